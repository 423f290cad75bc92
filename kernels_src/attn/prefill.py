"""Varlen causal prefill attention over a paged KV cache (FlashAttention-2 style; Dao 2023).

Packed queries q [T, Hq, D] (cu_seqlens_q int32 [N+1]); sequence i has q_len = cu[i+1] - cu[i] new tokens
and seq_lens[i] = L total context (cached prefix + the new tokens, which are the last q_len positions), so
query row r of sequence i sits at absolute position L - q_len + r and sees keys 0..that position. Keys and
values come from the paged cache [num_blocks, block_size, Hkv, D] through the block table
[N, max_blocks]. GQA: q head h reads kv head h // group. Online softmax in fp32 (exp2 domain), bf16
tensor-core dots with fp32 accumulation; the score matrix is never materialized.

Grid (Hq * n_mblocks,), n_mblocks = cdiv(T, BLOCK_M) + N: program p takes q head p % Hq and the
(p // Hq)-th packed m-block counted from the end (heaviest, i.e. latest, blocks first). Each processed
sequence owns cdiv(q_len, BLOCK_M) consecutive packed m-blocks; the block of a program is found by a
chunked prefix scan of cu_seqlens, from its last chunk backwards. Processed sequences lie inside [0, T)
without overlapping, so they own at most cdiv(T, BLOCK_M) + N m-blocks: the grid always covers every row
(no host sync, no dependence on a caller's bound of q_len); the surplus programs come last and exit
after the scan.

Device-side bound checks (the host cannot see lengths or tables without a sync), so that no value of
cu_seqlens, seq_lens or block_tables makes the kernel touch memory outside q, out, gate, the caches and
those three tensors:
  * sequence i is processed iff 0 <= cu[i] <= cu[i+1] <= T (num_tokens) and cu[i+1] <= cu[j] for every
    j > i + 1; any other sequence is skipped (none of its rows is read or written). Processed sequences
    never overlap, so every row of [0, T) is written by at most one program; rows of skipped sequences
    and rows outside every processed sequence (e.g. before cu[0] or past cu[N]) are left as they were.
    A well-formed cu_seqlens (non-decreasing, cu[N] <= T) processes every sequence.
  * L is clamped to [0, max_blocks * block_size]; block ids outside [0, num_blocks) are masked out (those
    keys are skipped: the gather path never reads them, the TMA path reads block 0 instead, in bounds);
    rows that see no key (only possible for inconsistent lengths, L < q_len) write zeros.

HAS_GATE: o *= sigmoid(gate[t*stride_gt + h*stride_gh + d]) (Qwen gated attention epilogue).
"""
import triton
import triton.language as tl

from kernels_src.attn.common import kv_rows
from kernels_src.common import sigmoid_f32


@triton.jit
def _min_i32(a, b):
    return tl.minimum(a, b)


@triton.jit
def _find_block(cu_ptr, r, num_seqs, num_tokens, BLOCK_M: tl.constexpr, SEQ_CHUNK: tl.constexpr):
    """(sequence, m-block inside it) of the r-th packed m-block counted from the
    end (r = 0: the last m-block of the last processed sequence); sequence -1 when r is past the first one.
    The chunks of cu_seqlens are scanned from the last one, carrying the blocks after them and the minimum
    of the offsets after them, so that the processed-sequence rule (module docstring: cu[i+1] <= every
    later offset) needs no second pass."""
    seq = -1
    mb = -1
    after = 0  # m-blocks of the processed sequences after this chunk
    bot = num_tokens  # min(T, cu[j] for every j past this chunk's last end offset)
    n_chunks = (num_seqs + SEQ_CHUNK - 1) // SEQ_CHUNK
    for j in range(0, n_chunks):
        idx = (n_chunks - 1 - j) * SEQ_CHUNK + tl.arange(0, SEQ_CHUNK)
        msk = idx < num_seqs
        lo = tl.load(cu_ptr + idx, mask=msk, other=0)
        hi = tl.load(cu_ptr + idx + 1, mask=msk, other=2147483647)
        later = tl.minimum(tl.associative_scan(hi, 0, _min_i32, reverse=True), bot)  # min(cu[i+1..N], T)
        ok = msk & (lo >= 0) & (lo <= hi) & (hi <= later)
        ln = tl.where(ok, hi, lo) - lo  # 0 for a skipped sequence (no overflow for any lo, hi)
        nb = (ln + BLOCK_M - 1) // BLOCK_M
        incl = tl.cumsum(nb, 0, reverse=True) + after  # blocks from this sequence to the end
        excl = incl - nb
        hit = (r >= excl) & (r < incl)  # at most one lane of all chunks (nb = 0 lanes never hit)
        seq = tl.maximum(seq, tl.max(tl.where(hit, idx, -1), 0))
        mb = tl.maximum(mb, tl.max(tl.where(hit, nb - 1 - (r - excl), -1), 0))
        after += tl.sum(nb, 0)
        bot = tl.minimum(bot, tl.min(hi, 0))  # masked lanes hold INT32_MAX
    return seq, mb


