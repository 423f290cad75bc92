"""`vkc regen`: compile every spec for the requested archs in parallel worker processes, check resources,
write ``vendored/<arch>/`` and ``manifests/<arch>.json`` atomically and deterministically."""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vkc_contract.arch import ALL_ARCHS
from vkc_contract.arch import get as get_arch
from vkc_contract.hashing import sha256_bytes, sha256_file
from vkc_contract.layout import ARTIFACT_KINDS, TRITON_CUBIN, kind_relpath
from vkc_contract.tactics import manifest_block as tactics_block

from vkc import cute_lane, discover, manifest, toolchain
from vkc.spec import ResolvedSpec


class RegenError(RuntimeError):
    pass


@dataclass
class TaskResult:
    arch: str
    base: str
    cubin: bytes
    launch: dict[str, Any]
    params: list[dict[str, Any]]
    resources: dict[str, Any]


# ---------------------------------------------------------------- worker side (spawned processes)

def _worker_init(cache_dir: str) -> None:
    from vkc.compile import worker_env  # noqa: PLC0415

    env = worker_env()
    os.environ.clear()
    os.environ.update(env)
    os.environ["TRITON_CACHE_DIR"] = cache_dir


_RES_RE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def cuobjdump_resources(cubin_path: Path, entry: str) -> dict[str, Any]:
    tool = toolchain.triton_bin_dir() / "cuobjdump"
    elf = subprocess.run([str(tool), "--list-elf", str(cubin_path)], capture_output=True, text=True, check=True)
    m = re.search(r"\.(sm_\d+a?)\.cubin", elf.stdout)
    if not m:
        raise RegenError(f"cuobjdump --list-elf printed no SASS arch for {cubin_path}: {elf.stdout!r}")
    res = subprocess.run([str(tool), "-res-usage", str(cubin_path)], capture_output=True, text=True, check=True)
    block = res.stdout.split(f"Function {entry}:", 1)
    r = _RES_RE.search(block[1] if len(block) == 2 else "")
    if not r:
        raise RegenError(f"cuobjdump -res-usage has no line for {entry} in {cubin_path}: {res.stdout!r}")
    reg, stack, shared, local = (int(x) for x in r.groups())
    return {"sass_arch": m.group(1), "registers": reg, "stack": stack, "shared_static": shared, "local": local,
            "spills": bool(stack or local)}


def _compile_task(root: str, rs: ResolvedSpec) -> TaskResult:
    from vkc.compile import compile_base  # noqa: PLC0415

    c = compile_base(Path(root), rs)
    with tempfile.TemporaryDirectory(prefix="vkc-res-") as d:
        p = Path(d) / "k.cubin"
        p.write_bytes(c.cubin)
        resources = cuobjdump_resources(p, c.launch["name"])
    return TaskResult(rs.arch, rs.spec.base, c.cubin, c.launch, c.params, resources)


# ---------------------------------------------------------------- parent side

def check_generator(root: Path) -> None:
    """The running vkc must be the checkout's own generator (its hash goes into the manifest)."""
    for rel in discover.GENERATOR_FILES:
        running = discover.running_generator_file(rel)
        if sha256_file(running) != sha256_file(root / rel):
            raise RegenError(f"the running {running} differs from {root / rel}; "
                             f"install the checkout in editable mode (pip install -e .)")


def check_resources(arch: str, base: str, r: TaskResult, allow_spills: bool) -> list[str]:
    a = get_arch(arch)
    problems = []
    if r.resources["sass_arch"] != a.sass_name:
        problems.append(f"{base}: SASS arch {r.resources['sass_arch']} != {a.sass_name}")
    if r.resources["spills"] and not allow_spills:
        problems.append(f"{base}: spills (stack {r.resources['stack']} B, local {r.resources['local']} B) "
                        f"and the spec does not allow them")
    smem = r.launch["shared"] + r.resources["shared_static"]
    if smem > a.max_smem_optin:
        problems.append(f"{base}: shared memory {smem} B exceeds {arch}'s {a.max_smem_optin} B")
    return problems


def build_manifest(root: Path, arch: str, bases: list[discover.Base], results: dict[str, TaskResult],
                   ptxas: dict[str, str], cute: cute_lane.CuteBuild | None = None) -> dict[str, Any]:
    a = get_arch(arch)
    cute = cute or cute_lane.CuteBuild()
    kernels: dict[str, Any] = dict(cute.kernels)
    all_deps: set[str] = {d for k in cute.kernels.values() for d in k["inputs"]["deps"]}
    for b in bases:
        r = results[b.spec.base]
        deps = discover.source_deps(root, b.spec.family, b.spec.source)
        all_deps.update(deps)
        inputs = b.resolved.inputs_json()
        inputs["deps"] = deps
        kernels[b.spec.base] = {
            "inputs": inputs,
            "artifact": {"kind": TRITON_CUBIN, "loader": ARTIFACT_KINDS[TRITON_CUBIN].loader,
                         "path": kind_relpath(TRITON_CUBIN, arch, b.spec.base), "sha256": sha256_bytes(r.cubin),
                         "size": len(r.cubin)},
            "launch": r.launch,
            "params": r.params,
            "resources": r.resources,
        }
    doc = {
        "schema_version": manifest.SCHEMA_VERSION,
        "arch": arch,
        "target": {"backend": "cuda", "cc": a.triton_cc, "warp_size": 32},
        "toolchain": {
            "triton": toolchain.TRITON_VERSION,
            "ptxas": {"name": toolchain.ptxas_name_for(a.triton_cc), **ptxas},
            "python": toolchain.python_version(),
            "line_info": toolchain.LINE_INFO,
            "generator_sha256": discover.generator_hash(root),
            "cutlass_dsl": cute.toolchain,
        },
        "sources": discover.hash_sources(root, sorted(all_deps)),
        "kernels": kernels,
        "tactics": tactics_block(kernels),  # the GEMM tactic set (vkc_contract.tactics; the runtime's plans check it)
    }
    return manifest.seal(doc)


