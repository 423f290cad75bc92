"""Typed ops of the norm/RoPE/activation family (Qwen3.5/3.6 semantics).

All tensors are bf16 on one CUDA device (torch/cupy tensors, DLPack producers or vkc DeviceArrays); math
is fp32 inside the kernels. Rows may be strided; the last dimension must be contiguous. When every
pointer is 16-byte aligned and every row stride is a multiple of 16 elements the vectorized `.a16`
specialization runs, otherwise the `.any` one. Pass ``out=`` (and never allocate) inside graph capture.
With ``out=`` and torch tensors, a call whose inputs have the layout of a recent call of the same op is a bound
call (vkc_runtime.bound): no revalidation, the recorded launch with the new pointers.
"""
from __future__ import annotations


from .. import memory
from ..bound import CallCache
from ..kernels import get_kernel
from ._check import OpError, aligned, fits_i32, row_stride, same_device, stream_of, tensor

__all__ = ["rmsnorm", "add_rmsnorm", "gated_rmsnorm", "qk_norm_rope", "silu_mul", "sigmoid_mul", "embedding",
           "OpError", "ROW_BLOCKS", "BASES"]

ROW_BLOCKS = (1024, 2048, 4096, 8192, 16384)  # row capacities of the rmsnorm specializations
_VARIANTS = ("a16", "any")
BF16 = "bfloat16"

_ROPE = {256: 64, 128: 32}  # head dim -> rotary dims (partial RoPE on the first head_dim / 4)
_SIGMOID_DIMS = (256, 128)


# the kernel names, spelled once: the ops call these, BASES is built from them
def _rms_base(kind: str, block: int, variant: str) -> str:
    return f"norm.{kind}.b{block}.{variant}"


def _gated_base(variant: str) -> str:
    return f"norm.gated_rmsnorm.h128.{variant}"


def _qk_base(head_dim: int, variant: str) -> str:
    return f"norm.qk_norm_rope.d{head_dim}.r{_ROPE[head_dim]}.{variant}"


def _silu_base(variant: str) -> str:
    return f"norm.silu_mul.{variant}"


def _sigmoid_base(head_dim: int, variant: str) -> str:
    return f"norm.sigmoid_mul.d{head_dim}.{variant}"


def _embedding_base(variant: str) -> str:
    return f"norm.embedding.{variant}"


BASES = tuple(
    [_rms_base(k, b, v) for k in ("rmsnorm", "add_rmsnorm") for b in ROW_BLOCKS for v in _VARIANTS]
    + [_gated_base(v) for v in _VARIANTS]
    + [_qk_base(d, v) for d in _ROPE for v in _VARIANTS]
    + [_silu_base(v) for v in _VARIANTS]
    + [_sigmoid_base(d, v) for d in _SIGMOID_DIMS for v in _VARIANTS]
    + [_embedding_base(v) for v in _VARIANTS])

_GATED_HEAD = 128
_calls = CallCache(per_key=8)  # bound calls, keyed by op (+ head counts)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _grid_y(op: str, n: int) -> int:
    if n > 65535:
        raise OpError(f"{op}: the launch needs {n} programs on grid axis y (limit 65535)")
    return n


def _variant(ptrs, strides) -> str:
    return "a16" if aligned(ptrs, strides) else "any"


def _block_for(op: str, n: int) -> int:
    for b in ROW_BLOCKS:
        if n <= b:
            return b
    raise OpError(f"{op}: rows of {n} elements exceed the largest compiled row block {ROW_BLOCKS[-1]}")


def _bindable(out, *slots):
    """The slots of a bound call, or None when the op allocated its output (nothing to bind)."""
    return None if out is None else slots


def _empty_ok(*dims: int) -> bool:
    return all(d > 0 for d in dims)


def rmsnorm(x, weight, eps: float = 1e-6, out=None, stream=None):
    """y = x * rsqrt(mean(x^2) + eps) * (1 + weight); x [M, N] bf16, weight [N] bf16."""
    op = "rmsnorm"
    s = stream_of(stream)
    if out is not None and _calls.run(op, (x, weight, out), (eps,), s):
        return out
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, N = xt.shape
    wt = tensor(op, "weight", weight, BF16, ndim=1, shape=(N,))
    res = out if out is not None else memory.DeviceArray.empty((M, N), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, N))
    same_device(op, xt, wt, yt)
    if not _empty_ok(M, N):
        return res
    sx, sy = row_stride(xt), row_stride(yt)
    fits_i32(op, N=N, stride_x=sx, stride_y=sy)
    k = get_kernel(_rms_base("rmsnorm", _block_for(op, N), _variant((xt.ptr, wt.ptr, yt.ptr), (sx, sy))))
    _calls.launch(op, _bindable(out, xt, wt, yt), (eps,), [(k, (M, 1, 1), (xt, wt, yt, sx, sy, N, float(eps)))], s)
    return res


