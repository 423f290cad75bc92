"""Fresh-process plan stability (GPU): one frozen plan, N fresh processes, identical tactics and output bytes.

    python tools/plans/fresh_process_check.py [--procs 6] [--dir DIR]

1. A seeding process runs a readwrite warm-up (``vkc_runtime.plans.warmup_gemm``) of the declared shapes below
   with ``VKC_PLAN_DEFAULTS=0`` (so every key is tuned by the miss method) into ``DIR/plans.json``.
2. ``--procs`` fresh processes run with ``VKC_PLAN_CACHE_MODE=frozen`` on that file: each warms up the same
   shapes (a missing key would fail), runs ``ops.gemm.linear`` on fixed-seed inputs for every shape, and prints
   JSON: its start report counts, the selected tactic map, the sha256 of every output's bytes.
3. The parent compares: every process loaded every key, tuned / rejected / saved / lazy-missed nothing, and all
   selected maps and output hashes are identical. Exit 0 and one summary line on success, 1 otherwise.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# (M, N, K): Qwen3.6-27B projection shapes at prefill-sized M (the bf16 GEMM serves M > 64; gemv serves less)
SHAPES = [(m, n, k) for m in (128, 300, 2048) for n, k in ((14336, 5120), (5120, 6144), (34816, 5120), (5120, 17408))]


def _child(role: str) -> int:
    import torch

    from vkc_runtime import plans
    from vkc_runtime.ops import gemm

    rep = plans.warmup_gemm(SHAPES, stream=torch.cuda.current_stream().cuda_stream)
    out = {"report": {k: rep[k] for k in ("mode", "loaded", "tuned", "rejected", "saved", "fingerprint")}}
    if role == "run":
        hashes = []
        for i, (m, n, k) in enumerate(SHAPES):
            g = torch.Generator(device="cuda").manual_seed(1000 + i)
            x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
            w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
            y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            gemm.linear(x, w, y, stream=torch.cuda.current_stream())
            torch.cuda.synchronize()
            hashes.append(hashlib.sha256(y.view(torch.int16).cpu().numpy().tobytes()).hexdigest())
        c = plans.cache_for_context()
        out.update(selected=c.selected(), lazy_misses=c.stats["lazy_misses"], hashes=hashes,
                   tactics=[plans.gemm_tactic(m, n, k).id for m, n, k in SHAPES])
    print(json.dumps(out, sort_keys=True))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=6)
    ap.add_argument("--dir", default=None, help="where the plan file goes (default: a temporary directory)")
    ap.add_argument("--child", choices=("seed", "run"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a.child)
    d = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="vkc-plans-"))
    d.mkdir(parents=True, exist_ok=True)
    plan = d / "plans.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith("VKC_PLAN_")}

    def run(role: str, **env) -> dict:
        r = subprocess.run([sys.executable, __file__, "--child", role], env={**base, **env, "VKC_PLAN_CACHE": str(plan)},
                           capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise SystemExit(f"{role} process failed ({r.returncode}):\n{r.stderr[-3000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    seed = run("seed", VKC_PLAN_CACHE_MODE="readwrite", VKC_PLAN_DEFAULTS="0")
    keys = len({plans_key(m, n, k) for m, n, k in SHAPES})
    problems = []
    if seed["report"]["tuned"] != keys or seed["report"]["saved"] != keys:
        problems.append(f"seed: tuned {seed['report']['tuned']} / saved {seed['report']['saved']}, expected {keys}")
    outs = [run("run", VKC_PLAN_CACHE_MODE="frozen", VKC_PLAN_DEFAULTS="0") for _ in range(a.procs)]
    for i, o in enumerate(outs):
        r = o["report"]
        if (r["loaded"], r["tuned"], r["rejected"], r["saved"], o["lazy_misses"]) != (keys, 0, 0, 0, 0):
            problems.append(f"process {i}: loaded {r['loaded']} tuned {r['tuned']} rejected {r['rejected']} "
                            f"saved {r['saved']} lazy misses {o['lazy_misses']} (expected {keys}/0/0/0/0)")
        for f in ("selected", "tactics", "hashes"):
            if o[f] != outs[0][f]:
                problems.append(f"process {i}: {f} differ from process 0")
        if r["fingerprint"] != seed["report"]["fingerprint"]:
            problems.append(f"process {i}: fingerprint {r['fingerprint']} != seed {seed['report']['fingerprint']}")
    sel = hashlib.sha256(json.dumps(outs[0]["selected"], sort_keys=True).encode()).hexdigest()[:16] if outs else "-"
    for p in problems:
        print("FAIL", p, file=sys.stderr)
    print(f"fresh-process plans: {a.procs} processes, {keys} keys, fingerprint {seed['report']['fingerprint']}, "
          f"selected-map sha {sel}, tactics {outs[0]['tactics'] if outs else []}: "
          f"{'IDENTICAL' if not problems else f'{len(problems)} PROBLEM(S)'}")
    return 1 if problems else 0


def plans_key(m, n, k):
    from vkc_runtime.plans import gemm_key
    return gemm_key(m, n, k)


if __name__ == "__main__":
    sys.exit(main())
