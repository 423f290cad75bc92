"""Tuning benchmark of the attention prefill for `vkc tune run` (GPU): paged causal prefill at Qwen3.6 shapes
(24/4 and 16/2 x 256), one sequence; rows are attributed to the spec(s) the candidate varies (candidate.json
beside the artifact root in VKC_ARTIFACT_ROOT). Prints one JSON line of rows {"spec", "case", "us", "tflops"}."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from bench_attn import paged, time_ms  # noqa: E402

from vkc_runtime.ops import attention as A  # noqa: E402

CASES = [(24, 4, 4096), (24, 4, 8192), (16, 2, 8192)]


def main() -> None:
    cand = json.loads((Path(os.environ["VKC_ARTIFACT_ROOT"]) / "candidate.json").read_text())
    rows = []
    D = 256
    for Hq, Hkv, T in CASES:
        kc, vc, bt, _, _ = paged(1, T, Hkv, D)
        q = torch.randn(T, Hq, D, device="cuda", dtype=torch.bfloat16)
        cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
        sl = torch.tensor([T], dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        ms = time_ms(lambda: A.prefill(q, kc, vc, bt, cu, sl, D ** -0.5, out=out, max_seqlen_q=T))
        tflops = 4 * T * T * D * Hq / 2 / (ms * 1e-3) / 1e12
        for spec in cand["specs"]:
            rows.append({"spec": spec, "case": f"{Hq}/{Hkv} T={T}", "us": ms * 1e3, "tflops": tflops})
        del kc, vc, q, out
        torch.cuda.empty_cache()
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
