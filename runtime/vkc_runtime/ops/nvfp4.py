"""NVFP4 linears from weights packed once into the MMA layout (kernels_src/gemv/nvfp4_mma.py): y = x @ W^T at any M.

    w = MmaWeights(words, scales, n, k, global_scale)   # device tensors in the MMA layout (shapes: mma_shapes)
    pack(weight_packed, weight_scale, words, scales)     # HF's linear NVFP4 tensors -> the MMA layout, on the device
    linear_nvfp4(x, w, out)                              # y [M, N] bf16 = x [M, K] @ W^T, W = e2m1 * e4m3 * alpha

Why a second layout: the linear layout's kernels (ops.gemv.gemv_w4a16, ops.gemm.linear_w4a16) decode weights into
k order with 4-5 integer instructions per weight, which holds the M = 1 GEMV at about a third of the 4-bit HBM
floor on the H200. Packed once at load, each thread's loads are its tensor-core fragments and a weight pair costs
three integer instructions and one packed multiply (the kernel module's docstring has the layout and the exact
decoding). :func:`pack_host` is the same packing in numpy (tests, small tensors).

Operands (checked before any launch, :class:`OpError` otherwise):
  x        [M, K] bf16, last dim contiguous, 16-byte aligned, row stride % 16 elements; K % 16 == 0
  words    int32 [cdiv(N, 16), cdiv(K, 128), 32, 8], scales int32 [cdiv(N, 16), cdiv(K, 128), 32], contiguous,
           16-byte aligned (:func:`mma_shapes`); ``global_scale`` the effective multiplier (compressed-tensors:
           1 / weight_global_scale; ModelOpt: weight_scale_2), a finite float
  out      [M, N] bf16, last dim contiguous, 16-byte aligned, not overlapping x or the weights

Dispatch (:func:`plan`, a pure function of host ints): every M runs the tensor-core kernel
``gemv.w4a16.mma.m{8,16}.k{WK}.r{R}`` -- BLOCK_M 8 for M <= 8, else 16 with the M chunks along the grid (the chunks
of one weight block run together, so its bytes come from L2 after the first) -- unless M > MMA_MAX_M and the caller
passes ``dequant_workspace`` (bf16, >= N * K elements): then the weights are dequantized into it once
(``gemv.nvfp4_mma_dequant``) and the bf16 GEMM (:func:`vkc_runtime.ops.gemm.linear`) runs. For the kernel the rule
takes the (WK, R, split) of least estimated time: the weights streamed at full bandwidth, times the busiest SM's
programs over the mean (programs are equal, so the SM with one more sets the time), times (iterations +
WARP_OVERHEAD) / iterations per warp (a warp's start and end), stretched by IN_FLIGHT / the resident warps per SM
when fewer (too few loads in flight); a split adds its reduce launch (SPLIT_LAUNCH_US, SPLIT_EACH_US per partial)
and its partials' traffic and keeps at least 2 k blocks per warp. The constants were fitted to the H200's measured alternatives
(benchmarks/bench_nvfp4_mma.py; BENCHMARKS.md, session 16). Split-K: fp32 partials [s, M, N] in ``workspace`` (as
ops.gemv: a 1-D float32 tensor of >= :func:`workspace_elems` elements allocated before any graph capture; without one
a per-device default that grows on eager calls only), summed in split order by ``gemv.splitk_reduce``
(deterministic).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from ..bound import CallCache, Launch, disjoint
from ..kernels import get_kernel
from ..memory import TensorRef
from . import gemm as _gemm
from . import gemv as _gemv
from ._check import BF16, OpError, cdiv, fits_i32, row_stride, same_device, stream_of, tensor
from ._check import sm_count as _sm_count

__all__ = ["MmaWeights", "mma_shapes", "pack", "pack_host", "linear_nvfp4", "dequantize", "plan", "MmaPlan",
           "workspace_elems", "split_workspace_elems", "BASES", "MMA_TILES", "MMA_MAX_M", "MAX_SPLIT", "SLOT",
           "E5M3_BIAS"]

SLOT = (3, 7, 2, 6, 1, 5, 0, 4)  # kernels_src/gemv/nvfp4_mma.py: nibble of code e in its word
E5M3_BIAS = 13                   # scale byte E << 3 | m  =  2^(E - 13) * (1 + m / 8)
# (BLOCK_M, WK warps along K per row block, R row blocks per program); kernels_src/gemv/spec.py compiles the same
MMA_TILES = tuple((bm, wk, r) for bm in (8, 16) for wk, r in ((8, 1), (4, 2), (1, 8)))
MMA_MAX_M = 128   # above it, with a dequant workspace, dequantize once + the bf16 GEMM
MAX_SPLIT = 16
MIN_BLOCKS_PER_WARP = 2
WARP_OVERHEAD = 1.0         # a warp's start and end (first loads, the cross-warp sum, the store), in k-block iterations
IN_FLIGHT = 12              # resident warps per SM (one k block of weights in flight each) that hide the load latency
SPLIT_LAUNCH_US = 1.0       # the split-K reduce launch
SPLIT_EACH_US = 0.1         # and each split's partial it reads
STREAM_BYTES_PER_US = 4.8e6  # HBM bandwidth (H200) that converts weight bytes into the rule's microseconds


class MmaWeights(NamedTuple):
    """One NVFP4 weight [n, k] in the MMA layout: ``words`` / ``scales`` device tensors (:func:`mma_shapes`),
    ``global_scale`` the effective multiplier."""
    words: Any
    scales: Any
    n: int
    k: int
    global_scale: float


class MmaPlan(NamedTuple):
    bm: int
    wk: int       # warps per row block, along K
    r: int        # row blocks per program
    split: int
    k_split: int  # K elements per split, a multiple of 128 * wk


def mma_shapes(n: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(words shape, scales shape) of an [n, k] weight in the MMA layout (int32 both)."""
    return (cdiv(n, 16), cdiv(k, 128), 32, 8), (cdiv(n, 16), cdiv(k, 128), 32)


