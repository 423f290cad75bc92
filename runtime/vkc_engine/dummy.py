"""Random weights of a config's real shapes, for speed runs without a checkpoint on disk (vLLM's
``--load-format dummy``): :class:`DummyCheckpoint` answers the model's tensor requests like
:class:`vkc_engine.loader.Checkpoint` does, from one random bf16 tile repeated (so a 27B model builds at memory
speed, not at random-number speed). The values are meaningless; the shapes and dtypes are the real ones.
Every name is "in" the checkpoint, so a MoE model reads its experts in the released per-expert layout (the
model's choice when layer 0 has ``experts.0.up_proj.weight``): each expert's [I, H] part is a view of the
tile, uploaded into the stacked device buffer with no host copy (35B-A3B: 256 x 3 parts per layer).

FP8 (the model directory's config.json has a block-wise FP8 ``quantization_config``): the projections a released
``*-FP8`` checkpoint quantizes -- the attention and GDN projections except ``in_proj_a`` / ``in_proj_b``, the dense
MLP, the MoE experts and the shared expert -- come as F8_E4M3 bytes (a repeated tile of random finite e4m3 values)
with float32 ``weight_scale_inv`` of their block grid, so the engine runs them on the FP8 GEMM and the FP8 expert
kernels.

NVFP4 (an NVFP4 ``quantization_config``, either layout): the same projections come as NVFP4 -- random packed codes, e4m3 group scales of
0.25 .. 1 and a global multiplier of 0.01 (the global scales "exist" only for them, so everything else loads as
bf16) -- and run the W4A16 kernels of ops.nvfp4 (MMA layout) and of ops.moe (experts as stored).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .loader import FP8_DTYPE, RawTensor, to_bf16_bits

__all__ = ["DummyCheckpoint"]

_TILE = 1 << 20
_QUANT_SKIP = ("lm_head", "embed_tokens", "in_proj_a", "in_proj_b", "mlp.gate.")


class DummyCheckpoint:
    def __init__(self, model_dir, seed: int = 0):
        self.dir = model_dir
        rng = np.random.default_rng(seed)
        f = (rng.standard_normal(_TILE) * 0.02).astype(np.float32)
        self._tile = to_bf16_bits(RawTensor("tile", "F32", f, "dummy"))
        self._served: list[str] = []
        cfg = Path(model_dir) / "config.json"
        raw = json.loads(cfg.read_text()) if cfg.is_file() else {}
        q = raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config") or {}
        self.fp8 = q.get("quant_method") == "fp8"
        self.nvfp4 = "compressed-tensors" if "nvfp4-pack-quantized" in json.dumps(q) else \
            "modelopt" if "NVFP4" in str(q.get("quant_algo", "")).upper() else None
        # e4m3 bytes of magnitude 2^-3 .. 2^4 (exponent fields 4 .. 11), random signs and mantissas: finite
        b = rng.integers(0, 8, _TILE) | (rng.integers(4, 12, _TILE) << 3) | (rng.integers(0, 2, _TILE) << 7)
        self._fp8_tile = b.astype(np.uint8)
        self._u8_tile = rng.integers(0, 256, _TILE, dtype=np.uint8)  # any byte is two valid e2m1 codes
        self._scale_tile = rng.integers(0x28, 0x38, _TILE, dtype=np.uint8)  # e4m3 0.25 .. 0.94

    def names(self) -> list[str]:
        return sorted(self._served)

    def __contains__(self, name: str) -> bool:
        if self.nvfp4 and name.endswith((".weight_global_scale", ".weight_scale_2", ".input_global_scale",
                                         ".input_scale")):  # the NVFP4 modules (module doc)
            mod = name.rsplit(".", 1)[0]
            return "proj" in mod.split(".")[-1] and not any(k in mod + "." for k in _QUANT_SKIP)
        return True

    def ignored_summary(self) -> str:
        return ""

    def get(self, name: str, shape=None, dtypes=None) -> RawTensor:
        if self.nvfp4 and name.endswith((".weight_global_scale", ".weight_scale_2")):
            self._served.append(name)
            v = 100.0 if self.nvfp4 == "compressed-tensors" else 0.01  # a divisor / a multiplier: alpha 0.01
            return RawTensor(name, "F32", np.full((1,), v, np.float32), "dummy")
        if shape is None or any(s is None for s in shape):
            raise ValueError(f"dummy weights need the full shape of {name}")
        self._served.append(name)
        n = math.prod(shape)
        if name.endswith("A_log"):  # decay rates of a plausible range: -exp(A_log) in [-16, -1]
            return RawTensor(name, "F32", np.log(np.linspace(1.0, 16.0, n, dtype=np.float32)).reshape(shape), "dummy")
        if name.endswith("dt_bias"):
            return RawTensor(name, "F32", np.ones(shape, np.float32), "dummy")
        if name.endswith(".weight_scale_inv"):  # weights of magnitude 0.00125 .. 0.16 with the tile's e4m3 values
            return RawTensor(name, "F32", np.full(shape, 0.01, np.float32), "dummy")
        if dtypes == ("U8",):  # NVFP4 packed codes
            return RawTensor(name, "U8", self._repeat(self._u8_tile, n).reshape(shape), "dummy")
        if dtypes == (FP8_DTYPE,) and name.endswith(".weight_scale"):  # NVFP4 group scales
            return RawTensor(name, FP8_DTYPE, self._repeat(self._scale_tile, n).reshape(shape), "dummy")
        proj = name.endswith(".weight") and "proj" in name.split(".")[-2] and len(shape) == 2
        if self.fp8 and proj and FP8_DTYPE in (dtypes or ()) and not any(k in name for k in _QUANT_SKIP):
            return RawTensor(name, FP8_DTYPE, self._repeat(self._fp8_tile, n).reshape(shape), "dummy")
        return RawTensor(name, "BF16", self._repeat(self._tile, n).reshape(shape), "dummy")

    @staticmethod
    def _repeat(tile: np.ndarray, n: int) -> np.ndarray:
        reps = -(-n // _TILE)
        return np.tile(tile, reps)[:n] if reps > 1 else tile[:n]
