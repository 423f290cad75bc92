"""Device memory: vkc's minimal :class:`DeviceArray` and :func:`as_tensor` for foreign tensors.

:func:`as_tensor` turns whatever an op receives into a :class:`TensorRef` ``(ptr, shape, strides in
elements, dtype name, device ordinal, keepalive)``. Accepted, in this order:

1. :class:`DeviceArray` (and :class:`TensorRef` itself);
2. torch-like tensors, duck-typed (``data_ptr``, ``stride``, ``dtype``, ``device``, ``is_cuda``): the fast
   path, no DLPack, works for bf16 (torch's ``__cuda_array_interface__`` raises TypeError for bf16);
3. objects with ``__cuda_array_interface__`` (cupy, numba, torch). The interface carries no device
   ordinal, so ``device`` is -1 (unknown). typestr ``<V2`` is read as bfloat16 (the convention of torch,
   ml_dtypes and vkc; older torch raises TypeError for bf16 there, newer reports ``<V2``). A ``stream`` entry in the interface is ignored: vkc
   does not synchronise with the producer (order your streams yourself);
4. DLPack producers (``__dlpack__`` + ``__dlpack_device__``) and raw ``dltensor`` capsules. vkc calls
   ``__dlpack__(stream=-1)`` -- "-1: the producer must not synchronise" -- because vkc launches on the
   stream you pass to the op and cannot express that to the producer; producers that reject the keyword
   are called without arguments. The capsule is *not* consumed (not renamed to ``used_dltensor``) and is
   kept alive by the TensorRef, so the producer's capsule destructor frees it when the TensorRef dies.

Host (CPU) tensors are rejected with ValueError.

dtype names: ``bfloat16 float16 float32 float64 int8 uint8 int16 uint16 int32 uint32 int64 uint64 bool
float8_e4m3fn float8_e5m2``.

``DeviceArray.__cuda_array_interface__`` (v3, contiguous, no ``stream`` key = no synchronisation
needed) describes bfloat16 as typestr ``"<V2"`` (an opaque 2-byte element: numpy has no bfloat16 and
reporting ``<u2``/``<i2`` would let consumers silently treat the bits as integers). Consumers that need
real bf16 should use ``__dlpack__`` (kDLBfloat, needs the native module), e.g. ``torch.from_dlpack(a)``.

Frees during a graph capture: ``cuMemFree`` is not capturable (it would invalidate a capture in progress, and the
error would surface at a later launch), so a :class:`DeviceArray` collected while a ``vkc_runtime.Graph``
capture runs is freed when the last such capture ends (vkc_runtime.deferred).
"""
from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from . import deferred, driver
from .interop import _from_cai, _from_dlpack, _from_torch, _is_capsule, is_torch_tensor, parse_dlpack_capsule
from .tensor import (DTYPES, TensorRef, _c_strides, _DL_CUDA, dtype_name, from_bf16_bits, itemsize,  # noqa: F401
                     to_bf16_bits)

__all__ = [
    "DTYPES", "DeviceArray", "TensorRef", "as_tensor", "dtype_name", "itemsize", "to_bf16_bits",
    "from_bf16_bits", "empty", "zeros", "full", "from_numpy", "parse_dlpack_capsule",
]


# ----------------------------------------------------------------------------------- DeviceArray
def _free_device(ptr: int, ctx: int) -> None:
    if deferred.defer(lambda: _free_device(ptr, ctx)):
        return
    try:
        cu = driver.cu
        pushed = False
        if ctx and driver.current_context() != ctx:
            driver.call(cu.cuCtxPushCurrent, ctx)
            pushed = True
        try:
            driver.call(cu.cuMemFree, ptr)
        finally:
            if pushed:
                driver.call(cu.cuCtxPopCurrent)
    except Exception:  # interpreter shutdown, context gone: nothing sensible left to do
        pass


def _sync_legacy() -> None:
    """Wait for the legacy default stream: ``stream=None`` copies/fills are complete when they return, so
    work on any (also non-blocking) stream may use the data right away."""
    driver.call(driver.cu.cuStreamSynchronize, 0)


