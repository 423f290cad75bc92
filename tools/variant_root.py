"""Build an artifact root for an A/B of kernel variants on the device (CPU box; the CuTe lane not needed).

A variant is a copy of this tree's build inputs (aot, contract, runtime, kernels_src, csrc) with some kernel
sources or specs patched, regenerated for one arch. Its root holds only the artifacts named by ``globs`` plus the
variant's manifest; on the device, fill it with the head's other artifacts and point the runtime at it::

    cp -rn vendored/sm_90a/. ROOT/vendored/sm_90a/; cp manifests/schema.json ROOT/manifests/
    VKC_ARTIFACT_ROOT=$PWD/ROOT python3 benchmarks/bench_gemv.py ...

(the runtime checks each artifact's sha256 against the manifest it loads, not the manifest's digest). Use from a
session's record script::

    from variant_root import build
    def patch(tree): ...            # edit files under tree (a pathlib.Path)
    build("BN4", patch, ["gemv/bf16.m1.*.cubin"])
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
_INPUTS = ("aot", "contract", "runtime", "kernels_src", "csrc")


def build(name: str, patch, globs: list[str], arch: str = "sm_90a",
          work: pathlib.Path | None = None) -> pathlib.Path:
    """Copy the build inputs to ``work/name/tree``, apply ``patch(tree)``, regenerate ``arch`` there, and
    assemble ``work/name/root`` (the artifacts matching ``globs`` under vendored/<arch>/, and the manifest).
    Prints the root's kernels' resources; returns the root."""
    work = (work or REPO / "build/var-src").resolve()
    tree = work / name / "tree"
    shutil.rmtree(tree.parent, ignore_errors=True)
    for rel in _INPUTS:
        shutil.copytree(REPO / rel, tree / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (tree / "manifests").mkdir()
    shutil.copy2(REPO / "manifests/schema.json", tree / "manifests/schema.json")
    patch(tree)
    env = dict(os.environ)
    env.setdefault("VKC_CUTE_PYTHON", str(REPO / ".venv-cute/bin/python"))
    code = "import sys, pathlib; from vkc import regen; regen.regen(pathlib.Path(sys.argv[1]), [sys.argv[2]])"
    subprocess.run([str(REPO / ".venv/bin/python"), "-c", code, str(tree), arch], cwd=tree, env=env, check=True,
                   capture_output=True)
    root = tree.parent / "root"
    src = tree / "vendored" / arch
    picked = sorted({f for g in globs for f in src.glob(g)})
    if not picked:
        raise SystemExit(f"variant {name}: no artifact matches {globs}")
    for f in picked:
        dst = root / "vendored" / arch / f.relative_to(src)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dst)
    (root / "manifests").mkdir(parents=True)
    shutil.copy2(tree / "manifests" / f"{arch}.json", root / "manifests" / f"{arch}.json")
    kernels = json.loads((root / "manifests" / f"{arch}.json").read_text())["kernels"]
    paths = {str(f.relative_to(tree)) for f in picked}
    print(name, {k: v["resources"] for k, v in kernels.items() if v.get("artifact", {}).get("path") in paths})
    return root


def replace_once(path: pathlib.Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in a file, where ``old`` occurs exactly once (a patch that silently misses is a
    variant identical to the head)."""
    s = path.read_text()
    if s.count(old) != 1:
        raise SystemExit(f"{path}: expected one occurrence of {old!r}, found {s.count(old)}")
    path.write_text(s.replace(old, new))


if __name__ == "__main__":
    sys.exit(__doc__)
