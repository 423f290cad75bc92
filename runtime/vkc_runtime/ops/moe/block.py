"""The whole MoE block (:func:`sparse_moe_block`) and its workspace (:func:`moe_workspace`), two paths, each on
one stream, no host sync, every buffer from the workspace (graph-capturable):

  decode  (M <= ``DECODE_MAX_M`` tokens, or the experts' kind's own limit: decode_ops.decode_max_m): route ->
          decode_gate_up (gate_up GEMV + SwiGLU per (token, pick) pair) -> decode_down (down GEMV + the weighted
          sum per token): four launches, no grouping by expert, no MMA tile padded to 16 rows for one real row;
  grouped (larger M): route -> align -> grouped GEMM (gate_up, SiLU-and-mul) -> grouped GEMM (down) -> combine,
          five ops and six or seven launches.

Block-wise FP8 experts (``Fp8Experts``) on the grouped path (every M past the decode path's limit, while
``W8A8_GROUPED``) run W8A8, grouped by ``W8A8_BLOCK_M`` rows whatever the M rule says, when the workspace was made
with ``w8a8=True`` on an FP8 arch (ops/moe/w8a8_ops.py): x quantized per row per 128 columns
(ops.gemm_fp8.quantize_fp8_per_token_group, one launch), the gate_up GEMM on the FP8 tensor cores writing h as bf16,
h quantized likewise, the down GEMM on the FP8 tensor cores: two launches more than W8A16. ``FUSED_H_QUANT`` (off:
measured slower, see the constants) would have the gate_up epilogue write h quantized (the ``.q`` tile, block_m 64
only: the 128-row one spills).
On the decode path (its GEMVs stream the weights) and without those buffers they run W8A16. ``_fp8_mode=`` forces
"w8a16", "w8a8" (the fused epilogue) or "w8a8_unfused", ``_block_m=`` the row tile (benchmarks and tests).

``path=`` forces one ("decode" / "grouped"; benchmarks and tests); the default is the M rule, a pure function of
the call's M, so a captured graph replays the path it was captured with. Both give the same function within
bf16 rounding (the decode path rounds h to bf16 like the grouped GEMM's epilogue, but sums the k' weighted
down projections in fp32 before one bf16 rounding, where the grouped path rounds each pick's row first).

Tile rule (``block_m_for``): the grouped GEMMs' row tile, chosen by their module's rule
(``grouped_ops.choose_block_m``: it follows the mean number of pairs per expert P / E', P = M * k'; small
means block_m 16 for decode and small prefill, where most groups hold a few rows and a taller tile would
mostly multiply padding). The capacity of the grouping buffers is taken for the call's own P
(``align_capacity(P, E', block_m)``), so a decode step's GEMM grids stay small.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ... import memory
from ...kernels import get_kernel, has_kernel
from ...tensor import TensorRef
from .. import gemm_fp8 as _gemm_fp8
from .._check import BF16, OpError, cdiv, same_device, stream_of, tensor
from .common import BASES as _ROUTE_BASES, MAX_TOPK, align_capacity, check_experts, contiguous, hist_chunks, HIST_BINS
from . import decode_ops as _decode
from . import experts as _xk
from .decode_ops import DECODE_BASES, decode_down, decode_gate_up
from .route_ops import align, combine, route, route_scratch_floats
from . import w8a8_ops as _w8a8

try:
    _grouped = importlib.import_module(f"{__package__}.grouped_ops")
except ModuleNotFoundError as _e:  # the grouped GEMMs' module (helper moegemm's); absent on branches without it
    if _e.name != f"{__package__}.grouped_ops":
        raise
    _grouped = None

__all__ = ["MoeWorkspace", "moe_workspace", "sparse_moe_block", "block_m_for", "BLOCK_MS", "PATHS", "choose_path",
           "fp8_mode", "FP8_MODES", "W8A8_GROUPED", "W8A8_BLOCK_M", "FUSED_H_QUANT"]

PATHS = ("decode", "grouped")
FP8_MODES = ("w8a16", "w8a8", "w8a8_unfused")
# W8A8 on the grouped path at every M: on the H100 (bench_moe.py fp8, 35B-A3B shapes, graph) the block at block_m 64
# with W8A8 takes 0.71-0.84x the time of W8A16 at the rule's block_m 16 at M = 8 to 384 tokens (e.g. 100.9 vs
# 120.7 us at M = 8, 339 vs 440 at 256), and 0.54-0.82x W8A16 at block_m 64 or 128 from 256 up
W8A8_GROUPED = True
# W8A8 groups by 64 rows at every M it runs at, and quantizes h in its own launch: on the H200 (bench_moe.py, 35B-A3B
# shapes, graph) the m64 block is 1.1-1.55x the m128 one at M 512-8192, and the n64 gate_up tile + the quantizer
# 1.05-1.17x the fused .q tile (BN 128 on 8 warps)
W8A8_BLOCK_M = 64
FUSED_H_QUANT = False

BLOCK_MS = tuple(_grouped.BLOCK_MS) if _grouped is not None else (16, 64)


def block_m_for(M: int, k_out: int, num_experts: int) -> int:
    """The grouped GEMMs' block_m for M tokens with k' picks over E' experts (module docstring)."""
    if _grouped is None:
        return BLOCK_MS[0]
    return _grouped.choose_block_m(M, k_out, num_experts)


