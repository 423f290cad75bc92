"""`vkc verify`: the fatal drift check (ARCHITECTURE.md "Manifest and artifact kinds"; no GPU, no Triton; `--rebuild` excepted).

Every problem is one line naming the arch, what drifted and the exact repair command; each comes from a
registered check (:mod:`vkc.checks`). Artifacts are checked by the rules of their kind (:mod:`vkc.kinds`).

Two modes:

* ``checkout`` (a source tree): everything, including kernel sources, specs, git tracking.
* ``installed`` (an artifact root without sources, e.g. a wheel's ``vkc_runtime/artifacts/``): schema,
  canonical form and digest, arch and target, toolchain pins and generator hash against the installed
  vkc, every artifact by its kind, no missing or extra files. Source, spec and git drift need a checkout.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from vkc_contract.arch import ALL_ARCHS
from vkc_contract.arch import get as get_arch
from vkc_contract.hashing import sha256_file

from vkc_contract.layout import CUTE_SO
from vkc_contract.tactics import manifest_block as tactics_block

from vkc import cute_lane, discover, kinds, manifest, toolchain
from vkc.checks import CHECKS, Problem, problem  # noqa: F401 - CHECKS re-exported for the tests
from vkc.compile import params_of
from vkc.spec import SpecError

CHECKOUT, INSTALLED = "checkout", "installed"
INSTALLED_NOTE = ("installed artifacts: schema, digests, toolchain pins, generator and every artifact checked; "
                  "kernel source, spec and git drift checks need a source checkout")


def _regen(arch: str) -> str:
    return f"run `vkc regen --arch {arch}`"


def git_tracked(root: Path) -> set[str] | None:
    """Repo-relative paths git tracks under vendored/ and manifests/, or None outside a git checkout."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", "vendored", "manifests"],
                         capture_output=True, check=False)
    if out.returncode != 0:
        return None
    return {p for p in out.stdout.decode().split("\0") if p}


def _manifest_doc(root: Path, arch: str) -> tuple[list[Problem], dict[str, Any] | None]:
    """Presence, JSON, schema, canonical form, digest, arch and target of manifests/<arch>.json."""
    fix, a = _regen(arch), get_arch(arch)
    mpath = manifest.manifest_path(root, arch)
    rel = mpath.relative_to(root).as_posix()
    if not mpath.is_file():
        return [problem("manifest-missing", arch, rel=rel, fix=fix)], None
    try:
        doc = manifest.load(mpath)
    except ValueError as e:
        return [problem("manifest-json", arch, rel=rel, err=e, fix=fix)], None
    errs = manifest.schema_errors(root, doc)
    if errs:
        return [problem("schema-violation", arch, rel=rel, err=e, fix=fix) for e in errs], None
    P = []
    if mpath.read_bytes() != manifest.canonical(doc):
        P.append(problem("noncanonical", arch, rel=rel, fix=fix))
    if doc["digest"] != manifest.digest(doc):
        P.append(problem("digest", arch, rel=rel, fix=fix))
    if doc["arch"] != arch:
        P.append(problem("manifest-arch", arch, rel=rel, got=doc["arch"], fix=fix))
    if doc["target"]["cc"] != a.triton_cc:
        P.append(problem("target-cc", arch, got=doc["target"]["cc"], want=a.triton_cc, fix=fix))
    try:
        want = tactics_block(doc["kernels"])
    except KeyError as e:
        want = {"error": str(e)}
    if doc["tactics"] != want:
        short = lambda t: (f"v{t.get('version')} count {t.get('count')} digest {str(t.get('digest'))[:12]} "  # noqa: E731
                           f"bases {t.get('bases')}" if "error" not in t else t["error"])
        P.append(problem("tactics", arch, got=short(doc["tactics"]), want=short(want), fix=fix))
    return P, doc


