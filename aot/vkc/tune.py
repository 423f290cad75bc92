"""`vkc tune`: AOT tuning in three steps, with the pinned compiler on both sides of the measurement.

1. ``vkc tune build`` (CPU box): for every value of one knob, regenerate one arch into a scratch tree with a
   tuning layer that sets the knob for the chosen specs; keep each result as an artifact root
   ``OUT/<knob><value>/`` (vendored/<arch>/ + manifests/<arch>.json + candidate.json).
2. ``vkc tune run`` (GPU): time every candidate root with a family benchmark (``benchmarks/tune_<family>.py``)
   in a fresh process with ``VKC_ARTIFACT_ROOT`` pointing at it; the benchmark prints JSON rows
   ``{"spec": <spec name>, "case": ..., "us": ...}``.
3. ``vkc tune apply``: per spec, the candidate with the lowest geometric-mean time over that spec's cases
   is written into ``kernels_src/<family>/tuning/<arch>.json`` — data that ``vkc regen`` consumes.

The GPU box runs its own Triton (3.6 on the H200) for JIT peers, so tuning Triton-JIT variants there would
measure a different compiler: candidates are always cubins from the pinned toolchain.
"""
from __future__ import annotations

import fnmatch
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from vkc import discover, regen


def _layer(knob: str, value: int) -> dict[str, Any]:
    if knob.startswith("constexprs."):
        return {"constexprs": {knob.split(".", 1)[1]: value}}
    if knob not in ("num_warps", "num_stages"):
        raise ValueError(f"knob must be num_warps, num_stages or constexprs.<NAME>, got {knob!r}")
    return {knob: value}


def _overlay(entry: dict[str, Any], knobs: dict[str, int]) -> dict[str, Any]:
    """``entry`` (one spec's tuning data) with each knob (KNOB -> value, e.g. the fixed ones and the swept one)
    laid over it; constexprs merge key by key."""
    out = dict(entry)
    for knob, value in knobs.items():
        for k, val in _layer(knob, value).items():
            out[k] = {**out.get(k, {}), **val} if isinstance(val, dict) else val
    return out


def build(root: Path, arch: str, family: str, knob: str, values: list[int], patterns: list[str], out: Path,
          log: Callable[[str], None] = print, fixed: dict[str, int] | None = None) -> list[Path]:
    """``fixed``: other knobs set to one value in every candidate (e.g. {"num_stages": 2} while BLOCK_M varies)."""
    names = [s.name for s in discover.load_specs(root, family)]
    chosen = [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]
    if not chosen:
        raise ValueError(f"no spec of {family} matches {patterns}")
    base_tuning = discover.load_tuning(root, family, arch)
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for v in values:
        tuning = dict(base_tuning)
        for n in chosen:
            tuning[n] = _overlay(tuning.get(n, {}), {**(fixed or {}), knob: v})
        with tempfile.TemporaryDirectory(prefix="vkc-tune-") as tmp:
            tree = Path(tmp) / "tree"
            for rel in ("aot", "contract", "runtime", "kernels_src", "csrc"):  # csrc: the CuTe lane's shim
                shutil.copytree(root / rel, tree / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            (tree / "manifests").mkdir()
            shutil.copy2(root / "manifests/schema.json", tree / "manifests/schema.json")
            tdir = tree / "kernels_src" / family / discover.TUNING_DIR
            tdir.mkdir(exist_ok=True)
            (tdir / f"{arch}.json").write_text(json.dumps(tuning, indent=1, sort_keys=True) + "\n")
            try:
                regen.regen(tree, [arch])
            except regen.RegenError as e:  # e.g. the value makes a kernel spill: not a candidate
                log(f"{knob}={v}: rejected: {e}")
                continue
            dst = out / f"{knob.replace('constexprs.', '')}{v}"
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(tree / "vendored" / arch, dst / "vendored" / arch)
            (dst / "manifests").mkdir(parents=True)
            for f in (f"{arch}.json", "schema.json"):
                shutil.copy2(tree / "manifests" / f, dst / "manifests" / f)
            (dst / "candidate.json").write_text(json.dumps(
                {"arch": arch, "family": family, "knob": knob, "value": v, "fixed": fixed or {}, "specs": chosen},
                indent=1) + "\n")
            doc = json.loads((dst / "manifests" / f"{arch}.json").read_text())
            regs = {n: doc["kernels"][f"{family}.{n}"]["resources"]["registers"] for n in chosen}
            log(f"{knob}={v}: {dst} (registers {regs})")
            made.append(dst)
    return made


def run(tune_dir: Path, bench: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Time every candidate under ``tune_dir`` with ``bench`` (GPU). Returns {candidate: {candidate, rows}}."""
    res: dict[str, Any] = {}
    for cand in sorted(p for p in tune_dir.iterdir() if (p / "candidate.json").is_file()):
        e = {**(env or os.environ), "VKC_ARTIFACT_ROOT": str(cand.resolve())}
        p = subprocess.run([sys.executable, str(bench)], capture_output=True, text=True, env=e)
        meta = json.loads((cand / "candidate.json").read_text())
        if p.returncode != 0:
            res[cand.name] = {"candidate": meta, "error": p.stderr[-2000:]}
            continue
        res[cand.name] = {"candidate": meta, "rows": json.loads(p.stdout.strip().splitlines()[-1])}
    return res


def choose(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per spec: the candidate with the lowest geometric mean of its case times (all cases must be present). Only
    a candidate's own specs count (the benchmark also times the family's other kernels, the same in every
    candidate: their spread is noise, and the knob was never compiled into them)."""
    per_spec: dict[str, dict[str, dict[str, float]]] = {}
    for name, r in results.items():
        own = set(r["candidate"].get("specs", ()))
        for row in r.get("rows", []):
            if row["spec"] not in own:
                continue
            per_spec.setdefault(row["spec"], {}).setdefault(name, {})[row["case"]] = float(row["us"])
    out = {}
    for spec, cands in sorted(per_spec.items()):
        cases = set.union(*(set(c) for c in cands.values()))
        full = {n: t for n, t in cands.items() if set(t) == cases}
        best = min(full, key=lambda n: math.fsum(math.log(x) for x in full[n].values()))
        meta = results[best]["candidate"]
        out[spec] = {"family": meta["family"], "arch": meta["arch"], "knob": meta["knob"], "value": meta["value"],
                     "fixed": meta.get("fixed", {}),
                     "candidate": best,
                     "geomean_us": {n: math.exp(math.fsum(math.log(x) for x in t.values()) / len(t))
                                    for n, t in sorted(full.items())}}
    return out


def apply(root: Path, choices: dict[str, dict[str, Any]], mirror: list[tuple[str, str]] = ()) -> dict[Path, dict]:
    """Write the chosen knob values into kernels_src/<family>/tuning/<arch>.json (merged with what is there).
    ``mirror`` pairs (".a16", ".any") copy a measured spec's choice to its twin of the same shape."""
    files: dict[Path, dict] = {}
    for spec, c in choices.items():
        path = root / discover.KERNELS_DIR / c["family"] / discover.TUNING_DIR / f"{c['arch']}.json"
        data = files.setdefault(path, json.loads(path.read_text()) if path.is_file() else {})
        names = [spec] + [spec[: -len(a)] + b for a, b in mirror if spec.endswith(a)]
        for n in names:
            data[n] = _overlay(data.get(n, {}), {**c.get("fixed", {}), c["knob"]: c["value"]})
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return files
