"""Where vkc's artifacts live, which arch to use, and what a manifest promises.

An *artifact root* is a directory holding ``manifests/<arch>.json`` (+ ``manifests/schema.json``) and
``vendored/<arch>/...``; artifact paths in a manifest are relative to it.

Root discovery (:func:`find_root`), first hit wins:

1. env ``VKC_ARTIFACT_ROOT`` (must be a directory with a ``manifests/`` folder, else an error);
2. the package's own ``vkc_runtime/artifacts/`` (wheel installs; CMake installs it there);
3. walking up from this file to a directory containing ``manifests/schema.json`` (source tree,
   ``PYTHONPATH=runtime`` and editable installs, whose ``vkc_runtime`` resolves to the source tree).

Arch selection (:func:`select_arch`): env ``VKC_ARCH`` if set (must be a known arch that can run on the
device and have a manifest), else the device's exact arch, else its documented plain fallbacks
(:func:`vkc_contract.arch.candidates_for_cc`); the first candidate whose manifest exists wins.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path, PurePosixPath
from typing import Any

from vkc_contract import abi
from vkc_contract import arch as _arch
from .errors import ArtifactError, MissingKernelError
from vkc_contract.hashing import IntegrityError, sha256_bytes, sha256_file
from vkc_contract.layout import ARTIFACT_KINDS, SCHEMA_VERSION, TRITON_CUBIN, current_host_platform, manifest_path

__all__ = [
    "SCHEMA_VERSION", "find_root", "find_root_info", "manifest_path", "load_manifest", "select_arch",
    "select_arch_info", "ArtifactSet", "repair_hint",
]

_PKG_ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
_lock = threading.Lock()
_manifest_cache: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}


# --------------------------------------------------------------------------------------- root

def find_root_info() -> tuple[Path | None, str | None]:
    """``(root, how)`` with how in ``"env" | "package" | "source-tree"``; ``(None, None)`` if none."""
    env = os.environ.get("VKC_ARTIFACT_ROOT", "").strip()
    if env:
        p = Path(env).expanduser()
        if not (p / "manifests").is_dir():
            raise ArtifactError(f"VKC_ARTIFACT_ROOT={env!r} is not an artifact root (no manifests/ folder in it)")
        return p.resolve(), "env"
    if (_PKG_ARTIFACTS / "manifests").is_dir():
        return _PKG_ARTIFACTS, "package"
    here = Path(__file__).resolve().parent
    for d in (here, *here.parents):
        if (d / "manifests" / "schema.json").is_file():
            return d, "source-tree"
    return None, None


def find_root() -> Path | None:
    """The artifact root (see module doc), or None when there is none."""
    return find_root_info()[0]


def repair_hint(arch: str | None) -> str:
    a = arch or "<arch>"
    return (f"run `vkc regen --arch {a}` in a vkc source tree (then `vkc verify --arch {a}`), or install a vkc "
            f"wheel built with artifacts for {a} (VKC_ARCHES={a} pip wheel .)")


# --------------------------------------------------------------------------------------- manifests

def load_manifest(root: str | Path, arch: str) -> dict[str, Any]:
    """Read and sanity-check ``manifests/<arch>.json`` (cached, re-read when the file changes).

    Raises FileNotFoundError when absent and :class:`ArtifactError` when malformed. Full schema
    validation is ``vkc verify``'s job (jsonschema is not a runtime dependency).
    """
    _arch.get(arch)
    p = manifest_path(root, arch)
    st = p.stat()  # FileNotFoundError propagates
    key = str(p.resolve())
    stamp = (st.st_mtime_ns, st.st_size)
    with _lock:
        hit = _manifest_cache.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{p}: not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ArtifactError(f"{p}: top level must be an object")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ArtifactError(f"{p}: schema_version {doc.get('schema_version')!r}, this runtime reads {SCHEMA_VERSION}; "
                            f"{repair_hint(arch)}")
    if doc.get("arch") != arch:
        raise ArtifactError(f"{p}: manifest is for arch {doc.get('arch')!r}, expected {arch!r}")
    if not isinstance(doc.get("kernels"), dict):
        raise ArtifactError(f"{p}: 'kernels' must be an object")
    with _lock:
        _manifest_cache[key] = (stamp, doc)
    return doc


# --------------------------------------------------------------------------------------- arch selection

def select_arch_info(cc: tuple[int, int] | None, root: str | Path | None) -> tuple[str, str]:
    """``(arch, how)``, how in ``"env" | "exact" | "fallback"``.

    Raises :class:`MissingKernelError` when no usable arch has a manifest under ``root`` and ValueError
    for an invalid ``VKC_ARCH``.
    """
    env = os.environ.get("VKC_ARCH", "").strip()
    if env:
        a = _arch.get(env)  # ValueError naming the known archs
        if cc is not None:
            ok = _arch.candidates_for_cc(tuple(cc))
            if env not in ok:
                why = ("arch-specific ('a') cubins run only on exactly their compute capability"
                       if a.arch_specific else "cubins run only on the same major version with minor >= theirs")
                raise ValueError(f"VKC_ARCH={env} cannot run on this device (cc {cc[0]}.{cc[1]}): {why}; "
                                 f"usable here: {', '.join(ok) or 'none'}")
        if root is None or not manifest_path(root, env).is_file():
            raise MissingKernelError(f"VKC_ARCH={env}: no manifest {env}.json under artifact root {root}; "
                                     f"{repair_hint(env)}", arch=env, repair=repair_hint(env))
        return env, "env"
    if cc is None:
        raise ValueError("no device compute capability given and VKC_ARCH is not set")
    cands = _arch.candidates_for_cc(tuple(cc))
    if not cands:
        raise MissingKernelError(
            f"vkc has no arch for compute capability {cc[0]}.{cc[1]} (supported: {', '.join(_arch.ALL_ARCHS)})",
            arch=None, repair="use a supported GPU")
    if root is not None:
        for i, name in enumerate(cands):
            if manifest_path(root, name).is_file():
                return name, ("exact" if i == 0 and _arch.ARCHS[name].cc == tuple(cc) else "fallback")
    raise MissingKernelError(
        f"no vkc artifacts for this device (cc {cc[0]}.{cc[1]}): none of {', '.join(cands)} has a manifest under "
        f"artifact root {root}; {repair_hint(cands[0])}", arch=cands[0], repair=repair_hint(cands[0]))


def select_arch(cc: tuple[int, int] | None, root: str | Path | None) -> str:
    """The arch whose artifacts to load for a device of compute capability ``cc`` (see module doc)."""
    return select_arch_info(cc, root)[0]


# --------------------------------------------------------------------------------------- artifact set

def _safe_relpath(rel: str, where: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ArtifactError(f"{where}: artifact path {rel!r} must be relative to the artifact root")
    return p


class ArtifactSet:
    """The artifacts of one arch under one root: manifest entries, files, integrity."""

    def __init__(self, root: str | Path, arch: str):
        self.root = Path(root)
        self.arch = arch
        self.manifest = load_manifest(self.root, arch)
        self.kernels: dict[str, dict[str, Any]] = self.manifest["kernels"]

    def __repr__(self) -> str:
        return f"ArtifactSet(root={str(self.root)!r}, arch={self.arch!r}, kernels={len(self.kernels)})"

    def bases(self) -> list[str]:
        return sorted(self.kernels)

    def __contains__(self, base: str) -> bool:
        return base in self.kernels

    def entry(self, base: str) -> dict[str, Any]:
        try:
            return self.kernels[base]
        except KeyError:
            raise MissingKernelError(
                f"kernel {base!r} is not in manifest {self.arch}.json under {self.root}; {repair_hint(self.arch)}",
                arch=self.arch, missing=[base], repair=repair_hint(self.arch)) from None

    def _artifact(self, base: str) -> dict[str, Any]:
        """The entry's artifact for this machine: ``artifact`` (device code), or among ``artifacts`` (host-code
        kinds, one per host platform) the one whose ``host_platform`` is this machine's."""
        entry = self.entry(base)
        if "artifacts" in entry:
            arts = entry["artifacts"] if isinstance(entry["artifacts"], list) else []
            host = current_host_platform()
            art = next((a for a in arts if isinstance(a, dict) and a.get("host_platform") == host), None)
            if art is None:
                have = sorted(str(a.get("host_platform")) for a in arts if isinstance(a, dict))
                raise ArtifactError(f"{self.arch}.json: kernel {base!r} has no artifact for this host platform "
                                    f"({host or 'unknown CPU'}; built for: {', '.join(have) or 'none'})")
        else:
            art = entry.get("artifact")
        if not isinstance(art, dict) or not all(k in art for k in ("path", "sha256", "size")):
            raise ArtifactError(f"{self.arch}.json: kernel {base!r} has no valid 'artifact' (path, sha256, size)")
        if art.get("kind", TRITON_CUBIN) not in ARTIFACT_KINDS:
            raise ArtifactError(f"{self.arch}.json: kernel {base!r} is a {art.get('kind')!r} artifact (loader "
                                f"{art.get('loader')!r}); this runtime knows {', '.join(ARTIFACT_KINDS)}")
        return art

    def artifact(self, base: str) -> dict[str, Any]:
        """The manifest's artifact record of ``base`` for this machine (kind, loader, path, sha256, size, ...)."""
        return dict(self._artifact(base))

    def path(self, base: str) -> Path:
        rel = _safe_relpath(self._artifact(base)["path"], f"{self.arch}.json:{base}")
        return self.root.joinpath(*rel.parts)

    def check_complete(self, required) -> list[str]:
        """Problems for the ``required`` bases: not in the manifest, file missing, size mismatch.

        Cheap (stat only); hashes are checked when a kernel is loaded (:meth:`read_verified`).
        """
        problems: list[str] = []
        for base in sorted(set(required)):
            if base not in self.kernels:
                problems.append(f"{base}: not in manifest {self.arch}.json")
                continue
            try:
                art = self._artifact(base)
                p = self.path(base)
            except ArtifactError as e:
                problems.append(f"{base}: {e}")
                continue
            try:
                size = p.stat().st_size
            except OSError:
                problems.append(f"{base}: file missing: {p}")
                continue
            if size != art["size"]:
                problems.append(f"{base}: size mismatch: {p} is {size} bytes, manifest says {art['size']}")
        return problems

    def check_hashes(self, bases=None) -> list[str]:
        """sha256 of every (or the given) artifact vs the manifest (slow path for ``doctor --deep``)."""
        problems = []
        for base in sorted(self.kernels if bases is None else bases):
            try:
                art = self._artifact(base)
                actual = sha256_file(self.path(base))
            except (OSError, ArtifactError, MissingKernelError) as e:
                problems.append(f"{base}: {e}")
                continue
            if actual != art["sha256"]:
                problems.append(f"{base}: sha256 mismatch: manifest {art['sha256']}, file {actual}")
        return problems

    def read_verified(self, base: str) -> bytes:
        """The artifact's bytes, after checking size and sha256 against the manifest.

        Raises :class:`IntegrityError` naming the file, the expected and the actual hash.
        """
        art = self._artifact(base)
        p = self.path(base)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise MissingKernelError(f"artifact of {base!r} is missing: {p}; {repair_hint(self.arch)}",
                                     arch=self.arch, missing=[base], repair=repair_hint(self.arch)) from None
        actual = sha256_bytes(data)
        if actual != art["sha256"] or len(data) != art["size"]:
            raise IntegrityError(
                f"artifact {p} (kernel {base}, arch {self.arch}) does not match its manifest: "
                f"expected sha256 {art['sha256']} ({art['size']} bytes), actual {actual} ({len(data)} bytes); "
                f"refusing to load it. {repair_hint(self.arch)}")
        return data

    def launch_spec(self, base: str) -> "LaunchSpec":
        return LaunchSpec.from_entry(base, self.entry(base), self.arch)