class DeviceArray:
    """A contiguous (row-major) device buffer with a shape and a dtype, owned by vkc (``cuMemAlloc``).

    ``dtype`` is a numpy dtype, or the string ``"bfloat16"`` (numpy has none) and the fp8 names.
    Memory is freed by a finalizer when the array (and every view of it) is garbage collected.
    """

    __slots__ = ("ptr", "shape", "dtype_name", "device", "ctx", "_base", "_ref", "_finalizer", "__weakref__")

    def __init__(self, shape, dtype="float32", *, ptr: int | None = None, base: Any = None,
                 device: int | None = None, ctx: int = 0):
        self.shape = tuple(int(s) for s in ((shape,) if isinstance(shape, int) else shape))
        if any(s < 0 for s in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")
        self.dtype_name = dtype_name(dtype)
        self._base = base
        self._ref = None
        self._finalizer = None
        if ptr is not None:  # a view of memory someone else owns (base keeps it alive)
            self.ptr, self.device, self.ctx = int(ptr), -1 if device is None else int(device), ctx
            return
        self.ctx = driver.ensure_context(device)
        self.device = driver.context_device()
        n = self.nbytes
        self.ptr = int(driver.call_taking_memory(driver.cu.cuMemAlloc, n, detail=f"allocating {n} bytes")) if n else 0
        if self.ptr:
            self._finalizer = weakref.finalize(self, _free_device, self.ptr, self.ctx)
            self._finalizer.atexit = False

    # -- properties -------------------------------------------------------------------------------
    @property
    def dtype(self):
        d = DTYPES[self.dtype_name][3]
        return d if d is not None else self.dtype_name

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype_name][0]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements (C order)."""
        return _c_strides(self.shape)

    def data_ptr(self) -> int:
        return self.ptr

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype_name}, ptr={self.ptr:#x}, device={self.device})"

    def tensor_ref(self) -> TensorRef:
        r = self._ref
        if r is None:
            r = self._ref = TensorRef(self.ptr, self.shape, self.strides, self.dtype_name, self.device, self)
        return r

    def reshape(self, *shape) -> "DeviceArray":
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        shape = list(shape)
        if shape.count(-1) > 1:
            raise ValueError("only one dimension can be -1")
        if -1 in shape:
            rest = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = self.size // rest if rest else 0
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} into {tuple(shape)}")
        return DeviceArray(tuple(shape), self.dtype_name, ptr=self.ptr, base=self._base or self, device=self.device,
                           ctx=self.ctx)

    def view(self, dtype) -> "DeviceArray":
        """Reinterpret the bytes (last dimension rescaled)."""
        name = dtype_name(dtype)
        isz = DTYPES[name][0]
        if not self.shape:
            raise ValueError("cannot view a 0-d array as another dtype")
        last = self.shape[-1] * self.itemsize
        if last % isz:
            raise ValueError(f"last dimension ({last} bytes) is not a multiple of {name}'s {isz} bytes")
        return DeviceArray(self.shape[:-1] + (last // isz,), name, ptr=self.ptr, base=self._base or self,
                           device=self.device, ctx=self.ctx)

    # -- constructors -----------------------------------------------------------------------------
    @classmethod
    def empty(cls, shape, dtype="float32", *, device: int | None = None) -> "DeviceArray":
        return cls(shape, dtype, device=device)

    @classmethod
    def zeros(cls, shape, dtype="float32", *, device: int | None = None, stream=None) -> "DeviceArray":
        a = cls(shape, dtype, device=device)
        a.fill_bytes(0, stream=stream)
        return a

    @classmethod
    def full(cls, shape, value, dtype="float32", *, device: int | None = None, stream=None) -> "DeviceArray":
        name = dtype_name(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if name == "bfloat16":
            host = np.full(shape, to_bf16_bits(np.float32(value))[()], dtype=np.uint16)
        elif DTYPES[name][3] is None:
            raise TypeError(f"full() does not support {name}; build the bits on the host and use from_numpy")
        else:
            host = np.full(shape, value, dtype=DTYPES[name][3])
        return cls.from_numpy(host, dtype=name, device=device, stream=stream)

    @classmethod
    def from_numpy(cls, arr, stream=None, *, dtype=None, device: int | None = None) -> "DeviceArray":
        """Copy a host array to a new DeviceArray.

        ``dtype="bfloat16"``: a float array is rounded to bf16 (nearest even); a uint16 array is taken as
        raw bf16 bits. ml_dtypes' bfloat16 arrays are recognised and copied bit-exactly.
        ``stream``: asynchronous copy on that stream (``cuMemcpyHtoDAsync``); else synchronous (complete on
        return, then usable from any stream). Not capturable: allocate and upload before a graph capture.
        """
        a = np.asarray(arr)
        if a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:  # ml_dtypes.bfloat16 (duck-typed)
            a, name = a.view(np.uint16), "bfloat16"
        elif dtype is not None and dtype_name(dtype) == "bfloat16":
            name = "bfloat16"
            if a.dtype != np.uint16:
                a = to_bf16_bits(a)
        elif dtype is not None:
            name = dtype_name(dtype)
            if DTYPES[name][3] is not None:
                a = a.astype(DTYPES[name][3], copy=False)
            elif a.dtype.itemsize != DTYPES[name][0]:
                raise TypeError(f"{name} needs a host array of {DTYPES[name][0]}-byte raw values, got {a.dtype}")
        else:
            name = dtype_name(a.dtype)
        a = np.ascontiguousarray(a)
        out = cls(a.shape, name, device=device)
        if out.nbytes:
            cu = driver.cu
            if stream is None:
                driver.call(cu.cuMemcpyHtoD, out.ptr, a.ctypes.data, out.nbytes)
                _sync_legacy()  # from pageable memory the DMA may still be in flight on return
            else:
                from .stream import resolve_stream
                driver.call(cu.cuMemcpyHtoDAsync, out.ptr, a.ctypes.data, out.nbytes, resolve_stream(stream))
        return out

    # -- host copies / fills ----------------------------------------------------------------------
    def to_numpy(self, stream=None, *, raw: bool = False) -> np.ndarray:
        """Copy to a new host array (synchronous; with ``stream`` the copy is queued on it, then waited for).

        bfloat16 comes back as float32 values (exact), or as uint16 bits with ``raw=True``; fp8 as uint8 bits.
        """
        host_dtype = DTYPES[self.dtype_name][3]
        if host_dtype is None:
            host_dtype = np.dtype(np.uint16) if self.itemsize == 2 else np.dtype(np.uint8)
        out = np.empty(self.shape, dtype=host_dtype)
        if self.nbytes:
            cu = driver.cu
            if stream is None:
                driver.call(cu.cuMemcpyDtoH, out.ctypes.data, self.ptr, self.nbytes)
            else:
                from .stream import resolve_stream
                s = resolve_stream(stream)
                driver.call(cu.cuMemcpyDtoHAsync, out.ctypes.data, self.ptr, self.nbytes, s)
                driver.call(cu.cuStreamSynchronize, s)
        if self.dtype_name == "bfloat16" and not raw:
            return from_bf16_bits(out)
        return out

    def fill_bytes(self, value: int, stream=None) -> "DeviceArray":
        """Set every byte to ``value`` (``cuMemsetD8``; complete on return, or async on ``stream`` if given --
        the stream form is capturable)."""
        if not 0 <= int(value) <= 255:
            raise ValueError(f"fill_bytes value must be 0..255, got {value}")
        if self.nbytes:
            cu = driver.cu
            if stream is None:
                driver.call(cu.cuMemsetD8, self.ptr, int(value), self.nbytes)
                _sync_legacy()  # memsets are asynchronous to the host
            else:
                from .stream import resolve_stream
                driver.call(cu.cuMemsetD8Async, self.ptr, int(value), self.nbytes, resolve_stream(stream))
        return self

    def copy_from(self, other, stream=None) -> "DeviceArray":
        """Device-to-device copy of ``other`` (same nbytes, contiguous) into this array."""
        src = as_tensor(other, "other")
        nbytes = src.numel * src.itemsize
        if nbytes != self.nbytes or not src.is_contiguous():
            raise ValueError(f"copy_from: need a contiguous source of {self.nbytes} bytes, got {nbytes} bytes "
                             f"(contiguous={src.is_contiguous()})")
        if nbytes:
            cu = driver.cu
            if stream is None:
                driver.call(cu.cuMemcpyDtoD, self.ptr, src.ptr, nbytes)
                _sync_legacy()
            else:
                from .stream import resolve_stream
                driver.call(cu.cuMemcpyDtoDAsync, self.ptr, src.ptr, nbytes, resolve_stream(stream))
        return self

    # -- interop ----------------------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": DTYPES[self.dtype_name][1], "data": (self.ptr, False),
                "version": 3, "strides": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DL_CUDA, max(self.device, 0))

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A legacy ``dltensor`` capsule (kDLCUDA). vkc does not track pending work: ``stream`` is ignored,
        so synchronise the stream that wrote this array before the consumer uses it. Needs ``_native``."""
        from .native import NATIVE as _native
        if _native is None:
            raise BufferError("DeviceArray.__dlpack__ needs the vkc native module (vkc_runtime._native)")
        if copy:
            raise BufferError("DeviceArray.__dlpack__ cannot copy")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"DeviceArray lives on {self.__dlpack_device__()}, cannot export to {dl_device}")
        code, bits = DTYPES[self.dtype_name][2]
        return _native.make_dlpack(self.ptr, self.shape, self.strides, code, bits, _DL_CUDA, max(self.device, 0),
                                   self)


