"""float64 numpy references for the sampler family (kernels_src/sample). Torch-free; reused by GPU tests.

Parameter rows as vkc_runtime.ops.sample lays them out: fparams [B, 8] (temperature, top_p, min_p, repetition,
presence, frequency), iparams [B, 4] (top_k, seed, step, slot); counts [slots, V] int32 with the prompt bit.
"""
from __future__ import annotations

import numpy as np

PROMPT_BIT = 1 << 30
COUNT_MASK = PROMPT_BIT - 1


def processed(logits, fp, ip, counts=None):
    """[B, V] float64 processed logits: vLLM's penalties (repetition over prompt + output tokens, then
    frequency x count and presence once over output tokens), then / temperature for sampling rows."""
    x = np.asarray(logits, dtype=np.float64).copy()
    S = 0 if counts is None else counts.shape[0]
    for b in range(x.shape[0]):
        temp, _, _, rep, pres, freq = (float(v) for v in fp[b, :6])
        slot = int(ip[b, 3])
        rep = rep if rep > 0 else 1.0
        if 0 <= slot < S and (rep != 1.0 or pres != 0.0 or freq != 0.0):
            c = counts[slot].astype(np.int64)
            n = (c & COUNT_MASK).astype(np.float64)
            seen = c != 0
            row = x[b]
            row = np.where(seen, np.where(row > 0, row / rep, row * rep), row)
            x[b] = row - freq * n - np.where(n > 0, pres, 0.0)
        if temp > 0:
            x[b] = x[b] / temp
    return x


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def allowed(l, top_k, top_p, min_p):
    """Boolean [V]: the joint min-p / top-k / top-p set of one processed row (kernels_src/sample/sample.py)."""
    l = np.asarray(l, dtype=np.float64)
    V = l.shape[0]
    m = l.max()
    w = np.exp(l - m)
    Z = w.sum()
    order = np.argsort(-l, kind="stable")
    ls, ws = l[order], w[order]
    # strictly larger mass / count per distinct value: searchsorted on the descending values
    first = np.searchsorted(-ls, -ls, side="left")  # index of the first element equal to each value
    above_cnt = first
    csum = np.concatenate([[0.0], np.cumsum(ws)])
    above_mass = csum[first]
    ok = np.ones(V, bool)
    if 0 < top_k < V:
        ok &= above_cnt < top_k
    if top_p < 1.0:
        ok &= above_mass < max(top_p, 1e-30) * Z
    if min_p > 0.0:
        ok &= ls >= m + np.log(min(min_p, 1.0))
    res = np.zeros(V, bool)
    res[order] = ok
    return res


def margins(l, top_p, min_p):
    """Distances of the row's filter quantities from their cut-offs (relative mass for top-p, log-space for
    min-p): tests require them to exceed the fp32-vs-float64 noise, so the reference set is the kernel's."""
    l = np.asarray(l, dtype=np.float64)
    m = l.max()
    w = np.exp(l - m)
    Z = w.sum()
    out = []
    if top_p < 1.0:
        above = np.array([w[l > v].sum() for v in np.unique(l)]) / Z
        out.append(np.min(np.abs(above - top_p)))
    if min_p > 0.0:
        out.append(np.min(np.abs((l - m) - np.log(min_p))))
    return min(out) if out else np.inf


def chi_square(observed, expected_p):
    """Pearson's statistic of counts against probabilities (categories with p > 0)."""
    observed = np.asarray(observed, dtype=np.float64)
    e = np.asarray(expected_p, dtype=np.float64) * observed.sum()
    keep = e > 0
    assert observed[~keep].sum() == 0, "samples outside the expected support"
    return float(((observed[keep] - e[keep]) ** 2 / e[keep]).sum()), int(keep.sum()) - 1


def chi2_bound(df: int) -> float:
    """An upper bound on the chi-square quantile at 1 - 1e-6 (Wilson-Hilferty with z = 4.9; conservative)."""
    z = 4.9
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3
