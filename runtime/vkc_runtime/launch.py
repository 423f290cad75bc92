"""Load vendored cubins and launch them with Triton's ABI (DESIGN.md section 3).

* :func:`get_kernel` -> :class:`Kernel` (one compiled base in one CUDA context; cached per
  ``(context, arch, base)``). The cubin is loaded lazily on the first launch, after its sha256 was
  checked against the manifest.
* :meth:`Kernel.launch` ``(grid, args, stream=0)``: ``args`` are the kernel's *visible* parameters in
  declaration order (pointers as ints, scalars as ints/floats); the two hidden scratch pointers are
  appended by vkc.
* One packing contract, two implementations: :func:`pack_args` (Python, ``struct``) and the native
  launcher ``vkc_runtime._native`` (``csrc/launcher.cpp``); each parameter sits at an offset aligned to
  its size (1/2/4/8), padding is zero, a ``void*[]`` points at each one. ``VKC_NATIVE=0`` forces the
  Python path (``cuLaunchKernel`` of cuda-bindings with the pre-packed ``void**`` address).
"""
from __future__ import annotations

import ctypes
import operator
import os
import struct
import threading
import weakref
from typing import Any, Sequence

from vkc_contract import abi

from . import artifacts, driver
from .artifacts import ArtifactSet, LaunchSpec
from .errors import ArtifactError, CudaError, LaunchError, MissingKernelError
from .memory import TensorRef, torch_source

__all__ = [
    "Kernel", "get_kernel", "has_kernel", "clear_cache", "pack_args", "pack_value", "param_layout", "ParamBuffer",
    "ScratchPool", "scratch_nbytes", "native_available", "native_reason", "SMEM_DEFAULT_LIMIT",
    "MAX_GRID_X", "MAX_GRID_YZ", "run_launches", "bind_call", "CallCache", "fastpath_enabled",
    "clear_bound_calls",
]

SMEM_DEFAULT_LIMIT = 48 * 1024  # above this a kernel must opt in (cuFuncSetAttribute)
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535

# ----------------------------------------------------------------------------------- native module
try:
    from . import _native  # type: ignore[attr-defined]
    _NATIVE_REASON: str | None = None
    _native._set_exception_types(CudaError, LaunchError)
except Exception as _e:  # ImportError when not built; anything else is reported by doctor
    _native = None  # type: ignore[assignment]
    _NATIVE_REASON = f"{type(_e).__name__}: {_e}"


def native_reason() -> str | None:
    """Why the native launcher is not used (None when it is)."""
    if _native is None:
        return _NATIVE_REASON
    if os.environ.get("VKC_NATIVE", "1").strip() == "0":
        return "disabled by VKC_NATIVE=0"
    return None


