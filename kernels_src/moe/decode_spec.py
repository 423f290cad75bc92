"""AOT specs of the MoE block's decode kernels (kernels and index rules in decode.py), imported by the family's
spec.py (this file defines only ``SPECS``).

Bases (vkc_runtime/ops/moe/decode_ops.py picks one tile per kernel; TILES there lists the same):
  decode.gate_up.n8.k256     BLOCK_N 8 rows of gate (+ 8 of up) x 256 of K per step, 4 warps (the rule's pick:
                             576 programs at M = 1 of the 35B-A3B shape; 79 registers on sm_90a, so all of
                             them resident at once with the next step's tiles in flight)
  decode.gate_up.n8.k512     8 + 8 rows x 512, 4 warps (128 registers with its next step held: 4 per SM)
  decode.gate_up.n16.k512    16 + 16 rows x 512, 8 warps
  decode.down.n8.k128.s9     BLOCK_N 8 rows of hidden x 128 of K per step, k' <= 9 slots as a tile of 8 and
                             one of 1 (SB 8, SBX 1: the 35B-A3B's 8 picks + the shared expert), 8 warps (the
                             rule's pick for k' <= 9: 256 programs at M = 1 of H = 2048, 4 K steps each)
  decode.down.n4.k128.s9     4 rows x 128, 8 + 1 slots, 4 warps
  decode.down.n4.k64.s16     4 rows x 64, every slot (SB 16 >= k') in one tile, 4 warps (the rule's pick above 9)
  decode.down.n4.k128.s16    4 rows x 128, 8 warps
  decode.down.n2.k128.s16    2 rows x 128, 4 warps (1024 programs at M = 1)
(The n4.k512.s4 / n8.k512.s4 down tiles before them took 4 slots per step, one slot group after another: three
dependent id -> weight rounds at k' = 9. On the H200 at M = 1, alone: old n4.k512.s4 9.1 us, n4.k64.s16 9.35 us
(49% of the floor either way); gate_up old n8.k512 11.2, n8.k256 12.1; the whole block 27.5 -> 27.1 us
(BENCHMARKS.md, session 13). Session 21: 8 + 1 slots instead of 16 lanes and 128 of K a step (4 dependent steps
instead of 8): n8.k128.s9 6.5 us at M = 1 (n4.k128.s9 6.9, n4.k64.s9 8.6, n4.k64.s16 9.0), 23.5 vs 28.8 at M = 4;
tried and dropped: down n2.k128.s9 10.7, n2.k64.s9 (2 warps) 11.2, n8.k64.s9 8.7, n4.k256.s9 (8 warps) 8.7; gate_up
n4.k512 11.7, n4.k256 (2 warps) 13.3, n8.k128 (2 warps) 12.9, n16.k256 (8 warps) 12.1, n4.k1024 (8 warps) 12.5,
n8.k512 with 8 warps 12.2 vs n8.k256 11.9, and two K steps of weights in flight (AHEAD 2) 11.9 / 9.5.)

The bf16 pointers, K (the reduction length) and the weights' / x's / h's / out's strides carry div=16
(checked by the runtime); the ids / weights pointers, P, E, N and k_out carry none.
No shared memory beyond the reductions' scratch, so no per-arch overrides. The down kernels are capped at 128
registers (``maxnreg``; 91-124 used, no spills on any arch with ptxas 13.4). The s9 tiles' num_warps were timed
on the H200 (above); the others are first choices (benchmarks/bench_moe.py times every tile of each kernel).

Grids (axis 0 first): gate_up (P, cdiv(N, BLOCK_N)); down (M, cdiv(H, BLOCK_N)).
"""
from vkc.spec import Arg, KernelSpec, pow2_split

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

# (BLOCK_N, BLOCK_K, num_warps) and (BLOCK_N, BLOCK_K, slots, num_warps); the op's TILES lists the same.
# slots 9: SB 8 + SBX 1 (the largest power of two, then the rest)
GATE_UP_TILES = ((8, 256, 4), (8, 512, 4), (16, 512, 8))
DOWN_TILES = ((8, 128, 9, 8), (4, 128, 9, 4), (4, 64, 16, 4), (4, 128, 16, 8), (2, 128, 16, 4))


def _args(params):
    return [Arg(n, t, div=d) for n, t, d in params]


SPECS = [KernelSpec(name=f"decode.gate_up.n{bn}.k{bk}", source="decode.py", entry="moe_decode_gate_up_kernel",
                    args=_args(_GATE_UP), constexprs={"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=1)
         for bn, bk, w in GATE_UP_TILES]
SPECS += [KernelSpec(name=f"decode.down.n{bn}.k{bk}.s{sb}", source="decode.py", entry="moe_decode_down_kernel",
                     args=_args(_DOWN), constexprs={"BLOCK_N": bn, "BLOCK_K": bk, **pow2_split(sb)}, num_warps=w,
                     num_stages=1, options={"maxnreg": 128})
          for bn, bk, sb, w in DOWN_TILES]
