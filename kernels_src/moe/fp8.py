"""Block-wise FP8 experts as W8A16: the MoE block's expert kernels with the weights kept e4m3 on the device, as
Qwen's *-FP8 checkpoints store them (each expert's projections with a ``weight_scale_inv`` per 128 x 128 block),
decoded in the kernel (bf16 activations, fp32 sums). The same three jobs as decode.py and grouped.py, the same
grids, index rules and outputs; only the weight operand differs.

  wq  uint8 [E', R, K]                       e4m3 bytes, expert after expert
  ws  fp32 [E', cdiv(R, 128), cdiv(K, 128)]  the multiplier of each 128 x 128 block (strides stride_se, stride_sn
                                             elements); w1 stacks gate rows [0, N) and up rows [N, 2N) with N a
                                             multiple of 128 (the host checks), so each half has whole blocks
  W[e, r, k] = e4m3(wq[e, r, k]) * ws[e, r // 128, k // 128]
Decoding: NATIVE (sm_89+) the hardware's e4m3 conversion; else the integer decoding of kernels_src/gemv/gemv.py
(e4m3_f16_scaled: the value times 2^-8, exact; the 2^8 goes into the scale). NaN codes (0x7F / 0xFF) are not
finite weights: they give NaN (NATIVE) or +-480 outputs, never an access outside the tensors.

  moe_w8a16_decode_gate_up_kernel  grid (P, cdiv(N, BLOCK_N)) as moe_decode_gate_up_kernel (decode.py): each K
        step walks its BLOCK_K / 128 scale blocks: the [BLOCK_N, 128] byte sub-tiles of the gate and up rows
        decoded to fp32 times x[k] * scale (BLOCK_N divides 128: one scalar scale per half and block) into fp32
        [BLOCK_N, 128] accumulators, summed over k once at the end.
  moe_w8a16_decode_down_kernel     grid (M, cdiv(H, BLOCK_N)) as moe_decode_down_kernel: every slot's rows in one
        [SB, BLOCK_N, BLOCK_K] byte tile (or two, SB + SBX: 9 picks as 8 + 1; BLOCK_K divides 128: one scale
        block a step), each step's products with h[k] summed over k and times the slot's scale into an fp32
        partial per (slot, row), then the routing-weighted sum over the slots in slot order.
  x and h are loaded in the weight tile's own layout (k broadcast over the rows by adding a zero): a 1-D
        x * scale vector broadcast into the tile cost up to 18 barriers and a shared-memory round trip a step
        (sm_90a SASS, session 34), the decode kernels' main cost at M = 1.
  moe_w8a16_grouped_kernel         grid (cdiv(N, BLOCK_N), n_blocks) as grouped_gemm_kernel (grouped.py): each K
        step's [BLOCK_K, BLOCK_N] byte tile decoded and multiplied by the step's one scale (BLOCK_K and BLOCK_N
        divide 128), rounded once to bf16 -- the weights dequantizing to bf16 at load would give -- and accumulated
        by the tensor cores into fp32 (gate and up apart). (Scaling each step's dot product instead, exact weights,
        measured 1.5-2x the bf16 kernel's time at M = 2048-8192: the fp32 scale-and-add of the accumulator per step
        cost more than the MMA; benchmarks/explore_moe_quant_grouped.py, BENCHMARKS.md session 17.)

Device-side indices: the rules of decode.py and grouped.py, unchanged (an id outside [0, E) reads no weight, no
scale and no x; its h row is zero, its down term nothing; grouped blocks and rows are validated the same way).
Tails: rows masked against N / H, k against K (K % 16 == 0, 16-byte aligned pointers and byte strides). Offsets are
int64.
"""
import triton
import triton.language as tl

from kernels_src.common import pdl_enter
from kernels_src.moe.grouped import grouped_block_rows, grouped_store
from kernels_src.gemv.gemv import e4m3_f16_scaled


