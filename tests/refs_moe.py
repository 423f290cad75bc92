"""float64 numpy references of the moe family (router, grouping invariants, combine, the whole block), and a
TEST-ONLY float32 stand-in of the grouped GEMM contract (never shipped: the real one is ops/moe/grouped_ops.py)."""
from __future__ import annotations

import numpy as np


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def route(x, gate_w, top_k, renorm, sg=None):
    """(ids [M, k'], weights [M, k'], probs [M, E]) in float64; ties: the lower id (stable descending sort)."""
    p = softmax(x @ gate_w.T)
    order = np.argsort(-p, axis=1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, order, axis=1)
    if renorm:
        w = w / w.sum(axis=1, keepdims=True)
    if sg is not None:
        E = gate_w.shape[0]
        order = np.concatenate([order, np.full((x.shape[0], 1), E)], axis=1)
        w = np.concatenate([w, 1.0 / (1.0 + np.exp(-(x @ sg.reshape(-1))))[:, None]], axis=1)
    return order.astype(np.int64), w, p


def near_tie_rows(p, top_k, rel=1e-5):
    """Rows whose sorted probabilities p_(1) >= ... >= p_(k+1) have two neighbours within rel of each other (order,
    or the k-th pick, may differ from fp32 by rounding)."""
    s = -np.sort(-p, axis=1)[:, :top_k + 1]
    gaps = s[:, :-1] - s[:, 1:]
    return np.nonzero((gaps <= rel * s[:, 1:]).any(axis=1))[0]


def check_align(ids, E, bm, sorted_ids, block_expert, num_padded, cap):
    """Every invariant of align's output for flat ids [P] (numpy int arrays); raises AssertionError."""
    ids = np.asarray(ids).reshape(-1)
    P = ids.size
    valid = (ids >= 0) & (ids < E)
    cnt = np.bincount(ids[valid], minlength=E)[:E]
    pc = -(-cnt // bm) * bm
    off = np.concatenate([[0], np.cumsum(pc)])
    npad = int(off[-1])
    assert int(num_padded[0]) == npad, (int(num_padded[0]), npad)
    assert sorted_ids.shape == (cap,) and block_expert.shape == (cap // bm,)
    for e in range(E):
        grp = sorted_ids[off[e]:off[e] + cnt[e]]
        want = np.nonzero(ids == e)[0]
        assert np.array_equal(np.sort(grp), want), f"expert {e}: pairs {grp} != {want}"
        assert np.array_equal(grp, want), f"expert {e}: not in pair order"
        assert (sorted_ids[off[e] + cnt[e]:off[e + 1]] == P).all(), f"expert {e}: padding"
        assert (block_expert[off[e] // bm:off[e + 1] // bm] == e).all(), f"expert {e}: block_expert"
    assert (sorted_ids[npad:] == P).all(), "tail of sorted_ids"
    assert (block_expert[npad // bm:] == -1).all(), "tail of block_expert"
    real = sorted_ids[sorted_ids < P]
    assert np.array_equal(np.sort(real), np.nonzero(valid)[0]), "each valid pair exactly once"
    return npad


def combine(y, ids, w, E):
    """y [P, H], ids / w [M, k'] (w None: unweighted) -> float64 [M, H] over the valid ids."""
    M, k = ids.shape
    yy = y.reshape(M, k, -1)
    ww = np.ones((M, k)) if w is None else w
    ok = (ids >= 0) & (ids < E)
    return np.einsum("mk,mkh->mh", np.where(ok, ww, 0.0), np.where(ok[..., None], yy, 0.0))


def silu(v):
    return v / (1.0 + np.exp(-v))


def block(x, gate_w, w1, w2, top_k, renorm, sg=None):
    """The MoE block in float64 (the shared expert as expert E of w1 / w2 when sg is given)."""
    ids, w, _ = route(x, gate_w, top_k, renorm, sg)
    M, H = x.shape
    I = w2.shape[2]
    out = np.zeros((M, H))
    for m in range(M):
        for j, e in enumerate(ids[m]):
            gu = w1[e] @ x[m]
            out[m] += w[m, j] * (w2[e] @ (silu(gu[:I]) * gu[I:]))
    return out


def grouped_gemm_standin(a, w, sorted_ids, block_expert, num_padded, *, a_row_div, out, block_m, act=None,
                         row_scale=None):
    """The grouped GEMM's contract on float32 numpy arrays (out updated in place, bf16 rounding left to the
    caller): for p < num_padded with f = sorted_ids[p] < P and e = block_expert[p // block_m] in [0, E'):
    out[f] = a[f // a_row_div] @ w[e]^T (silu_mul: silu(gate) * up of the two halves) * row_scale[f]."""
    P = out.shape[0]
    n = int(num_padded[0])
    for p in range(min(n, sorted_ids.shape[0])):
        f = int(sorted_ids[p])
        e = int(block_expert[p // block_m])
        if not (0 <= f < P and 0 <= e < w.shape[0]):
            continue
        r = w[e].astype(np.float32) @ a[f // a_row_div].astype(np.float32)
        if act == "silu_mul":
            N = r.shape[0] // 2
            r = silu(r[:N]) * r[N:]
        if row_scale is not None:
            r = r * row_scale[f]
        out[f] = r


def pairs_down(h, w2, ids, wts):
    """float64 out [M, H] of the decode down kernels: per token m, sum over its picks j with a valid id
    e = ids[m, j] (in [0, E')) of wts[m, j] * (w2[e] @ h[m k + j])."""
    M, k = ids.shape
    out = np.zeros((M, w2.shape[1]))
    for m in range(M):
        for j in range(k):
            if 0 <= ids[m, j] < w2.shape[0]:
                out[m] += wts[m, j] * (w2[ids[m, j]] @ h[m * k + j])
    return out
