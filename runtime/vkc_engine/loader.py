"""HF checkpoint reading: safetensors files (single or sharded with ``model.safetensors.index.json``), tensor
names normalised across the text-only and VLM-wrapped layouts, each tensor's dtype from the file header.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte
offsets into the data area) and the data. The header is parsed here rather than through the ``safetensors``
package because its numpy path cannot return bf16 without ml_dtypes; the tensors come back as read-only
views of a memory map (no host copy): bf16 as ``uint16`` bits, with the dtype name beside them. Every
inconsistency (truncated file, offsets outside the data, a size that does not match the shape) raises
:class:`CheckpointError` naming the file and tensor.

FP8 (block-wise, vkc_engine.config.QuantConfig): ``F8_E4M3`` tensors come back as their uint8 bytes (still a
view of the map); :func:`fp8_block_scales` reads a weight's ``weight_scale_inv`` (fp32, bf16 or fp16, checked
against the weight's block grid) as float32, :func:`dequantize_fp8` gives the float32 values of a block-quantized
weight (e4m3 decoded by a 256-entry table, exact; times its block's multiplier).

NVFP4 (vkc_engine.config, ``QuantConfig.method`` "nvfp4"): :func:`nvfp4_tensor` reads one linear's packed e2m1
codes (U8 [N, K/2], low nibble first), its e4m3 group scales (F8_E4M3 [N, K/16]) and its global scale (one F32
value: compressed-tensors' ``weight_global_scale`` is a divisor, ModelOpt's ``weight_scale_2`` a multiplier; the
result's ``alpha`` is always the multiplier), as :class:`Nvfp4Tensor` (views of the map);
:func:`dequantize_nvfp4` gives its float32 values (exact before the global multiplier).

Names: ``model.language_model.X`` (VLM-wrapped releases) is read as ``model.X``; ``mtp.*`` (the
multi-token-prediction head) and ``model.visual.*`` / ``visual.*`` (the vision tower) are skipped and
counted in :attr:`Checkpoint.ignored`.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["CheckpointError", "RawTensor", "SafetensorsFile", "Checkpoint", "to_float32", "to_bf16_bits",
           "FLOAT_DTYPES", "FP8_DTYPE", "E4M3_VALUES", "E2M1_VALUES", "fp8_block_scales", "dequantize_fp8",
           "Nvfp4Tensor", "nvfp4_names", "is_nvfp4", "nvfp4_tensor", "dequantize_nvfp4"]

# safetensors dtype code -> (numpy dtype of the raw view, itemsize)
_DTYPES = {"BF16": (np.uint16, 2), "F16": (np.float16, 2), "F32": (np.float32, 4), "F64": (np.float64, 8),
           "I8": (np.int8, 1), "U8": (np.uint8, 1), "I16": (np.int16, 2), "I32": (np.int32, 4),
           "I64": (np.int64, 8), "BOOL": (np.bool_, 1), "F8_E4M3": (np.uint8, 1), "F8_E5M2": (np.uint8, 1)}
FLOAT_DTYPES = ("BF16", "F16", "F32")  # what the engine converts to its compute dtypes
FP8_DTYPE = "F8_E4M3"  # block-quantized weights (uint8 bytes of float8_e4m3fn)


def _e4m3_table() -> np.ndarray:
    """float32 value of every float8_e4m3fn byte: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
    subnormal (m / 8 * 2^-6); S.1111.111 is NaN (no infinities)."""
    b = np.arange(256)
    e, m = (b >> 3) & 0xF, b & 7
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * 2.0 ** (e - 7.0))
    v = np.where(b & 0x80, -mag, mag).astype(np.float32)
    v[(b & 0x7F) == 0x7F] = np.nan
    return v


E4M3_VALUES = _e4m3_table()
# e2m1 code -> value (bit 3 sign, bits 2..1 exponent with bias 1, bit 0 mantissa)
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                       np.float32)
_MAX_HEADER = 100 * 2**20
_IGNORED_PREFIXES = ("mtp.", "model.visual.", "visual.")


class CheckpointError(ValueError):
    """A checkpoint file or tensor the engine cannot use (the message names the file / tensor)."""


@dataclass(frozen=True)
class RawTensor:
    """A tensor as stored: ``data`` a read-only view of the file (bf16 as uint16 bits), ``dtype`` the
    safetensors code (``BF16``, ``F32``, ...), ``name`` and ``file`` for messages."""
    name: str
    dtype: str
    data: np.ndarray
    file: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)


def to_float32(t: RawTensor) -> np.ndarray:
    """The stored values as float32 (exact for bf16, f16 and f32)."""
    if t.dtype == "BF16":
        return (t.data.astype(np.uint32) << 16).view(np.float32)
    if t.dtype in ("F16", "F32"):
        return t.data.astype(np.float32)
    raise CheckpointError(f"{t.file}: tensor {t.name} has dtype {t.dtype}; expected one of {FLOAT_DTYPES}")


def to_bf16_bits(t: RawTensor) -> np.ndarray:
    """bf16 bits (uint16) of the stored values: the file's own bytes for BF16 (no copy), round-to-nearest-even
    for F16 / F32."""
    if t.dtype == "BF16":
        return t.data
    f = np.ascontiguousarray(to_float32(t))
    u = f.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bits[np.isnan(f)] = 0x7FC0
    return bits


class SafetensorsFile:
    """One ``.safetensors`` file: header parsed and checked against the file size at open, tensors as
    memory-mapped views."""

    def __init__(self, path):
        self.path = str(path)
        size = os.path.getsize(self.path)
        if size < 8:
            raise CheckpointError(f"{self.path}: file is truncated ({size} bytes, no safetensors header)")
        with open(self.path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > _MAX_HEADER or 8 + n > size:
                raise CheckpointError(f"{self.path}: header length {n} does not fit the file ({size} bytes): "
                                      "truncated or not a safetensors file")
            try:
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{self.path}: header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: header is not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        data_len = size - self._data_start
        self.entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, e in header.items():
            try:
                dt, shape, (b, end) = e["dtype"], tuple(int(s) for s in e["shape"]), e["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(f"{self.path}: header entry of {name} is malformed: {e!r}") from None
            if dt not in _DTYPES:
                raise CheckpointError(f"{self.path}: tensor {name} has unknown dtype {dt!r}")
            need = math.prod(shape) * _DTYPES[dt][1]
            if not 0 <= b <= end or end - b != need:
                raise CheckpointError(f"{self.path}: tensor {name} ({dt} {list(shape)}) has byte range [{b}, {end}), "
                                      f"expected {need} bytes")
            if end > data_len:
                raise CheckpointError(f"{self.path}: file is truncated: tensor {name} ends at data byte {end}, the "
                                      f"file holds {data_len} data bytes")
            self.entries[name] = (dt, shape, b, end)
        self._map = None

    def _mm(self) -> np.ndarray:
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map

    def tensor(self, name: str, stored_name: str | None = None) -> RawTensor:
        key = stored_name or name
        dt, shape, b, end = self.entries[key]
        raw = self._mm()[self._data_start + b:self._data_start + end]
        arr = raw.view(_DTYPES[dt][0]).reshape(shape)
        return RawTensor(name, dt, arr, self.path)


def _canonical(name: str) -> str | None:
    """The text-only name of a stored tensor, or None for tensors the text model does not use."""
    if name.startswith(_IGNORED_PREFIXES):
        return None
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


class Checkpoint:
    """The safetensors of an HF model directory, by canonical (text-only) tensor name."""

    def __init__(self, model_dir):
        self.dir = Path(model_dir)
        idx = self.dir / "model.safetensors.index.json"
        if idx.is_file():
            try:
                weight_map = json.loads(idx.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{idx}: not a valid safetensors index ({e!r})") from None
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.dir.glob("*.safetensors"))
            weight_map = None
        if not files:
            raise CheckpointError(f"{self.dir}: no *.safetensors files (and no model.safetensors.index.json)")
        self.files: dict[str, SafetensorsFile] = {}
        for fn in files:
            p = self.dir / fn
            if not p.is_file():
                raise CheckpointError(f"{idx}: lists shard {fn}, which does not exist")
            self.files[fn] = SafetensorsFile(p)
        self._where: dict[str, tuple[str, str]] = {}  # canonical name -> (file, stored name)
        self.ignored: dict[str, int] = {}
        for fn, sf in self.files.items():
            for stored in sf.entries:
                if weight_map is not None and weight_map.get(stored) not in (None, fn):
                    continue  # the index says another shard owns it
                c = _canonical(stored)
                if c is None:
                    pre = stored.split(".")[0] if stored.startswith(("mtp.", "visual.")) else "model.visual"
                    self.ignored[pre] = self.ignored.get(pre, 0) + 1
                    continue
                if c in self._where:
                    raise CheckpointError(f"{self.dir}: tensor {c} is stored twice ({self._where[c][1]} in "
                                          f"{self._where[c][0]}, {stored} in {fn})")
                self._where[c] = (fn, stored)
        if weight_map is not None:
            for stored, fn in weight_map.items():
                c = _canonical(stored)
                if c is not None and c not in self._where:
                    raise CheckpointError(f"{idx}: tensor {stored} is listed in shard {fn} but not stored there")

    def names(self) -> list[str]:
        return sorted(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def ignored_summary(self) -> str:
        """One line naming the skipped tensor groups (empty when none)."""
        if not self.ignored:
            return ""
        parts = [f"{n} {p}.* tensors" for p, n in sorted(self.ignored.items())]
        return "ignored (not part of the text decoder): " + ", ".join(parts)

    def get(self, name: str, shape=None, dtypes=FLOAT_DTYPES) -> RawTensor:
        """The tensor ``name`` (canonical), checked against ``shape`` (None entries are free) and ``dtypes``."""
        if name not in self._where:
            raise CheckpointError(f"{self.dir}: tensor {name} is missing from the checkpoint")
        fn, stored = self._where[name]
        t = self.files[fn].tensor(name, stored)
        if shape is not None:
            shape = tuple(shape)
            if len(shape) != len(t.shape) or any(s is not None and s != a for s, a in zip(shape, t.shape)):
                raise CheckpointError(f"{fn}: tensor {stored} has shape {list(t.shape)}, expected "
                                      f"{[s if s is not None else '*' for s in shape]}")
        if dtypes is not None and t.dtype not in dtypes:
            hint = (" (quantized weights: block-wise FP8 F8_E4M3 linears with a quantization_config only)"
                    if t.dtype.startswith(("F8", "U8", "I8")) else "")
            raise CheckpointError(f"{fn}: tensor {stored} has dtype {t.dtype}, expected one of {list(dtypes)}{hint}")
        return t


def fp8_block_scales(ckpt: "Checkpoint", weight: RawTensor, block=(128, 128)) -> RawTensor:
    """The float32 ``weight_scale_inv`` of an F8_E4M3 weight ``<module>.weight`` [N, K]: stored as
    ``<module>.weight_scale_inv`` [cdiv(N, bn), cdiv(K, bk)] in F32, BF16 or F16 (converted exactly)."""
    if not weight.name.endswith(".weight"):
        raise CheckpointError(f"{weight.file}: FP8 tensor {weight.name} is not a linear's weight (expected a name "
                              "ending in .weight with a .weight_scale_inv beside it)")
    if weight.data.ndim != 2:
        raise CheckpointError(f"{weight.file}: FP8 tensor {weight.name} has shape {list(weight.shape)}: block-wise "
                              "FP8 weights are 2-D [N, K]")
    name = weight.name + "_scale_inv"
    if name not in ckpt:
        raise CheckpointError(f"{ckpt.dir}: tensor {name} is missing: the F8_E4M3 weight {weight.name} needs its "
                              "block scales")
    N, K = weight.shape
    bn, bk = block
    s = ckpt.get(name, (-(-N // bn), -(-K // bk)))
    return RawTensor(name, "F32", np.ascontiguousarray(to_float32(s)), s.file)


def dequantize_fp8(weight: RawTensor, scale: RawTensor, block=(128, 128)) -> np.ndarray:
    """float32 [N, K] of a block-quantized weight: e4m3 value * scale[n // bn, k // bk] (one float32 rounding)."""
    N, K = weight.shape
    bn, bk = block
    s = scale.data.astype(np.float32, copy=False)
    full = np.repeat(np.repeat(s, bn, axis=0), bk, axis=1)[:N, :K]
    return E4M3_VALUES[weight.data] * full


@dataclass(frozen=True)
class Nvfp4Tensor:
    """One NVFP4 linear weight as stored: ``packed`` U8 [N, K/2], ``scale`` F8_E4M3 bytes [N, K/16], ``alpha`` the
    global multiplier; ``names`` every checkpoint tensor it was read from (the input scale included)."""
    name: str
    packed: RawTensor
    scale: RawTensor
    alpha: float
    names: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], 2 * self.packed.shape[1]


