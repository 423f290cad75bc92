"""NVFP4 linears on the H200 from the MMA layout (vkc_runtime.ops.nvfp4.linear_nvfp4) next to the linear-layout
W4A16 GEMV (ops.gemv.gemv_w4a16, M <= 64) and cuBLAS bf16 (torch.matmul) on the dequantized weights, graph vs graph
in one process, microseconds and % of the 4-bit HBM floor.

y[M, N] = x[M, K] @ W[N, K]^T over the Qwen3.5/3.6 27B and 35B-A3B projection shapes (bench_gemv.SHAPES), M in MS.
Floor = the NVFP4 weight bytes (K/2 + K/16 per row) + x + y at the card's nominal HBM bandwidth (pct_floor) and at the
copy bandwidth measured in this process (pct_copy). Weights rotate over enough copies to exceed 2.5x the L2. Each row
records the relative error of both vkc paths against torch on the same weights, the plan the rule picked and, for
weights up to SWEEP_MAX_BYTES, forced (warps, split) alternatives.
Usage: python benchmarks/bench_nvfp4_mma.py OUT.json [M,M,...]
"""
from __future__ import annotations

import os
import sys

import torch

from vkc_runtime.ops import gemv as G
from vkc_runtime.ops import nvfp4 as N4

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as BC  # noqa: E402
from bench_gemv import SHAPES, dequant_bf16, floor_bytes, nvfp4_weights, run_case, weight_bytes  # noqa: E402
from timing import graph_ms, method  # noqa: E402

MS = (1, 4, 8, 16, 64)
SWEEP_MAX_BYTES = 120e6
INNER, REPS = 20, 20
ALPHA = 0.0625


def plan_name(p):
    return f"m{p.bm}.k{p.wk}.r{p.r}.s{p.split}"


def alternatives(M, K):
    bm = 8 if M <= 8 else 16
    kb = -(-K // 128)
    out = []
    for _, wk, r in (t for t in N4.MMA_TILES if t[0] == bm):
        for s in (1, 2, 3, 4, 6, 8):
            per = -(-(-(-kb // s)) // wk) * wk
            if -(-kb // per) == s:
                out.append(N4.MmaPlan(bm, wk, r, s, per * 128))
    return out


def bench_case(model, proj, N, K, M, copy_tbs, ws):
    wb = weight_bytes("w4a16", N, K)
    n_sets = BC.n_sets_for(wb)
    g = torch.Generator(device="cuda").manual_seed(N * 7 + K + M)
    xs = [torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16) for _ in range(n_sets)]
    qs = [nvfp4_weights(N, K, g) for _ in range(n_sets)]
    wshape, sshape = N4.mma_shapes(N, K)
    mw = []
    for packed, scale in qs:
        words = torch.empty(wshape, device="cuda", dtype=torch.int32)
        scales = torch.empty(sshape, device="cuda", dtype=torch.int32)
        N4.pack(packed, scale, words, scales)
        mw.append(N4.MmaWeights(words, scales, N, K, ALPHA))
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = torch.empty_like(out)
    fb = floor_bytes("w4a16", M, N, K)
    row = {"model": model, "proj": proj, "M": M, "N": N, "K": K, "weight_bytes": wb, "floor_bytes": fb,
           "floor_us": BC.floor_ms(fb, BC.HBM_NOMINAL_TBS) * 1e3, "floor_copy_us": BC.floor_ms(fb, copy_tbs) * 1e3,
           "n_sets": n_sets}

    def vkc(i, st, p=None):
        N4.linear_nvfp4(xs[i], mw[i], out, stream=st, workspace=ws, _plan=p)

    def old(i, st):
        G.gemv_w4a16(xs[i], qs[i][0], qs[i][1], ALPHA, out=out, stream=st, workspace=ws)

    torch_sets = BC.n_sets_for(N * K * 2)
    torch_w = [dequant_bf16(qs[0][0], qs[0][1], ALPHA)]
    torch_w += [torch_w[0].clone() for _ in range(torch_sets - 1)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bm = 8 if M <= 8 else 16
    occ = N4._occupancy(bm)
    row["plan"] = plan_name(N4.plan(M, N, K, sms, occ))
    row["occupancy"] = {f"k{wk}.r{r}": n for wk, r, n in occ}
    torch.matmul(xs[0], torch_w[0].T, out=ref)
    vkc(0, None)
    torch.cuda.synchronize()
    row["rel_err_vs_torch"] = BC.rel_err(out, ref)
    t = graph_ms(vkc, vkc=True, n_sets=n_sets, inner=INNER, reps=REPS)
    row["vkc_graph_us"] = t * 1e3
    row["pct_floor"] = 100 * row["floor_us"] / row["vkc_graph_us"]
    row["pct_copy"] = 100 * row["floor_copy_us"] / row["vkc_graph_us"]
    if M <= G.max_m():
        old(0, None)
        torch.cuda.synchronize()
        row["rel_err_linear_layout_vs_torch"] = BC.rel_err(out, ref)
        t2 = graph_ms(old, vkc=True, n_sets=n_sets, inner=INNER, reps=REPS)
        row["linear_layout_graph_us"] = t2 * 1e3
        row["speedup_vs_linear_layout"] = t2 / t
    tt = graph_ms(lambda i, st: torch.matmul(xs[i % n_sets], torch_w[i % torch_sets].T, out=ref), vkc=False,
                  n_sets=max(n_sets, torch_sets), inner=INNER, reps=REPS)
    row["torch_graph_us"] = tt * 1e3
    row["ratio_vs_torch"] = tt / t
    if wb <= SWEEP_MAX_BYTES:
        alts = {}
        for p in alternatives(M, K):
            try:
                alts[plan_name(p)] = graph_ms(lambda i, st, p=p: vkc(i, st, p), vkc=True, n_sets=n_sets,
                                              inner=INNER, reps=10) * 1e3
            except Exception as e:  # noqa: BLE001 - recorded, never silently dropped
                alts[plan_name(p)] = BC.err(e)
        BC.best_alternative(row, alts)
    return row


def main(out_path: str) -> None:
    ms = tuple(int(v) for v in sys.argv[2].split(",")) if len(sys.argv) > 2 else MS
    copy_tbs = BC.measured_copy_tbs()
    ws = torch.empty(N4.workspace_elems(max(ms), max(n for _, _, n, _ in SHAPES)), device="cuda",
                     dtype=torch.float32)
    rows, cmp = [], BC.Comparisons()
    lim = f"HBM floor (4-bit weights + x + y) at {BC.HBM_NOMINAL_TBS} TB/s nominal"
    for model, proj, N, K in SHAPES:
        for M in ms:
            r = run_case(lambda: bench_case(model, proj, N, K, M, copy_tbs, ws),
                         {"model": model, "proj": proj, "M": M, "N": N, "K": K})
            rows.append(r)
            case = f"w4a16 {model} {proj} M={M}"
            cmp.add("nvfp4", case, "device", "mma_layout", r.get("vkc_graph_us"), "torch_matmul_bf16",
                    r.get("torch_graph_us"), unit="us", pct_limit=r.get("pct_floor"), limit=lim)
            if "linear_layout_graph_us" in r:
                cmp.add("nvfp4", case, "device", "mma_layout", r.get("vkc_graph_us"), "vkc_gemv_w4a16_linear",
                        r["linear_layout_graph_us"], unit="us", pct_limit=r.get("pct_floor"), limit=lim)
            BC.write(out_path, BC.result("nvfp4_mma", method=method(graph_defaults={"inner": INNER, "reps": REPS}),
                                         limits=BC.hbm_limits(copy_tbs), rows=rows, comparisons=cmp))
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
