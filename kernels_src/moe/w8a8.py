"""Block-wise FP8 experts as W8A8: the MoE block's grouped GEMMs (the prefill path) on the FP8 tensor cores, for
Qwen's *-FP8 checkpoints (each expert's projections e4m3 with a ``weight_scale_inv`` per 128 x 128 block) and
activations quantized per row per 128 columns (ops.gemm_fp8's quantize_fp8_per_token_group layout; what the
checkpoints' own FP8 linears do):

  a   fp8 [a_rows, K]                              e4m3 activations (row stride stride_am)
  sa  fp32 [a_rows, cdiv(K, 128)]                  their multipliers (row stride stride_sam)
  wq  fp8 [E', R, K], ws fp32 [E', cdiv(R, 128), cdiv(K, 128)]   as kernels_src/moe/fp8.py (strides stride_qe,
                                                   stride_qn bytes; stride_se, stride_sn elements)
  out[f] = act(sum_kb (a[f // a_row_div, kb] . w[e, :, kb]) * sa[f // a_row_div, kb] * ws[e, n // 128, kb])

Each k-step's product (BLOCK_K = 128: one 128-wide slice; 64 on the mma.sync archs, where a slice's operands
would spill: half a slice) is a fresh fp32 MMA result promoted into the accumulator with its slice's two
multipliers (the block-FP8 GEMM's rule, kernels_src/gemm_fp8/gemm_fp8.py), so BLOCK_K and BLOCK_N divide 128 (one
weight multiplier per step and half). ACT_SILU: w[e] stacks gate rows [0, N) and up rows [N, 2N) (N a
multiple of 128, the host checks), two accumulators, silu(gate) * up in fp32; then either bf16 rows (QUANT_OUT
False) or, QUANT_OUT (BLOCK_N == 128: one group per program and row), the down GEMM's input directly: e4m3 rows
and their multipliers os[f, pid_n] = max(amax / 448, MIN_SCALE), q = satfinite(rn(h / os)) (the quantizers'
formula). Without ACT_SILU: bf16 rows of N columns.

Grid, blocks and device-side indices: grouped.py's (grouped_block_rows): a block runs only if it is below
num_padded[0] with an expert in [0, E); a row is read and written only if its f is in [0, P) and f // a_row_div <
a_rows; everything else reads nothing (the loop runs no iteration) and writes nothing. Tails: N masked; K masked
against K (K % 16 == 0, 16-byte aligned pointers and byte strides); a partial last k-slice reads its multipliers
at kb = k0 // 128 < cdiv(K, 128). Offsets are int64.
"""
import triton
import triton.language as tl

from kernels_src.gemm_fp8.gemm_fp8 import FP8_MAX, MIN_SCALE, to_fp8
from kernels_src.moe.grouped import grouped_block_rows, grouped_store


@triton.jit
def _promote(acc, a, w, s_a, s_w):
    """acc + (a . w) * s_a[row] * s_w: one k-slice's product, scaled into the fp32 accumulator."""
    return acc + tl.dot(a, w) * (s_a[:, None] * s_w)


@triton.jit
def moe_w8a8_grouped_kernel(a_ptr, sa_ptr, wq_ptr, ws_ptr, out_ptr, os_ptr, sorted_ptr, bexp_ptr, npad_ptr, P, E,
                            N, K, a_rows, a_row_div, stride_am, stride_sam, stride_qe, stride_qn, stride_se,
                            stride_sn, stride_om, stride_osm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, ACT_SILU: tl.constexpr, QUANT_OUT: tl.constexpr):
    """Module doc. Grid (cdiv(N, BLOCK_N), n_blocks) with n_blocks <= len(sorted_ids) / BLOCK_M; os_ptr / stride_osm
    are read only with QUANT_OUT."""
    tl.static_assert(128 % BLOCK_K == 0 and 128 % BLOCK_N == 0, "one multiplier per k-step and half")
    tl.static_assert(not QUANT_OUT or (ACT_SILU and BLOCK_N == 128), "QUANT_OUT: one 128-group per program row")
    pid_n = tl.program_id(0)
    e, block_ok, f, row_ok, row = grouped_block_rows(sorted_ptr, bexp_ptr, npad_ptr, P, E, a_rows, a_row_div, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rk = tl.arange(0, BLOCK_K)
    row64 = row.to(tl.int64)
    a_rows_ptr = a_ptr + row64[:, None] * stride_am + rk[None, :]
    sa_rows = sa_ptr + row64 * stride_sam
    q_e = wq_ptr + e * stride_qe
    qg = q_e + n.to(tl.int64)[None, :] * stride_qn + rk[:, None]          # [BLOCK_K, BLOCK_N], k contiguous
    qu = q_e + (n + N).to(tl.int64)[None, :] * stride_qn + rk[:, None]
    s_e = ws_ptr + e * stride_se
    sg = s_e + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    su = s_e + ((N + pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    k_end = tl.where(block_ok, K, 0)  # an invalid block runs no iteration and reads nothing
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        k_ok = (k0 + rk) < K
        kb = k0 // 128
        at = tl.load(a_rows_ptr + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        s_a = tl.load(sa_rows + kb, mask=row_ok, other=0.0)
        wmask = k_ok[:, None] & n_ok[None, :]
        acc = _promote(acc, at, tl.load(qg + k0, mask=wmask, other=0.0), s_a, tl.load(sg + kb))
        if ACT_SILU:
            acc_u = _promote(acc_u, at, tl.load(qu + k0, mask=wmask, other=0.0), s_a, tl.load(su + kb))
    if QUANT_OUT:
        h = acc / (1.0 + tl.exp(-acc)) * acc_u
        scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(h), axis=1), FP8_MAX), MIN_SCALE)
        f64 = tl.where(row_ok, f, 0).to(tl.int64)
        tl.store(out_ptr + f64[:, None] * stride_om + n[None, :], to_fp8(h, scale[:, None]),
                 mask=row_ok[:, None] & n_ok[None, :])
        tl.store(os_ptr + f64 * stride_osm + pid_n, scale, mask=row_ok)
    else:
        grouped_store(acc, acc_u, out_ptr, f, row_ok, n, n_ok, stride_om, ACT_SILU)
