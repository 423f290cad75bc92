"""RMSNorm family (Qwen3.5/3.6 semantics, ARCHITECTURE.md "Kernel families"). bf16 in/out, fp32 math.

Grids (one program per row; row index cast to int64 before it meets a stride):
  rmsnorm_kernel, add_rmsnorm_kernel: (M,)
  gated_rmsnorm_kernel:               (M, cdiv(H, HEADS_PER_PROG))
"""
import triton
import triton.language as tl

from kernels_src.common import floor16, pdl_enter, silu_f32


# Rows up to EARLY_W_BLOCK load the norm weight before pdl_enter, beside the activations rather than after the
# reduction (one dependent load fewer); wider blocks load it after the reduction, as holding it across spilled
# (add_rmsnorm 8192 on sm_80, 16384 on sm_100a: ptxas 13.4).
EARLY_W_BLOCK = tl.constexpr(4096)


@triton.jit
def _early_weight(w_ptr, cols, mask, BLOCK: tl.constexpr):
    if BLOCK <= EARLY_W_BLOCK:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    else:
        w = tl.zeros((BLOCK,), dtype=tl.bfloat16)  # unused: _late_weight loads it
    return w


@triton.jit
def _late_weight(w, w_ptr, cols, mask, BLOCK: tl.constexpr):
    if BLOCK > EARLY_W_BLOCK:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    return w.to(tl.float32)


@triton.jit
def _rmsnorm_row(x_row, w_ptr, y_row, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = _early_weight(w_ptr, cols, mask, BLOCK)
    pdl_enter(PDL)
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    # padded lanes are 0 and the mean divides by N, not BLOCK
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = _late_weight(w, w_ptr, cols, mask, BLOCK)
    y = x * rstd * (1.0 + w)
    tl.store(y_row + cols, y.to(tl.bfloat16), mask=mask)


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """y[m, :N] = x * rsqrt(mean(x^2) + eps) * (1 + w); grid (M,), needs BLOCK >= N."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    if N % 16 == 0:
        _rmsnorm_row(x_row, w_ptr, y_row, floor16(N), eps, BLOCK, PDL)  # vectorizable masks
    else:
        _rmsnorm_row(x_row, w_ptr, y_row, N, eps, BLOCK, PDL)


@triton.jit
def _add_rmsnorm_row(x_row, r_row, w_ptr, y_row, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = _early_weight(w_ptr, cols, mask, BLOCK)
    pdl_enter(PDL)
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(tl.bfloat16)
    tl.store(r_row + cols, s, mask=mask)
    sf = s.to(tl.float32)  # the norm sees the bf16-rounded sum, as HF does
    rstd = tl.rsqrt(tl.sum(sf * sf, axis=0) / N + eps)
    w = _late_weight(w, w_ptr, cols, mask, BLOCK)
    y = sf * rstd * (1.0 + w)
    tl.store(y_row + cols, y.to(tl.bfloat16), mask=mask)


@triton.jit
def add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, stride_x, stride_r, stride_y, N, eps,
                       BLOCK: tl.constexpr, PDL: tl.constexpr):
    """res[m] <- bf16(x + res); y = norm(res[m]) * (1 + w); grid (M,), needs BLOCK >= N."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    r_row = res_ptr + row * stride_r
    y_row = y_ptr + row * stride_y
    if N % 16 == 0:
        _add_rmsnorm_row(x_row, r_row, w_ptr, y_row, floor16(N), eps, BLOCK, PDL)
    else:
        _add_rmsnorm_row(x_row, r_row, w_ptr, y_row, N, eps, BLOCK, PDL)


@triton.jit
def gated_rmsnorm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, stride_x, stride_z, stride_y, H, eps,
                         HEAD: tl.constexpr, HEADS_PER_PROG: tl.constexpr, PDL: tl.constexpr):
    """Per head of HEAD channels: y = x * rsqrt(mean(x^2) + eps) * w * silu(z) (plain w, shape [HEAD]).

    Grid (M, cdiv(H, HEADS_PER_PROG)); axis 1 picks a group of HEADS_PER_PROG consecutive heads.
    """
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEADS_PER_PROG + tl.arange(0, HEADS_PER_PROG)
    cols = tl.arange(0, HEAD)
    offs = heads[:, None] * HEAD + cols[None, :]
    mask = (heads[:, None] < H) & (cols[None, :] < HEAD)
    w = tl.load(w_ptr + cols).to(tl.float32)
    pdl_enter(PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + row * stride_z + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD + eps)
    y = x * rstd[:, None] * w[None, :] * silu_f32(z)
    tl.store(y_ptr + row * stride_y + offs, y.to(tl.bfloat16), mask=mask)
