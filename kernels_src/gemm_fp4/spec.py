"""AOT specs of the gemm_fp4 family: the NVFP4 W4A4 GEMM and the bf16 -> NVFP4 activation quantizer (kernels and
layouts in gemm_fp4.py).

Archs: sm_100a, sm_120a, sm_121a, where ``tl.dot_scaled`` lowers to the NVFP4 block-scaled tensor-core MMA
(tcgen05 on sm_100a, warp-level mma.sync on sm_120a / sm_121a; build-verified: vkc has no Blackwell GPU), and
sm_90a, where Triton emulates it in bf16 -- built so that the same source is checked on the H100 / H200 (the
engine runs NVFP4 checkpoints as W4A16 there, ops.nvfp4).

Bases (vkc_runtime.ops.gemm_fp4 picks the tile per call with ops.gemm's rule among those built):
  w4a4.t128x128, w4a4.t64x128   BLOCK_K 128 (64 packed bytes and 8 scales per row a slice), GROUP_M 8; the 64-row
                                tile not on sm_100a (below)
  quant                         4 rows x 8 groups of 16 a program
The packed operands' pointers and row strides carry div=16 (the runtime checks them; K % 32 == 0 makes every
packed row a whole number of 16-byte pieces); M, N, K, the scale pointers and strides and the output row stride
carry none. num_warps / num_stages are first choices that compile without spills (no Blackwell device to time
them).

Grids (axis 0 first):
  w4a4.*   (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)
  quant    (cdiv(M, ROWS), cdiv(K / 16, GROUPS))
"""
from vkc.spec import Arg, KernelSpec

FP4_ARCHS = ("sm_90a", "sm_100a", "sm_120a", "sm_121a")
_SMALL_SMEM = ("sm_120a", "sm_121a")

_GEMM = [
    ("a_ptr", "*u8", 16), ("sa_ptr", "*fp8e4nv", None), ("w_ptr", "*u8", 16), ("sw_ptr", "*fp8e4nv", None),
    ("alpha_ptr", "*fp32", None), ("out_ptr", "*bf16", 16),
    ("M", "i32", None), ("N", "i32", None), ("K", "i32", 16),
    ("stride_am", "i32", 16), ("stride_sam", "i32", None), ("stride_wn", "i32", 16), ("stride_swn", "i32", None),
    ("stride_om", "i32", None),
]
_QUANT = [
    ("x_ptr", "*bf16", 16), ("gs_ptr", "*fp32", None), ("q_ptr", "*u8", 16), ("s_ptr", "*fp8e4nv", None),
    ("M", "i32", None), ("K", "i32", 16), ("stride_xm", "i32", 16), ("stride_qm", "i32", 16),
    ("stride_sm", "i32", None),
]

# (BLOCK_M, BLOCK_N, num_warps, num_stages, stages on sm_120a / sm_121a (99 KB of shared memory)); the sm_90a
# emulation of the 64x128 tile spills at 4 warps (it holds both operands upcast to bf16) and takes 8
TILES = ((128, 128, 8, 3, 2), (64, 128, 4, 3, 2))
_SM90 = {(64, 128): {"num_warps": 8}}


def _overrides(bm, bn, small):
    ov = {a: {"num_stages": small} for a in _SMALL_SMEM}
    if (bm, bn) in _SM90:
        ov["sm_90a"] = _SM90[(bm, bn)]
    return ov


def _args(params):
    return [Arg(n, t, div=d) for n, t, d in params]


def _archs(bm):
    # tcgen05's block-scaled MMA takes 128 rows per CTA: at BLOCK_M 64 Triton 3.9 falls back to the bf16 emulation
    # on sm_100a (UTCHMMA instead of UTCOMMA in the SASS), so the 64-row tile is not built there
    return FP4_ARCHS if bm == 128 else tuple(a for a in FP4_ARCHS if a != "sm_100a")


SPECS = [KernelSpec(name=f"w4a4.t{bm}x{bn}", source="gemm_fp4.py", entry="gemm_w4a4_kernel", args=_args(_GEMM),
                    constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8}, num_warps=w,
                    num_stages=st, archs=_archs(bm), overrides=_overrides(bm, bn, small))
         for bm, bn, w, st, small in TILES]
SPECS.append(KernelSpec(name="quant", source="gemm_fp4.py", entry="quant_nvfp4_kernel", args=_args(_QUANT),
                        constexprs={"ROWS": 4, "GROUPS": 8}, num_warps=4, num_stages=1, archs=FP4_ARCHS))
