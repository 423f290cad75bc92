"""A thin layer over ``cuda.bindings.driver``: error checking, driver availability, context and device queries.

Everything that touches libcuda goes through :func:`call`, so CPU tests can monkeypatch this module (or
``cuda.bindings.driver`` functions) at one boundary.

Without libcuda every cuda-bindings call raises ``cuda.pathfinder.DynamicLibNotFoundError`` (a
RuntimeError; wrappers may turn it into SystemError). :func:`call` turns those into
:class:`DriverUnavailable`, and the first such failure is cached so later calls fail fast (a failing
library search is slow).

Context policy (:func:`ensure_context`): if the calling thread already has a current context (torch,
cupy or the user made one) vkc uses it. Otherwise vkc retains the *primary* context of the requested
device ordinal (default 0; ordinals are counted after ``CUDA_VISIBLE_DEVICES`` filtering, which the
driver applies) and makes it current. Primary contexts are what the CUDA runtime (and so torch) use,
so vkc and torch share memory and streams. Retained primary contexts are never released (process
lifetime).
"""
from __future__ import annotations

import os
import threading

from cuda.bindings import driver as cu

from .errors import CudaError, DriverUnavailable

__all__ = [
    "cu", "CudaError", "DriverUnavailable", "check", "call", "init", "available", "unavailable_reason",
    "current_context", "ensure_context", "context_device", "device_count", "device_cc", "device_name",
    "driver_version", "sm_count", "max_smem_optin", "device_attribute", "reset_caches", "call_taking_memory",
    "on_out_of_memory", "release_for_retry", "oom_retries",
]

try:  # the error class cuda.pathfinder raises when libcuda cannot be found
    from cuda.pathfinder import DynamicLibNotFoundError as _LibNotFound
except Exception:  # pragma: no cover - older cuda-bindings without pathfinder
    class _LibNotFound(RuntimeError):  # type: ignore[no-redef]
        pass

# Errors cuda-bindings raises when the driver library itself is unusable.
_BOUNDARY_ERRORS = (_LibNotFound, SystemError, RuntimeError, OSError)

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_lock = threading.RLock()
_state: dict = {"init": None, "reason": None}  # init: None (not tried) / True / False
_dev_cache: dict[tuple[str, int], object] = {}
_primary: dict[int, int] = {}  # device ordinal -> retained primary context handle
_version: list[int] = []
_oom_hooks: list = []  # callables releasing device memory that other allocators of this process cache
_OOM = int(cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY)


def reset_caches() -> None:
    """Forget cached driver state (tests; never needed in normal use)."""
    with _lock:
        _state["init"] = None
        _state["reason"] = None
        _dev_cache.clear()
        _primary.clear()
        _version.clear()


def _error_name(code) -> str:
    try:
        err, name = cu.cuGetErrorName(code)
        if err == _SUCCESS and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        pass
    try:
        return cu.CUresult(int(code)).name
    except Exception:
        return f"CUDA_ERROR_{int(code)}"


def check(result, call: str = "cuda", detail: str = ""):
    """Unwrap a cuda-bindings result tuple ``(CUresult, *values)``.

    Returns None, the single value, or a tuple of values; raises :class:`CudaError` (with the
    ``cuGetErrorName`` text) when the CUresult is not CUDA_SUCCESS.
    """
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if err != _SUCCESS:
        code = int(err)
        raise CudaError(_error_name(err), code, call, detail)
    if not rest:
        return None
    if len(rest) == 1:
        return rest[0]
    return rest


def _lib_failure(exc: BaseException, fn_name: str) -> DriverUnavailable:
    reason = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, _LibNotFound) or "driver library" in str(exc) or "libcuda" in str(exc):
        with _lock:  # libcuda is absent: remember, every later call fails fast
            _state["init"] = False
            _state["reason"] = reason
    return DriverUnavailable(f"CUDA driver unavailable ({fn_name}): {reason}")


def call(fn, *args, detail: str = ""):
    """Call a ``cuda.bindings.driver`` function and :func:`check` its result.

    Library-loading failures become :class:`DriverUnavailable`; CUDA errors become :class:`CudaError`.
    """
    if _state["init"] is False:
        raise DriverUnavailable(f"CUDA driver unavailable: {_state['reason']}")
    name = getattr(fn, "__name__", "cuda")
    try:
        res = fn(*args)
    except _BOUNDARY_ERRORS as e:
        if isinstance(e, CudaError):  # pragma: no cover - cuda-bindings never raises ours
            raise
        raise _lib_failure(e, name) from e
    return check(res, name, detail)


def on_out_of_memory(hook) -> None:
    """Register ``hook()`` (returns True when it released something): run when a call that takes device memory
    (:func:`call_taking_memory`) fails with CUDA_ERROR_OUT_OF_MEMORY, before that call is tried once more.
    vkc_runtime.interop registers torch's and CuPy's cache releases (their pools keep freed memory reserved, which
    the driver then cannot give to vkc's allocations or module loads)."""
    if hook not in _oom_hooks:
        _oom_hooks.append(hook)


def oom_retries() -> int:
    """How many calls were retried after the hooks released memory (diagnostics, tests)."""
    return _state.get("oom_retries", 0)


def _released(hook) -> bool:
    try:
        return bool(hook())
    except Exception:  # noqa: BLE001 - a hook that failed released nothing; the original error stands
        return False


def release_for_retry(code: int) -> bool:
    """After a call that takes device memory failed with CUresult ``code``: for CUDA_ERROR_OUT_OF_MEMORY run the
    :func:`on_out_of_memory` hooks; True when one released memory (the caller then tries once more)."""
    if int(code) != _OOM or not [h for h in list(_oom_hooks) if _released(h)]:
        return False
    with _lock:
        _state["oom_retries"] = _state.get("oom_retries", 0) + 1
    return True


