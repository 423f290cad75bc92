"""Split-KV decode attention over a paged KV cache (flash-decoding) + log-sum-exp combine.

q [B, Hq, D] bf16: one new token per sequence, at position seq_lens[b] - 1, which sees keys 0..L-1
(L = seq_lens[b], clamped on the device to [0, max_blocks * block_size]; L = 0 gives a zero output).

Device-side indices: seq_lens and block_tables are read on the device only; sequence b is program-indexed
(b < B from the grid), L is clamped as above, and a key whose block id lies outside [0, num_blocks) is
masked out (never read; it does not count). The partial and ticket rows a program touches depend only on
its program id and num_splits (sized by the runtime), never on device data. So no value of seq_lens or
block_tables makes a kernel touch memory outside its tensors; meaningless values give meaningless
(finite or zero) outputs.

decode_split_kernel, grid (B * Hkv * num_splits,): program p takes split p % num_splits of
(b, kv head) = divmod(p // num_splits, Hkv). The group of `group` q heads of that kv head is one
[QB, D] operand (rows >= group are padding), so each K/V byte is read once per split. Sequence b's keys are
cut into num_splits ranges of kps = cdiv(cdiv(L, num_splits), BLOCK_N) * BLOCK_N keys; a split past the end
writes lse = -inf only. Writes part_o[((b*Hq + h)*num_splits + s)*D + d] (fp32, normalized by its own
softmax sum) and part_lse[(b*Hq + h)*num_splits + s] (fp32, log2 domain of scale * q.k).

decode_direct_kernel, grid (B * Hkv,): the one-split case in one launch (the split kernel's loop over all
keys, the output normalized, gated and stored as bf16 directly).

decode_fused_kernel, grid (B * Hkv * num_splits,): decode_split_kernel's work, then the last split of each
(b, kv head) to finish -- a ticket from an atomic counter per (b, kv head), taken after the program's
partials are stored (barrier, then an acq_rel atomic at GPU scope) -- merges the num_splits partials of its
group, writes o (times sigmoid(gate)) and resets the counter to 0: one launch, no combine kernel. The
counters (int32, one per (b, kv head)) must be zero before the first launch; every launch leaves them zero.

decode_combine_kernel, grid (B * Hq,): o[b, h] = sum_s 2^(lse_s - M) part_o_s / sum_s 2^(lse_s - M)
over splits with finite lse, M their largest lse, optionally times sigmoid(gate[b*stride_gb + h*stride_gh + d]).
It loads the first SPLIT_BLOCK splits' lse and partials together with every split's lse (M and the last split
with a finite lse): one round trip when the live splits fit the first block, whatever num_splits is -- a short
context under a split count chosen for the whole block table (a graph captured once) leaves most splits empty,
and later blocks are read only up to the last live split. A dead split's partial that is loaded (stale
scratch, NaN included) is dropped by a select, never used.
"""
import triton
import triton.language as tl

from kernels_src.attn.common import kv_rows
from kernels_src.common import pdl_enter, sigmoid_f32


@triton.jit
def _q_rows(q_ptr, b, hq, rmask, scale, stride_qb, stride_qh, D: tl.constexpr):
    """The QB (padded) q rows hq of sequence b ([QB, D] bf16, padding rows zero) and the exp2-domain score scale."""
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qb + hq[:, None] * stride_qh + d[None, :], mask=rmask[:, None], other=0.0)
    qk_scale = scale * 1.4426950408889634
    return q, qk_scale


@triton.jit
def _normalized(acc, m_i, l_i):
    """(acc normalized by its softmax sum, lse in the log2 domain; a row that saw nothing: zeros, -inf)."""
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    return out, lse


