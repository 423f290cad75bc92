"""Typed ops of the act family (kernels_src/act; Qwen3.5/3.6 semantics): SwiGLU on a merged [gate | up]
projection and the attention output gate ``x * sigmoid(gate)``.

Tensors, layouts, the `.a16`/`.any` choice and bound calls: the row-op conventions in :mod:`vkc_runtime.ops._check`.
"""
from __future__ import annotations

from .. import memory
from ..bound import CallCache, Launch
from ..kernels import get_kernel
from ._check import (BF16, VARIANTS, OpError, bindable, cdiv, fits_i32, grid_y, nonempty, row_stride,
                     same_device, stream_of, tensor, variant)

__all__ = ["silu_mul", "sigmoid_mul", "OpError", "BASES"]

_SIGMOID_DIMS = (256, 128)


# the kernel names, spelled once: the ops call these, BASES is built from them
def _silu_base(suffix: str) -> str:
    return f"act.silu_mul.{suffix}"


def _sigmoid_base(head_dim: int, suffix: str) -> str:
    return f"act.sigmoid_mul.d{head_dim}.{suffix}"


BASES = tuple([_silu_base(v) for v in VARIANTS] + [_sigmoid_base(d, v) for d in _SIGMOID_DIMS for v in VARIANTS])

_calls = CallCache(per_key=8)  # bound calls, keyed by op


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
    if not nonempty(M, I):
        return res
    sx, sy = row_stride(xt), row_stride(yt)
    fits_i32(op, I=I, stride_x=sx, stride_y=sy)
    k = get_kernel(_silu_base(variant((xt.ptr, yt.ptr), (sx, sy))))
    launch = Launch(k, (M, grid_y(op, cdiv(I, k.constexprs["BLOCK"])), 1), (xt, yt, sx, sy, I))
    _calls.launch(op, bindable(out, xt, yt), (), [launch], s)
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
    if not nonempty(T, H):
        return res
    sx, so = row_stride(xt), row_stride(ot)
    sgt = int(gt.strides[0]) if T > 1 else H * int(gt.strides[1])
    sgh = int(gt.strides[1]) if H > 1 else D
    fits_i32(op, H=H, stride_x=sx, gate_stride_t=sgt, gate_stride_h=sgh, stride_out=so)
    v = variant((xt.ptr, gt.ptr, ot.ptr), (sx, sgt, sgh, so))
    k = get_kernel(_sigmoid_base(D, v))
    launch = Launch(k, (T, grid_y(op, cdiv(H, k.constexprs["HEADS_PER_PROG"])), 1),
                    (xt, gt, ot, sx, sgt, sgh, so, H))
    _calls.launch(op, bindable(out, xt, gt, ot), (), [launch], s)
    return res
