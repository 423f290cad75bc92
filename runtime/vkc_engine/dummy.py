"""Random weights of a config's real shapes, for speed runs without a checkpoint on disk (vLLM's
``--load-format dummy``): :class:`DummyCheckpoint` answers the model's tensor requests like
:class:`vkc_engine.loader.Checkpoint` does, from one random bf16 tile repeated (so a 27B model builds at memory
speed, not at random-number speed). The values are meaningless; the shapes and dtypes are the real ones.
Every name is "in" the checkpoint, so a MoE model reads its experts in the released per-expert layout (the
model's choice when layer 0 has ``experts.0.up_proj.weight``): each expert's [I, H] part is a view of the
tile, uploaded into the stacked device buffer with no host copy (35B-A3B: 256 x 3 parts per layer).
"""
from __future__ import annotations

import math

import numpy as np

from .loader import RawTensor, to_bf16_bits

__all__ = ["DummyCheckpoint"]

_TILE = 1 << 20


class DummyCheckpoint:
    def __init__(self, model_dir, seed: int = 0):
        self.dir = model_dir
        rng = np.random.default_rng(seed)
        f = (rng.standard_normal(_TILE) * 0.02).astype(np.float32)
        self._tile = to_bf16_bits(RawTensor("tile", "F32", f, "dummy"))
        self._served: list[str] = []

    def names(self) -> list[str]:
        return sorted(self._served)

    def __contains__(self, name: str) -> bool:
        return True

    def ignored_summary(self) -> str:
        return ""

    def get(self, name: str, shape=None, dtypes=None) -> RawTensor:
        if shape is None or any(s is None for s in shape):
            raise ValueError(f"dummy weights need the full shape of {name}")
        self._served.append(name)
        n = math.prod(shape)
        if name.endswith("A_log"):  # decay rates of a plausible range: -exp(A_log) in [-16, -1]
            return RawTensor(name, "F32", np.log(np.linspace(1.0, 16.0, n, dtype=np.float32)).reshape(shape), "dummy")
        if name.endswith("dt_bias"):
            return RawTensor(name, "F32", np.ones(shape, np.float32), "dummy")
        reps = -(-n // _TILE)
        data = np.tile(self._tile, reps)[:n].reshape(shape) if reps > 1 else self._tile[:n].reshape(shape)
        return RawTensor(name, "BF16", data, "dummy")
