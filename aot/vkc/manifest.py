"""Manifest documents: canonical JSON, digest, atomic writes, schema validation (constants: :mod:`vkc_contract.layout`)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from vkc_contract.hashing import sha256_bytes
from vkc_contract.layout import SCHEMA_RELPATH as SCHEMA_PATH
from vkc_contract.layout import SCHEMA_VERSION, manifest_path

__all__ = ["SCHEMA_VERSION", "SCHEMA_PATH", "manifest_path", "canonical", "digest", "seal", "atomic_write", "load",
           "load_schema", "schema_errors"]


def canonical(doc: dict[str, Any]) -> bytes:
    """Sorted keys, 2-space indent, newline at end: the only serialization vkc writes."""
    return (json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=True) + "\n").encode()


def digest(doc: dict[str, Any]) -> str:
    """sha256 over the canonical form of everything but the digest itself (catches hand edits)."""
    body = {k: v for k, v in doc.items() if k != "digest"}
    return sha256_bytes(canonical(body))


def seal(doc: dict[str, Any]) -> dict[str, Any]:
    doc = dict(doc)
    doc["digest"] = digest(doc)
    return doc


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def load_schema(root: Path) -> dict[str, Any]:
    return json.loads((root / SCHEMA_PATH).read_text())


def schema_errors(root: Path, doc: dict[str, Any]) -> list[str]:
    import jsonschema  # noqa: PLC0415 - verify/regen only

    validator = jsonschema.Draft202012Validator(load_schema(root))
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]
