"""AOT specs of the gemm_fp8 family: FP8 e4m3 W8A8 GEMMs and the bf16 -> fp8 quantizers (kernels in gemm_fp8.py),
for the archs with FP8 tensor cores (sm_89, sm_90a, sm_100a, sm_120a, sm_121a).

Bases (vkc_runtime.ops.gemm_fp8 picks the tile per call; its docstring states the rule):
  scaled.t{128x256,128x128,64x128}   per-tensor / per-token x per-channel scales in the epilogue
  block.t{128x128,64x128}            128x128 block-wise weight scales, 1x128 activation scales, per k-slice
  quant_token / quant_tensor / quant_group   bf16 -> fp8 (dynamic per token, static per tensor, per token per 128)

The 128x256 tile needs the 228 KB of shared memory of sm_90a / sm_100a and is built only there (and not for the
block kernel: its per-slice partial product next to the accumulator would spill at 256 columns; block.t128x128
spills on sm_100a and is not built there); on the 99 KB archs (sm_89, sm_120a, sm_121a) the other tiles run with
fewer stages. The 64x128 tiles exist on every FP8 arch. Every fp8 / bf16 pointer, K and the
operand / input row strides carry div=16 (checked by the runtime); M, N, the output row stride, the scale
pointers and the scale strides carry none. num_warps / num_stages are first choices made without a device to
time them (benchmarks/bench_gemm_fp8.py measures; ``vkc tune`` retunes).

Grids (axis 0 first):
  scaled.*, block.*   (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)
  quant_token         (M,)
  quant_tensor        (M, cdiv(K, BLOCK))
  quant_group         (cdiv(M, ROWS), cdiv(cdiv(K, 128), GROUPS))
"""
from vkc.spec import Arg, KernelSpec

FP8_ARCHS = ("sm_89", "sm_90a", "sm_100a", "sm_120a", "sm_121a")
_BIG_SMEM = ("sm_90a", "sm_100a")
_SMALL_SMEM = ("sm_89", "sm_120a", "sm_121a")

_GEMM_HEAD = [
    ("a_ptr", "*fp8e4nv", 16), ("w_ptr", "*fp8e4nv", 16), ("out_ptr", "*bf16", 16),
    ("sa_ptr", "*fp32", None), ("sw_ptr", "*fp32", None),
    ("M", "i32", None), ("N", "i32", None), ("K", "i32", 16),
    ("stride_am", "i32", 16), ("stride_wn", "i32", 16), ("stride_om", "i32", None),
]
_SCALED = _GEMM_HEAD + [("sa_step", "i32", None), ("sw_step", "i32", None)]
_BLOCK = _GEMM_HEAD + [("stride_sam", "i32", None), ("stride_swn", "i32", None)]
_QUANT = [("x_ptr", "*bf16", 16), ("q_ptr", "*fp8e4nv", 16), ("s_ptr", "*fp32", None), ("K", "i32", 16),
          ("stride_xm", "i32", 16), ("stride_qm", "i32", 16)]
_QUANT_GROUP = _QUANT + [("stride_sm", "i32", None), ("M", "i32", None)]

# kind -> (BLOCK_M, BLOCK_N, num_warps, num_stages, stages on the 99 KB archs or None: not built there); BLOCK_K 128
TILES = {
    "scaled": ((128, 256, 8, 3, None), (128, 128, 8, 4, 2), (64, 128, 4, 4, 3)),
    "block": ((128, 128, 8, 4, 2), (64, 128, 4, 4, 3)),
}


def _archs(kind, bm, bn, small_stages):
    if small_stages is None:
        return _BIG_SMEM
    if (kind, bm, bn) == ("block", 128, 128):
        # sm_100a: the 128x128 partial product leaves tensor memory for registers next to the accumulator and
        # spills (Triton 3.9, at 8 and at 16 warps); the 64x128 tile runs there
        return tuple(a for a in FP8_ARCHS if a != "sm_100a")
    return FP8_ARCHS


def _args(params):
    return [Arg(n, t, div=d) for n, t, d in params]


SPECS = []
for _kind, _params in (("scaled", _SCALED), ("block", _BLOCK)):
    for _bm, _bn, _w, _st, _small in TILES[_kind]:
        SPECS.append(KernelSpec(
            name=f"{_kind}.t{_bm}x{_bn}", source="gemm_fp8.py", entry=f"gemm_fp8_{_kind}_kernel",
            args=_args(_params), constexprs={"BLOCK_M": _bm, "BLOCK_N": _bn, "BLOCK_K": 128, "GROUP_M": 8},
            num_warps=_w, num_stages=_st, archs=_archs(_kind, _bm, _bn, _small),
            overrides={a: {"num_stages": _small} for a in _SMALL_SMEM} if _small else {}))

SPECS += [
    KernelSpec(name="quant_token", source="gemm_fp8.py", entry="quant_token_kernel", args=_args(_QUANT),
               constexprs={"BLOCK": 1024}, num_warps=4, num_stages=1, archs=FP8_ARCHS),
    KernelSpec(name="quant_tensor", source="gemm_fp8.py", entry="quant_tensor_kernel", args=_args(_QUANT),
               constexprs={"BLOCK": 1024}, num_warps=4, num_stages=1, archs=FP8_ARCHS),
    # 4 rows x 4 groups a program (4 KB of bf16): one row of 8 groups a program moved ~1 TB/s on the MoE's h
    # [73728, 512] (H100, session 23; half of each program masked off)
    KernelSpec(name="quant_group", source="gemm_fp8.py", entry="quant_group_kernel", args=_args(_QUANT_GROUP),
               constexprs={"ROWS": 4, "GROUPS": 4}, num_warps=4, num_stages=1, archs=FP8_ARCHS),
]

del _kind, _params, _bm, _bn, _w, _st, _small
