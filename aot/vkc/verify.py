"""`vkc verify`: the fatal drift check of DESIGN.md section 4 (no GPU, no Triton; `--rebuild` excepted).

Every problem is one line naming the arch, what drifted and the exact repair command.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from vkc_contract import abi
from vkc_contract.arch import ALL_ARCHS
from vkc_contract.arch import get as get_arch
from vkc_contract.hashing import sha256_file
from vkc_contract.layout import artifact_relpath

from vkc import discover, elf, manifest, toolchain
from vkc.compile import params_of
from vkc.spec import SpecError


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


def verify_arch(root: Path, arch: str, tracked: set[str] | None) -> list[str]:
    P: list[str] = []
    fix = _regen(arch)
    a = get_arch(arch)
    mpath = manifest.manifest_path(root, arch)
    rel_m = mpath.relative_to(root).as_posix()
    if not mpath.is_file():
        return [f"{arch}: manifest {rel_m} is missing; {fix}"]
    try:
        doc = manifest.load(mpath)
    except ValueError as e:
        return [f"{arch}: {rel_m} is not valid JSON ({e}); {fix}"]
    errs = manifest.schema_errors(root, doc)
    if errs:
        return [f"{arch}: {rel_m} violates manifests/schema.json at {e}; {fix}" for e in errs]
    if mpath.read_bytes() != manifest.canonical(doc):
        P.append(f"{arch}: {rel_m} is not in canonical form (edited by hand?); {fix}")
    if doc["digest"] != manifest.digest(doc):
        P.append(f"{arch}: {rel_m} digest mismatch: the manifest was edited after regen; {fix}")
    if doc["arch"] != arch:
        P.append(f"{arch}: {rel_m} says arch {doc['arch']}; {fix}")
    if doc["target"]["cc"] != a.triton_cc:
        P.append(f"{arch}: target cc {doc['target']['cc']} != {a.triton_cc}; {fix}")
    untracked: list[str] = []
    if tracked is not None and rel_m not in tracked:
        untracked.append(rel_m)

    # toolchain pins
    tc = doc["toolchain"]
    if tc["triton"] != toolchain.TRITON_VERSION:
        P.append(f"{arch}: built with triton {tc['triton']}, pinned {toolchain.TRITON_VERSION}; "
                 f"pip install 'vkc[regen]' and {fix}")
    if tc["python"] != toolchain.PYTHON_VERSION:
        P.append(f"{arch}: built with python {tc['python']}, pinned {toolchain.PYTHON_VERSION}; {fix}")
    want_ptxas = toolchain.ptxas_name_for(a.triton_cc)
    pin = toolchain.PTXAS[want_ptxas]
    if tc["ptxas"] != {"name": want_ptxas, **pin}:
        P.append(f"{arch}: ptxas {tc['ptxas']} != pinned {want_ptxas} {pin}; {fix}")
    if tc["line_info"] != toolchain.LINE_INFO:
        P.append(f"{arch}: line info policy differs; {fix}")
    gen = discover.generator_hash(root)
    if tc["generator_sha256"] != gen:
        P.append(f"{arch}: generator (aot/ sources) changed since regen ({tc['generator_sha256'][:12]} -> "
                 f"{gen[:12]}); {fix}")

    # sources
    for rel, h in doc["sources"].items():
        f = root / rel
        if not f.is_file():
            P.append(f"{arch}: source {rel} recorded in the manifest is missing; {fix}")
        elif sha256_file(f) != h:
            P.append(f"{arch}: source {rel} changed since regen (stale artifacts); {fix}")

    # spec set and per-base inputs
    try:
        bases = {b.spec.base: b for b in discover.bases_for_arch(root, arch)}
    except (SpecError, SyntaxError, OSError) as e:
        return P + [f"{arch}: cannot read the specs: {e}"]
    recorded = doc["kernels"]
    for name in sorted(set(bases) - set(recorded)):
        P.append(f"{arch}: spec {name} has no artifact (added since regen); {fix}")
    for name in sorted(set(recorded) - set(bases)):
        P.append(f"{arch}: manifest has {name} but no spec defines it (removed since regen); {fix}")
    all_deps: set[str] = set()
    for name in sorted(set(bases) & set(recorded)):
        b, k = bases[name], recorded[name]
        inputs = b.resolved.inputs_json()
        try:
            inputs["deps"] = discover.source_deps(root, b.spec.family, b.spec.source)
        except (OSError, SyntaxError) as e:
            P.append(f"{arch}: {name}: cannot scan its source: {e}")
            continue
        all_deps.update(inputs["deps"])
        for key in sorted(set(inputs) | set(k["inputs"])):
            if inputs.get(key) != k["inputs"].get(key):
                P.append(f"{arch}: {name}: spec input {key!r} changed ({k['inputs'].get(key)!r} -> "
                         f"{inputs.get(key)!r}); {fix}")
        if k["params"] != params_of(b.resolved):
            P.append(f"{arch}: {name}: parameter list does not follow its signature; {fix}")
        P.extend(_check_artifact(root, arch, name, k))
        if tracked is not None and k["artifact"]["path"] not in tracked and (root / k["artifact"]["path"]).is_file():
            untracked.append(k["artifact"]["path"])
    missing_src = all_deps - set(doc["sources"])
    for rel in sorted(missing_src):
        P.append(f"{arch}: source {rel} is imported by a kernel but not recorded; {fix}")

    if untracked:
        shown = ", ".join(untracked[:3]) + (f" and {len(untracked) - 3} more" if len(untracked) > 3 else "")
        P.append(f"{arch}: {len(untracked)} file(s) not tracked by git ({shown}); CI clones would miss them: "
                 f"run `git add vendored/{arch} manifests/{arch}.json`")
    # stray files
    vdir = root / "vendored" / arch
    listed = {k["artifact"]["path"] for k in recorded.values()}
    if vdir.is_dir():
        for f in sorted(vdir.rglob("*")):
            rel = f.relative_to(root).as_posix()
            if f.is_file() and rel not in listed:
                P.append(f"{arch}: extra file {rel} is not in the manifest; delete it or {fix}")
    return P


def _check_artifact(root: Path, arch: str, name: str, k: dict[str, Any]) -> list[str]:
    P: list[str] = []
    fix = _regen(arch)
    a = get_arch(arch)
    art = k["artifact"]
    rel = art["path"]
    expected_rel = artifact_relpath(arch, name)
    if rel != expected_rel:
        P.append(f"{arch}: {name}: artifact path {rel} != {expected_rel}; {fix}")
    f = root / rel
    if not f.is_file():
        return P + [f"{arch}: {name}: artifact {rel} is missing; {fix}"]
    data = f.read_bytes()
    if len(data) != art["size"] or sha256_file(f) != art["sha256"]:
        return P + [f"{arch}: {name}: artifact {rel} was modified (sha256/size mismatch); {fix}"]
    try:
        cub = elf.parse(data)
    except elf.CubinError as e:
        return P + [f"{arch}: {name}: {rel} is not a cubin ({e}); {fix}"]
    want_sm = a.cc[0] * 10 + a.cc[1]
    if cub.sm != want_sm:
        P.append(f"{arch}: {name}: {rel} holds SASS for sm_{cub.sm}, not {arch}; {fix}")
    if k["resources"]["sass_arch"] != a.sass_name:
        P.append(f"{arch}: {name}: resources say SASS {k['resources']['sass_arch']}; {fix}")
    L = k["launch"]
    inp = k["inputs"]
    if L["name"] != inp["entry"]:
        P.append(f"{arch}: {name}: launch name {L['name']} != entry {inp['entry']}; {fix}")
    if L["num_warps"] != inp["num_warps"] or L["num_ctas"] != inp["num_ctas"]:
        P.append(f"{arch}: {name}: launch num_warps/num_ctas differ from the spec inputs; {fix}")
    info = cub.kernels.get(L["name"])
    if info is None:
        return P + [f"{arch}: {name}: {rel} has no kernel {L['name']}; {fix}"]
    if info.reqntid is not None and info.reqntid[0] != 32 * L["num_warps"]:
        P.append(f"{arch}: {name}: cubin requires {info.reqntid[0]} threads, launch metadata says "
                 f"{32 * L['num_warps']}; {fix}")
    sizes = [s for _, _, s in info.params]
    want = [p["size"] for p in k["params"]]
    if info.params and sizes != want:
        P.append(f"{arch}: {name}: cubin parameter sizes {sizes} != manifest {want}; {fix}")
    if any(p["code"] != abi.pack_code(p["type"]) for p in k["params"]):
        P.append(f"{arch}: {name}: parameter pack codes inconsistent with types; {fix}")
    R = k["resources"]
    if R["spills"] and not inp["allow_spills"]:
        P.append(f"{arch}: {name}: spills recorded but not allowed by the spec; fix the kernel and {fix}")
    if L["shared"] + R["shared_static"] > a.max_smem_optin:
        P.append(f"{arch}: {name}: shared memory over {arch}'s limit; {fix}")
    return P


def verify(root: Path, archs: list[str] | None = None) -> list[str]:
    archs = archs or list(ALL_ARCHS)
    tracked = git_tracked(root)
    P: list[str] = []
    if not (root / manifest.SCHEMA_PATH).is_file():
        return [f"{manifest.SCHEMA_PATH} is missing; restore it from git"]
    mdir = root / "manifests"
    known = {f"{a}.json" for a in ALL_ARCHS} | {"schema.json"}
    for f in sorted(mdir.glob("*.json")):
        if f.name not in known:
            P.append(f"manifests/{f.name} is not a known arch manifest; delete it")
    vend = root / "vendored"
    if vend.is_dir():
        for d in sorted(vend.iterdir()):
            if d.name not in ALL_ARCHS and not d.name.startswith("."):
                P.append(f"vendored/{d.name} is not a known arch; delete it")
    for arch in archs:
        P.extend(verify_arch(root, arch, tracked))
    return P


def rebuild_compare(root: Path, archs: list[str], jobs: int | None = None) -> list[str]:
    """Regenerate into a fresh copy of the tree (another directory) and compare every byte."""
    from vkc import regen  # noqa: PLC0415 - needs triton

    P: list[str] = []
    with tempfile.TemporaryDirectory(prefix="vkc-rebuild-") as tmp:
        copy = Path(tmp) / "tree"
        for rel in ("aot", "contract", "runtime", "kernels_src"):
            shutil.copytree(root / rel, copy / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        (copy / "manifests").mkdir(parents=True)
        shutil.copy2(root / manifest.SCHEMA_PATH, copy / manifest.SCHEMA_PATH)
        regen.regen(copy, archs, jobs=jobs)
        for arch in archs:
            mine = manifest.manifest_path(root, arch)
            theirs = manifest.manifest_path(copy, arch)
            if not mine.is_file() or mine.read_bytes() != theirs.read_bytes():
                P.append(f"{arch}: rebuilt manifest differs from {mine.relative_to(root)}; {_regen(arch)}")
            new = {p.relative_to(copy).as_posix(): p.read_bytes()
                   for p in (copy / "vendored" / arch).rglob("*") if p.is_file()}
            for rel, data in sorted(new.items()):
                f = root / rel
                if not f.is_file() or f.read_bytes() != data:
                    P.append(f"{arch}: rebuilt {rel} differs from the committed bytes; {_regen(arch)}")
    return P