def _kernel_base(bm: int, wk: int, r: int) -> str:
    return f"gemv.w4a16.mma.m{bm}.k{wk}.r{r}"


BASES = tuple(_kernel_base(*t) for t in MMA_TILES) + ("gemv.nvfp4_mma_pack", "gemv.nvfp4_mma_dequant",
                                                             _gemv._reduce_base())


# ----------------------------------------------------------------------------------------------- host packing
def _e5m3_table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per e4m3 byte: the e5m3 byte of its magnitude, whether it is zero, whether it is NaN."""
    b = np.arange(256)
    mag = b & 0x7F
    e, m = mag >> 3, mag & 7
    val = np.where(e > 0, np.exp2(e - 7.0) * (1 + m / 8), m / 8 * 2.0 ** -6)
    p = np.floor(np.log2(np.where(val > 0, val, 1.0))).astype(np.int64)
    frac = np.round((np.where(val > 0, val, 1.0) / np.exp2(p) - 1) * 8).astype(np.int64)
    out = np.where(val > 0, ((p + E5M3_BIAS) << 3) | frac, 0)
    return out.astype(np.uint8), (mag == 0) | (mag == 0x7F), mag == 0x7F


def pack_host(weight_packed, weight_scale) -> tuple[np.ndarray, np.ndarray]:
    """numpy: HF's linear NVFP4 ``weight_packed`` [N, K/2] uint8 and ``weight_scale`` [N, K/16] (e4m3 bytes or
    float8) -> (words, scales) int32 arrays in the MMA layout. Raises ValueError for NaN scales."""
    wp = np.ascontiguousarray(np.asarray(weight_packed)).view(np.uint8)
    sc = np.ascontiguousarray(np.asarray(weight_scale)).view(np.uint8)
    N, Kh = wp.shape
    K = 2 * Kh
    if K % 16 or sc.shape != (N, K // 16):
        raise ValueError(f"pack_host: weight_packed {wp.shape} / weight_scale {sc.shape} are not [N, K/2] / [N, K/16] "
                         f"with K % 16 == 0")
    e5, zero, nan = _e5m3_table()
    if nan[sc].any():
        raise ValueError("pack_host: weight_scale holds e4m3 NaN codes (0x7F / 0xFF)")
    N16, KB = cdiv(N, 16), cdiv(K, 128)
    words = np.zeros((N16 * 16, KB * 16), np.uint32)          # 8 codes a word, code e in nibble e
    words[:N, :K // 8] = wp.view("<u4").reshape(N, K // 8)
    sgrp = np.zeros((N16 * 16, KB * 8), np.uint8)
    sgrp[:N, :K // 16] = sc
    w2 = words.reshape(N16 * 16, KB * 8, 2)                    # the 2 words of each scale group
    w2[zero[sgrp]] = 0
    w2[(sgrp >= 0x80) & ~zero[sgrp]] ^= np.uint32(0x88888888)
    out = np.zeros_like(words)
    for e, slot in enumerate(SLOT):
        out |= ((words >> np.uint32(4 * e)) & np.uint32(0xF)) << np.uint32(4 * slot)
    # row n = 16 rb + 8 h + g, word k/8 = 16 kb + 8 q + 2 t + c  ->  [rb, kb, g, t, q, h, c]
    w7 = out.reshape(N16, 2, 8, KB, 2, 4, 2).transpose(0, 3, 2, 5, 4, 1, 6)
    s6 = e5[sgrp].reshape(N16, 2, 8, KB, 2, 4).transpose(0, 3, 2, 5, 4, 1)
    return (np.ascontiguousarray(w7).reshape(N16, KB, 32, 8).view(np.int32),
            np.ascontiguousarray(s6).reshape(N16, KB, 32, 4).view("<u4").reshape(N16, KB, 32).view(np.int32))


# ----------------------------------------------------------------------------------------------- device ops
_calls = CallCache()


def _mma_operands(op: str, w: MmaWeights):
    if not isinstance(w, MmaWeights):
        raise OpError(f"{op}: weights must be an MmaWeights, got {type(w).__name__}")
    n, k = int(w.n), int(w.k)
    if n < 1 or k < 16 or k % 16:
        raise OpError(f"{op}: weight shape ({n}, {k}) needs n >= 1 and k a positive multiple of 16")
    wshape, sshape = mma_shapes(n, k)
    wt = tensor(op, "words", w.words, "int32", shape=wshape)
    st = tensor(op, "scales", w.scales, "int32", shape=sshape)
    for name, t, shape in (("words", wt, wshape), ("scales", st, sshape)):
        if len(t.shape) != len(shape):
            raise OpError(f"{op}: {name} must have shape {shape}, got {tuple(t.shape)}")
        want = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        if tuple(t.strides) != want:
            raise OpError(f"{op}: {name} must be contiguous (strides {tuple(t.strides)})")
        if t.ptr % 16:
            raise OpError(f"{op}: {name} must be 16-byte aligned")
    fits_i32(op, n=n, k=k, words=wt.shape[0] * wt.shape[1] * 256)
    return wt, st, n, k, _gemv.global_multiplier(op, w.global_scale)


@lru_cache(maxsize=4096)
def plan(M: int, N: int, K: int, num_sms: int, ctas_per_sm: tuple[tuple[int, int, int], ...] = ()) -> MmaPlan:
    """The MMA kernel, split count and per-split K of one call (the rule in the module doc). ``ctas_per_sm``:
    ((wk, r, resident programs per SM), ...) of the M bucket's kernels."""
    if M < 1:
        raise OpError(f"linear_nvfp4: M={M} must be >= 1")
    bm = 8 if M <= 8 else 16
    occ = {(wk, r): n for wk, r, n in ctas_per_sm}
    sms = max(1, num_sms)
    kb = cdiv(K, 128)
    stream_us = N * K * 0.5625 / STREAM_BYTES_PER_US  # the 4-bit weights at full bandwidth
    best = None
    for b, wk, r in MMA_TILES:
        if b != bm:
            continue
        for s in range(1, MAX_SPLIT + 1):
            per = cdiv(cdiv(kb, s), wk) * wk  # k blocks per split, whole rounds of the warps
            if cdiv(kb, per) != s or (s > 1 and per < MIN_BLOCKS_PER_WARP * wk):
                continue
            iters = per // wk
            progs = cdiv(cdiv(N, 16), r) * cdiv(M, bm) * s
            quant = cdiv(progs, sms) * sms / progs  # the busiest SM's programs over the mean
            in_flight = min(max(1, occ.get((wk, r), 1)), cdiv(progs, sms)) * wk * r
            t = stream_us * quant * (iters + WARP_OVERHEAD) / iters * max(1.0, IN_FLIGHT / in_flight)
            if s > 1:  # the reduce launch, and the fp32 partials written and read back
                t += SPLIT_LAUNCH_US + SPLIT_EACH_US * s + stream_us * 8.0 * s * min(M, bm) / (K * 0.5625)
            if best is None or t < best[0] - 1e-9:
                best = (t, MmaPlan(bm, wk, r, s, per * 128))
    return best[1]


