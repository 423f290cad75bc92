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
  kernel_names  which CUDA kernels a call (or a graph replay, graph_ms(kernels=[])) ran, from torch.profiler:
             records the backend a peer actually used

Nothing but the call goes inside the timed region: a peer's backend-selection context manager is entered by
the caller around the whole measurement (warm-up, capture and replays), never inside ``fn``.
"""
from __future__ import annotations

import statistics
import time

import torch


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def events_ms(fn, *, n_sets: int = 1, inner: int = 5, reps: int = 30, warm: int = 3) -> float:
    j = 0  # one running call counter: the sets rotate across samples too (inner = 1 still cycles them)
    for _ in range(warm * n_sets):
        fn(j % n_sets, None)
        j += 1
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = _events()
        a.record()
        for _ in range(inner):
            fn(j % n_sets, None)
            j += 1
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def host_us(fn, *, n: int = 100, warm: int = 3, n_sets: int = 1) -> float:
    for i in range(warm):
        fn(i % n_sets, None)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        fn(i % n_sets, None)
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / n * 1e6


def method(**overrides) -> dict:
    """The defaults of this module's timers, for a result JSON's "method" (callers pass what they changed)."""
    m = {"device": "graph_ms: `inner` calls captured in one CUDA graph on a side stream (vkc_runtime.Graph "
                   "launched on the capture stream for vkc, torch.cuda.CUDAGraph for peers), warm-up calls on that "
                   "stream before capture, one untimed replay, then `reps` replays timed with CUDA events; median "
                   "of the per-call times",
         "eager": "events_ms: `warm` x n_sets warm-up calls, then `reps` samples of `inner` back-to-back Python "
                  "calls between two CUDA events (host cost included); median",
         "host": "host_us: `warm` warm-up calls and a sync, then wall clock (perf_counter) around `n` back-to-back "
                 "calls without a sync, microseconds per call",
         "graph_defaults": {"inner": 5, "reps": 20}, "eager_defaults": {"inner": 5, "reps": 30, "warm": 3},
         "host_defaults": {"n": 100, "warm": 3}, "statistic": "median"}
    m.update(overrides)
    return m


def kernel_names(fn, n: int = 1) -> list:
    """Names of the CUDA kernels that n calls of fn() ran (torch.profiler CUDA activity), sorted, unique."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    names = set()
    for e in prof.events():
        if "CUDA" in str(getattr(e, "device_type", "")):  # kernels (and memcpy/memset), not CPU-side ops
            names.add(e.name)
    return sorted(names)


def graph_ms(fn, *, vkc: bool, n_sets: int = 1, inner: int = 5, reps: int = 20, kernels: list | None = None) -> float:
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
    if kernels is not None:  # what the captured graph runs (e.g. which SDPA backend was captured)
        try:
            with torch.cuda.stream(s):
                kernels.extend(kernel_names(replay))
        except Exception as e:  # noqa: BLE001 - diagnostic only
            kernels.append(f"<profiler failed: {type(e).__name__}: {e}>")
    return statistics.median(times)
