"""Depthwise causal conv1d (width W = 4, no bias) + SiLU over packed channels; bf16 in/out, fp32 math.

    y_t[c] = silu( sum_{j=0..W-1} w[c, j] * x_{t-(W-1)+j}[c] )

where inputs before a sequence's first token come from its conv state (zeros when it has none).

Conv-state layout (both kernels): ``conv_state[slot, r, c]`` bf16 of shape ``[slots, W-1, C]``, channels
contiguous (stride 1), row r = 0 the oldest input, r = W-2 the newest. Both kernels read and write rows of
channels, so every state access is a coalesced, vectorizable row segment (a ``[slots, C, W-1]`` layout would
give 6-byte strided pieces per channel). A slot is valid iff ``0 <= slot < num_slots``; an invalid
(negative / out of range) slot means "no state": zeros are read and nothing is written.

Varlen prefill in two launches on one stream: conv_prefill_kernel computes every row from x alone (one pass,
no sequence search), then conv_heads_kernel recomputes each sequence's first W-1 rows with its conv state and
writes the final states (one program per sequence and channel block: a slot's old state is read and its new
state written by the same program).

Grids:
  conv_prefill_kernel: (cdiv(T, SUB * BLOCK_T), cdiv(C, BLOCK_C))   axis 0 = block of packed tokens
  conv_heads_kernel:   (N, cdiv(C, BLOCK_C))                        axis 0 = sequence
  conv_update_kernel:  (B, cdiv(C, BLOCK_C))                        axis 0 = sequence
"""
import triton
import triton.language as tl

from kernels_src.common import floor16, pdl_enter, silu_f32


@triton.jit
def _tap_row(x_ptr, r, c, cmask, lo, hi, stride_x):
    """Row r of x over channels c (bf16: the rows a program keeps cost half the registers of fp32); zeros outside
    [lo, hi) (so nothing outside rows [0, T) is read)."""
    rv = tl.zeros_like(c) + r  # (a scalar bool & vector mask breaks Triton 3.9's interpreter)
    return tl.load(x_ptr + r.to(tl.int64) * stride_x + c, mask=cmask & (rv >= lo) & (rv < hi), other=0.0)


@triton.jit
def _silu_approx(x):
    """x * sigmoid(x) with div.approx (2 ulp for denominators in [2^-126, 2^126]; past 2^126 -- x < -87 -- the
    quotient is -0 or a denormal, the exact value's bf16 is -0 too): the full-range division's range checks were a
    quarter of the body's instructions, and the body is close to its issue limit at HBM speed."""
    return tl.fdiv(x, 1.0 + tl.exp(-x), approx=True)


@triton.jit
def _out_row(y_ptr, t, c, cmask, lo, hi, T, stride_y, w0, w1, w2, w3, r0, r1, r2, r3):
    """y row t = silu(w0 r0 + w1 r1 + w2 r2 + w3 r3) (fp32; r0 the oldest input) for members of [lo, hi),
    zeros for the other rows of [0, T)."""
    acc = w0 * r0.to(tl.float32) + w1 * r1.to(tl.float32) + w2 * r2.to(tl.float32) + w3 * r3.to(tl.float32)
    tv = tl.zeros_like(c) + t
    y = tl.where((tv >= lo) & (tv < hi), _silu_approx(acc), 0.0)
    tl.store(y_ptr + t.to(tl.int64) * stride_y + c, y.to(tl.bfloat16), mask=cmask & (tv < T))


