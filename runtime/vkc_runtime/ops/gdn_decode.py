"""Typed op of the GDN packed decode step (Qwen3.5/3.6 Gated DeltaNet).

One recurrent gated-delta step per sequence of a continuous batch, reading q/k/v straight from the packed
conv output. Per sequence b, value head h (key head h // (Hv / Hk)), fp32 math:
    q, k = l2norm (eps 1e-6);  g = -exp(A_log) * softplus(a + dt_bias);  beta = sigmoid(b)
    S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T (K^-0.5 q)

Layouts: qkv [B, 2*Hk*128 + Hv*128] bf16 (channels [q | k | v], row stride free); a, b [B, Hv] bf16 (row stride
free); A_log, dt_bias [Hv] fp32; state [slots, Hv, 128, 128] fp32 (each slot contiguous; slot stride a multiple of
16 elements; 16-byte aligned) updated IN PLACE; slot_idx int32 [B]; out [B, Hv, 128] bf16 (row stride free, heads
contiguous). A slot outside [0, slots) (e.g. -1 for padding): no state read or written, out[b] = 0. Slot values are
device data and are not checked on the host (no sync); the kernel skips out-of-range ones. Valid slots must be
distinct within one call. Grid (B * Hv * 128 / BLOCK_V,) on axis 0 only (no 65535 limit).

``ba=(x, w_ba)`` (a and b None): the step computes b and a itself from the block's input, b[h] = bf16(x . w_ba[h]),
a[h] = bf16(x . w_ba[Hv + h]) (fp32 sums, one bf16 rounding: what the in-projection GEMV writes), for checkpoints
whose in_proj_b / in_proj_a are not of the rest of the in-projection's kind (an NVFP4 or FP8 model keeps them
bf16): one launch fewer per layer and step (the ``.ba`` kernels). x bf16 [B, H] (last dim contiguous, row stride
free), w_ba bf16 [2 Hv, H] (b rows then a rows, last dim contiguous, row stride free).
"""
from __future__ import annotations

from .. import memory
from ..bound import CallCache, Launch
from ..kernels import get_kernel
from ._check import OpError, fits_i32, row_stride, same_device, stream_of, tensor

__all__ = ["recurrent_decode", "HEAD_DIM", "BASES"]

HEAD_DIM = 128
BF16 = "bfloat16"
_SPECS = ("bv32", "bv16")


def _base(tile: str, ba: bool = False) -> str:
    """The kernel name (spelled once: the op calls this, BASES is built from it)."""
    return f"gdn_decode.recurrent.k128_v128.{tile}" + (".ba" if ba else "")


BASES = tuple(_base(t, ba) for ba in (False, True) for t in _SPECS)
# below this many (sequence, head) pairs the BLOCK_V = 16 spec (twice the CTAs) runs
SMALL_BATCH_HEADS = 512
_calls = CallCache()  # bound calls (vkc_runtime.bound): a call with out= and torch tensors of a recent layout


