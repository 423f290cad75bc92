"""Typed ops of the attention family (kernels_src/attn): paged KV cache write, varlen causal prefill,
split-KV decode. Qwen3.6 full-attention layers: head dim 256 (128 also built), GQA Hq/Hkv <= 16.

Layouts
  q          prefill [T, Hq, D] / decode [B, Hq, D] bf16, head stride D, token stride any multiple of 16
  k_cache,   [num_blocks, block_size, Hkv, D] bf16 ("NHD"), inner [block_size, Hkv, D] contiguous; k and v
  v_cache    caches must have identical shapes and strides (views of one allocation are fine)
  block_tables int32 [N, max_blocks]; row stride any, entries contiguous
  cu_seqlens_q int32 [N+1]; seq_lens int32 [N] = total context (cached prefix + new tokens)
  gate       optional [T|B, Hq, D] bf16 view with a contiguous last dim (e.g. qg.view(T, Hq, 2, D)[:, :, 1]):
             out *= sigmoid(gate), fused into the epilogue
  out        [T|B, Hq, D] bf16

What is validated on the host: dtypes, shapes, strides, 16-byte alignment of every bf16/fp32 pointer and
multiples of 16 for their strides (the kernels are compiled with those promises), D in {128, 256},
Hq % Hkv == 0 and Hq/Hkv <= 16, block-table width * block_size >= max_seq_len when the caller passes it,
int32 ranges, block-table width * block_size < 2^30. What is *not* validated (it would need a device sync):
block-table contents, cu_seqlens, seq_lens and slot_mapping values. The kernels bound-check those cheaply
instead, so no value of them makes a kernel touch memory outside the tensors it was given: a context length
is clamped to [0, max_blocks * block_size], block ids outside [0, num_blocks) are skipped (their keys do not
count), slots outside [0, num_blocks * block_size) are not written, a row that sees no key (L < q_len)
yields zeros, and prefill processes sequence i only when 0 <= cu[i] <= cu[i+1] <= T and cu[i+1] <= every
later offset (others are skipped: their rows are neither read nor written; so are rows outside every
processed sequence). Results for such inputs are defined but meaningless. Duplicate slots in one
reshape_and_cache call: one of the rows lands in the slot (which one is unspecified), still in bounds.

Prefill kernels: on sm_90a/sm_100a a TMA kernel (K/V tiles loaded as boxes of one cache block, 128 x 64
tiles at D=256) when block_size is a multiple of its key tile (64 at D=256, 128 at D=128) and the block
stride a multiple of the slot stride; otherwise (other archs, block size 16) the gather kernel, which looks
up every key row. :func:`prefill_uses_tma` tells which one a cache gets.

Graph capture (on any stream, torch's capture stream included): pass ``out=`` and, for decode, a
:class:`DecodeWorkspace` sized up front with :func:`decode_workspace` and a ``max_seq_len`` (or the bound
block_tables width * block_size is used); the split count then depends only on host-side sizes, so replay
with new lengths/tables is valid. The TMA prefill kernel builds its descriptors in Triton's global scratch:
pass a :class:`PrefillWorkspace` (:func:`prefill_workspace`) allocated before capture, or run the same shape
once eagerly (on any stream) so the context's default scratch is large enough. One workspace must not be
used by launches on two streams at the same time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from .. import driver, memory
from ..bound import CallCache, Launch
from ..kernels import get_kernel, has_kernel
from ..scratch import GlobalScratch
from ._check import OpError, fits_i32, same_device, stream_of, tensor

__all__ = ["reshape_and_cache", "prefill", "PrefillPlan", "prefill_uses_tma", "PrefillWorkspace",
           "prefill_workspace", "decode", "DecodePlan", "DecodeWorkspace", "decode_workspace", "num_splits_for",
           "use_fused_combine", "MIN_KEYS_PER_SPLIT", "HEAD_DIMS", "OpError", "BASES", "OPTIONAL_BASES"]

HEAD_DIMS = (128, 256)
MAX_GROUP = 16  # q heads per kv head processed as one padded 16-row operand in decode
BF16 = "bfloat16"
MIN_KEYS_PER_SPLIT = 64  # one BLOCK_N tile of the decode kernels (shorter splits win at small B: BENCHMARKS.md)
CTAS_PER_SM = 2  # default resident CTAs per SM (decode asks the driver for the loaded kernel's occupancy)
DEFAULT_MAX_SPLITS = 64
FUSED_KEYS_PER_SPLIT2 = 128  # fused combine when keys per split >= this x splits (see use_fused_combine)

_GATES = (True, False)


# the kernel names, spelled once: the ops call these, BASES / OPTIONAL_BASES are built from them
def _cache_write_base(aligned: bool) -> str:
    return f"attn.reshape_and_cache.{'a16' if aligned else 'any'}"


def _prefill_base(D: int, gate: bool, tma: bool = False) -> str:
    return f"attn.prefill.d{D}.{'gate' if gate else 'nogate'}" + (".tma" if tma else "")


def _decode_base(kind: str, D: int, gate: bool | None = None) -> str:
    """kind: "split" (no gate: the gate is applied where the splits are combined), "direct", "fused", "combine"."""
    return f"attn.decode_{kind}.d{D}" + ("" if gate is None else f".{'gate' if gate else 'nogate'}")


BASES = tuple(
    [_cache_write_base(a) for a in (True, False)]
    + [_prefill_base(d, g) for d in HEAD_DIMS for g in _GATES]
    + [_decode_base("split", d) for d in HEAD_DIMS]
    + [_decode_base(k, d, g) for k in ("direct", "fused", "combine") for d in HEAD_DIMS for g in _GATES])
OPTIONAL_BASES = tuple(_prefill_base(d, g, tma=True) for d in HEAD_DIMS for g in _GATES)  # sm_90a / sm_100a


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _a16(op: str, **ptrs_and_strides: int) -> None:
    for k, v in ptrs_and_strides.items():
        if v % 16:
            what = "16-byte aligned" if k.endswith("ptr") else "a multiple of 16 elements"
            raise OpError(f"{op}: {k}={v:#x} must be {what} (the attention kernels are compiled for it)")


def _stride(t, dim: int, default: int) -> int:
    """Stride of dim, normalized to `default` where the dim has extent 1 (any stride is legal there)."""
    return int(t.strides[dim]) if t.shape[dim] > 1 else default


class _Cache(NamedTuple):
    """The paged K/V caches of a call, as :func:`_cache_pair` checked them."""
    k: object  # TensorRef of k_cache
    v: object  # TensorRef of v_cache
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    stride_block: int  # elements between cache blocks
    stride_slot: int  # elements between slots of a block (= num_kv_heads * head_dim)
    stride_head: int  # elements between kv heads (= head_dim)


def _cache_pair(op: str, k_cache, v_cache) -> _Cache:
    kc = tensor(op, "k_cache", k_cache, BF16, ndim=4)
    NB, BS, Hkv, D = kc.shape
    vc = tensor(op, "v_cache", v_cache, BF16, ndim=4, shape=(NB, BS, Hkv, D))
    if D not in HEAD_DIMS:
        raise OpError(f"{op}: head dim must be one of {HEAD_DIMS}, got {D}")
    if BS < 1 or Hkv < 1 or NB < 1:
        raise OpError(f"{op}: empty cache {tuple(kc.shape)}")
    strides = []
    for name, t in (("k_cache", kc), ("v_cache", vc)):
        sh = _stride(t, 2, D)
        ss = _stride(t, 1, Hkv * D)
        sb = _stride(t, 0, BS * Hkv * D)
        if sh != D or ss != Hkv * D:
            raise OpError(f"{op}: {name} must be contiguous within a block ([block_size, Hkv, D]), strides "
                          f"{tuple(t.strides)}")
        strides.append((sb, ss, sh))
    if strides[0] != strides[1]:
        raise OpError(f"{op}: k_cache and v_cache must have identical strides, got {strides[0]} / {strides[1]}")
    sb, ss, sh = strides[0]
    _a16(op, k_cache_ptr=kc.ptr, v_cache_ptr=vc.ptr, stride_cb=sb, stride_cs=ss)
    fits_i32(op, num_blocks=NB, block_size=BS, stride_cs=ss)
    if not (0 < sb < 2**62):
        raise OpError(f"{op}: block stride {sb} out of range")
    return _Cache(kc, vc, NB, BS, Hkv, D, sb, ss, sh)


def _block_tables(op: str, block_tables, n: int):
    bt = tensor(op, "block_tables", block_tables, "int32", ndim=2, shape=(n, None))
    if bt.shape[1] < 1:
        raise OpError(f"{op}: block_tables has no columns")
    sbt = _stride(bt, 0, bt.shape[1])
    fits_i32(op, stride_bt=sbt, max_blocks=bt.shape[1])
    return bt, sbt


def _capacity(op: str, max_blocks: int, BS: int) -> None:
    """The kernels clamp context lengths to max_blocks * block_size in int32 arithmetic (with headroom)."""
    if max_blocks * BS >= 2**30:
        raise OpError(f"{op}: block table capacity {max_blocks} blocks x {BS} = {max_blocks * BS} keys; at most "
                      f"2^30 - 1 are supported")


def _heads(op: str, Hq: int, Hkv: int) -> int:
    if Hq % Hkv:
        raise OpError(f"{op}: {Hq} q heads are not a multiple of {Hkv} kv heads")
    g = Hq // Hkv
    if g > MAX_GROUP:
        raise OpError(f"{op}: {g} q heads per kv head; at most {MAX_GROUP} are supported")
    return g


def _plan_dims(op: str, Hq: int, Hkv: int, D: int, BS: int) -> None:
    """A plan's head counts, head dim and block size, checked when it is made."""
    if D not in HEAD_DIMS:
        raise OpError(f"{op}: head dim must be one of {HEAD_DIMS}, got {D}")
    if min(Hq, Hkv, BS) < 1:
        raise OpError(f"{op}: num_q_heads, num_kv_heads and block_size must be positive")
    _heads(op, Hq, Hkv)


