import triton
import triton.language as tl


@triton.jit
def store_f32(ptr, offs, val, mask):
    tl.store(ptr + offs, val.to(tl.float32), mask=mask)