def add_rmsnorm(x, residual, weight, eps: float = 1e-6, out=None, stream=None):
    """residual <- bf16(x + residual) (in place); returns y = rmsnorm(residual) * (1 + weight)."""
    op = "add_rmsnorm"
    s = stream_of(stream)
    if out is not None and _calls.run(op, (x, residual, weight, out), (eps,), s):
        return out
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, N = xt.shape
    rt = tensor(op, "residual", residual, BF16, ndim=2, shape=(M, N))
    wt = tensor(op, "weight", weight, BF16, ndim=1, shape=(N,))
    res = out if out is not None else memory.DeviceArray.empty((M, N), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, N))
    same_device(op, xt, rt, wt, yt)
    if not _empty_ok(M, N):
        return res
    sx, sr, sy = row_stride(xt), row_stride(rt), row_stride(yt)
    fits_i32(op, N=N, stride_x=sx, stride_r=sr, stride_y=sy)
    v = _variant((xt.ptr, rt.ptr, wt.ptr, yt.ptr), (sx, sr, sy))
    k = get_kernel(_rms_base("add_rmsnorm", _block_for(op, N), v))
    _calls.launch(op, _bindable(out, xt, rt, wt, yt), (eps,),
                  [(k, (M, 1, 1), (xt, rt, wt, yt, sx, sr, sy, N, float(eps)))], s)
    return res


def gated_rmsnorm(x, z, weight, eps: float = 1e-6, out=None, stream=None):
    """Per 128-wide head: y = x * rsqrt(mean(x^2) + eps) * weight * silu(z); x, z [M, H*128], weight [128]."""
    op = "gated_rmsnorm"
    s = stream_of(stream)
    if out is not None and _calls.run(op, (x, z, weight, out), (eps,), s):
        return out
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, C = xt.shape
    if C % _GATED_HEAD:
        raise OpError(f"{op}: x has {C} channels, not a multiple of the head size {_GATED_HEAD}")
    H = C // _GATED_HEAD
    zt = tensor(op, "z", z, BF16, ndim=2, shape=(M, C))
    wt = tensor(op, "weight", weight, BF16, ndim=1, shape=(_GATED_HEAD,))
    res = out if out is not None else memory.DeviceArray.empty((M, C), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, C))
    same_device(op, xt, zt, wt, yt)
    if not _empty_ok(M, H):
        return res
    sx, sz, sy = row_stride(xt), row_stride(zt), row_stride(yt)
    fits_i32(op, H=H, stride_x=sx, stride_z=sz, stride_y=sy)
    v = _variant((xt.ptr, zt.ptr, wt.ptr, yt.ptr), (sx, sz, sy))
    k = get_kernel(_gated_base(v))
    _calls.launch(op, _bindable(out, xt, zt, wt, yt), (eps,),
                  [(k, (M, _grid_y(op, _cdiv(H, k.constexprs["HEADS_PER_PROG"])), 1),
                    (xt, zt, wt, yt, sx, sz, sy, H, float(eps)))], s)
    return res


def qk_norm_rope(qg, k, positions, q_weight, k_weight, num_q_heads: int, num_kv_heads: int, head_dim: int = 256,
                 eps: float = 1e-6, theta: float = 1e7, q_out=None, k_out=None, stream=None):
    """Attention preamble: split q from the interleaved per-head [query | gate] projection, RMSNorm(1+w) q and k
    per head, partial neox RoPE on the first head_dim/4 dims. qg [T, Hq*2*D], k [T, Hkv*D], positions int32 [T].
    Returns (q_out [T, Hq, D], k_out [T, Hkv, D]); the gate stays in qg (see :func:`sigmoid_mul`)."""
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
    fits_i32(op, stride_qg=sq, stride_k=sk, Hq=Hq, Hkv=Hkv)
    v = _variant((qt.ptr, kt.ptr, pt.ptr, wq.ptr, wk.ptr, qo.ptr, ko.ptr), (sq, sk))
    kern = get_kernel(_qk_base(D, v))
    hpp = kern.constexprs["HEADS_PER_PROG"]
    slots = (qt, kt, pt, wq, wk, qo, ko) if q_out is not None and k_out is not None else None
    _calls.launch(key, slots, (eps, theta), [(kern, (T, _grid_y(op, _cdiv(Hq, hpp) + _cdiv(Hkv, hpp)), 1),
                                              (qt, kt, pt, wq, wk, qo, ko, sq, sk, Hq, Hkv, float(eps), float(theta)))],
                  s)
    return qo_res, ko_res


