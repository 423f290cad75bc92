"""Tuning benchmark of the GDN chunked prefill for `vkc tune run` (GPU). The whole op is timed (CUDA-graph
replay) at Qwen3.6 shapes; each row is attributed to the spec(s) the candidate varies (read from the
candidate.json beside the artifact root in VKC_ARTIFACT_ROOT), so `vkc tune apply` picks, per spec, the value
that makes the whole prefill fastest. Prints one JSON line of rows {"spec", "case", "us"}."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from bench_gdn import vkc_case  # noqa: E402
from timing import graph_ms  # noqa: E402


CASES = [((16, 48), [8192]), ((16, 48), [32768]), ((16, 32), [8192]), ((16, 48), [1, 17, 500, 1000, 2093, 4581])]


def main() -> None:
    cand = json.loads((Path(os.environ["VKC_ARTIFACT_ROOT"]) / "candidate.json").read_text())
    rows = []
    for (hk, hv), lens in CASES:
        T, N = sum(lens), len(lens)
        call, _, _ = vkc_case(lens, hk, hv)
        ms = graph_ms(lambda i, st: call(st), vkc=True)
        for spec in cand["specs"]:
            rows.append({"spec": spec, "case": f"{hk}/{hv} x{N} T={T}", "us": ms * 1e3})
        call = None  # free this case before the next one
        torch.cuda.empty_cache()
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
