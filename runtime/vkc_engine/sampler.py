"""Sampling parameters and the host sampler (numpy): greedy, temperature, top-k, top-p, min-p, per-request seeds.

``VkcBackend.sample`` draws on the device (``vkc_runtime.ops.sample``); :func:`sample_host` is the numpy
backend's sampler and the CPU tests' reference. Order per row: temperature 0 -> argmax; else logits / T,
top-k, then softmax, top-p (smallest prefix of the sorted probabilities whose mass reaches p; the top token
always stays), min-p (drop tokens below min_p x the top probability), renormalise, draw one token with the
request's generator.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["SamplingParams", "sample_host", "make_generator"]


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
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_generator(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


def _row(logits: np.ndarray, p: SamplingParams, gen: np.random.Generator) -> int:
    if p.greedy:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / p.temperature
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


def sample_host(logits: np.ndarray, params: list[SamplingParams], generators: list) -> np.ndarray:
    """One token per row of logits [B, V] (float32) -> int32 [B]."""
    if logits.ndim != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(f"sample_host: {logits.shape} logits for {len(params)} parameter rows")
    return np.array([_row(logits[i], params[i], generators[i]) for i in range(len(params))], dtype=np.int32)
