"""The backend's weight objects and the uploads of quantized weights (split from vkc_engine.backend, whose
:class:`~vkc_engine.backend.VkcBackend` mixes :class:`QuantizedUploads` in and re-exports the names here).

  Fp8Weight      a block-wise FP8 linear: e4m3 bytes + fp32 128 x 128 block scales (ops.gemm_fp8, ops.gemv W8A16)
  Nvfp4Weight    an NVFP4 linear packed into ops.nvfp4's MMA layout (W4A16 at every M)
  experts        ops.moe.Nvfp4MmaExperts / Fp8Experts: MoE experts kept quantized (NVFP4 packed into the MMA
                 layout at load: tensor-core W4A16; FP8 as stored: W8A16)
Every upload checks the stored dtypes first (and NVFP4 scale bytes for e4m3 NaN codes), naming the tensor; the
mixin uses the backend's ``weight`` / ``empty`` / ``synchronize`` and its op modules.
"""
from __future__ import annotations

import numpy as np

from .loader import RawTensor

__all__ = ["BackendError", "Fp8Weight", "Nvfp4Weight", "QuantizedUploads"]


class BackendError(RuntimeError):
    """The backend cannot run this model or configuration (the message says which op or size)."""


class Fp8Weight:
    """A block-wise FP8 linear weight on the device: ``q`` [N, K] uint8 (float8_e4m3fn bytes), ``scale``
    [cdiv(N, 128), cdiv(K, 128)] float32 multipliers (the checkpoint's ``weight_scale_inv``)."""

    def __init__(self, q, scale):
        self.q, self.scale = q, scale

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)


def _check_fp8_parts(op: str, parts: list[RawTensor], scales: list[RawTensor]) -> None:
    """F8_E4M3 weights and F32 block scales."""
    if any(p.dtype != "F8_E4M3" for p in parts) or any(s.dtype != "F32" for s in scales):
        raise BackendError(f"{op} takes F8_E4M3 weights and F32 scales, got {sorted({p.dtype for p in parts})} / "
                           f"{sorted({s.dtype for s in scales})}")


def _check_nvfp4_parts(op: str, packed: list[RawTensor], scales: list[RawTensor]) -> None:
    """U8 codes and F8_E4M3 scales, no e4m3 NaN scale code (named with its tensor)."""
    if any(p.dtype != "U8" for p in packed) or any(s.dtype != "F8_E4M3" for s in scales):
        raise BackendError(f"{op} takes U8 codes and F8_E4M3 scales, got {sorted({p.dtype for p in packed})} / "
                           f"{sorted({s.dtype for s in scales})}")
    for t in scales:
        if np.any((np.asarray(t.data).view(np.uint8) & 0x7F) == 0x7F):
            raise BackendError(f"{t.name} ({t.file}) holds e4m3 NaN scale codes (0x7F / 0xFF): not a usable "
                               "NVFP4 checkpoint")


class Nvfp4Weight:
    """An NVFP4 linear weight on the device, packed into the MMA layout of ``vkc_runtime.ops.nvfp4`` (``mma``: an
    ``MmaWeights`` of int32 words and scales, its [N, K] and the global multiplier)."""

    def __init__(self, mma):
        self.mma = mma

    @property
    def shape(self) -> tuple[int, int]:
        return self.mma.n, self.mma.k

    @property
    def alpha(self) -> float:
        return self.mma.global_scale


