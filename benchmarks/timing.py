"""The benchmarks' one timing method (H200.md / METHOD.md): CUDA events around batches of calls, warm-up
first, median over repeats; ms per call.

``fn(i, stream)`` is one call on input set ``i`` (``0 <= i < n_sets``; rotating sets larger than L2 keep a
small op from timing cache hits) issued on ``stream``: an int CUDA stream handle, or None for the current
torch stream.

  events_ms  eager: host launch cost included (what a Python caller sees at small sizes)
  host_us    host time only: wall clock around n back-to-back calls (no sync inside; the launch queue absorbs
             them), in microseconds per call
  graph_ms   device time: ``inner`` calls captured in one CUDA graph on a side stream (vkc_runtime.Graph
             for vkc calls, torch.cuda.CUDAGraph for torch / peer calls), replays timed
"""
from __future__ import annotations

import statistics
import time

import torch


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def events_ms(fn, *, n_sets: int = 1, inner: int = 5, reps: int = 30, warm: int = 3) -> float:
    for i in range(warm * n_sets):
        fn(i % n_sets, None)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = _events()
        a.record()
        for i in range(inner):
            fn(i % n_sets, None)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def host_us(fn, *, n: int = 100, warm: int = 3) -> float:
    for i in range(warm):
        fn(i, None)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        fn(i, None)
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / n * 1e6


def graph_ms(fn, *, vkc: bool, n_sets: int = 1, inner: int = 5, reps: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture (lazy module loads, workspaces, torch's allocator)
        for i in range(n_sets):
            fn(i, s.cuda_stream if vkc else None)
    torch.cuda.synchronize()
    if vkc:
        import vkc_runtime
        g = vkc_runtime.Graph()
        with g.capture(s.cuda_stream):
            for i in range(inner):
                fn(i % n_sets, s.cuda_stream)
        replay = lambda: g.replay(s.cuda_stream)  # noqa: E731
    else:
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg, stream=s):
            for i in range(inner):
                fn(i % n_sets, None)
        replay = tg.replay
    times = []
    with torch.cuda.stream(s):
        replay()
        for _ in range(reps):
            a, b = _events()
            a.record(s)
            replay()
            b.record(s)
            b.synchronize()
            times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)
