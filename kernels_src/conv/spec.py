"""AOT specs of the causal conv1d family (width 4, SiLU; kernels in conv.py).

Conv state layout: ``[slots, W-1, C]`` bf16, channels contiguous (see conv.py). Each kernel comes as
``.a16`` (x, y, state pointers and every row/slot stride carry div=16, checked by the runtime) and
``.any`` (no hints). C never carries a hint; the kernels branch on ``C % 16`` internally, except the prefill
body, whose ``.a16`` form is compiled for C % 16 == 0 only (constexpr C16; the op checks it).

Grids (axis 0 first):
  prefill.w4.*   (cdiv(T, SUB * BLOCK_T), cdiv(C, BLOCK_C))   the body of a varlen prefill (x taps only)
  heads.w4.*     (N, cdiv(C, BLOCK_C))                        then each sequence's first 3 rows and its state
  update.w4.*    (B, cdiv(C, BLOCK_C))
"""
from vkc.spec import Arg, KernelSpec, with_pdl

_VARIANTS = (("a16", True), ("any", False))

# (name, type, gets div=16 in .a16)
_PREFILL = [
    ("x_ptr", "*bf16", True), ("w_ptr", "*bf16", False), ("y_ptr", "*bf16", True), ("cu_ptr", "*i32", False),
    ("stride_x", "i32", True), ("stride_w", "i32", False), ("stride_y", "i32", True),
    ("T", "i32", False), ("C", "i32", False), ("N", "i32", False),
]
_HEADS = [
    ("x_ptr", "*bf16", True), ("w_ptr", "*bf16", False), ("y_ptr", "*bf16", True), ("state_ptr", "*bf16", True),
    ("cu_ptr", "*i32", False), ("slot_ptr", "*i32", False),
    ("stride_x", "i32", True), ("stride_w", "i32", False), ("stride_y", "i32", True),
    ("stride_ss", "i32", True), ("stride_sr", "i32", True),
    ("T", "i32", False), ("C", "i32", False), ("N", "i32", False), ("num_slots", "i32", False),
]
_UPDATE = [
    ("x_ptr", "*bf16", True), ("w_ptr", "*bf16", False), ("y_ptr", "*bf16", True), ("state_ptr", "*bf16", True),
    ("slot_ptr", "*i32", False),
    ("stride_x", "i32", True), ("stride_w", "i32", False), ("stride_y", "i32", True),
    ("stride_ss", "i32", True), ("stride_sr", "i32", True),
    ("C", "i32", False), ("num_slots", "i32", False),
]


def _args(params, aligned):
    return [Arg(n, t, div=16 if (aligned and h) else None) for n, t, h in params]


SPECS = []
for _sfx, _al in _VARIANTS:
    # the body: 4 rows a step, SUB = 4 steps (16 rows) a program, 512 channels on 4 warps (8 B per thread per
    # row, 72 registers on sm_90a), the last three inputs in registers (conv.py). H100, T = 8192, C = 10240: 123.4
    # us; 2 warps (16 B a thread, 128 registers) 128.6, 8 / 16 steps 127.5 / 128.4, the old tile kernel 180.2
    # (BENCHMARKS.md session 26)
    SPECS.append(KernelSpec(
        name=f"prefill.w4.{_sfx}", source="conv.py", entry="conv_prefill_kernel", args=_args(_PREFILL, _al),
        constexprs={"W": 4, "BLOCK_T": 4, "BLOCK_C": 512, "SUB": 4, "C16": int(_al)}, num_warps=4, num_stages=1))
    # the heads: 512 channels of one sequence per program, 4 warps
    SPECS.append(KernelSpec(
        name=f"heads.w4.{_sfx}", source="conv.py", entry="conv_heads_kernel", args=_args(_HEADS, _al),
        constexprs={"W": 4, "BLOCK_C": 512}, num_warps=4, num_stages=1))
    # 512 channels of one sequence per program, 4 warps (4 bf16 = 8 B per thread per row; 8 per thread
    # spilled on sm_90a with the bundled ptxas).
    SPECS.append(with_pdl(KernelSpec(  # decode steps: programmatic dependent launch (common.py pdl_enter)
        name=f"update.w4.{_sfx}", source="conv.py", entry="conv_update_kernel", args=_args(_UPDATE, _al),
        constexprs={"W": 4, "BLOCK_C": 512}, num_warps=4, num_stages=1)))

del _sfx, _al
