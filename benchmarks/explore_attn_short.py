"""Exploration (the vendored kernels): attention decode at the engine's shape when the context is short and the
block table is wide -- what a decode step of a CUDA graph captured for the whole cache runs (35B-A3B: 16/2 x 256
heads, block size 64, a block table as wide as max_model_len). The split heuristic sees max_seq_len = the table's
capacity and picks its widest split count; the per-split key range follows the device-side length, so at a short
context most splits are empty. This times, graph-replayed (``inner`` calls back to back, PDL between them), the
op's default against forced split counts, fused and unfused, and against max_seq_len = the true length; each
with the TMA kernels (sm_90a) and with the gather kernels (a workspace without the TMA scratch).

Rows: {"B", "L", "width", "variant", "splits", "fused", "us"}. Env: ATTN_SHORT_CASES ("BxL ..."), ATTN_SHORT_SPLITS,
ATTN_SHORT_GATHER=0 (TMA only) or =only (gather only), ATTN_SHORT_PROFILE=1 (also each kernel's mean device time
over 30 eager calls, torch.profiler: "kernels_us", which separates the split launch from the combine; at long
contexts these eager numbers are not reliable, use "us"). Usage: python benchmarks/explore_attn_short.py OUT.json
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402
from bench_attn import paged  # noqa: E402

from vkc_runtime.ops import attn as A  # noqa: E402

HQ, HKV, D, BS = 16, 2, 256, 64
WIDTH = 512  # blocks per sequence: 32768 tokens (the engine's default max_model_len)
CASES = [(1, 100), (1, 1000), (1, 8000), (4, 100), (4, 1000)]
if os.environ.get("ATTN_SHORT_CASES"):  # e.g. "4x8000 4x30000"
    CASES = [tuple(int(v) for v in c.split("x")) for c in os.environ["ATTN_SHORT_CASES"].split()]
SPLITS = tuple(int(v) for v in os.environ.get("ATTN_SHORT_SPLITS", "1 2 4 8 16 64").split())
GATHER = os.environ.get("ATTN_SHORT_GATHER", "1")  # "0": TMA kernels only, "only": gather kernels only
PROFILE = os.environ.get("ATTN_SHORT_PROFILE", "0") == "1"


def kernel_us(fn, n=30):
    """Mean device time per call of each CUDA kernel that fn() launches, µs (eager calls, torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_time_total > 0 and e.count:
            out[e.key] = round(e.device_time_total / n, 2)
    return out


def inputs(B, L):
    kc, vc, bt_used, _, _ = paged(B, L, HKV, D, BS, dense=False)  # bench_attn's shuffled cache of B x L tokens
    bt = torch.zeros(B, WIDTH, dtype=torch.int32, device="cuda")  # as wide as the engine's, unused tail block 0
    bt[:, :bt_used.shape[1]] = bt_used
    q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16)
    sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
    return kc, vc, bt, q, gate, sl, torch.empty_like(q)


def main(path):
    rows = []
    ws = A.decode_workspace(max(8, max(b for b, _ in CASES)), HQ, D, 64, num_kv_heads=HKV)
    ws_gather = dataclasses.replace(ws, scratch=None)  # no TMA scratch: the gather kernels
    for B, L in CASES:
        kc, vc, bt, q, gate, sl, out = inputs(B, L)
        ref = None
        variants = [("default", {}), ("tight", {"max_seq_len": L})]
        variants += [(f"s{s}.{'fused' if f else 'sep'}", {"num_splits": s, "fused": f})
                     for s in SPLITS for f in ((True, False) if s > 1 else (False,))]
        if GATHER != "0":
            variants = [("gather." + n, kw) for n, kw in variants] + ([] if GATHER == "only" else variants)
        for name, kw in variants:
            w = ws_gather if name.startswith("gather.") else ws

            def op(i, st=None, kw=kw, w=w):
                A.decode(q, kc, vc, bt, sl, D ** -0.5, gate=gate, out=out, workspace=w, stream=st, **kw)
            try:
                op(0)
                torch.cuda.synchronize()
                if ref is None:
                    ref = out.float().clone()
                err = (out.float() - ref).abs().max().item()
                us = timing.graph_ms(op, vkc=True, inner=20, reps=20) * 1e3
            except Exception as e:  # noqa: BLE001 - a variant the op refuses is recorded, not fatal
                rows.append({"B": B, "L": L, "variant": name, "error": f"{type(e).__name__}: {e}"})
                continue
            r = {"B": B, "L": L, "width": WIDTH, "variant": name, "us": round(us, 2), "max_diff": err, **kw}
            if PROFILE:
                r["kernels_us"] = kernel_us(lambda op=op: op(0))
            rows.append(r)
            print(json.dumps(r), flush=True)
    with open(path, "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
