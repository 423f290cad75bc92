"""vkc_runtime: load vkc's vendored cubins through the CUDA driver API and launch them (numpy + cuda-bindings).

Public API (imported lazily; the arch table and the ABI live in :mod:`vkc_contract`)::

    DeviceArray, TensorRef, as_tensor, empty, zeros, full, from_numpy     (vkc_runtime.memory)
    Stream, Graph, resolve_stream, is_capturing                           (vkc_runtime.stream)
    get_kernel, has_kernel                                                (vkc_runtime.kernels)
    Kernel                                                                (vkc_runtime.loaders.triton_cubin)
    pack_args                                                             (vkc_runtime.pack)
    GlobalScratch                                                         (vkc_runtime.scratch)
    doctor  (module: doctor.report(), doctor.format_report())
    CudaError, DriverUnavailable, MissingKernelError, IntegrityError, LaunchError, ArtifactError
    OpError                                                               (vkc_runtime.ops)

Importing the package runs :func:`vkc_runtime.registry.check_import` (unless ``VKC_IMPORT_CHECK=0``):
with a usable GPU it refuses to import (MissingKernelError, an ImportError) when a kernel the ops need
has no artifact for the device's arch; without a driver or device it does nothing.
"""
from __future__ import annotations

import importlib as _importlib
import os as _os

__version__ = "0.1.0"

_LAZY = {
    "DeviceArray": "memory", "TensorRef": "memory", "as_tensor": "memory", "empty": "memory",
    "zeros": "memory", "full": "memory", "from_numpy": "memory",
    "Stream": "stream", "Graph": "stream", "resolve_stream": "stream", "is_capturing": "stream",
    "get_kernel": "kernels", "has_kernel": "kernels", "Kernel": "loaders.triton_cubin", "pack_args": "pack",
    "GlobalScratch": "scratch", "OpError": "ops._check",
    "CudaError": "errors", "DriverUnavailable": "errors", "MissingKernelError": "errors",
    "IntegrityError": "errors", "LaunchError": "errors", "ArtifactError": "errors", "VkcError": "errors",
    "require": "registry",
}
_SUBMODULES = ("artifacts", "bound", "doctor", "driver", "errors", "interop", "kernels", "loaders", "memory", "native",
               "ops", "pack", "registry", "scratch", "stream", "tensor")

__all__ = sorted([*_LAZY, "doctor", "__version__"])


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is not None:
        value = getattr(_importlib.import_module(f"{__name__}.{mod}"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


if _os.environ.get("VKC_IMPORT_CHECK", "1").strip() != "0":
    from .registry import check_import as _check_import

    _check_import()