def recurrent_decode(qkv, a, b, A_log, dt_bias, state, slot_idx, num_k_heads: int, num_v_heads: int, *, out=None,
                     stream=None, ba=None, _tile: str | None = None):
    """One GDN decode step; returns out [B, Hv, 128] bf16. ``state`` is updated in place. ``ba``: (x, w_ba) to
    compute b and a in the step (module doc; a and b None)."""
    op = "recurrent_decode"
    s = stream_of(stream)
    fused = ba is not None
    key = (num_k_heads, num_v_heads, _tile, fused)
    ins = (qkv, *ba, A_log, dt_bias, state, slot_idx, out) if fused else \
        (qkv, a, b, A_log, dt_bias, state, slot_idx, out)
    if out is not None and _calls.run(key, ins, (), s):
        return out
    Hk, Hv = int(num_k_heads), int(num_v_heads)
    D = HEAD_DIM
    if Hk <= 0 or Hv <= 0 or Hv % Hk:
        raise OpError(f"{op}: num_v_heads ({Hv}) must be a positive multiple of num_k_heads ({Hk})")
    qt = tensor(op, "qkv", qkv, BF16, ndim=2)
    B, Cq = qt.shape
    if Cq != 2 * Hk * D + Hv * D:
        raise OpError(f"{op}: qkv has {Cq} channels, expected 2*Hk*128 + Hv*128 = {2 * Hk * D + Hv * D}")
    if fused:
        if a is not None or b is not None or not isinstance(ba, tuple) or len(ba) != 2:
            raise OpError(f"{op}: ba=(x, w_ba) computes a and b: pass a=None, b=None")
        at = tensor(op, "ba.x", ba[0], BF16, ndim=2, shape=(B, None))
        Hx = at.shape[1]
        bt = tensor(op, "ba.w_ba", ba[1], BF16, ndim=2, shape=(2 * Hv, Hx))
        if Hx == 0:
            raise OpError(f"{op}: ba.x has no columns")
    else:
        at = tensor(op, "a", a, BF16, ndim=2, shape=(B, Hv))
        bt = tensor(op, "b", b, BF16, ndim=2, shape=(B, Hv))
    lt = tensor(op, "A_log", A_log, "float32", ndim=1, shape=(Hv,))
    dt = tensor(op, "dt_bias", dt_bias, "float32", ndim=1, shape=(Hv,))
    st = tensor(op, "state", state, "float32", ndim=4, shape=(None, Hv, D, D))
    S = st.shape[0]
    if tuple(st.strides[1:]) != (D * D, D, 1) and Hv > 1:
        raise OpError(f"{op}: each state slot must be contiguous [Hv, 128, 128], got strides {tuple(st.strides)}")
    ss = int(st.strides[0]) if S > 1 else Hv * D * D
    if st.ptr % 16 or ss % 16:
        raise OpError(f"{op}: state must be 16-byte aligned with a slot stride that is a multiple of 16 elements "
                      f"(ptr {st.ptr:#x}, slot stride {ss})")
    it = tensor(op, "slot_idx", slot_idx, "int32", ndim=1, shape=(B,))
    if B > 1 and it.strides[0] != 1:
        raise OpError(f"{op}: slot_idx must be contiguous")
    for name, t in (("A_log", lt), ("dt_bias", dt)):
        if Hv > 1 and t.strides[0] != 1:
            raise OpError(f"{op}: {name} must be contiguous")
    res = out if out is not None else memory.DeviceArray.empty((B, Hv, D), BF16, device=qt.device)
    ot = tensor(op, "out", res, BF16, ndim=3, shape=(B, Hv, D))
    if Hv > 1 and ot.strides[1] != D:
        raise OpError(f"{op}: out heads must be contiguous ([B, Hv, 128] with head stride 128)")
    same_device(op, qt, at, bt, lt, dt, st, it, ot)
    if B == 0:
        return res
    sq, sa, sb = row_stride(qt), row_stride(at), row_stride(bt)
    so = int(ot.strides[0]) if B > 1 else Hv * D
    fits_i32(op, stride_qkv=sq, stride_a=sa, stride_b=sb, stride_state=ss, stride_o=so, Hk=Hk, Hv=Hv, num_slots=S)
    tile = _tile or ("bv16" if B * Hv < SMALL_BATCH_HEADS else "bv32")
    if tile not in _SPECS:
        raise OpError(f"{op}: unknown tile {tile!r}")
    k = get_kernel(_base(tile, fused))
    nprog = B * Hv * (k.constexprs["V"] // k.constexprs["BLOCK_V"])
    if nprog >= 2**31:
        raise OpError(f"{op}: B * Hv = {B * Hv} is too large for one launch")
    # the fused kernel takes x / w_ba where the plain one takes a / b, and the hidden size last
    launch = Launch(k, (nprog, 1, 1),
                    (qt, at, bt, lt, dt, st, it, ot, sq, sa, sb, ss, so, Hk, Hv, S, float(D ** -0.5), 1e-6,
                     at.shape[1] if fused else 0))
    _calls.launch(key, None if out is None else (qt, at, bt, lt, dt, st, it, ot), (), [launch], s)
    return res
