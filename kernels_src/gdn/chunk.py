"""Gated DeltaNet chunked prefill (ARCHITECTURE.md "Kernel families"), chunk BT = 64, K = V = 128.

Pipeline (one launch each; every scratch element a kernel reads was written earlier in the same call, so no
buffer needs zero-filling):

1. ``gdn_chunk_index_kernel``  grid (1,): sanitised per-sequence table ``seqinfo [N, 4]`` = (bos, eos,
   first global chunk, number of chunks) and per global chunk ``cidx [max_chunks, 2]`` = (first token, eos of
   its sequence); unused tail entries get (-1, -1). Built on the device: no host sync.
2. ``gdn_prep_kernel``         grid (max_chunks, Hk): L2-normalised q, k (bf16 [T, Hk, K]); for the Hv/Hk value
   heads of the key head: chunk-local cumsum of g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b)
   (fp32 [T, Hv]).
3. ``gdn_kkt_wy_kernel``       grid (max_chunks * Hv,), value head fastest: A = strict-tril(beta_i exp(g_i - g_j)
   k_i.k_j), (I + A)^-1 from the inverses of its four diagonal 16x16 blocks (nilpotent product formula) and a
   block merge, then
   W = Tm (beta exp(g) K) and U = Tm (beta V) (bf16 [T, Hv, K|V]).
4. ``gdn_delta_h_kernel``      grid (N, Hv, V / BV): sequential over the chunks of one sequence: stores the state
   entering each chunk (transposed: bf16 h [max_chunks, Hv, V, K]), V' = U - W S (overwrites U in place),
   S <- exp(g_last) S + K^T (exp(g_last - g) V'); reads / writes the slot-indexed fp32 state cache.
5. ``gdn_chunk_o_kernel``      grid (max_chunks * V / BV * Hv,), value head fastest:
   O = scale (exp(g) (Q h) + (tril(Q K^T) exp(g_i - g_j)) V').

Token and chunk indices are cast to int64 before they meet a stride.

Device-side indices (never read on the host): cu_seqlens is read only by chunk_index, which clamps every
bound into [0, T] (eos >= bos) and the chunk count into the chunk table, so each later kernel's rows
[t0, eos) lie inside [0, T) and its chunk ids inside [0, max_chunks) whatever cu_seqlens holds;
decreasing offsets give empty sequences, overlapping ones are each computed (their outputs race:
unspecified values, in bounds). slot_idx is read only by delta_h, which takes the number of state slots
and treats a slot outside [0, num_slots) as "no state". Two sequences with the same valid slot in one
call: both start from it and both write their final state back; the slot's content (per value block)
comes from one of them, unspecified which; nothing outside the pool is touched.
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
                    stride_qkv, stride_a, stride_b, HK, HV, BT: tl.constexpr, K: tl.constexpr, GP: tl.constexpr):
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
        for j0 in range(0, G, GP):  # the value heads of this key head, GP columns of [T, Hv] at a time
            jv = j0 + tl.arange(0, GP)
            hv = hk * G + jv
            mm = m[:, None] & (jv < G)[None, :]
            a = tl.load(a_ptr + rows64[:, None] * stride_a + hv[None, :], mask=mm, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + rows64[:, None] * stride_b + hv[None, :], mask=mm, other=0.0).to(tl.float32)
            x = a + tl.load(dtb_ptr + hv, mask=jv < G, other=0.0)[None, :]
            sp = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))  # softplus, overflow-free
            g = tl.where(mm, -tl.exp(tl.load(alog_ptr + hv, mask=jv < G, other=0.0))[None, :] * sp, 0.0)
            gc = tl.cumsum(g, axis=0)
            beta = 1.0 / (1.0 + tl.exp(-b))
            tl.store(g_ptr + rows64[:, None] * HV + hv[None, :], gc, mask=mm)
            tl.store(beta_ptr + rows64[:, None] * HV + hv[None, :], beta, mask=mm)


# ------------------------------------------------------------------------------------------ 3. kkt + wy
@triton.jit
def _mm(a, b):
    return tl.dot(a, b, input_precision="tf32")


@triton.jit
def _diag_inverse(a, BT: tl.constexpr, BC: tl.constexpr):
    """D^-1 = blockdiag((I + A_bb)^-1) (BT x BT, fp32) for the BT / BC diagonal BC x BC blocks of the strictly
    lower triangular A, all blocks at once as [NB, BC, BC] batches cut out of A. A block is nilpotent
    (a^BC = 0), so (I + a)^-1 = (I - a)(I + a^2)(I + a^4)(I + a^8) for BC = 16: six batched fp32 dots instead of
    BC - 1 dependent row steps (each a cross-warp reduction). Powers of a grow for nearly parallel keys without
    decay (|a^8| ~ 3e3), which costs ~4e-4 of max|T| in fp32 -- below the bf16 rounding Tm gets."""
    tl.static_assert(BC == 16)
    NB: tl.constexpr = BT // BC
    r = tl.arange(0, BT)
    same = (r[:, None] // BC) == (r[None, :] // BC)
    # [row block, BC, col block, BC] with only the diagonal col block non-zero: summing it out cuts the blocks
    ad = tl.sum(tl.reshape(tl.where(same, a, 0.0), (NB, BC, NB, BC)), 2)
    i3 = tl.arange(0, BC)[None, :, None]
    j3 = tl.arange(0, BC)[None, None, :]
    eye = tl.where(i3 == j3, 1.0, 0.0) + tl.zeros((NB, BC, BC), tl.float32)
    t = eye - ad
    p = ad
    for _ in tl.static_range(3):  # BC = 16 = 2^4: factors (I + a^2), (I + a^4), (I + a^8)
        p = tl.dot(p, p, input_precision="ieee")
        t = t + tl.dot(t, p, input_precision="ieee")
    # scatter the NB blocks onto the diagonal of a BT x BT matrix
    blk = tl.arange(0, NB)
    sel = tl.where(blk[:, None] == blk[None, :], 1.0, 0.0)  # [NB, NB]
    full = t[:, :, None, :] * sel[:, None, :, None]  # [NB, BC, NB, BC]
    return tl.reshape(full, (BT, BT))


@triton.jit
def gdn_kkt_wy_kernel(kn_ptr, v_ptr, g_ptr, beta_ptr, cidx_ptr, w_ptr, u_ptr, stride_v, HK, HV,
                      BT: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """v_ptr points at the v channels of qkv (row stride stride_v). Writes W [T, Hv, K], U [T, Hv, V] (bf16).

    A = strict-tril(beta_i exp(g_i - g_j) k_i.k_j) comes from one 64x64 dot; the inverses of its four diagonal
    16x16 blocks (batched, :func:`_diag_inverse`) are merged block-wise into the 64x64 Tm with tf32 dots, which
    is applied with two bf16 tensor-core dots."""
    tl.static_assert(BT == 64)
    BC: tl.constexpr = 16
    pid = tl.program_id(0)  # value head fastest: the Hv / Hk heads sharing a key head read k from L2
    hv = pid % HV
    ic = pid // HV
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
        rb = tl.arange(0, BT)[:, None]
        cb = tl.arange(0, BT)[None, :]
        lo = tl.where(rb // BC > cb // BC, a, 0.0)
        dinv = _diag_inverse(a, BT, BC)
        eye = tl.where(rb == cb, 1.0, 0.0)
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
def gdn_delta_h_kernel(kn_ptr, w_ptr, u_ptr, g_ptr, h_ptr, state_ptr, slot_ptr, seqinfo_ptr, HK, HV, num_slots,
                       BT: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                       TMA: tl.constexpr):
    """Grid (N, Hv, V // BV). u_ptr holds U on entry and V' = U - W S on exit (in place). h is stored
    transposed: h [max_chunks, Hv, V, K] bf16 (what chunk_o reads).

    TMA = False: the state block is kept transposed, S^T [BV, K] fp32, so both products take their register
    operand on the left (V'^T = U^T - S^T W^T and S^T <- exp(g_last) S^T + V'^T_decayed K): the state never
    goes through shared memory; the products are mma.sync (M = BV rows). Any arch.
    TMA = True (Hopper+): S [K, BV] with the chunk's rows on M (V' = U - W S: M = 64; S <- exp(g_last) S +
    K^T V'_decayed: M = 128), warpgroup MMAs whose B operands (S, V'_decayed, bf16) go through shared memory;
    W, K, U tiles are loaded and V', h stored through tensor descriptors built once per program over the
    sequence's rows [bos, eos) -- rows past eos read as zeros and are never written, so no per-element address
    or mask arithmetic is left in the loop (the same orientation with pointer loads measured slower:
    BENCHMARKS.md, session 4).

    State: num_slots = state.shape[0] (0: no state; slot_ptr is then never read). A slot_idx[n] outside
    [0, num_slots) means "no state": zero initial state, nothing written back."""
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
    if num_slots > 0:
        slot = tl.load(slot_ptr + n).to(tl.int64)
        slot = tl.where((slot >= 0) & (slot < num_slots), slot, -1)  # out of range: no state
    if TMA:
        _delta_h_tma(kn_ptr, w_ptr, u_ptr, g_ptr, h_ptr, state_ptr, slot, hv, hk, bos, eos, coff, nc, ck, cv,
                     HK, HV, BT, K, V, BV)
    else:
        _delta_h_t(kn_ptr, w_ptr, u_ptr, g_ptr, h_ptr, state_ptr, slot, hv, hk, bos, eos, coff, nc, ck, cv,
                   HK, HV, BT, K, V, BV)


@triton.jit
def _delta_h_t(kn_ptr, w_ptr, u_ptr, g_ptr, h_ptr, state_ptr, slot, hv, hk, bos, eos, coff, nc, ck, cv,
               HK, HV, BT: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    s_off = (slot * HV + hv) * (K * V) + ck[None, :] * V + cv[:, None]  # state cache [slots, Hv, K, V]
    ST = tl.zeros((BV, K), dtype=tl.float32)
    if slot >= 0:
        ST = tl.load(state_ptr + s_off)
    h_base = h_ptr + hv.to(tl.int64) * (V * K) + cv[:, None] * K + ck[None, :]
    # g, g_last and U^T of chunk c + 1 are loaded while chunk c computes (they sit on the dependent chain of
    # each step otherwise; W and K come through the compiler's cp.async pipeline)
    rows = bos + tl.arange(0, BT)
    m = rows < eos
    r64 = rows.to(tl.int64)
    g_nx = tl.load(g_ptr + r64 * HV + hv, mask=m, other=0.0)
    gl_nx = tl.load(g_ptr + (tl.minimum(bos + BT, eos) - 1).to(tl.int64) * HV + hv, mask=nc > 0, other=0.0)
    ut_nx = tl.load(u_ptr + r64[None, :] * (HV * V) + hv * V + cv[:, None], mask=m[None, :], other=0.0)
    for c in range(0, nc):
        t0 = bos + c * BT
        m = rows < eos
        r64 = rows.to(tl.int64)
        g = g_nx
        g_last = gl_nx
        ut = ut_nx
        rows = rows + BT  # chunk c + 1
        m1 = rows < eos
        r1 = rows.to(tl.int64)
        g_nx = tl.load(g_ptr + r1 * HV + hv, mask=m1, other=0.0)
        gl_nx = tl.load(g_ptr + (tl.minimum(t0 + 2 * BT, eos) - 1).to(tl.int64) * HV + hv, mask=t0 + BT < eos,
                        other=0.0)
        ut_nx = tl.load(u_ptr + r1[None, :] * (HV * V) + hv * V + cv[:, None], mask=m1[None, :], other=0.0)
        tl.store(h_base + (coff + c) * (HV * V * K), ST.to(tl.bfloat16))
        w = tl.load(w_ptr + r64[:, None] * (HV * K) + hv * K + ck[None, :], mask=m[:, None], other=0.0)
        k = tl.load(kn_ptr + r64[:, None] * (HK * K) + hk * K + ck[None, :], mask=m[:, None], other=0.0)
        vpt = ut.to(tl.float32) - tl.dot(ST.to(tl.bfloat16), tl.trans(w))
        tl.store(u_ptr + r64[None, :] * (HV * V) + hv * V + cv[:, None], vpt.to(tl.bfloat16), mask=m[None, :])
        decay = tl.where(m, tl.exp(tl.where(m, g_last - g, 0.0)), 0.0)
        vst = (vpt * decay[None, :]).to(tl.bfloat16)
        ST = ST * tl.exp(g_last) + tl.dot(vst, k)
    if slot >= 0:
        tl.store(state_ptr + s_off, ST)


@triton.jit
def _delta_h_tma(kn_ptr, w_ptr, u_ptr, g_ptr, h_ptr, state_ptr, slot, hv, hk, bos, eos, coff, nc, ck, cv,
                 HK, HV, BT: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    s_off = (slot * HV + hv) * (K * V) + ck[:, None] * V + cv[None, :]  # state cache [slots, Hv, K, V]
    S = tl.zeros((K, BV), dtype=tl.float32)
    if slot >= 0:
        S = tl.load(state_ptr + s_off)
    nrows = eos - bos
    b64 = bos.to(tl.int64)
    v0 = tl.program_id(2) * BV  # first value column of this block
    w_desc = tl.make_tensor_descriptor(w_ptr + b64 * (HV * K) + hv * K, [nrows, K], [HV * K, 1], [BT, K])
    k_desc = tl.make_tensor_descriptor(kn_ptr + b64 * (HK * K) + hk * K, [nrows, K], [HK * K, 1], [BT, K])
    u_desc = tl.make_tensor_descriptor(u_ptr + b64 * (HV * V) + hv * V + v0, [nrows, BV], [HV * V, 1], [BT, BV])
    # h [max_chunks, Hv, V, K]: this program's chunks as a [nc, BV, K] box array
    h_desc = tl.make_tensor_descriptor(h_ptr + (coff * HV + hv) * (V * K) + v0 * K, [nc, BV, K],
                                       [HV * V * K, K, 1], [1, BV, K])
    rows = bos + tl.arange(0, BT)
    m = rows < eos
    g_nx = tl.load(g_ptr + rows.to(tl.int64) * HV + hv, mask=m, other=0.0)
    gl_nx = tl.load(g_ptr + (tl.minimum(bos + BT, eos) - 1).to(tl.int64) * HV + hv, mask=nc > 0, other=0.0)
    for c in range(0, nc):
        t0 = bos + c * BT
        m = rows < eos
        g = g_nx
        g_last = gl_nx
        rows = rows + BT  # chunk c + 1
        g_nx = tl.load(g_ptr + rows.to(tl.int64) * HV + hv, mask=rows < eos, other=0.0)
        gl_nx = tl.load(g_ptr + (tl.minimum(t0 + 2 * BT, eos) - 1).to(tl.int64) * HV + hv, mask=t0 + BT < eos,
                        other=0.0)
        sb = S.to(tl.bfloat16)
        h_desc.store([c, 0, 0], tl.reshape(tl.trans(sb), [1, BV, K]))
        w = w_desc.load([c * BT, 0])
        k = k_desc.load([c * BT, 0])
        u = u_desc.load([c * BT, 0])
        vp = u.to(tl.float32) - tl.dot(w, sb)
        u_desc.store([c * BT, 0], vp.to(tl.bfloat16))
        decay = tl.where(m, tl.exp(tl.where(m, g_last - g, 0.0)), 0.0)
        vd = (vp * decay[:, None]).to(tl.bfloat16)
        S = tl.dot(tl.trans(k), vd, S * tl.exp(g_last))
    if slot >= 0:
        tl.store(state_ptr + s_off, S)


# -------------------------------------------------------------------------------------------- 5. chunk_o
@triton.jit
def gdn_chunk_o_kernel(qn_ptr, kn_ptr, vp_ptr, g_ptr, h_ptr, cidx_ptr, o_ptr, HK, HV, scale,
                       BT: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """Grid (max_chunks * (V // BV) * Hv,), value head fastest, then the V block, then the chunk (the heads
    sharing q, k read them from L2). o [T, Hv, V] bf16."""
    pid = tl.program_id(0)
    hv = pid % HV
    rest = pid // HV
    iv = rest % (V // BV)
    ic = (rest // (V // BV)).to(tl.int64)
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
        h = tl.load(h_ptr + (ic * HV + hv) * (V * K) + cv[None, :] * K + ck[:, None])  # h [.., V, K]
        vp = tl.load(vp_ptr + r64[:, None] * (HV * V) + hv * V + cv[None, :], mask=m[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
        keep = (tl.arange(0, BT)[:, None] >= tl.arange(0, BT)[None, :]) & m[:, None]
        d = tl.where(keep, g[:, None] - g[None, :], 0.0)
        att = tl.where(keep, qk * tl.exp(d), 0.0).to(tl.bfloat16)
        o = tl.dot(q, h) * tl.exp(g)[:, None]
        o = tl.dot(att, vp, o)
        o = o * scale
        tl.store(o_ptr + r64[:, None] * (HV * V) + hv * V + cv[None, :], o.to(tl.bfloat16), mask=m[:, None])
