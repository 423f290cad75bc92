"""AOT specs of the NVFP4 (W4A16) expert kernels (kernels and index rules in nvfp4.py), imported by the family's
spec.py (this file defines only ``SPECS``).

Bases (vkc_runtime/ops/moe/nvfp4_ops.py picks one tile per kernel; its TILES lists the same):
  w4a16.decode.gate_up.n{BN}.k{BK}       BLOCK_N rows of gate (+ as many of up) x BLOCK_K of K per step
  w4a16.decode.down.n{BN}.k{BK}.s{S}     BLOCK_N rows of hidden x BLOCK_K, S >= k' slots: S = 16 one tile, S = 9
                                         a tile of 8 and one of 1 (SB 8, SBX 1: the 35B-A3B's 8 picks + shared)
  w4a16.grouped.m{BM}.n{BN}.k64[.silu]   the grouped GEMM's tiles (grouped_spec.py's first choice per block_m)
  w4a16.mma.gate_up.r{R}.k{WK}           experts in the MMA layout (nvfp4_mma.py, Gluon): R row blocks of 16 (of
                                         gate, and as many of up) per program, WK warps along K each (WK * R warps)
  w4a16.mma.down.r{R}.k{WK}              R row blocks of hidden per program, the k' picks' k blocks over WK warps
  w4a16.mma.grouped.m{BM}.n{BN}.k64[.silu]  the grouped tiles reading the MMA layout (MMA=True in nvfp4.py)
The linear-layout kernels with the packed-word decoder (PRMT: inline PTX; the interpreter runs PRMT=False in the CPU
tests). The tiles are first choices made without a device to time them (benchmarks/bench_moe.py times the forced
alternatives).

Byte pointers carry div=16, as do K, the code strides (K / 2 bytes a row: the runtime asks K % 32 == 0) and the
activations' strides; the scale strides (K / 16 bytes a row) carry none, nor do the alpha, ids and weights
pointers, P, E, N, k_out, a_rows, a_row_div and n_alpha (N of the grouped kernel: div=16, its store promise). Grids
as decode_spec.py / grouped_spec.py.
"""
from vkc.spec import Arg, KernelSpec, pow2_split

_W = [("wq_ptr", "*u8", 16), ("ws_ptr", "*u8", 16), ("alpha_ptr", "*fp32", None)]
_W_MMA = [("wq_ptr", "*i32", 16), ("ws_ptr", "*i32", 16), ("alpha_ptr", "*fp32", None)]  # words, scale words
_WSTRIDES = [("stride_qe", "i32", 16), ("stride_qn", "i32", 16), ("stride_se", "i32", None),
             ("stride_sn", "i32", None)]
_GATE_UP = [("x_ptr", "*bf16", 16), *_W, ("ids_ptr", "*i32", None), ("h_ptr", "*bf16", 16),
            ("P", "i32", None), ("E", "i32", None), ("N", "i32", None), ("K", "i32", 16), ("k_out", "i32", None),
            ("stride_x", "i32", 16), *_WSTRIDES, ("stride_h", "i32", 16)]
_DOWN = [("h_ptr", "*bf16", 16), *_W, ("ids_ptr", "*i32", None), ("wts_ptr", "*fp32", None),
         ("out_ptr", "*bf16", 16), ("E", "i32", None), ("N", "i32", None), ("K", "i32", 16), ("k_out", "i32", None),
         ("stride_h", "i32", 16), *_WSTRIDES, ("stride_o", "i32", 16)]
_GROUPED = [("a_ptr", "*bf16", 16), *_W, ("out_ptr", "*bf16", 16), ("sorted_ptr", "*i32", 16),
            ("bexp_ptr", "*i32", 16), ("npad_ptr", "*i32", 16), ("P", "i32", None), ("E", "i32", None),
            ("N", "i32", 16), ("K", "i32", 16), ("a_rows", "i32", None), ("a_row_div", "i32", None),
            ("stride_am", "i32", 16), *_WSTRIDES, ("stride_om", "i32", 16), ("n_alpha", "i32", None)]

