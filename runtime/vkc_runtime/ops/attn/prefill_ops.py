"""Varlen causal prefill over the paged KV cache: :func:`prefill`, :class:`PrefillPlan`, the TMA kernel's
:class:`PrefillWorkspace` (module docstring of :mod:`vkc_runtime.ops.attn`: layouts, device-data rules)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ... import memory
from ...bound import CallCache, Launch
from ...kernels import get_kernel, has_kernel
from ...scratch import GlobalScratch
from .._check import OpError, cdiv, fits_i32, same_device, stream_of, tensor
from .common import (BF16, GATES, HEAD_DIMS, LayerCalls, block_tables_arg, cache_pair, check_capacity,
                     group_size, plan_caches, plan_dims, prefill_base, q_out_gate)

__all__ = ["prefill", "PrefillPlan", "prefill_uses_tma", "PrefillWorkspace", "prefill_workspace"]


def _prefill_kernel(D: int, gate: bool, BS: int, NB: int, sb: int, ss: int, use_tma, kernels: dict | None = None):
    """The TMA kernel (sm_90a/sm_100a artifacts) when the cache allows it -- block_size a multiple of its
    BLOCK_N, the block stride a multiple of the slot stride, slot rows indexable in int32 -- else the
    gather kernel. use_tma: None = automatic, False = gather, True = TMA or an error. ``kernels``: a plan's
    cache of the choice per (D, gate, cache geometry, use_tma)."""
    key = (D, gate, BS, NB, sb, ss, use_tma)
    if kernels is not None:
        k = kernels.get(key)
        if k is not None:
            return k
    base, tma_base = prefill_base(D, gate), prefill_base(D, gate, tma=True)
    k = None
    if use_tma is not False and has_kernel(tma_base):
        tk = get_kernel(tma_base)
        bn = tk.constexprs["BLOCK_N"]
        why = (f"block_size {BS} is not a multiple of {bn}" if BS % bn else
               f"block stride {sb} is not a multiple of the slot stride {ss}" if sb % ss else
               "more than 2^31 slot rows" if NB * (sb // ss) >= 2**31 else None)
        if why is None:
            k = tk
        elif use_tma:
            raise OpError(f"prefill: use_tma=True but the TMA kernel cannot read this cache: {why}")
    elif use_tma:
        raise OpError(f"prefill: use_tma=True but the selected arch has no {tma_base} artifact (sm_90a/sm_100a)")
    if k is None:
        k = get_kernel(base)
    if kernels is not None:
        kernels[key] = k
    return k


def prefill_uses_tma(k_cache, *, gate: bool = False) -> bool:
    """Whether :func:`prefill` (use_tma=None) takes the TMA kernel for this cache on the current device."""
    c = cache_pair("prefill_uses_tma", k_cache, k_cache)
    k = _prefill_kernel(c.head_dim, gate, c.block_size, c.num_blocks, c.stride_block, c.stride_slot, None)
    return k.base == prefill_base(c.head_dim, gate, tma=True)


@dataclass(frozen=True)
class _PrefillBatch:
    """What a prefill launch takes from the packed batch layout alone (see _prefill_batch)."""
    N: int
    cu: object
    sl: object
    bt: object
    sbt: int
    max_seqlen_q: int | None
    kernels: dict = field(default_factory=dict, compare=False, repr=False)  # see _prefill_kernel


def _prefill_batch(op, cu_seqlens_q, seq_lens, block_tables, max_seqlen_q) -> _PrefillBatch:
    cu = tensor(op, "cu_seqlens_q", cu_seqlens_q, "int32", ndim=1)
    N = cu.shape[0] - 1
    if N < 0:
        raise OpError(f"{op}: cu_seqlens_q must have N+1 >= 1 entries")
    sl = tensor(op, "seq_lens", seq_lens, "int32", ndim=1, shape=(N,))
    for name, t in (("cu_seqlens_q", cu), ("seq_lens", sl)):
        if t.shape[0] > 1 and t.strides[0] != 1:
            raise OpError(f"{op}: {name} must be contiguous")
    tables = block_tables_arg(op, block_tables, N)
    bt, sbt = tables.ref, tables.row_stride
    return _PrefillBatch(N, cu, sl, bt, sbt, None if max_seqlen_q is None else max(int(max_seqlen_q), 1))


@dataclass(frozen=True, eq=False)  # immutable, compared and hashed by identity (bound calls key on it)
class PrefillWorkspace:
    """Global scratch of the TMA prefill kernel (its descriptors, built on the device) for batches of up to
    ``max_tokens`` tokens in ``max_seqs`` sequences with ``num_q_heads`` heads of ``head_dim``; ``scratch`` is
    None where the arch's prefill kernels need none. Pass it to :func:`prefill` / :class:`PrefillPlan` to
    capture on any stream without an eager warm-up; not for launches on two streams at the same time."""
    scratch: GlobalScratch | None
    max_tokens: int
    max_seqs: int
    num_q_heads: int
    head_dim: int


def _load_kernels(D: int, device: int | None = None) -> list:
    """Load (cuModuleLoadData) every prefill kernel of head dim ``D`` the selected arch has (gather, and TMA
    where built) now, outside any graph capture."""
    out = []
    for gate in GATES:
        for base in (prefill_base(D, gate), prefill_base(D, gate, tma=True)):
            if base == prefill_base(D, gate) or has_kernel(base, device=device):
                k = get_kernel(base, device=device)
                k.load()
                out.append(k)
    return out


def prefill_workspace(max_tokens: int, max_seqs: int, num_q_heads: int, head_dim: int, *,
                      device: int | None = None) -> PrefillWorkspace:
    """Allocate a :class:`PrefillWorkspace` and load the prefill kernels of ``head_dim`` (allocates: call it
    before any graph capture; a capture on any stream may follow without an eager warm-up)."""
    if min(max_tokens, max_seqs, num_q_heads) < 1 or head_dim not in HEAD_DIMS:
        raise OpError(f"prefill_workspace: sizes must be positive and head_dim one of {HEAD_DIMS}")
    n = 0
    for k in _load_kernels(head_dim, device):  # so that a capture needs no warm-up
        if k.base.endswith(".tma"):  # the largest grid _prefill_launches can make for these sizes
            n_mb = cdiv(max_tokens, k.constexprs["BLOCK_M"]) + max_seqs
            n = max(n, k.scratch_bytes((num_q_heads * n_mb, 1, 1)))
    return PrefillWorkspace(GlobalScratch(n, device=device) if n else None, int(max_tokens), int(max_seqs),
                            int(num_q_heads), int(head_dim))


def _prefill_scratch(op: str, ws, T: int, N: int, Hq: int, D: int):
    """The workspace's scratch for a prefill of T tokens in N sequences (None: the context's default)."""
    if ws is None:
        return None
    if not isinstance(ws, PrefillWorkspace):
        raise OpError(f"{op}: workspace must be a PrefillWorkspace (see prefill_workspace)")
    if T > ws.max_tokens or N > ws.max_seqs or (Hq, D) != (ws.num_q_heads, ws.head_dim):
        raise OpError(f"{op}: workspace sized for {ws.max_tokens} tokens, {ws.max_seqs} sequences, {ws.num_q_heads} "
                      f"heads, D {ws.head_dim}; this call needs {T}, {N}, {Hq}, D {D}")
    return ws.scratch


def _prefill_launches(op, p: _PrefillBatch, qt, cache, ot, gate, scale, use_tma, workspace=None):
    """The launch list of one prefill call (for run_launches) and the gate's slot: () or (gate tensor,)."""
    kc, vc, NB, BS, Hkv, D = cache.k, cache.v, cache.num_blocks, cache.block_size, cache.num_kv_heads, cache.head_dim
    sb, ss, sh = cache.stride_block, cache.stride_slot, cache.stride_head
    T, Hq, _ = qt.shape
    group = group_size(op, Hq, Hkv)
    scratch = _prefill_scratch(op, workspace, T, p.N, Hq, D)
    st = q_out_gate(op, qt, ot, gate, T, Hq, D, "t")
    kern = _prefill_kernel(D, gate is not None, BS, NB, sb, ss, use_tma, p.kernels)
    bm = kern.constexprs["BLOCK_M"]
    grid = Hq * (cdiv(T, bm) + p.N)  # every m-block any cu_seqlens_q can own (kernels_src/attn/prefill.py)
    fits_i32(op, grid=grid)
    check_capacity(op, p.bt.shape[1], BS)
    args = (qt, kc, vc, ot, st.gate, p.bt, p.cu, p.sl, float(scale), p.N, T, Hq, group, st.q_row, st.q_head,
            st.out_row, st.out_head, st.gate_row, st.gate_head, sb, ss, sh, p.sbt, BS, p.bt.shape[1], NB)
    return [Launch(kern, (grid, 1, 1), args, scratch)], (() if gate is None else (st.gate,))


def prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, *, gate=None, out=None,
            max_seqlen_q=None, use_tma=None, workspace=None, stream=None):
    """Varlen causal attention of packed q [T, Hq, D] against the paged caches (which must already hold the
    new tokens' K/V: call :func:`reshape_and_cache` first). Returns out [T, Hq, D] bf16.

    ``max_seqlen_q`` is accepted for compatibility and has no effect: the grid is always cdiv(T, BLOCK_M) + N
    m-blocks per head, every block any cu_seqlens_q can own (the surplus, at most N + 1 per head for a
    well-formed batch, is scheduled last and exits after its scan), so no value of it -- or of the device
    data -- can leave rows of a processed sequence unwritten. cu_seqlens_q / seq_lens / block_tables values
    are device data, bound-checked on the device (module docstring): sequence i is computed iff
    0 <= cu[i] <= cu[i+1] <= T and no later offset is below cu[i+1]; any other is skipped (its rows keep
    their bytes).
    ``use_tma``: None picks the TMA kernel where it exists (sm_90a/sm_100a) and the cache allows it
    (block_size a multiple of 64 for D=256, 128 for D=128); False forces the gather kernel. The TMA
    kernel uses global scratch for its descriptors: from ``workspace`` (a :class:`PrefillWorkspace`, for
    graph capture without a warm-up), else from the context's default scratch (inside graph capture, run the
    same shape once eagerly first, on any stream). Several layers over the same batch: :class:`PrefillPlan`.
    With ``out=`` and torch tensors, a call whose inputs have the layout of a recent call is a bound call (see
    vkc_runtime.bound): no revalidation, the recorded launches with the new pointers."""
    s = stream_of(stream)
    if out is not None:
        key = (gate is None, max_seqlen_q, use_tma, workspace)
        tensors = (q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out)
        if _prefill_calls.run(key, tensors if gate is None else tensors + (gate,), (scale,), s):
            return out
    op = "prefill"
    cache = cache_pair(op, k_cache, v_cache)
    D = cache.head_dim
    qt = tensor(op, "q", q, BF16, ndim=3, shape=(None, None, D))
    T, Hq, _ = qt.shape
    group_size(op, Hq, cache.num_kv_heads)
    p = _prefill_batch(op, cu_seqlens_q, seq_lens, block_tables, max_seqlen_q)
    res = out if out is not None else memory.DeviceArray.empty((T, Hq, D), BF16, device=qt.device)
    ot = tensor(op, "out", res, BF16, ndim=3, shape=(T, Hq, D))
    same_device(op, qt, cache.k, cache.v, p.cu, p.sl, p.bt, ot)
    if T and p.N:
        launches, gslot = _prefill_launches(op, p, qt, cache, ot, gate, scale, use_tma, workspace)
        slots = None if out is None else (qt, cache.k, cache.v, p.bt, p.cu, p.sl, ot) + gslot
        _prefill_calls.launch(key if out is not None else None, slots, (scale,), launches, s)
    return res