@dataclass(eq=False)
class MoeWorkspace:
    """Every intermediate buffer of :func:`sparse_moe_block` for up to ``max_tokens`` tokens (flat, contiguous;
    the block takes [M, ...] prefixes). Pk = max_tokens * k':
      topk_ids int32 [Pk], topk_weights fp32 [Pk]         router output
      part fp32                                          router partial logits (max over M of n_split * M * (E + 1))
      hist int32 [cdiv(Pk, 2048) * 512] (>= 1)           align's per-chunk histograms
      sorted_ids int32, block_expert int32 (largest align_capacity over BLOCK_MS), num_padded int32 [1]
      h bf16 [Pk * intermediate], y bf16 [Pk * hidden]    GEMM outputs (h: the decode path's too)
      xq u8 [max_tokens * hidden], xs fp32 [max_tokens * cdiv(hidden, 128)], hq u8 [Pk * intermediate],
      hs fp32 [Pk * cdiv(intermediate, 128)]             W8A8's quantized x and h (None unless made with w8a8=True
                                                         on an FP8 arch)
    One workspace must not serve two streams at the same time."""
    max_tokens: int
    num_experts: int   # routed experts E
    top_k: int
    hidden: int
    intermediate: int
    shared: bool
    topk_ids: Any
    topk_weights: Any
    part: Any
    hist: Any
    sorted_ids: Any
    block_expert: Any
    num_padded: Any
    h: Any
    y: Any
    xq: Any = None
    xs: Any = None
    hq: Any = None
    hs: Any = None

    @property
    def experts_total(self) -> int:
        return self.num_experts + int(self.shared)

    @property
    def k_out(self) -> int:
        return self.top_k + int(self.shared)


GROUPED_BASES = tuple(getattr(_grouped, "BASES", ())) if _grouped is not None else ()
GROUPED_OPTIONAL_BASES = tuple(getattr(_grouped, "OPTIONAL_BASES", ())) if _grouped is not None else ()


