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
"""
from __future__ import annotations

import ctypes
import math
import sys
import weakref
from typing import Any, Sequence

import numpy as np

from . import driver

__all__ = [
    "DTYPES", "DeviceArray", "TensorRef", "as_tensor", "dtype_name", "itemsize", "to_bf16_bits",
    "from_bf16_bits", "empty", "zeros", "full", "from_numpy", "parse_dlpack_capsule",
]

# name -> (itemsize, CAI typestr, (DLPack code, bits), numpy dtype or None)
DTYPES: dict[str, tuple[int, str, tuple[int, int], Any]] = {
    "bfloat16": (2, "<V2", (4, 16), None),
    "float16": (2, "<f2", (2, 16), np.dtype("float16")),
    "float32": (4, "<f4", (2, 32), np.dtype("float32")),
    "float64": (8, "<f8", (2, 64), np.dtype("float64")),
    "int8": (1, "|i1", (0, 8), np.dtype("int8")),
    "uint8": (1, "|u1", (1, 8), np.dtype("uint8")),
    "int16": (2, "<i2", (0, 16), np.dtype("int16")),
    "uint16": (2, "<u2", (1, 16), np.dtype("uint16")),
    "int32": (4, "<i4", (0, 32), np.dtype("int32")),
    "uint32": (4, "<u4", (1, 32), np.dtype("uint32")),
    "int64": (8, "<i8", (0, 64), np.dtype("int64")),
    "uint64": (8, "<u8", (1, 64), np.dtype("uint64")),
    "bool": (1, "|b1", (6, 8), np.dtype("bool")),
    "float8_e4m3fn": (1, "|V1", (10, 8), None),
    "float8_e5m2": (1, "|V1", (12, 8), None),
}
_DL_TO_NAME = {v[2]: k for k, v in DTYPES.items()}
_DL_TO_NAME[(1, 8)] = "uint8"
# CAI typestr (byte order normalised to '<') -> name. "<V2" is read as bfloat16: torch (2.11 seen on the
# H200), ml_dtypes and vkc all describe bf16 that way. "|V1" (fp8) stays ambiguous (e4m3 or e5m2): refused.
_TYPESTR = {v[1].replace("|", "<"): k for k, v in DTYPES.items() if not v[1].endswith("V1")}
_TYPESTR["<u1"] = "uint8"
_TYPESTR["<b1"] = "bool"

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_DEVICE_NAMES = {1: "host (CPU) memory", 2: "CUDA", 3: "CUDA pinned host memory", 4: "OpenCL", 7: "Vulkan",
                    8: "Metal", 10: "ROCm", 11: "ROCm host memory", 13: "CUDA managed memory", 14: "oneAPI"}


def dtype_name(dtype) -> str:
    """Canonical vkc dtype name of a name, numpy dtype, torch dtype or ml_dtypes dtype."""
    if isinstance(dtype, str):
        n = dtype.replace("torch.", "")
        n = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
             "fp64": "float64", "double": "float64", "i1": "bool", "bool_": "bool"}.get(n, n)
        if n in DTYPES:
            return n
        raise TypeError(f"unsupported dtype {dtype!r}; vkc knows {', '.join(DTYPES)}")
    if isinstance(dtype, np.dtype) or isinstance(dtype, type):
        d = np.dtype(dtype)
        if d.name in DTYPES:
            return d.name
        raise TypeError(f"unsupported dtype {d!r}; vkc knows {', '.join(DTYPES)}")
    return dtype_name(str(dtype))


def itemsize(name: str) -> int:
    return DTYPES[name][0]


def to_bf16_bits(a) -> np.ndarray:
    """float array -> uint16 bfloat16 bits (float32 rounding, then round to nearest even; NaN stays NaN)."""
    b = np.ascontiguousarray(np.asarray(a, dtype=np.float32)).view(np.uint32)
    rounded = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = ((b >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return np.where(nan, quiet, rounded)


def from_bf16_bits(bits) -> np.ndarray:
    """uint16 bfloat16 bits -> float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(out))