# --------------------------------------------------------------------------------------- launch spec

class LaunchSpec:
    """The launch-relevant part of a manifest entry, validated against :mod:`vkc_contract.abi`."""

    __slots__ = ("base", "arch", "name", "num_warps", "num_ctas", "shared", "global_scratch_size",
                 "global_scratch_align", "profile_scratch_size", "profile_scratch_align", "launch_pdl",
                 "launch_cooperative_grid", "tmem_size", "params", "visible", "hidden", "codes", "names",
                 "divisibility")

    @classmethod
    def from_entry(cls, base: str, entry: dict[str, Any], arch: str = "?") -> "LaunchSpec":
        where = f"{arch}.json:{base}"
        self = cls()
        self.base, self.arch = base, arch
        la = entry.get("launch")
        if not isinstance(la, dict):
            raise ArtifactError(f"{where}: missing 'launch'")
        try:
            self.name = str(la["name"])
            self.num_warps = int(la["num_warps"])
            self.num_ctas = int(la.get("num_ctas", 1))
            self.shared = int(la.get("shared", 0))
            self.global_scratch_size = int(la.get("global_scratch_size", 0))
            self.global_scratch_align = max(1, int(la.get("global_scratch_align", 1)))
            self.profile_scratch_size = int(la.get("profile_scratch_size", 0))
            self.profile_scratch_align = max(1, int(la.get("profile_scratch_align", 1)))
            self.launch_pdl = bool(la.get("launch_pdl", False))
            self.launch_cooperative_grid = bool(la.get("launch_cooperative_grid", False))
            self.tmem_size = int(la.get("tmem_size", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise ArtifactError(f"{where}: bad 'launch' record: {e!r}") from None
        if not (1 <= self.num_warps <= 32) or self.num_ctas < 1 or self.shared < 0:
            raise ArtifactError(f"{where}: implausible launch record num_warps={self.num_warps} "
                                f"num_ctas={self.num_ctas} shared={self.shared}")
        params = entry.get("params")
        if not isinstance(params, list):
            raise ArtifactError(f"{where}: missing 'params'")
        visible, hidden = [], []
        for i, p in enumerate(params):
            try:
                name, ty, code, size = p["name"], p["type"], p["code"], int(p["size"])
            except (KeyError, TypeError, ValueError):
                raise ArtifactError(f"{where}: param #{i} needs name/type/code/size: {p!r}") from None
            try:
                want = abi.pack_code(ty)
            except ValueError as e:
                raise ArtifactError(f"{where}: param {name!r}: {e}") from None
            if code != want or size != abi.PACK_SIZES[code]:
                raise ArtifactError(f"{where}: param {name!r} type {ty} must have code {want!r} size "
                                    f"{abi.PACK_SIZES[want]}, manifest says {code!r}/{size}")
            div = p.get("divisibility")
            if div not in (None, 0, 1, abi.DIVISIBILITY):
                raise ArtifactError(f"{where}: param {name!r}: divisibility {div!r} unsupported")
            if p.get("hidden"):
                if code != abi.POINTER_CODE:
                    raise ArtifactError(f"{where}: hidden param {name!r} must be a pointer")
                hidden.append(dict(p))
            else:
                if hidden:
                    raise ArtifactError(f"{where}: visible param {name!r} after hidden params")
                visible.append(dict(p))
        if tuple(h["name"] for h in hidden) != abi.HIDDEN_PARAMS:
            raise ArtifactError(f"{where}: hidden params {[h['name'] for h in hidden]} != {list(abi.HIDDEN_PARAMS)}")
        self.params = visible + hidden
        self.visible = visible
        self.hidden = hidden
        self.codes = "".join(p["code"] for p in self.params)
        self.names = [p["name"] for p in self.params]
        self.divisibility = [int(p.get("divisibility") or 0) if p.get("divisibility") == abi.DIVISIBILITY else 0
                             for p in self.params]
        return self

    @property
    def block_x(self) -> int:
        return 32 * self.num_warps

    @property
    def n_visible(self) -> int:
        return len(self.visible)
