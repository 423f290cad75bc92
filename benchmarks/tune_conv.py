"""Tuning benchmark of the causal conv1d prefill for `vkc tune run` (GPU): T = 8192 tokens x C = 10240 / 8192
channels (one sequence, and 16 x 512), CUDA-graph replay over rotating buffers larger than L2 (bench_gdn_decode's
method); rows are attributed to the spec(s) the candidate varies (candidate.json beside the artifact root in
VKC_ARTIFACT_ROOT). Prints one JSON line of rows {"spec", "case", "us", "pct_hbm"}."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gdn_decode import bench_conv_prefill  # noqa: E402

CASES = [([8192], 10240), ([512] * 16, 10240), ([8192], 8192)]


def main() -> None:
    cand = json.loads((Path(os.environ["VKC_ARTIFACT_ROOT"]) / "candidate.json").read_text())
    rows = []
    for lens, C in CASES:
        r = bench_conv_prefill(lens, C)
        for spec in cand["specs"]:
            if spec.startswith("prefill"):
                rows.append({"spec": spec, "case": f"{len(lens)}x{lens[0]} C={C}", "us": r["vkc_graph_us"],
                             "pct_hbm": r["vkc_pct_hbm"]})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