class QuantizedUploads:
    """The quantized-weight uploads of :class:`~vkc_engine.backend.VkcBackend` (module doc)."""

    def weight_fp8(self, parts: list[RawTensor], scales: list[RawTensor]) -> Fp8Weight:
        """Upload an FP8 linear: F8_E4M3 parts [N_i, K] stacked along dim 0 (their bytes copied from the file
        mapping) and their float32 block scales [N_i / 128, cdiv(K, 128)] stacked alike (every N_i a multiple of
        128, so the stack is the fused weight's block grid)."""
        _check_fp8_parts("weight_fp8", parts, scales)
        return Fp8Weight(self.weight(parts, "u8"), self.weight(scales, "f32"))

    def weight_nvfp4(self, packed: list[RawTensor], scales: list[RawTensor], alpha: float) -> Nvfp4Weight:
        """Upload an NVFP4 linear: U8 packed parts [N_i, K/2] and F8_E4M3 scale parts [N_i, K/16] stacked along dim
        0 into a temporary device copy, packed on the device (``ops.nvfp4.pack``) into the MMA layout, one global
        multiplier for all of them. e4m3 NaN scale codes are refused, naming the tensor."""
        _check_nvfp4_parts("weight_nvfp4", packed, scales)
        n4 = self._nvfp4_ops()
        lin_p, lin_s = self.weight(packed, "u8"), self.weight(scales, "u8")
        N, K = lin_p.shape[0], 2 * lin_p.shape[1]
        wshape, sshape = n4.mma_shapes(N, K)
        words, sc = self.empty(wshape, "i32"), self.empty(sshape, "i32")
        n4.pack(lin_p, lin_s, words, sc, stream=self._s)
        self.synchronize()  # the linear copies are freed when this returns
        w = Nvfp4Weight(n4.MmaWeights(words, sc, N, K, float(alpha)))
        self._nvfp4_elems = max(self._nvfp4_elems, N * K)
        return w

    def experts_nvfp4(self, packed: list[RawTensor], scales: list[RawTensor], alpha, experts: int):
        """Upload NVFP4 MoE expert weights for the tensor-core W4A16 expert kernels (ops.moe ``Nvfp4MmaExperts``): U8
        code parts [R_i, K/2] and F8_E4M3 scale parts [R_i, K/16], expert after expert (each expert's parts
        consecutive), stacked as stored into a temporary device copy of HF's linear layout and packed on the device
        (``ops.moe.pack_experts``, one launch) into the MMA layout; ``alpha`` float32 [experts, A], each expert's
        global multiplier per projection (A = 2: gate_up). Experts whose rows are not a multiple of 16 stay in the
        linear layout (``Nvfp4Experts``, the CUDA-core kernels). NaN scale codes are refused, naming the tensor."""
        _check_nvfp4_parts("experts_nvfp4", packed, scales)
        moe = self._moe_ops()
        codes, sc = self.weight(packed, "u8"), self.weight(scales, "u8")
        a = np.ascontiguousarray(alpha, dtype=np.float32)
        if a.ndim != 2 or a.shape[0] != experts or codes.shape[0] % experts:
            raise BackendError(f"experts_nvfp4: {codes.shape[0]} rows and alpha {a.shape} for {experts} experts")
        R, K = codes.shape[0] // experts, 2 * codes.shape[1]
        alpha_dev = self.weight([RawTensor("alpha", "F32", a, "")], "f32")
        linear = moe.Nvfp4Experts(codes.reshape(experts, R, codes.shape[1]), sc.reshape(experts, R, sc.shape[1]),
                                  alpha_dev)
        if R % 16:  # the MMA layout's row blocks would span two experts: the CUDA-core kernels on HF's layout
            return linear
        wshape, sshape = moe.nvfp4_mma_shapes(experts, R, K)
        words, sw = self.empty(wshape, "i32"), self.empty(sshape, "i32")
        out = moe.pack_experts(linear, words, sw, gate_up=a.shape[1] == 2, stream=self._s)
        self.synchronize()  # the linear copies are freed when this returns
        return out

    def experts_fp8(self, parts: list[RawTensor], scales: list[RawTensor], experts: int):
        """Upload block-wise FP8 MoE expert weights for the W8A16 expert kernels (ops.moe ``Fp8Experts``): F8_E4M3
        parts [R_i, K] and their float32 128 x 128 block scales [R_i / 128, cdiv(K, 128)], expert after expert,
        stacked as stored into [experts, R, K] / [experts, R / 128, cdiv(K, 128)] (every R_i a multiple of 128)."""
        _check_fp8_parts("experts_fp8", parts, scales)
        q, sc = self.weight(parts, "u8"), self.weight(scales, "f32")
        if q.shape[0] % experts or sc.shape[0] % experts:
            raise BackendError(f"experts_fp8: {q.shape[0]} rows / {sc.shape[0]} scale rows for {experts} experts")
        return self._moe_ops().Fp8Experts(q.reshape(experts, q.shape[0] // experts, q.shape[1]),
                                          sc.reshape(experts, sc.shape[0] // experts, sc.shape[1]))
