"""The ``cute-so`` loader: :class:`CuteKernel`, one C launcher of a CuTe DSL shared object in one CUDA context.

A ``cute-so`` artifact (built by the CuTe lane of `vkc regen`) is one host shared object per (arch, family, host
platform) holding every kernel of the family: C launchers, the host code that encodes the TMA descriptors, the
embedded cubins, and vkc's driver-API shim (it opens libcuda itself; no DSL runtime, no cudart). Loading, once
per process and file (:class:`CuteLibrary`): the file's sha256 and size are checked against the manifest, then it
is dlopened (ctypes); once per device, ``vkc_cute_load(device)`` loads the cubins and sets their shared-memory
attributes. A launcher enqueues on the explicit stream it is given, allocates nothing and calls no synchronising
API, so it can be captured in a CUDA graph (the first call of a kernel loads it: warm up before capturing).

Launcher ABIs (the manifest's ``launch.abi``; C signatures from ``vkc.cute_spec.ABIS``):

* ``gemm_bf16``: ``(a, lda, w, ldw, c, ldc, m, n, k, stream) -> CUresult``; :meth:`CuteKernel.launch` passes
  the arguments through and raises :class:`~vkc_runtime.errors.LaunchError` on a non-zero result.
* ``gemm_fp8``: ``(a, lda, w, ldw, c, ldc, sa, sa_step, sw, sw_step, m, n, k, stream) -> CUresult`` (fp8 A / W,
  fp32 scale vectors with element steps, 0 = one scale), likewise.
* ``gemm_fp8_block``: ``(a, lda, w, ldw, c, ldc, sa, ldsa, sw, ldsw, m, n, k, stream) -> CUresult`` (fp8 A / W,
  block scales: fp32 sa [m, ceil(k / 128)] and sw [ceil(n / 128), ceil(k / 128)] with row strides), likewise.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

from .. import driver
from ..artifacts import ArtifactSet
from ..errors import ArtifactError, LaunchError
from vkc_contract.hashing import IntegrityError, sha256_bytes

__all__ = ["CuteKernel", "CuteLibrary", "ABI_ARGTYPES", "CU_ERRORS"]

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
ABI_ARGTYPES: dict[str, list] = {
    "gemm_bf16": [_P, _I64, _P, _I64, _P, _I64, _I64, _I64, _I64, _P],
    "gemm_fp8": [_P, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _I64, _I64, _I64, _I64, _P],
    "gemm_fp8_block": [_P, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _I64, _I64, _I64, _I64, _P],
}
CU_ERRORS = {1: "CUDA_ERROR_INVALID_VALUE", 3: "CUDA_ERROR_NOT_INITIALIZED", 100: "CUDA_ERROR_NO_DEVICE",
             201: "CUDA_ERROR_INVALID_CONTEXT", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
             222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 400: "CUDA_ERROR_INVALID_HANDLE",
             700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
             801: "CUDA_ERROR_NOT_SUPPORTED", 900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
             901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"}

_libs_lock = threading.Lock()
_libs: dict[tuple[str, str], "CuteLibrary"] = {}  # (resolved path, sha256) -> the loaded library


def _err(rc: int) -> str:
    return f"{rc} ({CU_ERRORS.get(rc, 'CUresult')})"


class CuteLibrary:
    """One dlopened ``cute-so`` file (after its sha256 matched the manifest); loaded onto devices on demand."""

    def __init__(self, path: Path, sha256: str, size: int):
        data = path.read_bytes()
        if len(data) != size or sha256_bytes(data) != sha256:
            raise IntegrityError(f"artifact {path} does not match its manifest: expected sha256 {sha256} ({size} "
                                 f"bytes), actual {sha256_bytes(data)} ({len(data)} bytes); refusing to load it")
        try:
            self.lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise ArtifactError(f"cannot dlopen {path}: {e}") from None
        self.path = path
        self.lib.vkc_cute_driver_status.argtypes = []
        self.lib.vkc_cute_driver_status.restype = ctypes.c_int
        self.lib.vkc_cute_load.argtypes = [ctypes.c_int32]
        self.lib.vkc_cute_load.restype = ctypes.c_int32
        self._devices: set[int] = set()
        self._lock = threading.Lock()

    def load_device(self, device: int) -> None:
        if device in self._devices:
            return
        with self._lock:
            if device not in self._devices:
                rc = self.lib.vkc_cute_load(int(device))
                if rc and driver.release_for_retry(rc):  # out of memory, other allocators' caches released
                    rc = self.lib.vkc_cute_load(int(device))
                if rc:
                    raise ArtifactError(f"{self.path.name}: vkc_cute_load({device}) failed: {_err(rc)}")
                self._devices.add(device)

    def function(self, symbol: str, abi: str):
        if abi not in ABI_ARGTYPES:
            raise ArtifactError(f"{self.path.name}: launcher ABI {abi!r} unknown to this vkc_runtime")
        try:
            fn = getattr(self.lib, symbol)
        except AttributeError:
            raise ArtifactError(f"{self.path.name} does not export {symbol}") from None
        fn.argtypes = ABI_ARGTYPES[abi]
        fn.restype = ctypes.c_int32
        return fn


def library(path: Path, art: dict[str, Any]) -> CuteLibrary:
    key = (str(path.resolve()), art["sha256"])
    lib = _libs.get(key)
    if lib is None:
        with _libs_lock:
            lib = _libs.get(key)
            if lib is None:
                lib = _libs[key] = CuteLibrary(path, art["sha256"], art["size"])
    return lib


class CuteKernel:
    """One launcher of a ``cute-so`` artifact in one CUDA context (loaded lazily on the first launch)."""

    def __init__(self, base: str, aset: ArtifactSet, ctx: int, device: int = 0):
        self.base = base
        self.arch = aset.arch
        self.ctx = ctx
        self.device = device
        self.artifacts = aset
        entry = aset.entry(base)
        self.art = aset.artifact(base)  # this host platform's file (ArtifactError if none)
        if self.art.get("kind") != "cute-so":
            raise ArtifactError(f"{base}: a {self.art.get('kind')!r} artifact, not cute-so")
        self.launch_info: dict[str, Any] = dict(entry.get("launch") or {})
        self.inputs: dict[str, Any] = dict(entry.get("inputs") or {})
        try:
            self.symbol, self.abi = self.launch_info["symbol"], self.launch_info["abi"]
        except KeyError as e:
            raise ArtifactError(f"{aset.arch}.json: {base} has no launch.{e.args[0]}") from None
        if self.symbol not in self.art.get("symbols", ()):
            raise ArtifactError(f"{aset.arch}.json: {base}'s launcher {self.symbol} is not among the artifact's "
                                f"symbols")
        self._fn = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<vkc CuteKernel {self.base} {self.arch} ctx={self.ctx:#x} {'loaded' if self._fn else 'not loaded'}>"

    @property
    def loaded(self) -> bool:
        return self._fn is not None

    def load(self):
        if self._fn is None:
            with self._lock:
                if self._fn is None:
                    lib = library(self.artifacts.path(self.base), self.art)
                    lib.load_device(self.device)
                    self._fn = lib.function(self.symbol, self.abi)
        return self._fn

    def launch(self, *args) -> None:
        """Call the launcher with its ABI's arguments (the stream last); raise LaunchError on failure."""
        fn = self._fn or self.load()
        rc = fn(*args)
        if rc:
            raise LaunchError(f"{self.base}: launch failed: {_err(rc)}")
