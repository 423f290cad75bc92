"""Find the repository, the kernel families and their specs, and the source files each kernel depends
on — all without importing Triton (spec modules import only :mod:`vkc.spec`; kernel sources are read
with :mod:`ast`, never executed here)."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from vkc import cute_spec
from vkc.spec import KernelSpec, SpecError, with_family
from vkc_contract.hashing import sha256_file

KERNELS_DIR = "kernels_src"
SPEC_FILE = "spec.py"
TUNING_DIR = "tuning"  # kernels_src/<family>/tuning/<arch>.json: {"<spec name>": {overrides}}


def find_root(start: str | os.PathLike | None = None) -> Path:
    """The repository root: env VKC_ROOT, else the first parent of ``start`` (cwd) holding
    ``kernels_src/`` and ``manifests/``, else the checkout this package lives in."""
    env = os.environ.get("VKC_ROOT")
    if env:
        return Path(env).resolve()
    here = Path(start or os.getcwd()).resolve()
    for p in (here, *here.parents):
        if (p / KERNELS_DIR).is_dir() and (p / "manifests").is_dir():
            return p
    pkg_root = Path(__file__).resolve().parents[2]
    if (pkg_root / KERNELS_DIR).is_dir():
        return pkg_root
    raise FileNotFoundError("no vkc repository (kernels_src/ + manifests/) found; run inside a checkout or set VKC_ROOT")


def families(root: Path) -> list[str]:
    kdir = root / KERNELS_DIR
    return sorted(p.name for p in kdir.iterdir() if (p / SPEC_FILE).is_file())


def _spec_module(root: Path, family: str):
    path = root / KERNELS_DIR / family / SPEC_FILE
    mod_name = f"_vkc_spec_{family}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, mod


def load_specs(root: Path, family: str) -> list[KernelSpec]:
    path, mod = _spec_module(root, family)
    specs = getattr(mod, "SPECS", None)
    if not isinstance(specs, (list, tuple)):
        raise SpecError(f"{path}: must define SPECS = [KernelSpec(...), ...]")
    out = []
    names = set()
    for s in specs:
        if not isinstance(s, KernelSpec):
            raise SpecError(f"{path}: SPECS holds a {type(s).__name__}, not a KernelSpec")
        s = with_family(s, family)
        s.validate()
        if s.name in names:
            raise SpecError(f"{path}: spec name {s.name!r} appears twice")
        if not (root / KERNELS_DIR / family / s.source).is_file():
            raise SpecError(f"spec {s.base}: source {s.source} not found in {KERNELS_DIR}/{family}/")
        names.add(s.name)
        out.append(s)
    return out


def load_cute_specs(root: Path, family: str) -> list[cute_spec.CuteKernelSpec]:
    """The family's ``CUTE_SPECS`` (none when spec.py defines no such list)."""
    path, mod = _spec_module(root, family)
    specs = getattr(mod, "CUTE_SPECS", [])
    if not isinstance(specs, (list, tuple)):
        raise SpecError(f"{path}: CUTE_SPECS must be a list of CuteKernelSpec")
    out, names = [], set()
    triton_names = {s.name for s in load_specs(root, family)}
    for s in specs:
        if not isinstance(s, cute_spec.CuteKernelSpec):
            raise SpecError(f"{path}: CUTE_SPECS holds a {type(s).__name__}, not a CuteKernelSpec")
        s = cute_spec.with_family(s, family)
        s.validate()
        if s.name in names or s.name in triton_names:
            raise SpecError(f"{path}: spec name {s.name!r} appears twice")
        if not (root / KERNELS_DIR / family / s.source).is_file():
            raise SpecError(f"CuTe spec {s.base}: source {s.source} not found in {KERNELS_DIR}/{family}/")
        names.add(s.name)
        out.append(s)
    return out


def cute_specs_for_arch(root: Path, arch: str) -> list[cute_spec.CuteKernelSpec]:
    return [s for fam in families(root) for s in load_cute_specs(root, fam) if arch in s.archs]


def load_tuning(root: Path, family: str, arch: str) -> dict[str, dict[str, Any]]:
    path = root / KERNELS_DIR / family / TUNING_DIR / f"{arch}.json"
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected an object mapping spec names to overrides")
    return data


@dataclass(frozen=True)
class Base:
    """One spec resolved for one arch, ready to compile."""
    spec: KernelSpec
    arch: str
    resolved: Any  # vkc.spec.ResolvedSpec


def bases_for_arch(root: Path, arch: str) -> list[Base]:
    out = []
    for fam in families(root):
        tuning = load_tuning(root, fam, arch)
        specs = load_specs(root, fam)
        unknown = set(tuning) - {s.name for s in specs}
        if unknown:
            raise SpecError(f"{KERNELS_DIR}/{fam}/{TUNING_DIR}/{arch}.json tunes unknown specs {sorted(unknown)}")
        for s in specs:
            if arch in s.archs:
                out.append(Base(s, arch, s.for_arch(arch, tuning.get(s.name))))
    return out


def _module_file(root: Path, dotted: str) -> Path | None:
    parts = dotted.split(".")
    if not parts or parts[0] != KERNELS_DIR:
        return None
    p = root.joinpath(*parts)
    if p.with_suffix(".py").is_file():
        return p.with_suffix(".py")
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return None


