"""Read-only import of a FlashInfer autotune cache file (``autotune_configs.json``).

The file is a JSON object: ``_metadata`` (FlashInfer, CUDA, cuBLAS, cuDNN, cuDNN-frontend versions and the GPU
name) and one entry per tuned profile, keyed by the ``str()`` of a Python tuple, the value ``[runner, tactic]``.
vkc reads only ``fp4_gemm`` entries of ``CutlassFp4GemmRunner``, whose key is::

    ('fp4_gemm', 'CutlassFp4GemmRunner', ((M, K/2), (N, K/2), (Ma, Ks), (Na, Ks), (1,), (M, N)), ())

the shapes of the packed FP4 activation and weight, their swizzled e4m3 block-scale tensors (``Ma``, ``Na``: M
and N rounded up to 128; ``Ks``: K/16 rounded up to 4), the alpha scalar and the output; the trailing tuple is
the runner's cache-key extras, which must be empty. M, N and K come from these shapes exactly (no heuristic),
every shape is checked against them, and M must be one of vkc's M buckets (:mod:`.keys`).

Keys are parsed by :func:`parse_key`, a small bounded parser (length, depth, item count and integer size
capped; only tuples, non-negative integers, plain quoted strings and ``None``), never by ``eval``.

Rules: entries of other ops or runners are ignored (counted); a malformed FP4 entry (key, shapes, value,
runner mismatch, tactic outside the runner's id range, two keys for one (M, N, K)), malformed JSON, a
duplicate object key or metadata that does not match what the caller expects (``"*"`` on either side
matches anything) rejects the whole import. Tactic ids map to vkc tactics only when vkc's FP4 descriptor
list equals the upstream order (:func:`tactic_map`), otherwise nothing maps. The file is never written.

vkc's NVFP4 W4A4 GEMM (ops.gemm_fp4: two tiles, no tactic list and no plans yet) is not a plan runner, so on
every arch today the import maps to no vkc tactic; the parser and the mapping are tested against a descriptor table (tests/test_plans_flashinfer.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .keys import M_BUCKETS
from .store import PlanFileError, read_text, strict_json

__all__ = ["FlashInferImport", "parse_key", "read", "parse_document", "tactic_map", "FP4_OP", "FP4_RUNNER",
           "META_KEYS", "UPSTREAM_TACTICS"]

FP4_OP = "fp4_gemm"
FP4_RUNNER = "CutlassFp4GemmRunner"
UPSTREAM_TACTICS = 32            # CutlassFp4GemmRunner tactic ids are 0..31
META_KEYS = ("flashinfer_version", "cuda_version", "cublas_version", "cudnn_version", "cudnn_frontend_version",
             "gpu")
MAX_KEY_CHARS = 4096
MAX_DEPTH = 4
MAX_ITEMS = 256
MAX_INT_DIGITS = 12
MAX_STR = 128
MAX_BYTES = 8 << 20
_STR_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-/ ")


class KeyParseError(ValueError):
    pass


def parse_key(s: str):
    """A tuple key string -> nested Python tuples of int / str / None (bounded; KeyParseError otherwise)."""
    if type(s) is not str:
        raise KeyParseError("key is not a string")
    if len(s) > MAX_KEY_CHARS:
        raise KeyParseError(f"key longer than {MAX_KEY_CHARS} characters")
    pos = 0
    items = 0

    def ws():
        nonlocal pos
        while pos < len(s) and s[pos] == " ":
            pos += 1

    def value(depth: int):
        nonlocal pos, items
        items += 1
        if items > MAX_ITEMS:
            raise KeyParseError(f"more than {MAX_ITEMS} items")
        ws()
        if pos >= len(s):
            raise KeyParseError("unexpected end of key")
        c = s[pos]
        if c == "(":
            if depth >= MAX_DEPTH:
                raise KeyParseError(f"tuples nested deeper than {MAX_DEPTH}")
            pos += 1
            out = []
            ws()
            if pos < len(s) and s[pos] == ")":
                pos += 1
                return ()
            while True:
                out.append(value(depth + 1))
                ws()
                if pos >= len(s):
                    raise KeyParseError("unclosed tuple")
                if s[pos] == ",":
                    pos += 1
                    ws()
                    if pos < len(s) and s[pos] == ")":
                        pos += 1
                        return tuple(out)
                    continue
                if s[pos] == ")":
                    pos += 1
                    if len(out) == 1:
                        raise KeyParseError("a one-element tuple needs a trailing comma")
                    return tuple(out)
                raise KeyParseError(f"unexpected {s[pos]!r} at {pos}")
        if c.isdigit():
            start = pos
            while pos < len(s) and s[pos].isdigit():
                pos += 1
            if pos - start > MAX_INT_DIGITS:
                raise KeyParseError("integer too long")
            if pos - start > 1 and s[start] == "0":
                raise KeyParseError("integer with a leading zero")
            return int(s[start:pos])
        if c in "'\"":
            end = s.find(c, pos + 1)
            if end < 0:
                raise KeyParseError("unterminated string")
            body = s[pos + 1:end]
            if len(body) > MAX_STR or not set(body) <= _STR_CHARS:
                raise KeyParseError(f"string {body[:40]!r} has characters or a length a key never has")
            pos = end + 1
            return body
        if s.startswith("None", pos):
            pos += 4
            return None
        raise KeyParseError(f"unexpected {c!r} at {pos}")

    v = value(0)
    ws()
    if pos != len(s):
        raise KeyParseError(f"trailing characters at {pos}")
    return v


def _ceil(a: int, b: int) -> int:
    return -(-a // b) * b


def _is_shape(t, n: int) -> bool:
    return type(t) is tuple and len(t) == n and all(type(x) is int for x in t)


def derive_mnk(shapes) -> tuple[int, int, int]:
    """(M, N, K) of a CutlassFp4GemmRunner profile's input/output shapes (module docstring); ValueError if any
    shape disagrees."""
    if type(shapes) is not tuple or len(shapes) != 6:
        raise ValueError(f"expected 6 shapes (a, b, a_scale, b_scale, alpha, out), got {shapes!r}")
    a, b, asf, bsf, alpha, out = shapes
    if not (_is_shape(a, 2) and _is_shape(b, 2) and _is_shape(asf, 2) and _is_shape(bsf, 2) and _is_shape(alpha, 1)
            and _is_shape(out, 2)):
        raise ValueError(f"shapes {shapes!r} are not (2, 2, 2, 2, 1, 2)-dimensional integer tuples")
    m, kh = a
    n = b[0]
    k = 2 * kh
    if m < 1 or n < 1 or kh < 1 or k % 16:
        raise ValueError(f"M = {m}, N = {n}, K = {k}: need positive M, N and K a multiple of 16")
    ks = _ceil(k // 16, 4)
    want = ((m, kh), (n, kh), (_ceil(m, 128), ks), (_ceil(n, 128), ks), (1,), (m, n))
    if shapes != want:
        raise ValueError(f"shapes {shapes!r} are not those of M = {m}, N = {n}, K = {k}: expected {want!r}")
    if m not in M_BUCKETS:
        raise ValueError(f"M = {m} is not an M bucket ({M_BUCKETS[0]}..{M_BUCKETS[-1]}, powers of two)")
    return m, n, k


def tactic_map(upstream: Sequence[Mapping[str, Any]] | None, local: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Upstream id -> vkc id: the identity when vkc's descriptor list equals the upstream order, else empty."""
    if upstream is None or len(upstream) != len(local) or not local:
        return {}
    if [dict(d) for d in upstream] != [dict(d) for d in local]:
        return {}
    return {i: i for i in range(len(local))}


