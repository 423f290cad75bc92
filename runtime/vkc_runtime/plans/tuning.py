"""How a missing key is tuned: the timing method and the timer interface it runs through.

Per candidate tactic (:func:`measure`): 3 warm-up launches, synchronize, a stream delay of ``delay_us``
(default 5000 us, ``VKC_PLAN_TUNE_DELAY_US``; 0: none) so the timed launches are queued behind it and host
launch cost is not timed, then 10 launches between two recorded events; the time is the mean. The fastest
tactic wins, ties to the lower id (:func:`select`). A :class:`Timer` does the device side; CPU tests pass a fake
one with injected timings, the GPU uses :class:`CudaEventTimer`.
"""
from __future__ import annotations

import ctypes
import time
from typing import Any, Callable, Iterable, Protocol

from .config import REPEATS, WARMUPS

__all__ = ["Timer", "measure", "select", "CudaEventTimer"]


class Timer(Protocol):
    def synchronize(self) -> None: ...
    def delay(self, us: int) -> None: ...
    def record(self) -> Any: ...
    def elapsed_us(self, start: Any, end: Any) -> float: ...


def measure(timer: Timer, run: Callable[[], None], delay_us: int, warmups: int = WARMUPS,
            repeats: int = REPEATS) -> float:
    """Mean microseconds of one ``run()`` by the method in the module docstring."""
    for _ in range(warmups):
        run()
    timer.synchronize()
    if delay_us:
        timer.delay(delay_us)
    t0 = timer.record()
    for _ in range(repeats):
        run()
    t1 = timer.record()
    timer.synchronize()
    us = float(timer.elapsed_us(t0, t1)) / repeats
    if not us == us or us < 0:  # NaN or negative: a broken timer must not pick a tactic
        raise RuntimeError(f"timer returned {us!r} us")
    return us


def select(times: Iterable[tuple[int, float]]) -> int:
    """The fastest tactic id (ties: the lower id)."""
    best = min(times, key=lambda t: (t[1], t[0]), default=None)
    if best is None:
        raise ValueError("no candidate tactic to select from")
    return best[0]


class CudaEventTimer:
    """Driver-API events on ``stream``; the delay holds the stream on a host-released gate
    (``cuStreamWaitValue32`` on a mapped host word) that :meth:`synchronize` opens once ``delay_us`` have
    passed since :meth:`delay` (so everything launched in between is queued behind it)."""

    def __init__(self, stream: int = 0):
        from .. import driver  # noqa: PLC0415

        self._d = driver
        self._cu = driver.cu
        self.stream = stream
        self._events: list = []
        self._flag_host = None
        self._flag_dev = None
        self._deadline: float | None = None

    def _event(self):
        cu = self._cu
        e = self._d.call(cu.cuEventCreate, int(cu.CUevent_flags.CU_EVENT_DEFAULT))
        self._events.append(e)
        return e

    def _gate(self):
        if self._flag_host is None:
            cu = self._cu
            p = self._d.call(cu.cuMemHostAlloc, 4, cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE)
            self._flag_host = int(p)
            self._flag_dev = self._d.call(cu.cuMemHostGetDevicePointer, self._flag_host, 0)
        return self._flag_host, self._flag_dev

    def _set_flag(self, v: int) -> None:
        ctypes.c_uint32.from_address(self._flag_host).value = v

    def delay(self, us: int) -> None:
        host, dev = self._gate()
        self._set_flag(0)
        cu = self._cu
        self._d.call(cu.cuStreamWaitValue32, self.stream, dev, 1,
                     int(cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ))
        self._deadline = time.perf_counter() + us * 1e-6

    def record(self):
        e = self._event()
        self._d.call(self._cu.cuEventRecord, e, self.stream)
        return e

    def synchronize(self) -> None:
        if self._deadline is not None:
            left = self._deadline - time.perf_counter()
            if left > 0:
                time.sleep(left)
            self._set_flag(1)
            self._deadline = None
        self._d.call(self._cu.cuStreamSynchronize, self.stream)

    def elapsed_us(self, start, end) -> float:
        return float(self._d.call(self._cu.cuEventElapsedTime, start, end)) * 1000.0

    def close(self) -> None:
        if self._deadline is not None:
            self._set_flag(1)
            self._deadline = None
        for e in self._events:
            self._d.call(self._cu.cuEventDestroy, e)
        self._events.clear()
        if self._flag_host is not None:
            self._d.call(self._cu.cuMemFreeHost, self._flag_host)
            self._flag_host = None