def _plan_caches(op: str, k_cache, v_cache, BS: int, Hkv: int, D: int):
    """_cache_pair for a layer run through a plan: the caches must have the plan's geometry."""
    cache = _cache_pair(op, k_cache, v_cache)
    got = (cache.block_size, cache.num_kv_heads, cache.head_dim)
    if got != (BS, Hkv, D):
        raise OpError(f"{op}: caches have block size / kv heads / head dim {got}, the plan was made for "
                      f"{(BS, Hkv, D)}")
    return cache


def _gate(op: str, gate, n: int, Hq: int, D: int, fallback):
    """(gate tensor, row stride, head stride); without a gate the kernel's unused pointer is ``fallback``."""
    if gate is None:
        return fallback, 0, 0
    gt = tensor(op, "gate", gate, BF16, ndim=3, shape=(n, Hq, D))
    sgt, sgh = _stride(gt, 0, Hq * 2 * D), _stride(gt, 1, 2 * D)
    _a16(op, gate_ptr=gt.ptr, stride_gt=sgt, stride_gh=sgh)
    fits_i32(op, stride_gt=sgt, stride_gh=sgh)
    return gt, sgt, sgh


def _q_out_gate(op: str, qt, ot, gate, n: int, Hq: int, D: int, r: str):
    """Row/head strides of q and out ([n, Hq, D] views) and the gate's (tensor, strides), checked 16-byte
    aligned and int32 (``r`` names the row axis in messages: "t" tokens, "b" batch)."""
    sq, so = (_stride(qt, 0, Hq * D), _stride(qt, 1, D)), (_stride(ot, 0, Hq * D), _stride(ot, 1, D))
    g = _gate(op, gate, n, Hq, D, qt)
    vals = (sq[0], sq[1], so[0], so[1])
    if (qt.ptr | ot.ptr | sq[0] | sq[1] | so[0] | so[1]) % 16 or not (0 <= min(vals) and max(*vals, n) < 2**31):
        # the slow path names the offending value (the common call only pays the two checks above)
        st = {f"stride_q{r}": sq[0], "stride_qh": sq[1], f"stride_o{r}": so[0], "stride_oh": so[1]}
        _a16(op, q_ptr=qt.ptr, out_ptr=ot.ptr, **st)
        fits_i32(op, **{r.upper(): n}, **st)
    return sq, so, g


