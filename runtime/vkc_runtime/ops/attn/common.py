"""What the attention ops share: the kernel names (``BASES``), the checks of paged caches, block tables, head
counts and q/out/gate views, and the per-layer bound calls of the plans (:mod:`vkc_runtime.ops.attn` has the
layouts and the rules)."""
from __future__ import annotations

from typing import NamedTuple

from ...bound import CallCache
from .._check import BF16, OpError, fits_i32, tensor

HEAD_DIMS = (128, 256)
MAX_GROUP = 16  # q heads per kv head processed as one padded 16-row operand in decode
GATES = (True, False)


# the kernel names, spelled once: the ops call these, BASES / OPTIONAL_BASES are built from them
def cache_write_base(aligned: bool) -> str:
    return f"attn.reshape_and_cache.{'a16' if aligned else 'any'}"


def prefill_base(D: int, gate: bool, tma: bool = False) -> str:
    return f"attn.prefill.d{D}.{'gate' if gate else 'nogate'}" + (".tma" if tma else "")


def decode_base(kind: str, D: int, gate: bool | None = None, tma: bool = False) -> str:
    """kind: "split" (no gate: the gate is applied where the splits are combined), "direct", "fused", "combine";
    tma: the TMA variant of split / direct / fused (sm_90a / sm_100a)."""
    return (f"attn.decode_{kind}.d{D}" + ("" if gate is None else f".{'gate' if gate else 'nogate'}")
            + (".tma" if tma else ""))


def decode_bases(D: int, tma: bool = False) -> tuple[str, ...]:
    """Every decode kernel of head dim ``D`` (what a decode workspace or plan may launch); tma: the TMA variants
    (split, direct, fused), which only sm_90a / sm_100a have."""
    if tma:
        return (decode_base("split", D, tma=True),) + tuple(
            decode_base(k, D, g, tma=True) for k in ("direct", "fused") for g in GATES)
    kinds = ("direct", "fused", "combine")
    return (decode_base("split", D),) + tuple(decode_base(k, D, g) for k in kinds for g in GATES)


BASES = tuple(
    [cache_write_base(a) for a in (True, False)]
    + [prefill_base(d, g) for d in HEAD_DIMS for g in GATES]
    + [b for d in HEAD_DIMS for b in decode_bases(d)])
OPTIONAL_BASES = (tuple(prefill_base(d, g, tma=True) for d in HEAD_DIMS for g in GATES)  # sm_90a / sm_100a
                  + tuple(b for d in HEAD_DIMS for b in decode_bases(d, tma=True)))


def require_a16(op: str, **ptrs_and_strides: int) -> None:
    for k, v in ptrs_and_strides.items():
        if v % 16:
            what = "16-byte aligned" if k.endswith("ptr") else "a multiple of 16 elements"
            raise OpError(f"{op}: {k}={v:#x} must be {what} (the attention kernels are compiled for it)")


def stride_of(t, dim: int, default: int) -> int:
    """Stride of dim, normalized to `default` where the dim has extent 1 (any stride is legal there)."""
    return int(t.strides[dim]) if t.shape[dim] > 1 else default


class PagedCache(NamedTuple):
    """The paged K/V caches of a call, as :func:`cache_pair` checked them."""
    k: object  # TensorRef of k_cache
    v: object  # TensorRef of v_cache
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    stride_block: int  # elements between cache blocks
    stride_slot: int  # elements between slots of a block (= num_kv_heads * head_dim)
    stride_head: int  # elements between kv heads (= head_dim)


def cache_pair(op: str, k_cache, v_cache) -> PagedCache:
    kc = tensor(op, "k_cache", k_cache, BF16, ndim=4)
    NB, BS, Hkv, D = kc.shape
    vc = tensor(op, "v_cache", v_cache, BF16, ndim=4, shape=(NB, BS, Hkv, D))
    if D not in HEAD_DIMS:
        raise OpError(f"{op}: head dim must be one of {HEAD_DIMS}, got {D}")
    if BS < 1 or Hkv < 1 or NB < 1:
        raise OpError(f"{op}: empty cache {tuple(kc.shape)}")
    strides = []
    for name, t in (("k_cache", kc), ("v_cache", vc)):
        sh = stride_of(t, 2, D)
        ss = stride_of(t, 1, Hkv * D)
        sb = stride_of(t, 0, BS * Hkv * D)
        if sh != D or ss != Hkv * D:
            raise OpError(f"{op}: {name} must be contiguous within a block ([block_size, Hkv, D]), strides "
                          f"{tuple(t.strides)}")
        strides.append((sb, ss, sh))
    if strides[0] != strides[1]:
        raise OpError(f"{op}: k_cache and v_cache must have identical strides, got {strides[0]} / {strides[1]}")
    sb, ss, sh = strides[0]
    require_a16(op, k_cache_ptr=kc.ptr, v_cache_ptr=vc.ptr, stride_cb=sb, stride_cs=ss)
    fits_i32(op, num_blocks=NB, block_size=BS, stride_cs=ss)
    if not (0 < sb < 2**62):
        raise OpError(f"{op}: block stride {sb} out of range")
    return PagedCache(kc, vc, NB, BS, Hkv, D, sb, ss, sh)


