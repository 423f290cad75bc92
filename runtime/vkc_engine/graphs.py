"""CUDA graphs for pure-decode steps: one captured forward per batch-size bucket, replayed with the step's
metadata written into the fixed buffers the graph reads.

Bucket rule (:func:`bucket_sizes`): 1, 2, 4, 8, then multiples of 8 up to 32 (16, 24, 32), then multiples of
16 (48, 64, 80, ...), capped at the step's row limit ``min(max_num_seqs, max_num_batched_tokens)``, which is
always the last bucket. A decode step of N sequences replays the smallest bucket B >= N (:func:`bucket_for`);
the B - N padding rows touch nothing (:meth:`DecodeLayout.fill`): KV slot -1 (reshape_and_cache skips it), context
length 0 and an all -1 block-table row (attention reads no key), GDN/conv slot -1, outside [0, num_slots) ("no
state": zeros read, nothing written back), token id 0 at position 0 (a valid embedding row, so every value
stays finite), and the logit rows 0 .. B-1 (padding rows' logits are computed and never sampled). These are the
ops' documented rules for out-of-range device indices (ARCHITECTURE.md section 7; the docstrings of
vkc_runtime.ops.attn, .conv and .gdn_decode).

What a graph holds: the model forward from its bucket's metadata buffer (ids, positions, slot_mapping, seq_lens,
gdn_slots, block_tables, logit_rows, cu_seqlens in one int32 array, :class:`DecodeLayout`: one upload per replay,
written by a host builder made for decode rows) to the logits buffer, with the backend's op choices for captured
decode steps (``backend.graph_ops()``: small-M linear on ops.gemv). Sampling stays an eager launch after the
replay (the backend's ``sample``: per-request parameters, and whatever per-request state the sampler grows, stay
in one place; its host work runs while the graph runs, so capturing it would not shorten the device timeline). Each bucket is first run eagerly once on all-padding rows (loads every kernel module, sizes the
gemv workspace), then every bucket is captured; mixed and prefill steps, and decode steps of more rows than the
last bucket, run eagerly. ``LLM(..., enforce_eager=True)`` captures nothing.
"""
from __future__ import annotations

import numpy as np

from .model import Step

__all__ = ["bucket_sizes", "bucket_for", "DecodeLayout", "DecodeGraphs", "FIELDS"]


def bucket_sizes(max_rows: int) -> tuple[int, ...]:
    """The batch sizes that get a graph, for steps of at most ``max_rows`` rows (module docstring)."""
    m = int(max_rows)
    if m < 1:
        raise ValueError(f"need at least one row per step, got {max_rows}")
    out = [b for b in (1, 2, 4, 8) if b < m]
    b = 16
    while b < m:
        out.append(b)
        b += 8 if b < 32 else 16
    out.append(m)
    return tuple(out)


def bucket_for(n: int, buckets) -> int | None:
    """The smallest bucket holding ``n`` rows, or None when ``n`` exceeds them all."""
    for b in buckets:
        if b >= n:
            return b
    return None


FIELDS = ("ids", "positions", "slot_mapping", "seq_lens", "gdn_slots", "block_tables", "logit_rows", "cu_seqlens")
_ALIGN = 16  # elements: every field starts 64-byte aligned


