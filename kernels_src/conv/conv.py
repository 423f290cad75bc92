"""Depthwise causal conv1d (width W = 4, no bias) + SiLU over packed channels; bf16 in/out, fp32 math.

    y_t[c] = silu( sum_{j=0..W-1} w[c, j] * x_{t-(W-1)+j}[c] )

where inputs before a sequence's first token come from its conv state (zeros when it has none).

Conv-state layout (both kernels): ``conv_state[slot, r, c]`` bf16 of shape ``[slots, W-1, C]``, channels
contiguous (stride 1), row r = 0 the oldest input, r = W-2 the newest. Both kernels read and write rows of
channels, so every state access is a coalesced, vectorizable row segment (a ``[slots, C, W-1]`` layout would
give 6-byte strided pieces per channel). A slot is valid iff ``0 <= slot < num_slots``; an invalid
(negative / out of range) slot means "no state": zeros are read and nothing is written.

Grids:
  conv_prefill_kernel: (cdiv(T, SUB * BLOCK_T), cdiv(C, BLOCK_C))   axis 0 = block of packed tokens
  conv_update_kernel:  (B, cdiv(C, BLOCK_C))                  axis 0 = sequence
"""
import triton
import triton.language as tl

from kernels_src.common import floor16, pdl_enter, silu_f32


@triton.jit
def _seq_of(cu_ptr, t, N, n_iter):
    """Per token t (int32 vector) the s in [0, N) with cu[s] <= t < cu[s+1] (vectorized binary search).

    Invariant cu[lo] <= t < cu[hi]; n_iter >= bit_length(N) iterations shrink hi - lo to 1. Empty
    sequences (cu[s] == cu[s+1]) are skipped because the largest s with cu[s] <= t is kept."""
    lo = tl.zeros_like(t)
    hi = lo + N
    for _ in range(n_iter):
        mid = (lo + hi) // 2
        go = tl.load(cu_ptr + mid) <= t
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    return lo


@triton.jit
def _seq_rows(cu_ptr, t, T, N, n_iter):
    """Per row t (int32 vector, t >= 0): its sequence s (_seq_of), s's clamped rows [start, end) --
    start = clamp(cu[s], 0, T), end = clamp(cu[s+1], start, T) -- and whether t lies in them. Rows that
    do not (past T, outside [cu[0], cu[N]), no sequence at all, inconsistent offsets) belong to no
    sequence; whatever cu_seqlens holds, a member row's taps and state rows stay inside [0, T) and the
    slot's 3 rows."""
    in_range = t < T
    s = _seq_of(cu_ptr, tl.where(in_range, t, 0), N, n_iter)
    start = tl.minimum(tl.maximum(tl.load(cu_ptr + s), 0), T)
    end = tl.minimum(tl.maximum(tl.load(cu_ptr + s + 1, mask=s < N, other=0), start), T)  # N = 0: empty
    member = in_range & (t >= start) & (t < end)
    return s, start, end, member


@triton.jit
def _prefill_rows(t, c, cmask, blk_lo, blk_hi, x_ptr, w0, w1, w2, w3, y_ptr, state_ptr, cu_ptr, slot_ptr,
                  stride_x, stride_y, stride_ss, stride_sr, T, N, num_slots, n_iter, TAIL: tl.constexpr):
    """Compute and store y for the rows t this program owns (see conv_prefill_kernel)."""
    in_range = t < T
    s, start, end, member = _seq_rows(cu_ptr, t, T, N, n_iter)
    pos = t - start
    if TAIL:
        own = member & (pos < 3) & (start >= blk_lo) & (start < blk_hi)
    else:
        own = member & ((pos >= 3) | (start >= blk_lo))
    slot = tl.load(slot_ptr + s, mask=own, other=-1)
    has_state = own & (slot >= 0) & (slot < num_slots)
    srow = state_ptr + tl.where(has_state, slot, 0).to(tl.int64) * stride_ss
    xrow0 = x_ptr + t.to(tl.int64) * stride_x
    acc = tl.zeros((t.shape[0], c.shape[0]), dtype=tl.float32)
    for j in tl.static_range(4):
        if j == 0:
            wj = w0
        elif j == 1:
            wj = w1
        elif j == 2:
            wj = w2
        else:
            wj = w3
        # tap j of row t is input position p = pos - 3 + j of its sequence: x row t - 3 + j when p >= 0,
        # else conv-state row p + 3. Two masked loads, not one through a per-row pointer select: the select
        # defeats Triton's vectorization analysis (16-byte accesses become 2-byte ones).
        p = pos - 3 + j
        xv = tl.load((xrow0 + (j - 3) * stride_x)[:, None] + c[None, :],
                     mask=(own & (p >= 0))[:, None] & cmask[None, :], other=0.0)
        acc += wj[None, :] * xv.to(tl.float32)
        if j < 3:  # tap 3 is the token itself
            sv = tl.load((srow + (p + 3) * stride_sr)[:, None] + c[None, :],
                         mask=(has_state & (p < 0))[:, None] & cmask[None, :], other=0.0)
            acc += wj[None, :] * sv.to(tl.float32)
    y = tl.where(member[:, None], silu_f32(acc), 0.0)
    if TAIL:
        write = own
    else:
        write = own | (in_range & ~member)  # rows of no sequence (e.g. past cu_seqlens[N]) are defined as zeros
    tl.store(y_ptr + t.to(tl.int64)[:, None] * stride_y + c[None, :], y.to(tl.bfloat16), mask=write[:, None] & cmask[None, :])


