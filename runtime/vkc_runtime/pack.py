"""Triton's launch ABI in Python: the argument packer, the grid check and the cuda-bindings launcher.

The native launcher (``csrc/launcher.cpp``, :mod:`vkc_runtime.native`) owns the ABI on the launch path; this
module is its Python twin, kept for two reasons: the fallback where the native module is not built or
``VKC_NATIVE=0`` is set, and the oracle the CPU tests compare the native packer against byte for byte
(``tests/test_runtime_launch.py``). The duplicated pieces -- value conversion and range checks, bfloat16
rounding, the parameter layout, the grid limits -- must change together in both places.

Layout: each parameter sits at an offset aligned to its size (1/2/4/8), padding is zero, a ``void*[]``
points at each one; the hidden scratch pointers follow the visible parameters (ARCHITECTURE.md, "Launch ABI").
"""
from __future__ import annotations

import ctypes
import operator
import struct
import threading
from typing import Any, Sequence

from vkc_contract import abi

from . import driver
from .errors import CudaError, LaunchError

__all__ = ["pack_args", "pack_value", "param_layout", "bf16_bits", "ParamBuffer", "PyLauncher", "check_grid",
           "grid3", "MAX_GRID_X", "MAX_GRID_YZ"]

MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535


# ----------------------------------------------------------------------------------- Python packer
_INT_RANGE = {
    "p": (0, 2**64 - 1), "b": (-2**7, 2**7 - 1), "B": (0, 2**8 - 1), "h": (-2**15, 2**15 - 1),
    "H": (0, 2**16 - 1), "i": (-2**31, 2**31 - 1), "I": (0, 2**32 - 1), "q": (-2**63, 2**63 - 1),
    "Q": (0, 2**64 - 1),
}
_CTYPE = {"p": "pointer", "?": "i1", "b": "i8", "B": "u8", "h": "i16", "H": "u16", "i": "i32", "I": "u32",
          "q": "i64", "Q": "u64", "e": "fp16", "E": "bf16", "f": "fp32", "d": "fp64"}
# struct format of each code's converted value
_FMT = {"p": "Q", "?": "B", "b": "b", "B": "B", "h": "h", "H": "H", "i": "i", "I": "I", "q": "q", "Q": "Q",
        "e": "e", "E": "H", "f": "f", "d": "d"}
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_F16 = struct.Struct("<e")


def _where(kernel: str, name: str) -> str:
    return f"{kernel}: argument '{name}'"


def bf16_bits(x: float) -> int:
    """bfloat16 bits of ``x``: the float32 value's bits rounded to nearest even (NaN stays a quiet NaN)."""
    b = _U32.unpack(_F32.pack(x))[0]
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return ((b >> 16) | 0x40) & 0xFFFF
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def _convert(code: str, v: Any, name: str, kernel: str, div: int) -> Any:
    """A Python value -> what ``struct`` packs for ``code`` (validating type, range and divisibility)."""
    if code in _INT_RANGE or code == "?":
        if code == "p" and v is None:
            iv = 0
        else:
            if isinstance(v, float) or not hasattr(type(v), "__index__"):
                raise TypeError(f"{_where(kernel, name)} ({_CTYPE[code]}) expects an int, got {type(v).__name__}")
            iv = operator.index(v)
        if code == "?":
            return 1 if iv else 0
        lo, hi = _INT_RANGE[code]
        if not lo <= iv <= hi:
            raise ValueError(f"{_where(kernel, name)} = {v!r} is out of range for {_CTYPE[code]}")
        if div > 1 and iv % div:
            if code == "p":
                raise ValueError(f"{_where(kernel, name)} = {iv:#x} is not {div}-byte aligned, but this kernel "
                                 f"specialization was compiled for {div}-aligned pointers (tt.divisibility={div})")
            raise ValueError(f"{_where(kernel, name)} = {iv} is not a multiple of {div}, but this kernel "
                             f"specialization was compiled for multiples of {div} (tt.divisibility={div})")
        return iv
    if code not in _FMT:
        raise ValueError(f"{_where(kernel, name)}: unknown pack code {code!r}")
    if isinstance(v, (str, bytes, bytearray)):
        raise TypeError(f"{_where(kernel, name)} ({_CTYPE[code]}) expects a float, got {type(v).__name__}")
    try:
        x = float(v)
    except OverflowError:
        raise ValueError(f"{_where(kernel, name)} = {v!r} is out of range for {_CTYPE[code]}") from None
    except (TypeError, ValueError):
        raise TypeError(f"{_where(kernel, name)} ({_CTYPE[code]}) expects a float, got {type(v).__name__}") from None
    if code == "d":
        return x
    try:
        if code == "e":
            _F16.pack(x)
            return x
        _F32.pack(x)  # OverflowError for finite values beyond float32 (as the C cast check)
    except (OverflowError, struct.error):
        raise ValueError(f"{_where(kernel, name)} = {v!r} is out of range for {_CTYPE[code]}") from None
    if code == "f":
        return x
    return bf16_bits(x)


