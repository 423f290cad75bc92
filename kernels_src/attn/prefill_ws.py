"""Warp-specialised causal prefill for sm_90a in Gluon (FlashAttention-3 structure; Shah et al. 2024), with the
ABI and the device-side bound rules of ``prefill.py``'s TMA path (varlen, paged cache, block_size % BLOCK_N == 0).

STATUS: compile-verified only (no GPU was lent when it was written). No spec builds it yet: the session record
``benchmarks/results/2026-12-08-session38/variants.py`` compiles it in place of the sm_90a ``.tma`` prefills
(D = 256 and 128) for an A/B against those kernels and cuDNN, which decides whether it replaces them. Its CPU
tests: ``tests/test_attn_prefill_ws_compile.py`` (it compiles with the spec's ABI; SASS structure) and
``tests/test_attn_prefill_ws_protocol.py`` (models: its barrier protocol never hangs; its tile arithmetic in
float64 equals causal attention).

A program owns one 128-row m-block of one query head (the grid and block scan of ``prefill.py``). Three
partitions share its shared memory:

* producer (worker 1, one warp, 24 registers): streams key and value tiles of BLOCK_N slots of one cache block by
  TMA into a STAGES-deep ring. K and V have their own slots and barriers: ``k_full`` / ``v_full`` (TMA
  transaction barriers, so a consumer's QK^T starts before V lands) and ``empty`` (K slots at 0..STAGES - 1, V
  slots at STAGES..2 STAGES - 1; two arrivals each: both consumers are done with it). A K slot is released as
  soon as its QK^T is in, so the next key tile loads while the PV of the previous one still reads its V slot.
  Tiles at or past the start of the sequence's last cache block come through descriptors that end at L, so slots
  past L read as zeros (stale slots may hold NaN, and 0 * NaN would poison a row); an id outside [0, num_blocks)
  reads block 0 (in bounds). These are ``prefill.py``'s rules.
* two consumers (the default partition and worker 0, four warps = one warp group each, 240 registers): query
  rows 0..63 and 64..127 of the m-block. Each copies its Q rows into shared memory once, then per key tile:
  S = Q K^T (wgmma, both operands in shared memory), online softmax in registers (exp2 domain), O += P V (wgmma,
  P from registers). Intra-warpgroup overlap: the QK^T of tile i and the PV of tile i - 1 are issued together,
  the softmax of tile i runs while the PV is still on the tensor cores, and O is rescaled once it lands. The
  output goes through the warp group's Q slot, so each thread stores 16 contiguous bytes.
  PINGPONG: the two warp groups issue their GEMMs in turn (an mbarrier pair), so one's softmax overlaps the
  other's GEMMs. Every consumer takes the same n_tiles + 1 turns: one per GEMM issue, then one per tile it only
  releases (past its own rows), in tile order. Turn k of one warp group waits for turn k - 1 (or k) of the other;
  releasing tile i waits for the load of tile i, which waits for both to release tile i - STAGES: with the
  releases and the turns in tile order neither chain waits for a later turn of the waiting warp group.

Masking per warp group: tiles entirely below its first row's diagonal and below L // BLOCK_N * BLOCK_N take no
mask; the others mask keys past each row's position and past L. Rows past q_len compute but are never stored;
rows that see no key (only for inconsistent lengths, L < q_len) store zeros. HAS_GATE: out *= sigmoid(gate).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

WM = gl.constexpr(64)  # query rows per consumer warp group (the wgmma M of one warp group)


@gluon.jit
def _min_i32(a, b):
    return gl.minimum(a, b)


@gluon.jit
def _find_block(cu_ptr, r, num_seqs, num_tokens, BLOCK_M: gl.constexpr, SEQ_CHUNK: gl.constexpr):
    """(sequence, m-block) of the r-th packed m-block counted from the end: ``prefill.py``'s ``_find_block``
    (same processed-sequence rule) written with explicit layouts."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    seq = -1
    mb = -1
    after = 0
    bot = num_tokens
    n_chunks = (num_seqs + SEQ_CHUNK - 1) // SEQ_CHUNK
    for j in range(0, n_chunks):
        idx = (n_chunks - 1 - j) * SEQ_CHUNK + gl.arange(0, SEQ_CHUNK, layout=lay)
        msk = idx < num_seqs
        lo = gl.load(cu_ptr + idx, mask=msk, other=0)
        hi = gl.load(cu_ptr + idx + 1, mask=msk, other=2147483647)
        later = gl.minimum(gl.associative_scan(hi, 0, _min_i32, reverse=True), bot)
        ok = msk & (lo >= 0) & (lo <= hi) & (hi <= later)
        ln = gl.where(ok, hi, lo) - lo
        nb = (ln + BLOCK_M - 1) // BLOCK_M
        incl = gl.cumsum(nb, 0, reverse=True) + after
        excl = incl - nb
        hit = (r >= excl) & (r < incl)
        seq = gl.maximum(seq, gl.max(gl.where(hit, idx, -1), 0))
        mb = gl.maximum(mb, gl.max(gl.where(hit, nb - 1 - (r - excl), -1), 0))
        after += gl.sum(nb, 0)
        bot = gl.minimum(bot, gl.min(hi, 0))
    return seq, mb


