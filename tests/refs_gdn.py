"""float64 numpy references for the GDN chunked prefill (kernels_src/gdn). Torch-free; reused by GPU tests.

Inputs hold the bf16 values (any float dtype). Math (ARCHITECTURE.md "Kernel families"), per value head h (key head
h // (Hv/Hk)): q, k L2-normalised with eps 1e-6 inside the sqrt, scale = K^-0.5,
g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b),
    S <- exp(g_t) S;  d = beta_t (v_t - S^T k_t);  S <- S + k_t d^T;  o_t = S^T (scale q_t).
"""
from __future__ import annotations

import numpy as np


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def softplus(x) -> np.ndarray:
    x = _f64(x)
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def prep(qkv, a, b, A_log, dt_bias, hk: int, hv: int, dk: int = 128, dv: int = 128):
    """-> q [T, hk, dk], k [T, hk, dk] (normalised), v [T, hv, dv], g [T, hv], beta [T, hv] (float64)."""
    qkv = _f64(qkv)
    T = qkv.shape[0]
    q = qkv[:, :hk * dk].reshape(T, hk, dk)
    k = qkv[:, hk * dk:2 * hk * dk].reshape(T, hk, dk)
    v = qkv[:, 2 * hk * dk:].reshape(T, hv, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    g = -np.exp(_f64(A_log))[None, :] * softplus(_f64(a) + _f64(dt_bias)[None, :])
    beta = 1.0 / (1.0 + np.exp(-_f64(b)))
    return q, k, v, g, beta


def _initial(state, slot_idx, n, hv, dk, dv):
    if state is not None and slot_idx is not None and int(slot_idx[n]) >= 0:
        return _f64(state[int(slot_idx[n])]).copy()
    return np.zeros((hv, dk, dv))


def recurrent(qkv, a, b, A_log, dt_bias, cu_seqlens, hk: int, hv: int, state=None, slot_idx=None,
              dk: int = 128, dv: int = 128):
    """Sequential recurrence. Returns (o [T, hv, dv], new_state): new_state is a float64 copy of ``state``
    with the final states written to the non-negative slots (None when state is None)."""
    q, k, v, g, beta = prep(qkv, a, b, A_log, dt_bias, hk, hv, dk, dv)
    T = q.shape[0]
    G = hv // hk
    scale = dk ** -0.5
    o = np.zeros((T, hv, dv))
    new_state = None if state is None else _f64(state).copy()
    cu = [int(x) for x in cu_seqlens]
    for n in range(len(cu) - 1):
        S = _initial(state, slot_idx, n, hv, dk, dv)
        for t in range(cu[n], cu[n + 1]):
            for h in range(hv):
                kk, qq = k[t, h // G], q[t, h // G]
                S[h] *= np.exp(g[t, h])
                d = beta[t, h] * (v[t, h] - S[h].T @ kk)
                S[h] += np.outer(kk, d)
                o[t, h] = S[h].T @ (scale * qq)
        if new_state is not None and slot_idx is not None and int(slot_idx[n]) >= 0:
            new_state[int(slot_idx[n])] = S
    return o, new_state


def chunked(qkv, a, b, A_log, dt_bias, cu_seqlens, hk: int, hv: int, state=None, slot_idx=None,
            dk: int = 128, dv: int = 128, C: int = 64):
    """The chunked (WY) form (ARCHITECTURE.md "Kernel families") in float64, as a cross-check of :func:`recurrent`."""
    q, k, v, g, beta = prep(qkv, a, b, A_log, dt_bias, hk, hv, dk, dv)
    T = q.shape[0]
    G = hv // hk
    scale = dk ** -0.5
    o = np.zeros((T, hv, dv))
    new_state = None if state is None else _f64(state).copy()
    cu = [int(x) for x in cu_seqlens]
    for n in range(len(cu) - 1):
        S = _initial(state, slot_idx, n, hv, dk, dv)
        for c0 in range(cu[n], cu[n + 1], C):
            c1 = min(c0 + C, cu[n + 1])
            for h in range(hv):
                Q, K, Vv = q[c0:c1, h // G], k[c0:c1, h // G], v[c0:c1, h]
                gam = np.cumsum(g[c0:c1, h])
                bt = beta[c0:c1, h]
                L = c1 - c0
                A = np.tril(bt[:, None] * np.exp(gam[:, None] - gam[None, :]) * (K @ K.T), -1)
                Tm = np.linalg.inv(np.eye(L) + A)
                W = Tm @ ((bt * np.exp(gam))[:, None] * K)
                U = Tm @ (bt[:, None] * Vv)
                Vp = U - W @ S[h]
                att = np.tril(Q @ K.T) * np.exp(np.tril(gam[:, None] - gam[None, :]))
                o[c0:c1, h] = scale * (np.exp(gam)[:, None] * (Q @ S[h]) + att @ Vp)
                S[h] = np.exp(gam[-1]) * S[h] + K.T @ (np.exp(gam[-1] - gam)[:, None] * Vp)
        if new_state is not None and slot_idx is not None and int(slot_idx[n]) >= 0:
            new_state[int(slot_idx[n])] = S
    return o, new_state


def rel_err(out, ref) -> float:
    out, ref = _f64(out), _f64(ref)
    den = np.linalg.norm(ref.ravel())
    return float(np.linalg.norm((out - ref).ravel()) / (den if den > 0 else 1.0))
