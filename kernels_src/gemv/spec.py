"""AOT specs of the small-M GEMM ("GEMV") family for decode (kernels and layouts in gemv.py).

Bases (the op picks one by M bucket and tile; vkc_runtime.ops.gemv has the rule):
  bf16.m{16,32,64}.n64.k128    BF16 weights, wide tile (N blocks of 64 rows)
  bf16.m{16,32,64}.n16.k256    BF16 weights, narrow tile (more programs for small N)
  bf16.m1.n4.k1024             BF16 at M = 1, 1024 <= N <= 8192 (the op rule): the CUDA-core kernel
                               (gemv_bf16_m1_kernel), 4 rows x 1024 of K, 8 warps (H200, benchmarks/
                               explore_decode.py and bench_gemv.py: 6.5 us at 2048 x 4096, the MMA kernel 9.0)
  w4a16.m{16,32,64}.n64.k256.{int,prmt}   NVFP4 weights dequantized in the kernel, wide tile (8 warps: the
                                          dequantized tile is 64 values per thread); .int / .prmt: the
                                          weight decoder (gemv.py)
  w4a16.m{16,32,64}.n16.k256.{int,prmt}   NVFP4, narrow tile
  w4a16.m1.n{64,16}.k256.{int,prmt}       NVFP4 at M = 1: the CUDA-core kernel (gemv_w4a16_m1_kernel)
  w8a16.m{16,32,64}.n{64,16}.k128         block-wise FP8 weights (128 x 128 fp32 scales) dequantized in the
                                          kernel (gemv_w8a16_kernel), wide and narrow tiles
  w8a16.m1.n4.k1024, w8a16.m1.n8.k512     FP8 at M = 1: the CUDA-core kernel (gemv_w8a16_m1_kernel), 4 warps;
                                          NATIVE (the hardware's e4m3 conversion) on sm_89+, the integer
                                          decoder on sm_80/86 (H200 JIT sweep: 55-81% of the FP8 floor over
                                          the 27B/35B-A3B projections, 1.5-3.6x the MMA kernel at M = 1)
  w4a16.mma.m{8,16}.k{WK}.r{R} NVFP4 weights in the MMA layout (nvfp4_mma.py, a Gluon kernel): R blocks of 16
                               weight rows and BLOCK_M rows of x per program, WK warps splitting K per row block;
                               any M (M chunks along the grid)
  nvfp4_mma_pack               linear NVFP4 (HF's weight_packed / weight_scale) -> the MMA layout, once at load
  nvfp4_mma_dequant            the MMA layout read back as bf16 W * alpha (Triton; the large-M path)
  splitk_reduce                the fixed-order fp32 sum of split-K partials -> bf16

Every pointer, K, each weight/x/scale row stride and k_split carry div=16 (checked by the runtime); M, N and y's
row stride carry none, nor does the FP8 block scales' row stride (cdiv(K, 128) elements: 40 at K = 5120).
num_warps / num_stages are first choices made without a device to time them: retune with ``vkc tune``
(benchmarks/bench_gemv.py measures the cases).

Grids (axis 0 first):
  bf16.*, w4a16.*, w8a16.*   (cdiv(N, BLOCK_N), n_split)
  w4a16.mma.*       (cdiv(N, 16 R) * cdiv(M, BLOCK_M), n_split)
  nvfp4_mma_pack, nvfp4_mma_dequant (cdiv(N, 16), cdiv(K, 128))
  splitk_reduce     (cdiv(N, BLOCK), M)
"""
from vkc.spec import Arg, KernelSpec, with_pdl