def empty(shape, dtype="float32", *, device: int | None = None) -> DeviceArray:
    return DeviceArray.empty(shape, dtype, device=device)


def zeros(shape, dtype="float32", *, device: int | None = None, stream=None) -> DeviceArray:
    return DeviceArray.zeros(shape, dtype, device=device, stream=stream)


def full(shape, value, dtype="float32", *, device: int | None = None, stream=None) -> DeviceArray:
    return DeviceArray.full(shape, value, dtype, device=device, stream=stream)


def from_numpy(arr, stream=None, *, dtype=None, device: int | None = None) -> DeviceArray:
    return DeviceArray.from_numpy(arr, stream, dtype=dtype, device=device)


def as_tensor(obj, name: str = "tensor") -> TensorRef:
    """A :class:`TensorRef` for a DeviceArray, torch tensor, CUDA-array-interface object or DLPack producer."""
    t = type(obj)
    if t is DeviceArray:
        return obj.tensor_ref()
    if t is TensorRef:
        return obj
    if is_torch_tensor(obj):  # the common case first: one isinstance instead of four attribute probes
        return _from_torch(obj, name)
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda") and hasattr(obj, "stride") and hasattr(obj, "dtype"):
        return _from_torch(obj, name)
    if isinstance(obj, DeviceArray):
        return obj.tensor_ref()
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    except (TypeError, BufferError, ValueError, RuntimeError):  # e.g. torch bf16: try DLPack next
        cai = None
    if cai is not None:
        return _from_cai(cai, obj, name)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, name)
    if _is_capsule(obj):
        return parse_dlpack_capsule(obj, name)
    if isinstance(obj, np.ndarray):
        raise ValueError(f"{name}: numpy array is host (CPU) memory; vkc kernels need CUDA device memory "
                         f"(use vkc_runtime.DeviceArray.from_numpy)")
    raise TypeError(f"{name}: cannot use {t.__module__}.{t.__qualname__} as a device tensor; pass a "
                    f"vkc DeviceArray, a torch CUDA tensor, or an object with __cuda_array_interface__ or __dlpack__")
