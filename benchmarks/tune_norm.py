"""Tuning benchmark of the norm family for `vkc tune run` (GPU): times the row-norm specializations of the
artifact root in VKC_ARTIFACT_ROOT with CUDA-graph replay over inputs larger than L2 (and the GDN output's gated
RMSNorm at decode sizes too) and prints one JSON line of rows {"spec", "case", "us", "tbs"}."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from bench_norm import graph_ms, make_sets  # noqa: E402

from vkc_runtime.ops import norm as N  # noqa: E402

# (hidden, tokens): hidden picks the BLOCK specialization (2048 -> b2048, 4096 -> b4096, 5120 -> b8192)
CASES = [(2048, 4096), (2048, 16384), (4096, 16384), (5120, 4096), (5120, 16384)]
# gated RMSNorm (value heads of 128, tokens): Qwen3.6-27B's 48 heads and 35B-A3B's 32, prefill and decode
GATED_CASES = [(48, 8192), (48, 1024), (48, 16), (32, 8192), (32, 1)]


def main() -> None:
    bf = dict(device="cuda", dtype=torch.bfloat16)
    rows = []
    for hidden, T in CASES:
        block = next(b for b in N.ROW_BLOCKS if hidden <= b)
        w = (torch.randn(hidden, device="cuda") * 0.1).to(torch.bfloat16)
        nb = 2 * T * hidden * 2
        ms = graph_ms(lambda x, y, stream=0: N.rmsnorm(x, w, 1e-6, out=y, stream=stream),
                      make_sets(lambda: (torch.randn(T, hidden, **bf), torch.empty(T, hidden, **bf)), nb), vkc=True)
        rows.append({"spec": f"rmsnorm.b{block}.a16", "case": f"{hidden}x{T}", "us": ms * 1e3, "tbs": nb / ms / 1e9})
        nb = 4 * T * hidden * 2
        ms = graph_ms(lambda x, r, y, stream=0: N.add_rmsnorm(x, r, w, 1e-6, out=y, stream=stream),
                      make_sets(lambda: (torch.randn(T, hidden, **bf), torch.randn(T, hidden, **bf),
                                         torch.empty(T, hidden, **bf)), nb), vkc=True)
        rows.append({"spec": f"add_rmsnorm.b{block}.a16", "case": f"{hidden}x{T}", "us": ms * 1e3,
                     "tbs": nb / ms / 1e9})
    wg = (torch.randn(128, device="cuda") * 0.1).to(torch.bfloat16)
    for heads, T in GATED_CASES:
        c = heads * 128
        nb = 3 * T * c * 2
        ms = graph_ms(lambda x, z, y, stream=0: N.gated_rmsnorm(x, z, wg, 1e-6, out=y, stream=stream),
                      make_sets(lambda: (torch.randn(T, c, **bf), torch.randn(T, c, **bf), torch.empty(T, c, **bf)),
                                nb), vkc=True)
        rows.append({"spec": "gated_rmsnorm.h128.a16", "case": f"{heads}hx{T}", "us": ms * 1e3,
                     "tbs": nb / ms / 1e9})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
