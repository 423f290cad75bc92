"""The native plan file: schema, compatibility metadata, strict loading, sorted output, merge and atomic publish.

A file is JSON ``{"_metadata": {...}, "plans": [...]}``. ``_metadata`` is mandatory and must equal the running
process's (:func:`metadata`) in every field of :data:`META_FIELDS`; each plan is the complete executable
identity of one key (runner, dtype, layout, N, K, M bucket, arch, output dtype, scale layout, tactic-set
version) and the tactic it selects (id and the base that id launches). Unknown extra fields are ignored.
Anything else (malformed JSON, NaN, a duplicate object key, a schema violation, a mismatched metadata field,
a duplicate or conflicting plan key, an unknown runner or tactic, a file that is not a regular file or is
over :data:`MAX_BYTES`) rejects the whole file: nothing of it is used (:class:`PlanFileError`).

Writes (:func:`publish`) go to a same-directory temporary file (named with the writer's pid), fsync, atomic
rename, fsync of the directory, under an advisory lock on ``<file>.lock`` that also covers the re-read and
merge: the destination is the old complete file or the new complete one. A temporary file whose writer
died (killed between write and rename) is removed by the next publish.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .keys import BUCKET_VERSION, M_BUCKETS, PlanKey
from . import tactics as T

__all__ = ["FORMAT", "META_FIELDS", "PlanFileError", "metadata", "fingerprint", "default_path", "parse",
           "load", "dumps", "merge", "publish", "entry", "entry_key", "SCHEMA"]

FORMAT = "vkc_gemm_plans_v1"
MAX_BYTES = 16 << 20
META_FIELDS = ("format", "cuda_driver", "cuda_runtime", "kernel_set", "device_name", "sm", "cc", "sm_count",
               "out_dtype", "scale_layout", "tactic_set", "timing", "bucket_version")

_STR = {"type": "string", "minLength": 1, "maxLength": 256}
_INT = {"type": "integer", "minimum": 0}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["_metadata", "plans"],
    "properties": {
        "_metadata": {
            "type": "object", "required": list(META_FIELDS),
            "properties": {
                "format": {"const": FORMAT}, "cuda_driver": _INT, "cuda_runtime": _STR,
                "kernel_set": {"type": "string", "pattern": "^[0-9a-f]{64}$"}, "device_name": _STR,
                "sm": {"type": "string", "pattern": "^sm_[0-9]+a?$"}, "cc": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+$"},
                "sm_count": {"type": "integer", "minimum": 1}, "out_dtype": _STR, "scale_layout": _STR,
                "tactic_set": {"type": "object", "required": ["version", "count", "digest"],
                               "properties": {"version": {"type": "integer", "minimum": 1}, "count": _INT,
                                              "digest": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}},
                "timing": {"type": "object", "required": ["warmups", "repeats", "delay_us"],
                           "properties": {"warmups": _INT, "repeats": {"type": "integer", "minimum": 1},
                                          "delay_us": _INT}},
                "bucket_version": _STR,
            },
        },
        "plans": {
            "type": "array", "maxItems": 100000,
            "items": {
                "type": "object",
                "required": ["runner", "dtype", "layout", "n", "k", "m_bucket", "sm", "out_dtype", "scale_layout",
                             "tactic_set_version", "tactic", "base"],
                "properties": {
                    "runner": _STR, "dtype": _STR, "layout": _STR,
                    "n": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                    "k": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                    "m_bucket": {"enum": list(M_BUCKETS)}, "sm": _STR, "out_dtype": _STR, "scale_layout": _STR,
                    "tactic_set_version": {"type": "integer", "minimum": 1}, "tactic": _INT, "base": _STR,
                },
            },
        },
    },
}


class PlanFileError(ValueError):
    """A plan file was rejected as a whole (the message says why)."""


def metadata(*, arch: str, device_name: str, cc: tuple[int, int], sm_count: int, cuda_driver: int,
             cuda_runtime: str, kernel_set: str, delay_us: int, warmups: int = 3, repeats: int = 10,
             out_dtype: str = "bf16", scale_layout: str = "none") -> dict[str, Any]:
    """The compatibility metadata of this process (every field must match for a file to load)."""
    return {"format": FORMAT, "cuda_driver": int(cuda_driver), "cuda_runtime": str(cuda_runtime),
            "kernel_set": kernel_set, "device_name": str(device_name), "sm": arch, "cc": f"{cc[0]}.{cc[1]}",
            "sm_count": int(sm_count), "out_dtype": out_dtype, "scale_layout": scale_layout,
            "tactic_set": T.tactic_set(arch),
            "timing": {"warmups": warmups, "repeats": repeats, "delay_us": int(delay_us)},
            "bucket_version": BUCKET_VERSION}


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(meta: Mapping[str, Any]) -> str:
    """16 hex digits of sha256 over the canonical mandatory metadata: the file's namespace and start-report id."""
    return hashlib.sha256(_canon({k: meta[k] for k in META_FIELDS}).encode()).hexdigest()[:16]


