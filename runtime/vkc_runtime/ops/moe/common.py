"""What the moe ops share: the kernel names (``BASES``), limits, ``align_capacity``, the router's split rule
and the checks of the routing tensors (:mod:`vkc_runtime.ops.moe` has the layouts)."""
from __future__ import annotations

from typing import Any, NamedTuple

from .._check import OpError, cdiv, tensor

MAX_EXPERTS = 512   # E' (routed + folded shared) <= the align kernels' EB
MAX_TOPK = 16       # k' <= the router's KB slots
TOPK_EB = (32, 256, 512)
# the router's small-tile logits kernel (BM 16) up to SMALL_M tokens, the large-tile one (BM 128) above. The
# rule's crossover is RULE_SMALL_M (the H200 timing of both kernels forced: benchmarks/bench_moe.py, rows
# moe_route_tiles, in BENCHMARKS.md). route.logits.large once raced on sm_90a and gave wrong ids
# (kernels_src/moe/route.py, "Pipelining"); the fixed kernel passes tests/gpu/test_gpu_moe_router.py on the H200.
RULE_SMALL_M = 128
SMALL_M = RULE_SMALL_M
SPLIT_TARGET = 128  # programs the router's logits launch aims for (about one per SM of an H100/H200)
MAX_SPLIT = 16
HIST_CHUNK = 2048   # align.hist's CH (pairs per program): align histograms directly when P <= this
HIST_BINS = 512     # align kernels' EB


# the kernel names, spelled once: the ops call these, BASES is built from them
def logits_base(size: str) -> str:
    return f"moe.route.logits.{size}"


def topk_base(eb: int) -> str:
    return f"moe.route.topk.e{eb}"


def align_base(kind: str) -> str:
    return f"moe.align.{kind}"


def combine_base() -> str:
    return "moe.combine"


BASES = (logits_base("small"), logits_base("large"), *(topk_base(e) for e in TOPK_EB), align_base("hist"),
         align_base("scatter"), combine_base())


def topk_eb(E: int) -> int:
    return next(e for e in TOPK_EB if e >= E)


def logits_size(M: int) -> str:
    return "small" if M <= SMALL_M else "large"


def route_split(M: int, E: int, H: int, BM: int, BE: int, BK: int) -> tuple[int, int]:
    """(n_split, k_split) of the router's logits launch: K split so that the grid has about SPLIT_TARGET
    programs (at most MAX_SPLIT splits, each a multiple of BK long, none empty)."""
    base = cdiv(M, BM) * cdiv(E, BE)
    s = max(1, min(MAX_SPLIT, cdiv(SPLIT_TARGET, base), cdiv(H, BK)))
    k_split = cdiv(cdiv(H, s), BK) * BK
    return cdiv(H, k_split), k_split


def hist_chunks(P: int) -> int:
    """align.hist programs for P pairs (0: the scatter kernel histograms the ids itself)."""
    return 0 if P <= HIST_CHUNK else cdiv(P, HIST_CHUNK)


def align_capacity(P: int, num_experts: int, block_m: int) -> int:
    """Rows of ``sorted_ids`` any routing of P pairs over ``num_experts`` experts needs with groups padded to
    ``block_m``: P + E' * (block_m - 1), rounded up to block_m."""
    if P < 0 or num_experts < 1 or block_m < 1:
        raise OpError(f"align_capacity: needs P >= 0, num_experts >= 1, block_m >= 1 (got {P}, {num_experts}, "
                      f"{block_m})")
    return cdiv(P + num_experts * (block_m - 1), block_m) * block_m


def check_experts(op: str, num_experts: int) -> None:
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise OpError(f"{op}: num_experts (E' = {num_experts}) must be in [1, {MAX_EXPERTS}]")


def routing(op: str, topk_ids, topk_weights=None):
    """topk_ids int32 [M, k'] (and topk_weights float32 [M, k']) contiguous: (ids ref, weights ref, M, k')."""
    it = tensor(op, "topk_ids", topk_ids, "int32", ndim=2)
    M, k = it.shape
    if not 1 <= k <= MAX_TOPK:
        raise OpError(f"{op}: topk_ids must have 1..{MAX_TOPK} columns, got {k}")
    contiguous(op, "topk_ids", it)
    wt = None
    if topk_weights is not None:
        wt = tensor(op, "topk_weights", topk_weights, "float32", ndim=2, shape=(M, k))
        contiguous(op, "topk_weights", wt)
    return it, wt, M, k


def contiguous(op: str, name: str, t) -> None:
    want, acc = [], 1
    for d in reversed(t.shape):
        want.insert(0, acc)
        acc *= d
    if any(n > 1 and s != w for n, s, w in zip(t.shape, t.strides, want)):
        raise OpError(f"{op}: {name} must be contiguous (shape {tuple(t.shape)}, strides {tuple(t.strides)})")


def a16(op: str, **vals: int) -> None:
    """Pointers 16-byte aligned, sizes/strides multiples of 16 elements (the kernels' div=16 promises)."""
    for k, v in vals.items():
        if v % 16:
            what = "16-byte aligned" if k.endswith("ptr") else "a multiple of 16"
            raise OpError(f"{op}: {k}={v:#x} must be {what}" if k.endswith("ptr") else f"{op}: {k}={v} must be {what}")


class ExpertRefs(NamedTuple):
    """Validated quantized expert weights (ops/moe/nvfp4_ops.py, ops/moe/fp8_ops.py): ``tensors`` the device refs in
    the kernels' argument order, ``strides`` (stride_qe, stride_qn, stride_se, stride_sn) as the kernels take them,
    ``named`` (name, ref) pairs for the overlap checks, and the logical [E', R, K]."""
    tensors: tuple
    strides: tuple
    named: list
    E: int
    R: int
    K: int
    codes: Any