def moe_workspace(max_tokens: int, num_experts: int, top_k: int, hidden: int, intermediate: int, *, shared: bool,
                  w8a8: bool = False, device: int | None = None) -> MoeWorkspace:
    """Allocate a :class:`MoeWorkspace` and load every kernel the block can launch (call it before any graph
    capture). ``num_experts``: the routed experts E (the shared expert, when ``shared``, is expert E). ``w8a8``:
    the buffers and kernels of the W8A8 path of FP8 experts (module doc), where the device has its kernels."""
    op = "moe.moe_workspace"
    for n, v in (("max_tokens", max_tokens), ("num_experts", num_experts), ("top_k", top_k), ("hidden", hidden),
                 ("intermediate", intermediate)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise OpError(f"{op}: {n} must be a positive int, got {v!r}")
    Ep, kout = num_experts + int(shared), top_k + int(shared)
    check_experts(op, Ep)
    if top_k > num_experts or kout > MAX_TOPK:
        raise OpError(f"{op}: top_k={top_k} must be <= num_experts={num_experts} with k' <= {MAX_TOPK}")
    Pk = max_tokens * kout
    cap = max(align_capacity(Pk, Ep, bm) for bm in BLOCK_MS)
    nblk = max(align_capacity(Pk, Ep, bm) // bm for bm in BLOCK_MS)

    def e(n, dt):
        return memory.DeviceArray.empty((max(int(n), 1),), dt, device=device)

    ids = e(Pk, "int32")  # makes the device's context current: the kernel lookups below need it
    for b in _ROUTE_BASES + GROUPED_BASES + DECODE_BASES:
        get_kernel(b, device=device).load()
    for b in GROUPED_OPTIONAL_BASES:
        if has_kernel(b, device=device):
            get_kernel(b, device=device).load()
    part = max(route_scratch_floats(m, num_experts, hidden, device=device) for m in range(1, max_tokens + 1))
    q8 = {}
    if w8a8 and _w8a8.available(device) and _gemm_fp8.load_quantizer("group", device):
        for b in _w8a8.W8A8_BASES:
            get_kernel(b, device=device).load()
        q8 = dict(xq=e(max_tokens * hidden, "uint8"), xs=e(max_tokens * cdiv(hidden, 128), "float32"),
                  hq=e(Pk * intermediate, "uint8"), hs=e(Pk * cdiv(intermediate, 128), "float32"))
    return MoeWorkspace(max_tokens=max_tokens, num_experts=num_experts, top_k=top_k, hidden=hidden,
                        intermediate=intermediate, shared=bool(shared), topk_ids=ids,
                        topk_weights=e(Pk, "float32"), part=e(part, "float32"),
                        hist=e(hist_chunks(Pk) * HIST_BINS, "int32"), sorted_ids=e(cap, "int32"),
                        block_expert=e(nblk, "int32"), num_padded=e(1, "int32"), h=e(Pk * intermediate, BF16),
                        y=e(Pk * hidden, BF16), **q8)


def _prefix(op: str, name: str, buf, shape: tuple, dtype: str) -> TensorRef:
    """A contiguous [shape] view at the start of a flat workspace buffer."""
    t = tensor(op, f"workspace.{name}", buf, dtype, ndim=1)
    n = 1
    for d in shape:
        n *= d
    if t.shape[0] < n:
        raise OpError(f"{op}: workspace.{name} holds {t.shape[0]} elements, the call needs {n}")
    strides, acc = [], 1
    for d in reversed(shape):
        strides.insert(0, acc)
        acc *= d
    return TensorRef(t.ptr, tuple(shape), tuple(strides), dtype, t.device, buf)


def fp8_mode(kind: str | None, block_m: int, ws: MoeWorkspace, forced: str | None = None) -> str:
    """How the grouped path runs experts of ``kind`` at ``block_m`` with workspace ``ws``: "w8a16", "w8a8" or
    "w8a8_unfused" (module doc); ``forced`` one of them (an OpError where it cannot run)."""
    op = "moe.sparse_moe_block"
    if forced is not None and forced not in FP8_MODES:
        raise OpError(f"{op}: _fp8_mode must be None or one of {FP8_MODES}, got {forced!r}")
    can = kind == "fp8" and ws.xq is not None and block_m in _w8a8.BLOCK_MS
    fused = can and bool(_w8a8.TILES[block_m]["gate_up_q"])
    if forced is None:
        if not can or not W8A8_GROUPED:
            return "w8a16"
        return "w8a8" if FUSED_H_QUANT and fused else "w8a8_unfused"
    if forced != "w8a16" and not (fused if forced == "w8a8" else can):
        raise OpError(f"{op}: _fp8_mode={forced!r} needs Fp8Experts, a workspace made with w8a8=True on an FP8 arch "
                      f"and block_m in {_w8a8.BLOCK_MS} (got {kind or 'bf16'} experts, block_m {block_m})")
    return forced


def choose_path(M: int, kind: str | None = None) -> str:
    """The block's path for M tokens with experts of ``kind`` (None: bf16; ops/moe/experts.py): "decode" for M <=
    decode_ops.decode_max_m(kind) (read at each call: the one place the limits live), else "grouped" (module
    doc)."""
    return "decode" if M <= _decode.decode_max_m(kind) else "grouped"


def sparse_moe_block(x, gate_w, w1, w2, top_k, *, renormalize, shared_gate_w=None, workspace, out, stream=None,
                     path: str | None = None, _fp8_mode: str | None = None, _block_m: int | None = None):
    """The MoE block of Qwen3.5/3.6 MoE for ``x`` bf16 [M, H] -> ``out`` bf16 [M, H]: router ``gate_w`` [E, H],
    experts ``w1`` [E', 2I, H] (gate rows then up rows) and ``w2`` [E', H, I], with the shared expert stacked
    as expert E (E' = E + 1) and ``shared_gate_w`` [1, H] when given (its weight sigmoid(x . shared_gate_w)).
    ``w1`` / ``w2`` may both be quantized experts of one kind (ops/moe/experts.py: ``Nvfp4Experts``, W4A16, or
    ``Fp8Experts``, W8A16, or W8A8 on the grouped path: module doc; either path).
    ``workspace``: :func:`moe_workspace` for at least M tokens, the same E, top_k, H, I and shared. ``path``:
    None (the M rule, :func:`choose_path`), "decode" or "grouped" (module doc). ``_fp8_mode`` / ``_block_m`` force
    the grouped path's FP8 mode / row tile (benchmarks, tests)."""
    op = "moe.sparse_moe_block"
    if path is not None and path not in PATHS:
        raise OpError(f"{op}: path must be None or one of {PATHS}, got {path!r}")
    s = stream_of(stream)
    ws = workspace
    if not isinstance(ws, MoeWorkspace):
        raise OpError(f"{op}: workspace must be a MoeWorkspace (moe_workspace(...)), got {type(ws).__name__}")
    xt = tensor(op, "x", x, BF16, ndim=2, shape=(None, ws.hidden))
    M, H = xt.shape
    shared = shared_gate_w is not None
    if shared != ws.shared or top_k != ws.top_k or M > ws.max_tokens:
        raise OpError(f"{op}: the workspace was made for shared={ws.shared}, top_k={ws.top_k}, <= {ws.max_tokens} "
                      f"tokens; got shared={shared}, top_k={top_k}, M={M}")
    gt = tensor(op, "gate_w", gate_w, BF16, ndim=2, shape=(ws.num_experts, H))
    Ep, kout, I = ws.experts_total, ws.k_out, ws.intermediate
    kind = _xk.kind_of(w1)
    if kind != _xk.kind_of(w2):
        raise OpError(f"{op}: w1 and w2 must be of one kind (both bf16 tensors, Nvfp4Experts or Fp8Experts), got "
                      f"{kind or 'bf16'} and {_xk.kind_of(w2) or 'bf16'}")
    if kind:
        w1t = _xk.module(kind).experts_refs(op, "w1", w1, rows=2 * I, K=H, gate_up=True, E=Ep).codes
        w2t = _xk.module(kind).experts_refs(op, "w2", w2, rows=H, K=I, gate_up=False, E=Ep).codes
    else:
        w1t = tensor(op, "w1", w1, BF16, ndim=3, shape=(Ep, 2 * I, H))
        w2t = tensor(op, "w2", w2, BF16, ndim=3, shape=(Ep, H, I))
        for n, t in (("w1", w1t), ("w2", w2t)):
            contiguous(op, n, t)
    ot = tensor(op, "out", out, BF16, ndim=2, shape=(M, H))
    same_device(op, xt, gt, w1t, w2t, ot)
    # what the expert kernels of either path would refuse, refused before the router launches
    if I % 16:
        raise OpError(f"{op}: intermediate I={I} must be a multiple of 16")
    if ot.ptr % 16 or (M > 1 and ot.strides[0] % 16):
        raise OpError(f"{op}: out must be 16-byte aligned with a row stride % 16 elements (strides {ot.strides})")
    if M == 0:
        return out
    P = M * kout
    ids = _prefix(op, "topk_ids", ws.topk_ids, (M, kout), "int32")
    wts = _prefix(op, "topk_weights", ws.topk_weights, (M, kout), "float32")
    path = path or choose_path(M, kind)
    if path == "grouped" and _grouped is None:
        raise OpError(f"{op}: the grouped GEMM ops (vkc_runtime.ops.moe.grouped_ops) are not in this build")
    if path == "grouped":
        bm = _block_m if _block_m is not None else block_m_for(M, kout, Ep)
        if bm not in BLOCK_MS:
            raise OpError(f"{op}: _block_m must be one of {BLOCK_MS}, got {bm!r}")
        if _block_m is None and fp8_mode(kind, W8A8_BLOCK_M, ws) != "w8a16":
            bm = W8A8_BLOCK_M
        mode = fp8_mode(kind, bm, ws, _fp8_mode)  # refused here, before any launch
    route(x, gate_w, top_k, renormalize=renormalize, shared_gate_w=shared_gate_w, topk_ids=ids, topk_weights=wts,
          workspace=ws, stream=s)
    h = _prefix(op, "h", ws.h, (P, I), BF16)
    if path == "decode":
        decode_gate_up(x, w1, ids, out=h, stream=s)
        decode_down(h, w2, ids, wts, out=out, stream=s)
        return out
    cap = align_capacity(P, Ep, bm)
    sid = _prefix(op, "sorted_ids", ws.sorted_ids, (cap,), "int32")
    bex = _prefix(op, "block_expert", ws.block_expert, (cap // bm,), "int32")
    npad = _prefix(op, "num_padded", ws.num_padded, (1,), "int32")
    align(ids, Ep, bm, sorted_ids=sid, block_expert=bex, num_padded=npad, workspace=ws, stream=s)
    y = _prefix(op, "y", ws.y, (P, H), BF16)
    if mode == "w8a16":
        _grouped.grouped_gemm(x, w1, sid, bex, npad, a_row_div=kout, out=h, block_m=bm, act="silu_mul", stream=s)
        _grouped.grouped_gemm(h, w2, sid, bex, npad, a_row_div=1, out=y, block_m=bm, act=None, stream=s)
    else:
        xq = _prefix(op, "xq", ws.xq, (M, H), "uint8")
        xs = _prefix(op, "xs", ws.xs, (M, cdiv(H, 128)), "float32")
        hq = _prefix(op, "hq", ws.hq, (P, I), "uint8")
        hs = _prefix(op, "hs", ws.hs, (P, cdiv(I, 128)), "float32")
        _gemm_fp8.quantize_fp8_per_token_group(x, xq, xs, stream=s)
        if mode == "w8a8":
            _w8a8.grouped_gemm_w8a8(xq, xs, w1, sid, bex, npad, a_row_div=kout, out=hq, out_scale=hs, block_m=bm,
                                    act="silu_mul", stream=s)
        else:
            _w8a8.grouped_gemm_w8a8(xq, xs, w1, sid, bex, npad, a_row_div=kout, out=h, block_m=bm, act="silu_mul",
                                    stream=s)
            _gemm_fp8.quantize_fp8_per_token_group(h, hq, hs, stream=s)
        _w8a8.grouped_gemm_w8a8(hq, hs, w2, sid, bex, npad, a_row_div=1, out=y, block_m=bm, stream=s)
    combine(y, ids, wts, Ep, out=out, stream=s)
    return out
