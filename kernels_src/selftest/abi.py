"""Self-test kernels: prove the launch ABI on a real device (every scalar width, hidden params) and give
the launch-overhead benchmark an empty kernel."""
import triton
import triton.language as tl

from kernels_src.selftest.common import store_f32


@triton.jit
def abi_probe_kernel(out_ptr, a_i1, a_i8, a_i16, a_i32, a_i64, a_u32, a_fp16, a_bf16, a_fp32, a_fp64, tail):
    """Writes every scalar argument (converted to fp64) to out[0..9] and ``tail`` to out[10]."""
    tl.store(out_ptr + 0, a_i1.to(tl.float64))
    tl.store(out_ptr + 1, a_i8.to(tl.float64))
    tl.store(out_ptr + 2, a_i16.to(tl.float64))
    tl.store(out_ptr + 3, a_i32.to(tl.float64))
    tl.store(out_ptr + 4, a_i64.to(tl.float64))
    tl.store(out_ptr + 5, a_u32.to(tl.float64))
    tl.store(out_ptr + 6, a_fp16.to(tl.float64))
    tl.store(out_ptr + 7, a_bf16.to(tl.float64))
    tl.store(out_ptr + 8, a_fp32.to(tl.float64))
    tl.store(out_ptr + 9, a_fp64)
    tl.store(out_ptr + 10, tail.to(tl.float64))


@triton.jit
def scale_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    """out = x + alpha * y over fp32 vectors (alpha is an fp32 scalar: 4 bytes in the ABI)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    y = tl.load(y_ptr + offs, mask=m)
    store_f32(out_ptr, offs, x + alpha * y, m)


@triton.jit
def empty_kernel(x_ptr, n):
    """Does nothing: used to measure host time per launch."""
    pass
