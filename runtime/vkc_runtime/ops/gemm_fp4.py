"""Typed ops of the gemm_fp4 family: the NVFP4 W4A4 GEMM (bf16 out, fp32 accumulation, HF's [N, K] weight rows)
and the bf16 -> NVFP4 activation quantizer (Triton kernels, kernels_src/gemm_fp4/).

    quantize_nvfp4(x, global_scale, out=None, scale=None)       -> (q [M, K/2] uint8, scale [M, K/16] e4m3)
    linear_w4a4(x_q, x_scale, w_q, w_scale, alpha, out=None)    out[m, n] = alpha * sum_k a[m, k] w[n, k]
    linear_nvfp4_w4a4(x, global_scale, w_q, w_scale, alpha, out=None, x_q=None, x_scale=None)   both, in turn

NVFP4 values: e2m1 codes two per byte, k = 2j in the LOW nibble of byte j; one float8 e4m3 scale per 16 along K;
a[m, k] = e2m1 * scale. The quantizer takes the activation's global scale as a DIVISOR (x ~ e2m1 * scale /
global_scale: compressed-tensors' ``input_global_scale``; for ModelOpt pass 1 / ``input_scale``) and computes,
per 16, scale = e4m3(satfinite(rn(amax / 6) * global_scale)) and the nearest-even e2m1 code of x *
rn(global_scale / scale), saturated at +-6 (kernels_src/gemm_fp4/gemm_fp4.py). ``alpha`` is the product of the two
global multipliers (compressed-tensors: 1 / (input_global_scale * weight_global_scale); ModelOpt: input_scale *
weight_scale_2). ``global_scale`` and ``alpha`` are one-element float32 device tensors, so a captured graph
replays with the values they hold then.

Where it runs: sm_100a (tcgen05 NVFP4 MMA), sm_120a / sm_121a (mma.sync NVFP4 MMA) -- **build-verified**: vkc has
no Blackwell GPU to run them on -- and sm_90a, where the same source is compiled with Triton's bf16 emulation of
the block-scaled MMA (exact products, fp32 accumulation): it exists so that the kernels are checked on the H100 /
H200, and is not a fast path (NVFP4 checkpoints run as W4A16 there: ops.nvfp4). Other archs: MissingKernelError.

Layouts and requirements (checked before any launch, :class:`OpError` otherwise):
  x_q, w_q          [M, K/2] / [N, K/2] uint8, last dim contiguous, 16-byte aligned, row stride % 16 bytes;
                    K = 2 * x_q.shape[1] a positive multiple of 32
  x_scale, w_scale  [M, K/16] / [N, K/16] float8_e4m3fn (or its uint8 bytes), last dim contiguous, any row stride
  out               [M, N] bfloat16, last dim contiguous, 16-byte aligned, not overlapping an input
  x                 [M, K] bfloat16, last dim contiguous, 16-byte aligned, row stride % 16 elements
M == 0 (or N == 0) returns without launching. Without ``out`` / ``scale`` the results are allocated with
:mod:`vkc_runtime.memory` (pass them inside graph capture: the launches allocate nothing). Calls with every output
passed and torch tensors are bound calls (vkc_runtime.bound).

Tile rule: ops.gemm's :func:`~vkc_runtime.ops.gemm.pick_mn_tile` over the compiled tiles (128x128, 64x128) with
:data:`TILE_FACTOR`; first guesses, never timed on a Blackwell device.
"""
from __future__ import annotations

from .. import memory
from ..bound import CallCache, Launch, disjoint
from ..errors import MissingKernelError
from ..kernels import get_kernel, has_kernel
from . import gemm as _gemm
from ._check import (BF16, FP8, OpError, bindable, cdiv, f32_aligned, fits_i32, fp8_tensor, grid_y, no_overlap,
                     row_stride, rows16, same_device, stream_of, tensor, vector_step)
from ._check import sm_count as _sm_count

__all__ = ["linear_w4a4", "quantize_nvfp4", "linear_nvfp4_w4a4", "TILES", "TILE_FACTOR", "GROUP", "BASES",
           "OPTIONAL_BASES", "OpError"]

