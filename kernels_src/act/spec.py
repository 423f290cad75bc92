"""AOT specs of the act family: SwiGLU (``silu(gate) * up``) and the attention output gate
(``x * sigmoid(gate)``) (kernels in act.py).

Every kernel comes as ``.a16`` (all pointers and row strides carry div=16, which the runtime checks) and
``.any`` (no hints). Sizes (I, H) never carry hints; the kernels branch on ``size % 16`` internally.

Grids (axis 0 first):
  silu_mul.*                 (M, cdiv(I, BLOCK))
  sigmoid_mul.*              (T, cdiv(H, HEADS_PER_PROG))
"""
from vkc.spec import Arg, KernelSpec, with_pdl


def _args(params, aligned):
    """params: (name, type, aligned_hint). The hint is applied only in the aligned variant."""
    return [Arg(n, t, div=16 if (aligned and h) else None) for n, t, h in params]


_VARIANTS = (("a16", True), ("any", False))

# (name, type, gets div=16 in .a16)
_SILU_MUL = [
    ("x_ptr", "*bf16", True), ("y_ptr", "*bf16", True),
    ("stride_x", "i32", True), ("stride_y", "i32", True), ("I", "i32", False),
]
_SIGMOID_MUL = [
    ("x_ptr", "*bf16", True), ("gate_ptr", "*bf16", True), ("out_ptr", "*bf16", True),
    ("stride_x", "i32", True), ("gate_stride_t", "i32", True), ("gate_stride_h", "i32", True),
    ("stride_out", "i32", True), ("H", "i32", False),
]

SPECS = []

for _sfx, _al in _VARIANTS:
    SPECS.append(KernelSpec(
        name=f"silu_mul.{_sfx}", source="act.py", entry="silu_mul_kernel",
        args=_args(_SILU_MUL, _al), constexprs={"BLOCK": 1024}, num_warps=4, num_stages=1))

    # 1024 elements per program: 4 heads of 256 or 8 heads of 128.
    for _d, _hpp in ((256, 4), (128, 8)):
        SPECS.append(KernelSpec(
            name=f"sigmoid_mul.d{_d}.{_sfx}", source="act.py", entry="sigmoid_mul_kernel",
            args=_args(_SIGMOID_MUL, _al), constexprs={"D": _d, "HEADS_PER_PROG": _hpp},
            num_warps=4, num_stages=1))

del _sfx, _al, _d, _hpp

SPECS = [with_pdl(s) for s in SPECS]  # decode steps: programmatic dependent launch (common.py pdl_enter)