def param_layout(codes: str) -> tuple[list[int], int]:
    """Offsets of each parameter (aligned to its size) and the total byte size."""
    offs, off = [], 0
    for c in codes:
        s = abi.PACK_SIZES.get(c)
        if s is None:
            raise ValueError(f"unknown pack code {c!r}")
        off = (off + s - 1) // s * s
        offs.append(off)
        off += s
    return offs, off


def _struct_for(codes: str) -> struct.Struct:
    offs, total = param_layout(codes)
    fmt, pos = ["<"], 0
    for c, o in zip(codes, offs):
        if o > pos:
            fmt.append(f"{o - pos}x")
        fmt.append(_FMT[c])
        pos = o + abi.PACK_SIZES[c]
    return struct.Struct("".join(fmt))


def _codes_names_divs(params) -> tuple[str, list[str], list[int]]:
    if isinstance(params, str):
        return params, [f"#{i}" for i in range(len(params))], [0] * len(params)
    codes, names, divs = [], [], []
    for i, p in enumerate(params):
        if isinstance(p, str):
            codes.append(p)
            names.append(f"#{i}")
            divs.append(0)
        else:
            codes.append(p["code"])
            names.append(p.get("name", f"#{i}"))
            divs.append(int(p.get("divisibility") or 0))
    return "".join(codes), names, divs


def pack_value(code: str, value: Any, name: str = "#0", kernel: str = "pack", div: int = 0) -> bytes:
    """The bytes of one parameter value (no alignment padding)."""
    return struct.pack("<" + _FMT[code], _convert(code, value, name, kernel, div))


def pack_args(params, values: Sequence[Any], *, kernel: str = "pack") -> bytes:
    """Pack ``values`` by ``params`` (a pack-code string or manifest param dicts) into the launch layout.

    Byte-for-byte what the native launcher puts in its parameter buffer (``_native.pack``). Checks
    types, ranges and, for param dicts, ``divisibility`` promises.
    """
    codes, names, divs = _codes_names_divs(params)
    values = tuple(values)
    if len(values) != len(codes):
        raise TypeError(f"{kernel}: expected {len(codes)} values, got {len(values)}")
    conv = [_convert(c, v, n, kernel, d) for c, v, n, d in zip(codes, values, names, divs)]
    return _struct_for(codes).pack(*conv)


class ParamBuffer:
    """A persistent parameter buffer + ``void*[]`` for ``cuLaunchKernel(..., kernelParams=address)``.

    Not thread safe by itself; :class:`PyLauncher` serialises use with a lock (the driver copies the
    parameters during the launch call, so the buffer may be reused right after it returns).
    """

    def __init__(self, codes: str):
        self.codes = codes
        self.offsets, self.total = param_layout(codes)
        self._struct = _struct_for(codes)
        self._buf = ctypes.create_string_buffer(max(self.total, 8))
        base = ctypes.addressof(self._buf)
        n = max(len(codes), 1)
        self._ptrs = (ctypes.c_void_p * n)(*[base + o for o in self.offsets])
        self.address = ctypes.addressof(self._ptrs)  # the void** handed to the driver

    def fill(self, converted: Sequence[Any]) -> None:
        self._struct.pack_into(self._buf, 0, *converted)

    def raw(self) -> bytes:
        return bytes(self._buf.raw[: self.total])

    def pointers(self) -> list[int]:
        return [int(p or 0) for p in self._ptrs[: len(self.codes)]]