_prefill_calls = CallCache()


class PrefillPlan:
    """Prefill of one packed batch layout for several layers (plan once per step, run per layer), in the
    spirit of :class:`DecodePlan`: ``cu_seqlens_q``, ``seq_lens`` and ``block_tables`` are checked once and
    the kernel choice (TMA or gather, per cache geometry) is made once; :meth:`run` checks only that layer's
    q, caches, out and gate, and launches. Results are identical to :func:`prefill` with the same
    arguments. The plan keeps references to the three batch tensors: update their contents in place
    between steps as you like, but build a new plan when the number of sequences or the block-table width
    changes. A plan belongs to the context current when it is made: it loads its kernels there, so a graph
    capture of :meth:`run` loads no module. ``workspace``: a
    :class:`PrefillWorkspace` for the TMA kernel's global scratch (see :func:`prefill`)."""

    def __init__(self, cu_seqlens_q, seq_lens, block_tables, *, num_q_heads: int, num_kv_heads: int,
                 head_dim: int, block_size: int, max_seqlen_q=None, use_tma=None, workspace=None):
        op = "PrefillPlan"
        plan_dims(op, int(num_q_heads), int(num_kv_heads), int(head_dim), int(block_size))
        if workspace is not None and not isinstance(workspace, PrefillWorkspace):
            raise OpError(f"{op}: workspace must be a PrefillWorkspace (see prefill_workspace)")
        self.workspace = workspace
        self._keep = (cu_seqlens_q, seq_lens, block_tables)
        self.Hq, self.Hkv, self.D, self.BS = int(num_q_heads), int(num_kv_heads), int(head_dim), int(block_size)
        self.use_tma = use_tma
        self.batch = _prefill_batch(op, cu_seqlens_q, seq_lens, block_tables, max_seqlen_q)
        _load_kernels(self.D)  # every kernel run() can pick, loaded now: a capture of run() loads no module
        self._calls = LayerCalls()

    def run(self, q, k_cache, v_cache, scale, *, out, gate=None, stream=None):
        """q, out [T, Hq, D] bf16 (out required: a plan is meant for graph capture and per-layer reuse)."""
        s = stream_of(stream)
        if self._calls.replay(q, k_cache, v_cache, out, gate, scale, s):
            return out
        op = "PrefillPlan.run"
        p = self.batch
        cache = plan_caches(op, k_cache, v_cache, self.BS, self.Hkv, self.D)
        qt = tensor(op, "q", q, BF16, ndim=3, shape=(None, self.Hq, self.D))
        T = qt.shape[0]
        ot = tensor(op, "out", out, BF16, ndim=3, shape=(T, self.Hq, self.D))
        same_device(op, qt, cache.k, cache.v, p.cu, p.sl, p.bt, ot)
        if T and p.N:
            launches, gslot = _prefill_launches(op, p, qt, cache, ot, gate, scale, self.use_tma, self.workspace)
            self._calls.launch(qt, cache, ot, gslot, gate, scale, launches, s)
        return out
