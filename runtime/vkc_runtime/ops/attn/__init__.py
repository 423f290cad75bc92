"""Typed ops of the attention family (kernels_src/attn): paged KV cache write, varlen causal prefill,
split-KV decode. Qwen3.6 full-attention layers: head dim 256 (128 also built), GQA Hq/Hkv <= 16.

Layouts
  q          prefill [T, Hq, D] / decode [B, Hq, D] bf16, head stride D, token stride any multiple of 16
  k_cache,   [num_blocks, block_size, Hkv, D] bf16 ("NHD"), inner [block_size, Hkv, D] contiguous; k and v
  v_cache    caches must have identical shapes and strides (views of one allocation are fine)
  block_tables int32 [N, max_blocks]; row stride any, entries contiguous
  cu_seqlens_q int32 [N+1]; seq_lens int32 [N] = total context (cached prefix + new tokens)
  gate       optional [T|B, Hq, D] bf16 view with a contiguous last dim (e.g. qg.view(T, Hq, 2, D)[:, :, 1]):
             out *= sigmoid(gate), fused into the epilogue
  out        [T|B, Hq, D] bf16

What is validated on the host: dtypes, shapes, strides, 16-byte alignment of every bf16/fp32 pointer and
multiples of 16 for their strides (the kernels are compiled with those promises), D in {128, 256},
Hq % Hkv == 0 and Hq/Hkv <= 16, block-table width * block_size >= max_seq_len when the caller passes it,
int32 ranges, block-table width * block_size < 2^30. What is *not* validated (it would need a device sync):
block-table contents, cu_seqlens, seq_lens and slot_mapping values. The kernels bound-check those cheaply
instead, so no value of them makes a kernel touch memory outside the tensors it was given: a context length
is clamped to [0, max_blocks * block_size], block ids outside [0, num_blocks) are skipped (their keys do not
count), slots outside [0, num_blocks * block_size) are not written, a row that sees no key (L < q_len)
yields zeros, and prefill processes sequence i only when 0 <= cu[i] <= cu[i+1] <= T and cu[i+1] <= every
later offset (others are skipped: their rows are neither read nor written; so are rows outside every
processed sequence). Results for such inputs are defined but meaningless. Duplicate slots in one
reshape_and_cache call: each element of the slot holds that element of one of the rows (which one is unspecified;
the two rows' stores may interleave), still in bounds.

Prefill kernels: on sm_90a/sm_100a a TMA kernel (K/V tiles loaded as boxes of one cache block, 128 x 64
tiles at D=256) when block_size is a multiple of its key tile (64 at D=256, 128 at D=128) and the block
stride a multiple of the slot stride; otherwise (other archs, block size 16) the gather kernel, which looks
up every key row. :func:`prefill_uses_tma` tells which one a cache gets.

Decode kernels: likewise a TMA variant of the split / direct / fused kernels on sm_90a/sm_100a (key tiles of
64 slots of one cache block, software-pipelined), taken when block_size is a multiple of 64, the block stride
a multiple of the slot stride and the workspace carries their global scratch (:func:`decode_workspace` sizes it;
``DecodePlan(...).batch.tma`` tells); block size 16 and the other archs use the gather kernels. In the TMA
kernels a block id outside [0, num_blocks) makes its tile read block 0 (in bounds) and discard it: its keys
still do not count.

Graph capture (on any stream, torch's capture stream included): pass ``out=`` and, for decode, a
:class:`DecodeWorkspace` sized up front with :func:`decode_workspace` and a ``max_seq_len`` (or the bound
block_tables width * block_size is used); the split count then depends only on host-side sizes, so replay
with new lengths/tables is valid. The TMA prefill kernel builds its descriptors in Triton's global scratch:
pass a :class:`PrefillWorkspace` (:func:`prefill_workspace`) allocated before capture, or run the same shape
once eagerly (on any stream) so the context's default scratch is large enough; the TMA decode kernels use the
:class:`DecodeWorkspace`'s own scratch (a decode without a workspace allocates and caches one per shape). One
workspace must not be used by launches on two streams at the same time. Workspaces and plans load every kernel they can launch
when they are made, so a capture loads no module; :func:`reshape_and_cache` loads its kernel on its first
(eager) call.

Modules: ``common`` (kernel names, the checks shared by the ops, the plans' per-layer bound calls),
``cache_ops`` (:func:`reshape_and_cache`), ``prefill_ops`` (prefill, its plan and workspace), ``decode_ops``
(decode, its plan and workspace, the split heuristic).
"""
from .._check import OpError
from .cache_ops import reshape_and_cache
from .common import BASES, HEAD_DIMS, OPTIONAL_BASES
from .decode_ops import (MIN_KEYS_PER_SPLIT, DecodePlan, DecodeWorkspace, decode, decode_workspace, num_splits_for,
                         use_fused_combine)
from .prefill_ops import PrefillPlan, PrefillWorkspace, prefill, prefill_uses_tma, prefill_workspace

__all__ = ["reshape_and_cache", "prefill", "PrefillPlan", "prefill_uses_tma", "PrefillWorkspace",
           "prefill_workspace", "decode", "DecodePlan", "DecodeWorkspace", "decode_workspace", "num_splits_for",
           "use_fused_combine", "MIN_KEYS_PER_SPLIT", "HEAD_DIMS", "OpError", "BASES", "OPTIONAL_BASES"]
