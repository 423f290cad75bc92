"""Typed ops of the norm family (kernels_src/norm; Qwen3.5/3.6 semantics): RMSNorm, RMSNorm fused with the
residual add, the GDN output's gated RMSNorm.

Tensors, layouts, the `.a16`/`.any` choice and bound calls: the row-op conventions in :mod:`vkc_runtime.ops._check`.

Programmatic dependent launch (sm_90a+, ARCHITECTURE.md section 8): rows up to 4096 wide and the gated norm read
the norm weight before their device-side wait, so the weight must not be written by the kernel launched just
before on the same stream (model weights never are; ``VKC_PDL=0`` lifts the rule).
"""
from __future__ import annotations

from .. import memory
from ..bound import CallCache, Launch
from ..kernels import get_kernel
from ._check import (BF16, VARIANTS, OpError, bindable, cdiv, fits_i32, grid_y, nonempty, row_stride,
                     same_device, stream_of, tensor, variant)

__all__ = ["rmsnorm", "add_rmsnorm", "gated_rmsnorm", "OpError", "ROW_BLOCKS", "BASES"]

ROW_BLOCKS = (1024, 2048, 4096, 8192, 16384)  # row capacities of the rmsnorm specializations
_GATED_HEAD = 128


# the kernel names, spelled once: the ops call these, BASES is built from them
def _rms_base(kind: str, block: int, suffix: str) -> str:
    return f"norm.{kind}.b{block}.{suffix}"


def _gated_base(suffix: str) -> str:
    return f"norm.gated_rmsnorm.h128.{suffix}"


BASES = tuple(
    [_rms_base(k, b, v) for k in ("rmsnorm", "add_rmsnorm") for b in ROW_BLOCKS for v in VARIANTS]
    + [_gated_base(v) for v in VARIANTS])

_calls = CallCache(per_key=8)  # bound calls, keyed by op


def _block_for(op: str, n: int) -> int:
    for b in ROW_BLOCKS:
        if n <= b:
            return b
    raise OpError(f"{op}: rows of {n} elements exceed the largest compiled row block {ROW_BLOCKS[-1]}")


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
    if not nonempty(M, N):
        return res
    sx, sy = row_stride(xt), row_stride(yt)
    fits_i32(op, N=N, stride_x=sx, stride_y=sy)
    k = get_kernel(_rms_base("rmsnorm", _block_for(op, N), variant((xt.ptr, wt.ptr, yt.ptr), (sx, sy))))
    launch = Launch(k, (M, 1, 1), (xt, wt, yt, sx, sy, N, float(eps)))
    _calls.launch(op, bindable(out, xt, wt, yt), (eps,), [launch], s)
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
    if not nonempty(M, N):
        return res
    sx, sr, sy = row_stride(xt), row_stride(rt), row_stride(yt)
    fits_i32(op, N=N, stride_x=sx, stride_r=sr, stride_y=sy)
    v = variant((xt.ptr, rt.ptr, wt.ptr, yt.ptr), (sx, sr, sy))
    k = get_kernel(_rms_base("add_rmsnorm", _block_for(op, N), v))
    launch = Launch(k, (M, 1, 1), (xt, rt, wt, yt, sx, sr, sy, N, float(eps)))
    _calls.launch(op, bindable(out, xt, rt, wt, yt), (eps,), [launch], s)
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
    if not nonempty(M, H):
        return res
    sx, sz, sy = row_stride(xt), row_stride(zt), row_stride(yt)
    fits_i32(op, H=H, stride_x=sx, stride_z=sz, stride_y=sy)
    v = variant((xt.ptr, zt.ptr, wt.ptr, yt.ptr), (sx, sz, sy))
    k = get_kernel(_gated_base(v))
    launch = Launch(k, (M, grid_y(op, cdiv(H, k.constexprs["HEADS_PER_PROG"])), 1),
                    (xt, zt, wt, yt, sx, sz, sy, H, float(eps)))
    _calls.launch(op, bindable(out, xt, zt, wt, yt), (eps,), [launch], s)
    return res
