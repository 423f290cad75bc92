"""The MoE block's small-M (decode) expert ops (kernels_src/moe/decode.py): no grouping by expert, no MMA tiles.

    decode_gate_up(x, w1, topk_ids, *, out, stream=None)
        out[f] = silu(x[t] @ w1[e, :I]^T) * (x[t] @ w1[e, I:]^T)      f = t * k' + j, e = topk_ids[t, j]
    decode_down(h, w2, topk_ids, topk_weights, *, out, stream=None)
        out[t] = sum_j topk_weights[t, j] * (h[t * k' + j] @ w2[e]^T)

bf16 in and out, fp32 sums. :func:`sparse_moe_block` (ops/moe/block.py) runs route -> decode_gate_up ->
decode_down for M <= ``DECODE_MAX_M`` tokens (4 launches, no align, no combine), else route -> align ->
grouped GEMMs -> combine.

``DECODE_MAX_M`` (4; a kind of quantized experts may set its own, :func:`decode_max_m`): the decode kernels read each pair's expert rows on their own (a pair = one token's pick),
so their weight bytes grow with M * k' while the grouped GEMMs' grow with the distinct experts; the pairs that
share an expert in one step (the shared expert: all M) meet in L2, because the programs of one weight block
run side by side. The H200 crossover (benchmarks/bench_moe.py, rows moe_block_paths, 35B-A3B's block, graph
device time, session 13): decode 27.1 / 42.6 / 69.4 / 118.8 us at M = 1 / 2 / 4 / 8, grouped 37.2 / 52.3 / 70.9 /
110.9 us.

Layouts and requirements (checked before any launch, :class:`OpError` otherwise):
  x            bf16 [M, H], last dim contiguous, row stride % 16 elements, 16-byte aligned, H % 16 == 0
  w1           bf16 [E', 2I, H] (gate rows then up rows), w2 bf16 [E', H, I]: last dim contiguous, strides % 16
               elements, 16-byte aligned; I % 16 == 0
  topk_ids     int32 [M, k'], topk_weights fp32 [M, k'], contiguous, 1 <= k' <= 16
  h            bf16 [M * k', I] (decode_gate_up's out, decode_down's input), last dim contiguous, row stride % 16,
               16-byte aligned;  out bf16 [M, H] likewise
  an output overlaps none of its op's inputs.
The ids' values are not read on the host (no sync): an id outside [0, E') gives a zero h row and contributes
nothing to out (kernels_src/moe/decode.py states the rule), so no value makes a kernel touch memory outside
these tensors.

Tiles (``TILES``; the rule takes the first of each kernel, ``_tile=`` forces another: benchmarks): gate_up
BLOCK_N 8 x BLOCK_K 256 (4 warps), 8 x 512 (4 warps) or 16 x 512 (8 warps); down with k' <= 9 slots as a tile of 8
and one of 1, BLOCK_N 8 x BLOCK_K 128 (8 warps; the pick for the 35B-A3B's 8 picks + the shared expert: 6.5 us at
M = 1 vs 9.0 for the 16-slot 4 x 64 tile on the H200, BENCHMARKS.md session 21) or 4 x 128 (4 warps), or every
slot (16 >= k') in one tile: 4 x 64 (4 warps), 4 x 128 (8 warps) or 2 x 128 (4 warps); the down rule takes the
first tile holding k'. Both kernels load the next K step's weights before reducing the current one. Grids:
gate_up (M * k', cdiv(I, BLOCK_N)), down (M, cdiv(H, BLOCK_N)): a pure function of the shapes, so graph-stable.

Quantized experts (ops/moe/experts.py): ``w1`` / ``w2`` as :class:`~vkc_runtime.ops.moe.nvfp4_ops.Nvfp4Experts` run
the W4A16 kernels (kernels_src/moe/nvfp4.py), as :class:`~vkc_runtime.ops.moe.fp8_ops.Fp8Experts` the W8A16 ones
(kernels_src/moe/fp8.py): the same grids and rules; tiles in each kind's TILES.

Graphs: no workspace, no allocation; the block's :func:`moe_workspace` loads these kernels and holds the h rows
(its ``h`` buffer). Calls with torch tensors are bound calls (vkc_runtime.bound). Deterministic: no atomics.
"""
from __future__ import annotations

from ...bound import CallCache, Launch, disjoint
from ...kernels import get_kernel
from .._check import BF16, OpError, cdiv, fits_i32, grid_y, row_stride, same_device, stream_of, tensor
from .common import routing
from . import experts as _xk

__all__ = ["decode_gate_up", "decode_down", "DECODE_MAX_M", "decode_max_m", "TILES", "DECODE_BASES", "load_kernels"]

DECODE_MAX_M = 4


def decode_max_m(kind: str | None = None) -> int:
    """The largest M the block takes the decode path at, for experts of ``kind`` (ops/moe/experts.py; None: bf16):
    the kind module's own DECODE_MAX_M where it sets one (measured per kind), else ``DECODE_MAX_M``."""
    return getattr(_xk.module(kind), "DECODE_MAX_M", DECODE_MAX_M) if kind else DECODE_MAX_M