def call_taking_memory(fn, *args, detail: str = ""):
    """:func:`call` for a driver call that takes device memory (cuMemAlloc, cuModuleLoadData): on
    CUDA_ERROR_OUT_OF_MEMORY the :func:`on_out_of_memory` hooks run, and if one released memory the call is tried
    once more (its error then stands)."""
    try:
        return call(fn, *args, detail=detail)
    except CudaError as e:
        if not release_for_retry(e.code):
            raise
    return call(fn, *args, detail=detail)


def init() -> None:
    """``cuInit(0)`` once per process. Raises :class:`DriverUnavailable` if it cannot succeed."""
    st = _state["init"]
    if st is True:
        return
    if st is False:
        raise DriverUnavailable(f"CUDA driver unavailable: {_state['reason']}")
    with _lock:
        if _state["init"] is True:
            return
        try:
            res = cu.cuInit(0)
        except _BOUNDARY_ERRORS as e:
            raise _lib_failure(e, "cuInit") from e
        err = res[0] if isinstance(res, tuple) else res
        if err != _SUCCESS:
            name = _error_name(err)
            _state["init"] = False
            _state["reason"] = f"cuInit failed: {name} ({int(err)})"
            raise DriverUnavailable(f"CUDA driver unavailable: {_state['reason']}")
        _state["init"] = True
        _state["reason"] = None


def available() -> bool:
    """True when libcuda loads and ``cuInit`` succeeds (does not create a context)."""
    try:
        init()
        return True
    except DriverUnavailable:
        return False


def unavailable_reason() -> str | None:
    """Why the driver is unusable, or None (calls :func:`init` if not tried yet)."""
    if available():
        return None
    return _state["reason"] or "unknown"


# --------------------------------------------------------------------------------------- contexts

def current_context() -> int:
    """The calling thread's current CUcontext as an int (0 if none). Requires :func:`init`."""
    if _state["init"] is not True:
        init()
    res = cu.cuCtxGetCurrent()  # hot path (get_kernel per launch): libcuda is loaded once init() succeeded
    if res[0] != _SUCCESS:
        check(res, "cuCtxGetCurrent")
    ctx = res[1]
    return int(ctx) if ctx is not None else 0


def context_device() -> int:
    """Device ordinal of the current context."""
    return int(call(cu.cuCtxGetDevice))


def _default_device() -> int:
    v = os.environ.get("VKC_DEVICE", "").strip()
    if not v:
        return 0
    try:
        d = int(v)
    except ValueError:
        raise ValueError(f"VKC_DEVICE={v!r} is not a device ordinal") from None
    return d


def ensure_context(device: int | None = None) -> int:
    """Return a current CUcontext handle (int), making one current if needed.

    * ``device is None`` and a context is current -> that context.
    * otherwise the primary context of ``device`` (default: env ``VKC_DEVICE`` or 0; ordinals respect
      ``CUDA_VISIBLE_DEVICES``) is retained (once per process) and made current for this thread, unless
      the current context already belongs to that device.
    """
    ctx = current_context()
    if ctx and device is None:
        return ctx
    dev = _default_device() if device is None else int(device)
    if ctx and context_device() == dev:
        return ctx
    n = device_count()
    if not 0 <= dev < n:
        raise DriverUnavailable(f"CUDA device ordinal {dev} is out of range: {n} device(s) visible"
                                f" (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
    with _lock:
        pctx = _primary.get(dev)
        if pctx is None:
            d = call(cu.cuDeviceGet, dev)
            pctx = int(call(cu.cuDevicePrimaryCtxRetain, d))
            _primary[dev] = pctx
    call(cu.cuCtxSetCurrent, pctx)
    return pctx


# --------------------------------------------------------------------------------------- devices

def device_count() -> int:
    init()
    return int(call(cu.cuDeviceGetCount))


def device_attribute(attr, dev: int = 0) -> int:
    """``cuDeviceGetAttribute`` for device ordinal ``dev`` (cached; device attributes are immutable)."""
    key = (str(attr), int(dev))
    v = _dev_cache.get(key)
    if v is None:
        init()
        d = call(cu.cuDeviceGet, int(dev))
        v = int(call(cu.cuDeviceGetAttribute, attr, d))
        _dev_cache[key] = v
    return v  # type: ignore[return-value]


def device_cc(dev: int = 0) -> tuple[int, int]:
    """Compute capability ``(major, minor)`` of device ordinal ``dev``."""
    A = cu.CUdevice_attribute
    return (device_attribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
            device_attribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))


def device_name(dev: int = 0) -> str:
    key = ("name", int(dev))
    v = _dev_cache.get(key)
    if v is None:
        init()
        d = call(cu.cuDeviceGet, int(dev))
        raw = call(cu.cuDeviceGetName, 256, d)
        if isinstance(raw, (bytes, bytearray)):
            raw = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
        v = str(raw)
        _dev_cache[key] = v
    return v  # type: ignore[return-value]


def sm_count(dev: int = 0) -> int:
    return device_attribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)


def max_smem_optin(dev: int = 0) -> int:
    """Bytes of shared memory a block may opt into (``MAX_SHARED_MEMORY_PER_BLOCK_OPTIN``)."""
    return device_attribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)


def driver_version() -> int:
    """``cuDriverGetVersion`` (e.g. 13000 for CUDA 13.0). Does not need cuInit or a device."""
    if not _version:
        _version.append(int(call(cu.cuDriverGetVersion)))
    return _version[0]
