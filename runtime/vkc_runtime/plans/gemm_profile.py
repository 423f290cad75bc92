"""What a GEMM tactic is timed on during a warm-up miss: device buffers of the key's shape (M = the bucket),
filled with a small repeating bf16 pattern (finite values, so no NaN/Inf paths are timed), launched directly
through the tactic's kernel on the warm-up stream. Buffers are shared by the tactics of one key and freed
after the warm-up."""
from __future__ import annotations

from typing import Callable

from . import tactics as T
from .keys import PlanKey

__all__ = ["Profiler"]


class Profiler:
    def __init__(self, arch: str, stream: int = 0):
        self.arch, self.stream = arch, stream
        self._bufs: dict[PlanKey, tuple] = {}

    def _buffers(self, key: PlanKey):
        b = self._bufs.get(key)
        if b is None:
            from .. import memory  # noqa: PLC0415

            self._bufs.clear()  # one key at a time: keep the peak to one problem's buffers
            m, n, k = key.m_bucket, key.n, key.k
            x = memory.DeviceArray.empty((m, k), "bfloat16")
            w = memory.DeviceArray.empty((n, k), "bfloat16")
            y = memory.DeviceArray.empty((m, n), "bfloat16")
            x.fill_bytes(0x3C, self.stream)   # 0x3C3C: bf16 0.0115
            w.fill_bytes(0x3B, self.stream)
            b = self._bufs[key] = (x, w, y)
        return b

    def make_run(self, key: PlanKey, tactic_id: int) -> Callable[[], None]:
        from ..kernels import get_kernel  # noqa: PLC0415

        t = T.by_id(self.arch, tactic_id)
        x, w, y = self._buffers(key)
        kern = get_kernel(t.base)
        m, n, k, s = key.m_bucket, key.n, key.k, self.stream

        def run() -> None:
            kern.launch(x.ptr, k, w.ptr, k, y.ptr, n, m, n, k, s)
        return run

    def close(self) -> None:
        self._bufs.clear()