_BF16 = [
    ("x_ptr", "*bf16", 16), ("w_ptr", "*bf16", 16), ("out_ptr", "*bf16", 16), ("ws_ptr", "*fp32", 16),
    ("M", "i32", None), ("N", "i32", None), ("K", "i32", 16),
    ("stride_xm", "i32", 16), ("stride_wn", "i32", 16), ("stride_om", "i32", None), ("k_split", "i32", 16),
]
_W4A16 = [
    ("x_ptr", "*bf16", 16), ("w_ptr", "*u8", 16), ("s_ptr", "*u8", 16), ("out_ptr", "*bf16", 16),
    ("ws_ptr", "*fp32", 16), ("alpha", "fp32", None),
    ("M", "i32", None), ("N", "i32", None), ("K", "i32", 16),
    ("stride_xm", "i32", 16), ("stride_wn", "i32", 16), ("stride_sn", "i32", 16), ("stride_om", "i32", None),
    ("k_split", "i32", 16),
]
_W8A16 = [
    ("x_ptr", "*bf16", 16), ("w_ptr", "*u8", 16), ("s_ptr", "*fp32", 16), ("out_ptr", "*bf16", 16),
    ("ws_ptr", "*fp32", 16), ("M", "i32", None), ("N", "i32", None), ("K", "i32", 16),
    ("stride_xm", "i32", 16), ("stride_wn", "i32", 16), ("stride_sn", "i32", None), ("stride_om", "i32", None),
    ("k_split", "i32", 16),
]
_W4A16_MMA = [
    ("x_ptr", "*bf16", 16), ("w_ptr", "*i32", 16), ("s_ptr", "*i32", 16), ("out_ptr", "*bf16", 16),
    ("ws_ptr", "*fp32", 16), ("alpha", "fp32", None), ("M", "i32", None), ("N", "i32", None), ("K", "i32", 16),
    ("stride_xm", "i32", 16), ("stride_om", "i32", None), ("k_split", "i32", 16),
]
_MMA_DEQUANT = [
    ("w_ptr", "*i32", 16), ("s_ptr", "*i32", 16), ("out_ptr", "*bf16", 16), ("alpha", "fp32", None),
    ("N", "i32", None), ("K", "i32", 16), ("stride_on", "i32", 16),
]
_MMA_PACK = [
    ("wp_ptr", "*u8", None), ("sc_ptr", "*u8", None), ("w_out", "*i32", 16), ("s_out", "*i32", 16),
    ("N", "i32", None), ("K", "i32", 16), ("stride_wn", "i32", None), ("stride_sn", "i32", None),
]
# (BLOCK_M, WK, R) of the MMA-layout NVFP4 kernel: WK warps per row block along K, R row blocks per program (the
# op's MMA_TILES lists the same)
MMA_TILES = tuple((bm, wk, r) for bm in (8, 16) for wk, r in ((8, 1), (4, 2), (1, 8)))
_REDUCE = [
    ("ws_ptr", "*fp32", 16), ("out_ptr", "*bf16", 16), ("M", "i32", None), ("N", "i32", None),
    ("stride_om", "i32", None), ("n_split", "i32", None),
]

M_BUCKETS = (16, 32, 64)
# kind -> its M buckets (BLOCK_M); every kind has a CUDA-core kernel for M = 1 (the MMA kernels pad M to 16)
BUCKETS = {"bf16": (1,) + M_BUCKETS, "w4a16": (1,) + M_BUCKETS, "w8a16": (1,) + M_BUCKETS}
# kind -> (BLOCK_N, BLOCK_K, num_warps) per tile
TILES = {
    "bf16": ((64, 128, 4), (16, 256, 4)),
    "w4a16": ((64, 256, 8), (16, 256, 4)),
    "w8a16": ((64, 128, 4), (16, 128, 4)),
}
# kind -> its own tiles for the M = 1 bucket where they differ from TILES (the op's M1_TILES lists the same)
M1_TILES = {"bf16": ((4, 1024, 8),), "w8a16": ((4, 1024, 4), (8, 512, 4))}
_NO_FP8_CVT = ("sm_80", "sm_86")  # no hardware e4m3 conversion (Triton's fp8e4nv needs sm_89+)
_SMALL_SMEM = ("sm_86", "sm_89", "sm_120a", "sm_121a")  # 99 KB of shared memory per block


