"""reshape_and_cache: scatter new K/V rows into the paged "NHD" cache.

k, v:               [T, Hkv, D] bf16, token stride stride_kt / stride_vt, inner [Hkv, D] contiguous
k_cache, v_cache:   [num_blocks, block_size, Hkv, D] bf16, block stride stride_cb, slot stride stride_cs,
                    inner [Hkv, D] contiguous (both caches share the strides)
slot_mapping:       int32 [T]; slot = block * block_size + offset. A negative slot, or one at or past
                    num_slots = num_blocks * block_size, writes nothing (bound-checked on the device).
                    Duplicate valid slots: the slot gets elements of one of the tokens' rows per column
                    block (unspecified which), nothing outside the cache is touched.

Grid (T, cdiv(N, BLOCK)) with N = Hkv * D: axis 0 = token, axis 1 = column block of the row.
"""
import triton
import triton.language as tl

from kernels_src.common import pdl_enter


@triton.jit
def reshape_and_cache_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                             stride_kt, stride_vt, stride_cb, stride_cs, block_size, N, num_slots,
                             BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if (slot >= 0) & (slot < num_slots):
        blk = (slot // block_size).to(tl.int64)
        off = (slot % block_size).to(tl.int64)
        dst = blk * stride_cb + off * stride_cs
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < N
        kr = tl.load(k_ptr + t * stride_kt + cols, mask=mask)
        vr = tl.load(v_ptr + t * stride_vt + cols, mask=mask)
        tl.store(k_cache_ptr + dst + cols, kr, mask=mask)
        tl.store(v_cache_ptr + dst + cols, vr, mask=mask)