def workspace_elems(M: int, N: int) -> int:
    """fp32 elements of a split-K workspace that serves any plan for M rows and N outputs."""
    return MAX_SPLIT * int(M) * int(N)


def _occupancy(bm: int, device=None) -> tuple[tuple[int, int, int], ...]:
    return tuple((wk, r, max(1, get_kernel(_kernel_base(bm, wk, r), device=device).max_active_blocks()))
                 for b, wk, r in MMA_TILES if b == bm)


def split_workspace_elems(M: int, N: int, K: int, *, dequant: bool = False, device: int | None = None) -> int:
    """fp32 split-K workspace elements the rule's plan for one call (M rows, [N, K] weights) needs on this device:
    0 when it does not split (or, with ``dequant``, takes the dequantize + GEMM path). Loads the kernels: call it
    before a capture."""
    if M < 1 or (dequant and M > MMA_MAX_M):
        return 0
    bm = 8 if M <= 8 else 16
    occ = _occupancy(bm, device)
    p = plan(int(M), int(N), int(K), _sm_count(get_kernel(_kernel_base(bm, *occ[0][:2]), device=device).device), occ)
    return p.split * int(M) * int(N) if p.split > 1 else 0


def linear_nvfp4(x, w: MmaWeights, out=None, *, stream=None, workspace=None, dequant_workspace=None,
                 _plan: MmaPlan | None = None):
    """y [M, N] bf16 = x [M, K] @ W^T for NVFP4 weights in the MMA layout (module doc). Returns ``out``
    (allocated when None)."""
    op = "linear_nvfp4"
    s = stream_of(stream)
    key = (op, workspace is None, _plan)
    if out is not None and isinstance(w, MmaWeights):
        tensors = (x, w.words, w.scales, out) + (() if workspace is None else (workspace,))
        alpha = _gemv.global_multiplier(op, w.global_scale)
        if _calls.run(key, tensors, (alpha, w.n, w.k), s):
            return out
    wt, st, N, K, alpha = _mma_operands(op, w)
    xt, M, yt, res = _gemv._prepare(op, x, out, N, K, (wt, st), any_m=True)
    dev = same_device(op, xt, wt, st, yt)
    if M == 0:
        return res
    sx, sy = (row_stride(xt) if M > 1 else K), (row_stride(yt) if M > 1 else N)
    _gemv._aligned(op, "x", xt, "x row stride", sx)
    _gemv._aligned(op, "out", yt)
    if sy < N:
        raise OpError(f"{op}: out rows overlap (row stride {sy} < N = {N})")
    for t, name in ((xt, "x"), (wt, "words"), (st, "scales")):
        _gemv._no_overlap(op, t, yt, name, "out")
    fits_i32(op, M=M, stride_x=sx, stride_out=sy)
    if M > MMA_MAX_M and dequant_workspace is not None and _plan is None:
        view = _gemm._dequant_view(op, dequant_workspace, N, K, dev, (xt, yt))
        _dequant(op, wt, st, view, alpha, N, K, s)
        return _gemm.linear(xt, view, yt, stream=s)
    bm = 8 if M <= 8 else 16
    p = _plan if _plan is not None else plan(M, N, K, _sm_count(dev), _occupancy(bm))
    if p.bm != bm or (p.bm, p.wk, p.r) not in MMA_TILES or p.k_split % (128 * p.wk) \
            or p.split != cdiv(K, p.k_split) or not 1 <= p.split <= MAX_SPLIT:
        raise OpError(f"{op}: plan {p!r} does not fit M={M}, K={K}")
    grid = cdiv(cdiv(N, 16), p.r) * cdiv(M, bm)
    fits_i32(op, grid=grid, partials=p.split * M * N)
    ws_t = yt  # never dereferenced as the workspace when split == 1
    user_ws = None
    if workspace is not None:
        user_ws = _gemv._workspace(op, workspace, p.split * M * N if p.split > 1 else 0, dev, s)
    if p.split > 1:
        ws_t = user_ws if user_ws is not None else _gemv._workspace(op, None, p.split * M * N, dev, s)
    launches = [Launch(get_kernel(_kernel_base(bm, p.wk, p.r)), (grid, p.split, 1),
                       (xt, wt, st, yt, ws_t, alpha, M, N, K, sx, sy, p.k_split))]
    if p.split > 1:
        r = get_kernel(_gemv._reduce_base())
        launches.append(Launch(r, (cdiv(N, r.constexprs["BLOCK"]), M, 1), (ws_t, yt, M, N, sy, p.split)))
    bind = out is not None and (p.split == 1 or workspace is not None)
    _calls.launch(key, ((xt, wt, st, yt) + ((user_ws,) if user_ws is not None else ())) if bind else None,
                  (alpha, N, K), launches, s, relations=[disjoint(t, yt) for t in (xt, wt, st)])
    return res