# the wide FP8 tile at M 64: 2 stages on the 99 KB archs, and 8 warps on sm_120a / sm_121a, where 4 spill 16 B
# (ptxas 13.4: the [64, 128] tile of decoded weights beside the [64, 64] accumulator)
_W8_M64_WIDE = {a: {"num_stages": 2, **({"num_warps": 8} if a in ("sm_120a", "sm_121a") else {})}
                for a in _SMALL_SMEM}


def _args(params):
    return [Arg(n, t, div=d) for n, t, d in params]


# kind -> [(name suffix, extra constexprs)]: the NVFP4 kernels come with both weight decoders (gemv.py)
_DECODERS = {"bf16": [("", {})], "w4a16": [(".int", {"PRMT": False}), (".prmt", {"PRMT": True})],
             "w8a16": [("", {})]}
_ARGS = {"bf16": _BF16, "w4a16": _W4A16, "w8a16": _W8A16}

SPECS = []
for _kind in TILES:
    for _bm in BUCKETS[_kind]:
        _tiles = M1_TILES.get(_kind, TILES[_kind]) if _bm == 1 else TILES[_kind]
        for (_bn, _bk, _warps), (_sfx, _dec) in ((t, d) for t in _tiles for d in _DECODERS[_kind]):
            _fp8_m1 = (_kind, _bm) == ("w8a16", 1)
            SPECS.append(KernelSpec(
                name=f"{_kind}.m{_bm}.n{_bn}.k{_bk}{_sfx}", source="gemv.py",
                entry=f"gemv_{_kind}_m1_kernel" if _bm == 1 else f"gemv_{_kind}_kernel",
                args=_args(_ARGS[_kind]),
                constexprs={"BLOCK_M": _bm, "BLOCK_N": _bn, "BLOCK_K": _bk, **_dec,
                            **({"NATIVE": True} if _fp8_m1 else {})},
                num_warps=_warps, num_stages=3,
                # 2 stages: x tiles of 64 rows (32 KB per stage at BLOCK_K 256) do not fit 3 in 99 KB; the wide
                # NVFP4 kernels at M 16 on sm_120a/sm_121a (.int spills 16 B there with 3 stages, ptxas 13.4)
                overrides=({a: {"constexprs": {"NATIVE": False}} for a in _NO_FP8_CVT} if _fp8_m1 else
                           _W8_M64_WIDE if (_kind, _bm, _bn) == ("w8a16", 64, 64) else
                           {a: {"num_stages": 2} for a in _SMALL_SMEM} if _bm == 64 else
                           {a: {"num_stages": 2} for a in ("sm_120a", "sm_121a")}
                           if (_kind, _bm, _bn) == ("w4a16", 16, 64) else {})))

SPECS += [KernelSpec(name=f"w4a16.mma.m{_bm}.k{_wk}.r{_r}", source="nvfp4_mma.py",
                     entry="gemv_w4a16_mma_kernel", args=_args(_W4A16_MMA),
                     constexprs={"BLOCK_M": _bm, "WK": _wk, "R": _r}, num_warps=_wk * _r, num_stages=1)
          for _bm, _wk, _r in MMA_TILES]
SPECS.append(KernelSpec(name="nvfp4_mma_pack", source="nvfp4_mma.py", entry="nvfp4_mma_pack_kernel",
                        args=_args(_MMA_PACK), num_warps=4, num_stages=1))
SPECS.append(KernelSpec(name="nvfp4_mma_dequant", source="nvfp4_mma.py", entry="nvfp4_mma_dequant_kernel",
                        args=_args(_MMA_DEQUANT), num_warps=4, num_stages=1))
SPECS.append(KernelSpec(name="splitk_reduce", source="gemv.py", entry="gemv_reduce_kernel", args=_args(_REDUCE),
                        constexprs={"BLOCK": 1024}, num_warps=4, num_stages=1))

SPECS = [with_pdl(s) for s in SPECS]  # every gemv kernel runs in decode steps (kernels_src/common.py pdl_enter)

del _kind, _tiles, _bm, _bn, _bk, _warps, _sfx, _dec, _fp8_m1
