"""vkc's dtype names and :class:`TensorRef`, the borrowed view of device memory the ops validate and launch with.

dtype names: ``bfloat16 float16 float32 float64 int8 uint8 int16 uint16 int32 uint32 int64 uint64 bool
float8_e4m3fn float8_e5m2``; :data:`DTYPES` maps each to its item size, CUDA-array-interface typestr, DLPack
(code, bits) and numpy dtype.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

__all__ = ["DTYPES", "TensorRef", "dtype_name", "itemsize", "to_bf16_bits", "from_bf16_bits"]

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