def install_arch(root: Path, arch: str, results: dict[str, TaskResult], doc: dict[str, Any],
                 host_files: dict[str, bytes] | None = None) -> None:
    """Swap in the new vendored/<arch>/ tree, then write the manifest (atomic rename each). ``host_files``: the
    CuTe lane's shared objects by path."""
    vend = root / "vendored"
    vend.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{arch}.staging-", dir=vend))
    files = {e["artifact"]["path"]: results[b].cubin for b, e in doc["kernels"].items() if "artifact" in e}
    files.update(host_files or {})
    try:
        for path, data in sorted(files.items()):
            dst = staging / Path(path).relative_to(f"vendored/{arch}")
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
            os.chmod(dst, 0o644)
        for d in sorted(p for p in staging.rglob("*") if p.is_dir()):
            os.chmod(d, 0o755)
        os.chmod(staging, 0o755)
        final = vend / arch
        old = None
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{arch}.old-", dir=vend))
            os.rmdir(old)
            os.replace(final, old)
        os.replace(staging, final)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    manifest.atomic_write(manifest.manifest_path(root, arch), manifest.canonical(doc))


def regen(root: Path, archs: list[str], jobs: int | None = None,
          progress: Callable[[str, int, int], None] | None = None,
          cute_python: str | None = None) -> dict[str, dict[str, Any]]:
    """Compile and install ``archs``; ``cute_python``: the CuTe DSL interpreter (default:
    :func:`vkc.cute_lane.dsl_python`)."""
    problems = toolchain.check_installed()
    if problems:
        raise RegenError("toolchain differs from the pins:\n  " + "\n  ".join(problems))
    check_generator(root)
    for arch in archs:
        get_arch(arch)
    plan = {arch: discover.bases_for_arch(root, arch) for arch in archs}
    cute_plan = {arch: discover.cute_specs_for_arch(root, arch) for arch in archs}
    if any(cute_plan.values()):
        try:  # fail before the Triton compiles when the DSL is missing
            cute_python = cute_python or cute_lane.dsl_python(root)
        except cute_lane.CuteLaneError as e:
            raise RegenError(f"{', '.join(a for a in archs if cute_plan[a])}: {e}") from None
    ptxas = {arch: toolchain.probe_ptxas(toolchain.ptxas_name_for(get_arch(arch).triton_cc)) for arch in archs}
    tasks = [(arch, b) for arch in archs for b in plan[arch]]
    results: dict[str, dict[str, TaskResult]] = {arch: {} for arch in archs}
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks) or 1))
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="vkc-triton-cache-") as cache:
        ctx = mp.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init,
                                 initargs=(cache,)) as pool:
            futs = {pool.submit(_compile_task, str(root), b.resolved): (arch, b) for arch, b in tasks}
            done = 0
            for fut in as_completed(futs):
                arch, b = futs[fut]
                done += 1
                try:
                    r = fut.result()
                except Exception as e:  # report every failing base, not just the first
                    errors.append(f"{arch} {b.spec.base}: {type(e).__name__}: {e}")
                    continue
                errors.extend(f"{arch} {p}" for p in check_resources(arch, b.spec.base, r, b.resolved.allow_spills))
                results[arch][b.spec.base] = r
                if progress:
                    progress(f"{arch} {b.spec.base}", done, len(tasks))
    cute: dict[str, cute_lane.CuteBuild] = {}
    if not errors:  # the CuTe lane: one DSL process per (arch, host platform), after the Triton pool
        for arch in archs:
            if not cute_plan[arch]:
                continue
            try:
                deps = {s.base: discover.source_deps(root, s.family, s.source) for s in cute_plan[arch]}
                cute[arch] = cute_lane.build_arch(root, arch, cute_plan[arch], deps, cute_python)
            except cute_lane.CuteLaneError as e:
                errors.append(f"{arch} CuTe lane: {e}")
                continue
            if progress:
                progress(f"{arch} CuTe: {len(cute_plan[arch])} kernels, {len(cute[arch].files)} shared objects",
                         len(tasks), len(tasks))
    if errors:
        raise RegenError("regen failed; nothing was written:\n  " + "\n  ".join(sorted(errors)))
    docs = {}
    for arch in archs:
        doc = build_manifest(root, arch, plan[arch], results[arch], ptxas[arch], cute.get(arch))
        errs = manifest.schema_errors(root, doc)
        if errs:
            raise RegenError(f"{arch}: generated manifest violates the schema:\n  " + "\n  ".join(errs))
        install_arch(root, arch, results[arch], doc, cute[arch].files if arch in cute else None)
        docs[arch] = doc
    return docs


def parse_archs(arch: tuple[str, ...], all_: bool) -> list[str]:
    if all_:
        return list(ALL_ARCHS)
    out = []
    for a in arch:
        for part in a.split(","):
            part = part.strip()
            if part:
                get_arch(part)
                out.append(part)
    return out