@triton.jit
def _e4m3_f32(b, NATIVE: tl.constexpr):
    """e4m3 bytes -> fp32: the value (NATIVE) or the value times 2^-8 (integer decoding)."""
    if NATIVE:
        return b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return e4m3_f16_scaled(b).to(tl.float32)


@triton.jit
def _scaled_bf16(b, scale, NATIVE: tl.constexpr):
    """e4m3 bytes times their block's fp32 scale, rounded once to bf16 (what dequantizing the weights to bf16 at
    load gives), the tensor cores' operand."""
    if NATIVE:
        return (b.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale).to(tl.bfloat16)
    else:
        return (e4m3_f16_scaled(b).to(tl.float32) * (scale * 256.0)).to(tl.bfloat16)


@triton.jit
def moe_w8a16_decode_gate_up_kernel(x_ptr, wq_ptr, ws_ptr, ids_ptr, h_ptr, P, E, N, K, k_out, stride_x, stride_qe,
                                    stride_qn, stride_se, stride_sn, stride_h, BLOCK_N: tl.constexpr,
                                    BLOCK_K: tl.constexpr, NATIVE: tl.constexpr, PDL: tl.constexpr):
    """x [M, K] bf16, wq [E, 2N, K] uint8, ws [E, 2N / 128, cdiv(K, 128)] fp32, ids int32 [P], h [P, N] bf16.
    Grid (P, cdiv(N, BLOCK_N)); BLOCK_N divides 128, N % 128 == 0."""
    tl.static_assert(128 % BLOCK_N == 0, "one scale row per half and program: BLOCK_N must divide 128")
    tl.static_assert(BLOCK_K % 128 == 0, "whole scale blocks a step: BLOCK_K must be a multiple of 128")
    f = tl.program_id(0)
    pid_n = tl.program_id(1)
    pdl_enter(PDL)
    e = tl.load(ids_ptr + f)
    ok = (e >= 0) & (e < E)
    e = tl.where(ok, e, 0).to(tl.int64)
    t = (f // k_out).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rk = tl.arange(0, 128)
    q_e = wq_ptr + e * stride_qe
    qg = q_e + n.to(tl.int64)[:, None] * stride_qn + rk[None, :]
    qu = q_e + (n + N).to(tl.int64)[:, None] * stride_qn + rk[None, :]
    s_e = ws_ptr + e * stride_se
    sg = s_e + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    su = s_e + ((N + pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    x_row = x_ptr + t * stride_x + n[:, None] * 0
    k_end = tl.where(ok, K, 0)  # an invalid id runs no iteration and reads no weight, scale or x
    acc_g = tl.zeros((BLOCK_N, 128), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, 128), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        for g in tl.static_range(BLOCK_K // 128):
            kb = k0 + g * 128
            k = kb + rk
            k_ok = k < K
            wm = n_ok[:, None] & k_ok[None, :]
            wg = tl.load(qg + kb, mask=wm, other=0)
            wu = tl.load(qu + kb, mask=wm, other=0)
            xk = tl.load(x_row + k[None, :], mask=k_ok[None, :], other=0.0).to(tl.float32)
            s_g = tl.load(sg + kb // 128, mask=kb < K, other=0.0)
            s_u = tl.load(su + kb // 128, mask=kb < K, other=0.0)
            acc_g += _e4m3_f32(wg, NATIVE) * (xk * s_g)
            acc_u += _e4m3_f32(wu, NATIVE) * (xk * s_u)
    acc_g = tl.sum(acc_g, axis=1)
    acc_u = tl.sum(acc_u, axis=1)
    if not NATIVE:
        acc_g = acc_g * 256.0
        acc_u = acc_u * 256.0
    hv = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u  # 0 for an invalid id
    tl.store(h_ptr + f.to(tl.int64) * stride_h + n, hv.to(tl.bfloat16), mask=n_ok)


@triton.jit
def _down_slots(ids_ptr, wts_ptr, wq_ptr, ws_ptr, h_ptr, t, s, k_out, E, n, n_ok, rk, pid_n, stride_h, stride_qe,
                stride_qn, stride_se, stride_sn, BLOCK_N: tl.constexpr):
    """Slots s of token t's picks: (valid, routing weight, byte rows [S, BN, BK], scale rows [S], h rows
    [S, BK], weight mask [S, BN, 1])."""
    f = t.to(tl.int64) * k_out + s
    e = tl.load(ids_ptr + f, mask=s < k_out, other=-1)
    ok = (s < k_out) & (e >= 0) & (e < E)
    wt = tl.load(wts_ptr + f, mask=ok, other=0.0)
    e = tl.where(ok, e, 0).to(tl.int64)
    w_rows = wq_ptr + e[:, None, None] * stride_qe + n.to(tl.int64)[None, :, None] * stride_qn + rk[None, None, :]
    s_rows = ws_ptr + e * stride_se + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    h_rows = h_ptr + tl.where(ok, f, 0)[:, None] * stride_h + rk[None, :]
    return ok, wt, w_rows, s_rows, h_rows, ok[:, None, None] & n_ok[None, :, None]


@triton.jit
def _down_step(part, w, w_rows, s_rows, h_rows, ok, wm, rk, k0, K, zn, BLOCK_K: tl.constexpr, NATIVE: tl.constexpr):
    """One K step of a slot group: the next step's bytes loaded (past K: fully masked, no access), then this
    step's decoded, multiplied with h[k] (loaded as [S, BN, BK]: the product's layout), summed over k and times
    the slot's scale of block k0 // 128 (loaded as [S, BN]: the sum's layout) into part [S, BN]."""
    k = k0 + rk
    hm = ok[:, None] & (k < K)[None, :]
    w_next = tl.load(w_rows + (k0 + BLOCK_K), mask=wm & ((k0 + BLOCK_K + rk) < K)[None, None, :], other=0)
    hk = tl.load(h_rows[:, None, :] + (k0 + zn)[None, :, None], mask=hm[:, None, :], other=0.0).to(tl.float32)
    sc = tl.load(s_rows[:, None] + (k0 // 128 + zn)[None, :], mask=ok[:, None] & (k0 < K), other=0.0)
    part += tl.sum(_e4m3_f32(w, NATIVE) * hk, axis=2) * sc
    return part, w_next


@triton.jit
def moe_w8a16_decode_down_kernel(h_ptr, wq_ptr, ws_ptr, ids_ptr, wts_ptr, out_ptr, E, N, K, k_out, stride_h,
                                 stride_qe, stride_qn, stride_se, stride_sn, stride_o, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr, SB: tl.constexpr, SBX: tl.constexpr, NATIVE: tl.constexpr,
                                 PDL: tl.constexpr):
    """h [P, K] bf16, wq [E, N, K] uint8, ws [E, cdiv(N, 128), cdiv(K, 128)] fp32, ids / weights [M, k_out]
    (k_out <= SB + SBX), out [M, N] bf16. Slots [0, SB) are one tile, slots [SB, SB + SBX) a second one (SBX 0:
    none), loaded in the same K steps. Grid (M, cdiv(N, BLOCK_N)); BLOCK_N divides 128."""
    tl.static_assert(128 % BLOCK_N == 0, "one scale row per program: BLOCK_N must divide 128")
    tl.static_assert(128 % BLOCK_K == 0, "one scale block a step: BLOCK_K must divide 128")
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rk = tl.arange(0, BLOCK_K)
    zn = n * 0  # broadcasts h and the scales over the rows (the tile's layout)
    pdl_enter(PDL)
    ok, wt, w_rows, s_rows, h_rows, wm = _down_slots(ids_ptr, wts_ptr, wq_ptr, ws_ptr, h_ptr, t, tl.arange(0, SB),
                                                     k_out, E, n, n_ok, rk, pid_n, stride_h, stride_qe, stride_qn,
                                                     stride_se, stride_sn, BLOCK_N)
    w = tl.load(w_rows, mask=wm & (rk < K)[None, None, :], other=0)
    part = tl.zeros((SB, BLOCK_N), dtype=tl.float32)
    if SBX > 0:
        ok2, wt2, w_rows2, s_rows2, h_rows2, wm2 = _down_slots(ids_ptr, wts_ptr, wq_ptr, ws_ptr, h_ptr, t,
                                                               SB + tl.arange(0, SBX), k_out, E, n, n_ok, rk, pid_n,
                                                               stride_h, stride_qe, stride_qn, stride_se, stride_sn,
                                                               BLOCK_N)
        w2 = tl.load(w_rows2, mask=wm2 & (rk < K)[None, None, :], other=0)
        part2 = tl.zeros((SBX, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        part, w = _down_step(part, w, w_rows, s_rows, h_rows, ok, wm, rk, k0, K, zn, BLOCK_K, NATIVE)
        if SBX > 0:
            part2, w2 = _down_step(part2, w2, w_rows2, s_rows2, h_rows2, ok2, wm2, rk, k0, K, zn, BLOCK_K, NATIVE)
    acc = tl.sum(tl.where(ok[:, None], wt[:, None] * part, 0.0), axis=0)
    if SBX > 0:
        acc += tl.sum(tl.where(ok2[:, None], wt2[:, None] * part2, 0.0), axis=0)
    if not NATIVE:
        acc = acc * 256.0
    tl.store(out_ptr + t.to(tl.int64) * stride_o + n, acc.to(tl.bfloat16), mask=n_ok)


@triton.jit
def moe_w8a16_grouped_kernel(a_ptr, wq_ptr, ws_ptr, out_ptr, sorted_ptr, bexp_ptr, npad_ptr, P, E, N, K, a_rows,
                             a_row_div, stride_am, stride_qe, stride_qn, stride_se, stride_sn, stride_om,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             ACT_SILU: tl.constexpr, NATIVE: tl.constexpr):
    """a [a_rows, K] bf16, wq [E, R, K] uint8, ws [E, cdiv(R, 128), cdiv(K, 128)] fp32, out [P, N] bf16; index
    arrays as in grouped.py. Grid (cdiv(N, BLOCK_N), n_blocks); BLOCK_N and BLOCK_K divide 128 (one scale per K
    step and half), N % 128 == 0 with ACT_SILU."""
    tl.static_assert(128 % BLOCK_N == 0 and 128 % BLOCK_K == 0, "one scale per K step: tiles must divide 128")
    pid_n = tl.program_id(0)
    e, block_ok, f, row_ok, row = grouped_block_rows(sorted_ptr, bexp_ptr, npad_ptr, P, E, a_rows, a_row_div, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    a_rows_ptr = a_ptr + row.to(tl.int64)[:, None] * stride_am
    q_e = wq_ptr + e * stride_qe
    qg = q_e + n.to(tl.int64)[None, :] * stride_qn                          # [1, BLOCK_N] byte rows
    qu = q_e + (n + N).to(tl.int64)[None, :] * stride_qn
    s_e = ws_ptr + e * stride_se
    sg = s_e + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    su = s_e + ((N + pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    k_end = tl.where(block_ok, K, 0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        at = tl.load(a_rows_ptr + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wmask = k_ok[:, None] & n_ok[None, :]
        wg = _scaled_bf16(tl.load(qg + k[:, None], mask=wmask, other=0), tl.load(sg + k0 // 128), NATIVE)
        acc = tl.dot(at, wg, acc)
        if ACT_SILU:
            wu = _scaled_bf16(tl.load(qu + k[:, None], mask=wmask, other=0), tl.load(su + k0 // 128), NATIVE)
            acc_u = tl.dot(at, wu, acc_u)
    grouped_store(acc, acc_u, out_ptr, f, row_ok, n, n_ok, stride_om, ACT_SILU)
