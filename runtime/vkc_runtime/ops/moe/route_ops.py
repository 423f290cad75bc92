"""The moe family's non-GEMM ops: :func:`route` (router), :func:`align` (grouping by expert) and
:func:`combine` (weighted sum per token). Layouts and rules: :mod:`vkc_runtime.ops.moe`."""
from __future__ import annotations

from ... import memory
from ...bound import CallCache, Launch
from ...kernels import get_kernel
from .._check import BF16, OpError, cdiv, fits_i32, grid_y, row_stride, same_device, stream_of, tensor
from .common import (HIST_BINS, HIST_CHUNK, MAX_EXPERTS, MAX_TOPK, a16, align_base, align_capacity, check_experts,
                     combine_base, contiguous, hist_chunks, logits_base, logits_size, route_split, routing, topk_base,
                     topk_eb)

__all__ = ["route", "align", "combine", "route_scratch_floats", "align_scratch_ints"]

_route_calls = CallCache()
_align_calls = CallCache()
_combine_calls = CallCache()


def _kernel_tiles(k) -> tuple[int, int, int]:
    c = k.constexprs
    return int(c["BM"]), int(c["BE"]), int(c["BK"])


def route_scratch_floats(M: int, E: int, H: int, device=None) -> int:
    """fp32 elements of the router's partial logits for M tokens (n_split * M * (E + 1))."""
    k = get_kernel(logits_base(logits_size(M)), device=device)
    n_split, _ = route_split(M, E, H, *_kernel_tiles(k))
    return n_split * M * (E + 1)


def align_scratch_ints(P: int) -> int:
    """int32 elements of align's histogram rows for P pairs."""
    return hist_chunks(P) * HIST_BINS


def _scratch(op, workspace, attr, n, dtype, dev):
    """The workspace's buffer ``attr`` (at least n elements) or, without a workspace, a fresh allocation
    (eager calls only: inside a graph capture pass the workspace)."""
    if workspace is None:
        return memory.DeviceArray.empty((max(n, 1),), dtype, device=None if dev < 0 else dev).tensor_ref()
    buf = getattr(workspace, attr, None)
    if buf is None:
        raise OpError(f"{op}: workspace has no {attr!r} buffer (use moe_workspace)")
    t = tensor(op, f"workspace.{attr}", buf, dtype, ndim=1)
    if t.shape[0] < n:
        raise OpError(f"{op}: workspace.{attr} holds {t.shape[0]} elements, this call needs {n} "
                      f"(the workspace was made for fewer tokens)")
    return t