def native_available() -> bool:
    return native_reason() is None


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

    Not thread safe by itself; :class:`_PyLauncher` serialises use with a lock (the driver copies the
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
class _PyLauncher:
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
        _check_grid(self.name, gx, gy, gz, self.num_ctas)
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


def _check_grid(name: str, gx: int, gy: int, gz: int, num_ctas: int) -> None:
    if gx < 0 or gy < 0 or gz < 0:
        raise LaunchError(f"{name}: negative grid ({gx}, {gy}, {gz})")
    if gx * num_ctas > MAX_GRID_X or gy > MAX_GRID_YZ or gz > MAX_GRID_YZ:
        raise LaunchError(f"{name}: grid ({gx}, {gy}, {gz}) x num_ctas {num_ctas} exceeds the CUDA limits "
                          f"(x*num_ctas < 2^31, y <= 65535, z <= 65535)")


def _grid3(name: str, grid) -> tuple[int, int, int]:
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


# ----------------------------------------------------------------------------------- scratch
def scratch_nbytes(gx: int, gy: int, gz: int, num_ctas: int, size: int) -> int:
    """Global scratch a launch needs: one ``size`` slice per CTA (Triton's rule)."""
    return gx * gy * gz * num_ctas * size


class ScratchPool:
    """Global-scratch buffers of one context, one per stream, grown only outside stream capture.

    The launch path is one dict lookup: a buffer that fits is handed out without asking the driver whether
    the stream is capturing (that query cost ~2-3 us of host time per launch). Since any buffer handed out
    may therefore be baked into a CUDA graph, a buffer that must grow is retired (kept alive for the
    context's lifetime), never freed; growth is geometric (``max(need, 2 * old)``), so the retired buffers
    together stay below the live one. Growth during capture is refused (the graph would bake a pointer the
    eager path later replaces): run the same launches once eagerly first.
    Launches on *different* streams never share a buffer; a graph replayed on a stream other than the
    one it was captured on shares the capture stream's buffer (do not run both concurrently).
    """

    def __init__(self, ctx: int = 0, *, alloc=None, is_capturing=None):
        self.ctx = ctx
        self._alloc = alloc or _mem_alloc
        self._is_capturing = is_capturing or _stream_is_capturing
        self._bufs: dict[int, tuple[int, int]] = {}  # stream -> (ptr, nbytes)
        self.retired: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def get(self, nbytes: int, align: int, stream: int, *, what: str = "kernel") -> int:
        if nbytes <= 0:
            return 0
        align = max(1, int(align))
        need = nbytes + (align - 1 if align > 256 else 0)  # cuMemAlloc is 256-byte aligned
        buf = self._bufs.get(stream)
        if buf is None or buf[1] < need:
            with self._lock:
                buf = self._bufs.get(stream)
                if buf is None or buf[1] < need:
                    if self._is_capturing(stream):
                        have = 0 if buf is None else buf[1]
                        raise LaunchError(
                            f"{what}: needs {nbytes} bytes of global scratch on stream {stream:#x}, the pool has "
                            f"{have}; the pool cannot grow during stream capture. Run the same launches once "
                            f"eagerly (outside capture) on this stream before capturing.")
                    size = max(need, 2 * (buf[1] if buf else 0))
                    if buf is not None:
                        self.retired.append(buf)
                    buf = self._bufs[stream] = (self._alloc(size), size)
        return (buf[0] + align - 1) // align * align

    def size(self, stream: int) -> int:
        b = self._bufs.get(stream)
        return 0 if b is None else b[1]


def _mem_alloc(n: int) -> int:
    return int(driver.call(driver.cu.cuMemAlloc, n))


def _stream_is_capturing(s: int) -> bool:
    st = driver.call(driver.cu.cuStreamIsCapturing, s)
    return int(st) != int(driver.cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)


_pools: dict[int, ScratchPool] = {}


def scratch_pool(ctx: int) -> ScratchPool:
    p = _pools.get(ctx)
    if p is None:
        p = _pools.setdefault(ctx, ScratchPool(ctx))
    return p


# ----------------------------------------------------------------------------------- Kernel
class Kernel:
    """One compiled base (a cubin of one arch) in one CUDA context."""

    def __init__(self, base: str, spec: LaunchSpec, aset: ArtifactSet, ctx: int, device: int = 0):
        self.base = base
        self.spec = spec
        self.artifacts = aset
        entry = aset.kernels.get(base, {})
        self.inputs: dict[str, Any] = dict(entry.get("inputs") or {})  # the manifest's compile inputs
        self.constexprs: dict[str, Any] = dict(self.inputs.get("constexprs") or {})  # e.g. BLOCK, baked in
        self.arch = aset.arch
        self.ctx = ctx
        self.device = device
        self.module = None
        self.function = None
        self.native = False
        self._launcher = None
        self._scratch_size = spec.global_scratch_size
        self._occupancy: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "loaded" if self._launcher is not None else "not loaded"
        return f"<vkc Kernel {self.base} {self.arch} ctx={self.ctx:#x} {state}>"

    @property
    def param_names(self) -> list[str]:
        return [p["name"] for p in self.spec.visible]

    @property
    def n_args(self) -> int:
        return self.spec.n_visible

    @property
    def loaded(self) -> bool:
        return self._launcher is not None

    # -- loading ----------------------------------------------------------------------------------
    def load(self):
        """Check sha256, ``cuModuleLoadData``, get the function, set attributes, build the launcher."""
        if self._launcher is not None:
            return self._launcher
        with self._lock:
            if self._launcher is not None:
                return self._launcher
            spec = self.spec
            if spec.profile_scratch_size > 0:
                raise ArtifactError(f"{self.base}: profile_scratch_size={spec.profile_scratch_size} (proton "
                                    f"instrumentation) is not supported by vkc_runtime; rebuild without it")
            path = self.artifacts.path(self.base)
            if path.suffix != ".cubin":
                raise ArtifactError(f"{self.base}: {path.name} is not a .cubin; vkc_runtime.launch loads Triton "
                                    f"cubins only")
            data = self.artifacts.read_verified(self.base)  # IntegrityError before the driver sees the bytes
            cu = driver.cu
            pushed = False
            if driver.current_context() != self.ctx:
                driver.call(cu.cuCtxPushCurrent, self.ctx)
                pushed = True
            try:
                self.module = driver.call(cu.cuModuleLoadData, data, detail=f"loading {path}")
                fn = driver.call(cu.cuModuleGetFunction, self.module, spec.name.encode(),
                                 detail=f"entry {spec.name!r} in {path}")
                self._configure(fn)
                self.function = fn
                self._launcher = self._make_launcher(fn)
            finally:
                if pushed:
                    driver.call(cu.cuCtxPopCurrent)
            return self._launcher

    def _configure(self, fn) -> None:
        cu = driver.cu
        FA = cu.CUfunction_attribute
        spec = self.spec
        max_threads = int(driver.call(cu.cuFuncGetAttribute, FA.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn))
        if max_threads < spec.block_x:
            raise LaunchError(f"{self.base}: needs {spec.block_x} threads per block (num_warps={spec.num_warps}) but "
                              f"the loaded function allows {max_threads} (too many registers for this device?)")
        if spec.num_ctas > 1:
            cc = driver.device_cc(self.device)
            if cc[0] < 9:
                raise LaunchError(f"{self.base}: num_ctas={spec.num_ctas} needs thread-block clusters (sm_90+), "
                                  f"device cc is {cc[0]}.{cc[1]}")
            if spec.num_ctas > 8:
                driver.call(cu.cuFuncSetAttribute, fn, FA.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        if spec.shared > SMEM_DEFAULT_LIMIT:
            optin = driver.max_smem_optin(self.device)
            static = int(driver.call(cu.cuFuncGetAttribute, FA.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn))
            if spec.shared + static > optin:
                raise LaunchError(
                    f"{self.base} ({self.arch}): needs {spec.shared} bytes of dynamic shared memory (+{static} static) "
                    f"per block, device {self.device} allows at most {optin} (MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
            driver.call(cu.cuFuncSetAttribute, fn, FA.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, spec.shared,
                        detail=f"{self.base}: opting into {spec.shared} bytes of dynamic shared memory")

    def _make_launcher(self, fn):
        spec = self.spec
        args = (spec.codes, list(spec.names), list(spec.divisibility), len(spec.hidden), spec.block_x, spec.shared,
                spec.num_ctas, spec.launch_pdl, spec.launch_cooperative_grid, self.base)
        if native_available():
            self.native = True
            return _native.Launcher(int(fn), *args)
        self.native = False
        return _PyLauncher(fn, *args)

    def max_active_blocks(self) -> int:
        """Resident CTAs per SM (cuOccupancyMaxActiveBlocksPerMultiprocessor with the launch's block size
        and dynamic shared memory): the wave size of a grid is this times the SM count. Cached."""
        n = self._occupancy
        if n is None:
            self.load()
            n = int(driver.call(driver.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor, self.function,
                                self.spec.block_x, self.spec.shared, detail=f"occupancy of {self.base}"))
            self._occupancy = n
        return n

    # -- launching --------------------------------------------------------------------------------
    def launch(self, grid, args, stream=0) -> None:
        """Launch on ``grid`` (int or 1-3 ints) with the visible ``args`` on ``stream`` (int handle or
        anything :func:`vkc_runtime.stream.resolve_stream` accepts; default: legacy stream 0)."""
        lau = self._launcher
        if lau is None:
            lau = self.load()
        if type(grid) is tuple and len(grid) == 3:
            gx, gy, gz = grid
        elif type(grid) is int:
            gx, gy, gz = grid, 1, 1
        else:
            gx, gy, gz = _grid3(self.base, grid)
        if type(stream) is not int:
            from .stream import resolve_stream
            stream = resolve_stream(stream)
        if type(args) is not tuple:
            args = tuple(args)
        scratch = self._scratch(gx, gy, gz, stream) if self._scratch_size else 0
        lau.launch(gx, gy, gz, stream, args, scratch)

    __call__ = launch

    def bind(self, grid, stream: int):
        """What a launch on ``grid`` / ``stream`` resolves to before its arguments: (launcher, gx, gy, gz,
        scratch pointer) -- :func:`bind_call` packs the arguments once and replays it."""
        lau = self._launcher or self.load()
        gx, gy, gz = _grid3(self.base, grid)
        _check_grid(self.base, gx, gy, gz, self.spec.num_ctas)
        return lau, gx, gy, gz, self._scratch(gx, gy, gz, stream)

    def _scratch(self, gx: int, gy: int, gz: int, stream: int) -> int:
        """The global-scratch pointer of a launch on this grid and stream (0: the kernel needs none / empty grid)."""
        if not self._scratch_size or gx <= 0 or gy <= 0 or gz <= 0:
            return 0
        _check_grid(self.base, gx, gy, gz, self.spec.num_ctas)
        n = scratch_nbytes(gx, gy, gz, self.spec.num_ctas, self._scratch_size)
        return scratch_pool(self.ctx).get(n, self.spec.global_scratch_align, stream, what=self.base)


# ----------------------------------------------------------------------------------- bound calls
# An op validates its inputs (dozens of Python-level checks, ~10-20 us of host time per call) and turns them into
# launches. A *bound call* records the facts that validation read -- per tensor: exact type, is_cuda, device,
# dtype, shape, strides and the pointer's alignment (capped at 16); per scalar: type and value; the CUDA
# context; the stream where a kernel uses global scratch; the relations between two tensors' pointers that
# validation checked (byte spans disjoint, or one pointer for both) -- together with the launches, their
# arguments packed once and the pointer arguments that come from each tensor. A later call with the same facts skips validation:
# the tensors' metadata is re-read (in C++ with the native launcher), compared, and the packed launches run with
# the new pointers. Every check an op does is a function of those facts (its kernel choice too: a pointer with
# at least the recorded alignment passes every alignment check the recorded one passed), so a replay launches
# exactly what validation would have -- and any difference makes run() return False so the op validates again.
# Only torch (or torch-like) tensors are guarded; calls with other inputs always validate. VKC_FASTPATH=0
# turns bound calls off.
def fastpath_enabled() -> bool:
    return os.environ.get("VKC_FASTPATH", "1").strip() != "0"


def _resolve(args) -> tuple:
    return tuple([a.ptr if type(a) is TensorRef else a for a in args])


def run_launches(launches, stream: int) -> None:
    """Launch ``[(kernel, grid, args)]`` in order; a :class:`TensorRef` in ``args`` stands for its pointer."""
    for k, grid, args in launches:
        k.launch(grid, _resolve(args), stream)


def _slot(ref: TensorRef):
    src = torch_source(ref)
    if src is None or ref.device < 0:
        return None
    p = ref.ptr
    align = 16
    while align > 1 and p % align:
        align //= 2
    return type(src), tuple(ref.shape), tuple(ref.strides), src.dtype, ref.device, align


class _PyBoundCall:
    """The reference implementation of a bound call (the native ``_native.BoundCall`` keeps the same contract);
    used without the native launcher and for kernels that are not :class:`Kernel` objects (tests)."""

    def __init__(self, ctx, slots, scalars, launches, relations=()):
        self.ctx, self.slots, self.scalars, self.launches = ctx, slots, scalars, launches
        self.relations = relations
        self.hits = 0

    def run(self, tensors, scalars, stream) -> bool:
        if len(tensors) != len(self.slots) or len(scalars) != len(self.scalars):
            return False
        ptrs = []
        try:
            for a, b in zip(scalars, self.scalars):
                if a is not b and (type(a) is not type(b) or not bool(a == b)):
                    return False
            if self.ctx and driver.current_context() != self.ctx:
                return False
            for t, (tp, shape, strides, dtype, dev, align) in zip(tensors, self.slots):
                if (type(t) is not tp or t.is_cuda is not True or t.get_device() != dev or t.dtype is not dtype
                        or tuple(t.shape) != shape or tuple(t.stride()) != strides):
                    return False
                p = t.data_ptr()
                if type(p) is not int or p < 0 or p % align:
                    return False
                ptrs.append(p)
        except Exception:  # a property or comparison that raised: the op's validation names it
            return False
        for kind, i, j, span_i, span_j in self.relations:
            a, b = ptrs[i], ptrs[j]
            if (a != b) if kind == _SAME else (a < b + span_j and b < a + span_i):
                return False
        self.hits += 1
        for k, grid, args, patches in self.launches:
            a = list(args)
            for i, si in patches:
                a[i] = ptrs[si]
            k.launch(grid, tuple(a), stream)
        return True


_DISJOINT, _SAME = 0, 1
_RELATIONS = {"disjoint": _DISJOINT, "same": _SAME}


def _span(ref: TensorRef) -> int:
    """Bytes from the first to one past the last element of ``ref`` (0 when empty)."""
    if any(n == 0 for n in ref.shape):
        return 0
    return (sum((n - 1) * abs(st) for n, st in zip(ref.shape, ref.strides)) + 1) * ref.itemsize


def bind_call(slots, scalars: tuple, launches, stream: int, relations=()):
    """A bound call for launches just made from validated inputs, or None when the call cannot be bound.

    ``slots``: the call's tensor arguments as the op read them (TensorRefs, in the order :meth:`run` will get
    the objects); ``scalars``: host values the op's choices depended on (compared by type and value);
    ``launches``: ``[(kernel, grid, args)]`` as given to :func:`run_launches` -- a TensorRef among ``args``
    that is one of ``slots`` (by identity) is re-read on every run, any other value is fixed; ``relations``:
    ``[("disjoint" | "same", a, b)]`` for two slots whose pointers validation compared (their byte spans do not
    overlap / they are one pointer), re-checked on every run."""
    if not fastpath_enabled():
        return None
    guards = []
    for r in slots:
        g = _slot(r)
        if g is None:
            return None
        guards.append(g)
    index = {id(r): i for i, r in enumerate(slots)}
    if len(index) != len(slots):
        return None
    rels = []
    for kind, a, b in relations:
        if id(a) not in index or id(b) not in index:
            return None
        rels.append((_RELATIONS[kind], index[id(a)], index[id(b)], _span(a), _span(b)))
    bound = []
    for k, grid, args in launches:
        patches = [(i, index[id(a)]) for i, a in enumerate(args) if type(a) is TensorRef and id(a) in index]
        bound.append((k, grid, _resolve(args), patches))
    kernels = [b[0] for b in bound]
    if _native is not None and native_available() and all(type(k) is Kernel and k.native for k in kernels):
        ctxs = {k.ctx for k in kernels}
        if len(ctxs) > 1 or len(guards) > 16:
            return None
        fixed_stream = -1
        nl = []
        for k, grid, args, patches in bound:
            lau, gx, gy, gz, scratch = k.bind(grid, stream)
            if scratch:
                fixed_stream = stream
            nl.append((lau, gx, gy, gz, args, patches, scratch))
        return _native.BoundCall(ctxs.pop() if ctxs else 0, guards, tuple(scalars), nl, fixed_stream, rels)
    ctx = kernels[0].ctx if kernels and all(type(k) is Kernel for k in kernels) else 0
    return _PyBoundCall(ctx, guards, tuple(scalars), bound, rels)


_call_caches: "weakref.WeakSet[CallCache]" = weakref.WeakSet()  # cleared by clear_cache()


class CallCache:
    """Bound calls of one op, a few per key (most recent first); the key holds what selects the op's code path
    besides the tensors (option values, workspace objects -- kept alive by the key, so identity is safe)."""

    def __init__(self, per_key: int = 4, max_keys: int = 64):
        self.per_key, self.max_keys = per_key, max_keys
        self._calls: dict = {}
        _call_caches.add(self)

    def run(self, key, tensors: tuple, scalars: tuple, stream: int) -> bool:
        try:
            calls = self._calls.get(key)
        except TypeError:  # an unhashable option value: never bound, the op validates (and names what is wrong)
            return False
        if calls:
            for c in calls:
                if c.run(tensors, scalars, stream):
                    return True
        return False

    def launch(self, key, slots, scalars: tuple, launches, stream: int, relations=()) -> None:
        """:func:`run_launches`, then record them as a bound call under ``key`` (``slots`` None: do not bind,
        e.g. the op allocated its output)."""
        run_launches(launches, stream)
        if slots is not None:
            self.record(key, slots, scalars, launches, stream, relations)

    def record(self, key, slots, scalars: tuple, launches, stream: int, relations=()) -> None:
        try:
            hash(key)
        except TypeError:
            return
        c = bind_call(slots, scalars, launches, stream, relations)
        if c is None:
            return
        calls = self._calls.get(key)
        if calls is None:
            if len(self._calls) >= self.max_keys:
                self._calls.clear()
            calls = self._calls[key] = []
        calls.insert(0, c)
        del calls[self.per_key:]

    def clear(self) -> None:
        self._calls.clear()

    @property
    def hits(self) -> int:
        """Replays so far by the bound calls currently held."""
        return sum(c.hits for calls in self._calls.values() for c in calls)


# ----------------------------------------------------------------------------------- cache
class _CtxInfo:
    __slots__ = ("device", "cc", "arch", "how", "aset")

    def __init__(self, device, cc, arch, how, aset):
        self.device, self.cc, self.arch, self.how, self.aset = device, cc, arch, how, aset


_cache_lock = threading.Lock()
_ctx_infos: dict[int, _CtxInfo] = {}
_kernels: dict[tuple[int, str, str], Kernel] = {}


def clear_cache() -> None:
    """Forget loaded kernels and per-context arch choices (tests; modules are not unloaded)."""
    with _cache_lock:
        _ctx_infos.clear()
        _kernels.clear()
        _pools.clear()
    clear_bound_calls()


def clear_bound_calls() -> None:
    """Forget every recorded bound call (the next call of each op validates again)."""
    for c in list(_call_caches):
        c.clear()


def context_info(ctx: int) -> _CtxInfo:
    info = _ctx_infos.get(ctx)
    if info is None:
        dev = driver.context_device()
        cc = driver.device_cc(dev)
        root = artifacts.find_root()
        if root is None:
            raise MissingKernelError(
                "vkc_runtime: no artifact root found (no VKC_ARTIFACT_ROOT, no packaged artifacts, no source tree); "
                + artifacts.repair_hint(None))
        arch, how = artifacts.select_arch_info(cc, root)
        info = _CtxInfo(dev, cc, arch, how, ArtifactSet(root, arch))
        with _cache_lock:
            info = _ctx_infos.setdefault(ctx, info)
    return info


def get_kernel(base: str, *, device: int | None = None) -> Kernel:
    """The :class:`Kernel` for ``base`` in the current context (made current if there is none).

    Raises :class:`DriverUnavailable` without a usable driver, :class:`MissingKernelError` when the
    selected arch has no artifact for ``base``.
    """
    ctx = driver.ensure_context(device)
    info = _ctx_infos.get(ctx) or context_info(ctx)
    key = (ctx, info.arch, base)
    k = _kernels.get(key)
    if k is None:
        spec = info.aset.launch_spec(base)
        k = Kernel(base, spec, info.aset, ctx, info.device)
        with _cache_lock:
            k = _kernels.setdefault(key, k)
    return k


def has_kernel(base: str, *, device: int | None = None) -> bool:
    """Whether the arch selected for the current context has an artifact for ``base`` (for arch-specific
    fast paths, e.g. TMA kernels built for sm_90a/sm_100a only; required bases go through the registry)."""
    ctx = driver.ensure_context(device)
    info = _ctx_infos.get(ctx) or context_info(ctx)
    return base in info.aset
