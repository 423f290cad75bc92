"""A model of the synchronisation protocol of the warp-specialised prefill (kernels_src/attn/prefill_ws.py): the
producer's and both consumers' mbarrier waits and arrivals, in the kernel's order, run under random schedules.
A hang on the GPU costs a device call and gives no diagnosis, so the protocol is checked here: every schedule
must finish, for every pair of per-warp-group tile counts (a warp group's own tiles can be fewer than the ring's:
the diagonal band, rows past q_len, inconsistent lengths), ring depths 2 and 3, with and without ping-pong.

The model follows the kernel's loops statement for statement (keep them in step when either changes): an mbarrier
counts arrivals per phase, ``wait(parity)`` passes once the phase of that parity has completed (PTX try_wait.parity
semantics: a fresh barrier passes parity 1), TMA loads land at once (a slower landing only delays). The second
test shows the model finds the deadlock of the first draft, whose idle warp groups released their tiles before
taking their turns."""
from __future__ import annotations

import random

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
