"""The paged KV cache write of the attention family: :func:`reshape_and_cache`."""
from __future__ import annotations

from ...bound import CallCache, Launch
from ...kernels import get_kernel
from .._check import OpError, cdiv, fits_i32, same_device, stream_of, tensor
from .common import BF16, cache_pair, cache_write_base, stride_of

__all__ = ["reshape_and_cache"]

_rac_calls = CallCache()


def reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, *, stream=None):
    """Write k, v [T, Hkv, D] into the paged caches at slot_mapping int32 [T] (slot = block * block_size +
    offset); negative or out-of-range slots are skipped on the device. Two tokens with the same valid slot:
    the slot ends up with elements of one of them (which one is unspecified), nothing else is touched."""
    s = stream_of(stream)
    if _rac_calls.run(None, (k, v, k_cache, v_cache, slot_mapping), (), s):
        return
    op = "reshape_and_cache"
    c = cache_pair(op, k_cache, v_cache)
    kc, vc, NB, BS, Hkv, D, sb, ss = c.k, c.v, c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim, \
        c.stride_block, c.stride_slot
    kt = tensor(op, "k", k, BF16, ndim=3, shape=(None, Hkv, D))
    T = kt.shape[0]
    vt = tensor(op, "v", v, BF16, ndim=3, shape=(T, Hkv, D))
    st = tensor(op, "slot_mapping", slot_mapping, "int32", ndim=1, shape=(T,))
    if T > 1 and st.strides[0] != 1:
        raise OpError(f"{op}: slot_mapping must be contiguous")
    for name, t in (("k", kt), ("v", vt)):
        if stride_of(t, 1, D) != D:
            raise OpError(f"{op}: {name} must be contiguous in [Hkv, D], strides {tuple(t.strides)}")
    same_device(op, kc, vc, kt, vt, st)
    if T == 0:
        return
    skt, svt = stride_of(kt, 0, Hkv * D), stride_of(vt, 0, Hkv * D)
    N = Hkv * D
    fits_i32(op, T=T, stride_kt=skt, stride_vt=svt, N=N)
    al = all(p % 16 == 0 for p in (kt.ptr, vt.ptr)) and skt % 16 == 0 and svt % 16 == 0
    kern = get_kernel(cache_write_base(al))
    gy = cdiv(N, kern.constexprs["BLOCK"])
    launch = Launch(kern, (T, gy, 1), (kt, vt, kc, vc, st, skt, svt, sb, ss, BS, N, NB * BS))
    _rac_calls.launch(None, (kt, vt, kc, vc, st), (), [launch], s)
