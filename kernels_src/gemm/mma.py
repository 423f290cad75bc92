"""The portable BF16 GEMM (Triton): out[M, N] = x[M, K] @ w[N, K]^T, bf16 in and out, fp32 accumulation.

The archs without the CuTe WGMMA kernel (sm_80, sm_86, sm_89, sm_100a, sm_120a, sm_121a) run this one; Triton lowers
``tl.dot`` to each arch's tensor-core instruction (``mma.sync`` on sm_80 / 86 / 89 / 120a / 121a, ``tcgen05.mma``
on sm_100a, ``wgmma`` on sm_90a, where it is built as a second lane that tests and benchmarks force). Loads are
pointer-based (cp.async rings from Triton's pipeliner), one output tile per program, tiles visited in groups of
GROUP_M tile rows (``kernels_src/gemm_fp8/gemm_fp8.py`` ``_tile``), so a wave's x rows and w rows stay in L2.

``gemm_w4a16_kernel`` is the same GEMM with NVFP4 weights dequantized in the kernel (W4A16, the large-M side of
``vkc_runtime.ops.gemv.gemv_w4a16``; layout and decoders in ``kernels_src/gemv/gemv.py``): each k-slice's packed
codes and e4m3 group scales decode to exact bf16 weights in registers (``nvfp4_tile``), the MMA runs bf16 x bf16,
and the one global multiplier scales the fp32 accumulator before the store. ``nvfp4_dequant_kernel`` writes the
same weights times the multiplier as a bf16 [N, K] matrix (one bf16 rounding per weight), for large M where
dequantizing once and running the bf16 GEMM beats decoding every k-slice in every tile row (ops.gemm).

Bounds: rows of x past M and rows of w past N are read from row ``m % M`` (``n % N``): in bounds and never stored,
so the loads need no M / N mask and stay vectorized; K is masked per k-slice (the host promises K % 16 == 0 and
row strides % 16, the ``div=16`` of the spec, so whole 16-element pieces are masked). Stores are masked to [M, N].
"""
import triton
import triton.language as tl

from kernels_src.gemm_fp8.gemm_fp8 import _store, _tile
from kernels_src.gemv.gemv import nvfp4_tile


@triton.jit
def gemm_bf16_kernel(a_ptr, w_ptr, out_ptr, M, N, K, stride_am, stride_wn, stride_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """a [M, K] bf16 (row stride stride_am), w [N, K] bf16 (stride_wn) -> out [M, N] bf16 (stride_om).
    Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)."""
    pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (m % M).to(tl.int64)[:, None] * stride_am + k[None, :]
    w_ptrs = w_ptr + (n % N).to(tl.int64)[:, None] * stride_wn + k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = k[None, :] < K - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=kmask, other=0.0)
        w = tl.load(w_ptrs, mask=kmask, other=0.0)
        acc = tl.dot(a, tl.trans(w), acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    _store(acc, m, n, M, N, out_ptr, stride_om)


@triton.jit
def gemm_w4a16_kernel(a_ptr, w_ptr, s_ptr, out_ptr, alpha, M, N, K, stride_am, stride_wn, stride_sn, stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      PRMT: tl.constexpr):
    """a [M, K] bf16 (row stride stride_am), NVFP4 w: packed [N, K/2] uint8 (row stride stride_wn bytes) and
    scales [N, K/16] e4m3 bytes (stride_sn), alpha fp32 -> out [M, N] bf16 (stride_om) = alpha * (a @ W^T).
    K % 16 == 0 (scale groups past K // 16 and k past K read as zero); BLOCK_K a multiple of 16. Grid as
    gemm_bf16_kernel's. PRMT: the packed-word decoder (inline PTX, compiled kernels only)."""
    pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = (n % N).to(tl.int64)
    n_ok = rn < N  # every wrapped row is in bounds
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (m % M).to(tl.int64)[:, None] * stride_am + k[None, :]
    w_rows = w_ptr + rn[:, None, None] * stride_wn
    if PRMT:
        w_rows32 = w_ptr.to(tl.pointer_type(tl.int32)) + rn[:, None, None] * (stride_wn // 4)
    else:
        w_rows32 = w_rows  # unused
    s_rows = s_ptr + rn[:, None] * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kt * BLOCK_K
        w = nvfp4_tile(w_rows, w_rows32, s_rows, k0, K, n_ok, BLOCK_N, BLOCK_K, PRMT)
        a = tl.load(a_ptrs, mask=k[None, :] < K - k0, other=0.0)
        acc = tl.dot(a, tl.trans(w), acc)
        a_ptrs += BLOCK_K
    _store(acc * alpha, m, n, M, N, out_ptr, stride_om)


@triton.jit
def nvfp4_dequant_kernel(w_ptr, s_ptr, out_ptr, alpha, N, K, stride_wn, stride_sn, stride_on,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRMT: tl.constexpr):
    """NVFP4 w (packed [N, K/2], scales [N, K/16], as gemm_w4a16_kernel's) -> out [N, K] bf16 = bf16(W * alpha)
    (row stride stride_on). Grid (cdiv(N, BLOCK_N), cdiv(K, BLOCK_K)); rows past N and columns past K are neither
    read nor written."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    n_ok = n < N
    rn = n.to(tl.int64)
    w_rows = w_ptr + rn[:, None, None] * stride_wn
    if PRMT:
        w_rows32 = w_ptr.to(tl.pointer_type(tl.int32)) + rn[:, None, None] * (stride_wn // 4)
    else:
        w_rows32 = w_rows  # unused
    w = nvfp4_tile(w_rows, w_rows32, s_ptr + rn[:, None] * stride_sn, k0, K, n_ok, BLOCK_N, BLOCK_K, PRMT)
    k = k0 + tl.arange(0, BLOCK_K)
    mask = n_ok[:, None] & (k < K)[None, :]
    tl.store(out_ptr + rn[:, None] * stride_on + k[None, :], (w.to(tl.float32) * alpha).to(tl.bfloat16), mask=mask)
