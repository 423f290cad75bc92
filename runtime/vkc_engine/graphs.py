"""CUDA graphs for pure-decode steps: one captured forward per batch-size bucket, replayed with the step's
metadata written into the fixed buffers the graph reads.

Bucket rule (:func:`bucket_sizes`): 1, 2, 4, 8, then multiples of 8 up to 32 (16, 24, 32), then multiples of
16 (48, 64, 80, ...), capped at the step's row limit ``min(max_num_seqs, max_num_batched_tokens)``, which is
always the last bucket. A decode step of N sequences replays the smallest bucket B >= N (:func:`bucket_for`);
the B - N padding rows touch nothing (:func:`pad_decode`): KV slot -1 (reshape_and_cache skips it), context
length 0 and an all -1 block-table row (attention reads no key), GDN/conv slot -1, outside [0, num_slots) ("no
state": zeros read, nothing written back), token id 0 at position 0 (a valid embedding row, so every value
stays finite), and the logit rows 0 .. B-1 (padding rows' logits are computed and never sampled). These are the
ops' documented rules for out-of-range device indices (ARCHITECTURE.md section 7; the docstrings of
vkc_runtime.ops.attn, .conv and .gdn_decode).

What a graph holds: the model forward from the metadata buffers (ids, positions, slot_mapping, seq_lens,
block_tables, gdn_slots, logit_rows) to the logits buffer, with the backend's captured-decode op choices
(``backend.graph_ops()``: small-M linear on ops.gemv). Sampling stays an eager launch after the replay (the
backend's ``sample``: per-request parameters, and whatever per-request state the sampler grows, stay in one
place). Each bucket is first run eagerly once on all-padding rows (loads every kernel module, sizes the gemv
workspace), then every bucket is captured; mixed and prefill steps, and decode steps of more rows than the last
bucket, run eagerly. ``LLM(..., enforce_eager=True)`` captures nothing.
"""
from __future__ import annotations

import numpy as np

from .model import Step, host_step_arrays

__all__ = ["bucket_sizes", "bucket_for", "pad_decode", "DecodeGraphs"]


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


def pad_decode(host: dict, bucket: int) -> dict:
    """``host_step_arrays`` of a decode step of N <= bucket one-token sequences, padded to ``bucket`` rows
    that touch nothing (module docstring). Every key of the graph's metadata is returned, N real rows first."""
    N = int(host["seq_lens"].shape[0])
    B = int(bucket)
    if not 0 <= N <= B or host["ids"].shape[0] != N:
        raise ValueError(f"pad_decode: {N} decode rows ({host['ids'].shape[0]} tokens) do not fit bucket {B}")
    p = B - N

    def ext(a, fill):
        return np.concatenate([np.asarray(a, np.int32), np.full(p, fill, np.int32)])

    bt = host["block_tables"]
    return {"ids": ext(host["ids"], 0), "positions": ext(host["positions"], 0),
            "slot_mapping": ext(host["slot_mapping"], -1), "seq_lens": ext(host["seq_lens"], 0),
            "cu_seqlens": np.arange(B + 1, dtype=np.int32),
            "block_tables": np.concatenate([bt.astype(np.int32), np.full((p, bt.shape[1]), -1, np.int32)]),
            "gdn_slots": ext(host["gdn_slots"], -1), "logit_rows": np.arange(B, dtype=np.int32)}


class DecodeGraphs:
    """The captured decode forwards of one engine (``llm``: model, cache, metadata buffers, block geometry)."""

    def __init__(self, llm, *, log=None):
        self.llm = llm
        self.be = be = llm.backend
        rows = min(llm.max_num_seqs, llm.max_num_batched_tokens)
        self.buckets = bucket_sizes(rows)
        self.graphs: dict[int, object] = {}
        self._steps = {B: self._step(B) for B in self.buckets}
        try:
            with be.graph_ops():
                for B in self.buckets:  # eager warm-up of every bucket first: modules, gemv workspace size
                    self._write(pad_decode(host_step_arrays([], llm.plan.block_size, llm.max_blocks), B))
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
        """The step a bucket's graph reads: views of the first rows of the engine's metadata buffers (the
        same addresses upload_into writes)."""
        be, m, mb = self.be, self.llm._meta, self.llm.max_blocks
        return Step(T=B, N=B, decode=True, ids=be.rows(m["ids"], B), positions=be.rows(m["positions"], B),
                    slot_mapping=be.rows(m["slot_mapping"], B), cu_seqlens=be.rows(m["cu_seqlens"], B + 1),
                    seq_lens=be.rows(m["seq_lens"], B),
                    block_tables=be.rows(m["block_tables"], B * mb).reshape(B, mb),
                    gdn_slots=be.rows(m["gdn_slots"], B), logit_rows=be.rows(m["logit_rows"], B), n_logits=B)

    def _forward(self, B: int):
        return self.llm.model.forward(self.llm.cache, self._steps[B])

    def _write(self, padded: dict) -> None:
        m = self.llm._meta
        for k, v in padded.items():
            self.be.upload_into(m[k], v)

    def bucket(self, chunks) -> int | None:
        """The bucket that runs this step, or None (eager): every sequence brings exactly its one latest token
        (a decode row, sampled) and there are at most as many as the largest bucket."""
        if not chunks or any(len(c[0]) != 1 or c[4] != "last" for c in chunks):
            return None
        return bucket_for(len(chunks), self.buckets) if self.graphs else None

    def run(self, chunks, bucket: int):
        """Replay the bucket's graph for a decode step; returns the logits [N, V] (device) of its N rows."""
        llm = self.llm
        host = host_step_arrays(chunks, llm.plan.block_size, llm.max_blocks)
        self._write(pad_decode(host, bucket))
        self.be.replay(self.graphs[bucket])
        return self.be.rows(llm.model.bufs["logits"], len(chunks))

    def profile(self, chunks) -> dict:
        """Device time per kernel family of this decode step's graph: the step captured once more with a CUDA
        event before every op (backend.profile_start), replayed once, timed and released. The replay is a real
        forward (the sequences' GDN states advance and their KV rows are rewritten): for measurements only."""
        B = self.bucket(chunks)
        if B is None:
            raise ValueError("profile() needs a pure decode step that fits a bucket")
        llm, be = self.llm, self.be
        self._write(pad_decode(host_step_arrays(chunks, llm.plan.block_size, llm.max_blocks), B))
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
