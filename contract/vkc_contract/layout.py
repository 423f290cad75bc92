"""Manifest constants shared by the generator (writes them) and the runtime (reads them).

An *artifact root* holds ``manifests/schema.json``, ``manifests/<arch>.json`` and ``vendored/<arch>/...``;
every path a manifest records is relative to that root, POSIX-style.

Artifact kinds (``ARTIFACT_KINDS``): every artifact entry of a manifest names its ``kind`` and the ``loader``
the runtime needs for it. Device-code kinds (``triton-cubin``) are one file per kernel; host-code kinds
(``cute-so``: a host shared object with C launchers and the cubins embedded) are one file per
(arch, family, host platform) and record that ``host_platform`` (one of ``HOST_PLATFORMS``).
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 1
SCHEMA_RELPATH = "manifests/schema.json"
MANIFEST_DIR = "manifests"
VENDORED_DIR = "vendored"


@dataclass(frozen=True)
class ArtifactKind:
    name: str    # "triton-cubin"
    suffix: str  # file name suffix, ".cubin"
    loader: str  # the runtime loader it needs
    host: bool   # host code: one file per host platform, records host_platform


TRITON_CUBIN = "triton-cubin"
CUTE_SO = "cute-so"
ARTIFACT_KINDS: dict[str, ArtifactKind] = {k.name: k for k in (
    ArtifactKind(TRITON_CUBIN, ".cubin", "triton-cubin", host=False),
    ArtifactKind(CUTE_SO, ".so", "cute-so", host=True),
)}

# Host platforms of host-code artifacts (GB10 DGX Spark, GH200 and GB200 are aarch64 hosts), with the
# ELF e_machine a shared object for that platform carries (all are 64-bit little-endian).
HOST_PLATFORMS: tuple[str, ...] = ("x86_64", "aarch64")
HOST_ELF_MACHINE: dict[str, int] = {"x86_64": 62, "aarch64": 183}  # EM_X86_64, EM_AARCH64
_MACHINE_ALIASES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


def artifact_kind(name: str) -> ArtifactKind:
    try:
        return ARTIFACT_KINDS[name]
    except KeyError:
        raise ValueError(f"unknown artifact kind {name!r}; known: {', '.join(ARTIFACT_KINDS)}") from None


def current_host_platform() -> str | None:
    """This machine's host platform (one of ``HOST_PLATFORMS``), or None for another CPU."""
    return _MACHINE_ALIASES.get(platform.machine().lower())


def manifest_relpath(arch: str) -> str:
    return f"{MANIFEST_DIR}/{arch}.json"


def manifest_path(root: str | Path, arch: str) -> Path:
    return Path(root) / manifest_relpath(arch)


def split_base(base: str) -> tuple[str, str]:
    """``"norm.rmsnorm.b2048.a16"`` -> ``("norm", "rmsnorm.b2048.a16")``: the family, then the name in it."""
    family, sep, name = base.partition(".")
    if not sep or not family or not name:
        raise ValueError(f"kernel base {base!r} is not <family>.<name>")
    return family, name


def artifact_relpath(arch: str, base: str, suffix: str = ".cubin") -> str:
    """Where the artifact of ``base`` lives for ``arch``: ``vendored/<arch>/<family>/<name><suffix>``."""
    family, name = split_base(base)
    return f"{VENDORED_DIR}/{arch}/{family}/{name}{suffix}"


def kind_relpath(kind: str, arch: str, base: str, host_platform: str | None = None) -> str:
    """Where an artifact of ``kind`` for kernel ``base`` lives:

    * device code, one file per kernel: ``vendored/<arch>/<family>/<name><suffix>`` (``.cubin``);
    * host code, one file per family and host platform: ``vendored/<arch>/<family>/<family>.<host><suffix>``.
    """
    k = artifact_kind(kind)
    if not k.host:
        if host_platform is not None:
            raise ValueError(f"{kind} artifacts are device code and have no host platform")
        return artifact_relpath(arch, base, k.suffix)
    if host_platform not in HOST_PLATFORMS:
        raise ValueError(f"{kind} artifacts need a host platform, one of {', '.join(HOST_PLATFORMS)}; "
                         f"got {host_platform!r}")
    family, _ = split_base(base)
    return f"{VENDORED_DIR}/{arch}/{family}/{family}.{host_platform}{k.suffix}"