@triton.jit
def _body_block(x_ptr, w_ptr, y_ptr, cu_ptr, stride_x, stride_w, stride_y, T, C, N,
                BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, SUB: tl.constexpr):
    """Rows [t0, t0 + BLOCK_T * SUB) x BLOCK_C channels (see conv_prefill_kernel), walked BLOCK_T = 4 rows a step
    with the last three inputs kept in registers: each x row is loaded once by its program (plus the 3 rows
    before t0), the next step's 4 rows are loaded before this step's outputs are formed."""
    tl.static_assert(BLOCK_T == 4, "the body walks 4 rows a step")
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    wrow = w_ptr + c.to(tl.int64) * stride_w
    w0 = tl.load(wrow + 0, mask=cmask, other=0.0).to(tl.float32)
    w1 = tl.load(wrow + 1, mask=cmask, other=0.0).to(tl.float32)
    w2 = tl.load(wrow + 2, mask=cmask, other=0.0).to(tl.float32)
    w3 = tl.load(wrow + 3, mask=cmask, other=0.0).to(tl.float32)
    lo = tl.minimum(tl.maximum(tl.load(cu_ptr), 0), T)
    hi = tl.minimum(tl.maximum(tl.load(cu_ptr + N), lo), T)
    t0 = tl.program_id(0) * (BLOCK_T * SUB)
    # inputs t - 3, t - 2, t - 1 of the step's first row t (taps before lo read as zeros), then rows t .. t + 3
    p3 = _tap_row(x_ptr, t0 - 3, c, cmask, lo, hi, stride_x)
    p2 = _tap_row(x_ptr, t0 - 2, c, cmask, lo, hi, stride_x)
    p1 = _tap_row(x_ptr, t0 - 1, c, cmask, lo, hi, stride_x)
    a0 = _tap_row(x_ptr, t0, c, cmask, lo, hi, stride_x)
    a1 = _tap_row(x_ptr, t0 + 1, c, cmask, lo, hi, stride_x)
    a2 = _tap_row(x_ptr, t0 + 2, c, cmask, lo, hi, stride_x)
    a3 = _tap_row(x_ptr, t0 + 3, c, cmask, lo, hi, stride_x)
    for i in range(SUB):
        t = t0 + i * BLOCK_T
        # the next step's rows (none after the last step: hi_n = lo masks every load)
        hi_n = tl.where(i + 1 < SUB, hi, lo)
        b0 = _tap_row(x_ptr, t + 4, c, cmask, lo, hi_n, stride_x)
        b1 = _tap_row(x_ptr, t + 5, c, cmask, lo, hi_n, stride_x)
        b2 = _tap_row(x_ptr, t + 6, c, cmask, lo, hi_n, stride_x)
        b3 = _tap_row(x_ptr, t + 7, c, cmask, lo, hi_n, stride_x)
        _out_row(y_ptr, t, c, cmask, lo, hi, T, stride_y, w0, w1, w2, w3, p3, p2, p1, a0)
        _out_row(y_ptr, t + 1, c, cmask, lo, hi, T, stride_y, w0, w1, w2, w3, p2, p1, a0, a1)
        _out_row(y_ptr, t + 2, c, cmask, lo, hi, T, stride_y, w0, w1, w2, w3, p1, a0, a1, a2)
        _out_row(y_ptr, t + 3, c, cmask, lo, hi, T, stride_y, w0, w1, w2, w3, a0, a1, a2, a3)
        p3, p2, p1 = a1, a2, a3
        a0, a1, a2, a3 = b0, b1, b2, b3


@triton.jit
def conv_prefill_kernel(x_ptr, w_ptr, y_ptr, cu_ptr, stride_x, stride_w, stride_y, T, C, N,
                        W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, SUB: tl.constexpr,
                        C16: tl.constexpr):
    """Varlen causal conv1d + SiLU, the body: every row of x [T, C] -> y [T, C] with its taps read from x only.

    x, y: [T, C] bf16 (row strides stride_x, stride_y); w: [C, W] bf16 (row stride stride_w); cu_seqlens int32
    [N + 1]. Rows in [lo, hi) = [clamp(cu[0], 0, T), clamp(cu[N], lo, T)) get silu(sum_j w[:, j] x[t - 3 + j]) with
    the taps before lo read as zeros; the other rows of [0, T) get zeros. A sequence's first W-1 = 3 rows (whose
    taps reach into the previous sequence or its conv state) are wrong here and are rewritten by
    conv_heads_kernel, launched after this kernel on the same stream. One pass over x: a program owns BLOCK_T *
    SUB consecutive rows (BLOCK_T = 4 a step) of BLOCK_C channels, loads each of them once plus the 3 rows before
    its first (the previous program's, mostly L2 hits), and keeps the last three inputs in registers (the
    earlier form loaded four shifted [rows, channels] tiles and needed 224 registers a thread on sm_90a). Only
    cu_seqlens[0] and cu_seqlens[N] are read, clamped, so no offset makes a tap or a store leave rows [0, T).
    Grid (cdiv(T, SUB * BLOCK_T), cdiv(C, BLOCK_C)). y must not overlap x.
    C16 (constexpr, the .a16 variant): the host promises C % 16 == 0, and only the body with 16-row-aligned
    channel masks (vectorized loads) is compiled (a runtime branch would compile both, and the scalar one's
    registers would set the kernel's; C16 with C % 16 != 0 would leave the last C % 16 channels unwritten, no
    access outside the buffers).
    """
    tl.static_assert(W == 4, "conv kernels are written for width 4")
    if C16:
        _body_block(x_ptr, w_ptr, y_ptr, cu_ptr, stride_x, stride_w, stride_y, T, floor16(C), N, BLOCK_T, BLOCK_C,
                    SUB)
    else:
        _body_block(x_ptr, w_ptr, y_ptr, cu_ptr, stride_x, stride_w, stride_y, T, C, N, BLOCK_T, BLOCK_C, SUB)


