"""Plan keys: which GEMM problem a plan entry answers.

A key is ``(runner, m_bucket, n, k, dtype, layout)``: N and K exact, M by bucket. Buckets (version
:data:`BUCKET_VERSION`): the 16 powers of two 1, 2, 4, ..., 32768; an M maps to the largest bucket <= M
(M >= 32768 maps to 32768), the way FlashInfer's GEMM autotuner buckets its token counts, so an imported
FlashInfer key (whose M is a bucket value) maps to exactly one vkc key. M == 0 launches nothing and has no key.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUCKET_VERSION", "M_BUCKETS", "m_bucket", "PlanKey"]

BUCKET_VERSION = "pow2-1..32768/v1"
M_BUCKETS: tuple[int, ...] = tuple(1 << i for i in range(16))


def m_bucket(m: int) -> int:
    if type(m) is not int or m < 1:
        raise ValueError(f"M must be a positive int, got {m!r}")
    return min(1 << (m.bit_length() - 1), M_BUCKETS[-1])


@dataclass(frozen=True, order=True)
class PlanKey:
    runner: str
    dtype: str
    layout: str
    n: int
    k: int
    m_bucket: int

    def __str__(self) -> str:
        return f"{self.runner} {self.dtype} {self.layout} M~{self.m_bucket} N={self.n} K={self.k}"
