"""Where a graph-replayed step's device time goes, kernel by kernel, from the CUDA activity trace (CUPTI, read
through torch.profiler: it records every kernel of the process, the nodes of vkc's driver-API graphs included).

``bench_engine.py --breakdown`` puts a CUDA event before every op, which splits PDL overlap and adds nodes; this
is the undisturbed step: the same graphs as the timed decode loop. Each kernel's *exclusive* time is the part of
its [start, end) after the previous kernel's end (PDL lets a kernel start while its predecessor runs and wait in
griddepcontrol.wait: that wait is charged to the predecessor); a positive gap between one kernel's end and the
next one's start is idle device time (launch latency, host work between steps).

    timeline(fn, steps) -> {"steps", "span_us", "busy_us", "idle_us", "kernels": [{name, calls, us, us_max}]}
        (per step: us = exclusive µs per step, calls per step; sorted by us; span = first start .. last end,
        idle = span - busy, both per step; the idle between steps -- the host's sampling and upload -- is
        reported apart as ``between_steps_us``)

``summarize(intervals, steps, marks)`` is the pure part (tests/test_bench_logic.py drives it on made-up
intervals). torch is imported by :func:`timeline` only.
"""
from __future__ import annotations

__all__ = ["summarize", "timeline"]


def summarize(intervals, steps: int, marks=()) -> dict:
    """intervals: (name, start_us, end_us) of every kernel, any order; marks: the start times of steps 2..n
    (a gap that contains one is between steps, not inside a step)."""
    ks = sorted((float(s), float(e), n) for n, s, e in intervals)
    steps = max(1, int(steps))
    if not ks:
        return {"steps": steps, "span_us": 0.0, "busy_us": 0.0, "idle_us": 0.0, "between_steps_us": 0.0,
                "kernels": []}
    per: dict[str, list] = {}
    busy = idle = between = 0.0
    last_end = ks[0][0]
    cuts = sorted(float(m) for m in marks)
    for s, e, n in ks:
        gap = s - last_end
        if gap > 0:
            if any(last_end <= c <= s for c in cuts):
                between += gap
            else:
                idle += gap
        excl = max(0.0, e - max(s, last_end))
        busy += excl
        p = per.setdefault(n, [0, 0.0, 0.0])
        p[0] += 1
        p[1] += excl
        p[2] = max(p[2], e - s)
        last_end = max(last_end, e)
    span = last_end - ks[0][0] - between
    rows = [{"name": n, "calls": c / steps, "us": t / steps, "us_max": m} for n, (c, t, m) in per.items()]
    rows.sort(key=lambda r: -r["us"])
    return {"steps": steps, "span_us": span / steps, "busy_us": busy / steps, "idle_us": idle / steps,
            "between_steps_us": between / steps, "kernels": rows}


def timeline(fn, steps: int) -> dict:
    """Run ``fn()`` (one step) ``steps`` times under torch.profiler (CUDA activities only) and summarize the
    kernels it recorded. Needs torch with CUPTI (the H200's torch has it)."""
    import torch  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if getattr(e, "device_type", None) is not None
          and str(e.device_type).endswith("CUDA") and not e.name.startswith(("Memcpy", "Memset"))]
    intervals = [(e.name, e.time_range.start, e.time_range.end) for e in ev]
    # step boundaries: the host's work between steps (sampling download, scheduling) leaves the widest gaps, so
    # the steps are cut at the (steps - 1) widest gaps between kernels
    ks = sorted((s, e) for _, s, e in intervals)
    gaps, end = [], None
    for s, e in ks:
        if end is not None and s > end:
            gaps.append((s - end, (end + s) / 2))
        end = e if end is None else max(end, e)
    marks = [m for _, m in sorted(gaps, reverse=True)[:max(0, steps - 1)]]
    return summarize(intervals, steps, marks)
