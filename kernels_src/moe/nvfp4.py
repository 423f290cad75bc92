"""NVFP4 experts as W4A16: the MoE block's expert kernels with the weights kept 4-bit on the device and decoded in
the kernel (bf16 activations, fp32 sums). The same three jobs as decode.py and grouped.py, the same grids, index
rules and outputs; only the weight operand differs.

Expert weights as NVFP4 checkpoints store them, one expert after another (HF's linear layout, the rules of
kernels_src/gemv/gemv.py's module doc):
  wq     uint8 [E', R, K/2]  e2m1 codes, byte j of a row holds k = 2j (low nibble) and k = 2j + 1 (high nibble)
  ws     uint8 [E', R, K/16] e4m3 group scales, ws[e, r, g] scales k in [16g, 16g + 16)
  alpha  fp32 [E', A]        the global multiplier per expert and projection: A = 2 for w1 (column 0 scales the
                             gate rows [0, N), column 1 the up rows [N, 2N): a checkpoint stores gate_proj and
                             up_proj with a global scale each), A = 1 for w2
  W[e, r, k] = e2m1(code) * e4m3(ws[e, r, k // 16]) * alpha[e, half(r)]. A weight times its group scale is exact
  in fp32 (and in bf16: at most 6 significant bits); alpha multiplies the fp32 dot product of each row.

  moe_w4a16_decode_gate_up_kernel  grid (P, cdiv(N, BLOCK_N)) as moe_decode_gate_up_kernel (decode.py):
        h[f, n] = bf16(silu(g) * u), g = alpha[e, 0] * (x[t] . Wq[e, n]), u = alpha[e, 1] * (x[t] . Wq[e, N + n]).
        Each row is read as int64 words, one per scale group of 16 k (kernels_src/gemv/gemv.py: nvfp4_words_fma,
        the M = 1 GEMV's CUDA-core decode), [BLOCK_N, G] words per K step, the next step's words and scales loaded
        before the current step is decoded.
  moe_w4a16_decode_down_kernel     grid (M, cdiv(H, BLOCK_N)) as moe_decode_down_kernel: every slot's rows in one
        [SB, BLOCK_N, G] tile of words (or two: slots [SB, SB + SBX) apart, so that 9 picks decode as 8 + 1 instead
        of 16 lanes of which 7 are dead -- the kernel issues instructions for every lane of its tile), an fp32
        partial per (slot, row), then out[t, n] = bf16(sum_j w[t, j] * alpha[e_j] * partial[j, n]) in slot order.
  moe_w4a16_grouped_kernel         grid (cdiv(N, BLOCK_N), n_blocks) as grouped_gemm_kernel (grouped.py): each K
        step's [BLOCK_N, BLOCK_K] weight tile decoded to exact bf16 in registers (gemv.py: nvfp4_tile), then the
        tensor-core dot with the gathered rows; alpha scales the fp32 accumulators (gate and up apart) before the
        SiLU-and-mul epilogue.

Device-side indices: the rules of decode.py and grouped.py, unchanged (an id outside [0, E) reads no weight, no
scale, no alpha and no x; its h row is zero, its down term nothing; grouped blocks and rows are validated the same
way). Codes and scale bytes are decoded as values, never used as addresses. Tails: N / H masked by row, K against
K (the host promises K % 16 == 0: a row is whole int64 words, one per scale group, and 16-byte aligned pointers
and row strides, so the word loads are aligned). Offsets are int64.
"""
import triton
import triton.language as tl

from kernels_src.common import pdl_enter
from kernels_src.moe.grouped import grouped_block_rows, grouped_store
from kernels_src.gemv.gemv import e4m3_scale, nvfp4_tile, nvfp4_words_fma
from kernels_src.gemv.nvfp4_mma import nvfp4_mma_tile