@triton.jit
def _softmax_step(m_i, l_i, s):
    """One online-softmax step over scores s [QB, N] (log2 domain, -inf for keys that do not count): (the new
    running max, the accumulator's rescale alpha, the tile's probabilities p, the new running sum)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _attend_range(q_ptr, k_cache_ptr, v_cache_ptr, bt_row, b, kvh, hq, rmask, n_lo, n_hi, scale,
                  stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, block_size, max_blocks, num_blocks,
                  D: tl.constexpr, BLOCK_N: tl.constexpr, QB: tl.constexpr):
    """Attention of the QB (padded) q rows hq of sequence b over its keys [n_lo, n_hi): (out normalized by
    its own softmax sum, fp32 [QB, D]; lse in the log2 domain of scale * q.k, -inf for a row that saw
    nothing)."""
    d = tl.arange(0, D)
    q, qk_scale = _q_rows(q_ptr, b, hq, rmask, scale, stride_qb, stride_qh, D)
    m_i = tl.full([QB], float("-inf"), tl.float32)
    l_i = tl.zeros([QB], tl.float32)
    acc = tl.zeros([QB, D], tl.float32)
    for n in range(n_lo, n_hi, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        rows, ok = kv_rows(bt_row, offs_n, kvh, n_hi, block_size, max_blocks, num_blocks,
                           stride_cb, stride_cs, stride_ch)
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new, alpha, p, l_i = _softmax_step(m_i, l_i, s)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m_i = m_new
    return _normalized(acc, m_i, l_i)


@triton.jit
def _tma_step(acc, m_i, l_i, q, k_desc, v_desc, row0, col, ok, valid, qk_scale, TAIL: tl.constexpr):
    """One key tile by TMA (BLOCK_N slots of one cache block from slot row row0): scores of keys not ok are
    -inf; a tile of an invalid block (valid False: row0 points into block 0, in bounds) leaves acc as it was,
    and TAIL zeroes the V rows of keys not ok (slots past L may hold anything, NaN included: 0 * NaN)."""
    k = k_desc.load([row0, col])
    s = tl.where(ok[None, :], tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
    m_new, alpha, p, l_i = _softmax_step(m_i, l_i, s)
    v = v_desc.load([row0, col])
    if TAIL:
        v = tl.where(ok[:, None], v, 0.0)
    acc = tl.where(valid, acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v), acc)
    return acc, m_new, l_i


@triton.jit
def _tile_row(bt_row, n, block_size, num_blocks, rows_per_block):
    """The slot row of key n in the cache's slot-row matrix and whether its block id is valid (an invalid one
    points into block 0)."""
    blk = tl.load(bt_row + n // block_size)
    valid = (blk >= 0) & (blk < num_blocks)
    return tl.where(valid, blk, 0) * rows_per_block + n % block_size, valid


@triton.jit
def _attend_range_tma(q_ptr, k_cache_ptr, v_cache_ptr, bt_row, b, kvh, hq, rmask, n_lo, n_hi, scale,
                      stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, block_size, num_blocks,
                      D: tl.constexpr, BLOCK_N: tl.constexpr, QB: tl.constexpr, STAGES: tl.constexpr):
    """_attend_range with K / V tiles loaded by TMA (block_size % BLOCK_N == 0, n_lo % BLOCK_N == 0: a tile is
    BLOCK_N slots of one cache block, one box; the cache seen as a [num_blocks * rows_per_block, stride_cs]
    matrix of slot rows, descriptors built on the device). A key of a block id outside [0, num_blocks) is not
    counted (its tile reads block 0's slots, in bounds, and discards them). Full tiles run software-pipelined
    STAGES deep; the one partial tile of the range (keys past n_hi) last."""
    q, qk_scale = _q_rows(q_ptr, b, hq, rmask, scale, stride_qb, stride_qh, D)
    rows_per_block = (stride_cb // stride_cs).to(tl.int32)
    n_rows = num_blocks * rows_per_block
    k_desc = tl.make_tensor_descriptor(k_cache_ptr, [n_rows, stride_cs], [stride_cs, 1], [BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(v_cache_ptr, [n_rows, stride_cs], [stride_cs, 1], [BLOCK_N, D])
    col = kvh * stride_ch
    m_i = tl.full([QB], float("-inf"), tl.float32)
    l_i = tl.zeros([QB], tl.float32)
    acc = tl.zeros([QB, D], tl.float32)
    cols = tl.arange(0, BLOCK_N)
    n_full = n_lo + (n_hi - n_lo) // BLOCK_N * BLOCK_N
    for n in tl.range(n_lo, n_full, BLOCK_N, num_stages=STAGES):
        row0, valid = _tile_row(bt_row, n, block_size, num_blocks, rows_per_block)
        ok = (cols < BLOCK_N) & valid
        acc, m_i, l_i = _tma_step(acc, m_i, l_i, q, k_desc, v_desc, row0, col, ok, valid, qk_scale, False)
    if n_full < n_hi:
        row0, valid = _tile_row(bt_row, n_full, block_size, num_blocks, rows_per_block)
        ok = (n_full + cols < n_hi) & valid
        acc, m_i, l_i = _tma_step(acc, m_i, l_i, q, k_desc, v_desc, row0, col, ok, valid, qk_scale, True)
    return _normalized(acc, m_i, l_i)


@triton.jit
def _attend(q_ptr, k_cache_ptr, v_cache_ptr, bt_row, b, kvh, hq, rmask, n_lo, n_hi, scale, stride_qb, stride_qh,
            stride_cb, stride_cs, stride_ch, block_size, max_blocks, num_blocks, D: tl.constexpr,
            BLOCK_N: tl.constexpr, QB: tl.constexpr, TMA: tl.constexpr, STAGES: tl.constexpr):
    """_attend_range_tma (TMA) or _attend_range (gather)."""
    if TMA:
        out, lse = _attend_range_tma(q_ptr, k_cache_ptr, v_cache_ptr, bt_row, b, kvh, hq, rmask, n_lo, n_hi, scale,
                                     stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, block_size, num_blocks,
                                     D, BLOCK_N, QB, STAGES)
    else:
        out, lse = _attend_range(q_ptr, k_cache_ptr, v_cache_ptr, bt_row, b, kvh, hq, rmask, n_lo, n_hi, scale,
                                 stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, block_size, max_blocks,
                                 num_blocks, D, BLOCK_N, QB)
    return out, lse


LSE_BLOCK = tl.constexpr(64)  # splits per lse load of the combine (the default split cap, 64: one load)


@triton.jit
def _split_range(seqlen_ptr, b, split, num_splits, max_blocks, block_size, BLOCK_N: tl.constexpr):
    """Sequence b's clamped length and split `split`'s key range [n_lo, n_hi) (empty past the end)."""
    L = tl.minimum(tl.maximum(tl.load(seqlen_ptr + b), 0), max_blocks * block_size)
    kps = ((L + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    n_lo = split * kps
    return n_lo, tl.minimum(n_lo + kps, L)


@triton.jit
def _split_partials(q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seqlen_ptr, part_o_ptr, part_lse_ptr,
                    scale, num_kv_heads, group, num_splits,
                    stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
                    block_size, max_blocks, num_blocks,
                    D: tl.constexpr, BLOCK_N: tl.constexpr, QB: tl.constexpr, TMA: tl.constexpr,
                    STAGES: tl.constexpr):
    """This program's split of one (sequence, kv head): attend over its key range and store the group's normalized
    partial outputs and log2-sum-exps at rows (b * Hq + hq) * num_splits + split (lse -inf: an empty split).
    Returns what a merge of the group needs: (b, b * Hkv + kv head, q heads, their mask, first partial row)."""
    pid = tl.program_id(0)
    split = pid % num_splits
    bh = pid // num_splits
    kvh = bh % num_kv_heads
    b = (bh // num_kv_heads).to(tl.int64)
    num_q_heads = num_kv_heads * group
    n_lo, n_hi = _split_range(seqlen_ptr, b, split, num_splits, max_blocks, block_size, BLOCK_N)
    r = tl.arange(0, QB)
    rmask = r < group
    hq = kvh * group + r
    prow0 = (b * num_q_heads + hq) * num_splits  # int64, split 0 of each q row
    if n_lo < n_hi:
        d = tl.arange(0, D)
        out, lse = _attend(q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr + b * stride_bt, b, kvh, hq, rmask, n_lo, n_hi,
                           scale, stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, block_size, max_blocks,
                           num_blocks, D, BLOCK_N, QB, TMA, STAGES)
        tl.store(part_o_ptr + (prow0 + split)[:, None] * D + d[None, :], out, mask=rmask[:, None])
        tl.store(part_lse_ptr + prow0 + split, lse, mask=rmask)
    else:
        tl.store(part_lse_ptr + prow0 + split, tl.full([QB], float("-inf"), tl.float32), mask=rmask)
    return b, bh, hq, rmask, prow0


@triton.jit
def decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seqlen_ptr, part_o_ptr, part_lse_ptr,
                        scale, num_kv_heads, group, num_splits,
                        stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
                        block_size, max_blocks, num_blocks,
                        D: tl.constexpr, BLOCK_N: tl.constexpr, QB: tl.constexpr, PDL: tl.constexpr,
                        TMA: tl.constexpr, STAGES: tl.constexpr):
    pdl_enter(PDL)
    _split_partials(q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seqlen_ptr, part_o_ptr, part_lse_ptr,
                    scale, num_kv_heads, group, num_splits, stride_qb, stride_qh, stride_cb, stride_cs, stride_ch,
                    stride_bt, block_size, max_blocks, num_blocks, D, BLOCK_N, QB, TMA, STAGES)


@triton.jit
def decode_fused_kernel(q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seqlen_ptr, part_o_ptr, part_lse_ptr, count_ptr,
                        o_ptr, gate_ptr, scale, num_kv_heads, group, num_splits,
                        stride_qb, stride_qh, stride_ob, stride_oh, stride_gb, stride_gh,
                        stride_cb, stride_cs, stride_ch, stride_bt, block_size, max_blocks, num_blocks,
                        D: tl.constexpr, BLOCK_N: tl.constexpr, QB: tl.constexpr, HAS_GATE: tl.constexpr,
                        PDL: tl.constexpr, TMA: tl.constexpr, STAGES: tl.constexpr):
    pdl_enter(PDL)
    b, bh, hq, rmask, prow0 = _split_partials(
        q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seqlen_ptr, part_o_ptr, part_lse_ptr, scale, num_kv_heads, group,
        num_splits, stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt, block_size, max_blocks,
        num_blocks, D, BLOCK_N, QB, TMA, STAGES)
    d = tl.arange(0, D)
    tl.debug_barrier()  # every thread's partials are written before the ticket is taken (release below)
    ticket = tl.atomic_add(count_ptr + bh, 1, sem="acq_rel", scope="gpu")
    if ticket == num_splits - 1:  # the other splits of this (b, kv head) have published their partials
        m_run = tl.full([QB], float("-inf"), tl.float32)
        l_run = tl.zeros([QB], tl.float32)
        acc = tl.zeros([QB, D], tl.float32)
        for s in range(0, num_splits):
            # .cg: read at L2, where the other programs' partials are (never cached in this SM's L1 before)
            lse = tl.load(part_lse_ptr + prow0 + s, mask=rmask, other=float("-inf"), cache_modifier=".cg")
            live = lse > float("-inf")
            m_new = tl.maximum(m_run, lse)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_run - m_use)
            w = tl.where(live, tl.exp2(lse - m_use), 0.0)
            po = tl.load(part_o_ptr + (prow0 + s)[:, None] * D + d[None, :], mask=live[:, None], other=0.0,
                         cache_modifier=".cg")
            acc = acc * alpha[:, None] + w[:, None] * po
            l_run = l_run * alpha + w
            m_run = m_new
        res = acc / tl.where(l_run > 0.0, l_run, 1.0)[:, None]
        if HAS_GATE:
            g = tl.load(gate_ptr + b * stride_gb + hq[:, None] * stride_gh + d[None, :], mask=rmask[:, None],
                        other=0.0).to(tl.float32)
            res = res * sigmoid_f32(g)
        tl.store(o_ptr + b * stride_ob + hq[:, None] * stride_oh + d[None, :], res.to(tl.bfloat16),
                 mask=rmask[:, None])
        tl.atomic_xchg(count_ptr + bh, 0, sem="relaxed", scope="gpu")  # ready for the next launch


@triton.jit
def decode_direct_kernel(q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seqlen_ptr, o_ptr, gate_ptr,
                         scale, num_kv_heads, group,
                         stride_qb, stride_qh, stride_ob, stride_oh, stride_gb, stride_gh,
                         stride_cb, stride_cs, stride_ch, stride_bt, block_size, max_blocks, num_blocks,
                         D: tl.constexpr, BLOCK_N: tl.constexpr, QB: tl.constexpr, HAS_GATE: tl.constexpr,
                         PDL: tl.constexpr, TMA: tl.constexpr, STAGES: tl.constexpr):
    """One split: grid (B * Hkv,), program p takes (b, kv head) = divmod(p, Hkv), attends over all L keys
    and writes o[b, h] (bf16, times sigmoid(gate) when HAS_GATE) directly: no partials, no combine launch.
    L <= 0 writes zeros."""
    pdl_enter(PDL)
    pid = tl.program_id(0)
    kvh = pid % num_kv_heads
    b = (pid // num_kv_heads).to(tl.int64)
    L = tl.minimum(tl.maximum(tl.load(seqlen_ptr + b), 0), max_blocks * block_size)
    r = tl.arange(0, QB)
    rmask = r < group
    hq = kvh * group + r
    d = tl.arange(0, D)
    out = tl.zeros([QB, D], tl.float32)
    lse = tl.full([QB], float("-inf"), tl.float32)
    if L > 0:
        out, lse = _attend(q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr + b * stride_bt, b, kvh, hq, rmask, 0, L,
                           scale, stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, block_size, max_blocks,
                           num_blocks, D, BLOCK_N, QB, TMA, STAGES)
    if HAS_GATE:
        g = tl.load(gate_ptr + b * stride_gb + hq[:, None] * stride_gh + d[None, :], mask=rmask[:, None],
                    other=0.0).to(tl.float32)
        out = out * sigmoid_f32(g)
    tl.store(o_ptr + b * stride_ob + hq[:, None] * stride_oh + d[None, :], out.to(tl.bfloat16),
             mask=rmask[:, None])


@triton.jit
def decode_combine_kernel(part_o_ptr, part_lse_ptr, o_ptr, gate_ptr, num_q_heads, num_splits,
                          stride_ob, stride_oh, stride_gb, stride_gh,
                          D: tl.constexpr, SPLIT_BLOCK: tl.constexpr, HAS_GATE: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    h = pid % num_q_heads
    b = (pid // num_q_heads).to(tl.int64)
    base = pid.to(tl.int64) * num_splits  # == (b * Hq + h) * num_splits
    d = tl.arange(0, D)
    # three independent loads in flight at once: the first SPLIT_BLOCK splits' lse and partials, and every
    # split's lse (max and last live split); later blocks only up to the last live split
    sp = tl.arange(0, SPLIT_BLOCK)
    lse = tl.load(part_lse_ptr + base + sp, mask=sp < num_splits, other=float("-inf"))
    po = tl.load(part_o_ptr + (base + sp)[:, None] * D + d[None, :], mask=(sp < num_splits)[:, None], other=0.0)
    lse_all = tl.load(part_lse_ptr + base + tl.arange(0, LSE_BLOCK), mask=tl.arange(0, LSE_BLOCK) < num_splits,
                      other=float("-inf"))
    m_run = tl.max(lse_all, 0)
    last = tl.max(tl.where(lse_all > float("-inf"), tl.arange(0, LSE_BLOCK), -1), 0)
    for s0 in range(LSE_BLOCK, num_splits, LSE_BLOCK):  # more splits than one lse load covers
        spl = s0 + tl.arange(0, LSE_BLOCK)
        lse_more = tl.load(part_lse_ptr + base + spl, mask=spl < num_splits, other=float("-inf"))
        m_run = tl.maximum(m_run, tl.max(lse_more, 0))
        last = tl.maximum(last, tl.max(tl.where(lse_more > float("-inf"), spl, -1), 0))
    m_use = tl.where(m_run == float("-inf"), 0.0, m_run)
    live = lse > float("-inf")  # a dead split's stale partial (any bits, NaN included) is dropped by the select
    w = tl.where(live, tl.exp2(lse - m_use), 0.0)
    acc = tl.sum(tl.where(live[:, None], w[:, None] * po, 0.0), 0)
    l_run = tl.sum(w, 0)
    for s0 in range(SPLIT_BLOCK, last + 1, SPLIT_BLOCK):
        sp = s0 + tl.arange(0, SPLIT_BLOCK)
        inb = sp <= last
        lse = tl.load(part_lse_ptr + base + sp, mask=inb, other=float("-inf"))
        po = tl.load(part_o_ptr + (base + sp)[:, None] * D + d[None, :], mask=inb[:, None], other=0.0)
        live = lse > float("-inf")
        w = tl.where(live, tl.exp2(lse - m_use), 0.0)
        acc += tl.sum(tl.where(live[:, None], w[:, None] * po, 0.0), 0)
        l_run += tl.sum(w, 0)
    out = acc / tl.where(l_run > 0.0, l_run, 1.0)
    if HAS_GATE:
        g = tl.load(gate_ptr + b * stride_gb + h * stride_gh + d).to(tl.float32)
        out = out * sigmoid_f32(g)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, out.to(tl.bfloat16))
