"""Typed op of the embedding family (kernels_src/embedding): the token embedding gather.

Tensors, layouts, the `.a16`/`.any` choice and bound calls: the row-op conventions in :mod:`vkc_runtime.ops._check`.
"""
from __future__ import annotations

from .. import memory
from ..bound import CallCache, Launch
from ..kernels import get_kernel
from ._check import (BF16, VARIANTS, OpError, bindable, cdiv, fits_i32, grid_y, nonempty, row_stride,
                     same_device, stream_of, tensor, variant)

__all__ = ["embedding", "OpError", "BASES"]


# the kernel names, spelled once: the op calls this, BASES is built from it
def _embedding_base(suffix: str) -> str:
    return f"embedding.embedding.{suffix}"


BASES = tuple(_embedding_base(v) for v in VARIANTS)

_calls = CallCache(per_key=8)  # bound calls


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
    if not nonempty(T, N):
        return res
    if T > 1 and it.strides[0] != 1:
        raise OpError(f"{op}: ids must be contiguous")
    st, so = row_stride(tt), row_stride(ot)
    fits_i32(op, V=V, N=N, stride_table=st, stride_out=so)
    k = get_kernel(_embedding_base(variant((it.ptr, tt.ptr, ot.ptr), (st, so))))
    launch = Launch(k, (T, grid_y(op, cdiv(N, k.constexprs["BLOCK"])), 1), (it, tt, ot, st, so, V, N))
    _calls.launch(op, bindable(out, it, tt, ot), (), [launch], s)
    return res