def route(x, gate_w, top_k, *, renormalize, shared_gate_w=None, topk_ids, topk_weights, workspace=None,
          stream=None):
    """Router: fp32 ``logits = x @ gate_w^T`` ([M, E]), softmax over E, the top_k experts (ties: lower id) and
    their probabilities (divided by their sum when ``renormalize``) -> ``topk_ids`` int32 / ``topk_weights``
    float32 [M, k']. With ``shared_gate_w`` ([1, H] or [H] bf16) column k holds expert id E and weight
    sigmoid(x . shared_gate_w) (k' = top_k + 1), else k' = top_k. ``workspace``: a :class:`MoeWorkspace` (its
    ``part`` buffer; needed inside a graph capture), else the partial logits are allocated per call."""
    op = "moe.route"
    s = stream_of(stream)
    shared = shared_gate_w is not None
    key = (op, type(top_k), top_k, bool(renormalize), shared, workspace)  # the type too: 8.0 == 8, True == 1
    ins = (x, gate_w, topk_ids, topk_weights) + ((shared_gate_w,) if shared else ())
    if workspace is not None and _route_calls.run(key, ins, (), s):
        return topk_ids, topk_weights
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, H = xt.shape
    wt = tensor(op, "gate_w", gate_w, BF16, ndim=2, shape=(None, H))
    E = wt.shape[0]
    contiguous(op, "gate_w", wt)
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise OpError(f"{op}: top_k must be an int, got {type(top_k).__name__}")
    kout = top_k + int(shared)
    if not 1 <= E <= MAX_EXPERTS - int(shared):
        raise OpError(f"{op}: gate_w has {E} experts; E{' + 1' if shared else ''} must be in [1, {MAX_EXPERTS}]")
    if not 1 <= top_k <= E or kout > MAX_TOPK:
        raise OpError(f"{op}: top_k={top_k} must be in [1, E={E}] with k' = {kout} <= {MAX_TOPK}")
    ts = [xt, wt]
    if shared:
        sgt = tensor(op, "shared_gate_w", shared_gate_w, BF16)
        if tuple(sgt.shape) not in ((1, H), (H,)):
            raise OpError(f"{op}: shared_gate_w must be [1, {H}] or [{H}], got shape {tuple(sgt.shape)}")
        contiguous(op, "shared_gate_w", sgt)
        ts.append(sgt)
    else:
        sgt = wt  # never read (has_shared = 0)
    it = tensor(op, "topk_ids", topk_ids, "int32", ndim=2, shape=(M, kout))
    ot = tensor(op, "topk_weights", topk_weights, "float32", ndim=2, shape=(M, kout))
    contiguous(op, "topk_ids", it)
    contiguous(op, "topk_weights", ot)
    ts += [it, ot]
    dev = same_device(op, *ts)
    if H < 1:
        raise OpError(f"{op}: x has no columns")
    sx = row_stride(xt)
    a16(op, H=H, stride_x=sx, x_ptr=xt.ptr, gate_w_ptr=wt.ptr, shared_gate_w_ptr=sgt.ptr)
    if M == 0:
        return topk_ids, topk_weights
    fits_i32(op, M=M, H=H, stride_x=sx, P=M * kout, E_times_H=E * H)
    kl = get_kernel(logits_base(logits_size(M)), device=None if dev < 0 else dev)
    BM, BE, BK = _kernel_tiles(kl)
    n_split, k_split = route_split(M, E, H, BM, BE, BK)
    part = _scratch(op, workspace, "part", n_split * M * (E + 1), "float32", dev)
    kt = get_kernel(topk_base(topk_eb(E)), device=None if dev < 0 else dev)
    if n_split > int(kt.constexprs["NS"]):  # route_split caps it at MAX_SPLIT; the kernel loads NS splits
        raise OpError(f"{op}: {n_split} K splits > the top-k kernel's {kt.constexprs['NS']}")
    hs = int(shared)
    launches = [Launch(kl, (cdiv(M, BM), grid_y(op, cdiv(E, BE)), n_split),
                       (xt, wt, sgt, part, M, E, H, sx, k_split, hs)),
                Launch(kt, (M, 1, 1), (part, it, ot, M, E, n_split, top_k, kout, int(bool(renormalize)), hs))]
    slots = None if workspace is None else (xt, wt, it, ot) + ((sgt,) if shared else ())
    _route_calls.launch(key, slots, (), launches, s)
    return topk_ids, topk_weights


def _vec(op, name, obj, n=None):
    t = tensor(op, name, obj, "int32", ndim=1, shape=None if n is None else (n,))
    contiguous(op, name, t)
    return t


