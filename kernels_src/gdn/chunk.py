"""Gated DeltaNet chunked prefill (DESIGN.md section 6), chunk BT = 64, K = V = 128.

Pipeline (one launch each; every scratch element a kernel reads was written earlier in the same call, so no
buffer needs zero-filling):

1. ``gdn_chunk_index_kernel``  grid (1,): sanitised per-sequence table ``seqinfo [N, 4]`` = (bos, eos,
   first global chunk, number of chunks) and per global chunk ``cidx [max_chunks, 2]`` = (first token, eos of
   its sequence); unused tail entries get (-1, -1). Built on the device: no host sync.
2. ``gdn_prep_kernel``         grid (max_chunks, Hk): L2-normalised q, k (bf16 [T, Hk, K]); for the Hv/Hk value
   heads of the key head: chunk-local cumsum of g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b)
   (fp32 [T, Hv]).
3. ``gdn_kkt_wy_kernel``       grid (max_chunks, Hv): A = strict-tril(beta_i exp(g_i - g_j) k_i.k_j) in 16x16 blocks,
   (I + A)^-1 by forward substitution of the four diagonal blocks and a block merge, then
   W = Tm (beta exp(g) K) and U = Tm (beta V) (bf16 [T, Hv, K|V]).
4. ``gdn_delta_h_kernel``      grid (N, Hv, V / BV): sequential over the chunks of one sequence: stores the state
   entering each chunk (bf16 h [max_chunks, Hv, K, V]), V' = U - W S (overwrites U in place),
   S <- exp(g_last) S + K^T (exp(g_last - g) V'); reads / writes the slot-indexed fp32 state cache.
5. ``gdn_chunk_o_kernel``      grid (max_chunks, Hv, V / BV):
   O = scale (exp(g) (Q h) + (tril(Q K^T) exp(g_i - g_j)) V').

Token and chunk indices are cast to int64 before they meet a stride.
"""
import triton
import triton.language as tl


# ----------------------------------------------------------------------------------------------- 1. index
@triton.jit
def gdn_chunk_index_kernel(cu_ptr, seqinfo_ptr, cidx_ptr, N, T, max_chunks, BT: tl.constexpr, BLOCK: tl.constexpr):
    """cu_seqlens int32 [N+1] -> seqinfo int32 [N, 4], cidx int32 [max_chunks, 2]. Bounds are clamped to
    [0, T] and the chunk count to max_chunks, so bad cu_seqlens can never make a later kernel leave its
    buffers."""
    off = tl.program_id(0) * 0
    j = tl.arange(0, BLOCK)
    for n in range(0, N):
        bos = tl.minimum(tl.maximum(tl.load(cu_ptr + n), 0), T)
        eos = tl.minimum(tl.maximum(tl.load(cu_ptr + n + 1), bos), T)
        nc = tl.minimum((eos - bos + BT - 1) // BT, max_chunks - off)
        tl.store(seqinfo_ptr + n * 4 + 0, bos)
        tl.store(seqinfo_ptr + n * 4 + 1, eos)
        tl.store(seqinfo_ptr + n * 4 + 2, off)
        tl.store(seqinfo_ptr + n * 4 + 3, nc)
        for j0 in range(0, nc, BLOCK):
            jj = j0 + j
            m = jj < nc
            tl.store(cidx_ptr + (off + jj) * 2, bos + jj * BT, mask=m)
            tl.store(cidx_ptr + (off + jj) * 2 + 1, eos + jj * 0, mask=m)
        off += nc
    for j0 in range(off, max_chunks, BLOCK):
        jj = j0 + j
        m = jj < max_chunks
        tl.store(cidx_ptr + jj * 2, jj * 0 - 1, mask=m)
        tl.store(cidx_ptr + jj * 2 + 1, jj * 0 - 1, mask=m)


# ------------------------------------------------------------------------------------------------ 2. prep
@triton.jit
def _l2norm_store(src_ptr, dst_ptr, rows64, m, stride_src, stride_dst, K: tl.constexpr):
    cols = tl.arange(0, K)
    x = tl.load(src_ptr + rows64[:, None] * stride_src + cols[None, :], mask=m[:, None], other=0.0).to(tl.float32)
    x = x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    tl.store(dst_ptr + rows64[:, None] * stride_dst + cols[None, :], x.to(tl.bfloat16), mask=m[:, None])


@triton.jit
def gdn_prep_kernel(qkv_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, cidx_ptr, qn_ptr, kn_ptr, g_ptr, beta_ptr,
                    stride_qkv, stride_a, stride_b, HK, HV, BT: tl.constexpr, K: tl.constexpr):
    ic = tl.program_id(0)
    hk = tl.program_id(1)
    t0 = tl.load(cidx_ptr + ic.to(tl.int64) * 2)
    if t0 >= 0:
        eos = tl.load(cidx_ptr + ic.to(tl.int64) * 2 + 1)
        rows = t0 + tl.arange(0, BT)
        m = rows < eos
        rows64 = rows.to(tl.int64)
        _l2norm_store(qkv_ptr + hk * K, qn_ptr + hk * K, rows64, m, stride_qkv, HK * K, K)
        _l2norm_store(qkv_ptr + (HK + hk) * K, kn_ptr + hk * K, rows64, m, stride_qkv, HK * K, K)
        G = HV // HK
        for jv in range(0, G):
            hv = hk * G + jv
            a = tl.load(a_ptr + rows64 * stride_a + hv, mask=m, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + rows64 * stride_b + hv, mask=m, other=0.0).to(tl.float32)
            x = a + tl.load(dtb_ptr + hv)
            sp = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))  # softplus, overflow-free
            g = tl.where(m, -tl.exp(tl.load(alog_ptr + hv)) * sp, 0.0)
            gc = tl.cumsum(g, axis=0)
            beta = 1.0 / (1.0 + tl.exp(-b))
            tl.store(g_ptr + rows64 * HV + hv, gc, mask=m)
            tl.store(beta_ptr + rows64 * HV + hv, beta, mask=m)


