"""Exploration (JIT on the device, not the vendored kernels): the MoE grouped GEMM kernel of
kernels_src/moe/grouped.py compiled by the device's Triton over a grid of tiles (BLOCK_M, BLOCK_N, BLOCK_K,
num_warps, num_stages), GEMM1 (gate_up + SwiGLU, K = H) and GEMM2 (down, K = I) timed separately at the
35B-A3B shape (E' = 256 + 1 shared, H 2048, I 512, top-8 + shared) for long prefill M, with torch._grouped_mm
on pre-permuted rows next to it. Used to choose the vendored tiles of kernels_src/moe/grouped_spec.py; the
chosen tiles are then measured as vendored cubins by benchmarks/bench_moe_grouped.py.

    python benchmarks/explore_moe_grouped.py OUT.json [M,M,...]
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels_src", "moe"))
from bench_moe_grouped import E, H, I, KP, align, routing  # noqa: E402
from grouped import grouped_gemm_kernel  # noqa: E402

GRID = {"BM": (64, 128), "BN": (64, 128), "BK": (64, 128), "warps": (4, 8), "stages": (3, 4)}


def ms(fn):
    return triton.testing.do_bench(fn, warmup=5, rep=40)


def run_case(M, g):
    x = torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16)
    w1 = (torch.randn(E, 2 * I, H, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    ids = routing(M, g)
    P = M * KP
    h = torch.empty(P, I, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(P, H, device="cuda", dtype=torch.bfloat16)
    scale = torch.rand(P, device="cuda", generator=g)
    flops1, flops2 = 2 * P * H * 2 * I, 2 * P * I * H
    out = {"M": M, "gemm1": [], "gemm2": []}
    for BM, BN, BK, wp, st in itertools.product(*GRID.values()):
        sid, bexp, npad = align(ids, BM)
        nb = sid.numel() // BM
        for which in ("gemm1", "gemm2"):
            if which == "gemm1":
                a, w, o, N, K, rows, div, silu, hs = x, w1, h, I, H, M, KP, True, 0
            else:
                a, w, o, N, K, rows, div, silu, hs = h, w2, y, H, I, P, 1, False, 1
            grid = (triton.cdiv(N, BN), nb)

            def go():
                grouped_gemm_kernel[grid](a, w, o, sid, bexp, npad, scale, P, E, N, K, rows, div, a.stride(0),
                                          w.stride(0), w.stride(1), o.stride(0), hs, BLOCK_M=BM, BLOCK_N=BN,
                                          BLOCK_K=BK, ACT_SILU=silu, num_warps=wp, num_stages=st)
            rec = {"BM": BM, "BN": BN, "BK": BK, "warps": wp, "stages": st}
            try:
                t = ms(go)
                rec.update(us=t * 1e3, tflops=(flops1 if which == "gemm1" else flops2) / t / 1e9)
            except Exception as e:  # noqa: BLE001 - out of shared memory / registers: recorded
                rec["error"] = f"{type(e).__name__}: {str(e)[:120]}"
            out[which].append(rec)
    # torch's grouped GEMM on rows already permuted by expert (the favourable comparison)
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    xa = x[order // KP]
    ha = torch.empty(P, I, device="cuda", dtype=torch.bfloat16)
    out["torch_gemm1_us"] = ms(lambda: torch._grouped_mm(xa, w1.transpose(1, 2), offs=offs)) * 1e3
    out["torch_gemm2_us"] = ms(lambda: torch._grouped_mm(ha, w2.transpose(1, 2), offs=offs)) * 1e3
    for which in ("gemm1", "gemm2"):
        ok = [r for r in out[which] if "us" in r]
        out[which + "_best"] = min(ok, key=lambda r: r["us"]) if ok else None
        out[which] = sorted(ok, key=lambda r: r["us"])[:8] + [r for r in out[which] if "us" not in r]
    return out


def main():
    path = sys.argv[1]
    Ms = [int(m) for m in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2048, 8192]
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {"triton": triton.__version__, "device": torch.cuda.get_device_name(), "cases": []}
    for M in Ms:
        t0 = time.time()
        res["cases"].append(run_case(M, g))
        c = res["cases"][-1]
        print(M, f"{time.time() - t0:.0f}s", "best1", c["gemm1_best"], "best2", c["gemm2_best"],
              "torch", round(c["torch_gemm1_us"], 1), round(c["torch_gemm2_us"], 1), flush=True)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
