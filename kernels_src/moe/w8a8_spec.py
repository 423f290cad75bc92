"""AOT specs of the block-wise FP8 W8A8 grouped expert kernels (kernel and index rules in w8a8.py), imported by the
family's spec.py (this file defines only ``SPECS``); built for the archs with FP8 tensor cores.

Bases ``w8a8.grouped.m{BM}.n{BN}.k128[.silu][.q]`` (vkc_runtime/ops/moe/w8a8_ops.py picks one; its TILES lists the
same): ``.silu`` the gate_up GEMM (SwiGLU in the epilogue, gate + up = 2 x BN weight rows a program), ``.q`` its
output quantized in the epilogue (BN 128: one activation group a row), plain the down GEMM. Tiles are first
choices sized by registers (two accumulators and a k-step's product per half: 4 x 32 fp32 a thread at m128.n64 on
8 warps) and shared memory (BM x 128 + 1 or 2 x BN x 128 bytes a stage: 4 stages on sm_90a / sm_100a). The 99 KB
archs (sm_89, sm_120a, sm_121a: mma.sync, the operands in registers) take k-steps of half a slice (BLOCK_K 64; a
whole slice spilled 8-48 B at every tile with Triton 3.9) and 2 or 3 stages. benchmarks/bench_moe.py times the
tiles (sm_90a).

Pointers carry div=16 except the activation and output multipliers' (row strides cdiv(K, 128) / N / 128
elements: neither they nor those strides promise anything); K, N, the fp8 / bf16 row strides and the expert byte
strides carry div=16 (the runtime checks them). Grid: (cdiv(N, BN), n_blocks) as grouped_spec.py.
"""
from vkc.spec import Arg, KernelSpec

FP8_ARCHS = ("sm_89", "sm_90a", "sm_100a", "sm_120a", "sm_121a")
_SMALL_SMEM = ("sm_89", "sm_120a", "sm_121a")  # 99 KB of shared memory per block


def _args(quant_out: bool):
    out = "*fp8e4nv" if quant_out else "*bf16"
    return [Arg(n, t, div=d) for n, t, d in (
        ("a_ptr", "*fp8e4nv", 16), ("sa_ptr", "*fp32", None), ("wq_ptr", "*fp8e4nv", 16), ("ws_ptr", "*fp32", 16),
        ("out_ptr", out, 16), ("os_ptr", "*fp32", None), ("sorted_ptr", "*i32", 16), ("bexp_ptr", "*i32", 16),
        ("npad_ptr", "*i32", 16), ("P", "i32", None), ("E", "i32", None), ("N", "i32", 16), ("K", "i32", 16),
        ("a_rows", "i32", None), ("a_row_div", "i32", None), ("stride_am", "i32", 16), ("stride_sam", "i32", None),
        ("stride_qe", "i32", 16), ("stride_qn", "i32", 16), ("stride_se", "i32", None), ("stride_sn", "i32", None),
        ("stride_om", "i32", 16), ("stride_osm", "i32", None))]


# (BLOCK_M, BLOCK_N, silu, quant_out, num_warps, num_stages); the op's TILES lists the same
# (m128.n128.silu.q, two 128 x 128 accumulators and a slice's product on 8 warps, spills 24 B on sm_90a: not built;
# block_m 128 quantizes h in its own launch)
TILES = ((64, 64, True, False, 4, 4), (64, 128, True, True, 8, 4), (128, 64, True, False, 8, 4),
         (64, 128, False, False, 4, 4), (128, 128, False, False, 8, 4))


SMALL_BLOCK_K = 64  # the mma.sync archs: a whole 128-wide slice's operands spill (8-48 B) at every tile


def _small(bm: int, bn: int, silu: bool) -> dict:
    """The 99 KB mma.sync archs: half-slice k-steps, 3 stages while a stage takes at most 24 KB, else 2."""
    stage = (bm + (2 if silu else 1) * bn) * SMALL_BLOCK_K
    return {"num_stages": 3 if stage <= 24 * 1024 else 2, "constexprs": {"BLOCK_K": SMALL_BLOCK_K}}


SPECS = [KernelSpec(name=f"w8a8.grouped.m{bm}.n{bn}.k128" + (".silu" if silu else "") + (".q" if q else ""),
                    source="w8a8.py", entry="moe_w8a8_grouped_kernel", args=_args(q),
                    constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "ACT_SILU": silu, "QUANT_OUT": q},
                    num_warps=w, num_stages=st, archs=FP8_ARCHS,
                    overrides={a: _small(bm, bn, silu) for a in _SMALL_SMEM})
         for bm, bn, silu, q, w, st in TILES]