GROUP = 16                          # e4m3 scale per 16 values along K
TILES = ((128, 128), (64, 128))     # kernels_src/gemm_fp4/spec.py
TILE_FACTOR = {(128, 128): 1.0, (64, 128): 0.85}
_ARCHS = "sm_90a (bf16 emulation, for verification), sm_100a, sm_120a, sm_121a"
U8 = "uint8"
F32 = "float32"


def gemm_base(bm: int, bn: int) -> str:
    """The GEMM kernel name (spelled once: the ops call this, OPTIONAL_BASES is built from it)."""
    return f"gemm_fp4.w4a4.t{bm}x{bn}"


QUANT_BASE = "gemm_fp4.quant"
BASES: tuple[str, ...] = ()  # nothing on sm_80 / sm_86 / sm_89
OPTIONAL_BASES = tuple(gemm_base(bm, bn) for bm, bn in TILES) + (QUANT_BASE,)

_calls = CallCache(per_key=8)


def _packed(op, name, obj, rows=None):
    return tensor(op, name, obj, U8, ndim=2, shape=None if rows is None else (rows, None))


def _check_k(op, K):
    if K <= 0 or K % 32:
        raise OpError(f"{op}: K = {K} must be a positive multiple of 32")


def _scale_rows(op, name, t, rows, K) -> int:
    if tuple(t.shape) != (rows, K // GROUP):
        raise OpError(f"{op}: {name} has shape {tuple(t.shape)}, expected ({rows}, {K // GROUP}) (K / {GROUP})")
    ld = row_stride(t) if rows > 1 else K // GROUP
    if ld < K // GROUP:
        raise OpError(f"{op}: {name} rows overlap (row stride {ld} < {K // GROUP})")
    return ld


def _one_f32(op, name, obj):
    t = tensor(op, name, obj, F32, inner_contiguous=False)
    if vector_step(op, name, t, 1, "per tensor") != 0:
        raise OpError(f"{op}: {name} must have one element")
    return t


def _missing(op, base) -> MissingKernelError:
    return MissingKernelError(f"{op}: no NVFP4 W4A4 kernel for this device's arch (built for {_ARCHS})",
                              missing=[base])


def linear_w4a4(x_q, x_scale, w_q, w_scale, alpha, out=None, *, stream=None):
    """out[M, N] bf16 = alpha * (x_q @ w_q^T) over NVFP4 operands (module docstring). Returns ``out`` (allocated
    when None)."""
    op = "linear_w4a4"
    s = stream_of(stream)
    if out is not None and _calls.run(op, (x_q, x_scale, w_q, w_scale, alpha, out), (), s):
        return out
    xt = _packed(op, "x_q", x_q)
    M, K = xt.shape[0], 2 * xt.shape[1]
    wt = _packed(op, "w_q", w_q)
    N = wt.shape[0]
    if 2 * wt.shape[1] != K:
        raise OpError(f"{op}: w_q has shape {tuple(wt.shape)}, expected dim 1 == K / 2 = {K // 2} (x_q is "
                      f"{tuple(xt.shape)})")
    at = fp8_tensor(op, "x_scale", x_scale)
    bt = fp8_tensor(op, "w_scale", w_scale)
    ct = _one_f32(op, "alpha", alpha)
    res = out if out is not None else memory.DeviceArray.empty((M, N), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, N))
    dev = same_device(op, xt, wt, at, bt, ct, yt)
    if M == 0 or N == 0:
        return res
    _check_k(op, K)
    sx = rows16(op, "x_q", xt, "K / 2", K // 2)
    sw = rows16(op, "w_q", wt, "K / 2", K // 2)
    ssa = _scale_rows(op, "x_scale", at, M, K)
    ssb = _scale_rows(op, "w_scale", bt, N, K)
    if yt.ptr % 16:
        raise OpError(f"{op}: out data pointer {yt.ptr:#x} is not 16-byte aligned")
    so = row_stride(yt) if M > 1 else N
    if so < N:
        raise OpError(f"{op}: out rows overlap (row stride {so} < N = {N})")
    f32_aligned(op, "alpha", ct)
    no_overlap(op, "out", yt, x_q=xt, w_q=wt, x_scale=at, w_scale=bt, alpha=ct)
    tiles = tuple(t for t in TILES if has_kernel(gemm_base(*t)))
    if not tiles:
        raise _missing(op, gemm_base(*TILES[0]))
    bm, bn = _gemm.pick_mn_tile(M, N, _sm_count(dev), tiles, TILE_FACTOR)
    k = get_kernel(gemm_base(bm, bn))
    grid = cdiv(M, bm) * cdiv(N, bn)
    fits_i32(op, M=M, N=N, K=K, stride_x=sx, stride_w=sw, stride_out=so, x_scale_stride=ssa, w_scale_stride=ssb,
             grid=grid, x_span=(M - 1) * sx + K // 2, w_span=(N - 1) * sw + K // 2,
             x_scale_span=(M - 1) * ssa + K // GROUP, w_scale_span=(N - 1) * ssb + K // GROUP)
    launch = Launch(k, (grid, 1, 1), (xt, at, wt, bt, ct, yt, M, N, K, sx, ssa, sw, ssb, so))
    _calls.launch(op, bindable(out, xt, at, wt, bt, ct, yt), (), [launch], s,
                  relations=[disjoint(t, yt) for t in (xt, at, wt, bt, ct)])
    return res


def quantize_nvfp4(x, global_scale, out=None, scale=None, *, stream=None):
    """x [M, K] bf16 -> (q [M, K/2] uint8, scale [M, K/16] float8_e4m3fn) with the activation's global scale
    (a divisor, module docstring). Returns ``(out, scale)`` (allocated when None)."""
    op = "quantize_nvfp4"
    s = stream_of(stream)
    if out is not None and scale is not None and _calls.run(op, (x, global_scale, out, scale), (), s):
        return out, scale
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, K = xt.shape
    gt = _one_f32(op, "global_scale", global_scale)
    res = out if out is not None else memory.DeviceArray.empty((M, K // 2), U8, device=xt.device)
    qt = _packed(op, "out", res, rows=M)
    if 2 * qt.shape[1] != K:
        raise OpError(f"{op}: out has shape {tuple(qt.shape)}, expected ({M}, {K // 2}) (K / 2)")
    sres = scale if scale is not None else memory.DeviceArray.empty((M, K // GROUP), FP8, device=xt.device)
    st = fp8_tensor(op, "scale", sres)
    same_device(op, xt, gt, qt, st)
    if M == 0:
        return res, sres
    _check_k(op, K)
    sx = rows16(op, "x", xt, "K", K)
    sq = rows16(op, "out", qt, "K / 2", K // 2)
    ss = _scale_rows(op, "scale", st, M, K)
    f32_aligned(op, "global_scale", gt)
    no_overlap(op, "out", qt, x=xt, global_scale=gt, scale=st)
    no_overlap(op, "scale", st, x=xt, global_scale=gt)
    if not has_kernel(QUANT_BASE):
        raise _missing(op, QUANT_BASE)
    k = get_kernel(QUANT_BASE)
    c = k.constexprs
    grid = (cdiv(M, c["ROWS"]), grid_y(op, cdiv(K // GROUP, c["GROUPS"])), 1)
    fits_i32(op, M=M, K=K, stride_x=sx, stride_out=sq, scale_stride=ss, x_span=(M - 1) * sx + K,
             out_span=(M - 1) * sq + K // 2, scale_span=(M - 1) * ss + K // GROUP)
    launch = Launch(k, grid, (xt, gt, qt, st, M, K, sx, sq, ss))
    _calls.launch(op, None if out is None or scale is None else (xt, gt, qt, st), (), [launch], s,
                  relations=[disjoint(xt, qt), disjoint(xt, st), disjoint(qt, st), disjoint(gt, qt),
                             disjoint(gt, st)])
    return res, sres


def linear_nvfp4_w4a4(x, global_scale, w_q, w_scale, alpha, out=None, *, x_q=None, x_scale=None, stream=None):
    """out = linear_w4a4(quantize_nvfp4(x, global_scale), w_q, w_scale, alpha): two launches. ``x_q`` /
    ``x_scale``: the quantized activations' buffers ([M, K/2] uint8, [M, K/16] e4m3; pass them inside a graph
    capture)."""
    q, sc = quantize_nvfp4(x, global_scale, out=x_q, scale=x_scale, stream=stream)
    return linear_w4a4(q, sc, w_q, w_scale, alpha, out=out, stream=stream)
