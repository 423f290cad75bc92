"""Sequences and the scheduler: continuous batching, chunked prefill mixed with decode under a per-step token
budget, FCFS admission, preemption by recompute.

Each step, running sequences come first (in arrival order): a decoding sequence asks for one token, a
prefilling one for as much of its remaining prompt as the budget leaves (chunked prefill), one whose last token
is still being drawn for nothing. When the KV blocks
run out, the most recently admitted running sequence is preempted: its blocks and state slot are freed, its
progress is forgotten and it goes back to the front of the waiting queue, to be recomputed from its prompt
plus the tokens it already produced. Waiting sequences are admitted while budget, a state slot, KV blocks and
``max_num_seqs`` allow (not in a step that had to preempt).
"""
from __future__ import annotations

import enum
import itertools
from collections import deque

from .cache import BlockPool, SlotPool
from .sampler import SamplingParams, make_generator

__all__ = ["Status", "Sequence", "Scheduler"]

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request: its tokens, its cache holdings and its sampling state."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, *, request_id: str | None = None,
                 prompt: str | None = None):
        if not prompt_ids:
            raise ValueError("a request needs at least one prompt token")
        self.seq_id = next(_ids)
        self.request_id = request_id if request_id is not None else str(self.seq_id)
        self.prompt = prompt
        self.prompt_ids = [int(t) for t in prompt_ids]
        self.output_ids: list[int] = []
        self.params = params
        self.status = Status.WAITING
        self.num_computed = 0           # tokens whose K/V and GDN state are in the cache
        self.block_table: list[int] = []
        self.slot: int | None = None
        self.generator = make_generator(params.seed)
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.detok = None               # set by the engine (incremental detokenizer)
        self.output_text = ""
        self.sent_chars = 0             # characters of output_text already streamed
        self.logprobs = [] if params.logprobs is not None else None  # sampler.Logprob per output token
        # overlapped steps (vkc_engine.llm): tokens drawn on the device whose values the host has not read yet;
        # ``ahead`` = 1 when the newest of them is this sequence's next input (``ahead_src``: (the step that
        # draws it, its row)), so the scheduler counts it and the next step feeds it from the device
        self.num_inflight = 0
        self.ahead = 0
        self.ahead_src = None

    @property
    def tokens(self) -> list[int]:
        """The tokens the host knows (prompt + output read back)."""
        return self.prompt_ids + self.output_ids

    def token_slice(self, start: int, n: int) -> list[int]:
        """``tokens[start:start + n]`` without building the whole list (a decode row reads one output token)."""
        P = len(self.prompt_ids)
        if start >= P:
            return self.output_ids[start - P:start - P + n]
        if start + n <= P:
            return self.prompt_ids[start:start + n]
        return self.prompt_ids[start:] + self.output_ids[:start + n - P]

    @property
    def num_known(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens to compute eventually: the known ones and the one drawn ahead on the device (if any)."""
        return len(self.prompt_ids) + len(self.output_ids) + self.ahead

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


class Scheduler:
    def __init__(self, blocks: BlockPool, slots: SlotPool, *, max_num_seqs: int, max_num_batched_tokens: int):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.blocks, self.slots = blocks, slots
        self.max_num_seqs = min(int(max_num_seqs), slots.num_slots)
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[tuple[Sequence, int]], list[int]]:
        """This step's (sequence, number of new tokens) in batch order, and the state slots handed out now
        (the caller zeroes them before the forward)."""
        budget = self.max_num_batched_tokens
        out: list[tuple[Sequence, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            if n == 0:  # its last token is still being drawn (overlapped steps): nothing to compute now
                i += 1
                continue
            while not self.blocks.can_grow(seq.block_table, seq.num_computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break  # it preempted itself: everything after it is gone too
            self.blocks.grow(seq.block_table, seq.num_computed + n)
            out.append((seq, n))
            budget -= n
            i += 1
        new_slots: list[int] = []
        while (not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
               and self.slots.num_free):
            seq = self.waiting[0]
            n = min(seq.num_tokens, budget)
            if not self.blocks.can_grow(seq.block_table, n):
                break
            self.waiting.popleft()
            seq.slot = self.slots.take()
            new_slots.append(seq.slot)
            seq.status = Status.RUNNING
            self.blocks.grow(seq.block_table, n)
            self.running.append(seq)
            out.append((seq, n))
            budget -= n
        return out, new_slots

    def _release(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        if seq.slot is not None:
            self.slots.release(seq.slot)
            seq.slot = None
        if seq in self.running:
            self.running.remove(seq)

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Free the sequence's blocks and slot (running or waiting) and mark it finished."""
        self._release(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