def align(topk_ids, num_experts, block_m, *, sorted_ids, block_expert, num_padded, workspace=None, stream=None):
    """Group the P = M * k' (token, pick) pairs of ``topk_ids`` int32 [M, k'] by expert (module docstring of
    :mod:`vkc_runtime.ops.moe`): ``sorted_ids`` int32 [cap] (cap a multiple of block_m and at least
    ``align_capacity(P, num_experts, block_m)``), ``block_expert`` int32 [cap // block_m], ``num_padded`` int32
    [1]. Ids outside [0, num_experts) are dropped. ``workspace`` (its ``hist`` buffer) is needed when
    P > 2048 inside a graph capture."""
    op = "moe.align"
    s = stream_of(stream)
    key = (op, type(num_experts), num_experts, type(block_m), block_m, workspace)
    ins = (topk_ids, sorted_ids, block_expert, num_padded)
    if _align_calls.run(key, ins, (), s):
        return sorted_ids, block_expert, num_padded
    for name, v in (("num_experts", num_experts), ("block_m", block_m)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise OpError(f"{op}: {name} must be an int, got {type(v).__name__}")
    check_experts(op, num_experts)
    if not 1 <= block_m <= 1024:
        raise OpError(f"{op}: block_m={block_m} must be in [1, 1024]")
    it, _, M, k = routing(op, topk_ids)
    P = M * k
    st = _vec(op, "sorted_ids", sorted_ids)
    cap = st.shape[0]
    need = align_capacity(P, num_experts, block_m)
    if cap % block_m or cap < need:
        raise OpError(f"{op}: sorted_ids has {cap} entries; it needs a multiple of block_m={block_m} that is at "
                      f"least align_capacity({P}, {num_experts}, {block_m}) = {need}")
    bt = _vec(op, "block_expert", block_expert, cap // block_m)
    nt = _vec(op, "num_padded", num_padded, 1)
    dev = same_device(op, it, st, bt, nt)
    fits_i32(op, P=P, cap=cap)
    d = None if dev < 0 else dev
    n_chunks = hist_chunks(P)
    ks = get_kernel(align_base("scatter"), device=d)
    launches = []
    if n_chunks:
        hist = _scratch(op, workspace, "hist", n_chunks * HIST_BINS, "int32", dev)
        kh = get_kernel(align_base("hist"), device=d)
        assert int(kh.constexprs["CH"]) == HIST_CHUNK == int(ks.constexprs["CH"])
        launches.append(Launch(kh, (n_chunks, 1, 1), (it, hist, P, num_experts)))
    else:
        hist = st  # never read (n_chunks = 0)
    src = it if P else st  # P = 0: no id is read (an empty array's pointer may be null)
    launches.append(Launch(ks, (num_experts, 1, 1), (src, hist, st, bt, nt, P, num_experts, n_chunks, cap, block_m)))
    bind = workspace is not None or not n_chunks  # a fresh histogram buffer is not bound
    _align_calls.launch(key, (it, st, bt, nt) if bind else None, (), launches, s)
    return sorted_ids, block_expert, num_padded


def combine(y, topk_ids, topk_weights, num_experts, *, out, stream=None):
    """``out[m] = sum_j w[m, j] * y[m * k' + j]`` over the picks j whose id is in [0, num_experts), fp32 in j
    order, bf16 out [M, H]. ``y`` bf16 [M * k', H]; ``topk_weights`` None: the weights were applied (by the
    second grouped GEMM's row_scale) and the sum is plain."""
    op = "moe.combine"
    s = stream_of(stream)
    hw = topk_weights is not None
    key = (op, type(num_experts), num_experts, hw)
    ins = (y, topk_ids, out) + ((topk_weights,) if hw else ())
    if _combine_calls.run(key, ins, (), s):
        return out
    if not isinstance(num_experts, int) or isinstance(num_experts, bool):
        raise OpError(f"{op}: num_experts must be an int, got {type(num_experts).__name__}")
    check_experts(op, num_experts)
    it, wt, M, k = routing(op, topk_ids, topk_weights)
    yt = tensor(op, "y", y, BF16, ndim=2, shape=(M * k, None))
    H = yt.shape[1]
    ot = tensor(op, "out", out, BF16, ndim=2, shape=(M, H))
    ts = [yt, it, ot] + ([wt] if hw else [])
    dev = same_device(op, *ts)
    sy, so = row_stride(yt), row_stride(ot)
    a16(op, H=H, stride_y=sy, stride_out=so, y_ptr=yt.ptr, out_ptr=ot.ptr)
    if M == 0 or H == 0:
        return out
    fits_i32(op, M=M, H=H, stride_y=sy, stride_out=so, P=M * k)
    kc = get_kernel(combine_base(), device=None if dev < 0 else dev)
    launches = [Launch(kc, (M, grid_y(op, cdiv(H, int(kc.constexprs["BH"]))), 1),
                       (yt, it, wt if hw else it, ot, H, k, num_experts, sy, so, int(hw)))]
    _combine_calls.launch(key, tuple(ts), (), launches, s)
    return out

