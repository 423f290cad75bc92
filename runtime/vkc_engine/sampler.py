"""Sampling parameters and the host sampler (numpy): penalties, greedy, temperature, top-k, top-p, min-p,
per-request seeds, log-probabilities.

``VkcBackend.sample`` draws on the device (``vkc_runtime.ops.sample``); :func:`sample_rows` is the numpy
backend's sampler and the CPU tests' reference. Order per row: penalties (as ``ops.sample`` applies them,
kernels_src/sample/sample.py: repetition divides positive / multiplies negative logits of every token seen in
the prompt or the output, frequency subtracts ``freq * count`` and presence ``pres`` once, both over output
tokens); temperature 0 -> argmax of the penalized logits; else logits / T, top-k, then softmax, top-p (smallest
prefix of the sorted probabilities whose mass reaches p; the top token always stays), min-p (drop tokens below
min_p x the top probability), renormalise, draw one token with the request's generator. (The device kernel
measures top-k, top-p and min-p jointly on the full distribution: with several filters at once its allowed set
can be smaller; ops.sample's docstring.)

Log-probabilities (``SamplingParams.logprobs``: ``None`` none, ``n >= 0`` the sampled token's plus the top n),
as the kernel defines them: log-softmax of the processed logits (penalized, tempered; greedy rows untempered),
before the filters; top n largest first, ties lower id first.

Penalty counts: :class:`HostCounts` is the numpy twin of ``ops.sample.counts_buffer`` (int32 [slots, V], the
output count of each token | PROMPT_BIT for prompt tokens), one row per sequence slot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SamplingParams", "Logprob", "SampleResult", "HostCounts", "sample_host", "sample_rows", "row_logprob",
           "make_generator", "PROMPT_BIT", "MAX_LOGPROBS"]

PROMPT_BIT = 1 << 30          # as vkc_runtime.ops.sample.PROMPT_BIT
_COUNT_MASK = PROMPT_BIT - 1
MAX_LOGPROBS = 20             # as vkc_runtime.ops.sample.MAX_TOP_LOGPROBS


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0          # 0 or -1: off
    min_p: float = 0.0
    max_tokens: int = 16
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    repetition_penalty: float = 1.0   # 1: off; > 1 discourages tokens of the prompt and the output
    presence_penalty: float = 0.0     # 0: off; subtracted once from every token already in the output
    frequency_penalty: float = 0.0    # 0: off; subtracted per occurrence in the output
    logprobs: int | None = None       # None: none; n: the sampled token's log-probability and the top n

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0


@dataclass
class Logprob:
    """One generated token's log-probability and the top alternatives ``[(token_id, logprob), ...]`` (largest
    first; as many as the request asked for)."""
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class SampleResult:
    """One step's draws: ``tokens`` int32 [B]; with log-probabilities requested by any row, ``logprobs`` float32
    [B] (the sampled tokens') and ``top_ids`` int32 / ``top_logprobs`` float32 [B, n] (n = the largest request;
    a row takes its own first ``params.logprobs`` columns)."""
    tokens: np.ndarray
    logprobs: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None


class HostCounts:
    """Penalty token counts on the host, int32 [num_slots, V] (layout of ops.sample.counts_buffer)."""

    def __init__(self, num_slots: int, V: int):
        self.counts = np.zeros((num_slots, V), np.int32)

    def init(self, slot: int, prompt_ids, output_ids) -> None:
        """Row ``slot`` := the prompt bit of each prompt token | the number of times each output token occurs."""
        row = self.counts[slot]
        row[...] = 0
        np.add.at(row, np.asarray(output_ids, np.int64), 1)
        row[np.asarray(prompt_ids, np.int64)] |= PROMPT_BIT

    def add(self, slots, tokens) -> None:
        for s, t in zip(slots, tokens):
            if s >= 0:
                self.counts[s, t] += 1


def make_generator(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


def _processed(logits: np.ndarray, p: SamplingParams, counts_row) -> np.ndarray:
    """float64 penalized (and, for sampling rows, tempered) logits of one row."""
    x = logits.astype(np.float64)
    if counts_row is not None and p.has_penalties:
        c = counts_row.astype(np.int64)
        n = (c & _COUNT_MASK).astype(np.float64)
        rep = float(np.float32(p.repetition_penalty))
        x = np.where(c != 0, np.where(x > 0, x / rep, x * rep), x)
        x = x - float(np.float32(p.frequency_penalty)) * n - np.where(n > 0, float(np.float32(p.presence_penalty)),
                                                                       0.0)
    if not p.greedy:
        x = x / p.temperature
    return x


def _draw(x: np.ndarray, p: SamplingParams, gen: np.random.Generator) -> int:
    if p.greedy:
        return int(np.argmax(x))
    V = x.shape[0]
    if 0 < p.top_k < V:
        kth = np.partition(x, V - p.top_k)[V - p.top_k]
        x = np.where(x >= kth, x, -np.inf)
    x = x - np.max(x)
    prob = np.exp(x)
    prob /= prob.sum()
    if p.top_p < 1:
        order = np.argsort(-prob, kind="stable")
        csum = np.cumsum(prob[order])
        keep = np.searchsorted(csum, p.top_p) + 1  # tokens up to the first whose cumulative mass reaches top_p
        mask = np.zeros(V, dtype=bool)
        mask[order[:keep]] = True
        prob = np.where(mask, prob, 0.0)
    if p.min_p > 0:
        prob = np.where(prob >= p.min_p * prob.max(), prob, 0.0)
    prob /= prob.sum()
    return int(gen.choice(V, p=prob))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x)
    return x - m - np.log(np.exp(x - m).sum())


def sample_rows(logits: np.ndarray, params: list[SamplingParams], generators: list, *, counts: HostCounts | None = None,
                slots=None) -> SampleResult:
    """One token per row of logits [B, V] (float32); ``slots[b]`` is row b's penalty row of ``counts`` (-1 or
    ``None``: no penalties). The sampled tokens of rows with a slot are added to ``counts``."""
    B = len(params)
    if logits.ndim != 2 or logits.shape[0] != B or B != len(generators):
        raise ValueError(f"sample_rows: {logits.shape} logits for {B} parameter rows")
    slots = [-1] * B if slots is None else [int(s) for s in slots]
    n_top = max((p.logprobs for p in params if p.logprobs is not None), default=None)
    toks = np.empty(B, np.int32)
    lps = np.empty(B, np.float32) if n_top is not None else None
    tv = np.full((B, n_top or 0), -np.inf, np.float32) if n_top else None
    ti = np.full((B, n_top or 0), -1, np.int32) if n_top else None
    for b, (p, g) in enumerate(zip(params, generators)):
        row = counts.counts[slots[b]] if counts is not None and slots[b] >= 0 else None
        x = _processed(logits[b], p, row)
        toks[b] = _draw(x, p, g)
        if lps is not None:
            ls = _log_softmax(x)
            lps[b] = ls[toks[b]]
            if n_top:
                order = np.argsort(-ls, kind="stable")[:n_top]  # stable: ties keep the lower id first
                order = order[np.isfinite(ls[order])]
                tv[b, :len(order)] = ls[order]
                ti[b, :len(order)] = order
    if counts is not None:
        counts.add(slots, toks)
    return SampleResult(toks, lps, ti, tv)


def row_logprob(res: SampleResult, b: int, p: SamplingParams) -> Logprob | None:
    """Row b's :class:`Logprob` from a step's result (None when the request asked for none)."""
    if p.logprobs is None or res.logprobs is None:
        return None
    top = []
    if p.logprobs and res.top_ids is not None:
        top = [(int(i), float(v)) for i, v in zip(res.top_ids[b, :p.logprobs], res.top_logprobs[b, :p.logprobs])
               if i >= 0]
    return Logprob(int(res.tokens[b]), float(res.logprobs[b]), top)


def sample_host(logits: np.ndarray, params: list[SamplingParams], generators: list) -> np.ndarray:
    """One token per row of logits [B, V] (float32) -> int32 [B] (no penalties)."""
    if logits.ndim != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(f"sample_host: {logits.shape} logits for {len(params)} parameter rows")
    return sample_rows(logits, params, generators).tokens