def default_path(root: Path, meta: Mapping[str, Any]) -> Path:
    return root / "vkc" / "gemm_plans" / FORMAT / meta["sm"] / fingerprint(meta) / "plans.json"


def entry(arch: str, key: PlanKey, tactic_id: int, *, out_dtype: str = "bf16", scale_layout: str = "none"):
    t = T.by_id(arch, tactic_id)
    return {"runner": key.runner, "dtype": key.dtype, "layout": key.layout, "n": key.n, "k": key.k,
            "m_bucket": key.m_bucket, "sm": arch, "out_dtype": out_dtype, "scale_layout": scale_layout,
            "tactic_set_version": T.TACTIC_SET_VERSION, "tactic": t.id, "base": t.base}


def entry_key(e: Mapping[str, Any]) -> PlanKey:
    return PlanKey(e["runner"], e["dtype"], e["layout"], e["n"], e["k"], e["m_bucket"])


def _no_dupes(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise PlanFileError(f"duplicate JSON object key {k!r}")
        d[k] = v
    return d


def _no_constant(name):
    raise PlanFileError(f"non-finite number {name} in JSON")


def strict_json(text: str) -> Any:
    """json.loads that rejects duplicate object keys and NaN/Infinity (PlanFileError)."""
    try:
        return json.loads(text, object_pairs_hook=_no_dupes, parse_constant=_no_constant)
    except PlanFileError:
        raise
    except (ValueError, RecursionError) as e:
        raise PlanFileError(f"malformed JSON: {e}") from None


def _schema_errors(doc: Any, schema: Mapping[str, Any]) -> list[str]:
    import jsonschema  # noqa: PLC0415 - only when a file is read

    v = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in sorted(v.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def parse(text: str, expect: Mapping[str, Any]) -> dict[PlanKey, dict[str, Any]]:
    """Validate a native document against the expected metadata; its plans by key (or PlanFileError)."""
    doc = strict_json(text)
    errs = _schema_errors(doc, SCHEMA)
    if errs:
        raise PlanFileError(f"schema: {errs[0]}" + (f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""))
    meta = doc["_metadata"]
    for f in META_FIELDS:
        if meta[f] != expect[f]:
            raise PlanFileError(f"_metadata.{f} is {meta[f]!r}, this process has {expect[f]!r}")
    arch = expect["sm"]
    out: dict[PlanKey, dict[str, Any]] = {}
    for i, e in enumerate(doc["plans"]):
        for f in ("sm", "out_dtype", "scale_layout"):
            if e[f] != expect[f]:
                raise PlanFileError(f"plans[{i}].{f} is {e[f]!r}, the file's metadata says {expect[f]!r}")
        if e["tactic_set_version"] != T.TACTIC_SET_VERSION:
            raise PlanFileError(f"plans[{i}].tactic_set_version {e['tactic_set_version']} != {T.TACTIC_SET_VERSION}")
        try:
            t = T.by_id(arch, e["tactic"])
        except KeyError as ex:
            raise PlanFileError(f"plans[{i}]: {ex.args[0]}") from None
        if e["runner"] != t.runner:
            raise PlanFileError(f"plans[{i}]: unknown runner {e['runner']!r} for tactic {t.id} ({t.runner})")
        if e["base"] != t.base:
            raise PlanFileError(f"plans[{i}]: tactic {t.id} launches {t.base}, the file says {e['base']!r}")
        if (e["dtype"], e["layout"]) != (t.dtype, t.layout):
            raise PlanFileError(f"plans[{i}]: dtype/layout {e['dtype']}/{e['layout']} do not match tactic {t.id}")
        k = entry_key(e)
        if k in out:
            raise PlanFileError(f"plans[{i}]: key {k} appears twice")
        out[k] = {f: e[f] for f in SCHEMA["properties"]["plans"]["items"]["required"]}
    return out


def read_text(path: str | Path, max_bytes: int) -> str:
    """A plan file's text: a regular file of at most ``max_bytes`` bytes of UTF-8 (PlanFileError otherwise,
    FileNotFoundError when there is none); read once, never more than ``max_bytes + 1`` bytes (a file growing
    after the stat is caught by the parser: its text is cut)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise PlanFileError(f"{path} is not a regular file")
    if st.st_size > max_bytes:
        raise PlanFileError(f"{path} is {st.st_size} bytes (over {max_bytes})")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanFileError(f"{path}: not UTF-8: {e}") from None


def load(path: Path, expect: Mapping[str, Any]) -> dict[PlanKey, dict[str, Any]]:
    """Read and :func:`parse` a file; FileNotFoundError when there is none, PlanFileError when it is rejected."""
    return parse(read_text(path, MAX_BYTES), expect)


def _sort_key(e: Mapping[str, Any]):
    return (e["runner"], e["dtype"], e["layout"], e["n"], e["k"], e["m_bucket"])


def dumps(meta: Mapping[str, Any], plans: Iterable[Mapping[str, Any]]) -> bytes:
    """The canonical file: sorted keys, plans sorted by key, 1-space indent, newline at the end."""
    doc = {"_metadata": dict(meta), "plans": sorted((dict(e) for e in plans), key=_sort_key)}
    return (json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()


def merge(prior: Mapping[PlanKey, Mapping[str, Any]], current: Mapping[PlanKey, Mapping[str, Any]]):
    """Prior compatible entries plus the current ones; a key in both takes the current entry."""
    out = dict(prior)
    out.update(current)
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_dead_temps(path: Path) -> int:
    n = 0
    prefix = f".{path.name}."
    for p in path.parent.glob(f"{prefix}*.tmp"):
        pid = p.name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                n += 1
    return n


@contextlib.contextmanager
def _locked(path: Path):
    import fcntl  # noqa: PLC0415 - POSIX only; the runtime targets Linux

    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def publish(path: Path, meta: Mapping[str, Any], current: Mapping[PlanKey, Mapping[str, Any]],
            before_rename: Callable[[Path], None] | None = None) -> tuple[int, bool]:
    """Merge ``current`` over the compatible file now at ``path`` and atomically replace it.

    Returns ``(entries written, prior file rejected)``. ``before_rename`` is a test hook called with the
    complete, fsynced temporary file just before the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        _sweep_dead_temps(path)
        rejected = False
        try:
            prior = load(path, meta)
        except FileNotFoundError:
            prior = {}
        except PlanFileError:
            prior, rejected = {}, True
        merged = merge(prior, current)
        data = dumps(meta, merged.values())
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            if before_rename is not None:
                before_rename(Path(tmp))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        try:
            dfd = os.open(path.parent, os.O_RDONLY)
        except OSError:
            return len(merged), rejected
        try:
            os.fsync(dfd)
        except OSError as e:  # some filesystems refuse a directory fsync
            if e.errno not in (errno.EINVAL, errno.EBADF):
                raise
        finally:
            os.close(dfd)
    return len(merged), rejected