class BlockTables(NamedTuple):
    """The block tables of a call, as :func:`block_tables_arg` checked them."""
    ref: object  # TensorRef, int32 [n, max_blocks]
    row_stride: int  # elements between rows


def block_tables_arg(op: str, block_tables, n: int) -> BlockTables:
    bt = tensor(op, "block_tables", block_tables, "int32", ndim=2, shape=(n, None))
    if bt.shape[1] < 1:
        raise OpError(f"{op}: block_tables has no columns")
    sbt = stride_of(bt, 0, bt.shape[1])
    fits_i32(op, stride_bt=sbt, max_blocks=bt.shape[1])
    return BlockTables(bt, sbt)


def check_capacity(op: str, max_blocks: int, BS: int) -> None:
    """The kernels clamp context lengths to max_blocks * block_size in int32 arithmetic (with headroom)."""
    if max_blocks * BS >= 2**30:
        raise OpError(f"{op}: block table capacity {max_blocks} blocks x {BS} = {max_blocks * BS} keys; at most "
                      f"2^30 - 1 are supported")


def group_size(op: str, Hq: int, Hkv: int) -> int:
    if Hq % Hkv:
        raise OpError(f"{op}: {Hq} q heads are not a multiple of {Hkv} kv heads")
    g = Hq // Hkv
    if g > MAX_GROUP:
        raise OpError(f"{op}: {g} q heads per kv head; at most {MAX_GROUP} are supported")
    return g


def plan_dims(op: str, Hq: int, Hkv: int, D: int, BS: int) -> None:
    """A plan's head counts, head dim and block size, checked when it is made."""
    if D not in HEAD_DIMS:
        raise OpError(f"{op}: head dim must be one of {HEAD_DIMS}, got {D}")
    if min(Hq, Hkv, BS) < 1:
        raise OpError(f"{op}: num_q_heads, num_kv_heads and block_size must be positive")
    group_size(op, Hq, Hkv)


def plan_caches(op: str, k_cache, v_cache, BS: int, Hkv: int, D: int):
    """cache_pair for a layer run through a plan: the caches must have the plan's geometry."""
    cache = cache_pair(op, k_cache, v_cache)
    got = (cache.block_size, cache.num_kv_heads, cache.head_dim)
    if got != (BS, Hkv, D):
        raise OpError(f"{op}: caches have block size / kv heads / head dim {got}, the plan was made for "
                      f"{(BS, Hkv, D)}")
    return cache


def gate_arg(op: str, gate, n: int, Hq: int, D: int, fallback):
    """(gate tensor, row stride, head stride); without a gate the kernel's unused pointer is ``fallback``."""
    if gate is None:
        return fallback, 0, 0
    gt = tensor(op, "gate", gate, BF16, ndim=3, shape=(n, Hq, D))
    sgt, sgh = stride_of(gt, 0, Hq * 2 * D), stride_of(gt, 1, 2 * D)
    require_a16(op, gate_ptr=gt.ptr, stride_gt=sgt, stride_gh=sgh)
    fits_i32(op, stride_gt=sgt, stride_gh=sgh)
    return gt, sgt, sgh


class QOutGate(NamedTuple):
    """The element strides of q, out and the gate of one call, as :func:`q_out_gate` checked them."""
    q_row: int
    q_head: int
    out_row: int
    out_head: int
    gate: object  # TensorRef of the gate, or q's when there is none (the kernel does not read it then)
    gate_row: int  # 0 without a gate
    gate_head: int


def q_out_gate(op: str, qt, ot, gate, n: int, Hq: int, D: int, r: str) -> QOutGate:
    """Row/head strides of q and out ([n, Hq, D] views) and the gate's tensor and strides, checked 16-byte
    aligned and int32 (``r`` names the row axis in messages: "t" tokens, "b" batch)."""
    sqr, sqh, sor, soh = stride_of(qt, 0, Hq * D), stride_of(qt, 1, D), stride_of(ot, 0, Hq * D), stride_of(ot, 1, D)
    gt, sgr, sgh = gate_arg(op, gate, n, Hq, D, qt)
    vals = (sqr, sqh, sor, soh)
    if (qt.ptr | ot.ptr | sqr | sqh | sor | soh) % 16 or not (0 <= min(vals) and max(*vals, n) < 2**31):
        # the slow path names the offending value (the common call only pays the two checks above)
        st = {f"stride_q{r}": sqr, "stride_qh": sqh, f"stride_o{r}": sor, "stride_oh": soh}
        require_a16(op, q_ptr=qt.ptr, out_ptr=ot.ptr, **st)
        fits_i32(op, **{r.upper(): n}, **st)
    return QOutGate(sqr, sqh, sor, soh, gt, sgr, sgh)


class LayerCalls:
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