# --------------------------------------------------------------------------------------- reshape_and_cache

_rac_calls = CallCache()


def reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, *, stream=None):
    """Write k, v [T, Hkv, D] into the paged caches at slot_mapping int32 [T] (slot = block * block_size +
    offset); negative or out-of-range slots are skipped on the device. Two tokens with the same valid slot:
    the slot ends up with elements of one of them (which one is unspecified), nothing else is touched."""
    s = stream_of(stream)
    if _rac_calls.run(None, (k, v, k_cache, v_cache, slot_mapping), (), s):
        return
    op = "reshape_and_cache"
    c = _cache_pair(op, k_cache, v_cache)
    kc, vc, NB, BS, Hkv, D, sb, ss = c.k, c.v, c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim, \
        c.stride_block, c.stride_slot
    kt = tensor(op, "k", k, BF16, ndim=3, shape=(None, Hkv, D))
    T = kt.shape[0]
    vt = tensor(op, "v", v, BF16, ndim=3, shape=(T, Hkv, D))
    st = tensor(op, "slot_mapping", slot_mapping, "int32", ndim=1, shape=(T,))
    if T > 1 and st.strides[0] != 1:
        raise OpError(f"{op}: slot_mapping must be contiguous")
    for name, t in (("k", kt), ("v", vt)):
        if _stride(t, 1, D) != D:
            raise OpError(f"{op}: {name} must be contiguous in [Hkv, D], strides {tuple(t.strides)}")
    same_device(op, kc, vc, kt, vt, st)
    if T == 0:
        return
    skt, svt = _stride(kt, 0, Hkv * D), _stride(vt, 0, Hkv * D)
    N = Hkv * D
    fits_i32(op, T=T, stride_kt=skt, stride_vt=svt, N=N)
    al = all(p % 16 == 0 for p in (kt.ptr, vt.ptr)) and skt % 16 == 0 and svt % 16 == 0
    kern = get_kernel(_cache_write_base(al))
    gy = _cdiv(N, kern.constexprs["BLOCK"])
    _rac_calls.launch(None, (kt, vt, kc, vc, st), (), [(kern, (T, gy, 1), (kt, vt, kc, vc, st, skt, svt, sb, ss, BS, N,
                                                                           NB * BS))], s)


