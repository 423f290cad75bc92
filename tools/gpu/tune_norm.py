"""GPU half of AOT tuning for the norm family: time each candidate artifact root built by tools/tune_build.py
(same Triton 3.9 cubins regen would vendor) with CUDA-graph replay over inputs larger than L2.
Usage (device): python3 tools/gpu/tune_norm.py build/tune OUT.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CASES = [(2048, 4096), (2048, 16384), (4096, 16384), (5120, 4096), (5120, 16384)]


def child(root: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import torch
    from bench_norm import graph_ms, make_sets

    from vkc_runtime.ops import norm as N
    bf = dict(device="cuda", dtype=torch.bfloat16)
    out = []
    for hidden, T in CASES:
        w = (torch.randn(hidden, device="cuda") * 0.1).to(torch.bfloat16)
        nb = 2 * T * hidden * 2
        ms = graph_ms(lambda x, y, stream=0: N.rmsnorm(x, w, 1e-6, out=y, stream=stream),
                      make_sets(lambda: (torch.randn(T, hidden, **bf), torch.empty(T, hidden, **bf)), nb), vkc=True)
        out.append({"op": "rmsnorm", "hidden": hidden, "tokens": T, "us": ms * 1e3, "tbs": nb / ms / 1e9})
        nb = 4 * T * hidden * 2
        ms = graph_ms(lambda x, r, y, stream=0: N.add_rmsnorm(x, r, w, 1e-6, out=y, stream=stream),
                      make_sets(lambda: (torch.randn(T, hidden, **bf), torch.randn(T, hidden, **bf),
                                         torch.empty(T, hidden, **bf)), nb), vkc=True)
        out.append({"op": "add_rmsnorm", "hidden": hidden, "tokens": T, "us": ms * 1e3, "tbs": nb / ms / 1e9})
    print(json.dumps(out))


def main(tune_dir: str, out_path: str) -> None:
    res = {}
    for cand in sorted(Path(tune_dir).iterdir()):
        if not (cand / "candidate.json").is_file():
            continue
        env = {**os.environ, "VKC_ARTIFACT_ROOT": str(cand.resolve())}
        p = subprocess.run([sys.executable, __file__, "--child", str(cand)], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            res[cand.name] = {"error": p.stderr[-1500:]}
            continue
        res[cand.name] = {"candidate": json.loads((cand / "candidate.json").read_text()),
                          "rows": json.loads(p.stdout.strip().splitlines()[-1])}
    json.dump(res, open(out_path, "w"), indent=1)
    names = [n for n in res if "rows" in res[n]]
    if not names:
        print(json.dumps(res, indent=1)[:3000])
        return
    print(f"{'op':<12}{'hidden':>7}{'T':>7}" + "".join(f"{n:>14}" for n in names) + "   (TB/s)")
    for i, r in enumerate(res[names[0]]["rows"]):
        print(f"{r['op']:<12}{r['hidden']:>7}{r['tokens']:>7}" + "".join(f"{res[n]['rows'][i]['tbs']:>14.2f}"
                                                                     for n in names))


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
