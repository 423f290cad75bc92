"""AOT specs of the MoE block's decode kernels (kernels and index rules in decode.py), imported by the family's
spec.py (this file defines only ``SPECS``).

Bases (vkc_runtime/ops/moe/decode_ops.py picks one tile per kernel; TILES there lists the same):
  decode.gate_up.n8.k512     BLOCK_N 8 rows of gate (+ 8 of up) x 512 of K per iteration, 4 warps (the rule's
                             pick: 576 programs at M = 1 of the 35B-A3B shape, about four resident per SM)
  decode.gate_up.n16.k512    16 + 16 rows, 8 warps (half the programs, twice the bytes per iteration)
  decode.down.n4.k512.s4     BLOCK_N 4 rows of hidden, 4 slots per iteration (SB), 4 warps (the rule's pick:
                             512 programs at M = 1 of H = 2048)
  decode.down.n8.k512.s4     8 rows, 4 slots, 8 warps (256 programs at M = 1)

The bf16 pointers, K (the reduction length) and the weights' / x's / h's / out's strides carry div=16
(checked by the runtime); the ids / weights pointers, P, E, N and k_out carry none.
No shared memory beyond the reductions' scratch, so no per-arch overrides. The down kernels are capped at 128
registers (``maxnreg``; ptxas 13.4 gives the 4-warp one 133 for sm_90a otherwise, which would fit 3 programs per
SM instead of 4; no spills at 128). num_warps are first choices made without a device to time them
(benchmarks/bench_moe.py times both tiles of each kernel).

Grids (axis 0 first): gate_up (P, cdiv(N, BLOCK_N)); down (M, cdiv(H, BLOCK_N)).
"""
from vkc.spec import Arg, KernelSpec

_GATE_UP = [
    ("x_ptr", "*bf16", 16), ("w_ptr", "*bf16", 16), ("ids_ptr", "*i32", None), ("h_ptr", "*bf16", 16),
    ("P", "i32", None), ("E", "i32", None), ("N", "i32", None), ("K", "i32", 16), ("k_out", "i32", None),
    ("stride_x", "i32", 16), ("stride_we", "i32", 16), ("stride_wn", "i32", 16), ("stride_h", "i32", 16),
]
_DOWN = [
    ("h_ptr", "*bf16", 16), ("w_ptr", "*bf16", 16), ("ids_ptr", "*i32", None), ("wts_ptr", "*fp32", None),
    ("out_ptr", "*bf16", 16), ("E", "i32", None), ("N", "i32", None), ("K", "i32", 16), ("k_out", "i32", None),
    ("stride_h", "i32", 16), ("stride_we", "i32", 16), ("stride_wn", "i32", 16), ("stride_o", "i32", 16),
]

# (BLOCK_N, BLOCK_K, num_warps) and (BLOCK_N, BLOCK_K, SB, num_warps); the op's TILES lists the same
GATE_UP_TILES = ((8, 512, 4), (16, 512, 8))
DOWN_TILES = ((4, 512, 4, 4), (8, 512, 4, 8))


def _args(params):
    return [Arg(n, t, div=d) for n, t, d in params]


SPECS = [KernelSpec(name=f"decode.gate_up.n{bn}.k{bk}", source="decode.py", entry="moe_decode_gate_up_kernel",
                    args=_args(_GATE_UP), constexprs={"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=1)
         for bn, bk, w in GATE_UP_TILES]
SPECS += [KernelSpec(name=f"decode.down.n{bn}.k{bk}.s{sb}", source="decode.py", entry="moe_decode_down_kernel",
                     args=_args(_DOWN), constexprs={"BLOCK_N": bn, "BLOCK_K": bk, "SB": sb}, num_warps=w,
                     num_stages=1, options={"maxnreg": 128})
          for bn, bk, sb, w in DOWN_TILES]
