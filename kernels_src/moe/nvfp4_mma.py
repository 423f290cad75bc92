"""NVFP4 experts in the MMA layout: the MoE block's decode kernels on tensor cores (Gluon, mma.sync), the weights
packed once at load into the layout of kernels_src/gemv/nvfp4_mma.py (its module doc: words, scales, the exact
PTX decoder). The CUDA-core W4A16 decode kernels (nvfp4.py) spend their issue slots decoding weights into k order
and multiplying on CUDA cores (BENCHMARKS.md, session 19: half the issue slots busy at 7-14% of the DRAM
bandwidth); here a lane's two 16-byte loads per 128-wide k block are its A fragments, a code pair becomes a bf16
pair in a few integer instructions and the tensor cores do the products.

Expert weights: the experts' rows stacked ([E' * R, K], expert after expert) and packed as one weight, so expert
e's row blocks are e * R16 .. e * R16 + R16 - 1 (R % 16 == 0, R16 = R / 16): words int32 [E', R16, KB, 32, 8]
(stride_qe words an expert), scales int32 [E', R16, KB, 32] (stride_se), KB = cdiv(K, 128); alpha fp32 [E', A]
as for the linear kind (nvfp4.py). gate_up weights: R = 2N, the gate rows' blocks first, then the up rows'.
The decoded weights are W * 2^-16 before alpha (ACC_SCALE), so alpha * 2^16 multiplies each dot product.

  moe_w4a16_mma_gate_up_kernel  grid (P, cdiv(N16, R)): pair f = t * k' + j (expert e = ids[f]) and R row
        blocks of the gate half (rows 16 (rt R + r) ..) with the same blocks of the up half (N16 blocks further);
        warp (wk, r) takes the k blocks wk, wk + WK, ... of both, x[t] as the B operand (8 columns of which one is
        real). h[f, n] = bf16(silu(g) * u), g = alpha[e, 0] * (x[t] . W[e, n]), u = alpha[e, 1] * (x[t] . W[e, N + n])
        (fp32), as the linear kernel computes it.
  moe_w4a16_mma_down_kernel     grid (M, cdiv(N16, R)): token t and R row blocks of hidden; the token's k' picks x
        KB k blocks are items i = j * KB + kb, warp (wk, r) takes the items wk, wk + WK, ... (so the 9 picks x 4 k
        blocks of the 35B-A3B spread over every warp), each one mma of expert e_j's block with h[t k' + j]'s k
        block, scaled by wts[t, j] * alpha[e_j] into the warp's fp32 accumulator; the WK partial tiles are summed
        at the end. out[t, n] = bf16(sum over picks and k blocks), fp32 throughout.
Both load the next step's words, scales and activations before decoding the current step; nothing is read
before the grid-dependency wait (the expert ids come from the router).

Device-side ids: a pair / pick whose id is outside [0, E) reads no weight, scale, alpha or activation (its loads
are masked, its k loop is empty / its items add 0) and gives a zero h row / no term; ids and weights are read
only at f < P (gate_up: the grid) and j < k' (down: the items). Rows past N (H) and k past K read as zero from
the layout's padding or are masked; offsets are int64.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from kernels_src.gemv.nvfp4_mma import _decode_asm, _layouts_ok, gluon_pdl_enter

BLOCK_M = gl.constexpr(8)  # the mma's N: one real activation row (the pair's token) and 7 zero columns


@gluon.constexpr_function
def _mma_layout(wk, r):
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[wk, r, 1], instr_shape=[1, 16, 8])


@gluon.constexpr_function
def _w_layout(wk, r):  # words [WK, R, 32, 8]: a lane's 8 words of its warp's block
    return gl.BlockedLayout([1, 1, 1, 8], [1, 1, 32, 1], [wk, r, 1, 1], [3, 2, 1, 0])


@gluon.constexpr_function
def _s_layout(wk, r):  # scales [WK, R, 32]: a lane's scale word
    return gl.BlockedLayout([1, 1, 1], [1, 1, 32], [wk, r, 1], [2, 1, 0])


@gluon.jit
def _block_offsets(rt, WK: gl.constexpr, R: gl.constexpr, KB, N16):
    """Per warp (wk, r): the int64 word offsets [WK, R, 32, 8] and scale offsets [WK, R, 32] of row block
    rt * R + r at k block 0 (add kb * 256 / kb * 32 for k block kb), whether the row block exists, and the warp's
    wk in the words' and the scales' layouts ([WK, 1, 1, 1], [WK, 1, 1])."""
    w_l: gl.constexpr = _w_layout(WK, R)
    s_l: gl.constexpr = _s_layout(WK, R)
    wl3: gl.constexpr = gl.SliceLayout(3, w_l)
    wk = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, wl3)))[:, None, None, None]
    wr = rt * R + gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, wl3)))[None, :, None, None]
    w_off = wr.to(gl.int64) * KB * 256 \
        + gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, wl3)))[None, None, :, None] * 8 \
        + gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, w_l))))[None, None, None, :]
    sk = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, s_l)))[:, None, None]
    sr = rt * R + gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, s_l)))[None, :, None]
    s_off = sr.to(gl.int64) * KB * 32 + gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, s_l)))[
        None, None, :]
    return w_off, wr < N16, s_off, sr < N16, wk, sk


@gluon.jit
def _decode(words, sc, WK: gl.constexpr, R: gl.constexpr):
    """The A operand [WK, 16 R, 128] bf16 (W * 2^-16) of each warp's block (kernels_src/gemv/nvfp4_mma.py)."""
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=_mma_layout(WK, R), k_width=16)
    return gl.inline_asm(_decode_asm, ("=h", "r", "r"), [words, sc],
                         gl.distributed_type(gl.bfloat16, [WK, 16 * R, 128], a_l), is_pure=True)