@lru_cache(maxsize=None)
def _imports_of(path: Path, root: Path) -> tuple[Path, ...]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel_pkg = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found: list[Path] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = rel_pkg.split(".")
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for n in names:
            f = _module_file(root, n)
            if f is not None and f not in found:
                found.append(f)
    return tuple(found)


def source_deps(root: Path, family: str, source: str) -> list[str]:
    """The kernel source plus every kernels_src module it imports, transitively (repo-relative paths)."""
    start = (root / KERNELS_DIR / family / source).resolve()
    seen: list[Path] = []
    stack = [start]
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.append(p)
        stack.extend(_imports_of(p, root.resolve()))
    # package __init__ files are imported too when the kernel module is imported by its dotted name
    pkg_inits = []
    for p in seen:
        d = p.parent
        while d != root.resolve() and d.is_relative_to(root.resolve()):
            init = d / "__init__.py"
            if init.is_file() and init not in seen and init not in pkg_inits:
                pkg_inits.append(init)
            d = d.parent
    return sorted(p.relative_to(root.resolve()).as_posix() for p in seen + pkg_inits)


def hash_sources(root: Path, paths: list[str]) -> dict[str, str]:
    return {p: sha256_file(root / p) for p in sorted(paths)}


GENERATOR_FILES = (
    # everything whose change can change an artifact or a manifest byte
    "aot/vkc/spec.py", "aot/vkc/discover.py", "aot/vkc/compile.py", "aot/vkc/manifest.py",
    "aot/vkc/regen.py", "aot/vkc/toolchain.py", "aot/vkc/elf.py",
    "aot/vkc/cute_spec.py", "aot/vkc/cute_dsl.py", "aot/vkc/cute_glue.py", "aot/vkc/cute_lane.py",
    "aot/vkc/hostelf.py",
    "contract/vkc_contract/abi.py", "contract/vkc_contract/arch.py", "contract/vkc_contract/layout.py",
    "contract/vkc_contract/tactics.py",
)


def running_generator_file(rel: str) -> Path:
    """Where the running (imported) vkc / vkc_contract keeps the generator file ``rel`` of the checkout layout."""
    import vkc_contract  # noqa: PLC0415

    pkgs = {"aot/vkc/": Path(__file__).resolve().parent, "contract/vkc_contract/": Path(vkc_contract.__file__).parent}
    for prefix, pkg in pkgs.items():
        if rel.startswith(prefix):
            return pkg / rel[len(prefix):]
    raise ValueError(f"{rel} is not a generator file")


def generator_hash(root: Path | None) -> str:
    """Hash of the generator files of the checkout ``root``, or of the running packages when ``root`` is None
    (an installed wheel: its vkc / vkc_contract files are the checkout's, copied verbatim)."""
    import hashlib

    h = hashlib.sha256()
    for rel in GENERATOR_FILES:
        f = root / rel if root is not None else running_generator_file(rel)
        h.update(rel.encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest()


INSTALLED_ARTIFACTS = "artifacts"  # vkc_runtime/artifacts/ in a wheel install (CMakeLists.txt installs it)


def installed_artifact_root() -> Path | None:
    """The installed wheel's artifact root (``vkc_runtime/artifacts/``), located without importing vkc_runtime."""
    import importlib.util  # noqa: PLC0415

    try:
        spec = importlib.util.find_spec("vkc_runtime")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        d = Path(loc) / INSTALLED_ARTIFACTS
        if (d / "manifests").is_dir():
            return d
    return None


def find_artifact_root(start: str | os.PathLike | None = None) -> tuple[Path, str]:
    """``(root, mode)`` for `vkc verify` / `vkc inspect`; mode ``"checkout"`` (a source tree: kernels_src/ +
    manifests/) or ``"installed"`` (an artifact root: manifests/ + vendored/, no sources).

    ``start`` (``--root``) or env VKC_ROOT names the directory outright; otherwise a checkout found from the
    cwd or around this package, else env VKC_ARTIFACT_ROOT, else the installed wheel's artifacts."""
    explicit = start if start is not None else os.environ.get("VKC_ROOT")
    if explicit:
        p = Path(explicit).resolve()
        if (p / KERNELS_DIR).is_dir() and (p / "manifests").is_dir():
            return p, "checkout"
        if (p / "manifests").is_dir():
            return p, "installed"
        raise FileNotFoundError(f"{p} is neither a vkc checkout (kernels_src/ + manifests/) nor an artifact root "
                                f"(manifests/)")
    try:
        return find_root(), "checkout"
    except FileNotFoundError:
        pass
    env = os.environ.get("VKC_ARTIFACT_ROOT", "").strip()
    if env:
        p = Path(env).expanduser().resolve()
        if not (p / "manifests").is_dir():
            raise FileNotFoundError(f"VKC_ARTIFACT_ROOT={env!r} is not an artifact root (no manifests/ folder in it)")
        return p, "installed"
    inst = installed_artifact_root()
    if inst is not None:
        return inst, "installed"
    raise FileNotFoundError("no vkc checkout (kernels_src/ + manifests/) and no installed vkc artifacts found; run "
                            "inside a checkout, pass --root, or install a vkc wheel built with artifacts")
