"""Write the committed default GEMM plans, runtime/vkc_runtime/plans/defaults/<arch>.json.

    .venv/bin/python tools/plans/make_defaults.py            # rewrite every arch's file
    .venv/bin/python tools/plans/make_defaults.py --check    # exit 1 when a committed file differs
    .venv/bin/python tools/plans/make_defaults.py --from plans.json   # sm_90a default := a tuned plan file

sm_90a: the documented tile rule of ``vkc_runtime.ops.gemm.pick_tile`` evaluated at the H200's 132 SMs for every
M bucket of the Qwen3.6-27B bf16 projection shapes below (not yet timed: replace with a tuned plan from an
H200: ``vkc tune plans --write-defaults sm_90a.json`` times every covered key there and writes this format directly;
``--from plans.json`` converts a tuned native plan file). Archs without
GEMM tactics get an empty plan that says so. tests/test_plans_defaults.py runs ``--check``'s comparison for
rule-made files and validates tuned ones.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from vkc_runtime.ops import gemm
from vkc_runtime.plans import defaults, gemm_key, store, tactics
from vkc_runtime.plans.keys import BUCKET_VERSION, M_BUCKETS

H200 = ("NVIDIA H200", 132)
SHAPES_27B = defaults.COVERED_NK  # the Qwen3.6-27B GEMMs (plans/defaults.py)


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


def from_tuned(path: Path) -> tuple[str, bytes]:
    """A default plan made of a tuned native plan file (validated against its own metadata)."""
    meta = store.strict_json(path.read_text())["_metadata"]
    plans = store.parse(path.read_text(), meta)
    return meta["sm"], defaults.tuned_document(meta, plans.values(), "vkc tune plans")


def _source(p: Path) -> str:
    return str(json.loads(p.read_text()).get("_metadata", {}).get("source", ""))


def main(argv: list[str]) -> int:
    if "--from" in argv:
        arch, data = from_tuned(Path(argv[argv.index("--from") + 1]))
        defaults.path_for(arch).write_bytes(data)
        print(f"wrote {defaults.path_for(arch)}")
        return 0
    bad = 0
    for arch in tactics.TACTICS:
        p = defaults.path_for(arch)
        data = document(arch)
        if "--check" in argv:
            if p.is_file() and not _source(p).startswith(("rule:", "none")):
                continue  # a tuned default: validated by defaults.read, not regenerated
            if not p.is_file() or p.read_bytes() != data:
                print(f"{p}: differs from tools/plans/make_defaults.py", file=sys.stderr)
                bad = 1
        else:
            if p.is_file() and not _source(p).startswith(("rule:", "none")):
                print(f"kept {p} (tuned)")
                continue
            p.write_bytes(data)
            print(f"wrote {p} ({len(json.loads(data)['plans'])} plans)")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
