"""Tuning benchmark of the rope family for `vkc tune run` (GPU): times qk_norm_rope (per-head RMSNorm(1 + w) of q
and k, then partial RoPE) of the artifact root in VKC_ARTIFACT_ROOT with CUDA-graph replay over inputs larger than
L2 and prints one JSON line of rows {"spec", "case", "us", "tbs"} (bytes: the query halves and k read, q_out and
k_out written)."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from bench_norm import graph_ms, make_sets  # noqa: E402

from vkc_runtime.ops import rope as RO  # noqa: E402

# (query heads, kv heads, head dim, rotary dims (head dim / 4: the op's rule), tokens): Qwen3.6-27B (24/4) and
# 35B-A3B (16/2) at 256, and a head dim of 128 (the d128 specialization)
CASES = [(24, 4, 256, 64, 8192), (24, 4, 256, 64, 32768), (16, 2, 256, 64, 8192), (32, 8, 128, 32, 8192)]


def main() -> None:
    bf = dict(device="cuda", dtype=torch.bfloat16)
    rows = []
    for H, Hkv, D, rot, T in CASES:
        wq, wk = ((torch.randn(D, device="cuda") * 0.1).to(torch.bfloat16) for _ in range(2))
        pos = torch.arange(T, device="cuda", dtype=torch.int32)
        qo, ko = torch.empty(T, H, D, **bf), torch.empty(T, Hkv, D, **bf)
        nb = T * (H + Hkv) * D * 2 * 2
        ms = graph_ms(lambda qg, k, stream=0: RO.qk_norm_rope(qg, k, pos, wq, wk, H, Hkv, D, 1e-6, 1e7, q_out=qo,
                                                              k_out=ko, stream=stream),
                      make_sets(lambda: (torch.randn(T, H * 2 * D, **bf), torch.randn(T, Hkv * D, **bf)), nb),
                      vkc=True)
        rows.append({"spec": f"qk_norm_rope.d{D}.r{rot}.a16", "case": f"{H}/{Hkv}x{D} T={T}", "us": ms * 1e3,
                     "tbs": nb / ms / 1e9})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
