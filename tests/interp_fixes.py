"""Five Triton 3.9 interpreter bugs that make CPU results differ from the GPU, fixed for the test session, and
two gaps filled (kernel code is unchanged; only `triton.runtime.interpreter` and, for 5 and 6, three names
of kernels_src/common.py are touched, and only under TRITON_INTERPRET=1):

1. bf16 tensors are kept as raw uint16 bits and `tl.dot` multiplies those bits as integers. Widen bf16
   operands to fp32 (exact) first: bf16 products with fp32 accumulation, as the tensor cores compute.
2. fp32 -> bf16 casts truncate; the GPU (`cvt.rn.bf16.f32`) rounds to nearest even.
3. `block_mask & scalar_bool` (a 0-d int1) is an int1 block whose handle holds int32 data, which masked
   loads and stores refuse ("mask has unsupported dtype"); such masks are read as the booleans they stand for.
4. fp32 -> fp8 e4m3 (`float8e4nv`) casts round half up, flush small values and wrap large ones; the GPU
   (`cvt.rn.satfinite.e4m3x2.f32`) rounds to nearest even, keeps subnormals and saturates at +-448.
5. The interpreter has no grid dependency control (`gdc_wait` / `gdc_launch_dependents` fail outside a
   compiled kernel): kernels_src/common.py's two names (pdl_enter, the PDL kernels' only use) become no-ops,
   which is exact -- the interpreter runs each launch to its end before the next starts, so the wait is
   always already satisfied.
6. No inline PTX either: kernels_src/common.py's L2 prefetch (`_prefetch_l2_lines`, the one asm statement that
   changes no value) becomes a masked load of the same addresses, its result unused -- so the bounds checker of
   the CPU tests sees every address a prefetch forms.
7. `tl.dot_scaled` decodes every scale as e8m0 (2^(byte - 127)), also float8 e4m3 scales (NVFP4's per-16
   scales, which the GPU lowers to the mxf4nvf4 MMA or to an exact bf16 emulation): e4m3 scale handles are
   decoded as e4m3 (ml_dtypes), e8m0 ones as before.
"""
from __future__ import annotations

import numpy as np


def _prefetch_as_load(ptrs, mask):
    """Item 6: the interpreter's stand-in of kernels_src.common._prefetch_l2_lines (called inside an interpreted
    kernel, where tl.load runs on the interpreter's builder)."""
    import triton.language as tl
    tl.load(ptrs, mask=mask)


def apply() -> None:
    import triton.language as tl
    from triton.runtime import interpreter as I

    if getattr(I.InterpreterBuilder.create_dot, "_vkc_fixed", False):
        return
    orig_dot = I.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(h):
            if getattr(h.dtype, "scalar", h.dtype) == tl.bfloat16:
                bits = np.asarray(h.data).astype(np.uint32) << np.uint32(16)
                return I.TensorHandle(bits.view(np.float32), tl.float32)
            return h
        return orig_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    orig_cast = I.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            f = np.ascontiguousarray(np.asarray(src.data).astype(np.float32))
            u = f.view(np.uint32).astype(np.uint64)
            bits = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)
            bits = np.where(np.isnan(f), np.uint16(0x7FC0), bits)
            return I.TensorHandle(bits, tl.bfloat16)
        return orig_cast(self, src, dst_type)

    orig_fp_to_fp = I.InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            import ml_dtypes
            f = np.asarray(src.data).astype(np.float32)
            q = np.where(np.isnan(f), f, np.clip(f, -448.0, 448.0)).astype(ml_dtypes.float8_e4m3fn)
            return I.TensorHandle(q.view(np.uint8), tl.float8e4nv)
        return orig_fp_to_fp(self, src, dst_type, rounding_mode)

    def boolean(mask):
        if np.asarray(mask.data).dtype != np.bool_:
            return I.TensorHandle(np.asarray(mask.data) != 0, tl.int1)
        return mask

    orig_load = I.InterpreterBuilder.create_masked_load
    orig_store = I.InterpreterBuilder.create_masked_store

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        return orig_load(self, ptrs, boolean(mask), other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return orig_store(self, ptrs, value, boolean(mask), cache_policy)

    orig_scale = I._dot_scaled_scale_to_f32

    def dot_scaled_scale_to_f32(scale_handle, compute_type):
        if scale_handle.dtype == tl.float8e4nv:
            import ml_dtypes
            return np.asarray(scale_handle.data).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        return orig_scale(scale_handle, compute_type)

    I._dot_scaled_scale_to_f32 = dot_scaled_scale_to_f32
    create_dot._vkc_fixed = True
    import kernels_src.common as kc  # the one module that calls the two (pdl_enter)

    def gdc_noop():
        return None

    kc.gdc_wait = gdc_noop
    kc.gdc_launch_dependents = gdc_noop
    kc._prefetch_l2_lines = _prefetch_as_load
    I.InterpreterBuilder.create_masked_load = create_masked_load
    I.InterpreterBuilder.create_masked_store = create_masked_store
    I.InterpreterBuilder.create_dot = create_dot
    I.InterpreterBuilder.cast_impl = cast_impl
    I.InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
