"""TFLOPS of the CuTe DSL sm_90a BF16 GEMM artifact vs torch.matmul (cuBLAS) bf16, in one process (H200).

C[M, N] = A[M, K] @ W[N, K]^T; both sides graph-replayed (benchmarks/timing.py graph_ms: `inner` calls in one
CUDA graph, CUDA events around replays, median), same inputs, same output buffer shape. Each case also records
the CuTe result's relative error against torch's, so a fast wrong kernel cannot pass unnoticed. Every tile variant
of each (N, K) is timed (forced), and the one gemm_lib picks by default is named.
Usage: VKC_CUTE_SO=build/cute/sm_90a/gemm.x86_64.so python benchmarks/bench_cute_gemm.py OUT.json [M,M,...]
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import timing  # noqa: E402
from tools.cute.gemm_lib import CuteGemmLib  # noqa: E402

NKS = [(10240, 5120), (5120, 6144), (34816, 5120), (2048, 4096)]
MS = [1, 16, 64, 255, 512, 2048, 4096, 8192]


def main(argv: list[str]) -> int:
    out_path = argv[1]
    ms = [int(x) for x in argv[2].split(",")] if len(argv) > 2 else MS
    lib = CuteGemmLib(os.environ["VKC_CUTE_SO"])
    torch.manual_seed(0)
    rows = []
    for n, k in NKS:
        w = (torch.randn(n, k, device="cuda") * k ** -0.5).to(torch.bfloat16)
        for m in ms:
            a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            c_cute = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            c_torch = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            torch.matmul(a, w.T, out=c_torch)
            torch_ms = timing.graph_ms(lambda i, st: torch.matmul(a, w.T, out=c_torch), vkc=False)
            flop = 2.0 * m * n * k
            lib.gemm(a, w, out=c_cute)
            picked = lib.last_symbol
            row = {"m": m, "n": n, "k": k, "torch_ms": torch_ms, "torch_tflops": flop / torch_ms / 1e9,
                   "picked": picked, "variants": {}}
            for v in lib.variants[(n, k)]:
                c_cute.fill_(float("nan"))
                lib.gemm(a, w, out=c_cute, symbol=v.symbol)
                torch.cuda.synchronize()
                err = float(torch.linalg.norm(c_cute.float() - c_torch.float())
                            / torch.linalg.norm(c_torch.float()))
                ms_ = timing.graph_ms(lambda i, st, s_=v.symbol: lib.gemm(a, w, out=c_cute, symbol=s_), vkc=False)
                row["variants"][f"{v.tile_m}x{v.tile_n}"] = {
                    "ms": ms_, "tflops": flop / ms_ / 1e9, "ratio_vs_torch": torch_ms / ms_,
                    "rel_err_vs_torch": err, "symbol": v.symbol}
            best = min(row["variants"].values(), key=lambda r: r["ms"])
            pick = next(r for r in row["variants"].values() if r["symbol"] == picked)
            row.update(best_tflops=best["tflops"], best_ratio=best["ratio_vs_torch"],
                       picked_ratio=pick["ratio_vs_torch"])
            rows.append(row)
            print(json.dumps(row), flush=True)
            write(out_path, lib, rows)  # after every case: a run cut short keeps what it measured
            del a, c_cute, c_torch
        del w
        torch.cuda.empty_cache()
    return 0


def write(out_path: str, lib: CuteGemmLib, rows: list[dict]) -> None:
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "artifact_sha256": lib.info["sha256"], "dsl": lib.info["dsl"], "cases": rows}
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