def _toolchain(root: Path | None, arch: str, tc: dict[str, Any]) -> list[Problem]:
    fix, a = _regen(arch), get_arch(arch)
    P = []
    if tc["triton"] != toolchain.TRITON_VERSION:
        P.append(problem("triton-pin", arch, got=tc["triton"], want=toolchain.TRITON_VERSION, fix=fix))
    if tc["python"] != toolchain.PYTHON_VERSION:
        P.append(problem("python-pin", arch, got=tc["python"], want=toolchain.PYTHON_VERSION, fix=fix))
    want_ptxas = toolchain.ptxas_name_for(a.triton_cc)
    pin = toolchain.PTXAS[want_ptxas]
    if tc["ptxas"] != {"name": want_ptxas, **pin}:
        P.append(problem("ptxas-pin", arch, got=tc["ptxas"], name=want_ptxas, want=pin, fix=fix))
    if tc["line_info"] != toolchain.LINE_INFO:
        P.append(problem("line-info", arch, got=tc["line_info"], want=toolchain.LINE_INFO, fix=fix))
    gen = discover.generator_hash(root)
    if tc["generator_sha256"] != gen:
        P.append(problem("generator", arch, old=tc["generator_sha256"][:12], new=gen[:12], fix=fix))
    dsl = tc.get("cutlass_dsl")
    if dsl is not None:
        got = {k: dsl.get(k) for k in toolchain.CUTLASS_DSL}
        if got != toolchain.CUTLASS_DSL:
            P.append(problem("cutlass-dsl-pin", arch, got=_dsl_name(got), want=_dsl_name(toolchain.CUTLASS_DSL),
                             fix=fix))
    return P


def _dsl_name(d: dict[str, Any]) -> str:
    return f"{d.get('package')} {d.get('version')} ({d.get('flavor')})"


def _cute_toolchain(root: Path | None, arch: str, doc: dict[str, Any]) -> list[Problem]:
    """A manifest with cute-so kernels records the DSL and (checked in a checkout) the shim it linked."""
    fix = _regen(arch)
    if not any(kinds.kind_of(k) == CUTE_SO for k in doc["kernels"].values()):
        return []
    dsl = doc["toolchain"].get("cutlass_dsl")
    if dsl is None:
        return [problem("cutlass-dsl-unrecorded", arch, fix=fix)]
    if root is None:
        return []
    P = []
    recorded = dsl.get("shim_sha256") or {}
    for rel, h in sorted(cute_lane.shim_hashes(root).items()):
        if recorded.get(rel) != h:
            P.append(problem("cute-shim-changed", arch, rel=rel, fix=fix))
    return P


def _sources_and_specs(root: Path, arch: str, doc: dict[str, Any]) -> list[Problem]:
    """Kernel sources, the spec set and every Triton kernel's spec inputs (source checkout only)."""
    fix = _regen(arch)
    P: list[Problem] = []
    for rel, h in doc["sources"].items():
        f = root / rel
        if not f.is_file():
            P.append(problem("source-missing", arch, rel=rel, fix=fix))
        elif sha256_file(f) != h:
            P.append(problem("source-changed", arch, rel=rel, fix=fix))
    try:
        bases = {b.spec.base: b for b in discover.bases_for_arch(root, arch)}
        cute = {s.base: s for s in discover.cute_specs_for_arch(root, arch)}
    except (SpecError, SyntaxError, OSError) as e:
        return P + [problem("specs-unreadable", arch, err=e, fix=fix)]
    recorded = doc["kernels"]
    for name in sorted((set(bases) | set(cute)) - set(recorded)):
        P.append(problem("spec-added", arch, name=name, fix=fix))
    for name in sorted(set(recorded) - set(bases) - set(cute)):
        P.append(problem("spec-removed", arch, name=name, fix=fix))
    all_deps: set[str] = set()
    for name in sorted((set(bases) | set(cute)) & set(recorded)):
        k = recorded[name]
        spec = bases[name].spec if name in bases else cute[name]
        try:
            deps = discover.source_deps(root, spec.family, spec.source)
        except (OSError, SyntaxError) as e:
            P.append(problem("source-unscannable", arch, name=name, err=e, fix=fix))
            continue
        if name in bases:
            inputs = bases[name].resolved.inputs_json()
            inputs["deps"] = deps
        else:
            inputs = cute[name].inputs_json(deps)
        all_deps.update(deps)
        for key in sorted(set(inputs) | set(k["inputs"])):
            if inputs.get(key) != k["inputs"].get(key):
                P.append(problem("spec-input", arch, name=name, key=key, old=k["inputs"].get(key),
                                 new=inputs.get(key), fix=fix))
        if name in bases and k.get("params") != params_of(bases[name].resolved):
            P.append(problem("params-signature", arch, name=name, fix=fix))
    for rel in sorted(all_deps - set(doc["sources"])):
        P.append(problem("source-unrecorded", arch, rel=rel, fix=fix))
    return P


