"""Tuning benchmark of the moe family's router for `vkc tune run` (GPU): times moe.route (the logits launch, then
softmax + top-k) of the artifact root in VKC_ARTIFACT_ROOT on the 35B-A3B's router (E 256, top 8 + the shared
expert's gate, H 2048) at decode and prefill token counts, CUDA-graph replay (the launches chained by PDL as in
a decode step), a router weight of its own per input set so that the weights come from HBM as in a step, and
prints one JSON line of rows {"spec", "case", "us"}: one row per launch the call makes (the logits kernel the
rule takes for M, and route.topk.e256), both with the call's time."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from bench_moe import E, H, I, K  # noqa: E402 - the 35B-A3B block's shape
from bench_norm import graph_ms, make_sets  # noqa: E402

from vkc_runtime.ops import moe  # noqa: E402
from vkc_runtime.ops.moe import common  # noqa: E402

MS = (1, 4, 16, 64, 2048)


def main() -> None:
    rows = []
    for M in MS:
        ws = moe.moe_workspace(M, E, K, H, I, shared=True)
        ids = torch.empty(M, K + 1, dtype=torch.int32, device="cuda")
        wts = torch.empty(M, K + 1, device="cuda")

        def make():
            def rnd(*shape):
                return (torch.randn(*shape, device="cuda") * 0.02).to(torch.bfloat16)
            return rnd(M, H), rnd(E, H), rnd(1, H)
        nb = (M + E + 1) * H * 2
        ms = graph_ms(lambda x, gw, sg, stream=0: moe.route(x, gw, K, renormalize=True, shared_gate_w=sg,
                                                            topk_ids=ids, topk_weights=wts, workspace=ws,
                                                            stream=stream),
                      make_sets(make, nb), vkc=True)
        for spec in (common.logits_base(common.logits_size(M)), common.topk_base(common.topk_eb(E))):
            rows.append({"spec": spec.split(".", 1)[1], "case": f"M={M}", "us": ms * 1e3})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