@triton.jit
def _prefill_block(x_ptr, w_ptr, y_ptr, state_ptr, cu_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss,
                   stride_sr, T, C, N, num_slots, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, SUB: tl.constexpr):
    """One program: SUB * BLOCK_T packed tokens x BLOCK_C channels, in SUB row tiles (the weights, the
    sequence-search depth and the ownership bounds are set up once per program)."""
    blk_lo = tl.program_id(0) * (SUB * BLOCK_T)
    blk_hi = blk_lo + SUB * BLOCK_T
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    wrow = w_ptr + c.to(tl.int64) * stride_w
    w0 = tl.load(wrow + 0, mask=cmask, other=0.0).to(tl.float32)
    w1 = tl.load(wrow + 1, mask=cmask, other=0.0).to(tl.float32)
    w2 = tl.load(wrow + 2, mask=cmask, other=0.0).to(tl.float32)
    w3 = tl.load(wrow + 3, mask=cmask, other=0.0).to(tl.float32)
    n_iter = 0
    m = N
    while m > 0:
        m = m // 2
        n_iter += 1

    # 1) rows of this block; 2) the first W-1 = 3 tokens of sequences that start in this block but spill
    #    into the next one (they read the initial state, which only this program touches)
    for i in range(SUB):
        _prefill_rows(blk_lo + i * BLOCK_T + tl.arange(0, BLOCK_T), c, cmask, blk_lo, blk_hi, x_ptr, w0, w1, w2,
                      w3, y_ptr, state_ptr, cu_ptr, slot_ptr, stride_x, stride_y, stride_ss, stride_sr, T, N,
                      num_slots, n_iter, False)
    _prefill_rows(blk_hi + tl.arange(0, 4), c, cmask, blk_lo, blk_hi, x_ptr, w0, w1, w2, w3, y_ptr,
                  state_ptr, cu_ptr, slot_ptr, stride_x, stride_y, stride_ss, stride_sr, T, N, num_slots,
                  n_iter, True)

    # 3) final conv state of every sequence starting in this block: the last 3 inputs (x rows, or the old
    #    state's rows when the sequence is shorter than 3). The y rows above read the old state of the same
    #    slots: every thread is past them (barrier) before any state row is stored.
    tl.debug_barrier()
    for i in range(SUB):
        t = blk_lo + i * BLOCK_T + tl.arange(0, BLOCK_T)
        s, start, end, member = _seq_rows(cu_ptr, t, T, N, n_iter)
        first = member & (t == start)  # a non-empty sequence's first row
        ln = end - start  # >= 1 where first
        slot = tl.load(slot_ptr + s, mask=first, other=-1)
        first = first & (slot >= 0) & (slot < num_slots)
        srow = state_ptr + tl.where(first, slot, 0).to(tl.int64) * stride_ss
        m2 = first[:, None] & cmask[None, :]
        xs = x_ptr + start.to(tl.int64) * stride_x
        # new row r = input position ln - 3 + r: x row start + q when q >= 0, else old state row q + 3;
        # all three are loaded before any is stored (they may read rows of the same slot)
        q0 = ln - 3
        q1 = ln - 2
        q2 = ln - 1
        n0 = tl.load(tl.where(q0 >= 0, xs + q0 * stride_x, srow + (q0 + 3) * stride_sr)[:, None] + c[None, :],
                     mask=m2)
        n1 = tl.load(tl.where(q1 >= 0, xs + q1 * stride_x, srow + (q1 + 3) * stride_sr)[:, None] + c[None, :],
                     mask=m2)
        n2 = tl.load(tl.where(q2 >= 0, xs + q2 * stride_x, srow + (q2 + 3) * stride_sr)[:, None] + c[None, :],
                     mask=m2)
        tl.debug_barrier()
        tl.store(srow[:, None] + c[None, :], n0, mask=m2)
        tl.store(srow[:, None] + stride_sr + c[None, :], n1, mask=m2)
        tl.store(srow[:, None] + 2 * stride_sr + c[None, :], n2, mask=m2)