@triton.jit
def _attend(acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, bt_row, kvh, pos, n_lo, n_hi, L, qk_scale,
            block_size, max_blocks, num_blocks, stride_cb, stride_cs, stride_ch,
            D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Gather path: the rows of each key tile are looked up one by one (any block_size)."""
    d = tl.arange(0, D)
    for n in range(n_lo, n_hi, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        rows, ok = kv_rows(bt_row, offs_n, kvh, L, block_size, max_blocks, num_blocks,
                           stride_cb, stride_cs, stride_ch)
        if MASKED:
            k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=ok[:, None], other=0.0)
        else:
            k = tl.load(k_cache_ptr + rows[:, None] + d[None, :])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if MASKED:
            vis = ok[None, :] & (offs_n[None, :] <= pos[:, None])
        else:
            vis = ok[None, :] & (pos[:, None] >= 0)  # (pos < 0 only for inconsistent lengths)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=ok[:, None], other=0.0)
        else:
            v = tl.load(v_cache_ptr + rows[:, None] + d[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attend_tma(acc, m_i, l_i, q, k_desc, v_desc, bt_row, col, pos, n_lo, n_hi, qk_scale, block_size,
                num_blocks, rows_per_block, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, TAIL: tl.constexpr,
                STAGES: tl.constexpr):
    """TMA path (block_size % BLOCK_N == 0): a key tile is BLOCK_N consecutive slots of one cache block,
    one box per tile. TAIL: the descriptors cover only the valid slots of the sequence's last block (rows
    past L read as zeros); otherwise they cover the whole cache and an id outside [0, num_blocks) reads
    block 0 (in bounds; such a sequence's output is meaningless). STAGES: software-pipelining depth of the
    loop (None: the kernel's num_stages)."""
    for n in tl.range(n_lo, n_hi, BLOCK_N, num_stages=STAGES):
        if TAIL:
            row0 = n % block_size
        else:
            blk = tl.load(bt_row + n // block_size)
            row0 = tl.where((blk >= 0) & (blk < num_blocks), blk, 0) * rows_per_block + n % block_size
        k = k_desc.load([row0, col])
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            offs_n = n + tl.arange(0, BLOCK_N)
            s = tl.where(offs_n[None, :] <= pos[:, None], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
        else:  # every key of the tile is visible to every row: no mask, no empty rows
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([row0, col])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _store_gated_half(o, g_rows, o_rows, rmask, BLOCK_M: tl.constexpr, HALF: tl.constexpr):
    """o_rows[:, c] = o[:, c] * sigmoid(g_rows[:, c]) for c < HALF, in two quarters."""
    Q: tl.constexpr = HALF // 2
    dq = tl.arange(0, Q)
    o_a, o_b = tl.split(tl.permute(tl.reshape(o, [BLOCK_M, 2, Q]), (0, 2, 1)))
    g = tl.load(g_rows + dq[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    tl.store(o_rows + dq[None, :], (o_a * sigmoid_f32(g)).to(tl.bfloat16), mask=rmask[:, None])
    g = tl.load(g_rows + Q + dq[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    tl.store(o_rows + Q + dq[None, :], (o_b * sigmoid_f32(g)).to(tl.bfloat16), mask=rmask[:, None])


@triton.jit
def _prefill_mblock(q_ptr, k_cache_ptr, v_cache_ptr, o_ptr, gate_ptr, bt_ptr, cu_ptr, seqlen_ptr, seq, mb,
                    h, scale, group, stride_qt, stride_qh, stride_ot, stride_oh, stride_gt, stride_gh,
                    stride_cb, stride_cs, stride_ch, stride_bt, block_size, max_blocks, num_blocks,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_GATE: tl.constexpr,
                    TMA: tl.constexpr):
    """m-block mb (rows cu[seq] + mb * BLOCK_M ..., masked to its q_len) of processed sequence seq, q head h
    (processed: 0 <= cu[seq] <= cu[seq+1] <= T)."""
    q_start = tl.load(cu_ptr + seq)
    q_len = tl.load(cu_ptr + seq + 1) - q_start
    L = tl.minimum(tl.maximum(tl.load(seqlen_ptr + seq), 0), max_blocks * block_size)
    ctx0 = L - q_len  # absolute position of the first new token
    kvh = h // group
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt

    m0 = mb * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    rmask = offs_m < q_len
    tok = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + h * stride_qh + d[None, :], mask=rmask[:, None], other=0.0)
    pos = ctx0 + offs_m

    qk_scale = scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # keys every row of the block sees (no causal mask) up to n_full, then the diagonal band to n_end
    last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    n_full = tl.maximum(tl.minimum((ctx0 + m0 + 1) // BLOCK_N * BLOCK_N, L), 0)
    n_end = tl.minimum(ctx0 + last + 1, L)
    if TMA:
        # the cache as a 2-D [num_blocks * rows_per_block, Hkv * D] matrix of slot rows
        rows_per_block = (stride_cb // stride_cs).to(tl.int32)
        n_rows = num_blocks * rows_per_block
        col = kvh * stride_ch
        k_desc = tl.make_tensor_descriptor(k_cache_ptr, [n_rows, stride_cs], [stride_cs, 1], [BLOCK_N, D])
        v_desc = tl.make_tensor_descriptor(v_cache_ptr, [n_rows, stride_cs], [stride_cs, 1], [BLOCK_N, D])
        acc, m_i, l_i = _attend_tma(acc, m_i, l_i, q, k_desc, v_desc, bt_row, col, pos, 0, n_full, qk_scale,
                                    block_size, num_blocks, rows_per_block, BLOCK_N, False, False, None)
        # the last tile may hold slots past L (stale, maybe NaN: 0 * NaN would poison the row); it is
        # read through descriptors of the last block that end at L, so those slots read as zeros
        n_tail = tl.maximum(L // BLOCK_N * BLOCK_N, n_full)
        acc, m_i, l_i = _attend_tma(acc, m_i, l_i, q, k_desc, v_desc, bt_row, col, pos, n_full,
                                    tl.minimum(n_end, n_tail), qk_scale, block_size, num_blocks,
                                    rows_per_block, BLOCK_N, True, False, 1)
        if n_tail < n_end:
            p0 = n_tail // block_size * block_size
            blk = tl.load(bt_row + n_tail // block_size)
            blk = tl.where((blk >= 0) & (blk < num_blocks), blk, 0).to(tl.int64)
            k_tail = tl.make_tensor_descriptor(k_cache_ptr + blk * stride_cb, [L - p0, stride_cs],
                                               [stride_cs, 1], [BLOCK_N, D])
            v_tail = tl.make_tensor_descriptor(v_cache_ptr + blk * stride_cb, [L - p0, stride_cs],
                                               [stride_cs, 1], [BLOCK_N, D])
            acc, m_i, l_i = _attend_tma(acc, m_i, l_i, q, k_tail, v_tail, bt_row, col, pos, n_tail, n_end,
                                        qk_scale, block_size, num_blocks, rows_per_block, BLOCK_N, True, True, 1)
    else:
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, bt_row, kvh, pos, 0, n_full, L,
                                qk_scale, block_size, max_blocks, num_blocks, stride_cb, stride_cs, stride_ch,
                                D, BLOCK_N, False)
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_cache_ptr, v_cache_ptr, bt_row, kvh, pos, n_full, n_end, L,
                                qk_scale, block_size, max_blocks, num_blocks, stride_cb, stride_cs, stride_ch,
                                D, BLOCK_N, True)
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_rows = o_ptr + tok[:, None] * stride_ot + h * stride_oh
    if HAS_GATE:
        # four quarters of D/4 columns: the gate tile never sits in registers next to the whole output
        HALF: tl.constexpr = D // 2
        o_lo, o_hi = tl.split(tl.permute(tl.reshape(out, [BLOCK_M, 2, HALF]), (0, 2, 1)))
        g_rows = gate_ptr + tok[:, None] * stride_gt + h * stride_gh
        _store_gated_half(o_lo, g_rows, o_rows, rmask, BLOCK_M, HALF)
        _store_gated_half(o_hi, g_rows + HALF, o_rows + HALF, rmask, BLOCK_M, HALF)
    else:
        tl.store(o_rows + d[None, :], out.to(tl.bfloat16), mask=rmask[:, None])


@triton.jit
def prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, o_ptr, gate_ptr, bt_ptr, cu_ptr, seqlen_ptr,
                   scale, num_seqs, num_tokens, num_q_heads, group,
                   stride_qt, stride_qh, stride_ot, stride_oh, stride_gt, stride_gh,
                   stride_cb, stride_cs, stride_ch, stride_bt, block_size, max_blocks, num_blocks,
                   D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_GATE: tl.constexpr,
                   SEQ_CHUNK: tl.constexpr, TMA: tl.constexpr):
    pid = tl.program_id(0)
    h = pid % num_q_heads
    seq, mb = _find_block(cu_ptr, pid // num_q_heads, num_seqs, num_tokens, BLOCK_M, SEQ_CHUNK)
    if seq >= 0:
        _prefill_mblock(q_ptr, k_cache_ptr, v_cache_ptr, o_ptr, gate_ptr, bt_ptr, cu_ptr, seqlen_ptr, seq, mb,
                        h, scale, group, stride_qt, stride_qh, stride_ot, stride_oh, stride_gt, stride_gh,
                        stride_cb, stride_cs, stride_ch, stride_bt, block_size, max_blocks, num_blocks,
                        D, BLOCK_M, BLOCK_N, HAS_GATE, TMA)