def silu_mul(x, out=None, stream=None):
    """SwiGLU: y = silu(x[:, :I]) * x[:, I:] on a merged [gate | up] projection x [M, 2I]."""
    op = "silu_mul"
    s = stream_of(stream)
    if out is not None and _calls.run(op, (x, out), (), s):
        return out
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, I2 = xt.shape
    if I2 % 2:
        raise OpError(f"{op}: x has an odd number of columns ({I2}); expected [gate | up]")
    I = I2 // 2
    res = out if out is not None else memory.DeviceArray.empty((M, I), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, I))
    same_device(op, xt, yt)
    if not _empty_ok(M, I):
        return res
    sx, sy = row_stride(xt), row_stride(yt)
    fits_i32(op, I=I, stride_x=sx, stride_y=sy)
    k = get_kernel(_silu_base(_variant((xt.ptr, yt.ptr), (sx, sy))))
    _calls.launch(op, _bindable(out, xt, yt), (), [(k, (M, _grid_y(op, _cdiv(I, k.constexprs["BLOCK"])), 1),
                                                    (xt, yt, sx, sy, I))], s)
    return res


def sigmoid_mul(x, gate, out=None, stream=None):
    """out = x * sigmoid(gate): x [T, H*D], gate [T, H, D] (any strides with a contiguous last dim, e.g. the gate
    halves of qk_norm_rope's qg viewed as qg.view(T, H, 2, D)[:, :, 1]). out may be x (in place)."""
    op = "sigmoid_mul"
    s = stream_of(stream)
    if out is not None and _calls.run(op, (x, gate, out), (), s):
        return out
    gt = tensor(op, "gate", gate, BF16, ndim=3)
    T, H, D = gt.shape
    if D not in _SIGMOID_DIMS:
        raise OpError(f"{op}: head dim must be one of {sorted(_SIGMOID_DIMS)}, got {D}")
    xt = tensor(op, "x", x, BF16, ndim=2, shape=(T, H * D))
    res = out if out is not None else memory.DeviceArray.empty((T, H * D), BF16, device=xt.device)
    ot = tensor(op, "out", res, BF16, ndim=2, shape=(T, H * D))
    same_device(op, xt, gt, ot)
    if not _empty_ok(T, H):
        return res
    sx, so = row_stride(xt), row_stride(ot)
    sgt = int(gt.strides[0]) if T > 1 else H * int(gt.strides[1])
    sgh = int(gt.strides[1]) if H > 1 else D
    fits_i32(op, H=H, stride_x=sx, gate_stride_t=sgt, gate_stride_h=sgh, stride_out=so)
    v = _variant((xt.ptr, gt.ptr, ot.ptr), (sx, sgt, sgh, so))
    k = get_kernel(_sigmoid_base(D, v))
    _calls.launch(op, _bindable(out, xt, gt, ot), (), [(k, (T, _grid_y(op, _cdiv(H, k.constexprs["HEADS_PER_PROG"])), 1),
                                                        (xt, gt, ot, sx, sgt, sgh, so, H))], s)
    return res


def embedding(ids, table, out=None, stream=None):
    """out[t] = table[ids[t]]; ids int32 [T], table [V, N] bf16. Ids outside [0, V) give zero rows (checked on
    the device, so a bad id never reads out of bounds)."""
    op = "embedding"
    s = stream_of(stream)
    if out is not None and _calls.run(op, (ids, table, out), (), s):
        return out
    it = tensor(op, "ids", ids, "int32", ndim=1)
    tt = tensor(op, "table", table, BF16, ndim=2)
    T = it.shape[0]
    V, N = tt.shape
    res = out if out is not None else memory.DeviceArray.empty((T, N), BF16, device=tt.device)
    ot = tensor(op, "out", res, BF16, ndim=2, shape=(T, N))
    same_device(op, it, tt, ot)
    if not _empty_ok(T, N):
        return res
    if T > 1 and it.strides[0] != 1:
        raise OpError(f"{op}: ids must be contiguous")
    st, so = row_stride(tt), row_stride(ot)
    fits_i32(op, V=V, N=N, stride_table=st, stride_out=so)
    k = get_kernel(_embedding_base(_variant((it.ptr, tt.ptr, ot.ptr), (st, so))))
    _calls.launch(op, _bindable(out, it, tt, ot), (), [(k, (T, _grid_y(op, _cdiv(N, k.constexprs["BLOCK"])), 1),
                                                        (it, tt, ot, st, so, V, N))], s)
    return res
