"""Build AOT tuning candidates on the CPU box (maintainer script; the GPU half is tools/gpu/tune_norm.py).

For every value of one knob, copies the generator + kernels into a scratch tree, writes a tuning file
``kernels_src/<family>/tuning/<arch>.json`` that sets the knob for the chosen specs, regenerates that arch
with the pinned toolchain and keeps ``vendored/<arch>/`` + ``manifests/<arch>.json`` as one artifact root per
candidate under OUT/<knob><value>/. The winners measured on the GPU go into the family's real tuning file,
which `vkc regen` consumes.

  python tools/tune_build.py --arch sm_90a --family norm --knob num_warps --values 4,8,16 \
      --specs 'rmsnorm.b*.a16,add_rmsnorm.b*.a16' --out build/tune
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("VKC_IMPORT_CHECK", "0")

from vkc import discover, regen  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True)
    ap.add_argument("--family", required=True)
    ap.add_argument("--knob", required=True, help="num_warps | num_stages | a constexpr name (constexprs.<NAME>)")
    ap.add_argument("--values", required=True, help="comma-separated integers")
    ap.add_argument("--specs", required=True, help="comma-separated fnmatch patterns of spec names")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    root = discover.find_root()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = [s.name for s in discover.load_specs(root, a.family)]
    pats = a.specs.split(",")
    chosen = [n for n in names if any(fnmatch.fnmatch(n, p) for p in pats)]
    if not chosen:
        raise SystemExit(f"no spec of {a.family} matches {pats}")
    base_tuning = discover.load_tuning(root, a.family, a.arch)
    for v in (int(x) for x in a.values.split(",")):
        layer = {"constexprs": {a.knob.split(".", 1)[1]: v}} if a.knob.startswith("constexprs.") else {a.knob: v}
        tuning = {n: {**base_tuning.get(n, {}), **layer} for n in chosen}
        tuning.update({n: t for n, t in base_tuning.items() if n not in tuning})
        with tempfile.TemporaryDirectory(prefix="vkc-tune-") as tmp:
            tree = Path(tmp) / "tree"
            for rel in ("aot", "runtime", "kernels_src"):
                shutil.copytree(root / rel, tree / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            (tree / "manifests").mkdir()
            shutil.copy2(root / "manifests/schema.json", tree / "manifests/schema.json")
            tdir = tree / "kernels_src" / a.family / discover.TUNING_DIR
            tdir.mkdir(exist_ok=True)
            (tdir / f"{a.arch}.json").write_text(json.dumps(tuning, indent=1, sort_keys=True) + "\n")
            try:
                regen.regen(tree, [a.arch])
            except regen.RegenError as e:
                print(f"{a.knob}={v}: FAILED: {e}")
                continue
            dst = out / f"{a.knob.replace('constexprs.', '')}{v}"
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(tree / "vendored" / a.arch, dst / "vendored" / a.arch)
            (dst / "manifests").mkdir(parents=True)
            shutil.copy2(tree / "manifests" / f"{a.arch}.json", dst / "manifests" / f"{a.arch}.json")
            shutil.copy2(tree / "manifests/schema.json", dst / "manifests/schema.json")
            (dst / "candidate.json").write_text(json.dumps({"arch": a.arch, "family": a.family, "knob": a.knob,
                                                             "value": v, "specs": chosen}, indent=1) + "\n")
            doc = json.loads((dst / "manifests" / f"{a.arch}.json").read_text())
            regs = {n: doc["kernels"][f"{a.family}.{n}"]["resources"]["registers"] for n in chosen}
            print(f"{a.knob}={v}: {dst}  registers {regs}")


if __name__ == "__main__":
    main()
