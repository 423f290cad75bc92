"""NVFP4 experts packed into the MMA layout (kernels_src/moe/nvfp4_mma.py): :class:`Nvfp4MmaExperts` passed where
the MoE ops take ``w1`` / ``w2`` runs the tensor-core W4A16 decode kernels (Gluon, the layout's lane-exact loads
and PTX decoder of ``vkc_runtime.ops.nvfp4``) and, on the grouped path, the grouped kernel reading the same
layout -- one copy of the weights for both paths:

    w1 = pack_experts(Nvfp4Experts(codes, scales, alpha), words, scales_mma, gate_up=True)  # once, at load
    decode_gate_up(x, w1, ids, out=h); decode_down(h, w2, ids, wts, out=y); grouped_gemm(a, w1, ..., act="silu_mul")

Layout: the experts' rows stacked ([E' * R, K], expert after expert) in the MMA layout of ``ops.nvfp4`` (its
module doc), so ``words`` int32 [E', R / 16, KB, 32, 8] and ``scales`` int32 [E', R / 16, KB, 32] (KB = cdiv(K,
128); :func:`mma_shapes`), ``alpha`` as for :class:`~.nvfp4_ops.Nvfp4Experts` ([E', 2] for gate_up weights, [E']
or [E', 1] for down). R % 16 == 0 (a row block never spans two experts) and K % 16 == 0.

Tiles (``TILES``, the rule's pick first; ``_tile=`` forces another): gate_up (16 R, WK) -- R row blocks of gate
(and as many of up) per program, WK warps along K; down (16 R, WK, 16) -- 16: the k' it takes (any k' <= 16: the
picks' k blocks are a loop, not a tile); grouped as the linear kind's, with the MMA layout's own tiles.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from ...tensor import TensorRef
from .._check import OpError, same_device, stream_of, tensor
from .. import nvfp4 as _n4
from .common import ExpertRefs, contiguous
from .nvfp4_ops import Nvfp4Experts, experts_refs as _linear_refs

__all__ = ["Nvfp4MmaExperts", "experts_refs", "mma_shapes", "pack_experts", "TILES", "NVFP4_MMA_BASES", "base"]

ALPHA_COLUMNS_ARG = True  # the grouped kernel takes n_alpha (ops/moe/grouped_ops.py)
# the block's decode path up to 16 tokens (decode_ops.decode_max_m): on the H200 (35B-A3B block, graph device time,
# BENCHMARKS.md session 20) the tensor-core decode path took 66.7 / 118.4 us at M = 8 / 16 against 112 / 172 for the
# best grouped one
DECODE_MAX_M = 16


class Nvfp4MmaExperts(NamedTuple):
    """NVFP4 experts in the MMA layout (module doc): ``words`` int32 [E', R/16, KB, 32, 8], ``scales`` int32 [E',
    R/16, KB, 32], ``alpha`` float32 [E', A] or [E'], ``rows`` R and ``k`` K of each expert."""
    words: Any
    scales: Any
    alpha: Any
    rows: int
    k: int


# kernel -> its tiles, the rule's pick first (kernels_src/moe/nvfp4_spec.py compiles the same: MMA_TILES as (R, WK),
# MMA_GROUPED_TILES)
TILES = {
    "gate_up": ((16, 4), (16, 8), (32, 4)),
    "down": ((16, 8, 16), (16, 4, 16), (32, 4, 16)),
    "grouped": {16: {None: ((64, 64),), "silu_mul": ((64, 64),)},
                64: {None: ((64, 64),), "silu_mul": ((64, 64),)},
                128: {None: ((128, 64),), "silu_mul": ((64, 64),)}},
}


def base(kind: str, tile: tuple, block_m: int | None = None, act: str | None = None) -> str:
    """The kernel name (spelled once: the ops call this, NVFP4_MMA_BASES is built from it)."""
    if kind in ("gate_up", "down"):
        return f"moe.w4a16.mma.{kind}.r{tile[0] // 16}.k{tile[1]}"
    return f"moe.w4a16.mma.grouped.m{block_m}.n{tile[0]}.k{tile[1]}" + (".silu" if act == "silu_mul" else "")


NVFP4_MMA_BASES = tuple([base(k, t) for k in ("gate_up", "down") for t in TILES[k]] +
                        [base("grouped", t, bm, act) for bm, per in TILES["grouped"].items()
                         for act, ts in per.items() for t in ts])


def mma_shapes(experts: int, rows: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(words shape, scales shape) of ``experts`` experts of [rows, k] in the MMA layout (int32 both)."""
    w, s = _n4.mma_shapes(rows, k)
    return (experts, *w), (experts, *s)


