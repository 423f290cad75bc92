"""Block-wise FP8 expert weights for the MoE ops (kernels_src/moe/fp8.py): :class:`Fp8Experts` passed where the ops
take bf16 ``w1`` / ``w2`` runs W8A16 -- the weights stay e4m3 on the device, as Qwen's *-FP8 checkpoints store each
expert's projections, and are decoded in the kernels (bf16 activations, fp32 sums) -- on both paths of
:func:`~vkc_runtime.ops.moe.sparse_moe_block`:

    w1 = Fp8Experts(q, scale)   # q uint8 [E', 2I, H] e4m3 (gate rows, then up), scale fp32 [E', 2I / 128, cdiv(H, 128)]
    w2 = Fp8Experts(q, scale)   # q uint8 [E', H, I], scale fp32 [E', cdiv(H, 128), cdiv(I, 128)]

W[e, r, k] = e4m3(q[e, r, k]) * scale[e, r // 128, k // 128] (``weight_scale_inv``: a multiplier, its dtype
widened to float32 at load). Requirements (checked before any launch, :class:`OpError` otherwise): q uint8 and
scale float32, contiguous, 16-byte aligned; K % 16 == 0; for gate_up weights I % 128 == 0 (the gate and up halves
whole scale blocks, as a fused checkpoint's per-projection grids stack). Weight bytes are values, never addresses
(an e4m3 NaN code gives NaN or +-480 outputs, no access outside the tensors).

Tiles (``TILES``, the rule's pick first; ``_tile=`` forces another): as ops/moe/nvfp4_ops.py; the decode picks are
the fastest at M = 1 on the 35B-A3B shape (benchmarks/bench_moe.py fp8). Session 34 (H100, x and h loaded in the
weight tile's layout, kernels_src/moe/fp8.py): gate_up n8.k512 9.2 us vs n8.k256 10.2, n16.k256 11.4; down
n4.k128.s9 (k' <= 9 as 8 + 1 slots, 4 warps) 6.2 us vs n2.k128.s9 7.0, n4.k128.s16 8.7: the rule's pick for
k' <= 9 (earlier kernels, H200, sessions 17 / 21: gate_up n8.k256 11.35 us, down n4.k128.s9 6.1).
"""
from __future__ import annotations

from typing import Any, NamedTuple

from .._check import OpError, cdiv, same_device, tensor
from .common import ExpertRefs, contiguous

__all__ = ["Fp8Experts", "experts_refs", "TILES", "FP8_BASES", "base"]


class Fp8Experts(NamedTuple):
    """Block-wise FP8 expert weights (module doc): ``q`` uint8 [E', R, K], ``scale`` float32 [E', cdiv(R, 128),
    cdiv(K, 128)]."""
    q: Any
    scale: Any


# kernel -> its tiles, the rule's pick first (kernels_src/moe/fp8_spec.py compiles the same)
TILES = {
    "gate_up": ((8, 512), (8, 256), (16, 256)),
    # down: the rule takes the first tile holding k' (9: 8 + 1 slots)
    "down": ((4, 128, 9), (2, 128, 9), (4, 128, 16), (4, 64, 16), (2, 128, 16)),
    "grouped": {16: {None: ((64, 64),), "silu_mul": ((64, 64),)},
                64: {None: ((128, 64),), "silu_mul": ((64, 64),)},
                128: {None: ((128, 64),), "silu_mul": ((64, 64),)}},
}


def base(kind: str, tile: tuple, block_m: int | None = None, act: str | None = None) -> str:
    """The kernel name (spelled once: the ops call this, FP8_BASES is built from it)."""
    if kind == "gate_up":
        return f"moe.w8a16.decode.gate_up.n{tile[0]}.k{tile[1]}"
    if kind == "down":
        return f"moe.w8a16.decode.down.n{tile[0]}.k{tile[1]}.s{tile[2]}"
    return f"moe.w8a16.grouped.m{block_m}.n{tile[0]}.k{tile[1]}" + (".silu" if act == "silu_mul" else "")


FP8_BASES = tuple([base(k, t) for k in ("gate_up", "down") for t in TILES[k]] +
                  [base("grouped", t, bm, act) for bm, per in TILES["grouped"].items() for act, ts in per.items()
                   for t in ts])


def experts_refs(op: str, name: str, w: Fp8Experts, *, rows: int | None, K: int | None, gate_up: bool,
                 E: int | None = None) -> ExpertRefs:
    """Check FP8 experts ``w`` (module doc) for ``rows`` rows of ``K`` each (None: any); gate_up weights need
    whole 128-row scale blocks per half. The refs and strides the kernels take (bytes for q, elements for scale)."""
    if not isinstance(w, Fp8Experts):
        raise OpError(f"{op}: {name} must be Fp8Experts, got {type(w).__name__}")
    q = tensor(op, f"{name}.q", w.q, "uint8", ndim=3)
    Ep, R, Kw = q.shape
    if (rows is not None and R != rows) or (K is not None and Kw != K) or (E is not None and Ep != E):
        raise OpError(f"{op}: {name}.q has shape {tuple(q.shape)}, expected [{E if E is not None else 'E'}, "
                      f"{rows if rows is not None else 'R'}, {K if K is not None else 'K'}]")
    if Ep < 1 or R < 1 or Kw == 0 or Kw % 16:
        raise OpError(f"{op}: {name}: need E' >= 1, R >= 1 and K a positive multiple of 16, got {Ep} x {R} x {Kw}")
    if gate_up and R % 256:
        raise OpError(f"{op}: {name}: gate_up weights need I = R / 2 a multiple of 128 (whole scale blocks per "
                      f"half), got R = {R}")
    s = tensor(op, f"{name}.scale", w.scale, "float32", ndim=3, shape=(Ep, cdiv(R, 128), cdiv(Kw, 128)))
    for n, t in (("q", q), ("scale", s)):
        contiguous(op, f"{name}.{n}", t)
        if t.ptr % 16:
            raise OpError(f"{op}: {name}.{n} must be 16-byte aligned")
    same_device(op, q, s)
    ns, ks = cdiv(R, 128), cdiv(Kw, 128)
    return ExpertRefs((q, s), (R * Kw, Kw, ns * ks, ks), [(f"{name}.q", q), (f"{name}.scale", s)], Ep, R, Kw, q)
