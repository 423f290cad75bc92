"""The expert weight kinds the MoE ops take for ``w1`` / ``w2``: bf16 tensors, or quantized experts kept quantized on
the device and decoded in the kernels -- :class:`~.nvfp4_ops.Nvfp4Experts` (W4A16, HF's linear layout, CUDA-core
decode), :class:`~.nvfp4_mma_ops.Nvfp4MmaExperts` (W4A16 in the MMA layout, tensor-core decode) and
:class:`~.fp8_ops.Fp8Experts` (block-wise FP8, W8A16). One place maps a weight to its kind and the kind's module
(``experts_refs``, ``base``, ``TILES``)."""
from __future__ import annotations

from . import fp8_ops, nvfp4_mma_ops, nvfp4_ops

__all__ = ["kind_of", "module", "flat", "KINDS", "QUANT_BASES"]

KINDS = {"nvfp4": nvfp4_ops, "nvfp4_mma": nvfp4_mma_ops, "fp8": fp8_ops}
QUANT_BASES = nvfp4_ops.NVFP4_BASES + nvfp4_mma_ops.NVFP4_MMA_BASES + fp8_ops.FP8_BASES


def kind_of(w) -> str | None:
    """"nvfp4", "nvfp4_mma", "fp8" or None (a bf16 tensor)."""
    if isinstance(w, nvfp4_ops.Nvfp4Experts):
        return "nvfp4"
    if isinstance(w, nvfp4_mma_ops.Nvfp4MmaExperts):
        return "nvfp4_mma"
    if isinstance(w, fp8_ops.Fp8Experts):
        return "fp8"
    return None


def module(kind: str):
    return KINDS[kind]


def flat(w) -> tuple:
    """The tensors of a weight (a quantized one's members), for the bound-call guards."""
    k = kind_of(w)
    return tuple(w)[:3] if k == "nvfp4_mma" else tuple(w) if k else (w,)