# ------------------------------------------------------------------------------------------------ prefill

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
    base, tma_base = _prefill_base(D, gate), _prefill_base(D, gate, tma=True)
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
    c = _cache_pair("prefill_uses_tma", k_cache, k_cache)
    k = _prefill_kernel(c.head_dim, gate, c.block_size, c.num_blocks, c.stride_block, c.stride_slot, None)
    return k.base == _prefill_base(c.head_dim, gate, tma=True)


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
    bt, sbt = _block_tables(op, block_tables, N)
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


def prefill_workspace(max_tokens: int, max_seqs: int, num_q_heads: int, head_dim: int, *,
                      device: int | None = None) -> PrefillWorkspace:
    """Allocate a :class:`PrefillWorkspace` and load the prefill kernels of ``head_dim`` (allocates: call it
    before any graph capture; a capture on any stream may follow without an eager warm-up)."""
    if min(max_tokens, max_seqs, num_q_heads) < 1 or head_dim not in HEAD_DIMS:
        raise OpError(f"prefill_workspace: sizes must be positive and head_dim one of {HEAD_DIMS}")
    n = 0
    for gate in _GATES:
        get_kernel(_prefill_base(head_dim, gate), device=device).load()  # so that a capture needs no warm-up
        base = _prefill_base(head_dim, gate, tma=True)
        if has_kernel(base, device=device):  # the largest grid _prefill_launches can make for these sizes
            k = get_kernel(base, device=device)
            k.load()
            n_mb = _cdiv(max_tokens, k.constexprs["BLOCK_M"]) + max_seqs
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
    group = _heads(op, Hq, Hkv)
    scratch = _prefill_scratch(op, workspace, T, p.N, Hq, D)
    (sqt, sqh), (sot, soh), (gt, sgt, sgh) = _q_out_gate(op, qt, ot, gate, T, Hq, D, "t")
    kern = _prefill_kernel(D, gate is not None, BS, NB, sb, ss, use_tma, p.kernels)
    bm = kern.constexprs["BLOCK_M"]
    grid = Hq * (_cdiv(T, bm) + p.N)  # every m-block any cu_seqlens_q can own (kernels_src/attn/prefill.py)
    fits_i32(op, grid=grid)
    _capacity(op, p.bt.shape[1], BS)
    args = (qt, kc, vc, ot, gt, p.bt, p.cu, p.sl, float(scale), p.N, T, Hq, group, sqt, sqh, sot, soh, sgt, sgh,
            sb, ss, sh, p.sbt, BS, p.bt.shape[1], NB)
    return [Launch(kern, (grid, 1, 1), args, scratch)], (() if gate is None else (gt,))


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
    cache = _cache_pair(op, k_cache, v_cache)
    D = cache.head_dim
    qt = tensor(op, "q", q, BF16, ndim=3, shape=(None, None, D))
    T, Hq, _ = qt.shape
    _heads(op, Hq, cache.num_kv_heads)
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


