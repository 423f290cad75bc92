"""Manifest constants shared by the generator (writes them) and the runtime (reads them).

An *artifact root* holds ``manifests/schema.json``, ``manifests/<arch>.json`` and ``vendored/<arch>/...``;
every path a manifest records is relative to that root, POSIX-style.
"""
from __future__ import annotations

from pathlib import Path

SCHEMA_VERSION = 1
SCHEMA_RELPATH = "manifests/schema.json"
MANIFEST_DIR = "manifests"
VENDORED_DIR = "vendored"


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
