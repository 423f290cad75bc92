"""Typed ops of the causal conv1d family (width 4, no bias, SiLU; Qwen3.5/3.6 GDN preamble).

    y_t[c] = silu( sum_{j=0..3} weight[c, j] * x_{t-3+j}[c] ),  inputs before a sequence's start from its conv state

Layouts: x, y [T or B, C] bf16 (row stride free, channels contiguous); weight [C, 4] bf16 (row stride free);
``conv_state`` [slots, 3, C] bf16 (**channels contiguous**, row 0 = oldest input; each slot holds the last 3
inputs of its sequence). ``slot_idx`` int32: a slot outside [0, slots) (e.g. -1) means "no state": zeros are
read and nothing is written (the decode update then outputs zeros for that row). Slot values live on the device
and are not checked on the host (that would need a sync); the kernels skip out-of-range ones. Valid slots must be
distinct within one call (duplicates: unspecified results for those sequences and slots, nothing else touched).
``cu_seqlens`` int32 [N + 1]: 0 = cu[0] <= ... <= cu[N] <= T (rows at or past cu[N] get zeros); its values are
device data, clamped on the device (each sequence to [clamp(cu[s], 0, T), clamp(cu[s+1], that, T)); rows past T
are never touched, rows in no sequence get zeros), so no offset makes the kernels leave x, y or the state. The
prefill is two launches on the caller's stream (kernels_src/conv/conv.py): every row from x alone, then each
sequence's first 3 rows from its conv state and the final states. When every pointer is 16-byte aligned and every
row/slot stride a multiple of 16 elements the vectorized ``.a16`` specialization runs, else ``.any``. Pass ``out=`` inside graph capture. With ``out=`` and
torch tensors, a call whose inputs have the layout of a recent call (and the same aliasing of out and x) is a
bound call (vkc_runtime.bound): no revalidation, the recorded launch with the new pointers.
"""
from __future__ import annotations

from .. import memory
from ..bound import CallCache, Launch, disjoint, same
from ..kernels import get_kernel
from ._check import OpError, aligned, cdiv, fits_i32, row_stride, same_device, stream_of, tensor

__all__ = ["causal_conv1d", "causal_conv1d_update", "WIDTH", "BASES"]

WIDTH = 4
BF16 = "bfloat16"
_VARIANTS = ("a16", "any")


def _base(kind: str, variant: str) -> str:
    """The kernel name (spelled once: the ops call this, BASES is built from it)."""
    return f"conv.{kind}.w4.{variant}"


BASES = tuple(_base(k, v) for k in ("prefill", "heads", "update") for v in _VARIANTS)
_calls = CallCache()  # bound calls, keyed by op (+ whether a state is passed)

def _weight(op, weight, C):
    wt = tensor(op, "weight", weight, BF16, ndim=2, shape=(C, WIDTH))
    return wt, row_stride(wt)


def _state(op, conv_state, C):
    st = tensor(op, "conv_state", conv_state, BF16, ndim=3, shape=(None, WIDTH - 1, C))
    S = st.shape[0]
    ss = int(st.strides[0]) if S > 1 else (WIDTH - 1) * C
    sr = int(st.strides[1])
    return st, S, ss, sr


def _slots(op, slot_idx, n):
    it = tensor(op, "slot_idx", slot_idx, "int32", ndim=1, shape=(n,))
    if n > 1 and it.strides[0] != 1:
        raise OpError(f"{op}: slot_idx must be contiguous")
    return it


def _no_overlap(op, a, b, an, bn):
    """Refuse y sharing memory with x (the prefill's taps read rows other programs write)."""
    def span(t):
        lo = t.ptr
        hi = t.ptr + sum((s - 1) * st for s, st in zip(t.shape, t.strides)) * t.itemsize + t.itemsize
        return lo, hi
    (a0, a1), (b0, b1) = span(a), span(b)
    if a0 < b1 and b0 < a1:
        raise OpError(f"{op}: {bn} must not overlap {an}")


