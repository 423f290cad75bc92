"""Exception types of vkc_runtime (stdlib only; importing this module has no side effects)."""
from __future__ import annotations

from vkc_contract.hashing import IntegrityError

__all__ = [
    "VkcError", "CudaError", "DriverUnavailable", "MissingKernelError", "ArtifactError",
    "IntegrityError", "LaunchError",
]


class VkcError(Exception):
    """Base class of vkc_runtime's own errors (IntegrityError and MissingKernelError keep their stdlib bases)."""


class CudaError(VkcError, RuntimeError):
    """A CUDA driver call returned an error.

    ``name`` is the ``cuGetErrorName`` text (``CUDA_ERROR_INVALID_VALUE``), ``code`` the numeric
    CUresult, ``call`` the driver function, ``detail`` what vkc was doing.
    """

    def __init__(self, name: str, code: int, call: str, detail: str = ""):
        self.name = str(name)
        self.code = int(code)
        self.call = str(call)
        self.detail = str(detail)
        msg = f"{self.call}: {self.name} ({self.code})"
        if self.detail:
            msg += f": {self.detail}"
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self.name, self.code, self.call, self.detail))


class DriverUnavailable(VkcError, RuntimeError):
    """libcuda cannot be loaded or initialised (no driver, no device, driver too old)."""


class LaunchError(VkcError, ValueError):
    """A launch was refused before reaching the driver (bad grid, shared memory beyond the device limit...)."""


class ArtifactError(VkcError, RuntimeError):
    """A manifest or artifact is malformed or inconsistent with this runtime."""


class MissingKernelError(ImportError):
    """Required kernels have no artifact for the selected arch.

    Raised at ``import vkc_runtime`` (refuse early, not at the first launch) and by ``get_kernel``.
    """

    def __init__(self, message: str, *, arch: str | None = None, missing: list[str] | tuple[str, ...] = (),
                 repair: str = ""):
        self.arch = arch
        self.missing = list(missing)
        self.repair = repair
        super().__init__(message)