@dataclass
class FlashInferImport:
    metadata: dict[str, Any]
    entries: dict[tuple[int, int, int], int]          # (M, N, K) -> upstream tactic id, every FP4 entry
    mapped: dict[tuple[int, int, int], int] = field(default_factory=dict)   # -> vkc tactic id, where it maps
    ignored: int = 0                                   # foreign entries (other ops / runners)


def _meta_ok(meta: Mapping[str, Any], expect: Mapping[str, Any]) -> None:
    for k in META_KEYS:
        if k not in meta or type(meta[k]) not in (str, int):
            raise PlanFileError(f"FlashInfer _metadata.{k} is missing or not a string")
    for k, want in expect.items():
        got = meta.get(k)
        if str(got) != str(want) and "*" not in (str(got), str(want)):
            raise PlanFileError(f"FlashInfer _metadata.{k} is {got!r}, this process expects {want!r}")


def _is_fp4_key_text(key: str) -> bool:
    head = key.lstrip("( ")
    return head.startswith((f"'{FP4_OP}'", f'"{FP4_OP}"'))


def parse_document(text: str, expect: Mapping[str, Any], tactic_ids: Mapping[int, int] | None = None) -> FlashInferImport:
    doc = strict_json(text)
    if type(doc) is not dict or type(doc.get("_metadata")) is not dict:
        raise PlanFileError("FlashInfer cache: not an object with a _metadata object")
    _meta_ok(doc["_metadata"], expect)
    imp = FlashInferImport(metadata=dict(doc["_metadata"]), entries={})
    for key, val in doc.items():
        if key == "_metadata":
            continue
        try:
            k = parse_key(key)
        except KeyParseError as e:
            if _is_fp4_key_text(key):
                raise PlanFileError(f"FlashInfer {FP4_OP} key {key[:80]!r}: {e}") from None
            imp.ignored += 1
            continue
        if type(k) is not tuple or len(k) < 2 or k[0] != FP4_OP or k[1] != FP4_RUNNER:
            if type(k) is tuple and k and k[0] == FP4_OP and (len(k) < 2 or type(k[1]) is not str):
                raise PlanFileError(f"FlashInfer {FP4_OP} key {key[:80]!r} names no runner")
            imp.ignored += 1
            continue
        if len(k) != 4:
            raise PlanFileError(f"FlashInfer key {key[:80]!r}: expected (op, runner, shapes, extras)")
        if k[3] != ():
            raise PlanFileError(f"FlashInfer key {key[:80]!r}: cache-key extras {k[3]!r} must be empty")
        try:
            mnk = derive_mnk(k[2])
        except ValueError as e:
            raise PlanFileError(f"FlashInfer key {key[:80]!r}: {e}") from None
        if (type(val) is not list or len(val) != 2 or type(val[0]) is not str or type(val[1]) is not int):
            raise PlanFileError(f"FlashInfer entry {key[:80]!r}: value {val!r} is not [runner, tactic]")
        if val[0] != FP4_RUNNER:
            raise PlanFileError(f"FlashInfer entry {key[:80]!r}: value runner {val[0]!r} != key runner {FP4_RUNNER}")
        if not 0 <= val[1] < UPSTREAM_TACTICS:
            raise PlanFileError(f"FlashInfer entry {key[:80]!r}: tactic {val[1]} outside 0..{UPSTREAM_TACTICS - 1}")
        if mnk in imp.entries:
            raise PlanFileError(f"FlashInfer cache: two entries for M, N, K = {mnk}")
        imp.entries[mnk] = val[1]
        if tactic_ids and val[1] in tactic_ids:
            imp.mapped[mnk] = tactic_ids[val[1]]
    return imp


def read(path: str | Path, expect: Mapping[str, Any], tactic_ids: Mapping[int, int] | None = None) -> FlashInferImport:
    """Import ``path`` (read-only; PlanFileError on any rejection, FileNotFoundError when absent)."""
    return parse_document(read_text(path, MAX_BYTES), expect, tactic_ids)
