"""Which kernels the ops need, and the import-time completeness check.

Each ops module declares, as data next to the code that picks its kernels, the bases it may launch:
``BASES`` (required: the import check refuses an arch that lacks one) and, where it has arch-specific fast
paths, ``OPTIONAL_BASES`` (looked up with ``has_kernel``; e.g. the sm_90a/sm_100a TMA prefill). Both are
built from the same small naming functions the op calls, so each base name is spelled once. The ops do not
import this module; it imports them (the list is :data:`vkc_runtime.ops.MODULES`), one direction only.
:func:`require` adds bases declared outside the ops (extensions, tests). ARCHITECTURE.md, "Kernel names and
completeness".

``import vkc_runtime`` then runs :func:`check_import`: if a CUDA device is usable it selects the arch
and checks (stat only) that every required base has an artifact, raising :class:`MissingKernelError`
(an ImportError) with the repair command otherwise. With no driver/device it does nothing (ops raise
a clear error at launch). ``VKC_IMPORT_CHECK=0`` disables the check (the aot CLI sets it).
"""
from __future__ import annotations

import importlib
import os
import threading
from typing import Any

from .errors import MissingKernelError

__all__ = ["require", "required", "optional", "ops_bases", "check_import", "last_check", "clear"]

_lock = threading.Lock()
_extra: set[str] = set()
_last: dict[str, Any] = {"status": "not-run"}


def _valid(bases) -> None:
    for b in bases:
        if not isinstance(b, str) or not b or b != b.strip():
            raise ValueError(f"kernel base must be a non-empty string, got {b!r}")


def ops_bases(*, optional: bool = False) -> dict[str, tuple[str, ...]]:
    """``{ops module: its BASES}`` (``optional=True``: its OPTIONAL_BASES) for every module of
    :data:`vkc_runtime.ops.MODULES` (imports them)."""
    ops = importlib.import_module("vkc_runtime.ops")
    out = {}
    for name in ops.MODULES:
        mod = importlib.import_module(f"vkc_runtime.ops.{name}")
        bases = tuple(getattr(mod, "OPTIONAL_BASES" if optional else "BASES", ()))
        _valid(bases)
        out[name] = bases
    return out


def require(*bases: str) -> tuple[str, ...]:
    """Declare kernel bases that code outside :mod:`vkc_runtime.ops` launches."""
    _valid(bases)
    with _lock:
        _extra.update(bases)
    return bases


def required(*, include_ops: bool = True) -> frozenset[str]:
    """Every base the import check requires: the ops modules' BASES and what :func:`require` added."""
    with _lock:
        extra = frozenset(_extra)
    if not include_ops:
        return extra
    return extra.union(*ops_bases().values())


def optional() -> frozenset[str]:
    """Bases the ops use where the arch has them (not required)."""
    return frozenset().union(*ops_bases(optional=True).values())


def clear() -> None:
    """Forget :func:`require` declarations and the last check (tests)."""
    with _lock:
        _extra.clear()
    _last.clear()
    _last["status"] = "not-run"


def last_check() -> dict[str, Any]:
    """The state the last :func:`check_import` left (for ``doctor``)."""
    return dict(_last)


def _set(**kw) -> dict[str, Any]:
    _last.clear()
    _last.update(kw)
    return dict(_last)


def check_import(*, force: bool = False, import_ops: bool = True, root=None, device: int | None = None
                 ) -> dict[str, Any]:
    """Verify that every required base has an artifact for this machine's device.

    Returns a status dict (``status`` in ``skipped | no-device | nothing-required | ok``); raises
    :class:`MissingKernelError` on missing kernels or when no arch of the device has artifacts.
    """
    from vkc_contract import arch as _arch
    from . import artifacts, driver  # deferred: keep `import vkc_runtime` light

    if not force and os.environ.get("VKC_IMPORT_CHECK", "1").strip() == "0":
        return _set(status="skipped", reason="VKC_IMPORT_CHECK=0")
    req = required(include_ops=import_ops)
    try:
        driver.init()
        n = driver.device_count()
    except driver.DriverUnavailable as e:
        return _set(status="no-device", reason=str(e), required=sorted(req))
    if n == 0:
        return _set(status="no-device", reason="no CUDA device visible", required=sorted(req))
    if device is None:
        device = 0
        try:
            if driver.current_context():
                device = driver.context_device()
        except driver.CudaError:
            pass
    cc = driver.device_cc(device)
    if not req:
        return _set(status="nothing-required", device=device, cc=list(cc), required=[])
    if root is None:
        root = artifacts.find_root()
    if root is None:
        cands = _arch.candidates_for_cc(cc)
        a = cands[0] if cands else None
        raise MissingKernelError(
            f"vkc_runtime: {len(req)} kernel(s) required but no artifact root was found (no VKC_ARTIFACT_ROOT, no "
            f"packaged artifacts, no source tree with manifests/schema.json); {artifacts.repair_hint(a)}. "
            f"Set VKC_IMPORT_CHECK=0 to import anyway (`VKC_IMPORT_CHECK=0 python -m vkc_runtime.doctor` shows details).", arch=a, missing=sorted(req), repair=artifacts.repair_hint(a))
    arch, how = artifacts.select_arch_info(cc, root)  # MissingKernelError when no arch has a manifest
    problems = artifacts.ArtifactSet(root, arch).check_complete(req)
    if problems:
        missing = sorted({p.split(":", 1)[0] for p in problems})
        hint = artifacts.repair_hint(arch)
        name = ""
        try:
            name = f" {driver.device_name(device)!r}"
        except Exception:
            pass
        raise MissingKernelError(
            f"vkc_runtime: arch {arch} ({how}; device{name} cc {cc[0]}.{cc[1]}; artifact root {root}) lacks "
            f"{len(missing)} required kernel(s):\n  " + "\n  ".join(problems) +
            f"\nRepair: {hint}. Set VKC_IMPORT_CHECK=0 to import anyway (`VKC_IMPORT_CHECK=0 python -m vkc_runtime.doctor` shows details).",
            arch=arch, missing=missing, repair=hint)
    return _set(status="ok", device=device, cc=list(cc), arch=arch, how=how, root=str(root), required=sorted(req))
