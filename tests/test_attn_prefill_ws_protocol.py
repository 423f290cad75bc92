"""Models of the warp-specialised prefill (kernels_src/attn/prefill_ws.py), which Triton's interpreter cannot run.

1. Its synchronisation protocol: the
producer's and both consumers' mbarrier waits and arrivals, in the kernel's order, run under random schedules.
A hang on the GPU costs a device call and gives no diagnosis, so the protocol is checked here: every schedule
must finish, for every pair of per-warp-group tile counts (a warp group's own tiles can be fewer than the ring's:
the diagonal band, rows past q_len, inconsistent lengths), ring depths 2 and 3, with and without ping-pong.

The model follows the kernel's loops statement for statement (keep them in step when either changes): an mbarrier
counts arrivals per phase, ``wait(parity)`` passes once the phase of that parity has completed (PTX try_wait.parity
semantics: a fresh barrier passes parity 1), TMA loads land at once (a slower landing only delays). The second
test shows the model finds the deadlock of the first draft, whose idle warp groups released their tiles before
taking their turns.

2. Its tile arithmetic in float64 (numpy): per m-block and warp group the kernel's key ranges (n_full, n_mine,
my_tiles, n_end), masks, tail tiles read as zeros past L, and the reordered online softmax (O rescaled after the
previous tile's PV lands), against causal attention, for prefixes, every length class around the 64-row warp
group and 128-row block, and inconsistent lengths (L < q_len: rows that see no key give zeros)."""
from __future__ import annotations

import random

import numpy as np
import pytest


class Bar:
    def __init__(self, count: int):
        self.count, self.pending, self.phase = count, count, 0  # phase: completed phases

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def passes(self, parity: int) -> bool:
        return self.phase % 2 != parity