class DecodeLayout:
    """Where each field of a bucket's metadata lives in its one int32 buffer (one upload per replay):
    ids, positions, slot_mapping, seq_lens, gdn_slots [B] each, block_tables [B, max_blocks], logit_rows [B],
    cu_seqlens [B + 1], each starting at a multiple of 16 elements."""

    def __init__(self, bucket: int, max_blocks: int):
        self.B, self.mb = int(bucket), int(max_blocks)
        sizes = {f: self.B for f in FIELDS}
        sizes["block_tables"], sizes["cu_seqlens"] = self.B * self.mb, self.B + 1
        self.offsets, off = {}, 0
        for f in FIELDS:
            self.offsets[f] = off
            off += -(-sizes[f] // _ALIGN) * _ALIGN
        self.sizes, self.size = sizes, off

    def views(self, arr) -> dict:
        """The fields of a host array of this layout (numpy views)."""
        out = {f: arr[self.offsets[f]:self.offsets[f] + self.sizes[f]] for f in FIELDS}
        out["block_tables"] = out["block_tables"].reshape(self.B, self.mb)
        return out

    def host(self) -> np.ndarray:
        """A host array of this layout with the constant fields set (logit rows 0 .. B-1, cu_seqlens 0 .. B)."""
        arr = np.zeros(self.size, np.int32)
        v = self.views(arr)
        v["logit_rows"][:] = np.arange(self.B)
        v["cu_seqlens"][:] = np.arange(self.B + 1)
        return arr

    def fill(self, arr: np.ndarray, chunks, block_size: int) -> None:
        """Write a decode step of N <= B one-token chunks (tokens, start, block_table, gdn_slot, want) into
        ``arr``: the N real rows first, then B - N padding rows that touch nothing (module docstring)."""
        N, B = len(chunks), self.B
        if N > B:
            raise ValueError(f"{N} decode rows do not fit bucket {B}")
        v = self.views(arr)
        ids, pos, sm, lens, gs, bt = (v[f] for f in FIELDS[:6])
        toks = [c[0] for c in chunks]
        if any(len(t) != 1 for t in toks):
            raise ValueError("a decode step brings exactly one token per sequence")
        starts = [int(c[1]) for c in chunks]
        ids[:N] = [t[0] for t in toks]
        pos[:N] = starts
        lens[:N] = [p + 1 for p in starts]
        gs[:N] = [c[3] for c in chunks]
        sm[:N] = [c[2][p // block_size] * block_size + p % block_size for c, p in zip(chunks, starts)]
        bt.fill(-1)
        for i, c in enumerate(chunks):
            bt[i, :len(c[2])] = c[2]
        ids[N:], pos[N:], sm[N:], lens[N:], gs[N:] = 0, 0, -1, 0, -1


class DecodeGraphs:
    """The captured decode forwards of one engine (``llm``: model, cache, block geometry)."""

    def __init__(self, llm, *, log=None):
        self.llm = llm
        self.be = be = llm.backend
        rows = min(llm.max_num_seqs, llm.max_num_batched_tokens)
        self.buckets = bucket_sizes(rows)
        self.graphs: dict[int, object] = {}
        self.layouts = {B: DecodeLayout(B, llm.max_blocks) for B in self.buckets}
        self._host = {B: lay.host() for B, lay in self.layouts.items()}
        self._dev = {B: be.empty((lay.size,), "i32") for B, lay in self.layouts.items()}
        self._steps = {B: self._step(B) for B in self.buckets}
        try:
            with be.graph_ops():
                for B in self.buckets:  # eager warm-up of every bucket first: modules, gemv workspace size
                    self.write([], B)
                    self._forward(B)
                be.synchronize()
                for B in self.buckets:
                    self.graphs[B] = be.capture(lambda B=B: self._forward(B))
        except BaseException:
            self.close()
            raise
        if log is not None:
            log(f"CUDA graphs: decode buckets {', '.join(map(str, self.buckets))}")

    def _step(self, B: int) -> Step:
        """The step a bucket's graph reads: views of the bucket's metadata buffer."""
        be, lay, d = self.be, self.layouts[B], self._dev[B]
        v = {f: be.segment(d, lay.offsets[f], lay.sizes[f]) for f in FIELDS}
        return Step(T=B, N=B, decode=True, ids=v["ids"], positions=v["positions"], slot_mapping=v["slot_mapping"],
                    cu_seqlens=v["cu_seqlens"], seq_lens=v["seq_lens"],
                    block_tables=v["block_tables"].reshape(B, lay.mb), gdn_slots=v["gdn_slots"],
                    logit_rows=v["logit_rows"], n_logits=B)

    def _forward(self, B: int):
        return self.llm.model.forward(self.llm.cache, self._steps[B])

    def write(self, chunks, B: int) -> None:
        """Upload a decode step's rows, padded to bucket B, into the buffer the bucket's graph reads."""
        host = self._host[B]
        self.layouts[B].fill(host, chunks, self.llm.plan.block_size)
        self.be.upload_into(self._dev[B], host)

    def bucket(self, chunks) -> int | None:
        """The bucket that runs this step, or None (eager): every sequence brings exactly its one latest token
        (a decode row, sampled) and there are at most as many as the largest bucket."""
        if not chunks or any(len(c[0]) != 1 or c[4] != "last" for c in chunks):
            return None
        return bucket_for(len(chunks), self.buckets) if self.graphs else None

    def run(self, chunks, bucket: int, patch=None):
        """Replay the bucket's graph for a decode step; returns the logits [N, V] (device) of its N rows.
        ``patch(ids)`` rewrites token ids in the bucket's device buffer after the upload (overlapped steps)."""
        self.write(chunks, bucket)
        if patch is not None:
            patch(self._steps[bucket].ids)
        self.be.replay(self.graphs[bucket])
        return self.be.rows(self.llm.model.bufs["logits"], len(chunks))

    def profile(self, chunks) -> dict:
        """Device time per kernel family of this decode step's graph: the step captured once more with a CUDA
        event before every op (backend.profile_start), replayed once, timed and released. The replay is a real
        forward (the sequences' GDN states advance and their KV rows are rewritten): for measurements only."""
        B = self.bucket(chunks)
        if B is None:
            raise ValueError("profile() needs a pure decode step that fits a bucket")
        be = self.be
        self.write(chunks, B)
        be.profile_start()
        try:
            with be.graph_ops():
                g = be.capture(lambda: (self._forward(B), be.profile_mark()))
        except BaseException:
            be.profile_stop()
            raise
        try:
            return be.profile_stop(replay=lambda: be.replay(g))
        finally:
            be.release_graph(g)

    def close(self) -> None:
        """Destroy every graph (the buffers they read stay with the engine)."""
        graphs, self.graphs = self.graphs, {}
        for g in graphs.values():
            self.be.release_graph(g)