# ------------------------------------------------------------------------------------------ 3. kkt + wy
@triton.jit
def _halves_rows(x, M: tl.constexpr, N: tl.constexpr):
    """[2M, N] -> (rows [0, M), rows [M, 2M)) (register tensors have no slicing: reshape + split)."""
    return tl.split(tl.permute(tl.reshape(x, (2, M, N)), (1, 2, 0)))


@triton.jit
def _halves_cols(x, M: tl.constexpr, N: tl.constexpr):
    """[M, 2N] -> (cols [0, N), cols [N, 2N))."""
    return tl.split(tl.permute(tl.reshape(x, (M, 2, N)), (0, 2, 1)))


@triton.jit
def _cat_rows(top, bot, M: tl.constexpr, N: tl.constexpr):
    return tl.reshape(tl.permute(tl.join(top, bot), (2, 0, 1)), (2 * M, N))


@triton.jit
def _cat_cols(left, right, M: tl.constexpr, N: tl.constexpr):
    return tl.reshape(tl.permute(tl.join(left, right), (0, 2, 1)), (M, 2 * N))


@triton.jit
def _quarters(x, BC: tl.constexpr):
    """[2BC, 2BC] -> (x00, x01, x10, x11) blocks of BC x BC."""
    top, bot = _halves_rows(x, BC, 2 * BC)
    x00, x01 = _halves_cols(top, BC, BC)
    x10, x11 = _halves_cols(bot, BC, BC)
    return x00, x01, x10, x11


@triton.jit
def _inv_unit_lower(a, BC: tl.constexpr):
    """(I + a)^-1 for a strictly lower BC x BC block: forward substitution row by row,
    T[i, :] = e_i - sum_{j<i} a[i, j] T[j, :]."""
    r = tl.arange(0, BC)[:, None]
    c = tl.arange(0, BC)[None, :]
    at = tl.trans(a)  # at[j, i] = a[i, j]: column i of at is row i of a, indexed along rows
    t = tl.where(r == c, 1.0, 0.0)
    for i in tl.static_range(1, BC):
        a_row = tl.sum(tl.where(c == i, at, 0.0), axis=1)       # [BC] over j
        upd = tl.sum(a_row[:, None] * t, axis=0)                # [BC] over columns
        t = tl.where(r == i, t - upd[None, :], t)
    return t


@triton.jit
def _mm(a, b):
    return tl.dot(a, b, input_precision="tf32")


