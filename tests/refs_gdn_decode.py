"""float64 numpy references for the causal conv1d family (kernels_src/conv) and the GDN packed decode step
(kernels_src/gdn_decode). Torch-free; reused by the CPU interpreter tests and the GPU tests.

Conv state layout: [slots, W-1, C] (row 0 = oldest input). A slot outside [0, slots) means "no state":
zeros are read and nothing is written. GDN state layout: [slots, Hv, K, V].
"""
from __future__ import annotations

import numpy as np


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def silu(x):
    x = _f64(x)
    return x / (1.0 + np.exp(-x))


def _valid(slot, nslots) -> bool:
    return 0 <= int(slot) < nslots


def conv_prefill(x, w, cu_seqlens, conv_state=None, slot_idx=None):
    """Varlen causal conv1d + SiLU. x [T, C], w [C, W], cu_seqlens [N+1]; conv_state [slots, W-1, C] or None.

    Returns (y [T, C] float64, new_state (copy of conv_state with the final states written) or None).
    Rows at or past cu_seqlens[N] are zeros."""
    x, w = _f64(x), _f64(w)
    T, C = x.shape
    W = w.shape[1]
    cu = [int(v) for v in cu_seqlens]
    y = np.zeros((T, C))
    new = None if conv_state is None else _f64(conv_state).copy()
    for s in range(len(cu) - 1):
        a, b = cu[s], cu[s + 1]
        slot = -1 if slot_idx is None else int(slot_idx[s])
        has = conv_state is not None and _valid(slot, new.shape[0])
        init = _f64(conv_state)[slot] if has else np.zeros((W - 1, C))
        seq = np.concatenate([init, x[a:b]], axis=0)  # [W-1 + L, C]
        for i in range(b - a):
            y[a + i] = silu(np.sum(seq[i:i + W] * w.T, axis=0))
        if has:
            new[slot] = seq[-(W - 1):]
    return y, new


def conv_update(x, w, conv_state, slot_idx):
    """Decode step. x [B, C]; returns (y [B, C], new_state). Invalid slot: y = 0, state untouched."""
    x, w = _f64(x), _f64(w)
    new = _f64(conv_state).copy()
    B, C = x.shape
    y = np.zeros((B, C))
    for i in range(B):
        slot = int(slot_idx[i])
        if not _valid(slot, new.shape[0]):
            continue
        seq = np.concatenate([new[slot], x[i:i + 1]], axis=0)  # [W, C]
        y[i] = silu(np.sum(seq * w.T, axis=0))
        new[slot] = seq[1:]
    return y, new


def softplus(x):
    x = _f64(x)
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def gdn_decode(qkv, a, b, A_log, dt_bias, state, slot_idx, hk: int, hv: int, k_dim: int = 128, v_dim: int = 128,
               eps: float = 1e-6, scale: float | None = None):
    """One gated-delta step per sequence. qkv [B, 2*hk*K + hv*V], a, b [B, hv], A_log, dt_bias [hv],
    state [slots, hv, K, V]. Returns (o [B, hv, V], new_state). Invalid slot: o = 0, no state access."""
    qkv, a, b, A_log, dt_bias = (_f64(t) for t in (qkv, a, b, A_log, dt_bias))
    new = _f64(state).copy()
    B = qkv.shape[0]
    K, V = k_dim, v_dim
    scale = K ** -0.5 if scale is None else scale
    o = np.zeros((B, hv, V))
    g_per = hv // hk
    for i in range(B):
        slot = int(slot_idx[i])
        if not _valid(slot, new.shape[0]):
            continue
        for h in range(hv):
            kh = h // g_per
            q = qkv[i, kh * K:(kh + 1) * K]
            k = qkv[i, (hk + kh) * K:(hk + kh + 1) * K]
            v = qkv[i, 2 * hk * K + h * V:2 * hk * K + (h + 1) * V]
            q = q / np.sqrt(np.sum(q * q) + eps)
            k = k / np.sqrt(np.sum(k * k) + eps)
            g = -np.exp(A_log[h]) * softplus(a[i, h] + dt_bias[h])
            beta = 1.0 / (1.0 + np.exp(-b[i, h]))
            S = new[slot, h] * np.exp(g)
            delta = beta * (v - S.T @ k)
            S = S + np.outer(k, delta)
            new[slot, h] = S
            o[i, h] = S.T @ (scale * q)
    return o, new