# ----------------------------------------------------------------------------------- TensorRef
class TensorRef:
    """A borrowed view of device memory: what ops validate and launch with."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "keepalive")

    def __init__(self, ptr: int, shape: tuple, strides: tuple, dtype: str, device: int = -1, keepalive: Any = None):
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        self.device = device
        self.keepalive = keepalive

    def __repr__(self) -> str:
        return (f"TensorRef(ptr={self.ptr:#x}, shape={self.shape}, strides={self.strides}, dtype={self.dtype!r}, "
                f"device={self.device})")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][0]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        exp = 1
        for s, st in zip(reversed(self.shape), reversed(self.strides)):
            if s != 1 and st != exp:
                return False
            exp *= s
        return True

    def check(self, op: str, name: str, *, dtype=None, ndim: int | None = None, shape=None,
              contiguous: bool = False, align: int = 0, device: int | None = None) -> "TensorRef":
        """Validate for an op; raises TypeError/ValueError naming ``op``, ``name`` and what was expected.

        ``dtype``: a name or a collection of names; ``shape``: a tuple where ``None`` entries match anything;
        ``align``: required byte alignment of ``ptr``; ``device``: required ordinal (-1/unknown passes).
        """
        where = f"{op}: {name}"
        if dtype is not None:
            ok = (dtype,) if isinstance(dtype, str) else tuple(dtype)
            if self.dtype not in ok:
                raise TypeError(f"{where} has dtype {self.dtype}, expected {' or '.join(ok)}")
        if ndim is not None and self.ndim != ndim:
            raise ValueError(f"{where} has {self.ndim} dims (shape {self.shape}), expected {ndim}")
        if shape is not None:
            if len(shape) != self.ndim or any(e is not None and e != s for e, s in zip(shape, self.shape)):
                want = "(" + ", ".join("*" if e is None else str(e) for e in shape) + ")"
                raise ValueError(f"{where} has shape {self.shape}, expected {want}")
        if contiguous and not self.is_contiguous():
            raise ValueError(f"{where} must be contiguous (row-major), has strides {self.strides} for shape "
                             f"{self.shape}")
        if align and self.ptr % align:
            raise ValueError(f"{where} data pointer {self.ptr:#x} is not {align}-byte aligned")
        if device is not None and self.device >= 0 and self.device != device:
            raise ValueError(f"{where} is on CUDA device {self.device}, expected device {device}")
        return self


# ----------------------------------------------------------------------------------- DeviceArray
def _free_device(ptr: int, ctx: int) -> None:
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
        self.ptr = int(driver.call(driver.cu.cuMemAlloc, n, detail=f"allocating {n} bytes")) if n else 0
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


# ----------------------------------------------------------------------------------- DLPack parsing
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_capi: list = []


def _capsule_api():
    if not _capi:
        api = ctypes.pythonapi
        get_name = api.PyCapsule_GetName
        get_name.restype = ctypes.c_char_p
        get_name.argtypes = [ctypes.py_object]
        get_ptr = api.PyCapsule_GetPointer
        get_ptr.restype = ctypes.c_void_p
        get_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
        is_cap = api.PyCapsule_CheckExact if hasattr(api, "PyCapsule_CheckExact") else None
        _capi.extend([get_name, get_ptr, is_cap])
    return _capi


def _is_capsule(obj) -> bool:
    return type(obj).__name__ == "PyCapsule"


def _reject_device(name: str, dev_type: int) -> None:
    what = _DL_DEVICE_NAMES.get(dev_type, f"DLPack device type {dev_type}")
    hint = " (move it to the GPU first, e.g. .cuda())" if dev_type in (_DL_CPU, _DL_CUDA_HOST) else ""
    raise ValueError(f"{name}: tensor lives in {what}; vkc kernels need CUDA device memory{hint}")


def parse_dlpack_capsule(capsule, name: str = "tensor", keepalive: Any = None) -> TensorRef:
    """Read a ``dltensor`` / ``dltensor_versioned`` capsule into a TensorRef (the capsule is kept alive,
    not consumed). Rejects non-CUDA memory."""
    get_name, get_ptr, _ = _capsule_api()
    cname = get_name(capsule)
    if cname == b"dltensor":
        addr = get_ptr(capsule, cname)
        t = _DLManagedTensor.from_address(addr).dl_tensor
    elif cname == b"dltensor_versioned":
        addr = get_ptr(capsule, cname)
        mv = _DLManagedTensorVersioned.from_address(addr)
        if mv.version.major != 1:
            raise BufferError(f"{name}: DLPack major version {mv.version.major} is not supported (need 1)")
        t = mv.dl_tensor
    else:
        raise BufferError(f"{name}: capsule named {cname!r} is not an unconsumed DLPack tensor")
    dev_type, dev_id = int(t.device.device_type), int(t.device.device_id)
    if dev_type not in (_DL_CUDA, _DL_CUDA_MANAGED):
        _reject_device(name, dev_type)
    if t.dtype.lanes != 1:
        raise TypeError(f"{name}: vectorised DLPack dtypes (lanes={t.dtype.lanes}) are not supported")
    dt = _DL_TO_NAME.get((int(t.dtype.code), int(t.dtype.bits)))
    if dt is None:
        raise TypeError(f"{name}: unsupported DLPack dtype code={t.dtype.code} bits={t.dtype.bits}")
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    strides = tuple(int(t.strides[i]) for i in range(ndim)) if t.strides else _c_strides(shape)
    ptr = int(t.data or 0) + int(t.byte_offset)
    return TensorRef(ptr, shape, strides, dt, dev_id, (capsule, keepalive))


# ----------------------------------------------------------------------------------- as_tensor
_torch_dtype_names: dict[Any, str] = {}


def _torch_dtype(dt, name: str) -> str:
    n = _torch_dtype_names.get(dt)
    if n is None:
        s = str(dt)
        try:
            n = dtype_name(s[6:] if s.startswith("torch.") else s)
        except TypeError:
            raise TypeError(f"{name}: unsupported tensor dtype {s}; vkc knows {', '.join(DTYPES)}") from None
        _torch_dtype_names[dt] = n
    return n


def _from_torch(t, name: str) -> TensorRef:
    if not t.is_cuda:
        dev = getattr(t, "device", "?")
        raise ValueError(f"{name}: tensor is on {dev}, not a CUDA device; vkc kernels need CUDA device memory "
                         f"(move it with .cuda())")
    get_device = getattr(t, "get_device", None)  # one call instead of t.device.index (builds a device object)
    dev = get_device() if get_device is not None else t.device.index
    return TensorRef(t.data_ptr(), tuple(t.shape), tuple(t.stride()), _torch_dtype(t.dtype, name),
                     -1 if dev is None else dev, t)


_torch_tensor: list = [None]  # torch.Tensor once torch is imported by the caller (vkc never imports torch)


def _is_torch_tensor(obj) -> bool:
    tt = _torch_tensor[0]
    if tt is None:
        torch = sys.modules.get("torch")
        tt = _torch_tensor[0] = getattr(torch, "Tensor", None) if torch is not None else None
        if tt is None:
            return False
    return isinstance(obj, tt)


def torch_source(ref: TensorRef):
    """The torch (or torch-like: data_ptr/shape/stride/dtype/is_cuda/get_device) tensor ``ref`` was read from,
    else None. Such a tensor's metadata can be re-read cheaply, which is what a bound call
    (:func:`vkc_runtime.bound.bind_call`) guards on."""
    k = ref.keepalive
    if k is None or type(k) is tuple:
        return None
    if _is_torch_tensor(k):
        return k
    if all(hasattr(k, a) for a in ("data_ptr", "is_cuda", "stride", "dtype", "get_device", "shape")):
        return k
    return None


def _from_cai(cai: dict, obj, name: str) -> TensorRef:
    try:
        shape = tuple(int(s) for s in cai["shape"])
        typestr = cai["typestr"]
        ptr = int(cai["data"][0] or 0)
    except (KeyError, TypeError, IndexError, ValueError):
        raise TypeError(f"{name}: malformed __cuda_array_interface__: {cai!r}") from None
    if cai.get("mask") is not None:
        raise TypeError(f"{name}: masked arrays are not supported")
    ts = typestr.replace("|", "<").replace("=", "<")
    if ts.startswith(">") and ts[1:] not in ("i1", "u1", "b1"):
        raise TypeError(f"{name}: big-endian dtype {typestr!r} is not supported")
    dt = _TYPESTR.get("<" + ts[1:])
    if dt is None:
        raise TypeError(f"{name}: unsupported __cuda_array_interface__ typestr {typestr!r}"
                        + ("; fp8 tensors must come through DLPack or a torch tensor" if ts[1:] == "V1" else ""))
    isz = DTYPES[dt][0]
    st = cai.get("strides")
    if st is None:
        strides = _c_strides(shape)
    else:
        if len(st) != len(shape) or any(int(s) % isz for s in st):
            raise ValueError(f"{name}: byte strides {tuple(st)} are not multiples of the {isz}-byte item size")
        strides = tuple(int(s) // isz for s in st)
    return TensorRef(ptr, shape, strides, dt, -1, obj)


def _from_dlpack(obj, name: str) -> TensorRef:
    try:
        dev_type, dev_id = obj.__dlpack_device__()
    except Exception as e:
        raise TypeError(f"{name}: __dlpack_device__() failed: {e}") from None
    dev_type = int(dev_type)
    if dev_type not in (_DL_CUDA, _DL_CUDA_MANAGED):
        _reject_device(name, dev_type)
    try:
        cap = obj.__dlpack__(stream=-1)  # -1: no producer-side synchronisation (see module doc)
    except TypeError:
        cap = obj.__dlpack__()
    return parse_dlpack_capsule(cap, name, obj)


def as_tensor(obj, name: str = "tensor") -> TensorRef:
    """A :class:`TensorRef` for a DeviceArray, torch tensor, CUDA-array-interface object or DLPack producer."""
    t = type(obj)
    if t is DeviceArray:
        return obj.tensor_ref()
    if t is TensorRef:
        return obj
    if _is_torch_tensor(obj):  # the common case first: one isinstance instead of four attribute probes
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