@triton.jit
def gdn_kkt_wy_kernel(kn_ptr, v_ptr, g_ptr, beta_ptr, cidx_ptr, w_ptr, u_ptr, stride_v, HK, HV,
                      BT: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """v_ptr points at the v channels of qkv (row stride stride_v). Writes W [T, Hv, K], U [T, Hv, V] (bf16).

    A = strict-tril(beta_i exp(g_i - g_j) k_i.k_j) comes from one 64x64 dot; its 16x16 blocks are taken apart
    with reshape/split, the four diagonal blocks inverted by forward substitution, merged block-wise
    (X_ij = -T_ii sum_{k=j}^{i-1} A_ik X_kj, fp32), reassembled to the 64x64 Tm and applied with two
    bf16 tensor-core dots."""
    tl.static_assert(BT == 64)
    BC: tl.constexpr = 16
    ic = tl.program_id(0)
    hv = tl.program_id(1)
    t0 = tl.load(cidx_ptr + ic.to(tl.int64) * 2)
    if t0 >= 0:
        eos = tl.load(cidx_ptr + ic.to(tl.int64) * 2 + 1)
        hk = hv // (HV // HK)
        rows = t0 + tl.arange(0, BT)
        m = rows < eos
        r64 = rows.to(tl.int64)
        ck = tl.arange(0, K)
        cv = tl.arange(0, V)
        k = tl.load(kn_ptr + r64[:, None] * (HK * K) + hk * K + ck[None, :], mask=m[:, None], other=0.0)
        g = tl.load(g_ptr + r64 * HV + hv, mask=m, other=0.0)
        beta = tl.load(beta_ptr + r64 * HV + hv, mask=m, other=0.0)
        kk = tl.dot(k, tl.trans(k))
        d = g[:, None] - g[None, :]
        keep = (tl.arange(0, BT)[:, None] > tl.arange(0, BT)[None, :]) & m[:, None]
        a = tl.where(keep, beta[:, None] * tl.exp(tl.where(keep, d, 0.0)) * kk, 0.0)
        # 16x16 blocks a_ij (row block i, column block j)
        a_lo, a_01, a_10, a_hi = _quarters(a, 2 * BC)  # 32x32 quarters; only the diagonal 16x16 blocks are used
        a00, a01, a10, a11 = _quarters(a_lo, BC)
        a22, a23, a32, a33 = _quarters(a_hi, BC)
        t00 = _inv_unit_lower(a00, BC)
        t11 = _inv_unit_lower(a11, BC)
        t22 = _inv_unit_lower(a22, BC)
        t33 = _inv_unit_lower(a33, BC)
        # (I + A) = D (I + N), D = I + blockdiag(A), N = D^-1 L (L: the strictly block-lower part of A),
        # N^4 = 0  =>  Tm = (I - N)(I + N^2) D^-1   (the block forward substitution, as 64x64 tf32 dots)
        z = tl.zeros((BC, BC), dtype=tl.float32)
        z2 = tl.zeros((2 * BC, 2 * BC), dtype=tl.float32)
        d_lo = _cat_rows(_cat_cols(t00, z, BC, BC), _cat_cols(z, t11, BC, BC), BC, 2 * BC)
        d_hi = _cat_rows(_cat_cols(t22, z, BC, BC), _cat_cols(z, t33, BC, BC), BC, 2 * BC)
        dinv = _cat_rows(_cat_cols(d_lo, z2, 2 * BC, 2 * BC), _cat_cols(z2, d_hi, 2 * BC, 2 * BC), 2 * BC, BT)
        rb = tl.arange(0, BT)[:, None]
        cb = tl.arange(0, BT)[None, :]
        eye = tl.where(rb == cb, 1.0, 0.0)
        lo = tl.where(rb // BC > cb // BC, a, 0.0)
        nn = _mm(dinv, lo)
        n2 = _mm(nn, nn)
        x = _mm(_mm(eye - nn, eye + n2), dinv)
        x = x.to(tl.bfloat16)
        kb = (k.to(tl.float32) * (beta * tl.exp(g))[:, None]).to(tl.bfloat16)
        w = tl.dot(x, kb)
        tl.store(w_ptr + r64[:, None] * (HV * K) + hv * K + ck[None, :], w.to(tl.bfloat16), mask=m[:, None])
        v = tl.load(v_ptr + r64[:, None] * stride_v + hv * V + cv[None, :], mask=m[:, None], other=0.0)
        vb = (v.to(tl.float32) * beta[:, None]).to(tl.bfloat16)
        u = tl.dot(x, vb)
        tl.store(u_ptr + r64[:, None] * (HV * V) + hv * V + cv[None, :], u.to(tl.bfloat16), mask=m[:, None])


# -------------------------------------------------------------------------------------------- 4. delta_h
@triton.jit
def gdn_delta_h_kernel(kn_ptr, w_ptr, u_ptr, g_ptr, h_ptr, state_ptr, slot_ptr, seqinfo_ptr, HK, HV, use_state,
                       BT: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """Grid (N, Hv, V // BV). u_ptr holds U on entry and V' = U - W S on exit (in place)."""
    n = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    hk = hv // (HV // HK)
    bos = tl.load(seqinfo_ptr + n * 4 + 0)
    eos = tl.load(seqinfo_ptr + n * 4 + 1)
    coff = tl.load(seqinfo_ptr + n * 4 + 2).to(tl.int64)
    nc = tl.load(seqinfo_ptr + n * 4 + 3)
    ck = tl.arange(0, K)
    cv = iv * BV + tl.arange(0, BV)
    slot = tl.full((), -1, tl.int64)
    if use_state != 0:
        slot = tl.load(slot_ptr + n).to(tl.int64)
    s_off = (slot * HV + hv) * (K * V) + ck[:, None] * V + cv[None, :]
    S = tl.zeros((K, BV), dtype=tl.float32)
    if slot >= 0:
        S = tl.load(state_ptr + s_off)
    h_base = h_ptr + hv.to(tl.int64) * (K * V) + ck[:, None] * V + cv[None, :]
    for c in range(0, nc):
        t0 = bos + c * BT
        rows = t0 + tl.arange(0, BT)
        m = rows < eos
        r64 = rows.to(tl.int64)
        tl.store(h_base + (coff + c) * (HV * K * V), S.to(tl.bfloat16))
        w = tl.load(w_ptr + r64[:, None] * (HV * K) + hv * K + ck[None, :], mask=m[:, None], other=0.0)
        u_off = u_ptr + r64[:, None] * (HV * V) + hv * V + cv[None, :]
        u = tl.load(u_off, mask=m[:, None], other=0.0)
        k = tl.load(kn_ptr + r64[:, None] * (HK * K) + hk * K + ck[None, :], mask=m[:, None], other=0.0)
        g = tl.load(g_ptr + r64 * HV + hv, mask=m, other=0.0)
        g_last = tl.load(g_ptr + (tl.minimum(t0 + BT, eos) - 1).to(tl.int64) * HV + hv)
        vp = u.to(tl.float32) - tl.dot(w, S.to(tl.bfloat16))
        tl.store(u_off, vp.to(tl.bfloat16), mask=m[:, None])
        decay = tl.where(m, tl.exp(tl.where(m, g_last - g, 0.0)), 0.0)
        vs = (vp * decay[:, None]).to(tl.bfloat16)
        S = S * tl.exp(g_last) + tl.dot(tl.trans(k), vs)
    if slot >= 0:
        tl.store(state_ptr + s_off, S)


# -------------------------------------------------------------------------------------------- 5. chunk_o
@triton.jit
def gdn_chunk_o_kernel(qn_ptr, kn_ptr, vp_ptr, g_ptr, h_ptr, cidx_ptr, o_ptr, HK, HV, scale,
                       BT: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """Grid (max_chunks, Hv, V // BV). o [T, Hv, V] bf16."""
    ic = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    t0 = tl.load(cidx_ptr + ic * 2)
    if t0 >= 0:
        eos = tl.load(cidx_ptr + ic * 2 + 1)
        hk = hv // (HV // HK)
        rows = t0 + tl.arange(0, BT)
        m = rows < eos
        r64 = rows.to(tl.int64)
        ck = tl.arange(0, K)
        cv = iv * BV + tl.arange(0, BV)
        q = tl.load(qn_ptr + r64[:, None] * (HK * K) + hk * K + ck[None, :], mask=m[:, None], other=0.0)
        k = tl.load(kn_ptr + r64[:, None] * (HK * K) + hk * K + ck[None, :], mask=m[:, None], other=0.0)
        g = tl.load(g_ptr + r64 * HV + hv, mask=m, other=0.0)
        h = tl.load(h_ptr + (ic * HV + hv) * (K * V) + ck[:, None] * V + cv[None, :])
        vp = tl.load(vp_ptr + r64[:, None] * (HV * V) + hv * V + cv[None, :], mask=m[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
        keep = (tl.arange(0, BT)[:, None] >= tl.arange(0, BT)[None, :]) & m[:, None]
        d = tl.where(keep, g[:, None] - g[None, :], 0.0)
        att = tl.where(keep, qk * tl.exp(d), 0.0).to(tl.bfloat16)
        o = tl.dot(q, h) * tl.exp(g)[:, None]
        o = tl.dot(att, vp, o)
        o = o * scale
        tl.store(o_ptr + r64[:, None] * (HV * V) + hv * V + cv[None, :], o.to(tl.bfloat16), mask=m[:, None])
