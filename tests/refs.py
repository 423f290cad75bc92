"""float64 numpy references for the row families (kernels_src/norm, rope, act, embedding). Torch-free; reused by
GPU tests.

All functions take numpy arrays holding the bf16 input values (any float dtype) and return float64
results of the exact math, except where a kernel's contract includes a bf16 rounding step (the residual
of add_rmsnorm), which is reproduced bit-exactly with :func:`bf16_round`.
"""
from __future__ import annotations

import numpy as np


def bf16_round(a) -> np.ndarray:
    """Round to the nearest bfloat16 (ties to even) through float32, as torch's bf16 cast does.

    Returns float32 values that are exactly representable in bf16.
    """
    f = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32).copy()
    nan = np.isnan(f)
    out[nan] = np.nan
    return out


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def rmsnorm(x, w, eps: float) -> np.ndarray:
    """Gemma-style RMSNorm over the last axis: x * rsqrt(mean(x^2) + eps) * (1 + w)."""
    x, w = _f64(x), _f64(w)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def add_rmsnorm(x, residual, w, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(y, new_residual): new_residual = bf16(fp32(x) + fp32(residual)); y = rmsnorm(new_residual)."""
    s = bf16_round(np.asarray(x, dtype=np.float32) + np.asarray(residual, dtype=np.float32))
    return rmsnorm(s, w, eps), s.astype(np.float64)


def silu(x) -> np.ndarray:
    x = _f64(x)
    return x / (1.0 + np.exp(-x))


def sigmoid(x) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-_f64(x)))


def gated_rmsnorm(x, z, w, eps: float, head: int = 128) -> np.ndarray:
    """Per group of `head` channels: x * rsqrt(mean(x^2) + eps) * w * silu(z) (plain w of shape [head])."""
    x, z, w = _f64(x), _f64(z), _f64(w)
    lead = x.shape[:-1]
    xh = x.reshape(*lead, -1, head)
    zh = z.reshape(*lead, -1, head)
    y = xh / np.sqrt(np.mean(xh * xh, axis=-1, keepdims=True) + eps) * w * silu(zh)
    return y.reshape(x.shape)


def rope_neox(x, positions, theta: float, rot: int) -> np.ndarray:
    """Partial rotate-half RoPE on the first `rot` dims of x [T, H, D]; the rest passes through."""
    x = _f64(x)
    half = rot // 2
    inv_freq = float(theta) ** (-(2.0 * np.arange(half, dtype=np.float64)) / rot)
    ang = _f64(positions)[:, None] * inv_freq[None, :]  # [T, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    x1, x2 = x[..., :half], x[..., half:rot]
    out[..., :half] = x1 * c - x2 * s
    out[..., half:rot] = x2 * c + x1 * s
    return out


def qk_norm_rope(qg, k, positions, wq, wk, eps: float, theta: float, hq: int, hkv: int, d: int,
                 rot: int) -> tuple[np.ndarray, np.ndarray]:
    """Attention preamble. qg [T, hq*2*d] (per head [query | gate]), k [T, hkv*d].

    Returns q [T, hq, d], k [T, hkv, d]: RMSNorm(1 + w) per head, then partial neox RoPE.
    """
    qg, k = _f64(qg), _f64(k)
    t = qg.shape[0]
    q = qg.reshape(t, hq, 2 * d)[..., :d]
    kk = k.reshape(t, hkv, d)
    return (rope_neox(rmsnorm(q, wq, eps), positions, theta, rot),
            rope_neox(rmsnorm(kk, wk, eps), positions, theta, rot))


def silu_mul(x) -> np.ndarray:
    """x [M, 2I] = [gate | up] -> silu(gate) * up [M, I]."""
    x = _f64(x)
    i = x.shape[-1] // 2
    return silu(x[..., :i]) * x[..., i:]


def sigmoid_mul(x, gate) -> np.ndarray:
    """x [T, H*D], gate [T, H, D] -> x * sigmoid(gate) reshaped to [T, H*D]."""
    x, gate = _f64(x), _f64(gate)
    return x * sigmoid(gate).reshape(x.shape)


def embedding(ids, table) -> np.ndarray:
    """table[ids]; ids outside [0, V) give zero rows."""
    table = _f64(table)
    ids = np.asarray(ids, dtype=np.int64)
    out = np.zeros((ids.shape[0], table.shape[1]), dtype=np.float64)
    ok = (ids >= 0) & (ids < table.shape[0])
    out[ok] = table[ids[ok]]
    return out


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out has NaN)."""
    out, ref = _f64(out), _f64(ref)
    den = np.linalg.norm(ref.ravel())
    return float(np.linalg.norm((out - ref).ravel()) / (den if den > 0 else 1.0))