# (BLOCK_N, BLOCK_K, num_warps), (BLOCK_N, BLOCK_K, SB, num_warps), (BLOCK_M, BLOCK_N, silu, num_warps, stages);
# the op's TILES lists the same
GATE_UP_TILES = ((8, 512, 4), (4, 512, 4), (8, 256, 4))
DOWN_TILES = ((4, 64, 9, 4), (4, 128, 16, 4), (4, 64, 16, 4), (2, 128, 16, 4))  # SB 9: slots 8 + 1 (SBX)
GROUPED_TILES = ((16, 64, False, 4, 3), (16, 64, True, 4, 2), (64, 128, False, 4, 3), (64, 64, True, 4, 3),
                 (128, 128, False, 8, 3), (128, 64, True, 8, 3))
# the MMA layout's grouped tiles (BLOCK_M, BLOCK_N, silu, num_warps, stages): the linear ones' shapes, m64 at
# BLOCK_N 64 (its gathered decode at n128 x 4 warps spilled on sm_80 / sm_120a). BLOCK_K 128 (a whole k block's
# words a step) measured slower on the H200 at every tile (BENCHMARKS.md, session 20): 64 only
MMA_GROUPED_TILES = ((16, 64, False, 4, 3), (16, 64, True, 4, 2), (64, 64, False, 4, 3), (64, 64, True, 8, 3),
                     (128, 128, False, 8, 3), (128, 64, True, 8, 3))
# (R, WK) of the MMA-layout decode kernels (the op's MMA_TILES lists the same, as (16 R, WK[, slots]))
MMA_TILES = ((1, 4), (1, 8), (2, 4))
_SMALL_SMEM = ("sm_86", "sm_89", "sm_120a", "sm_121a")  # 99 KB of shared memory per block


def _args(params, mma=False):
    return [Arg(n, t, div=d) for n, t, d in params] if not mma else \
        _args([_W_MMA[_W.index(p)] if p in _W else p for p in params])


SPECS = [KernelSpec(name=f"w4a16.decode.gate_up.n{bn}.k{bk}", source="nvfp4.py",
                    entry="moe_w4a16_decode_gate_up_kernel", args=_args(_GATE_UP),
                    constexprs={"BLOCK_N": bn, "BLOCK_K": bk, "PRMT": True}, num_warps=w, num_stages=1)
         for bn, bk, w in GATE_UP_TILES]
SPECS += [KernelSpec(name=f"w4a16.decode.down.n{bn}.k{bk}.s{sb}", source="nvfp4.py",
                     entry="moe_w4a16_decode_down_kernel", args=_args(_DOWN),
                     constexprs={"BLOCK_N": bn, "BLOCK_K": bk, **pow2_split(sb), "PRMT": True},
                     num_warps=w, num_stages=1, options={"maxnreg": 128})
          for bn, bk, sb, w in DOWN_TILES]
SPECS += [KernelSpec(name=f"w4a16.{'mma.' if mma else ''}grouped.m{bm}.n{bn}.k64" + (".silu" if silu else ""),
                     source="nvfp4.py", entry="moe_w4a16_grouped_kernel", args=_args(_GROUPED, mma),
                     constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "ACT_SILU": silu, "PRMT": True,
                                 "MMA": mma},
                     num_warps=w, num_stages=st,
                     overrides={a: {"num_stages": 2} for a in _SMALL_SMEM} if bm >= 64 else {})
          for mma, tiles in ((False, GROUPED_TILES), (True, MMA_GROUPED_TILES)) for bm, bn, silu, w, st in tiles]
SPECS += [KernelSpec(name=f"w4a16.mma.{kind}.r{r}.k{wk}", source="nvfp4_mma.py",
                     entry=f"moe_w4a16_mma_{kind}_kernel", args=_args(_GATE_UP if kind == "gate_up" else _DOWN, True),
                     constexprs={"WK": wk, "R": r}, num_warps=wk * r, num_stages=1)
          for kind in ("gate_up", "down") for r, wk in MMA_TILES]
