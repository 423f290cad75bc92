"""Attention preamble: per-head RMSNorm(1 + w) of q and k, then partial neox RoPE (ARCHITECTURE.md "Kernel families").

Grid (cdiv(T, TOK), cdiv(Hq, HEADS_PER_PROG) + cdiv(Hkv, HEADS_PER_PROG)): axis 0 = a block of TOK tokens; on
axis 1 the first cdiv(Hq, HEADS_PER_PROG) programs take groups of query heads (read from the query half of each
head's [query(D) | gate(D)] slice of qg), the rest take groups of key heads. The gate halves are not touched.
A program's TOK x HEADS_PER_PROG heads are one [TOK * HEADS_PER_PROG, D] tile (every row's loads issued
together: more bytes in flight a program than one token's heads, BENCHMARKS.md session 29); each row computes
its own cos/sin for its token's position.
"""
import triton
import triton.language as tl

from kernels_src.common import pdl_enter


@triton.jit
def _norm_rope_rows(src, src_tok_stride, src_head_stride, w_ptr, dst, pos_ptr, T, n_heads, t0, h0, eps,
                    log2_theta, D: tl.constexpr, ROT: tl.constexpr, TOK: tl.constexpr, HEADS_PER_PROG: tl.constexpr):
    """Rows r of one [TOK * HEADS_PER_PROG, D] tile: token t0 + r // HEADS_PER_PROG, head h0 + r % HEADS_PER_PROG
    (rows past T or n_heads masked). dst is [T, n_heads, D] contiguous."""
    HALF: tl.constexpr = ROT // 2
    r = tl.arange(0, TOK * HEADS_PER_PROG)
    t = t0 + r // HEADS_PER_PROG
    heads = h0 + r % HEADS_PER_PROG
    hmask = ((t < T) & (heads < n_heads))[:, None]
    d = tl.arange(0, D)
    j = tl.arange(0, HALF)
    src_rows = src + t.to(tl.int64)[:, None] * src_tok_stride + heads[:, None] * src_head_stride
    dst_rows = dst + (t.to(tl.int64) * n_heads + heads)[:, None] * D
    pos = tl.load(pos_ptr + t, mask=t < T, other=0).to(tl.float32)[:, None]

    # whole head for the norm and the pass-through dims
    x = tl.load(src_rows + d[None, :], mask=hmask & (d[None, :] < D), other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
    w = tl.load(w_ptr + d).to(tl.float32)
    tl.store(dst_rows + d[None, :], (x * rstd * (1.0 + w[None, :])).to(tl.bfloat16),
             mask=hmask & (d[None, :] >= ROT))

    # rotary span as its two halves (re-read from L1), rotate-half pairing
    m2 = hmask & (j[None, :] < HALF)
    x1 = tl.load(src_rows + j[None, :], mask=m2, other=0.0).to(tl.float32)
    x2 = tl.load(src_rows + HALF + j[None, :], mask=m2, other=0.0).to(tl.float32)
    n1 = x1 * rstd * (1.0 + tl.load(w_ptr + j).to(tl.float32))[None, :]
    n2 = x2 * rstd * (1.0 + tl.load(w_ptr + HALF + j).to(tl.float32))[None, :]
    # inv_freq_j = theta^(-2j/ROT); angle = pos * inv_freq_j in fp32
    inv_freq = tl.exp2(-(2.0 * j.to(tl.float32) / ROT) * log2_theta)
    angle = pos * inv_freq[None, :]
    c = tl.cos(angle)
    s = tl.sin(angle)
    tl.store(dst_rows + j[None, :], (n1 * c - n2 * s).to(tl.bfloat16), mask=m2)
    tl.store(dst_rows + HALF + j[None, :], (n2 * c + n1 * s).to(tl.bfloat16), mask=m2)


@triton.jit
def qk_norm_rope_kernel(qg_ptr, k_ptr, pos_ptr, wq_ptr, wk_ptr, q_out_ptr, k_out_ptr,
                        stride_qg, stride_k, T, Hq, Hkv, eps, theta,
                        D: tl.constexpr, ROT: tl.constexpr, TOK: tl.constexpr, HEADS_PER_PROG: tl.constexpr,
                        PDL: tl.constexpr):
    """q_out[t, h] = rope(rmsnorm(qg[t, h*2D : h*2D + D]) * (1 + wq)); k_out likewise from k with wk.

    qg [T, Hq*2*D] row stride stride_qg; k [T, Hkv*D] row stride stride_k; positions int32 [T];
    q_out [T, Hq, D], k_out [T, Hkv, D] contiguous.
    Grid (cdiv(T, TOK), cdiv(Hq, HEADS_PER_PROG) + cdiv(Hkv, HEADS_PER_PROG)).
    """
    pdl_enter(PDL)
    t0 = tl.program_id(0) * TOK
    hb = tl.program_id(1)
    n_qb = (Hq + HEADS_PER_PROG - 1) // HEADS_PER_PROG
    log2_theta = tl.log2(theta)
    if hb < n_qb:
        _norm_rope_rows(qg_ptr, stride_qg, 2 * D, wq_ptr, q_out_ptr, pos_ptr, T, Hq, t0, hb * HEADS_PER_PROG, eps,
                        log2_theta, D, ROT, TOK, HEADS_PER_PROG)
    else:
        _norm_rope_rows(k_ptr, stride_k, D, wk_ptr, k_out_ptr, pos_ptr, T, Hkv, t0, (hb - n_qb) * HEADS_PER_PROG,
                        eps, log2_theta, D, ROT, TOK, HEADS_PER_PROG)