class _LayerCalls:
    """The bound calls of a plan's per-layer run (q, caches, out, optional gate; keyed by whether a gate is
    passed), shared by PrefillPlan and DecodePlan."""

    def __init__(self):
        self.calls = CallCache(max_keys=2)

    def replay(self, q, k_cache, v_cache, out, gate, scale, stream: int) -> bool:
        tensors = (q, k_cache, v_cache, out) if gate is None else (q, k_cache, v_cache, out, gate)
        return self.calls.run(gate is None, tensors, (scale,), stream)

    def launch(self, qt, cache, ot, gslot, gate, scale, launches, stream: int) -> None:
        self.calls.launch(gate is None, (qt, cache.k, cache.v, ot) + gslot, (scale,), launches, stream)

    @property
    def hits(self) -> int:
        return self.calls.hits


class PrefillPlan:
    """Prefill of one packed batch layout for several layers (plan once per step, run per layer), in the
    spirit of :class:`DecodePlan`: ``cu_seqlens_q``, ``seq_lens`` and ``block_tables`` are checked once and
    the kernel choice (TMA or gather, per cache geometry) is made once; :meth:`run` checks only that layer's
    q, caches, out and gate, and launches. Results are identical to :func:`prefill` with the same
    arguments. The plan keeps references to the three batch tensors: update their contents in place
    between steps as you like, but build a new plan when the number of sequences or the block-table width
    changes. A plan belongs to the device (context) it first runs on. ``workspace``: a
    :class:`PrefillWorkspace` for the TMA kernel's global scratch (see :func:`prefill`)."""

    def __init__(self, cu_seqlens_q, seq_lens, block_tables, *, num_q_heads: int, num_kv_heads: int,
                 head_dim: int, block_size: int, max_seqlen_q=None, use_tma=None, workspace=None):
        op = "PrefillPlan"
        _plan_dims(op, int(num_q_heads), int(num_kv_heads), int(head_dim), int(block_size))
        if workspace is not None and not isinstance(workspace, PrefillWorkspace):
            raise OpError(f"{op}: workspace must be a PrefillWorkspace (see prefill_workspace)")
        self.workspace = workspace
        self._keep = (cu_seqlens_q, seq_lens, block_tables)
        self.Hq, self.Hkv, self.D, self.BS = int(num_q_heads), int(num_kv_heads), int(head_dim), int(block_size)
        self.use_tma = use_tma
        self.batch = _prefill_batch(op, cu_seqlens_q, seq_lens, block_tables, max_seqlen_q)
        self._calls = _LayerCalls()

    def run(self, q, k_cache, v_cache, scale, *, out, gate=None, stream=None):
        """q, out [T, Hq, D] bf16 (out required: a plan is meant for graph capture and per-layer reuse)."""
        s = stream_of(stream)
        if self._calls.replay(q, k_cache, v_cache, out, gate, scale, s):
            return out
        op = "PrefillPlan.run"
        p = self.batch
        cache = _plan_caches(op, k_cache, v_cache, self.BS, self.Hkv, self.D)
        qt = tensor(op, "q", q, BF16, ndim=3, shape=(None, self.Hq, self.D))
        T = qt.shape[0]
        ot = tensor(op, "out", out, BF16, ndim=3, shape=(T, self.Hq, self.D))
        same_device(op, qt, cache.k, cache.v, p.cu, p.sl, p.bt, ot)
        if T and p.N:
            launches, gslot = _prefill_launches(op, p, qt, cache, ot, gate, scale, self.use_tma, self.workspace)
            self._calls.launch(qt, cache, ot, gslot, gate, scale, launches, s)
        return out


# ------------------------------------------------------------------------------------------------- decode

