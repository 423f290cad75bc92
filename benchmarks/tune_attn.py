"""Tuning benchmark of the attention family for `vkc tune run` (GPU): paged causal prefill at Qwen3.6 shapes
(24/4 and 16/2 x 256, one sequence) for prefill specs, split-KV decode at large B x L (24/4 x 256, block size
16) for decode specs; rows are attributed to the spec(s) the candidate varies (candidate.json
beside the artifact root in VKC_ARTIFACT_ROOT). Prints one JSON line of rows {"spec", "case", "us", "tflops"}."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from bench_attn import paged, time_ms  # noqa: E402

from vkc_runtime.ops import attn as A  # noqa: E402

CASES = [(24, 4, 1024), (16, 2, 1024), (24, 4, 4096), (24, 4, 8192), (16, 2, 8192)]
DECODE_CASES = [(256, 4096), (64, 32768), (16, 32768), (64, 4096)]  # (B, L) at 24/4 x 256


def prefill_rows(specs):
    rows = []
    D = 256
    for Hq, Hkv, T in CASES:
        bs = 64 if any(sp.endswith(".tma") for sp in specs) else 16  # the TMA kernel needs bs % 64 == 0
        kc, vc, bt, _, _ = paged(1, T, Hkv, D, bs, dense=False)
        q = torch.randn(T, Hq, D, device="cuda", dtype=torch.bfloat16)
        cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
        sl = torch.tensor([T], dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        ms = time_ms(lambda i: A.prefill(q, kc, vc, bt, cu, sl, D ** -0.5, out=out, max_seqlen_q=T))
        tflops = 4 * T * T * D * Hq / 2 / (ms * 1e-3) / 1e12
        for spec in specs:
            rows.append({"spec": spec, "case": f"{Hq}/{Hkv} T={T}", "us": ms * 1e3, "tflops": tflops})
        del kc, vc, q, out
        torch.cuda.empty_cache()
    return rows


def decode_rows(specs):
    rows = []
    Hq, Hkv, D = 24, 4, 256
    for B, L in DECODE_CASES:
        kc, vc, bt, _, _ = paged(B, L, Hkv, D, dense=False)
        q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
        sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        ws = A.decode_workspace(B, Hq, D, 64)
        ms = time_ms(lambda i: A.decode(q, kc, vc, bt, sl, D ** -0.5, out=out, workspace=ws, max_seq_len=L))
        pct = 100 * 2 * B * L * Hkv * D * 2 / (4.26e12 * ms * 1e-3)
        for spec in specs:
            rows.append({"spec": spec, "case": f"B={B} L={L}", "us": ms * 1e3, "pct_hbm": pct})
        del kc, vc, ws
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    cand = json.loads((Path(os.environ["VKC_ARTIFACT_ROOT"]) / "candidate.json").read_text())
    pre = [s for s in cand["specs"] if s.startswith("prefill")]
    dec = [s for s in cand["specs"] if s.startswith("decode")]
    rows = (prefill_rows(pre) if pre else []) + (decode_rows(dec) if dec else [])
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