@gluon.jit
def _producer(k_desc, v_desc, k_tail, v_tail, k_smem, v_smem, k_full, v_full, empty, bt_row, col, n_end, n_tail,
              block_size, num_blocks, rows_per_block):
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    nbytes: gl.constexpr = k_desc.block_type.nbytes
    n_tiles = (n_end + BLOCK_N - 1) // BLOCK_N
    for i in range(n_tiles):
        slot = i % STAGES
        free = ((i // STAGES) & 1) ^ 1  # the first pass over the ring waits for nothing
        n = i * BLOCK_N
        if n < n_tail:
            blk = gl.load(bt_row + n // block_size)
            row0 = gl.where((blk >= 0) & (blk < num_blocks), blk, 0) * rows_per_block + n % block_size
            mbarrier.wait(empty.index(slot), free)
            mbarrier.expect(k_full.index(slot), nbytes)
            tma.async_load(k_desc, [row0, col], k_full.index(slot), k_smem.index(slot))
            mbarrier.wait(empty.index(STAGES + slot), free)
            mbarrier.expect(v_full.index(slot), nbytes)
            tma.async_load(v_desc, [row0, col], v_full.index(slot), v_smem.index(slot))
        else:
            mbarrier.wait(empty.index(slot), free)
            mbarrier.expect(k_full.index(slot), nbytes)
            tma.async_load(k_tail, [n - n_tail, col], k_full.index(slot), k_smem.index(slot))
            mbarrier.wait(empty.index(STAGES + slot), free)
            mbarrier.expect(v_full.index(slot), nbytes)
            tma.async_load(v_tail, [n - n_tail, col], v_full.index(slot), v_smem.index(slot))


@gluon.jit
def _softmax(s, m_i, l_i, pos, n, n_full, L, qk_scale, s_layout: gl.constexpr):
    """One tile's online-softmax step: (p, alpha, m, l); keys past a row's position or past L masked unless the
    whole tile lies below n_full."""
    BLOCK_N: gl.constexpr = s.shape[1]
    if n + BLOCK_N <= n_full:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * qk_scale - m_new[:, None])
    else:
        offs_n = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        vis = (offs_n[None, :] <= pos[:, None]) & (offs_n[None, :] < L)
        s = gl.where(vis, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _turn(turn, wg, k, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.wait(turn.index(wg), k & 1)


@gluon.jit
def _pass(turn, wg, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - wg), count=1)


@gluon.jit
def _consumer(wg: gl.constexpr, q_smem, k_smem, v_smem, k_full, v_full, empty, turn, q_ptr, o_ptr, gate_ptr,
              q_start, q_len, m0, h, ctx0, L, n_end, qk_scale, stride_qt, stride_qh, stride_ot, stride_oh, stride_gt,
              stride_gh, HAS_GATE: gl.constexpr, PINGPONG: gl.constexpr):
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    D: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    # this warp group's query rows -> its Q slot (rows past q_len read as zeros)
    r0 = m0 + wg * WM
    q_sl = q_smem.index(wg)
    for c in gl.static_range(0, D, 64):
        rows = r0 + gl.arange(0, WM, layout=gl.SliceLayout(1, ld_layout))
        cols = c + gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout))
        tok = (q_start + rows).to(gl.int64)
        x = gl.load(q_ptr + tok[:, None] * stride_qt + h * stride_qh + cols[None, :], mask=(rows < q_len)[:, None],
                    other=0.0)
        q_sl.slice(c, 64, dim=1).store(x)
    fence_async_shared()

    pos = ctx0 + r0 + gl.arange(0, WM, layout=row_s)
    # keys [0, n_full) are visible to every row of this warp group; its last row sees keys up to n_mine
    n_full = gl.maximum(gl.minimum((ctx0 + r0 + 1) // BLOCK_N * BLOCK_N, L // BLOCK_N * BLOCK_N), 0)
    n_mine = gl.minimum(ctx0 + gl.minimum(r0 + WM, q_len), L)
    n_tiles = (n_end + BLOCK_N - 1) // BLOCK_N
    my_tiles = gl.where(r0 < q_len, gl.maximum((n_mine + BLOCK_N - 1) // BLOCK_N, 0), 0)

    m_i = gl.full([WM], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([WM], gl.float32, layout=row_s)
    acc = gl.zeros([WM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([WM, BLOCK_N], gl.float32, layout=s_layout)
    done = 0  # turns taken
    if my_tiles > 0:
        mbarrier.wait(k_full.index(0), 0)
        _turn(turn, wg, 0, PINGPONG)
        s = warpgroup_mma(q_sl, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _pass(turn, wg, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        mbarrier.arrive(empty.index(0), count=1)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, pos, 0, n_full, L, qk_scale, s_layout)
        for i in range(1, my_tiles):
            slot = i % STAGES
            prev = (i - 1) % STAGES
            mbarrier.wait(k_full.index(slot), (i // STAGES) & 1)
            mbarrier.wait(v_full.index(prev), ((i - 1) // STAGES) & 1)
            pa = gl.convert_layout(p.to(gl.bfloat16), p_layout)
            _turn(turn, wg, i, PINGPONG)
            s = warpgroup_mma(q_sl, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(pa, v_smem.index(prev), acc, is_async=True)
            _pass(turn, wg, PINGPONG)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))  # S_i is in; P_{i-1} V_{i-1} may still run
            mbarrier.arrive(empty.index(slot), count=1)
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, pos, i * BLOCK_N, n_full, L, qk_scale, s_layout)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(empty.index(STAGES + prev), count=1)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        last = (my_tiles - 1) % STAGES
        mbarrier.wait(v_full.index(last), ((my_tiles - 1) // STAGES) & 1)
        pa = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        _turn(turn, wg, my_tiles, PINGPONG)
        acc = warpgroup_mma(pa, v_smem.index(last), acc, is_async=True)
        _pass(turn, wg, PINGPONG)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index(STAGES + last), count=1)
        done = my_tiles + 1
    # tiles only the other warp group reads: release them (the ring's phases) and take one turn each, in tile
    # order, so the other warp group's turns never wait behind this one's drain (every warp group takes
    # n_tiles + 1 turns)
    for i in range(my_tiles, n_tiles):
        slot = i % STAGES
        mbarrier.wait(k_full.index(slot), (i // STAGES) & 1)
        mbarrier.wait(v_full.index(slot), (i // STAGES) & 1)
        mbarrier.arrive(empty.index(slot), count=1)
        mbarrier.arrive(empty.index(STAGES + slot), count=1)
        _turn(turn, wg, done, PINGPONG)
        _pass(turn, wg, PINGPONG)
        done += 1
    for k in range(done, n_tiles + 1):
        _turn(turn, wg, k, PINGPONG)
        _pass(turn, wg, PINGPONG)

    l_o = gl.convert_layout(l_i, row_o)
    out = acc / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
    if HAS_GATE:  # the gate in the accumulator's layout, so the product is rounded to bf16 once
        rows = r0 + gl.arange(0, WM, layout=row_o)
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        tok = (q_start + rows).to(gl.int64)
        g = gl.load(gate_ptr + tok[:, None] * stride_gt + h * stride_gh + cols[None, :], mask=(rows < q_len)[:, None],
                    other=0.0).to(gl.float32)
        out = out / (1.0 + gl.exp(-g))
    # through this warp group's Q slot (its last QK^T is done) so that each thread stores 16 contiguous bytes
    q_sl.store(out.to(gl.bfloat16))
    for c in gl.static_range(0, D, 64):
        rows = r0 + gl.arange(0, WM, layout=gl.SliceLayout(1, ld_layout))
        cols = c + gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout))
        tok = (q_start + rows).to(gl.int64)
        gl.store(o_ptr + tok[:, None] * stride_ot + h * stride_oh + cols[None, :],
                 q_sl.slice(c, 64, dim=1).load(ld_layout), mask=(rows < q_len)[:, None])


@gluon.jit
def prefill_ws_kernel(q_ptr, k_cache_ptr, v_cache_ptr, o_ptr, gate_ptr, bt_ptr, cu_ptr, seqlen_ptr,
                      scale, num_seqs, num_tokens, num_q_heads, group,
                      stride_qt, stride_qh, stride_ot, stride_oh, stride_gt, stride_gh,
                      stride_cb, stride_cs, stride_ch, stride_bt, block_size, max_blocks, num_blocks,
                      D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HAS_GATE: gl.constexpr,
                      SEQ_CHUNK: gl.constexpr, TMA: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr):
    gl.static_assert(BLOCK_M == 2 * WM, "two consumer warp groups of 64 rows")
    gl.static_assert(TMA, "the TMA path only")
    gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warp group")
    pid = gl.program_id(0)
    h = pid % num_q_heads
    seq, mb = _find_block(cu_ptr, pid // num_q_heads, num_seqs, num_tokens, BLOCK_M, SEQ_CHUNK)
    if seq >= 0:
        q_start = gl.load(cu_ptr + seq)
        q_len = gl.load(cu_ptr + seq + 1) - q_start
        L = gl.minimum(gl.maximum(gl.load(seqlen_ptr + seq), 0), max_blocks * block_size)
        ctx0 = L - q_len  # absolute position of the first new token
        bt_row = bt_ptr + seq.to(gl.int64) * stride_bt
        m0 = mb * BLOCK_M
        n_end = gl.maximum(gl.minimum(ctx0 + gl.minimum(m0 + BLOCK_M, q_len), L), 0)
        n_tail = L // block_size * block_size  # the start of the sequence's last (partial) cache block
        qk_scale = scale * 1.4426950408889634

        # the cache as a 2-D [num_blocks * rows_per_block, Hkv * D] matrix of slot rows
        rows_per_block = (stride_cb // stride_cs).to(gl.int32)
        col = (h // group) * stride_ch
        kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.bfloat16)
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WM, D], gl.bfloat16)
        k_desc = tma.make_tensor_descriptor(k_cache_ptr, [num_blocks * rows_per_block, stride_cs], [stride_cs, 1],
                                            [BLOCK_N, D], kv_layout)
        v_desc = tma.make_tensor_descriptor(v_cache_ptr, [num_blocks * rows_per_block, stride_cs], [stride_cs, 1],
                                            [BLOCK_N, D], kv_layout)
        blk = gl.load(bt_row + n_tail // block_size, mask=n_tail < L, other=0)
        blk = gl.where((blk >= 0) & (blk < num_blocks), blk, 0).to(gl.int64)
        n_last = gl.maximum(L - n_tail, 1)  # rows of the last block's descriptors (none is read when L == n_tail)
        k_tail = tma.make_tensor_descriptor(k_cache_ptr + blk * stride_cb, [n_last, stride_cs], [stride_cs, 1],
                                            [BLOCK_N, D], kv_layout)
        v_tail = tma.make_tensor_descriptor(v_cache_ptr + blk * stride_cb, [n_last, stride_cs], [stride_cs, 1],
                                            [BLOCK_N, D], kv_layout)

        q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, WM, D], q_layout)
        k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D], kv_layout)
        v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D], kv_layout)
        k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_full.index(i), count=1)
            mbarrier.init(v_full.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
            mbarrier.init(empty.index(STAGES + i), count=2)
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        if PINGPONG:
            mbarrier.arrive(turn.index(0), count=1)  # warp group 0 takes the first turn

        gl.warp_specialize([
            (_consumer, (gl.constexpr(0), q_smem, k_smem, v_smem, k_full, v_full, empty, turn, q_ptr, o_ptr,
                         gate_ptr, q_start, q_len, m0, h, ctx0, L, n_end, qk_scale, stride_qt, stride_qh, stride_ot,
                         stride_oh, stride_gt, stride_gh, gl.constexpr(HAS_GATE), gl.constexpr(PINGPONG))),
            (_consumer, (gl.constexpr(1), q_smem, k_smem, v_smem, k_full, v_full, empty, turn, q_ptr, o_ptr,
                         gate_ptr, q_start, q_len, m0, h, ctx0, L, n_end, qk_scale, stride_qt, stride_qh, stride_ot,
                         stride_oh, stride_gt, stride_gh, gl.constexpr(HAS_GATE), gl.constexpr(PINGPONG))),
            (_producer, (k_desc, v_desc, k_tail, v_tail, k_smem, v_smem, k_full, v_full, empty, bt_row, col, n_end,
                         n_tail, block_size, num_blocks, rows_per_block)),
        ], [4, 1], [240, 24])
