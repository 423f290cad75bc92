"""Typed op of the rope family (kernels_src/rope; Qwen3.5/3.6 semantics): the attention preamble, per-head
RMSNorm(1 + w) of q and k followed by partial rotate-half RoPE.

Tensors, layouts, the `.a16`/`.any` choice and bound calls: the row-op conventions in :mod:`vkc_runtime.ops._check`.
"""
from __future__ import annotations

from .. import memory
from ..bound import CallCache, Launch
from ..kernels import get_kernel
from ._check import (BF16, VARIANTS, OpError, cdiv, fits_i32, grid_y, row_stride, same_device, stream_of,
                     tensor, variant)

__all__ = ["qk_norm_rope", "OpError", "BASES"]

_ROPE = {256: 64, 128: 32}  # head dim -> rotary dims (partial RoPE on the first head_dim / 4)


# the kernel names, spelled once: the op calls this, BASES is built from it
def _qk_base(head_dim: int, suffix: str) -> str:
    return f"rope.qk_norm_rope.d{head_dim}.r{_ROPE[head_dim]}.{suffix}"


BASES = tuple(_qk_base(d, v) for d in _ROPE for v in VARIANTS)

_calls = CallCache(per_key=8)  # bound calls, keyed by head counts and head dim


def qk_norm_rope(qg, k, positions, q_weight, k_weight, num_q_heads: int, num_kv_heads: int, head_dim: int = 256,
                 eps: float = 1e-6, theta: float = 1e7, q_out=None, k_out=None, stream=None):
    """Attention preamble: split q from the interleaved per-head [query | gate] projection, RMSNorm(1+w) q and k
    per head, partial neox RoPE on the first head_dim/4 dims. qg [T, Hq*2*D], k [T, Hkv*D], positions int32 [T].
    Returns (q_out [T, Hq, D], k_out [T, Hkv, D]); the gate stays in qg (see
    :func:`vkc_runtime.ops.act.sigmoid_mul`)."""
    op = "qk_norm_rope"
    s = stream_of(stream)
    key = (op, num_q_heads, num_kv_heads, head_dim)
    if q_out is not None and k_out is not None and _calls.run(
            key, (qg, k, positions, q_weight, k_weight, q_out, k_out), (eps, theta), s):
        return q_out, k_out
    D = int(head_dim)
    if D not in _ROPE:
        raise OpError(f"{op}: head_dim must be one of {sorted(_ROPE)}, got {D}")
    Hq, Hkv = int(num_q_heads), int(num_kv_heads)
    if Hq <= 0 or Hkv <= 0:
        raise OpError(f"{op}: head counts must be positive, got {Hq}/{Hkv}")
    qt = tensor(op, "qg", qg, BF16, ndim=2)
    T = qt.shape[0]
    if qt.shape[1] != Hq * 2 * D:
        raise OpError(f"{op}: qg has {qt.shape[1]} columns, expected num_q_heads*2*head_dim = {Hq * 2 * D}")
    kt = tensor(op, "k", k, BF16, ndim=2, shape=(T, Hkv * D))
    pt = tensor(op, "positions", positions, "int32", ndim=1, shape=(T,))
    wq = tensor(op, "q_weight", q_weight, BF16, ndim=1, shape=(D,))
    wk = tensor(op, "k_weight", k_weight, BF16, ndim=1, shape=(D,))
    qo_res = q_out if q_out is not None else memory.DeviceArray.empty((T, Hq, D), BF16, device=qt.device)
    ko_res = k_out if k_out is not None else memory.DeviceArray.empty((T, Hkv, D), BF16, device=qt.device)
    qo = tensor(op, "q_out", qo_res, BF16, ndim=3, shape=(T, Hq, D))
    ko = tensor(op, "k_out", ko_res, BF16, ndim=3, shape=(T, Hkv, D))
    for name, t, n in (("q_out", qo, Hq), ("k_out", ko, Hkv)):
        if T > 1 and (t.strides[1] != D or t.strides[0] != n * D) or (T == 1 and n > 1 and t.strides[1] != D):
            raise OpError(f"{op}: {name} must be contiguous [T, H, D], got strides {tuple(t.strides)}")
    same_device(op, qt, kt, pt, wq, wk, qo, ko)
    if T == 0:
        return qo_res, ko_res
    sq, sk = row_stride(qt), row_stride(kt)
    fits_i32(op, stride_qg=sq, stride_k=sk, T=T, Hq=Hq, Hkv=Hkv)
    v = variant((qt.ptr, kt.ptr, pt.ptr, wq.ptr, wk.ptr, qo.ptr, ko.ptr), (sq, sk))
    kern = get_kernel(_qk_base(D, v))
    hpp, tok = kern.constexprs["HEADS_PER_PROG"], kern.constexprs["TOK"]
    slots = (qt, kt, pt, wq, wk, qo, ko) if q_out is not None and k_out is not None else None
    launch = Launch(kern, (cdiv(T, tok), grid_y(op, cdiv(Hq, hpp) + cdiv(Hkv, hpp)), 1),
                    (qt, kt, pt, wq, wk, qo, ko, sq, sk, T, Hq, Hkv, float(eps), float(theta)))
    _calls.launch(key, slots, (eps, theta), [launch], s)
    return qo_res, ko_res
