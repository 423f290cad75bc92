"""numpy references of the FP8 e4m3 quantization and GEMMs (kernels_src/gemm_fp8, vkc_runtime.ops.gemm_fp8), with
ml_dtypes' float8_e4m3fn (round to nearest even, subnormals kept) as the format's oracle.

Scales are multipliers: value = fp8 * scale. The quantizers divide in float32 (IEEE), clamp to +-448 and round
to nearest even; dynamic scales are max(amax / 448, MIN_SCALE) in float32.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
FP8_MAX = np.float32(448.0)
MIN_SCALE = np.float32(1.0 / (448.0 * 512.0))
GROUP = 128


def to_fp8(v) -> np.ndarray:
    """float32 values -> e4m3 (saturating at +-448, NaN kept)."""
    f = np.asarray(v, dtype=np.float32)
    return np.where(np.isnan(f), f, np.clip(f, -FP8_MAX, FP8_MAX)).astype(E4M3)


def fp8_bits(q) -> np.ndarray:
    return np.asarray(q).view(np.uint8)


def from_bits(b) -> np.ndarray:
    """uint8 bytes of e4m3 -> float64 values."""
    return np.asarray(b, dtype=np.uint8).view(E4M3).astype(np.float64)


def _dyn_scale(amax) -> np.ndarray:
    return np.maximum(np.asarray(amax, np.float32) / FP8_MAX, MIN_SCALE).astype(np.float32)


def quant_token(x) -> tuple[np.ndarray, np.ndarray]:
    """x [M, K] float32 (bf16 values) -> (q [M, K] e4m3, scale [M] float32)."""
    x = np.asarray(x, np.float32)
    s = _dyn_scale(np.abs(x).max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32))
    return to_fp8(x / s[:, None]), s


def quant_tensor(x, scale) -> np.ndarray:
    return to_fp8(np.asarray(x, np.float32) / np.float32(scale))


def group_cols(K: int) -> int:
    return -(-K // GROUP)


def quant_group(x) -> tuple[np.ndarray, np.ndarray]:
    """x [M, K] -> (q [M, K] e4m3, scale [M, cdiv(K, 128)] float32), a partial last group included."""
    x = np.asarray(x, np.float32)
    M, K = x.shape
    G = group_cols(K)
    pad = np.zeros((M, G * GROUP), np.float32)
    pad[:, :K] = x
    s = _dyn_scale(np.abs(pad.reshape(M, G, GROUP)).max(axis=2))
    return to_fp8(x / np.repeat(s, GROUP, axis=1)[:, :K]), s


def expand_block(scale, rows: int, cols: int) -> np.ndarray:
    """A [cdiv(rows, 128), cdiv(cols, 128)] block-scale grid -> per-element [rows, cols] float64."""
    s = np.asarray(scale, np.float64)
    return np.repeat(np.repeat(s, GROUP, axis=0), GROUP, axis=1)[:rows, :cols]


def gemm_scaled(a_bits, sa, w_bits, sw) -> np.ndarray:
    """float64 (a * sa[m]) @ (w * sw[n])^T; sa: 1 or M scales, sw: 1 or N."""
    a, w = from_bits(a_bits), from_bits(w_bits)
    sa = np.broadcast_to(np.asarray(sa, np.float64).reshape(-1), (a.shape[0],))
    sw = np.broadcast_to(np.asarray(sw, np.float64).reshape(-1), (w.shape[0],))
    return (a * sa[:, None]) @ (w * sw[:, None]).T


def gemm_block(a_bits, sa, w_bits, sw) -> np.ndarray:
    """float64 product of the block-dequantized operands: a[m, k] * sa[m, k // 128], w[n, k] * sw[n // 128, k // 128]."""
    a, w = from_bits(a_bits), from_bits(w_bits)
    M, K = a.shape
    N = w.shape[0]
    sa_full = np.repeat(np.asarray(sa, np.float64), GROUP, axis=1)[:, :K]
    return (a * sa_full) @ (w * expand_block(sw, N, K)).T


def random_fp8(rng, shape, spread: float = 2.0) -> np.ndarray:
    """Random e4m3 bytes of values with magnitudes over several binades (normals and some subnormals)."""
    v = rng.standard_normal(shape).astype(np.float32) * np.float32(2.0) ** rng.uniform(-spread, spread, shape)
    return fp8_bits(to_fp8(v * 16))