# kernel -> its tiles, the rule's pick first (kernels_src/moe/decode_spec.py compiles the same list):
# gate_up (BLOCK_N, BLOCK_K), down (BLOCK_N, BLOCK_K, slots); the down rule takes the first tile holding k'
TILES = {"gate_up": ((8, 256), (8, 512), (16, 512)),
         "down": ((8, 128, 9), (4, 128, 9), (4, 64, 16), (4, 128, 16), (2, 128, 16))}


def _base(kind: str, tile: tuple, weights: str | None = None) -> str:
    """The kernel name (spelled once: the ops call this, DECODE_BASES is built from it); ``weights``: a quantized
    kind's kernel (ops/moe/experts.py: "nvfp4", "fp8")."""
    if weights:
        return _xk.module(weights).base(kind, tile)
    if kind == "gate_up":
        return f"moe.decode.gate_up.n{tile[0]}.k{tile[1]}"
    return f"moe.decode.down.n{tile[0]}.k{tile[1]}.s{tile[2]}"


DECODE_BASES = tuple(_base(kind, t) for kind, tiles in TILES.items() for t in tiles) + \
    tuple(_base(kind, t, w) for w in _xk.KINDS for kind in TILES for t in _xk.module(w).TILES[kind])
BASES = DECODE_BASES

_gate_up_calls = CallCache()
_down_calls = CallCache()


def load_kernels(*, device: int | None = None) -> None:
    """Load every decode kernel in the current context (before a graph capture)."""
    for b in DECODE_BASES:
        get_kernel(b, device=device).load()


def _pick_tile(op: str, kind: str, forced, weights: str | None = None, k: int = 1):
    """The rule's tile (the first listed; for down the first holding k slots) or the forced one."""
    tiles = _xk.module(weights).TILES[kind] if weights else TILES[kind]
    fits = [t for t in tiles if kind != "down" or t[2] >= k]
    if forced is None:
        return fits[0]
    if forced not in tiles:
        raise OpError(f"{op}: _tile {forced!r} is not a compiled {kind} tile: {tiles}")
    if forced not in fits:
        raise OpError(f"{op}: _tile {forced!r} holds {forced[2]} slots, fewer than k' = {k}")
    return forced


def _span(t) -> tuple[int, int]:
    if any(n == 0 for n in t.shape):
        return t.ptr, t.ptr
    return t.ptr, t.ptr + sum((s - 1) * st for s, st in zip(t.shape, t.strides)) * t.itemsize + t.itemsize


def _no_overlap(op: str, out, others) -> None:
    o0, o1 = _span(out)
    for name, t in others:
        a0, a1 = _span(t)
        if a0 < o1 and o0 < a1:
            raise OpError(f"{op}: out must not overlap {name}")


def _a16(op: str, name: str, t, strides) -> None:
    if t.ptr % 16:
        raise OpError(f"{op}: {name} must be 16-byte aligned")
    for s in strides:
        if s % 16:
            raise OpError(f"{op}: {name} strides {tuple(t.strides)} must be multiples of 16 elements")


def _rows(op: str, name: str, t, shape) -> int:
    """The row stride of a [rows, cols] bf16 operand (checked: % 16 elements, 16-byte aligned, rows apart; one
    row: never used by the kernel, passed as cols rounded up to 16)."""
    rows, cols = shape
    st = row_stride(t) if rows > 1 else cdiv(cols, 16) * 16
    _a16(op, name, t, (st,))
    if rows > 1 and st < cols:
        raise OpError(f"{op}: {name} rows overlap (row stride {st} < {cols})")
    return st


def _weights(op: str, name: str, w, rows: int, K: int) -> tuple[int, int]:
    """(stride_e, stride_row) of expert weights [E', rows, K] (last dim contiguous, strides % 16, aligned)."""
    E = w.shape[0]
    se = int(w.strides[0]) if E > 1 else rows * K
    sr = int(w.strides[1]) if rows > 1 else K
    _a16(op, name, w, (se, sr))
    return se, sr


