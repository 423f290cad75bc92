"""float64 numpy references for the attention family (kernels_src/attn). Torch-free; reused by GPU tests.

Paged "NHD" cache: k_cache, v_cache [num_blocks, block_size, Hkv, D]; block_tables [N, max_blocks] int32;
key position n of sequence i lives at k_cache[block_tables[i, n // bs], n % bs].
"""
from __future__ import annotations

import numpy as np


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def sigmoid(x) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-_f64(x)))


def depage(cache, block_table_row, L: int) -> np.ndarray:
    """[L, Hkv, D] float64 rows 0..L-1 of one sequence."""
    cache = np.asarray(cache)
    bs = cache.shape[1]
    n = np.arange(L)
    blk = np.asarray(block_table_row)[n // bs]
    return _f64(cache[blk, n % bs])


def reshape_and_cache(k, v, k_cache, v_cache, slot_mapping):
    """Copies of the caches after writing rows of k/v [T, Hkv, D] at slot_mapping (negative/out of range skip)."""
    kc, vc = np.array(k_cache, copy=True), np.array(v_cache, copy=True)
    nb, bs = kc.shape[:2]
    for t, s in enumerate(np.asarray(slot_mapping)):
        if 0 <= s < nb * bs:
            kc[s // bs, s % bs] = k[t]
            vc[s // bs, s % bs] = v[t]
    return kc, vc


def attention(q, k, v, scale: float, q_pos, gate=None) -> np.ndarray:
    """q [Lq, Hq, D], k/v [L, Hkv, D]; query row r sees keys 0..q_pos[r] (GQA: head h -> h // (Hq/Hkv)).
    Optional gate [Lq, Hq, D]: out *= sigmoid(gate). Rows that see no key are zero."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    Lq, Hq, D = q.shape
    L, Hkv, _ = k.shape
    g = Hq // Hkv
    out = np.zeros((Lq, Hq, D))
    kh = np.repeat(k, g, axis=1)  # [L, Hq, D]
    vh = np.repeat(v, g, axis=1)
    s = np.einsum("rhd,nhd->hrn", q, kh) * scale  # [Hq, Lq, L]
    vis = np.arange(L)[None, :] <= np.asarray(q_pos)[:, None]  # [Lq, L]
    s = np.where(vis[None], s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(vis[None], np.exp(s - m), 0.0)
    den = p.sum(-1, keepdims=True)
    o = np.einsum("hrn,nhd->rhd", p / np.where(den > 0, den, 1.0), vh)
    out[:] = o
    if gate is not None:
        out = out * sigmoid(gate)
    return out


def prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale: float, gate=None) -> np.ndarray:
    """Varlen causal prefill: q [T, Hq, D] packed; sequence i's q_len new tokens are its last positions."""
    q = _f64(q)
    out = np.zeros_like(q)
    cu = np.asarray(cu_seqlens_q)
    for i in range(len(cu) - 1):
        a, b = int(cu[i]), int(cu[i + 1])
        if b <= a:
            continue
        L = int(seq_lens[i])
        k = depage(k_cache, block_tables[i], L)
        v = depage(v_cache, block_tables[i], L)
        pos = L - (b - a) + np.arange(b - a)
        out[a:b] = attention(q[a:b], k, v, scale, pos, None if gate is None else gate[a:b])
    return out


def decode(q, k_cache, v_cache, block_tables, seq_lens, scale: float, gate=None) -> np.ndarray:
    """q [B, Hq, D], one token per sequence at position seq_lens[b] - 1 (sees all L keys); L == 0 -> zeros."""
    q = _f64(q)
    out = np.zeros_like(q)
    for b in range(q.shape[0]):
        L = int(seq_lens[b])
        if L <= 0:
            continue
        k = depage(k_cache, block_tables[b], L)
        v = depage(v_cache, block_tables[b], L)
        out[b] = attention(q[b:b + 1], k, v, scale, [L - 1], None if gate is None else gate[b:b + 1])[0]
    return out


def rel_err(out, ref) -> float:
    out, ref = _f64(out), _f64(ref)
    den = np.linalg.norm(ref.ravel())
    return float(np.linalg.norm((out - ref).ravel()) / (den if den > 0 else 1.0))
