"""Attention preamble: per-head RMSNorm(1 + w) of q and k, then partial neox RoPE (DESIGN.md section 6).

Grid (T, Hq + Hkv): axis 0 = token t, axis 1 = head h; h < Hq is query head h (read from the query half
of qg's head slice [query(D) | gate(D)]), h >= Hq is key head h - Hq. The gate halves are not touched.
"""
import triton
import triton.language as tl


@triton.jit
def _norm_rope_head(src, w_ptr, dst, pos, eps, log2_theta, D: tl.constexpr, ROT: tl.constexpr):
    HALF: tl.constexpr = ROT // 2
    d = tl.arange(0, D)
    x = tl.load(src + d).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    xn = x * rstd * (1.0 + tl.load(w_ptr + d).to(tl.float32))
    # rotate-half partner of each lane inside the rotary span (the row is in L1 already)
    partner = tl.where(d < HALF, d + HALF, tl.where(d < ROT, d - HALF, d))
    xp = tl.load(src + partner).to(tl.float32)
    xpn = xp * rstd * (1.0 + tl.load(w_ptr + partner).to(tl.float32))
    # inv_freq_i = theta^(-2i/ROT), i = lane index within its half
    i = tl.where(d < HALF, d, d - HALF).to(tl.float32)
    inv_freq = tl.exp2(-(2.0 * i / ROT) * log2_theta)
    angle = pos * inv_freq
    c = tl.cos(angle)
    s = tl.sin(angle)
    rot = tl.where(d < HALF, xn * c - xpn * s, xn * c + xpn * s)
    out = tl.where(d < ROT, rot, xn)
    tl.store(dst + d, out.to(tl.bfloat16))


@triton.jit
def qk_norm_rope_kernel(qg_ptr, k_ptr, pos_ptr, wq_ptr, wk_ptr, q_out_ptr, k_out_ptr,
                        stride_qg, stride_k, Hq, Hkv, eps, theta,
                        D: tl.constexpr, ROT: tl.constexpr):
    """q_out[t, h] = rope(rmsnorm(qg[t, h*2D : h*2D + D]) * (1 + wq)); k_out likewise from k with wk.

    qg [T, Hq*2*D] row stride stride_qg; k [T, Hkv*D] row stride stride_k; positions int32 [T];
    q_out [T, Hq, D], k_out [T, Hkv, D] contiguous. Grid (T, Hq + Hkv).
    """
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    log2_theta = tl.log2(theta)
    if h < Hq:
        _norm_rope_head(qg_ptr + t * stride_qg + h * (2 * D), wq_ptr,
                        q_out_ptr + (t * Hq + h) * D, pos, eps, log2_theta, D, ROT)
    else:
        hk = h - Hq
        _norm_rope_head(k_ptr + t * stride_k + hk * D, wk_ptr,
                        k_out_ptr + (t * Hkv + hk) * D, pos, eps, log2_theta, D, ROT)