def causal_conv1d(x, weight, cu_seqlens, *, conv_state=None, slot_idx=None, out=None, stream=None):
    """Varlen prefill: x [T, C] packed sequences (cu_seqlens int32 [N+1]) -> y [T, C]. With ``conv_state``
    [slots, 3, C] and ``slot_idx`` int32 [N], each sequence starts from its slot's state (invalid slot: zeros) and
    its last 3 inputs (reaching into the old state when it is shorter than 3) are written back to the slot in
    place; empty sequences leave their slot unchanged. ``out`` must not overlap ``x``."""
    op = "causal_conv1d"
    s = stream_of(stream)
    key = (op, conv_state is None, slot_idx is None)
    tensors = (x, weight, cu_seqlens, out) if conv_state is None else (x, weight, cu_seqlens, out, conv_state, slot_idx)
    if out is not None and _calls.run(key, tensors, (), s):
        return out
    xt = tensor(op, "x", x, BF16, ndim=2)
    T, C = xt.shape
    wt, sw = _weight(op, weight, C)
    ct = tensor(op, "cu_seqlens", cu_seqlens, "int32", ndim=1)
    if ct.shape[0] < 1:
        raise OpError(f"{op}: cu_seqlens must have N + 1 >= 1 entries")
    if ct.shape[0] > 1 and ct.strides[0] != 1:
        raise OpError(f"{op}: cu_seqlens must be contiguous")
    N = ct.shape[0] - 1
    if (conv_state is None) != (slot_idx is None):
        raise OpError(f"{op}: pass conv_state and slot_idx together (or neither)")
    res = out if out is not None else memory.DeviceArray.empty((T, C), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(T, C))
    ts = [xt, wt, ct, yt]
    if conv_state is not None:
        st, S, ss, sr = _state(op, conv_state, C)
        it = _slots(op, slot_idx, N)
        ts += [st, it]
    same_device(op, *ts)
    if T == 0 or C == 0:
        return res
    _no_overlap(op, xt, yt, "x", "out")
    sx, sy = row_stride(xt), row_stride(yt)
    if conv_state is None:
        st_ref, sl_ref, ss, sr, S = yt, ct, 0, 0, 0  # never dereferenced as state (num_slots = 0)
    else:
        st_ref, sl_ref = st, it
        if S == 0:
            st_ref, ss, sr = yt, 0, 0
    st_ptr = st_ref.ptr
    fits_i32(op, T=T, C=C, N=N, num_slots=S, stride_x=sx, stride_w=sw, stride_y=sy, stride_ss=ss, stride_sr=sr)
    v = "a16" if aligned((xt.ptr, yt.ptr, st_ptr), (sx, sy, ss, sr)) else "any"
    # the .a16 body is compiled for C % 16 == 0 only (kernels_src/conv/conv.py, C16)
    body = get_kernel(_base("prefill", v if C % 16 == 0 else "any"))
    heads = get_kernel(_base("heads", v))
    gy, hy = cdiv(C, body.constexprs["BLOCK_C"]), cdiv(C, heads.constexprs["BLOCK_C"])
    if max(gy, hy) > 65535:
        raise OpError(f"{op}: C={C} needs {max(gy, hy)} programs on grid axis y (limit 65535)")
    # every row from x alone, then (same stream) each sequence's first 3 rows and its state (kernels_src/conv)
    launches = [Launch(body, (cdiv(T, body.constexprs["BLOCK_T"] * body.constexprs["SUB"]), gy, 1),
                       (xt, wt, yt, ct, sx, sw, sy, T, C, N))]
    if N > 0:
        launches.append(Launch(heads, (N, hy, 1), (xt, wt, yt, st_ref, ct, sl_ref, sx, sw, sy, ss, sr, T, C, N, S)))
    _calls.launch(key, None if out is None else tuple(ts), (), launches, s, relations=[disjoint(xt, yt)])
    return res


def causal_conv1d_update(x, weight, conv_state, slot_idx, *, out=None, stream=None):
    """Decode: one new token per sequence. x [B, C] -> y [B, C]; the slot's conv state [3, C] is rolled in place
    (rows <- [row 1, row 2, x]). A slot outside [0, slots): y row = 0 and no state access. ``out`` may be ``x``."""
    op = "causal_conv1d_update"
    s = stream_of(stream)
    if out is not None and _calls.run(op, (x, weight, conv_state, slot_idx, out), (), s):
        return out
    xt = tensor(op, "x", x, BF16, ndim=2)
    B, C = xt.shape
    wt, sw = _weight(op, weight, C)
    st, S, ss, sr = _state(op, conv_state, C)
    it = _slots(op, slot_idx, B)
    res = out if out is not None else memory.DeviceArray.empty((B, C), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(B, C))
    same_device(op, xt, wt, st, it, yt)
    if B == 0 or C == 0:
        return res
    if yt.ptr != xt.ptr:
        _no_overlap(op, xt, yt, "x", "out")
    elif row_stride(yt) != row_stride(xt):
        raise OpError(f"{op}: out aliases x with a different row stride")
    sx, sy = row_stride(xt), row_stride(yt)
    st_ptr = st.ptr
    if S == 0:
        ss, sr = 0, 0
    fits_i32(op, C=C, num_slots=S, stride_x=sx, stride_w=sw, stride_y=sy, stride_ss=ss, stride_sr=sr)
    v = "a16" if aligned((xt.ptr, yt.ptr, st_ptr), (sx, sy, ss, sr)) else "any"
    k = get_kernel(_base("update", v))
    gy = cdiv(C, k.constexprs["BLOCK_C"])
    if gy > 65535:
        raise OpError(f"{op}: C={C} needs {gy} programs on grid axis y (limit 65535)")
    if B >= 2**31:
        raise OpError(f"{op}: batch {B} too large")
    launch = Launch(k, (B, gy, 1), (xt, wt, yt, st, it, sx, sw, sy, ss, sr, C, S))
    _calls.launch(op, None if out is None else (xt, wt, st, it, yt), (), [launch], s,
                  relations=[same(xt, yt) if yt.ptr == xt.ptr else disjoint(xt, yt)])
    return res
