"""NumPy reference of the NVFP4 weight layout the gemv family's W4A16 kernel reads (kernels_src/gemv/gemv.py):

    packed [N, K/2] uint8   byte j of row n: k = 2j in the LOW nibble, k = 2j + 1 in the high nibble (e2m1 codes)
    scales [N, K/16] uint8  float8 e4m3fn bytes; scales[n, g] scales k in [16 g, 16 g + 16)
    alpha  float            the effective global multiplier (see vkc_runtime.ops.gemv.gemv_w4a16)
    W[n, k] = E2M1[code(n, k)] * e4m3(scales[n, k // 16]) * alpha

e2m1 values come from an explicit table (checked against ml_dtypes' float4_e2m1fn), e4m3 through ml_dtypes.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

# code -> value: bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def e2m1_table_from_ml_dtypes() -> np.ndarray:
    return np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)


def e4m3_decode(b: np.ndarray) -> np.ndarray:
    """uint8 bytes of float8 e4m3fn -> float64."""
    return np.asarray(b, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


def e4m3_encode(v: np.ndarray) -> np.ndarray:
    """float -> uint8 bytes of float8 e4m3fn (round to nearest)."""
    return np.asarray(v, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def pack(codes: np.ndarray) -> np.ndarray:
    """codes [N, K] in 0..15 -> packed [N, K/2] uint8 (low nibble first)."""
    c = np.asarray(codes, dtype=np.uint8)
    assert c.shape[-1] % 2 == 0 and c.max(initial=0) < 16
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def unpack(packed: np.ndarray) -> np.ndarray:
    """packed [N, K/2] uint8 -> codes [N, K]."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out


def dequant(packed: np.ndarray, scales: np.ndarray, alpha: float) -> np.ndarray:
    """W [N, K] float64 from the packed layout above."""
    w = E2M1[unpack(packed)]
    s = e4m3_decode(scales)
    return w * np.repeat(s, 16, axis=-1)[..., :w.shape[-1]] * float(alpha)


def quantize(w: np.ndarray, alpha: float | None = None):
    """A float [N, K] matrix -> (packed, scales, alpha) with the NVFP4 recipe (per 16: amax / 6 as the e4m3
    scale in units of alpha; nearest e2m1 code). Only for making test data: any codes and scales are valid
    inputs of the kernel."""
    w = np.asarray(w, dtype=np.float64)
    N, K = w.shape
    blocks = w.reshape(N, K // 16, 16)
    amax = np.abs(blocks).max(-1)
    if alpha is None:
        alpha = max(float(amax.max()) / (6.0 * 448.0), 1e-30)
    s_bytes = e4m3_encode(amax / 6.0 / alpha)
    s = e4m3_decode(s_bytes) * alpha
    safe = np.where(s > 0, s, 1.0)
    scaled = blocks / safe[..., None]
    mags = E2M1[:8]
    code = np.abs(np.abs(scaled)[..., None] - mags).argmin(-1).astype(np.uint8)
    code |= np.where(scaled < 0, 8, 0).astype(np.uint8)
    return pack(code.reshape(N, K)), s_bytes, float(alpha)


# ------------------------------------------------------------------ activations (kernels_src/gemm_fp4, W4A4)

# e2m1 midpoints between codes c and c + 1, and whether the tie goes up (to the even code c + 1)
_MIDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_code(v: np.ndarray) -> np.ndarray:
    """float -> e2m1 code (bit 3 the sign), nearest even, saturated at +-6; -0 and values rounding to 0 give 0."""
    a = np.abs(np.asarray(v, np.float32))
    c = np.zeros(a.shape, np.uint8)
    for mid, up in _MIDS:
        c += (a >= mid) if up else (a > mid)
    return np.where((np.asarray(v) < 0) & (c > 0), c + 8, c).astype(np.uint8)


def quant_act(x: np.ndarray, gs: float):
    """The activation quantizer of kernels_src/gemm_fp4 in float32, bit for bit: per 16 along K,
    s = e4m3(satfinite(rn(rn(amax / 6) * gs))), code = e2m1(x * rn(gs / s)) (0 where s == 0).
    Returns (packed [M, K/2] uint8, scale bytes [M, K/16] uint8)."""
    x = np.asarray(x, np.float32)
    M, K = x.shape
    g = x.reshape(M, K // 16, 16)
    gs = np.float32(gs)
    sf = (np.abs(g).max(-1) / np.float32(6.0)).astype(np.float32) * gs
    sb = np.clip(sf, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn)
    sd = sb.astype(np.float32)
    rcp = np.where(sd > 0, gs / np.where(sd > 0, sd, np.float32(1)), np.float32(0)).astype(np.float32)
    code = e2m1_code((g * rcp[..., None]).astype(np.float32))
    return pack(code.reshape(M, K)), sb.view(np.uint8)


def gemm_w4a4(a_packed, a_scales, w_packed, w_scales, alpha: float) -> np.ndarray:
    """float64 out [M, N] = alpha * dequant(a) @ dequant(w)^T (scales as e4m3 bytes)."""
    return dequant(a_packed, a_scales, 1.0) @ dequant(w_packed, w_scales, 1.0).T * float(alpha)