def verify_arch(root: Path, arch: str, tracked: set[str] | None, mode: str = CHECKOUT) -> list[Problem]:
    P, doc = _manifest_doc(root, arch)
    if doc is None:
        return P
    fix = _regen(arch)
    P += _toolchain(root if mode == CHECKOUT else None, arch, doc["toolchain"])
    P += _cute_toolchain(root if mode == CHECKOUT else None, arch, doc)
    if mode == CHECKOUT:
        P += _sources_and_specs(root, arch, doc)
    ctx = kinds.Ctx(root, arch)
    listed: list[str] = []
    for name, k in sorted(doc["kernels"].items()):
        P += kinds.check_kernel(ctx, name, k)
        listed += [art["path"] for art in kinds.artifacts_of(k) if art["path"] not in listed]

    if tracked is not None:
        rel_m = manifest.manifest_path(root, arch).relative_to(root).as_posix()
        untracked = [rel for rel in [rel_m] + listed if rel not in tracked and (root / rel).is_file()]
        if untracked:
            shown = ", ".join(untracked[:3]) + (f" and {len(untracked) - 3} more" if len(untracked) > 3 else "")
            P.append(problem("untracked", arch, n=len(untracked), shown=shown))
    vdir = root / "vendored" / arch
    if vdir.is_dir():
        for f in sorted(vdir.rglob("*")):
            rel = f.relative_to(root).as_posix()
            if f.is_file() and rel not in listed:
                P.append(problem("extra-file", arch, rel=rel, fix=fix))
    return P


def installed_archs(root: Path) -> list[str]:
    return [a for a in ALL_ARCHS if manifest.manifest_path(root, a).is_file()]


def verify(root: Path, archs: list[str] | None = None, mode: str = CHECKOUT) -> list[Problem]:
    """All problems of ``archs`` (default: every arch; in ``installed`` mode every arch with a manifest)."""
    tracked = git_tracked(root) if mode == CHECKOUT else None
    if not (root / manifest.SCHEMA_PATH).is_file():
        return [problem("schema-missing", schema=manifest.SCHEMA_PATH)]
    P: list[Problem] = []
    known = {f"{a}.json" for a in ALL_ARCHS} | {"schema.json"}
    for f in sorted((root / "manifests").glob("*.json")):
        if f.name not in known:
            P.append(problem("stray-manifest", file=f.name))
    vend = root / "vendored"
    if vend.is_dir():
        for d in sorted(vend.iterdir()):
            if d.name not in ALL_ARCHS and not d.name.startswith("."):
                P.append(problem("stray-arch-dir", dir=d.name))
    if not archs and mode == INSTALLED:
        archs = installed_archs(root)
        if not archs:
            return P + [problem("no-installed-manifest", root=root)]
    for arch in archs or ALL_ARCHS:
        P.extend(verify_arch(root, arch, tracked, mode))
    assert all(isinstance(p, Problem) for p in P), "every verify finding comes from vkc.checks.problem()"
    return P


def rebuild_compare(root: Path, archs: list[str], jobs: int | None = None) -> list[Problem]:
    """Regenerate into a fresh copy of the tree (another directory) and compare every byte."""
    from vkc import regen  # noqa: PLC0415 - needs triton

    P: list[Problem] = []
    with tempfile.TemporaryDirectory(prefix="vkc-rebuild-") as tmp:
        copy = Path(tmp) / "tree"
        for rel in ("aot", "contract", "runtime", "kernels_src", cute_lane.SHIM_DIR):
            if (root / rel).is_dir():  # the shim: only trees with CuTe kernels have (and need) it
                shutil.copytree(root / rel, copy / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        (copy / "manifests").mkdir(parents=True)
        shutil.copy2(root / manifest.SCHEMA_PATH, copy / manifest.SCHEMA_PATH)
        cute = None  # the checkout's DSL (the copy has no .venv-cute), only when some arch needs it
        if any(discover.cute_specs_for_arch(root, a) for a in archs):
            cute = cute_lane.dsl_python(root)
        regen.regen(copy, archs, jobs=jobs, cute_python=cute)
        for arch in archs:
            mine = manifest.manifest_path(root, arch)
            theirs = manifest.manifest_path(copy, arch)
            if not mine.is_file() or mine.read_bytes() != theirs.read_bytes():
                P.append(problem("rebuilt-manifest", arch, rel=mine.relative_to(root).as_posix(), fix=_regen(arch)))
            new = {p.relative_to(copy).as_posix(): p.read_bytes()
                   for p in (copy / "vendored" / arch).rglob("*") if p.is_file()}
            for rel, data in sorted(new.items()):
                f = root / rel
                if not f.is_file() or f.read_bytes() != data:
                    P.append(problem("rebuilt-artifact", arch, rel=rel, fix=_regen(arch)))
    return P