def nvfp4_names(layout: str, module: str) -> dict[str, str]:
    """The tensor names of one NVFP4 linear ``module`` in ``layout`` (vkc_engine.config.QuantConfig.layout)."""
    if layout == "compressed-tensors":
        return {"packed": module + ".weight_packed", "scale": module + ".weight_scale",
                "global": module + ".weight_global_scale", "input": module + ".input_global_scale"}
    if layout == "modelopt":
        return {"packed": module + ".weight", "scale": module + ".weight_scale",
                "global": module + ".weight_scale_2", "input": module + ".input_scale"}
    raise ValueError(f"unknown NVFP4 layout {layout!r}")


def is_nvfp4(ckpt: "Checkpoint", layout: str, module: str) -> bool:
    """Whether ``module`` is stored as NVFP4 (its global scale is there; a bf16 module of the ignore list has
    none)."""
    return nvfp4_names(layout, module)["global"] in ckpt


def nvfp4_tensor(ckpt: "Checkpoint", layout: str, module: str, shape: tuple[int, int]) -> Nvfp4Tensor:
    """The NVFP4 weight of ``module`` with logical shape (N, K), every part checked (shapes, dtypes, one finite
    positive global scale)."""
    N, K = shape
    if K % 16:
        raise CheckpointError(f"{ckpt.dir}: NVFP4 weight {module} has K = {K}, not a multiple of 16 (one e4m3 "
                              "scale per 16 weights)")
    n = nvfp4_names(layout, module)
    packed = ckpt.get(n["packed"], (N, K // 2), ("U8",))
    scale = ckpt.get(n["scale"], (N, K // 16), (FP8_DTYPE,))
    g = ckpt.get(n["global"], None)
    gv = to_float32(g).reshape(-1)
    if gv.size != 1 or not np.isfinite(gv[0]) or gv[0] <= 0:
        raise CheckpointError(f"{g.file}: tensor {n['global']} must hold one finite positive value, got "
                              f"{gv[:4].tolist()} (shape {list(g.shape)})")
    alpha = float(1.0 / np.float64(gv[0])) if layout == "compressed-tensors" else float(gv[0])
    names = (n["packed"], n["scale"], n["global"]) + ((n["input"],) if n["input"] in ckpt else ())
    return Nvfp4Tensor(module, packed, scale, alpha, names)


def dequantize_nvfp4(t: Nvfp4Tensor) -> np.ndarray:
    """float32 [N, K] of an NVFP4 weight: e2m1 * e4m3(scale[n, k // 16]) (exact) * alpha (one rounding)."""
    p = t.packed.data
    codes = np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], -1)
    s = np.repeat(E4M3_VALUES[t.scale.data], 16, axis=1)
    return (E2M1_VALUES[codes] * s) * np.float32(t.alpha)