@triton.jit
def conv_prefill_kernel(x_ptr, w_ptr, y_ptr, state_ptr, cu_ptr, slot_ptr, stride_x, stride_w, stride_y,
                        stride_ss, stride_sr, T, C, N, num_slots,
                        W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, SUB: tl.constexpr):
    """Varlen causal conv1d + SiLU over packed tokens x [T, C] -> y [T, C], conv state read and written back.

    x, y: [T, C] bf16 (row strides stride_x, stride_y); w: [C, W] bf16 (row stride stride_w);
    cu_seqlens int32 [N + 1] (cu[0] = 0, non-decreasing, cu[N] <= T: rows at or past cu[N] get zeros);
    slot_idx int32 [N]; state bf16 [num_slots, W-1, C] with strides (stride_ss, stride_sr, 1). With no
    state pass num_slots = 0 (state/slot pointers are then never dereferenced for state, slot_ptr must
    still be readable: pass cu_ptr). Valid slots must be distinct among the sequences of one launch.

    Device-side indices: whatever cu_seqlens and slot_idx hold, only rows [0, T) of x and y, rows 0..W-2
    of slots in [0, num_slots), and cu_seqlens[0..N], slot_idx[0..N-1] are touched. Sequence s covers
    the clamped rows [clamp(cu[s], 0, T), clamp(cu[s+1], that, T)) (a decreasing offset: empty; an offset
    past T: cut at T, rows past T are never touched); every row of [0, T) in no sequence is written as
    zeros. With non-monotone offsets (overlapping sequences) each row is computed for at most one
    sequence (unspecified which). Duplicate valid slots: those sequences' results and the slot's final
    content are unspecified (one writer wins), nothing else changes.

    Ownership (no cross-program race on the in-place state): a token at position >= W-1 in its sequence
    belongs to the block holding it; the first W-1 tokens of a sequence (the only ones reading its
    initial state) belong to the block holding the sequence's first token, which also writes the final
    state. A block is SUB * BLOCK_T tokens. Grid (cdiv(T, SUB * BLOCK_T), cdiv(C, BLOCK_C)). y must not
    overlap x.
    """
    tl.static_assert(W == 4, "conv kernels are written for width 4")
    if C % 16 == 0:
        _prefill_block(x_ptr, w_ptr, y_ptr, state_ptr, cu_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss,
                       stride_sr, T, floor16(C), N, num_slots, BLOCK_T, BLOCK_C, SUB)
    else:
        _prefill_block(x_ptr, w_ptr, y_ptr, state_ptr, cu_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss,
                       stride_sr, T, C, N, num_slots, BLOCK_T, BLOCK_C, SUB)


@triton.jit
def _update_block(x_ptr, w_ptr, y_ptr, state_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss, stride_sr,
                  C, num_slots, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    pdl_enter(PDL)
    slot = tl.load(slot_ptr + b)
    ok = (slot >= 0) & (slot < num_slots)
    srow = state_ptr + tl.where(ok, slot, 0).to(tl.int64) * stride_ss + c
    slot_v = tl.zeros_like(c) + slot  # (a scalar bool & vector mask breaks Triton 3.9's interpreter)
    smask = cmask & (slot_v >= 0) & (slot_v < num_slots)
    s0 = tl.load(srow, mask=smask, other=0.0)
    s1 = tl.load(srow + stride_sr, mask=smask, other=0.0)
    s2 = tl.load(srow + 2 * stride_sr, mask=smask, other=0.0)
    xv = tl.load(x_ptr + b * stride_x + c, mask=smask, other=0.0)
    wrow = w_ptr + c.to(tl.int64) * stride_w
    acc = tl.load(wrow + 0, mask=cmask, other=0.0).to(tl.float32) * s0.to(tl.float32)
    acc += tl.load(wrow + 1, mask=cmask, other=0.0).to(tl.float32) * s1.to(tl.float32)
    acc += tl.load(wrow + 2, mask=cmask, other=0.0).to(tl.float32) * s2.to(tl.float32)
    acc += tl.load(wrow + 3, mask=cmask, other=0.0).to(tl.float32) * xv.to(tl.float32)
    y = tl.where(ok, silu_f32(acc), 0.0)
    tl.store(y_ptr + b * stride_y + c, y.to(tl.bfloat16), mask=cmask)
    # roll: same thread, same channels -> loads above precede these stores in program order
    tl.store(srow, s1, mask=smask)
    tl.store(srow + stride_sr, s2, mask=smask)
    tl.store(srow + 2 * stride_sr, xv, mask=smask)


@triton.jit
def conv_update_kernel(x_ptr, w_ptr, y_ptr, state_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss,
                       stride_sr, C, num_slots, W: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    """Decode step: one token per sequence. x, y [B, C] bf16; state [num_slots, W-1, C] rolled in place:
    y[b] = silu(w . [state rows, x[b]]), state rows <- [rows 1.., x[b]]. Invalid slot: y[b] = 0, no state
    access. Grid (B, cdiv(C, BLOCK_C)). y may alias x (each element is read before it is written by the same
    thread)."""
    tl.static_assert(W == 4, "conv kernels are written for width 4")
    if C % 16 == 0:
        _update_block(x_ptr, w_ptr, y_ptr, state_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss, stride_sr,
                      floor16(C), num_slots, BLOCK_C, PDL)
    else:
        _update_block(x_ptr, w_ptr, y_ptr, state_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss, stride_sr,
                      C, num_slots, BLOCK_C, PDL)