def decode_gate_up(x, w1, topk_ids, *, out, stream=None, _tile: tuple | None = None):
    """``out`` bf16 [M * k', I] = silu(gate) * up of every (token, pick) pair's expert (module doc). Returns
    ``out``. ``_tile`` forces a compiled (BLOCK_N, BLOCK_K) tile (benchmarks)."""
    op = "moe.decode_gate_up"
    s = stream_of(stream)
    kind = _xk.kind_of(w1)
    key = (op, _tile, kind)
    if _gate_up_calls.run(key, (x, *_xk.flat(w1), topk_ids, out), (), s):
        return out
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, H = xt.shape
    if kind:
        q = _xk.module(kind).experts_refs(op, "w1", w1, rows=None, K=H, gate_up=True)
        wt, Ep, R = q.codes, q.E, q.R
    else:
        wt = tensor(op, "w1", w1, BF16, ndim=3, shape=(None, None, H))
        Ep, R, _ = wt.shape
    if Ep < 1:
        raise OpError(f"{op}: w1 has no experts")
    if R % 2 or R == 0:
        raise OpError(f"{op}: w1 must hold 2I rows per expert (gate rows then up rows), got {R}")
    I = R // 2
    it, _, Mi, k = routing(op, topk_ids)
    if Mi != M:
        raise OpError(f"{op}: topk_ids has {Mi} rows, x has {M}")
    P = M * k
    ot = tensor(op, "out", out, BF16, ndim=2, shape=(P, I))
    dev = same_device(op, xt, wt, it, ot)
    if H == 0 or H % 16 or I % 16:
        raise OpError(f"{op}: H={H} and I={I} must be positive multiples of 16")
    sx = _rows(op, "x", xt, (M, H))
    sh = _rows(op, "out", ot, (P, I))
    if kind:
        wrefs, wstr = q.tensors, q.strides
        _no_overlap(op, ot, [("x", xt), *q.named, ("topk_ids", it)])
    else:
        wrefs, wstr = (wt,), _weights(op, "w1", wt, R, H)
        _no_overlap(op, ot, [("x", xt), ("w1", wt), ("topk_ids", it)])
    fits_i32(op, P=P, E=Ep, R=R, H=H, stride_x=sx, stride_we=wstr[0], stride_wn=wstr[1], stride_h=sh)
    if P == 0:
        return out
    tile = _pick_tile(op, "gate_up", _tile, kind)
    kern = get_kernel(_base("gate_up", tile, kind), device=None if dev < 0 else dev)
    grid = (P, grid_y(op, cdiv(I, tile[0])), 1)
    args = (xt, *wrefs, it, ot, P, Ep, I, H, k, sx, *wstr, sh)
    slots = (xt, *wrefs, it, ot)
    _gate_up_calls.launch(key, slots, (), [Launch(kern, grid, args)], s,
                          relations=[disjoint(ot, r) for r in slots if r is not ot])
    return out


def decode_down(h, w2, topk_ids, topk_weights, *, out, stream=None, _tile: tuple | None = None):
    """``out`` bf16 [M, H] = the routing-weighted sum of every pick's down projection (module doc). Returns
    ``out``. ``_tile`` forces a compiled (BLOCK_N, BLOCK_K, SB) tile (benchmarks)."""
    op = "moe.decode_down"
    s = stream_of(stream)
    kind = _xk.kind_of(w2)
    key = (op, _tile, kind)
    if _down_calls.run(key, (h, *_xk.flat(w2), topk_ids, topk_weights, out), (), s):
        return out
    it, wts, M, k = routing(op, topk_ids, topk_weights)
    if wts is None:
        raise OpError(f"{op}: topk_weights is required")
    P = M * k
    ht = tensor(op, "h", h, BF16, ndim=2, shape=(P, None))
    I = ht.shape[1]
    if kind:
        q = _xk.module(kind).experts_refs(op, "w2", w2, rows=None, K=I, gate_up=False)
        wt, Ep, H = q.codes, q.E, q.R
    else:
        wt = tensor(op, "w2", w2, BF16, ndim=3, shape=(None, None, I))
        Ep, H, _ = wt.shape
    if Ep < 1:
        raise OpError(f"{op}: w2 has no experts")
    ot = tensor(op, "out", out, BF16, ndim=2, shape=(M, H))
    dev = same_device(op, ht, wt, it, wts, ot)
    if I == 0 or I % 16 or H == 0:
        raise OpError(f"{op}: I={I} must be a positive multiple of 16 and H={H} positive")
    sh = _rows(op, "h", ht, (P, I))
    so = _rows(op, "out", ot, (M, H))
    if kind:
        wrefs, wstr, wnamed = q.tensors, q.strides, q.named
    else:
        wrefs, wstr, wnamed = (wt,), _weights(op, "w2", wt, H, I), [("w2", wt)]
    _no_overlap(op, ot, [("h", ht), *wnamed, ("topk_ids", it), ("topk_weights", wts)])
    fits_i32(op, P=P, E=Ep, I=I, H=H, stride_h=sh, stride_we=wstr[0], stride_wn=wstr[1], stride_o=so)
    if M == 0:
        return out
    tile = _pick_tile(op, "down", _tile, kind, k)
    kern = get_kernel(_base("down", tile, kind), device=None if dev < 0 else dev)
    grid = (M, grid_y(op, cdiv(H, tile[0])), 1)
    args = (ht, *wrefs, it, wts, ot, Ep, H, I, k, sh, *wstr, so)
    slots = (ht, *wrefs, it, wts, ot)
    _down_calls.launch(key, slots, (), [Launch(kern, grid, args)], s,
                       relations=[disjoint(ot, r) for r in slots if r is not ot])
    return out