@gluon.jit
def _check_layouts(WK: gl.constexpr, R: gl.constexpr):
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=_mma_layout(WK, R), k_width=16)
    w_l: gl.constexpr = _w_layout(WK, R)
    s_l: gl.constexpr = _s_layout(WK, R)
    gl.static_assert(_layouts_ok(gl.to_linear_layout(a_l, [WK, 16 * R, 128]),
                                 gl.to_linear_layout(w_l, [WK, R, 32, 8]), gl.to_linear_layout(s_l, [WK, R, 32]),
                                 WK, R))


@gluon.jit
def moe_w4a16_mma_gate_up_kernel(x_ptr, wq_ptr, ws_ptr, alpha_ptr, ids_ptr, h_ptr, P, E, N, K, k_out, stride_x,
                                 stride_qe, stride_qn, stride_se, stride_sn, stride_h,
                                 WK: gl.constexpr, R: gl.constexpr, PDL: gl.constexpr):
    """x [M, K] bf16 (row stride stride_x), words / scales of the stacked gate_up experts (module doc; stride_qe /
    stride_se elements an expert; stride_qn / stride_sn, the row-block strides, are implied by K and unused),
    alpha fp32 [E, 2], ids int32 [P], h [P, N] bf16 (row stride stride_h). Grid (P, cdiv(N / 16, R)); num_warps
    == WK * R."""
    _check_layouts(WK, R)
    mma: gl.constexpr = _mma_layout(WK, R)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=16)
    f = gl.program_id(0)
    rt = gl.program_id(1)
    KB = gl.cdiv(K, 128)
    N16 = gl.cdiv(N, 16)
    w_off, w_ok, s_off, s_ok, wk_w, wk_s = _block_offsets(rt, WK, R, KB, N16)
    w_off = w_off + wk_w * 256  # warp wk's first k block
    s_off = s_off + wk_s * 32
    up_w = N16.to(gl.int64) * KB * 256  # the up half's blocks
    up_s = N16.to(gl.int64) * KB * 32
    xw = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, b_l)))[:, None, None]
    x_k = xw * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, gl.SliceLayout(2, b_l)))[None, :, None]
    xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(1, b_l)))[None, None, :]

    gluon_pdl_enter(PDL)  # the ids are the router's output
    e = gl.load(ids_ptr + f)
    ok = (e >= 0) & (e < E)
    kb_hi = gl.where(ok, KB, 0)  # an invalid id runs no iteration: no weight, scale or x is read
    e64 = gl.where(ok, e, 0).to(gl.int64)
    wb = wq_ptr + e64 * stride_qe
    sb = ws_ptr + e64 * stride_se
    x_row = x_ptr + (f // k_out).to(gl.int64) * stride_x + xm * 0
    x_ok = xm == 0

    wm = w_ok & (wk_w < kb_hi)
    sm = s_ok & (wk_s < kb_hi)
    wg = gl.load(wb + w_off, mask=wm, other=0)
    wu = gl.load(wb + up_w + w_off, mask=wm, other=0)
    cg = gl.load(sb + s_off, mask=sm, other=0)
    cu = gl.load(sb + up_s + s_off, mask=sm, other=0)
    xt = gl.load(x_row + x_k, mask=x_ok & (x_k < K) & (xw < kb_hi), other=0.0)
    acc_g = gl.zeros([WK, 16 * R, BLOCK_M], gl.float32, mma)
    acc_u = gl.zeros([WK, 16 * R, BLOCK_M], gl.float32, mma)
    for kb0 in range(0, kb_hi, WK):
        nb = kb0 + WK
        wm = w_ok & (nb + wk_w < kb_hi)
        sm = s_ok & (nb + wk_s < kb_hi)
        wg_n = gl.load(wb + nb * 256 + w_off, mask=wm, other=0)
        wu_n = gl.load(wb + up_w + nb * 256 + w_off, mask=wm, other=0)
        cg_n = gl.load(sb + nb * 32 + s_off, mask=sm, other=0)
        cu_n = gl.load(sb + up_s + nb * 32 + s_off, mask=sm, other=0)
        xk = nb * 128 + x_k
        xt_n = gl.load(x_row + xk, mask=x_ok & (xk < K) & (nb + xw < kb_hi), other=0.0)
        acc_g = mma_v2(_decode(wg, cg, WK, R), xt, acc_g)
        acc_u = mma_v2(_decode(wu, cu, WK, R), xt, acc_u)
        wg, wu, cg, cu, xt = wg_n, wu_n, cg_n, cu_n, xt_n

    a_g = gl.load(alpha_ptr + 2 * e64, mask=ok, other=0.0) * 65536.0  # ACC_SCALE
    a_u = gl.load(alpha_ptr + 2 * e64 + 1, mask=ok, other=0.0) * 65536.0
    g = gl.sum(acc_g, axis=0) * a_g
    u = gl.sum(acc_u, axis=0) * a_u
    hv = g / (1.0 + gl.exp(-g)) * u  # 0 for an invalid id
    y_l: gl.constexpr = gl.SliceLayout(0, mma)
    n = rt * 16 * R + gl.arange(0, 16 * R, layout=gl.SliceLayout(1, y_l))[:, None]
    m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, y_l))[None, :]
    gl.store(h_ptr + f.to(gl.int64) * stride_h + n + m * 0, hv.to(gl.bfloat16), mask=(n < N) & (m == 0))


