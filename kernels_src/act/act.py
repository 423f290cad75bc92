"""Elementwise activations on bf16 rows (fp32 math).

Grids:
  silu_mul_kernel:    (M, cdiv(I, BLOCK))                 axis 0 = row, axis 1 = column block
  sigmoid_mul_kernel: (T, cdiv(H, HEADS_PER_PROG))        axis 0 = token, axis 1 = group of heads
"""
import triton
import triton.language as tl

from kernels_src.common import floor16, pdl_enter, sigmoid_f32, silu_f32


@triton.jit
def _silu_mul_block(x_row, y_row, I, BLOCK: tl.constexpr):
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_row + I + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_row + cols, (silu_f32(g) * u).to(tl.bfloat16), mask=mask)


@triton.jit
def silu_mul_kernel(x_ptr, y_ptr, stride_x, stride_y, I, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """y[m, :I] = silu(x[m, :I]) * x[m, I:2I]; grid (M, cdiv(I, BLOCK))."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    if I % 16 == 0:
        _silu_mul_block(x_row, y_row, floor16(I), BLOCK)  # the up half starts 16-aligned too
    else:
        _silu_mul_block(x_row, y_row, I, BLOCK)


@triton.jit
def sigmoid_mul_kernel(x_ptr, gate_ptr, out_ptr, stride_x, gate_stride_t, gate_stride_h, stride_out, H,
                       D: tl.constexpr, HEADS_PER_PROG: tl.constexpr, PDL: tl.constexpr):
    """out[t, h*D + d] = x[t, h*D + d] * sigmoid(gate[t*gate_stride_t + h*gate_stride_h + d]).

    out may alias x. Grid (T, cdiv(H, HEADS_PER_PROG)).
    """
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEADS_PER_PROG + tl.arange(0, HEADS_PER_PROG)
    d = tl.arange(0, D)
    mask = (heads[:, None] < H) & (d[None, :] < D)
    offs = heads[:, None] * D + d[None, :]
    g_offs = heads[:, None].to(tl.int64) * gate_stride_h + d[None, :]
    x = tl.load(x_ptr + t * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + t * gate_stride_t + g_offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_out + offs, (x * sigmoid_f32(g)).to(tl.bfloat16), mask=mask)