def _dequant(op, wt, st, view: TensorRef, alpha: float, N: int, K: int, s: int) -> None:
    k = get_kernel("gemv.nvfp4_mma_dequant")
    _calls.launch((op, "dequant"), None, (), [Launch(k, (cdiv(N, 16), cdiv(K, 128), 1),
                                                     (wt, st, view, alpha, N, K, view.strides[0]))], s,
                  relations=[disjoint(wt, view), disjoint(st, view)])


def dequantize(w: MmaWeights, out, *, stream=None):
    """out [N, K] bf16 (contiguous rows, row stride % 16 elements) = W * global_scale, read from the MMA layout."""
    op = "nvfp4.dequantize"
    s = stream_of(stream)
    wt, st, N, K, alpha = _mma_operands(op, w)
    ot = tensor(op, "out", out, BF16, ndim=2, shape=(N, K))
    same_device(op, wt, st, ot)
    so = row_stride(ot)
    _gemv._aligned(op, "out", ot, "out row stride", so)
    for t, name in ((wt, "words"), (st, "scales")):
        _gemv._no_overlap(op, t, ot, name, "out")
    fits_i32(op, stride_out=so)
    _dequant(op, wt, st, ot, alpha, N, K, s)
    return out


def pack(weight_packed, weight_scale, words, scales, *, stream=None):
    """Device: HF's linear NVFP4 (weight_packed [N, K/2] uint8, weight_scale [N, K/16] e4m3 or its bytes; any row
    strides) -> ``words`` / ``scales`` (int32, :func:`mma_shapes`, contiguous). NaN scales (0x7F / 0xFF) pack as
    zero weights: check the checkpoint first (:func:`pack_host` refuses them)."""
    op = "nvfp4.pack"
    s = stream_of(stream)
    pt, sct, N, K = _gemv.nvfp4_weights(op, weight_packed, weight_scale)
    wshape, sshape = mma_shapes(N, K)
    wt = tensor(op, "words", words, "int32", shape=wshape)
    st = tensor(op, "scales", scales, "int32", shape=sshape)
    same_device(op, pt, sct, wt, st)
    for t, name in ((wt, "words"), (st, "scales")):
        if t.ptr % 16 or tuple(t.strides) != tuple(int(np.prod(t.shape[i + 1:])) for i in range(len(t.shape))):
            raise OpError(f"{op}: {name} must be contiguous and 16-byte aligned")
        for src, sname in ((pt, "weight_packed"), (sct, "weight_scale")):
            _gemv._no_overlap(op, src, t, sname, name)
    sw, ss = row_stride(pt), row_stride(sct)
    fits_i32(op, N=N, K=K, stride_w=sw, stride_s=ss)
    k = get_kernel("gemv.nvfp4_mma_pack")
    _calls.launch((op,), None, (), [Launch(k, (cdiv(N, 16), cdiv(K, 128), 1), (pt, sct, wt, st, N, K, sw, ss))], s)
    return words, scales
