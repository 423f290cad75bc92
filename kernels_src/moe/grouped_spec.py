"""AOT specs of the MoE grouped GEMMs (kernels and index rules in grouped.py), imported by the family's
spec.py (this file defines only ``SPECS``).

Bases ``moe.grouped.m{BLOCK_M}.n{BLOCK_N}.k{BLOCK_K}[.silu]`` (``.silu``: SwiGLU fused into the epilogue, two
accumulators per program). Tiles (the op's rule picks one: vkc_runtime/ops/moe/grouped_ops.py):
  m16.n16.k256   decode, narrow: many programs over few experts (M = 1: 9 experts must still fill the GPU)
  m16.n64.k64    decode, wide: fewer, longer programs once there are enough blocks
  m64.n128.k64   prefill (plain, 4 warps, 3 stages), m64.n64.k64 prefill (.silu: gate + up = 128 weight rows
                 per program)
  m128.n128.k64  long prefill (plain, 4 warps, 3 stages; 8 warps on the 99 KB archs), m128.n64.k64 (.silu, 8 warps: the sweep's best
                 .silu tile, n128 with 4 stages, is 4% faster on sm_90a but its two 128 x 128 accumulators spill
                 on sm_80 / sm_86)

Every pointer, N, K, a's / w's / out's strides carry div=16 (checked by the runtime); P, E, a_rows, a_row_div
and has_scale carry none. N's promise matters: without it the epilogue's column mask has no known constancy and
every output element is stored alone (2-byte stores; GEMM2 at M = 8192 writes 302 MB that way).

num_warps / num_stages: the m16 tiles are first choices made without a device to time them; the m64 / m128
tiles follow a JIT sweep on the H200 (benchmarks/explore_moe_grouped.py, 35B-A3B shape, M 2048 and 8192:
BLOCK_M {64, 128} x BLOCK_N {64, 128} x BLOCK_K {64, 128} x warps {4, 8} x stages {3, 4}; results in
benchmarks/results/2026-12-01-h200-session10.tgz).

Grid (axis 0 first): (cdiv(N, BLOCK_N), n_blocks), n_blocks <= len(sorted_ids) / BLOCK_M.
"""
from vkc.spec import Arg, KernelSpec

_ARGS = [
    ("a_ptr", "*bf16", 16), ("w_ptr", "*bf16", 16), ("out_ptr", "*bf16", 16),
    ("sorted_ptr", "*i32", 16), ("bexp_ptr", "*i32", 16), ("npad_ptr", "*i32", 16), ("scale_ptr", "*fp32", 16),
    ("P", "i32", None), ("E", "i32", None), ("N", "i32", 16), ("K", "i32", 16),
    ("a_rows", "i32", None), ("a_row_div", "i32", None),
    ("stride_am", "i32", 16), ("stride_we", "i32", 16), ("stride_wn", "i32", 16), ("stride_om", "i32", 16),
    ("has_scale", "i32", None),
]

# (BLOCK_M, BLOCK_N, BLOCK_K, silu, num_warps, num_stages); the op's TILES lists the same tiles
TILES = (
    (16, 16, 256, False, 4, 3), (16, 16, 256, True, 4, 3),
    (16, 64, 64, False, 4, 4), (16, 64, 64, True, 4, 4),
    (64, 128, 64, False, 4, 3), (64, 64, 64, True, 4, 4),
    (128, 128, 64, False, 4, 3), (128, 64, 64, True, 8, 3),
)
_SMALL_SMEM = ("sm_86", "sm_89", "sm_120a", "sm_121a")  # 99 KB of shared memory per block


def _small_smem_overrides(bm: int, silu: bool) -> dict:
    """99 KB archs: fewer stages (m64: 3, m128: 2); the plain m128 tile there keeps 8 warps (with 4 its 128 x 128
    accumulator spills on sm_120a / sm_121a)."""
    if bm < 64:
        return {}
    ov = {"num_stages": 3 if bm == 64 else 2}
    if bm == 128 and not silu:
        ov["num_warps"] = 8
    return {a: dict(ov) for a in _SMALL_SMEM}


SPECS = []
for _bm, _bn, _bk, _silu, _warps, _stages in TILES:
    SPECS.append(KernelSpec(
        name=f"grouped.m{_bm}.n{_bn}.k{_bk}" + (".silu" if _silu else ""), source="grouped.py",
        entry="grouped_gemm_kernel", args=[Arg(n, t, div=d) for n, t, d in _ARGS],
        constexprs={"BLOCK_M": _bm, "BLOCK_N": _bn, "BLOCK_K": _bk, "ACT_SILU": _silu},
        num_warps=_warps, num_stages=_stages,
        overrides=_small_smem_overrides(_bm, _silu)))

del _bm, _bn, _bk, _silu, _warps, _stages
