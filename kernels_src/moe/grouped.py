"""Grouped GEMMs of the MoE block: rows grouped by expert, one expert's weights per block of BLOCK_M rows.

    out[f] = act(a[f // a_row_div] @ w[e]^T) * row_scale[f]      for the rows of every valid block

bf16 in and out, fp32 accumulation. The grouping (ops/moe, `align`) is a device-built permutation:
sorted_ids [cap] int32 holds flat pair indices f (or a sentinel) grouped by expert, each expert's group padded
to a multiple of BLOCK_M; block_expert [cap / BLOCK_M] int32 the expert of each block (-1 past the end);
num_padded [1] int32 the padded row count. Program (pid_n, pid_b) computes the BLOCK_N output columns pid_n
of block pid_b: its rows are gathered from a by f // a_row_div, its weights are w[e] [R, K] (row-major, HF's
[out, in] layout), its results are scattered to out rows f.

ACT_SILU (GEMM1 of the block): w[e] holds 2N rows, gate rows [0, N) then up rows [N, 2N) (HF's gate_up_proj);
the program keeps two accumulators, gate columns n and up columns N + n of the same output columns, and writes
silu(gate) * up (fp32, then bf16): N = R / 2 output columns. Otherwise N = R.

Device-side indices (nothing read from device memory can move an access outside the given tensors):
  - a block is processed only if pid_b * BLOCK_M < num_padded[0] and block_expert[pid_b] is in [0, E); other
    blocks run no loop iteration and write nothing;
  - a row p of a processed block is used only if p < num_padded[0], f = sorted_ids[p] is in [0, P) and
    f // a_row_div < a_rows; other rows (the sentinel P, padding, garbage) are neither read nor written;
  - sorted_ids / block_expert are read only at indices below the grid's extent, which the host sizes from
    their lengths (the grid's block count never exceeds len(sorted_ids) / BLOCK_M <= len(block_expert));
  - duplicate f in valid blocks: one writer wins per row (unspecified which), still in bounds.
Rows that are never selected are not written. row_scale (fp32 [P]) is read only at valid f, only when
has_scale != 0 (otherwise its pointer is never dereferenced).

Tails: N is masked; K is masked against K (the host promises K % 16 == 0, 16-aligned pointers and row
strides, which keeps the masked loads vectorized). Offsets into a, w and out are computed in int64.
"""
import triton
import triton.language as tl


@triton.jit
def grouped_block_rows(sorted_ptr, bexp_ptr, npad_ptr, P, E, a_rows, a_row_div, BLOCK_M: tl.constexpr):
    """Program (., pid_b)'s block by the module doc's rule: (e, the block's expert as int64, 0 when the block is
    not processed; block_ok; f [BLOCK_M] the pair of each row; row_ok; row, the row of a each reads, 0 if not
    row_ok). The quantized-expert kernels (nvfp4.py, fp8.py) take the same rule from here."""
    pid_b = tl.program_id(1)
    num_padded = tl.load(npad_ptr)
    e = tl.load(bexp_ptr + pid_b)
    block_ok = (pid_b * BLOCK_M < num_padded) & (e >= 0) & (e < E)
    e = tl.where(block_ok, e, 0).to(tl.int64)
    p = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    f = tl.load(sorted_ptr + p)
    row = f // a_row_div
    row_ok = block_ok & (p < num_padded) & (f >= 0) & (f < P) & (row < a_rows)
    row = tl.where(row_ok, row, 0)
    return e, block_ok, f, row_ok, row


@triton.jit
def grouped_store(acc, acc_u, out_ptr, f, row_ok, n, n_ok, stride_om, ACT_SILU: tl.constexpr):
    """silu(acc) * acc_u with ACT_SILU (fp32), else acc, stored as bf16 to out rows f (the valid rows only)."""
    if ACT_SILU:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_u
    dst = out_ptr + tl.where(row_ok, f, 0).to(tl.int64)[:, None] * stride_om + n[None, :]
    tl.store(dst, acc.to(tl.bfloat16), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def grouped_gemm_kernel(a_ptr, w_ptr, out_ptr, sorted_ptr, bexp_ptr, npad_ptr, scale_ptr,
                        P, E, N, K, a_rows, a_row_div, stride_am, stride_we, stride_wn, stride_om, has_scale,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        ACT_SILU: tl.constexpr):
    """a [a_rows, K] bf16 (row stride stride_am), w [E, R, K] bf16 (strides stride_we, stride_wn, 1),
    out [P, N] bf16 (row stride stride_om); index arrays as in the module doc. Grid (cdiv(N, BLOCK_N),
    n_blocks) with n_blocks <= len(sorted_ids) / BLOCK_M."""
    pid_n = tl.program_id(0)
    e, block_ok, f, row_ok, row = grouped_block_rows(sorted_ptr, bexp_ptr, npad_ptr, P, E, a_rows, a_row_div, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    a_rows_ptr = a_ptr + row.to(tl.int64)[:, None] * stride_am
    w_e = w_ptr + e * stride_we
    wg_cols = w_e + n.to(tl.int64)[None, :] * stride_wn          # [1, BLOCK_N] gate (or only) weight rows
    k_end = tl.where(block_ok, K, 0)  # an invalid block runs no iteration
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if ACT_SILU:
        wu_cols = w_e + (n + N).to(tl.int64)[None, :] * stride_wn  # up rows N + n
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        at = tl.load(a_rows_ptr + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wmask = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(wg_cols + k[:, None], mask=wmask, other=0.0)
        acc = tl.dot(at, wg, acc)
        if ACT_SILU:
            wu = tl.load(wu_cols + k[:, None], mask=wmask, other=0.0)
            acc_u = tl.dot(at, wu, acc_u)
    if ACT_SILU:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_u
    if has_scale != 0:
        s = tl.load(scale_ptr + f, mask=row_ok, other=0.0)
        acc = acc * s[:, None]
    grouped_store(acc, acc, out_ptr, f, row_ok, n, n_ok, stride_om, False)
