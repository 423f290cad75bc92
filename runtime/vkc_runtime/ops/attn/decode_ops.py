"""Split-KV decode over the paged KV cache: :func:`decode`, :class:`DecodePlan`, :class:`DecodeWorkspace` and
the split heuristic (module docstring of :mod:`vkc_runtime.ops.attn`: layouts, device-data rules)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ... import memory
from ...bound import CallCache, Launch
from ...kernels import get_kernel, has_kernel
from ...scratch import GlobalScratch
from .._check import OpError, cdiv, fits_i32, same_device, stream_of, tensor
from .._check import sm_count as _sm_count
from .common import (BF16, HEAD_DIMS, LayerCalls, block_tables_arg, cache_pair, check_capacity, decode_base,
                     decode_bases, group_size, plan_caches, plan_dims, q_out_gate)

__all__ = ["decode", "DecodePlan", "DecodeWorkspace", "decode_workspace", "num_splits_for", "use_fused_combine",
           "MIN_KEYS_PER_SPLIT", "CTAS_PER_SM", "DEFAULT_MAX_SPLITS", "FUSED_KEYS_PER_SPLIT2"]

MIN_KEYS_PER_SPLIT = 64  # one BLOCK_N tile of the decode kernels (shorter splits win at small B: BENCHMARKS.md)
CTAS_PER_SM = 2  # default resident CTAs per SM (decode asks the driver for the loaded kernel's occupancy)
DEFAULT_MAX_SPLITS = 64
FUSED_KEYS_PER_SPLIT2 = 128  # fused combine when keys per split >= this x splits (see use_fused_combine)


@dataclass(frozen=True, eq=False)  # immutable, compared and hashed by identity (bound calls key on it)
class DecodeWorkspace:
    """Scratch of split-KV decode: fp32 partial outputs [max_batch, Hq, max_splits, D] and their
    log-sum-exps [max_batch, Hq, max_splits] -- every byte a combine reads is written by a split of the same
    call first, so stale content is fine -- and int32 tickets [max_batch * Hq] of the one-launch path
    (decode_fused), zeroed at allocation and left zero by every launch. ``scratch``: the TMA kernels' global
    scratch (their descriptors, built on the device) for grids of up to max_batch * max_kv_heads * max_splits
    programs; None where the arch has no TMA decode kernel."""
    part_o: memory.DeviceArray
    part_lse: memory.DeviceArray
    counters: memory.DeviceArray
    max_batch: int
    num_q_heads: int
    head_dim: int
    max_splits: int
    scratch: GlobalScratch | None = None
    max_kv_heads: int = 0


def decode_workspace(max_batch: int, num_q_heads: int, head_dim: int, max_splits: int = DEFAULT_MAX_SPLITS,
                     *, num_kv_heads: int | None = None, device: int | None = None) -> DecodeWorkspace:
    """Allocate decode scratch for up to ``max_batch`` sequences and ``max_splits`` KV splits (do this
    before graph capture; 256 x 24 x 64 x 256 x 4 B = 400 MB at the largest Qwen3.6 decode shape, so size
    max_splits to need: the heuristic only uses many splits for small batches). ``num_kv_heads`` (default
    num_q_heads, the most there can be) sizes the TMA kernels' global scratch. Also loads every decode kernel
    of ``head_dim``, so that a capture right after loads no module."""
    hkv = num_q_heads if num_kv_heads is None else num_kv_heads
    if min(max_batch, num_q_heads, head_dim, max_splits, hkv) < 1:
        raise OpError("decode_workspace: all sizes must be positive")
    if head_dim not in HEAD_DIMS:
        raise OpError(f"decode_workspace: head dim must be one of {HEAD_DIMS}, got {head_dim}")
    po = memory.DeviceArray.empty((max_batch * num_q_heads * max_splits * head_dim,), "float32", device=device)
    pl = memory.DeviceArray.empty((max_batch * num_q_heads * max_splits,), "float32", device=device)
    cnt = memory.DeviceArray.zeros((max_batch * num_q_heads,), "int32", device=device)
    n = 0
    for base, k in _load_kernels(int(head_dim), device).items():
        if base.endswith(".tma"):  # the largest grid _decode_launches can make for these sizes
            n = max(n, k.scratch_bytes((max_batch * hkv * max_splits, 1, 1)))
    return DecodeWorkspace(po, pl, cnt, int(max_batch), int(num_q_heads), int(head_dim), int(max_splits),
                           GlobalScratch(n, device=device) if n else None, int(hkv))


def _load_kernels(D: int, device: int | None = None) -> dict:
    """Load (cuModuleLoadData) every decode kernel of head dim ``D`` the selected arch has (gather, and TMA where
    built) now, outside any graph capture; base -> Kernel."""
    out = {}
    tma = decode_bases(D, tma=True)
    for base in decode_bases(D) + (tma if has_kernel(tma[0], device=device) else ()):
        k = out[base] = get_kernel(base, device=device)
        k.load()
    return out


def _tma_for(ws: DecodeWorkspace, B: int, Hkv: int, D: int, BS: int) -> bool:
    """Whether a batch takes the TMA kernels (where it launches them the cache's strides are checked too,
    _decode_launches): the arch has them, the block size is a multiple of their key tile, the workspace
    carries their global scratch for this many (sequence, kv head) pairs."""
    base = decode_base("split", D, tma=True)
    return (ws.scratch is not None and B * Hkv <= ws.max_batch * ws.max_kv_heads and has_kernel(base)
            and BS % get_kernel(base).constexprs["BLOCK_N"] == 0)


_ws_cache: dict[tuple, DecodeWorkspace] = {}


@lru_cache(maxsize=4096)  # a pure function of host ints, asked on every decode call
def num_splits_for(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int, *,
                   max_splits: int = DEFAULT_MAX_SPLITS, min_keys: int = MIN_KEYS_PER_SPLIT,
                   ctas_per_sm: int = CTAS_PER_SM) -> int:
    """Split-KV heuristic. Work items are (sequence, kv head) pairs, B * Hkv of them, each cut into s splits of
    ~L / s keys; the launch runs in ceil(B * Hkv * s / slots) waves of slots = ctas_per_sm * num_sms CTAs, so
    the time is ~ waves(s) / s (in units of one unsplit item). Pick the smallest s whose cost is within 5% of
    the best s in [1, min(max_splits, L // min_keys)]: full waves without the tail of a partial one (e.g.
    16 x 4 items on 264 slots: s = 4 is one full wave, s = 5 would be 1.2 waves), and no split shorter than
    ``min_keys`` keys, one key tile of the kernel. A CTA streams its keys at a per-SM rate far below 1/132 of
    HBM, so a small batch wants as many SMs as the wave allows even for one tile each (the measured sweep is in
    BENCHMARKS.md, "decode-sweep"). Depends only on host-side sizes, so it is graph-stable."""
    work = max(1, batch * num_kv_heads)
    slots = max(1, ctas_per_sm * max(1, num_sms))
    hi = int(max(1, min(max_splits, max_seq_len // max(1, min_keys))))
    cost = {s: cdiv(work * s, slots) / s for s in range(1, hi + 1)}
    best = min(cost.values())
    return next(s for s in range(1, hi + 1) if cost[s] <= best * 1.05)


def use_fused_combine(splits: int, max_seq_len: int, *, tma: bool = False,
                      factor: int = FUSED_KEYS_PER_SPLIT2) -> bool:
    """Whether the gather decode kernels combine the splits' partials inside the split launch (decode_fused:
    the last split of each (sequence, kv head) merges the group's partials; one launch) rather than in a
    separate combine launch. The fused merge saves a launch and the partials' round trip, but one CTA merges
    all `splits` partials serially after its own split, a tail ~ splits that pays off only when each split's
    own work (~ L / splits keys) is larger: fused iff L / splits >= factor * splits and splits <= 64 (the
    fused / separate timings that set the rule are in BENCHMARKS.md, session 5). The TMA kernels (``tma``)
    never take it: there it measured slower than the separate combine at every batch, context and split count
    timed (BENCHMARKS.md, session 37), by up to 1.7x at short contexts under a split count chosen for a wide
    block table."""
    return not tma and 1 < splits <= 64 and max_seq_len >= factor * splits * splits


def decode(q, k_cache, v_cache, block_tables, seq_lens, scale, *, gate=None, out=None, workspace=None,
           max_seq_len=None, num_splits=None, fused=None, stream=None):
    """One query token per sequence: q [B, Hq, D] at position seq_lens[b] - 1 attends to keys 0..L-1 of the
    paged caches (append the token's K/V with :func:`reshape_and_cache` first). Returns out [B, Hq, D] bf16.

    ``max_seq_len``: host-side upper bound of seq_lens, used by the split heuristic (default: the block
    table's capacity, block_tables.shape[1] * block_size). ``workspace``: a :class:`DecodeWorkspace` with
    max_batch >= B (required inside graph capture; otherwise one is allocated and cached per shape).
    ``num_splits``: force the KV split count (1..workspace.max_splits; benchmarks and tuning), default
    :func:`num_splits_for`. ``fused``: with more than one split, combine in the split launch (the last split
    of each group merges; one launch) or in a separate combine launch; default :func:`use_fused_combine`
    (never with the TMA kernels).
    Several layers decoding the same batch: :class:`DecodePlan` checks the batch once and each layer's call
    only its own tensors. With ``out=`` and torch tensors, a call whose inputs have the layout of a recent call
    is a bound call (see vkc_runtime.bound): no revalidation, the recorded launches with the new pointers."""
    s = stream_of(stream)
    if out is not None:
        key = (gate is None, workspace, max_seq_len, num_splits, fused)
        tensors = (q, k_cache, v_cache, block_tables, seq_lens, out)
        if _decode_calls.run(key, tensors if gate is None else tensors + (gate,), (scale,), s):
            return out
    op = "decode"
    cache = cache_pair(op, k_cache, v_cache)
    BS, Hkv, D = cache.block_size, cache.num_kv_heads, cache.head_dim
    qt = tensor(op, "q", q, BF16, ndim=3, shape=(None, None, D))
    B, Hq, _ = qt.shape
    batch = _decode_batch(op, block_tables, seq_lens, B, Hq, Hkv, D, BS, max_seq_len, workspace, num_splits, fused,
                          qt.device)
    res = out if out is not None else memory.DeviceArray.empty((B, Hq, D), BF16, device=qt.device)
    ot = tensor(op, "out", res, BF16, ndim=3, shape=(B, Hq, D))
    same_device(op, qt, cache.k, cache.v, ot, batch.bt, batch.sl)
    if B:
        launches, gslot = _decode_launches(op, batch, qt, cache, ot, gate, scale)
        slots = None if out is None else (qt, cache.k, cache.v, batch.bt, batch.sl, ot) + gslot
        _decode_calls.launch(key if out is not None else None, slots, (scale,), launches, s)
    return res


_decode_calls = CallCache()


class DecodePlan:
    """Decode of one batch layout for several layers (plan once per step, run per layer): the block tables,
    sequence lengths, workspace, split count and kernels are checked / chosen once; :meth:`run` checks only
    that layer's q, caches, out and gate, and launches. Results are identical to :func:`decode` with the
    same arguments. The plan keeps references to ``block_tables``, ``seq_lens`` and the workspace: update
    their contents in place between steps as you like (they are device data), but build a new plan when
    the batch size, the block-table width or ``max_seq_len`` changes. A plan belongs to the context current
    when it is made: it loads every decode kernel of its head dim there, so a graph capture of :meth:`run`
    loads no module."""

    def __init__(self, block_tables, seq_lens, *, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 block_size: int, workspace=None, max_seq_len=None, num_splits=None, fused=None):
        op = "DecodePlan"
        plan_dims(op, int(num_q_heads), int(num_kv_heads), int(head_dim), int(block_size))
        sl = tensor(op, "seq_lens", seq_lens, "int32", ndim=1)
        self._keep = (block_tables, seq_lens, workspace)
        self.batch = _decode_batch(op, block_tables, seq_lens, sl.shape[0], int(num_q_heads), int(num_kv_heads),
                                   int(head_dim), int(block_size), max_seq_len, workspace, num_splits, fused,
                                   sl.device)
        if self.batch.B:  # every kernel run() can launch, loaded now: a capture of run() loads no module
            self.batch.kernels.update(_load_kernels(self.batch.D))
        self._calls = LayerCalls()

    @property
    def num_splits(self) -> int:
        return self.batch.splits

    def run(self, q, k_cache, v_cache, scale, *, out, gate=None, stream=None):
        """out [B, Hq, D] bf16 (required: a plan is meant for graph capture and per-layer reuse)."""
        s = stream_of(stream)
        if self._calls.replay(q, k_cache, v_cache, out, gate, scale, s):
            return out
        op = "DecodePlan.run"
        p = self.batch
        cache = plan_caches(op, k_cache, v_cache, p.BS, p.Hkv, p.D)
        qt = tensor(op, "q", q, BF16, ndim=3, shape=(p.B, p.Hq, p.D))
        ot = tensor(op, "out", out, BF16, ndim=3, shape=(p.B, p.Hq, p.D))
        same_device(op, qt, cache.k, cache.v, ot, p.bt, p.sl)
        if p.B:
            launches, gslot = _decode_launches(op, p, qt, cache, ot, gate, scale)
            self._calls.launch(qt, cache, ot, gslot, gate, scale, launches, s)
        return out


@dataclass(frozen=True)
class _DecodeBatch:
    """What a decode launch takes from the batch layout alone (see _decode_batch)."""
    B: int
    Hq: int
    Hkv: int
    group: int
    D: int
    BS: int
    bt: object
    sbt: int
    sl: object
    ws: DecodeWorkspace | None  # None: empty batch
    splits: int
    fused: bool
    tma: bool = False  # the TMA kernels where the cache allows them (_decode_launches)
    kernels: dict = field(default_factory=dict, compare=False, repr=False)  # base -> Kernel, filled on use


def _decode_batch(op, block_tables, seq_lens, B, Hq, Hkv, D, BS, max_seq_len, workspace, num_splits, fused,
                  device) -> _DecodeBatch:
    group = group_size(op, Hq, Hkv)
    sl = tensor(op, "seq_lens", seq_lens, "int32", ndim=1, shape=(B,))
    if B > 1 and sl.strides[0] != 1:
        raise OpError(f"{op}: seq_lens must be contiguous")
    tables = block_tables_arg(op, block_tables, B)
    bt, sbt = tables.ref, tables.row_stride
    cap = bt.shape[1] * BS
    check_capacity(op, bt.shape[1], BS)
    if max_seq_len is None:
        max_seq_len = cap
    max_seq_len = int(max_seq_len)
    if max_seq_len > cap:
        raise OpError(f"{op}: max_seq_len {max_seq_len} exceeds the block table capacity "
                      f"{bt.shape[1]} blocks x {BS} = {cap}")
    if B == 0:  # nothing to launch
        return _DecodeBatch(B, Hq, Hkv, group, D, BS, bt, sbt, sl, None, 0, False)
    ws = workspace
    if ws is None:
        key = (device, B, Hq, D)
        ws = _ws_cache.get(key)
        if ws is None:
            ws = _ws_cache.setdefault(key, decode_workspace(B, Hq, D, device=device if device >= 0 else None))
    if not isinstance(ws, DecodeWorkspace):
        raise OpError(f"{op}: workspace must be a DecodeWorkspace (see decode_workspace)")
    if ws.max_batch < B or ws.num_q_heads != Hq or ws.head_dim != D:
        raise OpError(f"{op}: workspace sized for batch {ws.max_batch}, {ws.num_q_heads} heads, D {ws.head_dim}; "
                      f"this call needs batch {B}, {Hq} heads, D {D}")
    tma = _tma_for(ws, B, Hkv, D, BS)
    if num_splits is None:
        split_k = get_kernel(decode_base("split", D, tma=tma))
        # one TMA CTA streams an SM's share of HBM by itself: the slots are the SMs, not the resident CTAs (H100,
        # 24/4 x 256, B 1: 32 splits 13.1 / 53.7 us at L 4096 / 32768 vs 15.6 / 57.4 with 61 at 2 CTAs per SM)
        splits = num_splits_for(B, Hkv, max_seq_len, _sm_count(split_k.device), max_splits=ws.max_splits,
                                ctas_per_sm=1 if tma else max(1, split_k.max_active_blocks()))
    else:
        splits = int(num_splits)
        if not 1 <= splits <= ws.max_splits:
            raise OpError(f"{op}: num_splits={num_splits} is outside 1..{ws.max_splits} (the workspace's max_splits)")
    fits_i32(op, grid=B * Hkv * splits, partials=B * Hq * splits * D)
    return _DecodeBatch(B, Hq, Hkv, group, D, BS, bt, sbt, sl, ws, splits,
                        bool(fused) if fused is not None else use_fused_combine(splits, max_seq_len, tma=tma), tma)


def _kernel(kernels: dict, base: str):
    """The Kernel for ``base`` through a batch's cache (get_kernel asks the driver for the current context; a
    plan fills the cache when it is made)."""
    k = kernels.get(base)
    if k is None:
        k = kernels[base] = get_kernel(base)
    return k


def _decode_launches(op, p: _DecodeBatch, qt, cache, ot, gate, scale):
    """The launch list of one decode call (for run_launches) and the gate's slot: () or (gate tensor,)."""
    kc, vc, NB, BS, Hkv, D = cache.k, cache.v, cache.num_blocks, cache.block_size, cache.num_kv_heads, cache.head_dim
    sb, ss, sh = cache.stride_block, cache.stride_slot, cache.stride_head
    B, Hq, group, splits, bt, sl, ws = p.B, p.Hq, p.group, p.splits, p.bt, p.sl, p.ws
    st = q_out_gate(op, qt, ot, gate, B, Hq, D, "b")
    sqb, sqh, sob, soh, gt, sgb, sgh = st.q_row, st.q_head, st.out_row, st.out_head, st.gate, st.gate_row, st.gate_head
    g = gate is not None
    gslot = () if gate is None else (gt,)
    paged = (sb, ss, sh, p.sbt, BS, bt.shape[1], NB)
    # TMA: the cache as a matrix of slot rows (block stride a multiple of the slot stride, rows int32-indexable)
    tma = p.tma and sb % ss == 0 and NB * (sb // ss) < 2**31
    scr = ws.scratch if tma else None
    if splits == 1:  # one launch: the direct kernel normalizes, gates and stores; no partials, no combine
        return [Launch(_kernel(p.kernels, decode_base("direct", D, g, tma)), (B * Hkv, 1, 1),
                       (qt, kc, vc, bt, sl, ot, gt, float(scale), Hkv, group, sqb, sqh, sob, soh, sgb, sgh) + paged,
                       scr)], gslot
    po, pl = ws.part_o.data_ptr(), ws.part_lse.data_ptr()
    if p.fused:  # one launch: the last split of each group combines
        return [Launch(_kernel(p.kernels, decode_base("fused", D, g, tma)), (B * Hkv * splits, 1, 1),
                       (qt, kc, vc, bt, sl, po, pl, ws.counters.data_ptr(), ot, gt, float(scale), Hkv, group, splits,
                        sqb, sqh, sob, soh, sgb, sgh) + paged, scr)], gslot
    return [Launch(_kernel(p.kernels, decode_base("split", D, tma=tma)), (B * Hkv * splits, 1, 1),
                   (qt, kc, vc, bt, sl, po, pl, float(scale), Hkv, group, splits, sqb, sqh) + paged, scr),
            Launch(_kernel(p.kernels, decode_base("combine", D, g)), (B * Hq, 1, 1),
                   (po, pl, ot, gt, Hq, splits, sob, soh, sgb, sgh))], gslot


