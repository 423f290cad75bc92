"""Gated DeltaNet decode: one recurrent step per sequence of a continuous batch (ARCHITECTURE.md "Kernel families").

Per sequence b and value head h (key head kh = h // (Hv / Hk)), with fp32 math throughout:
    q, k   = l2norm(qkv[b, q/k channels of kh]),  x / sqrt(sum x^2 + eps)
    g      = -exp(A_log[h]) * softplus(a[b, h] + dt_bias[h]),   beta = sigmoid(b[b, h])
    S      = exp(g) * S                            (S = state[slot[b], h], [K, V] fp32, in place)
    delta  = beta * (v - S^T k)
    S      = S + k delta^T
    o      = S^T (scale * q)  =  scale * (S_decayed^T q + delta * (k . q))
The last identity lets both K-reductions run on the decayed state at once (independent reductions, one
pass over the tile) instead of a second reduction after the rank-1 update.

Layouts: qkv [B, 2*Hk*K + Hv*V] bf16 (channels [q | k | v], row stride stride_qkv); a, b [B, Hv] bf16 (row
strides); A_log, dt_bias [Hv] fp32; state [num_slots, Hv, K, V] fp32, each slot contiguous, slot stride
stride_state; slot_idx int32 [B]; o [B, Hv, V] bf16 (row stride stride_o, heads contiguous).
A slot outside [0, num_slots) (e.g. -1 for a padded batch entry): the state is neither read nor written
and o[b] = 0.

BA (the ``.ba`` specs): a_ptr / b_ptr are the block's input x [B, H] (row stride stride_a) and the b | a rows of the
in-projection w_ba [2 Hv, H] (row stride stride_b) instead: b = bf16(x[b] . w_ba[h]), a = bf16(x[b] . w_ba[Hv + h])
with fp32 sums over H in BLOCK_H chunks, rounded once to bf16 as the in-projection's GEMV output would be. Before
the grid-dependency wait (weights only) the first v-block program of each (b, h) asks L2 for the two weight rows.
x is read after the wait like every activation; columns past H are masked.

Grid (B * Hv * (V // BLOCK_V),) on axis 0 only (so B * Hv is never limited by the 65535 of axes y/z):
program p -> (b, h, v-block) with the v-block fastest, so neighbouring programs stream neighbouring
state bytes. Each program owns a [K, BLOCK_V] column slab of one head's state: it is read once and
written once (the kernel is HBM-bound on these bytes); splitting V gives B * Hv * V / BLOCK_V CTAs.
"""
import triton
import triton.language as tl

from kernels_src.common import l2_prefetch, pdl_enter


@triton.jit
def _softplus_f32(x):
    # log(1 + e^x) without overflow: max(x, 0) + log(1 + e^-|x|); equals torch's softplus (threshold 20)
    # to fp32 rounding
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _dot_bf16(x_row, w_row, H, BLOCK_H: tl.constexpr):
    """bf16(x . w) over H (fp32 sums in BLOCK_H chunks), as fp32."""
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        c = h0 + tl.arange(0, BLOCK_H)
        m = c < H
        acc += tl.load(x_row + c, mask=m, other=0.0).to(tl.float32) * tl.load(w_row + c, mask=m, other=0.0).to(
            tl.float32)
    return tl.sum(acc, axis=0).to(tl.bfloat16).to(tl.float32)


@triton.jit
def gdn_decode_kernel(qkv_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slot_ptr, o_ptr,
                      stride_qkv, stride_a, stride_b, stride_state, stride_o, Hk, Hv, num_slots, scale, eps, H,
                      K: tl.constexpr, V: tl.constexpr, BLOCK_V: tl.constexpr, BA: tl.constexpr,
                      BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    NV: tl.constexpr = V // BLOCK_V
    pid = tl.program_id(0)
    iv = pid % NV
    bh = pid // NV
    h = bh % Hv
    bi = (bh // Hv).to(tl.int64)
    kh = h // (Hv // Hk)
    cv = iv * BLOCK_V + tl.arange(0, BLOCK_V)
    o_row = o_ptr + bi * stride_o + h * V
    if BA:
        if iv == 0:  # the b / a weight rows (weights: allowed before the wait)
            l2_prefetch((b_ptr + h * stride_b).to(tl.pointer_type(tl.uint8)), 2 * H, 32)
            l2_prefetch((b_ptr + (Hv + h) * stride_b).to(tl.pointer_type(tl.uint8)), 2 * H, 32)
    pdl_enter(PDL)
    slot = tl.load(slot_ptr + bi)
    if (slot >= 0) & (slot < num_slots):
        ck = tl.arange(0, K)
        # the state slab first: its HBM round trip overlaps the q / k norms and the b / a dots below (the
        # reductions' barriers would otherwise keep the load behind them)
        sp = state_ptr + slot.to(tl.int64) * stride_state + h * (K * V) + ck[:, None] * V + cv[None, :]
        S = tl.load(sp)
        row = qkv_ptr + bi * stride_qkv
        q = tl.load(row + kh * K + ck).to(tl.float32)
        k = tl.load(row + (Hk + kh) * K + ck).to(tl.float32)
        v = tl.load(row + 2 * Hk * K + h * V + cv).to(tl.float32)
        q = q / tl.sqrt(tl.sum(q * q, axis=0) + eps)
        k = k / tl.sqrt(tl.sum(k * k, axis=0) + eps)
        if BA:
            x_row = a_ptr + bi * stride_a
            bb = _dot_bf16(x_row, b_ptr + h * stride_b, H, BLOCK_H)
            a = _dot_bf16(x_row, b_ptr + (Hv + h) * stride_b, H, BLOCK_H)
        else:
            a = tl.load(a_ptr + bi * stride_a + h).to(tl.float32)
            bb = tl.load(b_ptr + bi * stride_b + h).to(tl.float32)
        g = -tl.exp(tl.load(A_log_ptr + h)) * _softplus_f32(a + tl.load(dt_bias_ptr + h))
        decay = tl.exp(g)
        beta = 1.0 / (1.0 + tl.exp(-bb))
        S = S * decay
        sk = tl.sum(S * k[:, None], axis=0)
        sq = tl.sum(S * q[:, None], axis=0)
        delta = beta * (v - sk)
        tl.store(sp, S + k[:, None] * delta[None, :])
        o = scale * (sq + delta * tl.sum(k * q, axis=0))
        tl.store(o_row + cv, o.to(tl.bfloat16))
    else:
        tl.store(o_row + cv, tl.zeros((BLOCK_V,), dtype=tl.bfloat16))
