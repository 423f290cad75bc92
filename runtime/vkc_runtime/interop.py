"""Foreign tensors -> :class:`~vkc_runtime.tensor.TensorRef`: torch (duck-typed), ``__cuda_array_interface__``
and DLPack (producers and raw capsules). :func:`vkc_runtime.memory.as_tensor` picks the adapter; the accepted
forms and their rules are listed in :mod:`vkc_runtime.memory`'s docstring.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Any

from . import deferred, driver
from .tensor import (DTYPES, TensorRef, _c_strides, _DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED,
                     _DL_DEVICE_NAMES, _DL_TO_NAME, _TYPESTR, dtype_name)

__all__ = ["parse_dlpack_capsule", "torch_source", "is_torch_tensor"]


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


# ----------------------------------------------------------------------------------- torch, CAI, DLPack producers
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


def is_torch_tensor(obj) -> bool:
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
    if is_torch_tensor(k):
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


# ------------------------------------------------------------------- other allocators' cached memory
def _release_torch_cache() -> bool:
    """torch's caching allocator keeps freed blocks reserved: hand them back to the driver (never while a graph
    is captured -- torch's current stream or a vkc capture -- where a free would invalidate the capture). vkc
    never imports torch itself."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or deferred.active() or not cuda.is_initialized() or cuda.is_current_stream_capturing():
        return False
    cuda.empty_cache()
    return True


def _release_cupy_pool() -> bool:
    """CuPy's default memory pool likewise keeps freed blocks: free them (only when CuPy is already imported, and
    not during a vkc capture)."""
    cupy = sys.modules.get("cupy")
    if cupy is None or deferred.active() or not hasattr(cupy, "get_default_memory_pool"):
        return False
    cupy.get_default_memory_pool().free_all_blocks()
    return True


driver.on_out_of_memory(_release_torch_cache)
driver.on_out_of_memory(_release_cupy_pool)
