"""Tuning benchmark of the gemv family for `vkc tune run` (GPU): each candidate spec (candidate.json beside the
artifact root in VKC_ARTIFACT_ROOT) is timed with its own kernel forced (ops.gemv's ``_plan``; the split count
the dispatch rule would give that tile) at M = its bucket's largest M and 1, over three weight shapes (a 34 MB
one whose N needs split-K, a large fused projection, a long-K one), CUDA-graph replay over rotating weights larger
than L2 (benchmarks/bench_gemv.py's method). Prints one JSON line of rows {"spec", "case", "us", "pct_hbm"}."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_common as BC  # noqa: E402
from bench_gemv import floor_bytes, nvfp4_weights, weight_bytes  # noqa: E402
from timing import graph_ms  # noqa: E402

from vkc_runtime.ops import gemv as G  # noqa: E402

CASES = [(2048, 4096), (16480, 5120), (5120, 17408)]


def parse(spec: str):
    """'bf16.m16.n64.k128' / 'w4a16.m16.n64.k256.prmt' -> (kind, bm, bn, bk, decoder); None for the reduce."""
    parts = spec.split(".")
    if parts[0] not in G.TILES:
        return None
    bm, bn, bk = (int(p[1:]) for p in parts[1:4])
    return parts[0], bm, bn, bk, (parts[4] if len(parts) > 4 else None)


def time_case(kind, bm, bn, bk, dec, M, N, K):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rule = G.plan(kind, M, N, K, sms, (2, 2))
    kt = -(-K // bk)
    s = rule.split if (rule.bn, rule.bk) == (bn, bk) else 1
    per = -(-kt // s)
    p = G.Plan(bm, bn, bk, -(-kt // per), per * bk)
    n_sets = BC.n_sets_for(weight_bytes(kind, N, K))
    g = torch.Generator(device="cuda").manual_seed(N + K + M)
    xs = [torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16) for _ in range(n_sets)]
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ws = torch.empty(G.workspace_elems(M, N), device="cuda", dtype=torch.float32)
    if kind == "bf16":
        wts = [(torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).to(torch.bfloat16) for _ in range(n_sets)]

        def f(i, st):
            G.gemv(xs[i], wts[i], out=out, stream=st, workspace=ws, _plan=p)
    else:
        qs = [nvfp4_weights(N, K, g) for _ in range(n_sets)]

        def f(i, st):
            G.gemv_w4a16(xs[i], qs[i][0], qs[i][1], 0.5, out=out, stream=st, workspace=ws, _plan=p, _decoder=dec)
    ms = graph_ms(f, vkc=True, n_sets=n_sets, inner=20, reps=10)
    return ms * 1e3, 100 * BC.floor_ms(floor_bytes(kind, M, N, K), BC.HBM_NOMINAL_TBS) / ms


def main() -> None:
    cand = json.loads((Path(os.environ["VKC_ARTIFACT_ROOT"]) / "candidate.json").read_text())
    rows = []
    for spec in cand["specs"]:
        parsed = parse(spec)
        if parsed is None:
            continue
        kind, bm, bn, bk, dec = parsed
        for M in sorted({1, bm}):
            for N, K in CASES:
                us, pct = time_case(kind, bm, bn, bk, dec, M, N, K)
                rows.append({"spec": spec, "case": f"M={M} N={N} K={K}", "us": us, "pct_hbm": pct})
                torch.cuda.empty_cache()
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
