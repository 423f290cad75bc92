"""TFLOPS of ``vkc_runtime.ops.gemm.linear`` (CuTe DSL sm_90a bf16 GEMM) vs torch.matmul (cuBLAS), one process (H200).

out[M, N] = x[M, K] @ weight[N, K]^T over the Qwen3.5 27B/35B projection shapes. Both sides graph-replayed
(timing.graph_ms: `inner` calls in one CUDA graph, vkc_runtime.Graph for vkc, torch.cuda.CUDAGraph for cuBLAS;
CUDA events around replays; median); weights rotate over enough copies to exceed 2.5 x the L2 so small ones are
not timed from cache. Per case: the tile the op picks (ops/gemm.py pick_tile) and every compiled tile forced, each
with its relative error against cuBLAS's output (a fast wrong kernel cannot pass); pct_limit = % of the bf16
dense peak (989 TFLOPS) for M >= 256, % of the HBM floor (weights + activations at the card's nominal HBM
bandwidth) below.
Usage: python benchmarks/bench_gemm.py OUT.json [M,M,...]
"""
from __future__ import annotations

import os
import sys

import torch

from vkc_runtime.ops import gemm as G

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as C  # noqa: E402
import timing  # noqa: E402

NKS = [(10240, 5120), (6144, 5120), (5120, 6144), (34816, 5120), (5120, 17408), (8192, 2048), (2048, 4096),
       (4096, 2048)]
MS = [1, 16, 64, 255, 512, 2048, 4096, 8192]
SMALL_M = 256  # below: bandwidth-bound, limit = HBM floor


def main(argv: list[str]) -> int:
    out_path = argv[1]
    ms = [int(x) for x in argv[2].split(",")] if len(argv) > 2 else MS
    torch.manual_seed(0)
    rows, cmp = [], C.Comparisons()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k in NKS:
        n_sets = C.n_sets_for(n * k * 2)
        ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).to(torch.bfloat16) for _ in range(n_sets)]
        for m in ms:
            xs = [torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in range(n_sets)]
            ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            torch.matmul(xs[0], ws[0].T, out=ref)
            torch_ms = timing.graph_ms(lambda i, st: torch.matmul(xs[i], ws[i].T, out=ref), vkc=False, n_sets=n_sets)
            torch.matmul(xs[0], ws[0].T, out=ref)
            flop = 2.0 * m * n * k
            floor = C.floor_ms(2 * (n * k + m * k + m * n), C.HBM_NOMINAL_TBS)
            case = f"M={m} N={n} K={k}"
            picked = G.pick_tile(m, n, sms)
            row = {"m": m, "n": n, "k": k, "n_sets": n_sets, "picked": f"t128x{picked}", "torch_ms": torch_ms,
                   "torch_tflops": flop / torch_ms / 1e9, "floor_ms": floor, "tiles": {}}
            for tile in (None, *G.TILES):
                name = "picked" if tile is None else f"t128x{tile}"
                old, old_plan = G.pick_tile, G.plan_tactic
                if tile is not None:  # forced: neither the rule nor a GEMM plan decides
                    G.pick_tile = lambda m_, n_, s_, tiles=G.TILES, t_=tile: t_
                    G.plan_tactic = lambda m_, n_, k_: None
                try:
                    out.fill_(float("nan"))
                    G.linear(xs[0], ws[0], out, stream=torch.cuda.current_stream())
                    torch.cuda.synchronize()
                    err = C.rel_err(out, ref)
                    t = timing.graph_ms(lambda i, st: G.linear(xs[i], ws[i], out, stream=st), vkc=True, n_sets=n_sets)
                finally:
                    G.pick_tile, G.plan_tactic = old, old_plan
                pct = (100.0 * flop / t / 1e9 / C.BF16_DENSE_TFLOPS) if m >= SMALL_M else C.pct(floor, t)
                row["tiles"][name] = {"ms": t, "tflops": flop / t / 1e9, "ratio_vs_cublas": torch_ms / t,
                                      "rel_err_vs_cublas": err, "pct_limit": pct}
                cmp.add("gemm", case, "device", name, t, "cublas", torch_ms, pct_limit=pct,
                        limit="bf16 peak" if m >= SMALL_M else "HBM floor")
            rows.append(row)
            print(f"{case:<24} cuBLAS {row['torch_tflops']:7.1f} TF  " + "  ".join(
                f"{nm} {r['tflops']:7.1f} TF {r['ratio_vs_cublas']:.2f}x err {r['rel_err_vs_cublas']:.1e}"
                for nm, r in row["tiles"].items()), flush=True)
            write(out_path, rows, cmp)  # after every case: a run cut short keeps what it measured
            del xs, ref, out
        del ws
        torch.cuda.empty_cache()
    return 0


def write(out_path, rows, cmp):
    meth = timing.method(graph_used={"inner": 5, "reps": 20},
                         inputs="bf16 torch.randn; weights scaled by K^-0.5; n_sets copies of (x, weight) rotated "
                                "so they exceed 2.5 x the 60 MB L2",
                         peer="torch.matmul(x, w.T, out=...) (cuBLAS), captured in a torch.cuda.CUDAGraph")
    C.write(out_path, C.result("gemm", method=meth, limits=C.hbm_limits(None), rows=rows, comparisons=cmp))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
