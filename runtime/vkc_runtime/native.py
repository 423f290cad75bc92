"""The one place that imports the native launcher ``vkc_runtime._native`` (``csrc/launcher.cpp``) and says
whether it is used.

``NATIVE`` is the module or None (not built, or it failed to import: :func:`native_reason` says why).
``VKC_NATIVE=0`` turns it off at run time: launches then go through :mod:`vkc_runtime.pack`'s Python
launcher and bound calls through :class:`vkc_runtime.bound.PyBoundCall` (ARCHITECTURE.md, "Launch ABI").
"""
from __future__ import annotations

import os

from .errors import CudaError, LaunchError

__all__ = ["NATIVE", "native_reason", "native_available"]

try:
    from . import _native as NATIVE  # type: ignore[attr-defined]
    _IMPORT_FAILURE: str | None = None
    NATIVE._set_exception_types(CudaError, LaunchError)
except Exception as _e:  # ImportError when not built; anything else is reported by doctor
    NATIVE = None  # type: ignore[assignment]
    _IMPORT_FAILURE = f"{type(_e).__name__}: {_e}"


def native_reason() -> str | None:
    """Why the native launcher is not used (None when it is)."""
    if NATIVE is None:
        return _IMPORT_FAILURE
    if os.environ.get("VKC_NATIVE", "1").strip() == "0":
        return "disabled by VKC_NATIVE=0"
    return None


def native_available() -> bool:
    return native_reason() is None
