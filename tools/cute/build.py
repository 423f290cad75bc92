"""Build one arch's CuTe artifacts into a scratch directory, outside `vkc regen` (a thin wrapper of the lane).

    .venv/bin/python tools/cute/build.py --arch sm_90a --out build/cute/sm_90a

Writes ``<out>/<family>.<host>.so`` for every host platform and ``<out>/entries.json`` (the manifest entries and
the toolchain record `vkc regen` would write), and prints the DSL compile times. The real build is
:func:`vkc.cute_lane.build_arch`; `vkc regen --arch <arch>` is what vendors the result.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vkc import cute_lane, discover


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True)
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args(argv)
    root = discover.find_root()
    specs = discover.cute_specs_for_arch(root, a.arch)
    if not specs:
        raise SystemExit(f"no CuTe specs for {a.arch}")
    deps = {s.base: discover.source_deps(root, s.family, s.source) for s in specs}
    b = cute_lane.build_arch(root, a.arch, specs, deps)
    a.out.mkdir(parents=True, exist_ok=True)
    for rel, data in b.files.items():
        (a.out / Path(rel).name).write_bytes(data)
        print(f"{a.out / Path(rel).name}: {len(data)} bytes")
    (a.out / "entries.json").write_text(json.dumps({"kernels": b.kernels, "cutlass_dsl": b.toolchain}, indent=1,
                                                   sort_keys=True) + "\n")
    print("DSL compile seconds:", b.compile_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