# ----------------------------------------------------------------------------------- Python launcher
class PyLauncher:
    """The cuda-bindings fallback with the same interface and checks as ``_native.Launcher``."""

    def __init__(self, function, codes: str, names: list[str], divisibility: list[int], n_hidden: int, block_x: int,
                 shared: int, num_ctas: int, pdl: bool, cooperative: bool, kernel_name: str):
        self.function = function
        self.codes = codes
        self.names = names
        self.divs = divisibility
        self.n_visible = len(codes) - n_hidden
        self.block_x, self.shared, self.num_ctas = block_x, shared, num_ctas
        self.name = kernel_name
        self._buf = ParamBuffer(codes)
        self._lock = threading.Lock()
        self._vis = list(zip(codes[: self.n_visible], names[: self.n_visible], divisibility[: self.n_visible]))
        self._n_hidden = n_hidden
        self._attrs: list[tuple[str, Any]] = []
        if num_ctas > 1:
            self._attrs.append(("cluster", num_ctas))
            self._attrs.append(("spread", 1))
        if pdl:
            self._attrs.append(("pdl", 1))
        if cooperative:
            self._attrs.append(("cooperative", 1))
        self.uses_ex = bool(self._attrs)
        self._config = self._make_config() if self.uses_ex else None

    def _make_config(self):
        cu = driver.cu
        ids = cu.CUlaunchAttributeID
        attrs = []
        for kind, val in self._attrs:
            a = cu.CUlaunchAttribute()
            if kind == "cluster":
                a.id = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
                a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = val, 1, 1
            elif kind == "spread":
                a.id = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
                a.value.clusterSchedulingPolicyPreference = \
                    cu.CUclusterSchedulingPolicy.CU_CLUSTER_SCHEDULING_POLICY_SPREAD
            elif kind == "pdl":
                a.id = ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                a.value.programmaticStreamSerializationAllowed = 1
            else:
                a.id = ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
                a.value.cooperative = 1
            attrs.append(a)
        cfg = cu.CUlaunchConfig()
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block_x, 1, 1
        cfg.sharedMemBytes = self.shared
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        return cfg

    def launch(self, gx: int, gy: int, gz: int, stream: int, args: tuple, scratch: int) -> None:
        if len(args) != self.n_visible:
            raise TypeError(f"{self.name} takes {self.n_visible} arguments ("
                            f"{', '.join(self.names[: self.n_visible])}), got {len(args)}")
        check_grid(self.name, gx, gy, gz, self.num_ctas)
        conv = [_convert(c, v, n, self.name, d) for (c, n, d), v in zip(self._vis, args)]
        if self._n_hidden:
            conv.append(int(scratch))
            conv.extend([0] * (self._n_hidden - 1))
        if gx == 0 or gy == 0 or gz == 0:
            return
        cu = driver.cu
        with self._lock:
            self._buf.fill(conv)
            if self._config is None:
                call = "cuLaunchKernel"
                res = _raw(cu.cuLaunchKernel, self.function, gx * self.num_ctas, gy, gz, self.block_x, 1, 1,
                           self.shared, stream, self._buf.address, 0)
            else:
                call = "cuLaunchKernelEx"
                cfg = self._config
                cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx * self.num_ctas, gy, gz
                cfg.hStream = stream
                res = _raw(cu.cuLaunchKernelEx, cfg, self.function, self._buf.address, 0)
        err = res[0] if isinstance(res, tuple) else res
        if err != driver._SUCCESS:
            raise CudaError(driver._error_name(err), int(err), call, _detail(self, gx, gy, gz, stream))


def _raw(fn, *args):
    try:
        return fn(*args)
    except driver._BOUNDARY_ERRORS as e:
        raise driver._lib_failure(e, getattr(fn, "__name__", "cuda")) from e


def _detail(l, gx, gy, gz, stream) -> str:
    return (f"kernel {l.name} grid=({gx}, {gy}, {gz}) num_ctas={l.num_ctas} block={l.block_x} "
            f"shared={l.shared} stream={int(stream):#x}")


def check_grid(name: str, gx: int, gy: int, gz: int, num_ctas: int) -> None:
    if gx < 0 or gy < 0 or gz < 0:
        raise LaunchError(f"{name}: negative grid ({gx}, {gy}, {gz})")
    if gx * num_ctas > MAX_GRID_X or gy > MAX_GRID_YZ or gz > MAX_GRID_YZ:
        raise LaunchError(f"{name}: grid ({gx}, {gy}, {gz}) x num_ctas {num_ctas} exceeds the CUDA limits "
                          f"(x*num_ctas < 2^31, y <= 65535, z <= 65535)")


def grid3(name: str, grid) -> tuple[int, int, int]:
    if isinstance(grid, int) or hasattr(type(grid), "__index__"):
        return operator.index(grid), 1, 1
    try:
        g = [operator.index(v) for v in grid]
    except TypeError:
        raise TypeError(f"{name}: grid must be an int or a tuple of 1-3 ints, got {grid!r}") from None
    if not 1 <= len(g) <= 3:
        raise TypeError(f"{name}: grid must have 1-3 dimensions, got {grid!r}")
    g += [1] * (3 - len(g))
    return g[0], g[1], g[2]