@triton.jit
def moe_w4a16_decode_gate_up_kernel(x_ptr, wq_ptr, ws_ptr, alpha_ptr, ids_ptr, h_ptr, P, E, N, K, k_out, stride_x,
                                    stride_qe, stride_qn, stride_se, stride_sn, stride_h,
                                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRMT: tl.constexpr,
                                    PDL: tl.constexpr):
    """x [M, K] bf16 (row stride stride_x), wq [E, 2N, K/2] uint8 (strides stride_qe, stride_qn bytes), ws [E, 2N,
    K/16] uint8 (stride_se, stride_sn), alpha fp32 [E, 2], ids int32 [P], h [P, N] bf16 (row stride stride_h).
    Grid (P, cdiv(N, BLOCK_N))."""
    G: tl.constexpr = BLOCK_K // 16
    f = tl.program_id(0)
    pid_n = tl.program_id(1)
    pdl_enter(PDL)  # the ids are the router's output
    e = tl.load(ids_ptr + f)
    ok = (e >= 0) & (e < E)
    e = tl.where(ok, e, 0).to(tl.int64)
    t = (f // k_out).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    g = tl.arange(0, G)
    Kg = tl.where(ok, K // 16, 0)  # an invalid id reads no word, scale or x (no iteration runs)
    q_e = (wq_ptr + e * stride_qe).to(tl.pointer_type(tl.int64))
    qg_rows = q_e + (n.to(tl.int64) * (stride_qn // 8))[:, None]        # gate rows n, int64 words
    qu_rows = q_e + ((n + N).to(tl.int64) * (stride_qn // 8))[:, None]  # up rows N + n
    s_e = ws_ptr + e * stride_se
    sg_rows = s_e + (n.to(tl.int64) * stride_sn)[:, None]
    su_rows = s_e + ((n + N).to(tl.int64) * stride_sn)[:, None]
    x_row = x_ptr + t * stride_x
    # step k0's words and scales are loaded before step k0 - BLOCK_K is decoded (past Kg: masked, no access)
    m0 = n_ok[:, None] & (g < Kg)[None, :]
    wg = tl.load(qg_rows + g[None, :], mask=m0, other=0)
    wu = tl.load(qu_rows + g[None, :], mask=m0, other=0)
    cg = tl.load(sg_rows + g[None, :], mask=m0, other=0)
    cu = tl.load(su_rows + g[None, :], mask=m0, other=0)
    acc_g = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    for g0 in range(0, Kg, G):
        ga = g0 + g
        g_ok = ga < Kg
        gn = ga + G
        mn = n_ok[:, None] & (gn < Kg)[None, :]
        wg_next = tl.load(qg_rows + gn[None, :], mask=mn, other=0)
        wu_next = tl.load(qu_rows + gn[None, :], mask=mn, other=0)
        cg_next = tl.load(sg_rows + gn[None, :], mask=mn, other=0)
        cu_next = tl.load(su_rows + gn[None, :], mask=mn, other=0)
        xg = (x_row + 16 * ga)[None, :]
        acc_g = nvfp4_words_fma(acc_g, wg, e4m3_scale(cg.to(tl.int32)), xg, g_ok[None, :], PRMT)
        acc_u = nvfp4_words_fma(acc_u, wu, e4m3_scale(cu.to(tl.int32)), xg, g_ok[None, :], PRMT)
        wg, wu, cg, cu = wg_next, wu_next, cg_next, cu_next
    a_g = tl.load(alpha_ptr + 2 * e, mask=ok, other=0.0)
    a_u = tl.load(alpha_ptr + 2 * e + 1, mask=ok, other=0.0)
    gv = tl.sum(acc_g, axis=1) * a_g
    uv = tl.sum(acc_u, axis=1) * a_u
    hv = gv / (1.0 + tl.exp(-gv)) * uv  # 0 for an invalid id
    tl.store(h_ptr + f.to(tl.int64) * stride_h + n, hv.to(tl.bfloat16), mask=n_ok)


@triton.jit
def _down_slots(ids_ptr, wts_ptr, alpha_ptr, wq_ptr, ws_ptr, h_ptr, t, s, k_out, E, n, n_ok, stride_h, stride_qe,
                stride_qn, stride_se, stride_sn):
    """Slots s of token t's picks: (valid, routing weight x alpha, word / scale / h row pointers, weight mask)."""
    f = t.to(tl.int64) * k_out + s
    e = tl.load(ids_ptr + f, mask=s < k_out, other=-1)
    ok = (s < k_out) & (e >= 0) & (e < E)
    wt = tl.load(wts_ptr + f, mask=ok, other=0.0) * tl.load(alpha_ptr + tl.where(ok, e, 0), mask=ok, other=0.0)
    e = tl.where(ok, e, 0).to(tl.int64)
    rows = (e[:, None] * stride_qe + n.to(tl.int64)[None, :] * stride_qn)[:, :, None]       # [S, BN, 1] bytes
    q_rows = wq_ptr.to(tl.pointer_type(tl.int64)) + rows // 8
    s_rows = ws_ptr + (e[:, None] * stride_se + n.to(tl.int64)[None, :] * stride_sn)[:, :, None]
    h_rows = (h_ptr + tl.where(ok, f, 0) * stride_h)[:, None, None]                         # [S, 1, 1]
    return ok, wt, q_rows, s_rows, h_rows, ok[:, None, None] & n_ok[None, :, None]


@triton.jit
def _down_step(acc, w, c, q_rows, s_rows, h_rows, ok, wm, g, g0, Kg, G: tl.constexpr, PRMT: tl.constexpr):
    """One K step of a slot group: the next step's words and scales loaded, then this step's decoded into acc."""
    ga = g0 + g
    gn = ga + G
    mn = wm & (gn < Kg)[None, None, :]
    w_next = tl.load(q_rows + gn[None, None, :], mask=mn, other=0)
    c_next = tl.load(s_rows + gn[None, None, :], mask=mn, other=0)
    hg = h_rows + 16 * ga[None, None, :]
    acc = nvfp4_words_fma(acc, w, e4m3_scale(c.to(tl.int32)), hg, ok[:, None, None] & (ga < Kg)[None, None, :], PRMT)
    return acc, w_next, c_next


@triton.jit
def moe_w4a16_decode_down_kernel(h_ptr, wq_ptr, ws_ptr, alpha_ptr, ids_ptr, wts_ptr, out_ptr, E, N, K, k_out,
                                 stride_h, stride_qe, stride_qn, stride_se, stride_sn, stride_o,
                                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SB: tl.constexpr, SBX: tl.constexpr,
                                 PRMT: tl.constexpr, PDL: tl.constexpr):
    """h [P, K] bf16 (row stride stride_h), wq [E, N, K/2] uint8, ws [E, N, K/16] uint8 (byte strides), alpha fp32
    [E], ids int32 / weights fp32 [M, k_out] contiguous (k_out <= SB + SBX), out [M, N] bf16 (row stride
    stride_o). Slots [0, SB) are one tile, slots [SB, SB + SBX) a second one (SBX 0: none), loaded in the same K
    steps: 9 picks (8 routed + the shared expert) as 8 + 1 decode no dead slot lanes. Grid (M, cdiv(N, BLOCK_N))."""
    G: tl.constexpr = BLOCK_K // 16
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    g = tl.arange(0, G)
    Kg = K // 16
    pdl_enter(PDL)
    ok, wt, q_rows, s_rows, h_rows, wm = _down_slots(ids_ptr, wts_ptr, alpha_ptr, wq_ptr, ws_ptr, h_ptr, t,
                                                     tl.arange(0, SB), k_out, E, n, n_ok, stride_h, stride_qe,
                                                     stride_qn, stride_se, stride_sn)
    m0 = wm & (g < Kg)[None, None, :]
    w = tl.load(q_rows + g[None, None, :], mask=m0, other=0)
    c = tl.load(s_rows + g[None, None, :], mask=m0, other=0)
    acc = tl.zeros((SB, BLOCK_N, G), dtype=tl.float32)
    if SBX > 0:
        ok2, wt2, q_rows2, s_rows2, h_rows2, wm2 = _down_slots(ids_ptr, wts_ptr, alpha_ptr, wq_ptr, ws_ptr, h_ptr, t,
                                                               SB + tl.arange(0, SBX), k_out, E, n, n_ok, stride_h,
                                                               stride_qe, stride_qn, stride_se, stride_sn)
        m02 = wm2 & (g < Kg)[None, None, :]
        w2 = tl.load(q_rows2 + g[None, None, :], mask=m02, other=0)
        c2 = tl.load(s_rows2 + g[None, None, :], mask=m02, other=0)
        acc2 = tl.zeros((SBX, BLOCK_N, G), dtype=tl.float32)
    for g0 in range(0, Kg, G):
        acc, w, c = _down_step(acc, w, c, q_rows, s_rows, h_rows, ok, wm, g, g0, Kg, G, PRMT)
        if SBX > 0:
            acc2, w2, c2 = _down_step(acc2, w2, c2, q_rows2, s_rows2, h_rows2, ok2, wm2, g, g0, Kg, G, PRMT)
    part = tl.sum(acc, axis=2)                                                              # [SB, BN]
    y = tl.sum(tl.where(ok[:, None], wt[:, None] * part, 0.0), axis=0)
    if SBX > 0:
        y += tl.sum(tl.where(ok2[:, None], wt2[:, None] * tl.sum(acc2, axis=2), 0.0), axis=0)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + n, y.to(tl.bfloat16), mask=n_ok)


@triton.jit
def moe_w4a16_grouped_kernel(a_ptr, wq_ptr, ws_ptr, alpha_ptr, out_ptr, sorted_ptr, bexp_ptr, npad_ptr, P, E, N, K,
                             a_rows, a_row_div, stride_am, stride_qe, stride_qn, stride_se, stride_sn, stride_om,
                             n_alpha, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             ACT_SILU: tl.constexpr, PRMT: tl.constexpr, MMA: tl.constexpr):
    """a [a_rows, K] bf16 (row stride stride_am), wq [E, R, K/2] / ws [E, R, K/16] uint8 (byte strides), alpha fp32
    [E, n_alpha] (n_alpha 2 with ACT_SILU, else 1), out [P, N] bf16 (row stride stride_om); the index arrays as in
    grouped.py. MMA: wq / ws are int32 words / scale words of experts in the MMA layout (nvfp4_mma.py; stride_qe /
    stride_se elements an expert, stride_qn / stride_sn unused), decoded to W * 2^-16 (nvfp4_mma_tile). Grid (cdiv(N, BLOCK_N), n_blocks) with n_blocks
    <= len(sorted_ids) / BLOCK_M."""
    pid_n = tl.program_id(0)
    e, block_ok, f, row_ok, row = grouped_block_rows(sorted_ptr, bexp_ptr, npad_ptr, P, E, a_rows, a_row_div, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    a_rows_ptr = a_ptr + row.to(tl.int64)[:, None] * stride_am
    # byte rows (nvfp4_tile's .int decoder) and the same rows as int32 words (its PRMT decoder): gate (or only)
    # rows n, up rows N + n
    rg = e * stride_qe + n.to(tl.int64) * stride_qn
    ru = e * stride_qe + (n + N).to(tl.int64) * stride_qn
    q32 = wq_ptr.to(tl.pointer_type(tl.int32))
    sg = ws_ptr + (e * stride_se + n.to(tl.int64) * stride_sn)[:, None]
    su = ws_ptr + (e * stride_se + (n + N).to(tl.int64) * stride_sn)[:, None]
    k_end = tl.where(block_ok, K, 0)  # an invalid block runs no iteration
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        at = tl.load(a_rows_ptr + k[None, :], mask=row_ok[:, None] & (k < K)[None, :], other=0.0)
        if MMA:
            wg = nvfp4_mma_tile(wq_ptr + e * stride_qe, ws_ptr + e * stride_se, n, n_ok, k0, K, BLOCK_N, BLOCK_K,
                                PRMT)
        else:
            wg = nvfp4_tile((wq_ptr + rg)[:, None, None], (q32 + rg // 4)[:, None, None], sg, k0, K, n_ok, BLOCK_N,
                            BLOCK_K, PRMT)
        acc = tl.dot(at, tl.trans(wg), acc)
        if ACT_SILU:
            if MMA:
                wu = nvfp4_mma_tile(wq_ptr + e * stride_qe, ws_ptr + e * stride_se, n + N, n_ok, k0, K, BLOCK_N,
                                    BLOCK_K, PRMT)
            else:
                wu = nvfp4_tile((wq_ptr + ru)[:, None, None], (q32 + ru // 4)[:, None, None], su, k0, K, n_ok,
                                BLOCK_N, BLOCK_K, PRMT)
            acc_u = tl.dot(at, tl.trans(wu), acc_u)
    sc = 65536.0 if MMA else 1.0  # the MMA layout's tiles are W * 2^-16 (nvfp4_mma_tile)
    acc = acc * (tl.load(alpha_ptr + e * n_alpha, mask=block_ok, other=0.0) * sc)
    if ACT_SILU:
        acc_u = acc_u * (tl.load(alpha_ptr + e * n_alpha + 1, mask=block_ok, other=0.0) * sc)
    grouped_store(acc, acc_u, out_ptr, f, row_ok, n, n_ok, stride_om, ACT_SILU)
