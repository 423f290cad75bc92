"""ctypes front end of a CuTe GEMM artifact (``gemm.<host>.so`` + its JSON), for the GPU test and the benchmark.

The integration into vkc_runtime comes later; this module is the reference for how a caller drives the
artifact: ``vkc_cute_load(device)`` once per device, then the variant's launcher with raw pointers, M and a
CUstream. :func:`plan_call` holds every host-side check (dtype, shapes, strides, alignment, device, overlap) and
needs no GPU: it works on anything shaped like a torch tensor.
"""
from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from pathlib import Path

ALIGN = 16  # TMA: global base addresses 16-byte aligned
M_MAX = 2**31 - 1  # the launcher's M is a 32-bit tensor dimension

CU_ERRORS = {1: "CUDA_ERROR_INVALID_VALUE", 3: "CUDA_ERROR_NOT_INITIALIZED (no driver, or vkc_cute_load not called)",
             100: "CUDA_ERROR_NO_DEVICE", 201: "CUDA_ERROR_INVALID_CONTEXT", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
             222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 400: "CUDA_ERROR_INVALID_HANDLE",
             801: "CUDA_ERROR_NOT_SUPPORTED"}


class CuteGemmError(RuntimeError):
    pass


@dataclass(frozen=True)
class Variant:
    symbol: str
    tile_m: int
    tile_n: int


# a 128x128 tile does less MMA work per shared-memory byte than 128x256: its wave efficiency must beat the wider
# tile's by this factor before it is picked (a first guess; benchmarks/bench_cute_gemm.py measures both)
NARROW_TILE_COST = 0.93


def pick_variant(m: int, n: int, cands: list[Variant], sms: int) -> Variant:
    """The variant whose last wave wastes the least, the narrow tile discounted (see NARROW_TILE_COST)."""
    def score(v: Variant) -> float:
        tiles = -(-max(m, 1) // v.tile_m) * -(-n // v.tile_n)
        waves = -(-tiles // sms)
        return tiles / (waves * sms) * (1.0 if v.tile_n >= 256 else NARROW_TILE_COST)
    return max(cands, key=lambda v: (score(v), v.tile_n))


@dataclass(frozen=True)
class Call:
    symbol: str
    a: int
    w: int
    c: int
    m: int


def _is_bf16(t) -> bool:
    return str(t.dtype) in ("torch.bfloat16", "bfloat16")


def _span(t) -> tuple[int, int]:
    """Byte range [start, end) a dense 2-D bf16 operand occupies."""
    rows, cols = t.shape
    start = t.data_ptr()
    return start, start + 2 * ((rows - 1) * t.stride(0) + cols) if rows and cols else start


def plan_call(a, w, c, variants: dict[tuple[int, int], list[Variant]], *, sms: int = 132,
              symbol: str | None = None, require_cuda: bool = True) -> Call:
    """Check C[M, N] = A[M, K] @ W[N, K]^T's operands against the artifact's variants and pick one (``symbol``
    forces a variant of that (N, K)); raise ValueError (before any launch) on anything the kernel cannot take."""
    for name, t in (("a", a), ("w", w), ("out", c)):
        if len(t.shape) != 2:
            raise ValueError(f"{name}: expected a 2-D tensor, got shape {tuple(t.shape)}")
        if not _is_bf16(t):
            raise ValueError(f"{name}: expected bfloat16, got {t.dtype}")
        if require_cuda and t.device.type != "cuda":
            raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device}")
        rows, cols = t.shape
        if t.stride(1) != 1 or (rows > 1 and t.stride(0) != cols):
            raise ValueError(f"{name}: rows must be dense and contiguous (stride ({cols}, 1)), got {t.stride()}")
        if t.data_ptr() % ALIGN:
            raise ValueError(f"{name}: data pointer {t.data_ptr():#x} is not {ALIGN}-byte aligned")
    m, k = a.shape
    n, kw = w.shape
    if kw != k:
        raise ValueError(f"K mismatch: a is [{m}, {k}], w is [{n}, {kw}]")
    if tuple(c.shape) != (m, n):
        raise ValueError(f"out: expected shape ({m}, {n}), got {tuple(c.shape)}")
    if (n, k) not in variants:
        raise ValueError(f"no kernel for N={n}, K={k} in this artifact (have {sorted(variants)})")
    if m > M_MAX:
        raise ValueError(f"M={m} exceeds {M_MAX}")
    devs = {str(t.device) for t in (a, w, c)}
    if len(devs) != 1:
        raise ValueError(f"operands on different devices: {sorted(devs)}")
    if m:
        cs, ce = _span(c)
        for name, t in (("a", a), ("w", w)):
            s, e = _span(t)
            if s < ce and cs < e:
                raise ValueError(f"out overlaps {name}")
    cands = variants[(n, k)]
    if symbol is not None:
        if symbol not in {v.symbol for v in cands}:
            raise ValueError(f"{symbol} is not a kernel for N={n}, K={k}")
    else:
        symbol = pick_variant(m, n, cands, sms).symbol
    return Call(symbol, a.data_ptr(), w.data_ptr(), c.data_ptr(), m)


class CuteGemmLib:
    """One loaded artifact. ``gemm(a, w)`` returns a new [M, N] tensor; ``gemm(a, w, out=c)`` writes c."""

    def __init__(self, so_path: str | Path, info_path: str | Path | None = None):
        so_path = Path(so_path)
        info_path = Path(info_path) if info_path else so_path.with_suffix(".json")
        self.info = json.loads(info_path.read_text())
        self.lib = ctypes.CDLL(str(so_path))
        self.lib.vkc_cute_driver_status.argtypes = []
        self.lib.vkc_cute_driver_status.restype = ctypes.c_int
        self.lib.vkc_cute_load.argtypes = [ctypes.c_int32]
        self.lib.vkc_cute_load.restype = ctypes.c_int32
        self.variants: dict[tuple[int, int], list[Variant]] = {}
        self.fns = {}
        for v in self.info["variants"]:
            fn = getattr(self.lib, v["symbol"])
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
            fn.restype = ctypes.c_int32
            self.variants.setdefault((v["n"], v["k"]), []).append(Variant(v["symbol"], v["tile_m"], v["tile_n"]))
            self.fns[v["symbol"]] = fn
        self._loaded: set[int] = set()
        self._sms: dict = {}
        self.last_symbol: str | None = None  # the variant the last launch used

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc:
            raise CuteGemmError(f"{what} failed: {rc} {CU_ERRORS.get(rc, '')}".rstrip())

    def load(self, device: int) -> None:
        if device not in self._loaded:
            self._check(self.lib.vkc_cute_load(device), f"vkc_cute_load({device})")
            self._loaded.add(device)

    def launch(self, call: Call, stream: int) -> None:
        self.last_symbol = call.symbol
        self._check(self.fns[call.symbol](call.a, call.w, call.c, call.m, stream), call.symbol)

    def gemm(self, a, w, out=None, stream: int | None = None, symbol: str | None = None):
        import torch
        if out is None:
            out = torch.empty((a.shape[0], w.shape[0]), dtype=torch.bfloat16, device=a.device)
        if a.device.type == "cuda" and a.device not in self._sms:
            self._sms[a.device] = torch.cuda.get_device_properties(a.device).multi_processor_count
        call = plan_call(a, w, out, self.variants, sms=self._sms.get(a.device, 132), symbol=symbol)
        if call.m == 0:
            return out
        with torch.cuda.device(a.device):  # the launch goes to the current context
            self.load(torch.cuda.current_device())
            if stream is None:
                stream = torch.cuda.current_stream().cuda_stream
            self.launch(call, stream)
        return out
