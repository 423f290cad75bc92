"""FP8 e4m3 W8A8 GEMMs and the bf16 -> fp8 activation quantizers (Triton).

GEMMs, bf16 out, fp32 accumulation, weights [N, K] as Hugging Face stores them (both operands K-major):

  gemm_fp8_scaled_kernel   out[m, n] = (sum_k a[m, k] w[n, k]) * sa[m * sa_step] * sw[n * sw_step]
                           per-tensor scales are the broadcast case (step 0), per-token activation and
                           per-channel weight scales step 1 (or any element stride of a scale vector)
  gemm_fp8_block_kernel    out[m, n] = sum_kb (sum_{k in kb} a[m, k] w[n, k]) * sa[m, kb] * sw[n // 128, kb]
                           the block-wise FP8 of Qwen's FP8 checkpoints: 128x128 weight blocks, activations
                           quantized per token per 128 columns; each 128-wide k-slice's partial product is
                           scaled ("promoted") into the fp32 accumulator, so BLOCK_K == 128.

The grid is one program per output tile, tiles visited in groups of GROUP_M tile rows (grouped rasterization, so
the A rows and W rows of a wave stay in L2). Rows of A past M and rows of W past N are read from row ``m % M``
(``n % N``): in bounds and never stored, so the loads need no M/N mask and stay vectorized; K is masked (the
host promises K % 16 == 0, so a partial last k-slice is masked in whole 16-byte pieces). Stores are masked to
[M, N]. The scale reads use the same wrapped rows, so every scale index is inside the scale tensors the host
checked: sa[0 .. (M-1) * sa_step], sw[0 .. (N-1) * sw_step]; block: sa[M, cdiv(K, 128)] (row stride
stride_sam), sw[cdiv(N, 128), cdiv(K, 128)] (row stride stride_swn).

Quantizers (bf16 x [M, K] -> fp8 e4m3 q [M, K]; q = satfinite(rn(x / scale)), the division IEEE-rounded, the
value clamped to +-448 before the cast):

  quant_token_kernel   dynamic per token: scale[m] = max(amax(|x[m, :]|) / 448, MIN_SCALE)
  quant_tensor_kernel  static per tensor: scale read from a one-element device buffer (graph replays may change it)
  quant_group_kernel   dynamic per token per group of 128 columns: scale[m, g] = max(amax(|x[m, 128 g : 128 g +
                       128]|) / 448, MIN_SCALE), the block GEMM's activation layout [M, cdiv(K, 128)]

MIN_SCALE (1 / (448 * 512)) keeps an all-zero row from dividing by zero (its q is 0). NaN inputs give
unspecified values (still in bounds).
"""
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)
MIN_SCALE = tl.constexpr(1.0 / (448.0 * 512.0))


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(tile row, tile column) of this program under grouped rasterization."""
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BLOCK_M)
    n_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * n_n
    group = pid // per_group
    first = group * GROUP_M
    rows = tl.minimum(n_m - first, GROUP_M)
    within = pid - group * per_group
    return first + within % rows, within // rows


@triton.jit
def _store(acc, m, n, M, N, out_ptr, stride_om):
    mask = (m < M)[:, None] & (n < N)[None, :]
    tl.store(out_ptr + m.to(tl.int64)[:, None] * stride_om + n[None, :], acc.to(tl.bfloat16), mask=mask)


@triton.jit
def gemm_fp8_scaled_kernel(a_ptr, w_ptr, out_ptr, sa_ptr, sw_ptr, M, N, K, stride_am, stride_wn, stride_om,
                           sa_step, sw_step,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr):
    """a [M, K] fp8 (row stride stride_am), w [N, K] fp8 (stride_wn) -> out [M, N] bf16 (stride_om); scales as
    in the module doc. Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)."""
    pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = (m % M).to(tl.int64)
    rn = (n % N).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + k[None, :]
    w_ptrs = w_ptr + rn[:, None] * stride_wn + k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = k[None, :] < K - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=kmask, other=0.0)
        w = tl.load(w_ptrs, mask=kmask, other=0.0)
        acc = tl.dot(a, tl.trans(w), acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    sa = tl.load(sa_ptr + rm * sa_step)
    sw = tl.load(sw_ptr + rn * sw_step)
    _store(acc * sa[:, None] * sw[None, :], m, n, M, N, out_ptr, stride_om)


@triton.jit
def gemm_fp8_block_kernel(a_ptr, w_ptr, out_ptr, sa_ptr, sw_ptr, M, N, K, stride_am, stride_wn, stride_om,
                          stride_sam, stride_swn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr):
    """Block-wise scaled GEMM (module doc): sa [M, cdiv(K, 128)] fp32 (row stride stride_sam), sw [cdiv(N, 128),
    cdiv(K, 128)] fp32 (row stride stride_swn). BLOCK_K must be 128 (one scale group per k-slice). Grid as the
    scaled kernel's."""
    tl.static_assert(BLOCK_K == 128, "one 128-wide scale group per k-slice")
    pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = (m % M).to(tl.int64)
    rn = (n % N).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + k[None, :]
    w_ptrs = w_ptr + rn[:, None] * stride_wn + k[None, :]
    sa_ptrs = sa_ptr + rm * stride_sam
    sw_ptrs = sw_ptr + (rn // 128) * stride_swn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = k[None, :] < K - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=kmask, other=0.0)
        w = tl.load(w_ptrs, mask=kmask, other=0.0)
        sa = tl.load(sa_ptrs + kt)
        sw = tl.load(sw_ptrs + kt)
        part = tl.dot(a, tl.trans(w))
        acc += part * (sa[:, None] * sw[None, :])
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    _store(acc, m, n, M, N, out_ptr, stride_om)


@triton.jit
def to_fp8(x, scale):
    """satfinite(rn(x / scale)) as e4m3 (the quantizers' formula; kernels_src/moe/w8a8.py's epilogue uses it too)."""
    q = tl.math.div_rn(x, scale)
    return tl.clamp(q, -FP8_MAX, FP8_MAX).to(tl.float8e4nv)


@triton.jit
def quant_token_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, BLOCK: tl.constexpr):
    """x [M, K] bf16 -> q [M, K] fp8, s [M] fp32 (contiguous). Grid (M,): two passes over the row (amax, then
    quantize)."""
    row = tl.program_id(0).to(tl.int64)
    xr = x_ptr + row * stride_xm
    qr = q_ptr + row * stride_qm
    offs = tl.arange(0, BLOCK)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(xr + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), FP8_MAX), MIN_SCALE)
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        mask = k0 + offs < K
        x = tl.load(xr + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(qr + k0 + offs, to_fp8(x, scale), mask=mask)


@triton.jit
def quant_tensor_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, BLOCK: tl.constexpr):
    """x [M, K] bf16 -> q [M, K] fp8 with the one scale s_ptr[0]. Grid (M, cdiv(K, BLOCK))."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < K
    scale = tl.load(s_ptr)
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(q_ptr + row * stride_qm + offs, to_fp8(x, scale), mask=mask)


@triton.jit
def quant_group_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, M, ROWS: tl.constexpr,
                       GROUPS: tl.constexpr):
    """x [M, K] bf16 -> q [M, K] fp8, s [M, cdiv(K, 128)] fp32 (row stride stride_sm). Grid (cdiv(M, ROWS),
    cdiv(cdiv(K, 128), GROUPS)): each program quantizes GROUPS groups of 128 columns of ROWS rows (a tile of
    ROWS * GROUPS groups, one per line), so narrow rows such as the MoE's h [M * k', 512] still give a program
    several KB."""
    i = tl.arange(0, ROWS * GROUPS)
    row = tl.program_id(0) * ROWS + i // GROUPS
    g = tl.program_id(1) * GROUPS + i % GROUPS
    row_ok = row < M
    row64 = tl.where(row_ok, row, 0).to(tl.int64)
    c = tl.arange(0, 128)
    col = g[:, None] * 128 + c[None, :]
    mask = row_ok[:, None] & (col < K)
    x = tl.load(x_ptr + row64[:, None] * stride_xm + col, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX), MIN_SCALE)
    tl.store(s_ptr + row64 * stride_sm + g, scale, mask=row_ok & (g * 128 < K))
    tl.store(q_ptr + row64[:, None] * stride_qm + col, to_fp8(x, scale[:, None]), mask=mask)
