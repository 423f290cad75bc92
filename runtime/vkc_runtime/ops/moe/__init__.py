"""Typed ops of the moe family (kernels_src/moe): the MoE block of Qwen3.5/3.6 MoE (HF
``Qwen3_5MoeSparseMoeBlock``) and its pieces.

Layouts (device arrays, row-major; P = M * k' (token, pick) pairs, flat pair index f = m * k' + j)
  x            bf16 [M, H], row stride a multiple of 16, H a multiple of 16, 16-byte aligned
  gate_w       bf16 [E, H] contiguous (router), shared_gate_w bf16 [1, H] (or [H]) contiguous, optional
  topk_ids     int32 [M, k'], topk_weights fp32 [M, k'] contiguous; k' = top_k (+ 1 with the shared expert:
               column top_k is expert E with weight sigmoid(x . shared_gate_w))
  sorted_ids   int32 [cap], block_expert int32 [cap // block_m], num_padded int32 [1]:
               cap = align_capacity(P, E', block_m) (or more, a multiple of block_m); pairs grouped by expert in
               pair order, each group padded with the sentinel P to a multiple of block_m, experts without pairs
               get no rows; block_expert -1 and sorted_ids P past num_padded
  w1           bf16 [E', 2I, H] (gate rows, then up rows), w2 bf16 [E', H, I]; E' = E + 1 with the shared
               expert stacked as expert E
  y            bf16 [P, H] (the second grouped GEMM's rows per pair), out bf16 [M, H]
  quantized experts: w1 / w2 as :class:`Nvfp4Experts` (codes, e4m3 group scales, global multipliers;
               ops/moe/nvfp4_ops.py) run W4A16, as :class:`Fp8Experts` (e4m3 bytes, 128 x 128 block scales;
               ops/moe/fp8_ops.py) W8A16, in the decode and grouped kernels (kernels_src/moe/nvfp4.py, fp8.py), on
               both paths of the block; NVFP4 experts packed once into the MMA layout (:func:`pack_experts` ->
               :class:`Nvfp4MmaExperts`, ops/moe/nvfp4_mma_ops.py) decode on tensor cores
               (kernels_src/moe/nvfp4_mma.py); FP8 experts run W8A8 on the grouped path's prefill tiles where the
               workspace allows it (:func:`grouped_gemm_w8a8`, ops/moe/w8a8_ops.py, kernels_src/moe/w8a8.py)

Ops: :func:`route` (2 launches: split-K fp32 logits, then softmax / top-k / renormalise / shared fold in a
fixed-order sum of the splits), :func:`align` (1 launch for P <= 2048, else 2), :func:`grouped_gemm` (ops/moe/grouped_ops.py), :func:`combine` (1),
:func:`decode_gate_up` / :func:`decode_down` (ops/moe/decode_ops.py: per-pair GEMVs for a few tokens, 1 launch
each), :func:`sparse_moe_block` (M <= decode_ops.DECODE_MAX_M: route -> decode_gate_up -> decode_down; else
route -> align -> grouped_gemm(silu_mul) -> grouped_gemm -> combine) with its :func:`moe_workspace`. Limits:
E' <= 512, k' <= 16.

Device-side values: ids outside [0, E') are dropped by align (their pairs are in no group), skipped by
combine (never read) and by the decode kernels (a zero h row, no contribution); every store of align is masked
to its buffers whatever the ids; the router's ids are always in [0, E] (NaN logits give unspecified ids in
range). Validated on the host before any launch: dtypes,
shapes, contiguity, alignment, int32 ranges, buffer capacities.

Graph capture: pass ``out=`` / the output arrays and a workspace (route's partial logits, align's histogram
rows for P > 2048) allocated before capture; :func:`moe_workspace` loads every kernel the block can launch.
With torch tensors, a workspace (route, align) and the same layout as a recent call, route / align / combine
are bound calls (vkc_runtime.bound). The results are deterministic (no atomics; fixed summation orders).
"""
from .._check import OpError
from .block import (BLOCK_MS, FP8_MODES, FUSED_H_QUANT, GROUPED_BASES, GROUPED_OPTIONAL_BASES, PATHS,
                    W8A8_BLOCK_M, W8A8_GROUPED, MoeWorkspace, block_m_for, choose_path, fp8_mode, moe_workspace,
                    sparse_moe_block)
from .decode_ops import DECODE_BASES, DECODE_MAX_M, decode_down, decode_gate_up
from .common import BASES as ROUTE_BASES, MAX_EXPERTS, MAX_TOPK, align_capacity
from .route_ops import align, combine, route
from .fp8_ops import Fp8Experts
from .nvfp4_ops import Nvfp4Experts
from .nvfp4_mma_ops import Nvfp4MmaExperts, mma_shapes as nvfp4_mma_shapes, pack_experts
from .w8a8_ops import W8A8_BASES, grouped_gemm_w8a8

try:  # the grouped GEMMs (ops/moe/grouped_ops.py)
    from .grouped_ops import choose_block_m, grouped_gemm
except ModuleNotFoundError as _e:  # pragma: no cover - a tree without them
    if _e.name != f"{__name__}.grouped_ops":
        raise

__all__ = ["route", "align", "combine", "align_capacity", "moe_workspace", "MoeWorkspace", "sparse_moe_block",
           "grouped_gemm", "choose_block_m", "decode_gate_up", "decode_down", "DECODE_MAX_M", "DECODE_BASES",
           "choose_path", "PATHS", "Nvfp4Experts", "Nvfp4MmaExperts", "pack_experts", "nvfp4_mma_shapes", "Fp8Experts",
           "grouped_gemm_w8a8", "fp8_mode", "FP8_MODES", "FUSED_H_QUANT", "W8A8_GROUPED", "W8A8_BLOCK_M",
           "block_m_for", "BLOCK_MS", "MAX_EXPERTS", "MAX_TOPK", "OpError", "BASES", "OPTIONAL_BASES"]

# every kernel the family's ops may launch: the routing ones, the decode path's and, where ops/moe/grouped_ops.py
# is built in, its grouped GEMMs
BASES = ROUTE_BASES + GROUPED_BASES + DECODE_BASES
OPTIONAL_BASES = GROUPED_OPTIONAL_BASES + W8A8_BASES  # W8A8: the FP8 archs only