@triton.jit
def _heads_block(x_ptr, w_ptr, y_ptr, state_ptr, cu_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss,
                 stride_sr, T, C, N, num_slots, BLOCK_C: tl.constexpr):
    s = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    start = tl.minimum(tl.maximum(tl.load(cu_ptr + s), 0), T)
    end = tl.minimum(tl.maximum(tl.load(cu_ptr + s + 1), start), T)
    ln = end - start
    slot = tl.load(slot_ptr + s)
    slot_v = tl.zeros_like(c) + slot  # (a scalar bool & vector mask breaks Triton 3.9's interpreter)
    smask = cmask & (slot_v >= 0) & (slot_v < num_slots)
    srow = state_ptr + tl.where((slot >= 0) & (slot < num_slots), slot, 0).to(tl.int64) * stride_ss + c
    ln_v = tl.zeros_like(c) + ln
    # input positions -3 .. 2 of the sequence: the old state's rows (zeros without one), then x rows start ..
    o0 = tl.load(srow, mask=smask, other=0.0)
    o1 = tl.load(srow + stride_sr, mask=smask, other=0.0)
    o2 = tl.load(srow + 2 * stride_sr, mask=smask, other=0.0)
    xrow = x_ptr + start.to(tl.int64) * stride_x + c
    x0 = tl.load(xrow, mask=cmask & (ln_v > 0), other=0.0)
    x1 = tl.load(xrow + stride_x, mask=cmask & (ln_v > 1), other=0.0)
    x2 = tl.load(xrow + 2 * stride_x, mask=cmask & (ln_v > 2), other=0.0)
    wrow = w_ptr + c.to(tl.int64) * stride_w
    w0 = tl.load(wrow + 0, mask=cmask, other=0.0).to(tl.float32)
    w1 = tl.load(wrow + 1, mask=cmask, other=0.0).to(tl.float32)
    w2 = tl.load(wrow + 2, mask=cmask, other=0.0).to(tl.float32)
    w3 = tl.load(wrow + 3, mask=cmask, other=0.0).to(tl.float32)
    f0, f1, f2 = o0.to(tl.float32), o1.to(tl.float32), o2.to(tl.float32)
    g0, g1, g2 = x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32)
    yrow = y_ptr + start.to(tl.int64) * stride_y + c
    tl.store(yrow, silu_f32(w0 * f0 + w1 * f1 + w2 * f2 + w3 * g0).to(tl.bfloat16), mask=cmask & (ln_v > 0))
    tl.store(yrow + stride_y, silu_f32(w0 * f1 + w1 * f2 + w2 * g0 + w3 * g1).to(tl.bfloat16),
             mask=cmask & (ln_v > 1))
    tl.store(yrow + 2 * stride_y, silu_f32(w0 * f2 + w1 * g0 + w2 * g1 + w3 * g2).to(tl.bfloat16),
             mask=cmask & (ln_v > 2))
    # final state: input positions ln - 3 .. ln - 1 (x rows, or old state rows when the sequence is shorter
    # than 3); all three are loaded before any is stored (they may be rows of the same slot); an empty
    # sequence leaves its slot unchanged
    m = smask & (ln_v > 0)
    q0 = ln - 3
    q1 = ln - 2
    q2 = ln - 1
    n0 = tl.load(tl.where(q0 >= 0, xrow + q0.to(tl.int64) * stride_x, srow + (q0 + 3) * stride_sr), mask=m)
    n1 = tl.load(tl.where(q1 >= 0, xrow + q1.to(tl.int64) * stride_x, srow + (q1 + 3) * stride_sr), mask=m)
    n2 = tl.load(tl.where(q2 >= 0, xrow + q2.to(tl.int64) * stride_x, srow + (q2 + 3) * stride_sr), mask=m)
    tl.debug_barrier()
    tl.store(srow, n0, mask=m)
    tl.store(srow + stride_sr, n1, mask=m)
    tl.store(srow + 2 * stride_sr, n2, mask=m)


@triton.jit
def conv_heads_kernel(x_ptr, w_ptr, y_ptr, state_ptr, cu_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss,
                      stride_sr, T, C, N, num_slots, W: tl.constexpr, BLOCK_C: tl.constexpr):
    """Varlen causal conv1d + SiLU, the sequence heads and the conv states (after conv_prefill_kernel).

    Program (s, channel block): sequence s covers the clamped rows [start, end) = [clamp(cu[s], 0, T),
    clamp(cu[s+1], start, T)); its first min(3, end - start) rows are recomputed with the taps before start read
    from its slot's conv state (zeros for an invalid slot), and the slot gets the sequence's last 3 inputs
    (reaching into the old state when the sequence is shorter than 3; an empty sequence leaves it unchanged).
    state bf16 [num_slots, W-1, C] with strides (stride_ss, stride_sr, 1); slot_idx int32 [N]; with no state pass
    num_slots = 0 (slot_ptr must still be readable for N entries: pass cu_ptr). Only rows [0, T) of x and y,
    rows 0..W-2 of slots in [0, num_slots), cu_seqlens[0..N] and slot_idx[0..N-1] are touched, whatever they
    hold. The old state of a slot is read and its new state written by one program (same threads, loads first),
    so valid slots must be distinct among the sequences of one launch (duplicates: unspecified results for
    those sequences and slots, nothing else touched); overlapping sequences (non-monotone offsets) get
    unspecified head rows. Grid (N, cdiv(C, BLOCK_C)).
    """
    tl.static_assert(W == 4, "conv kernels are written for width 4")
    if C % 16 == 0:
        _heads_block(x_ptr, w_ptr, y_ptr, state_ptr, cu_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss,
                     stride_sr, T, floor16(C), N, num_slots, BLOCK_C)
    else:
        _heads_block(x_ptr, w_ptr, y_ptr, state_ptr, cu_ptr, slot_ptr, stride_x, stride_w, stride_y, stride_ss,
                     stride_sr, T, C, N, num_slots, BLOCK_C)


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