@dataclass(frozen=True, eq=False)  # immutable, compared and hashed by identity (bound calls key on it)
class DecodeWorkspace:
    """Scratch of split-KV decode: fp32 partial outputs [max_batch, Hq, max_splits, D] and their
    log-sum-exps [max_batch, Hq, max_splits] -- every byte a combine reads is written by a split of the same
    call first, so stale content is fine -- and int32 tickets [max_batch * Hq] of the one-launch path
    (decode_fused), zeroed at allocation and left zero by every launch."""
    part_o: memory.DeviceArray
    part_lse: memory.DeviceArray
    counters: memory.DeviceArray
    max_batch: int
    num_q_heads: int
    head_dim: int
    max_splits: int


def decode_workspace(max_batch: int, num_q_heads: int, head_dim: int, max_splits: int = DEFAULT_MAX_SPLITS,
                     *, device: int | None = None) -> DecodeWorkspace:
    """Allocate decode scratch for up to ``max_batch`` sequences and ``max_splits`` KV splits (do this
    before graph capture; 256 x 24 x 64 x 256 x 4 B = 400 MB at the largest Qwen3.6 decode shape, so size
    max_splits to need: the heuristic only uses many splits for small batches)."""
    if min(max_batch, num_q_heads, head_dim, max_splits) < 1:
        raise OpError("decode_workspace: all sizes must be positive")
    po = memory.DeviceArray.empty((max_batch * num_q_heads * max_splits * head_dim,), "float32", device=device)
    pl = memory.DeviceArray.empty((max_batch * num_q_heads * max_splits,), "float32", device=device)
    cnt = memory.DeviceArray.zeros((max_batch * num_q_heads,), "int32", device=device)
    return DecodeWorkspace(po, pl, cnt, int(max_batch), int(num_q_heads), int(head_dim), int(max_splits))


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
    cost = {s: _cdiv(work * s, slots) / s for s in range(1, hi + 1)}
    best = min(cost.values())
    return next(s for s in range(1, hi + 1) if cost[s] <= best * 1.05)


def use_fused_combine(splits: int, max_seq_len: int, *, factor: int = FUSED_KEYS_PER_SPLIT2) -> bool:
    """Whether decode combines the splits' partials inside the split launch (decode_fused: the last split of each
    (sequence, kv head) merges the group's partials; one launch) rather than in a separate combine launch.
    The fused merge saves a launch and the partials' round trip, but one CTA merges all `splits` partials
    serially after its own split, a tail ~ splits that pays off only when each split's own work (~ L / splits
    keys) is larger: fused iff L / splits >= factor * splits and splits <= 64 (the fused / separate timings
    that set the rule are in BENCHMARKS.md)."""
    return 1 < splits <= 64 and max_seq_len >= factor * splits * splits


def decode(q, k_cache, v_cache, block_tables, seq_lens, scale, *, gate=None, out=None, workspace=None,
           max_seq_len=None, num_splits=None, fused=None, stream=None):
    """One query token per sequence: q [B, Hq, D] at position seq_lens[b] - 1 attends to keys 0..L-1 of the
    paged caches (append the token's K/V with :func:`reshape_and_cache` first). Returns out [B, Hq, D] bf16.

    ``max_seq_len``: host-side upper bound of seq_lens, used by the split heuristic (default: the block
    table's capacity, block_tables.shape[1] * block_size). ``workspace``: a :class:`DecodeWorkspace` with
    max_batch >= B (required inside graph capture; otherwise one is allocated and cached per shape).
    ``num_splits``: force the KV split count (1..workspace.max_splits; benchmarks and tuning), default
    :func:`num_splits_for`. ``fused``: with more than one split, combine in the split launch (the last split
    of each group merges; one launch) or in a separate combine launch; default :func:`use_fused_combine`.
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
    cache = _cache_pair(op, k_cache, v_cache)
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
    the batch size, the block-table width or ``max_seq_len`` changes."""

    def __init__(self, block_tables, seq_lens, *, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 block_size: int, workspace=None, max_seq_len=None, num_splits=None, fused=None):
        op = "DecodePlan"
        _plan_dims(op, int(num_q_heads), int(num_kv_heads), int(head_dim), int(block_size))
        sl = tensor(op, "seq_lens", seq_lens, "int32", ndim=1)
        self._keep = (block_tables, seq_lens, workspace)
        self.batch = _decode_batch(op, block_tables, seq_lens, sl.shape[0], int(num_q_heads), int(num_kv_heads),
                                   int(head_dim), int(block_size), max_seq_len, workspace, num_splits, fused,
                                   sl.device)
        self._calls = _LayerCalls()

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
        cache = _plan_caches(op, k_cache, v_cache, p.BS, p.Hkv, p.D)
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
    kernels: dict = field(default_factory=dict, compare=False, repr=False)  # base -> Kernel, filled on use