def producer(n_tiles, S, k_full, v_full, empty):
    for i in range(n_tiles):
        yield empty[i % S], ((i // S) & 1) ^ 1
        k_full[i % S].arrive()
        yield empty[S + i % S], ((i // S) & 1) ^ 1
        v_full[i % S].arrive()


def consumer(wg, my, n_tiles, S, k_full, v_full, empty, turn, pingpong, turns_in_drain=True):
    def take(k):  # _turn
        if pingpong:
            yield turn[wg], k & 1

    def give():  # _pass
        if pingpong:
            turn[1 - wg].arrive()

    done = 0
    if my > 0:
        yield k_full[0], 0
        yield from take(0)
        give()
        empty[0].arrive()
        for i in range(1, my):
            yield k_full[i % S], (i // S) & 1
            yield v_full[(i - 1) % S], ((i - 1) // S) & 1
            yield from take(i)
            give()
            empty[i % S].arrive()
            empty[S + (i - 1) % S].arrive()
        yield v_full[(my - 1) % S], ((my - 1) // S) & 1
        yield from take(my)
        give()
        empty[S + (my - 1) % S].arrive()
        done = my + 1
    for i in range(my, n_tiles):
        yield k_full[i % S], (i // S) & 1
        yield v_full[i % S], (i // S) & 1
        empty[i % S].arrive()
        empty[S + i % S].arrive()
        if turns_in_drain:
            yield from take(done)
            give()
            done += 1
    for k in range(done, n_tiles + 1):
        yield from take(k)
        give()


def finishes(my0, my1, n_tiles, S, pingpong, seed, turns_in_drain=True) -> bool:
    k_full, v_full = [Bar(1) for _ in range(S)], [Bar(1) for _ in range(S)]
    empty, turn = [Bar(2) for _ in range(2 * S)], [Bar(1), Bar(1)]  # K slots, then V slots
    if pingpong:
        turn[0].arrive()  # warp group 0 takes the first turn
    parts = [producer(n_tiles, S, k_full, v_full, empty),
             consumer(0, my0, n_tiles, S, k_full, v_full, empty, turn, pingpong, turns_in_drain),
             consumer(1, my1, n_tiles, S, k_full, v_full, empty, turn, pingpong, turns_in_drain)]
    waiting = [None] * 3
    live = {0, 1, 2}
    rnd = random.Random(seed)
    while live:
        ready = [p for p in live if waiting[p] is None or waiting[p][0].passes(waiting[p][1])]
        if not ready:
            return False
        p = rnd.choice(ready)
        try:
            waiting[p] = next(parts[p])
        except StopIteration:
            live.discard(p)
    return True


@pytest.mark.parametrize("S", [2, 3])
@pytest.mark.parametrize("pingpong", [False, True])
def test_prefill_ws_protocol_never_hangs(S, pingpong):
    for n in range(0, 7):
        for my0 in range(0, n + 1):
            for my1 in range(0, n + 1):
                for seed in range(8):
                    assert finishes(my0, my1, n, S, pingpong, seed), (my0, my1, n, S, pingpong, seed)


def test_protocol_model_finds_the_draft_deadlock():
    hung = [(m0, m1, n) for n in range(3, 7) for m0 in range(n + 1) for m1 in range(n + 1)
            if not all(finishes(m0, m1, n, 2, True, seed, turns_in_drain=False) for seed in range(4))]
    # e.g. warp group 1 past q_len (no tiles of its own) while warp group 0 reads all six
    assert (6, 0, 6) in hung and (0, 6, 6) in hung, hung


BN, WM, BM = 64, 64, 128  # BLOCK_N, rows per warp group, BLOCK_M


def ws_rows(q, k, v, q_len, L, mb, wg, scale):
    """The rows of warp group ``wg`` of m-block ``mb`` as the kernel computes them (float64)."""
    ctx0, m0 = L - q_len, mb * BM
    n_end = max(min(ctx0 + min(m0 + BM, q_len), L), 0)
    r0 = m0 + wg * WM
    n_full = max(min((ctx0 + r0 + 1) // BN * BN, L // BN * BN), 0)
    n_mine = min(ctx0 + min(r0 + WM, q_len), L)
    my_tiles = max((n_mine + BN - 1) // BN, 0) if r0 < q_len else 0
    assert my_tiles <= (n_end + BN - 1) // BN
    rows = np.arange(r0, r0 + WM)
    qq = np.where((rows < q_len)[:, None], q[np.minimum(rows, q_len - 1)], 0.0)
    pos, qs = ctx0 + rows, scale * 1.4426950408889634

    def tile(n):  # slots past L read as zeros (the tail descriptors)
        live = (n + np.arange(BN)) < L
        idx = np.minimum(n + np.arange(BN), L - 1)
        return np.where(live[:, None], k[idx], 0.0), np.where(live[:, None], v[idx], 0.0)

    def softmax(s, m, l, n):
        if n + BN <= n_full:
            m_new = np.maximum(m, s.max(1) * qs)
            alpha, p = np.exp2(m - m_new), np.exp2(s * qs - m_new[:, None])
        else:
            offs = n + np.arange(BN)
            s = np.where((offs[None, :] <= pos[:, None]) & (offs[None, :] < L), s * qs, -np.inf)
            m_new = np.maximum(m, s.max(1))
            m_use = np.where(m_new == -np.inf, 0.0, m_new)
            alpha, p = np.exp2(m - m_use), np.exp2(s - m_use[:, None])
        return p, alpha, m_new, l * alpha + p.sum(1)

    m, l, acc = np.full(WM, -np.inf), np.zeros(WM), np.zeros((WM, v.shape[1]))
    if my_tiles > 0:
        kk, vv = tile(0)
        p, _, m, l = softmax(qq @ kk.T, m, l, 0)
        for i in range(1, my_tiles):
            s = qq @ tile(i * BN)[0].T
            acc = acc + p @ vv  # the PV of tile i - 1 lands after tile i's softmax started
            p, alpha, m, l = softmax(s, m, l, i * BN)
            acc = acc * alpha[:, None]
            vv = tile(i * BN)[1]
        acc = acc + p @ vv
    return rows, acc / np.where(l > 0, l, 1.0)[:, None]


@pytest.mark.parametrize("q_len,L", [(1, 1), (5, 5), (64, 64), (65, 65), (127, 127), (128, 128), (129, 129),
                                     (300, 300), (300, 1000), (1, 4096), (200, 263), (77, 141), (64, 128),
                                     (130, 321), (3, 2), (100, 50)])
def test_prefill_ws_tile_math_matches_causal_attention(q_len, L):
    g = np.random.default_rng(q_len * 7919 + L)
    D, scale = 32, 32 ** -0.5
    q, k, v = g.standard_normal((q_len, D)), g.standard_normal((L, D)), g.standard_normal((L, D))
    for mb in range(-(-q_len // BM)):
        for wg in (0, 1):
            rows, out = ws_rows(q, k, v, q_len, L, mb, wg, scale)
            for r, o in zip(rows, out):
                if r >= q_len:
                    continue
                nk = min(L - q_len + r + 1, L)  # keys 0 .. position, inside the cache
                if nk <= 0:
                    ref = np.zeros(D)
                else:
                    s = k[:nk] @ q[r] * scale
                    w = np.exp(s - s.max())
                    ref = w / w.sum() @ v[:nk]
                np.testing.assert_allclose(o, ref, rtol=0, atol=1e-12)
