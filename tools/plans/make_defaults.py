"""Write the committed default GEMM plans, runtime/vkc_runtime/plans/defaults/<arch>.json.

    .venv/bin/python tools/plans/make_defaults.py            # rewrite every arch's file
    .venv/bin/python tools/plans/make_defaults.py --check    # exit 1 when a committed file differs

sm_90a: the documented tile rule of ``vkc_runtime.ops.gemm.pick_tile`` evaluated at the H200's 132 SMs for every
M bucket of the Qwen3.6-27B bf16 projection shapes below (not yet timed: replace with a tuned plan from an
H200 warm-up, ``VKC_PLAN_CACHE=<file> VKC_PLAN_DEFAULTS=0``, then copy its plans here). Archs without GEMM
tactics get an empty plan that says so. tests/test_plans_defaults.py runs ``--check``'s comparison.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from vkc_runtime.ops import gemm
from vkc_runtime.plans import defaults, gemm_key, store, tactics
from vkc_runtime.plans.keys import BUCKET_VERSION, M_BUCKETS

H200 = ("NVIDIA H200", 132)
# (N, K) of the Qwen3.6-27B GEMMs (hidden 5120, 24 q + 4 kv heads of 256, MLP 17408, vocabulary 248320):
# packed q|gate|k|v, attention o_proj / GDN out_proj, MLP gate|up, MLP down, lm_head
SHAPES_27B = ((14336, 5120), (5120, 6144), (34816, 5120), (5120, 17408), (248320, 5120))


def document(arch: str) -> bytes:
    ts = tactics.tactics_for(arch)
    meta = {"format": defaults.DEFAULT_FORMAT, "sm": arch, "tactic_set": tactics.tactic_set(arch),
            "bucket_version": BUCKET_VERSION}
    plans = []
    if ts:
        name, sms = H200
        meta.update(device_name=name, sm_count=sms,
                    source=f"rule: vkc_runtime.ops.gemm.pick_tile at {sms} SMs (documented default, not timed)",
                    note="Qwen3.6-27B bf16 projection shapes x 16 M buckets; regenerate with tools/plans/make_defaults.py")
        for n, k in SHAPES_27B:
            for m in M_BUCKETS:
                tid = tactics.id_of_base(arch, gemm.gemm_base(gemm.pick_tile(m, n, sms)))
                plans.append(store.entry(arch, gemm_key(m, n, k), tid))
    else:
        meta.update(source="none", note=f"{arch} has no compiled GEMM tactics (the CuTe GEMM is built for sm_90a "
                                        "only): ops.gemm.linear raises MissingKernelError here")
    return store.dumps(meta, plans)


def main(argv: list[str]) -> int:
    bad = 0
    for arch in tactics.TACTICS:
        p = defaults.path_for(arch)
        data = document(arch)
        if "--check" in argv:
            if not p.is_file() or p.read_bytes() != data:
                print(f"{p}: differs from tools/plans/make_defaults.py", file=sys.stderr)
                bad = 1
        else:
            p.write_bytes(data)
            print(f"wrote {p} ({len(json.loads(data)['plans'])} plans)")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
