"""The one hash function of vkc: SHA-256 over bytes and files (manifests, verify and the loader)."""
from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class IntegrityError(RuntimeError):
    """An artifact's bytes do not match the hash its manifest records."""