def _decode_batch(op, block_tables, seq_lens, B, Hq, Hkv, D, BS, max_seq_len, workspace, num_splits, fused,
                  device) -> _DecodeBatch:
    group = _heads(op, Hq, Hkv)
    sl = tensor(op, "seq_lens", seq_lens, "int32", ndim=1, shape=(B,))
    if B > 1 and sl.strides[0] != 1:
        raise OpError(f"{op}: seq_lens must be contiguous")
    bt, sbt = _block_tables(op, block_tables, B)
    cap = bt.shape[1] * BS
    _capacity(op, bt.shape[1], BS)
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
    if num_splits is None:
        split_k = get_kernel(_decode_base("split", D))
        splits = num_splits_for(B, Hkv, max_seq_len, _sm_count(split_k.device), max_splits=ws.max_splits,
                                ctas_per_sm=max(1, split_k.max_active_blocks()))
    else:
        splits = int(num_splits)
        if not 1 <= splits <= ws.max_splits:
            raise OpError(f"{op}: num_splits={num_splits} is outside 1..{ws.max_splits} (the workspace's max_splits)")
    fits_i32(op, grid=B * Hkv * splits, partials=B * Hq * splits * D)
    return _DecodeBatch(B, Hq, Hkv, group, D, BS, bt, sbt, sl, ws, splits,
                        bool(fused) if fused is not None else use_fused_combine(splits, max_seq_len))


def _kernel(kernels: dict, base: str):
    """The Kernel for ``base`` through a plan's cache (get_kernel asks the driver for the current context; a
    plan resolves each base once, in the context it first runs in)."""
    k = kernels.get(base)
    if k is None:
        k = kernels[base] = get_kernel(base)
    return k


def _decode_launches(op, p: _DecodeBatch, qt, cache, ot, gate, scale):
    """The launch list of one decode call (for run_launches) and the gate's slot: () or (gate tensor,)."""
    kc, vc, NB, BS, Hkv, D = cache.k, cache.v, cache.num_blocks, cache.block_size, cache.num_kv_heads, cache.head_dim
    sb, ss, sh = cache.stride_block, cache.stride_slot, cache.stride_head
    B, Hq, group, splits, bt, sl, ws = p.B, p.Hq, p.group, p.splits, p.bt, p.sl, p.ws
    (sqb, sqh), (sob, soh), (gt, sgb, sgh) = _q_out_gate(op, qt, ot, gate, B, Hq, D, "b")
    g = gate is not None
    gslot = () if gate is None else (gt,)
    paged = (sb, ss, sh, p.sbt, BS, bt.shape[1], NB)
    if splits == 1:  # one launch: the direct kernel normalizes, gates and stores; no partials, no combine
        return [(_kernel(p.kernels, _decode_base("direct", D, g)), (B * Hkv, 1, 1),
                 (qt, kc, vc, bt, sl, ot, gt, float(scale), Hkv, group, sqb, sqh, sob, soh, sgb, sgh) + paged)], gslot
    po, pl = ws.part_o.data_ptr(), ws.part_lse.data_ptr()
    if p.fused:  # one launch: the last split of each group combines
        return [(_kernel(p.kernels, _decode_base("fused", D, g)), (B * Hkv * splits, 1, 1),
                 (qt, kc, vc, bt, sl, po, pl, ws.counters.data_ptr(), ot, gt, float(scale), Hkv, group, splits,
                  sqb, sqh, sob, soh, sgb, sgh) + paged)], gslot
    return [(_kernel(p.kernels, _decode_base("split", D)), (B * Hkv * splits, 1, 1),
             (qt, kc, vc, bt, sl, po, pl, float(scale), Hkv, group, splits, sqb, sqh) + paged),
            (_kernel(p.kernels, _decode_base("combine", D, g)), (B * Hq, 1, 1),
             (po, pl, ot, gt, Hq, splits, sob, soh, sgb, sgh))], gslot


_sms: dict[int, int] = {}


def _sm_count(dev: int) -> int:
    n = _sms.get(dev)
    if n is None:
        n = _sms.setdefault(dev, int(driver.sm_count(dev)))
    return n