def experts_refs(op: str, name: str, w: Nvfp4MmaExperts, *, rows: int | None, K: int | None, gate_up: bool,
                 E: int | None = None) -> ExpertRefs:
    """Check MMA-layout experts ``w`` (module doc) for ``rows`` rows of ``K`` each (None: any), gate_up weights (two
    alpha columns) or down weights (one); the refs and the strides the kernels take: (words an expert, words a row
    block, scale words an expert, scale words a row block)."""
    if not isinstance(w, Nvfp4MmaExperts):
        raise OpError(f"{op}: {name} must be Nvfp4MmaExperts, got {type(w).__name__}")
    R, Kw = w.rows, w.k
    for n, v in (("rows", R), ("k", Kw)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 16 or v % 16:
            raise OpError(f"{op}: {name}.{n} must be a positive multiple of 16, got {v!r}")
    if (rows is not None and R != rows) or (K is not None and Kw != K):
        raise OpError(f"{op}: {name} holds experts of [{R}, {Kw}], expected [{rows if rows is not None else 'R'}, "
                      f"{K if K is not None else 'K'}]")
    q = tensor(op, f"{name}.words", w.words, "int32", ndim=5)
    Ep = q.shape[0]
    wshape, sshape = mma_shapes(Ep, R, Kw)
    if tuple(q.shape) != wshape or (E is not None and Ep != E):
        raise OpError(f"{op}: {name}.words has shape {tuple(q.shape)}, expected "
                      f"{((E,) + wshape[1:]) if E is not None else wshape}")
    s = tensor(op, f"{name}.scales", w.scales, "int32", shape=sshape)
    n_alpha = 2 if gate_up else 1
    a = tensor(op, f"{name}.alpha", w.alpha, "float32")
    if not (a.shape == (Ep, n_alpha) or (n_alpha == 1 and a.shape == (Ep,))):
        raise OpError(f"{op}: {name}.alpha must be float32 [{Ep}, {n_alpha}]"
                      + (f" or [{Ep}]" if n_alpha == 1 else "") + f", got {tuple(a.shape)}")
    for n, t in (("words", q), ("scales", s), ("alpha", a)):
        contiguous(op, f"{name}.{n}", t)
        if t.ptr % 16:
            raise OpError(f"{op}: {name}.{n} must be 16-byte aligned")
    same_device(op, q, s, a)
    KB = wshape[2]
    return ExpertRefs((q, s, a), (wshape[1] * KB * 256, KB * 256, wshape[1] * KB * 32, KB * 32),
                      [(f"{name}.words", q), (f"{name}.scales", s), (f"{name}.alpha", a)], Ep, R, Kw, q)


def _view(t, shape: tuple) -> TensorRef:
    """A contiguous ``shape`` view of a contiguous tensor holding as many elements."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.insert(0, acc)
        acc *= d
    return TensorRef(t.ptr, tuple(shape), tuple(strides), t.dtype, t.device, t)


def pack_experts(w: Nvfp4Experts, words, scales, *, gate_up: bool, stream=None) -> Nvfp4MmaExperts:
    """Device: linear NVFP4 experts ``w`` (:class:`~.nvfp4_ops.Nvfp4Experts`, codes [E', R, K/2]; ``gate_up``: two
    alpha columns) -> the MMA layout in ``words`` / ``scales`` (int32, :func:`mma_shapes`, contiguous): the
    experts' rows stacked and packed as one weight (``ops.nvfp4.pack``, one launch). Returns the
    :class:`Nvfp4MmaExperts` (``w.alpha`` shared). R % 16 == 0. NaN scale codes pack as zero weights: check the
    checkpoint first (the engine's loader refuses them)."""
    op = "moe.pack_experts"
    q = _linear_refs(op, "w", w, rows=None, K=None, gate_up=gate_up)
    Ep, R, K = q.E, q.R, q.K
    if R % 16:
        raise OpError(f"{op}: the experts have {R} rows; the MMA layout needs a multiple of 16")
    wshape, sshape = mma_shapes(Ep, R, K)
    wt = tensor(op, "words", words, "int32", shape=wshape)
    st = tensor(op, "scales", scales, "int32", shape=sshape)
    for n, t in (("words", wt), ("scales", st)):
        contiguous(op, n, t)
    same_device(op, q.codes, wt, st)
    codes, sc = q.tensors[0], q.tensors[1]
    _n4.pack(_view(codes, (Ep * R, K // 2)), _view(sc, (Ep * R, K // 16)), _view(wt, (Ep * wshape[1], *wshape[2:])),
             _view(st, (Ep * sshape[1], *sshape[2:])), stream=stream_of(stream))
    return Nvfp4MmaExperts(words, scales, w.alpha, R, K)