@gluon.jit
def _pick_items(i, ids_ptr, wts_ptr, alpha_ptr, tk, k_out, KB, E, n_items, WITH_COEF: gl.constexpr):
    """Items i (any layout) of a token whose picks start at flat index tk: (expert id clamped to 0 as int64,
    valid, k block, flat pair index, and with WITH_COEF the pick's wts * alpha * 2^16, 0 when invalid)."""
    j = i // KB
    in_range = i < n_items
    e = gl.load(ids_ptr + tk + j, mask=in_range, other=-1)
    ok = in_range & (e >= 0) & (e < E)
    e64 = gl.where(ok, e, 0).to(gl.int64)
    coef = 0.0
    if WITH_COEF:
        coef = gl.load(wts_ptr + tk + j, mask=ok, other=0.0) * gl.load(alpha_ptr + e64, mask=ok, other=0.0) * 65536.0
    return e64, ok, i - j * KB, tk + j, coef


@gluon.jit
def moe_w4a16_mma_down_kernel(h_ptr, wq_ptr, ws_ptr, alpha_ptr, ids_ptr, wts_ptr, out_ptr, E, N, K, k_out,
                              stride_h, stride_qe, stride_qn, stride_se, stride_sn, stride_o,
                              WK: gl.constexpr, R: gl.constexpr, PDL: gl.constexpr):
    """h [P, K] bf16 (row stride stride_h), words / scales of the stacked down experts (module doc), alpha fp32 [E],
    ids int32 / weights fp32 [M, k_out] contiguous, out [M, N] bf16 (row stride stride_o). Grid (M, cdiv(N / 16,
    R)); num_warps == WK * R."""
    _check_layouts(WK, R)
    mma: gl.constexpr = _mma_layout(WK, R)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=16)
    t = gl.program_id(0)
    rt = gl.program_id(1)
    KB = gl.cdiv(K, 128)
    N16 = gl.cdiv(N, 16)
    n_items = k_out * KB
    tk = t.to(gl.int64) * k_out
    w_off, w_ok, s_off, s_ok, i_w, i_s = _block_offsets(rt, WK, R, KB, N16)  # warp wk: items wk, wk + WK, ...
    i_x = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, b_l)))[:, None, None]
    i_c = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, mma)))[:, None, None]
    x_k = gl.arange(0, 128, layout=gl.SliceLayout(0, gl.SliceLayout(2, b_l)))[None, :, None]
    xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(1, b_l)))[None, None, :]

    gluon_pdl_enter(PDL)  # the ids, weights and h rows are the previous kernels' outputs
    ew, okw, kbw, _, _ = _pick_items(i_w, ids_ptr, wts_ptr, alpha_ptr, tk, k_out, KB, E, n_items, False)
    es, oks, kbs, _, _ = _pick_items(i_s, ids_ptr, wts_ptr, alpha_ptr, tk, k_out, KB, E, n_items, False)
    _, okx, kbx, fx, _ = _pick_items(i_x, ids_ptr, wts_ptr, alpha_ptr, tk, k_out, KB, E, n_items, False)
    _, _, _, _, coef = _pick_items(i_c, ids_ptr, wts_ptr, alpha_ptr, tk, k_out, KB, E, n_items, True)
    words = gl.load(wq_ptr + ew * stride_qe + kbw * 256 + w_off, mask=w_ok & okw, other=0)
    sc = gl.load(ws_ptr + es * stride_se + kbs * 32 + s_off, mask=s_ok & oks, other=0)
    xk = kbx * 128 + x_k
    xt = gl.load(h_ptr + fx * stride_h + xk + xm * 0, mask=okx & (xk < K) & (xm == 0), other=0.0)
    acc = gl.zeros([WK, 16 * R, BLOCK_M], gl.float32, mma)
    zero = gl.zeros([WK, 16 * R, BLOCK_M], gl.float32, mma)
    for i0 in range(0, n_items, WK):
        nx = i0 + WK
        ew, okw, kbw, _, _ = _pick_items(nx + i_w, ids_ptr, wts_ptr, alpha_ptr, tk, k_out, KB, E, n_items, False)
        es, oks, kbs, _, _ = _pick_items(nx + i_s, ids_ptr, wts_ptr, alpha_ptr, tk, k_out, KB, E, n_items, False)
        _, okx, kbx, fx, _ = _pick_items(nx + i_x, ids_ptr, wts_ptr, alpha_ptr, tk, k_out, KB, E, n_items, False)
        _, _, _, _, coef_n = _pick_items(nx + i_c, ids_ptr, wts_ptr, alpha_ptr, tk, k_out, KB, E, n_items, True)
        words_n = gl.load(wq_ptr + ew * stride_qe + kbw * 256 + w_off, mask=w_ok & okw, other=0)
        sc_n = gl.load(ws_ptr + es * stride_se + kbs * 32 + s_off, mask=s_ok & oks, other=0)
        xk = kbx * 128 + x_k
        xt_n = gl.load(h_ptr + fx * stride_h + xk + xm * 0, mask=okx & (xk < K) & (xm == 0), other=0.0)
        acc = acc + coef * mma_v2(_decode(words, sc, WK, R), xt, zero)
        words, sc, xt, coef = words_n, sc_n, xt_n, coef_n

    y = gl.sum(acc, axis=0)
    y_l: gl.constexpr = gl.SliceLayout(0, mma)
    n = rt * 16 * R + gl.arange(0, 16 * R, layout=gl.SliceLayout(1, y_l))[:, None]
    m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, y_l))[None, :]
    gl.store(out_ptr + t.to(gl.int64) * stride_o + n + m * 0, y.to(gl.bfloat16), mask=(n < N) & (m == 0))
