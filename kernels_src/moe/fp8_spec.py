"""AOT specs of the block-wise FP8 (W8A16) expert kernels (kernels and index rules in fp8.py), imported by the
family's spec.py (this file defines only ``SPECS``).

Bases (vkc_runtime/ops/moe/fp8_ops.py picks one tile per kernel; its TILES lists the same):
  w8a16.decode.gate_up.n{BN}.k{BK}       BLOCK_N rows of gate (+ as many of up) x BLOCK_K bytes of K per step:
                                         n8.k512 is the pick (H100 M = 1: 9.2 us vs n8.k256 10.2, n16.k256 11.4,
                                         session 34)
  w8a16.decode.down.n{BN}.k{BK}.s{S}     BLOCK_N rows of hidden x BLOCK_K, every slot in one tile (S 16 >= k'),
                                         or S 9 as a tile of 8 and one of 1 (SB 8, SBX 1): n4.k128.s9 with 4 warps
                                         is the pick for k' <= 9 (H200 M = 1: 6.1 us vs 8.6 with 8 warps, n2.k128.s9
                                         8.2, n4.k128.s16 9.1, session 21)
  w8a16.grouped.m{BM}.n{BN}.k64[.silu]   the grouped GEMM's tiles (grouped_spec.py's first choice per block_m)
NATIVE (the hardware's e4m3 conversion) on sm_89 and later, the integer decoding on sm_80 / sm_86. The tiles are
first choices made without a device to time them (benchmarks/bench_moe.py times the forced alternatives).

Pointers carry div=16 except the ids / weights ones, as do K and the byte / element strides of the activations
and codes (the runtime checks them); the scale strides (cdiv(K, 128) elements a row) carry none, nor do P, E, N,
k_out, a_rows and a_row_div (N of the grouped kernel: div=16, its store promise). Grids as decode_spec.py /
grouped_spec.py.
"""
from vkc.spec import Arg, KernelSpec, pow2_split

_W = [("wq_ptr", "*u8", 16), ("ws_ptr", "*fp32", 16)]
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
            ("stride_am", "i32", 16), *_WSTRIDES, ("stride_om", "i32", 16)]

# (BLOCK_N, BLOCK_K, num_warps), (BLOCK_N, BLOCK_K, slots, num_warps), (BLOCK_M, BLOCK_N, silu, num_warps, stages);
# the op's TILES lists the same
GATE_UP_TILES = ((8, 256, 4), (16, 256, 8), (8, 512, 4))
DOWN_TILES = ((4, 128, 9, 4), (2, 128, 9, 4), (4, 64, 16, 4), (4, 128, 16, 8), (2, 128, 16, 4))
GROUPED_TILES = ((16, 64, False, 4, 3), (16, 64, True, 4, 2), (64, 128, False, 4, 3), (64, 64, True, 4, 3),
                 (128, 128, False, 8, 3), (128, 64, True, 8, 3))
_NO_FP8_CVT = ("sm_80", "sm_86")  # no cvt from e4m3: the integer decoding
_SMALL_SMEM = ("sm_86", "sm_89", "sm_120a", "sm_121a")  # 99 KB of shared memory per block


def _args(params):
    return [Arg(n, t, div=d) for n, t, d in params]


def _overrides(big: bool) -> dict:
    """sm_80 / sm_86: the integer decoding; the 99 KB archs: 2 stages for the m64 / m128 tiles, and 8 warps
    (the m64 .silu tile spilled 8 B with 4 on sm_120a / sm_121a, ptxas 13.4)."""
    ov = {a: {"constexprs": {"NATIVE": False}} for a in _NO_FP8_CVT}
    if big:
        for a in _SMALL_SMEM:
            ov.setdefault(a, {}).update(num_stages=2, num_warps=8)
    return ov


SPECS = [KernelSpec(name=f"w8a16.decode.gate_up.n{bn}.k{bk}", source="fp8.py",
                    entry="moe_w8a16_decode_gate_up_kernel", args=_args(_GATE_UP),
                    constexprs={"BLOCK_N": bn, "BLOCK_K": bk, "NATIVE": True}, num_warps=w, num_stages=1,
                    overrides=_overrides(False))
         for bn, bk, w in GATE_UP_TILES]
SPECS += [KernelSpec(name=f"w8a16.decode.down.n{bn}.k{bk}.s{sb}", source="fp8.py",
                     entry="moe_w8a16_decode_down_kernel", args=_args(_DOWN),
                     constexprs={"BLOCK_N": bn, "BLOCK_K": bk, **pow2_split(sb), "NATIVE": True}, num_warps=w,
                     num_stages=1, options={"maxnreg": 128}, overrides=_overrides(False))
          for bn, bk, sb, w in DOWN_TILES]
SPECS += [KernelSpec(name=f"w8a16.grouped.m{bm}.n{bn}.k64" + (".silu" if silu else ""), source="fp8.py",
                     entry="moe_w8a16_grouped_kernel", args=_args(_GROUPED),
                     constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "ACT_SILU": silu, "NATIVE": True},
                     num_warps=w, num_stages=st, overrides=_overrides(bm >= 64))
          for bm, bn, silu, w, st in GROUPED_TILES]
