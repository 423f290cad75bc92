"""Exploration (Triton JIT on the GPU, not vendored): tiles of the quantized-expert grouped GEMMs
(kernels_src/moe/nvfp4.py, fp8.py) next to the bf16 grouped GEMM (grouped.py) on the 35B-A3B block's shapes at
M = 2048 / 8192 tokens (E' = 257, k' = 9, H = 2048, I = 512): GEMM1 (gate_up + SiLU, N = I, K = H) and GEMM2 (down,
N = H, K = I), routing from moe.route + moe.align, triton.testing.do_bench medians (ms). Usage:
python benchmarks/explore_moe_quant_grouped.py OUT.jsonl"""
from __future__ import annotations

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_moe import E, EP, H, I, K, KOUT, quant_weights, random_weights  # noqa: E402

from kernels_src.moe import fp8 as F8, grouped as G, nvfp4 as N4  # noqa: E402
from vkc_runtime.ops import moe  # noqa: E402

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
SILU = [(128, 64, 64, 8, 3), (128, 128, 64, 8, 3), (128, 64, 128, 8, 3), (128, 64, 64, 4, 4), (64, 64, 128, 4, 3),
        (128, 32, 128, 4, 3), (256, 64, 64, 8, 3)]
PLAIN = [(128, 128, 64, 8, 3), (128, 128, 128, 8, 3), (128, 64, 128, 4, 3), (128, 256, 64, 8, 3),
         (64, 128, 128, 4, 3), (256, 128, 64, 8, 3)]


def run(kind, w, a, out, sid, bex, npad, P, a_div, silu, tile):
    bm, bn, bk, nw, ns = tile
    Nout = out.shape[1]
    nb = sid.shape[0] // bm
    grid = (triton.cdiv(Nout, bn), nb)
    Kk = a.shape[1]
    common = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, ACT_SILU=silu, num_warps=nw, num_stages=ns)
    if kind == "bf16":
        return lambda: G.grouped_gemm_kernel[grid](a, w, out, sid, bex, npad, sid, P, EP, Nout, Kk, a.shape[0], a_div,
                                                   a.stride(0), w.stride(0), w.stride(1), out.stride(0), 0, **common)
    if kind == "nvfp4":
        q, s, al = w
        return lambda: N4.moe_w4a16_grouped_kernel[grid](
            a, q, s, al, out, sid, bex, npad, P, EP, Nout, Kk, a.shape[0], a_div, a.stride(0), q.stride(0),
            q.stride(1), s.stride(0), s.stride(1), out.stride(0), al.shape[1], PRMT=True, **common)
    q, s = w
    return lambda: F8.moe_w8a16_grouped_kernel[grid](
        a, q, s, out, sid, bex, npad, P, EP, Nout, Kk, a.shape[0], a_div, a.stride(0), q.stride(0), q.stride(1),
        s.stride(0), s.stride(1), out.stride(0), NATIVE=True, **common)


def main(out_path):
    (gw, sg, w1b, w2b), _ = random_weights()
    qw = {k: quant_weights(k) for k in ("nvfp4", "fp8")}
    f = open(out_path, "w")
    for M in (2048, 8192):
        x = torch.randn(M, H, device="cuda").to(torch.bfloat16)
        ws = moe.moe_workspace(M, E, K, H, I, shared=True)
        ids = torch.empty(M, KOUT, dtype=torch.int32, device="cuda")
        wts = torch.empty(M, KOUT, device="cuda")
        moe.route(x, gw, K, renormalize=True, shared_gate_w=sg, topk_ids=ids, topk_weights=wts, workspace=ws)
        P = M * KOUT
        h = torch.randn(P, I, device="cuda").to(torch.bfloat16)
        for silu, tiles in ((True, SILU), (False, PLAIN)):
            for bm in sorted({t[0] for t in tiles}):
                cap = moe.align_capacity(P, EP, bm)
                sid = torch.empty(cap, dtype=torch.int32, device="cuda")
                bex = torch.empty(cap // bm, dtype=torch.int32, device="cuda")
                npad = torch.empty(1, dtype=torch.int32, device="cuda")
                moe.align(ids, EP, bm, sorted_ids=sid, block_expert=bex, num_padded=npad, workspace=ws)
                for tile in [t for t in tiles if t[0] == bm]:
                    for kind in ("bf16", "nvfp4", "fp8"):
                        if kind == "fp8" and (128 % tile[1] or 128 % tile[2]):
                            continue
                        j = 0 if silu else 1
                        w = (w1b, w2b)[j] if kind == "bf16" else tuple(qw[kind][j][0])
                        if silu:
                            a, out, div = x, torch.empty(P, I, dtype=torch.bfloat16, device="cuda"), KOUT
                        else:
                            a, out, div = h, torch.empty(P, H, dtype=torch.bfloat16, device="cuda"), 1
                        row = {"M": M, "gemm": "gate_up_silu" if silu else "down", "kind": kind, "tile": tile}
                        try:
                            fn = run(kind, w, a, out, sid, bex, npad, P, div, silu, tile)
                            fn()
                            torch.cuda.synchronize()
                            row["ms"] = triton.testing.do_bench(fn, warmup=5, rep=40)
                        except Exception as e:  # noqa: BLE001
                            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                        print(row, flush=True)
                        f.write(json.dumps(row) + "\n")
    f.close()


if __name__ == "__main__":
    main(sys.argv[1])
