"""Typed ops of the gemm_fp8 family: FP8 e4m3 W8A8 GEMMs (bf16 out, fp32 accumulation, HF's [N, K] weight layout)
and the bf16 -> fp8 activation quantizers (Triton kernels, kernels_src/gemm_fp8/; built for sm_89, sm_90a, sm_100a,
sm_120a, sm_121a; on sm_90a linear_fp8 runs the CuTe DSL kernel of family gemm, see "Lanes" below).

    linear_fp8(x_q, x_scale, w_q, w_scale, out=None)        out[m, n] = (x_q[m] . w_q[n]) * x_scale[m] * w_scale[n]
    linear_fp8_block(x_q, x_scale, w_q, w_scale, out=None)  out[m, n] = sum_kb (x_q[m, kb] . w_q[n, kb])
                                                                        * x_scale[m, kb] * w_scale[n // 128, kb]
    quantize_fp8_per_token(x, out=None, scale=None)         -> (q, scale [M])            dynamic, per row
    quantize_fp8_per_tensor(x, scale, out=None)             -> q                          static, one scale
    quantize_fp8_per_token_group(x, out=None, scale=None)   -> (q, scale [M, cdiv(K, 128)])   per row per 128

Scales are MULTIPLIERS (dequantized value = fp8 value * scale), float32 on the device: per-tensor scales are
one-element device tensors, so a captured graph replays with new values. The quantizers compute
``q = satfinite(rn(x / scale))`` (IEEE division, clamped to +-448) and the dynamic scales as
``max(amax / 448, 1 / (448 * 512))`` (the floor keeps an all-zero row finite; its q is 0).

Layouts and requirements (checked before any launch, :class:`OpError` otherwise):
  x_q, w_q    [M, K] / [N, K] float8_e4m3fn (or their uint8 bytes), last dim contiguous, row stride % 16 elements,
              16-byte aligned; K a positive multiple of 16
  out         [M, N] bfloat16, last dim contiguous (row stride free), 16-byte aligned, not overlapping any input
  linear_fp8  x_scale: 1 element (per tensor) or M (per token: shape (M,) or (M, 1), any element stride);
              w_scale: 1 element or N (per output channel: (N,) or (N, 1), e.g. compressed-tensors' [N, 1])
  linear_fp8_block  x_scale [M, cdiv(K, 128)] float32 (quantize_fp8_per_token_group's layout; last dim contiguous,
              any row stride); w_scale [cdiv(N, 128), cdiv(K, 128)] float32: Qwen's ``weight_scale_inv`` (a
              multiplier despite its name). Checkpoints store it as bfloat16 (Qwen3 dense FP8) or float16: convert
              it to float32 once at weight load (exact); the op refuses other dtypes.
  quantizers  x [M, K] bfloat16, K % 16 == 0, row stride % 16, 16-byte aligned; out [M, K] fp8 likewise; scale
              float32: per token [M] (or [M, 1]) contiguous, per tensor 1 element, per group [M, cdiv(K, 128)] with
              a contiguous last dim.
M == 0 (or N == 0) returns without launching. Without ``out`` / ``scale`` the results are allocated with
:mod:`vkc_runtime.memory` (pass them inside graph capture; the launches allocate nothing). Calls with every
output passed and torch tensors are bound calls (vkc_runtime.bound), except the CuTe lane (below).

Tile rule of the Triton kernels (:func:`pick_tile`): among the compiled tiles of the arch (scaled: 128x256 on
sm_90a / sm_100a only, 128x128, 64x128; block: 128x128 (not on sm_100a), 64x128) the highest ``useful fraction of
the padded M x N x last-wave efficiency x tile factor`` (:data:`TILE_FACTOR`: the narrower tiles' lower MMA work
per byte loaded); ties go to the earlier (wider) tile. The factors are first guesses: benchmarks/bench_gemm_fp8.py times every tile
next to the rule's pick. The CuTe kernels use ops.gemm's rule.

Lanes of :func:`linear_fp8` and :func:`linear_fp8_block`: on sm_90a the CuTe DSL WGMMA kernels of family gemm
(``gemm.fp8.*`` / ``gemm.fp8_block.*``, launched through :func:`vkc_runtime.ops.gemm.launch_fp8` /
``launch_fp8_block``; they also need N and the out row stride to be multiples of 8, else the Triton kernel runs),
elsewhere the Triton kernels (``gemm_fp8.scaled.*`` / ``gemm_fp8.block.*``). ``_lane="cute"`` / ``"triton"`` forces
one. The CuTe launch is one C call on the explicit stream (capturable, allocation-free) but not a bound call: it
validates on every call. The CuTe block-scaled kernel promotes each 128-wide k-slice as the Triton one does (H200:
1.7-2.1x the Triton kernel at M >= 2048, BENCHMARKS.md session 22). The quantizers are Triton everywhere.

Small M (decode): these GEMMs run for any M >= 1, but no FP8 GEMV (weights read once at M <= 16) exists yet.
"""
from __future__ import annotations

from .. import memory
from ..bound import CallCache, Launch, disjoint
from ..errors import MissingKernelError
from ..kernels import get_kernel, has_kernel
from . import gemm as _cute
from ._check import (BF16, FP8, OpError, bindable, cdiv, f32_aligned, fits_i32, fp8_tensor, grid_y, no_overlap,
                     row_stride, rows16, same_device, stream_of, tensor, vector_step)
from ._check import sm_count as _sm_count

__all__ = ["linear_fp8", "linear_fp8_block", "quantize_fp8_per_token", "quantize_fp8_per_tensor",
           "quantize_fp8_per_token_group", "pick_tile", "TILES", "TILE_FACTOR", "GROUP", "FP8_MAX", "MIN_SCALE",
           "BASES", "OPTIONAL_BASES", "OpError"]

F32 = "float32"
GROUP = 128                        # block-wise scales: 128 columns of K (and 128 rows of N for the weights)
FP8_MAX = 448.0
MIN_SCALE = 1.0 / (448.0 * 512.0)  # the dynamic scales' floor (kernels_src/gemm_fp8/gemm_fp8.py)
KINDS = ("scaled", "block")
# kind -> (BLOCK_M, BLOCK_N) tiles, widest first (kernels_src/gemm_fp8/spec.py); the op uses those this arch has
# (scaled 128x256: sm_90a / sm_100a only; block 128x128: not sm_100a; 64x128: every FP8 arch)
TILES = {"scaled": ((128, 256), (128, 128), (64, 128)), "block": ((128, 128), (64, 128))}
TILE_FACTOR = {(128, 256): 1.0, (128, 128): 0.9, (64, 128): 0.75}
QUANTS = ("token", "tensor", "group")
_FP8_ARCHS = "sm_89, sm_90a, sm_100a, sm_120a, sm_121a"


def gemm_base(kind: str, bm: int, bn: int) -> str:
    """The GEMM kernel name (spelled once: the ops call this, OPTIONAL_BASES is built from it)."""
    return f"gemm_fp8.{kind}.t{bm}x{bn}"


def quant_base(kind: str) -> str:
    return f"gemm_fp8.quant_{kind}"


def load_quantizer(kind: str, device: int | None = None) -> bool:
    """Load the ``kind`` activation quantizer's kernel ("token" / "group") for ``device`` ahead of a graph capture
    (another op's workspace, e.g. ops.moe's W8A8 path); False where this arch has none."""
    if not has_kernel(quant_base(kind), device=device):
        return False
    get_kernel(quant_base(kind), device=device).load()
    return True


BASES: tuple[str, ...] = ()  # nothing on sm_80 / sm_86
OPTIONAL_BASES = tuple(gemm_base(k, bm, bn) for k in KINDS for bm, bn in TILES[k]) + \
    tuple(quant_base(q) for q in QUANTS)

_calls = CallCache(per_key=8)
def pick_tile(m: int, n: int, sms: int, tiles=TILES["scaled"]) -> tuple[int, int]:
    """The (BLOCK_M, BLOCK_N) tile for an [m, n] output on ``sms`` SMs among ``tiles`` (module docstring)."""
    return _cute.pick_mn_tile(m, n, sms, tiles, TILE_FACTOR)


# ---------------------------------------------------------------- validation helpers

def _check_k(op, K):
    if K <= 0 or K % 16:
        raise OpError(f"{op}: K = {K} must be a positive multiple of 16")


def _gemm_kernel(op, kind, M, N, dev):
    tiles = tuple(t for t in TILES[kind] if has_kernel(gemm_base(kind, *t)))
    if not tiles:
        raise MissingKernelError(f"{op}: no FP8 GEMM for this device's arch (built for {_FP8_ARCHS})",
                                 missing=[gemm_base(kind, *TILES[kind][-1])])
    bm, bn = pick_tile(M, N, _sm_count(dev), tiles)
    return get_kernel(gemm_base(kind, bm, bn)), bm, bn


def _operands(op, x_q, w_q, out):
    xt = fp8_tensor(op, "x_q", x_q)
    M, K = xt.shape
    wt = fp8_tensor(op, "w_q", w_q)
    N, Kw = wt.shape
    if Kw != K:
        raise OpError(f"{op}: w_q has shape {tuple(wt.shape)}, expected dim 1 == K = {K} (x_q is {tuple(xt.shape)})")
    res = out if out is not None else memory.DeviceArray.empty((M, N), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, N))
    return xt, wt, yt, res, M, N, K


def _gemm_common(op, xt, wt, yt, M, N, K):
    _check_k(op, K)
    sx = rows16(op, "x_q", xt, "K", K)
    sw = rows16(op, "w_q", wt, "K", K)
    if yt.ptr % 16:
        raise OpError(f"{op}: out data pointer {yt.ptr:#x} is not 16-byte aligned")
    so = row_stride(yt) if M > 1 else N
    if so < N:
        raise OpError(f"{op}: out rows overlap (row stride {so} < N = {N})")
    return sx, sw, so


# ---------------------------------------------------------------- GEMMs

def _cute_available() -> bool:
    """Whether the CuTe FP8 GEMM (family gemm, sm_90a) exists on this device's arch."""
    return _cute.has_fp8()


def _cute_block_available() -> bool:
    """Whether the CuTe block-scaled FP8 GEMM (family gemm, sm_90a) exists on this device's arch."""
    return _cute.has_fp8_block()


def _lane_for(op, _lane, N, so, available, what, base) -> str:
    """The lane of an FP8 GEMM call: ``_lane`` if forced (checked), else the CuTe kernel where ``available()`` and
    the bf16 output's TMA store allows it (N and the out row stride multiples of 8), else Triton."""
    cute_ok = N % 8 == 0 and so % 8 == 0
    lane = _lane or ("cute" if cute_ok and available() else "triton")
    if lane == "cute":
        if not cute_ok:
            raise OpError(f"{op}: the CuTe lane needs N ({N}) and the out row stride ({so}) to be multiples of 8")
        if not available():
            raise MissingKernelError(f"{op}: no CuTe {what} for this device's arch (built for sm_90a)",
                                     missing=[base])
    return lane


def linear_fp8(x_q, x_scale, w_q, w_scale, out=None, *, stream=None, _lane: str | None = None):
    """out[M, N] bf16 = (x_q [M, K] @ w_q [N, K]^T) * x_scale[m] * w_scale[n]; x_scale: 1 or M float32 elements,
    w_scale: 1 or N (module docstring). Returns ``out`` (allocated when None). ``_lane`` forces "cute" or
    "triton" (tests, benchmarks); by default the lane rule of the module docstring picks."""
    op = "linear_fp8"
    s = stream_of(stream)
    if _lane not in (None, "cute", "triton"):
        raise OpError(f"{op}: _lane must be None, 'cute' or 'triton', got {_lane!r}")
    if out is not None and _lane != "cute" and _calls.run((op, _lane), (x_q, x_scale, w_q, w_scale, out), (), s):
        return out
    xt, wt, yt, res, M, N, K = _operands(op, x_q, w_q, out)
    at = tensor(op, "x_scale", x_scale, F32, inner_contiguous=False)
    bt = tensor(op, "w_scale", w_scale, F32, inner_contiguous=False)
    dev = same_device(op, xt, wt, yt, at, bt)
    if M == 0 or N == 0:
        return res
    sx, sw, so = _gemm_common(op, xt, wt, yt, M, N, K)
    sa_step = vector_step(op, "x_scale", at, M, "per token")
    sb_step = vector_step(op, "w_scale", bt, N, "per channel")
    no_overlap(op, "out", yt, x_q=xt, w_q=wt, x_scale=at, w_scale=bt)
    fits_i32(op, M=M, N=N, K=K, stride_x=sx, stride_w=sw, stride_out=so, x_scale_step=sa_step,
             w_scale_step=sb_step, x_scale_span=(M - 1) * sa_step, w_scale_span=(N - 1) * sb_step)
    if _lane_for(op, _lane, N, so, _cute_available, "FP8 GEMM", _cute.fp8_base(_cute.TILES[0])) == "cute":
        _cute.launch_fp8(xt.ptr, sx, wt.ptr, sw, yt.ptr, so, at.ptr, sa_step, bt.ptr, sb_step, M, N, K, s)
        return res
    k, bm, bn = _gemm_kernel(op, "scaled", M, N, dev)
    grid = cdiv(M, bm) * cdiv(N, bn)
    fits_i32(op, grid=grid)
    launch = Launch(k, (grid, 1, 1), (xt, wt, yt, at, bt, M, N, K, sx, sw, so, sa_step, sb_step))
    _calls.launch((op, _lane), bindable(out, xt, at, wt, bt, yt), (), [launch], s,
                  relations=[disjoint(t, yt) for t in (xt, wt, at, bt)])
    return res


def linear_fp8_block(x_q, x_scale, w_q, w_scale, out=None, *, stream=None, _lane: str | None = None):
    """out[M, N] bf16 = sum over 128-wide k-blocks kb of (x_q[:, kb] @ w_q[:, kb]^T) * x_scale[m, kb] *
    w_scale[n // 128, kb]; x_scale [M, cdiv(K, 128)], w_scale [cdiv(N, 128), cdiv(K, 128)] float32 (module
    docstring). Returns ``out`` (allocated when None). ``_lane`` as in :func:`linear_fp8`."""
    op = "linear_fp8_block"
    s = stream_of(stream)
    if _lane not in (None, "cute", "triton"):
        raise OpError(f"{op}: _lane must be None, 'cute' or 'triton', got {_lane!r}")
    if out is not None and _lane != "cute" and _calls.run((op, _lane), (x_q, x_scale, w_q, w_scale, out), (), s):
        return out
    xt, wt, yt, res, M, N, K = _operands(op, x_q, w_q, out)
    kb = cdiv(K, GROUP)
    at = tensor(op, "x_scale", x_scale, F32, ndim=2, shape=(M, kb))
    try:
        bt = tensor(op, "w_scale", w_scale, F32, ndim=2, shape=(cdiv(N, GROUP), kb))
    except OpError as e:
        if "must be float32, got bfloat16" in str(e) or "must be float32, got float16" in str(e):
            raise OpError(f"{e} (convert weight_scale_inv to float32 once at weight load: exact)") from None
        raise
    dev = same_device(op, xt, wt, yt, at, bt)
    if M == 0 or N == 0:
        return res
    sx, sw, so = _gemm_common(op, xt, wt, yt, M, N, K)
    ssa = row_stride(at) if M > 1 else kb
    ssb = row_stride(bt) if bt.shape[0] > 1 else kb
    f32_aligned(op, "x_scale", at)
    f32_aligned(op, "w_scale", bt)
    no_overlap(op, "out", yt, x_q=xt, w_q=wt, x_scale=at, w_scale=bt)
    fits_i32(op, M=M, N=N, K=K, stride_x=sx, stride_w=sw, stride_out=so, x_scale_stride=ssa,
             w_scale_stride=ssb, x_scale_span=(M - 1) * ssa + kb, w_scale_span=(bt.shape[0] - 1) * ssb + kb)
    if _lane_for(op, _lane, N, so, _cute_block_available, "block-scaled FP8 GEMM",
                 _cute.fp8_block_base(*_cute.FP8_BLOCK_TILES[0])) == "cute":
        _cute.launch_fp8_block(xt.ptr, sx, wt.ptr, sw, yt.ptr, so, at.ptr, ssa, bt.ptr, ssb, M, N, K, s)
        return res
    k, bm, bn = _gemm_kernel(op, "block", M, N, dev)
    grid = cdiv(M, bm) * cdiv(N, bn)
    fits_i32(op, grid=grid)
    launch = Launch(k, (grid, 1, 1), (xt, wt, yt, at, bt, M, N, K, sx, sw, so, ssa, ssb))
    _calls.launch((op, _lane), bindable(out, xt, at, wt, bt, yt), (), [launch], s,
                  relations=[disjoint(t, yt) for t in (xt, wt, at, bt)])
    return res


# ---------------------------------------------------------------- quantizers

def _quant_io(op, x, out):
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, K = xt.shape
    res = out if out is not None else memory.DeviceArray.empty((M, K), FP8, device=xt.device)
    qt = fp8_tensor(op, "out", res, shape=(M, K))
    return xt, qt, res, M, K


def _quant_rows(op, xt, qt, M, K):
    _check_k(op, K)
    sx = rows16(op, "x", xt, "K", K)
    sq = rows16(op, "out", qt, "K", K)
    fits_i32(op, M=M, K=K, stride_x=sx, stride_out=sq)
    return sx, sq


def quantize_fp8_per_token(x, out=None, scale=None, *, stream=None):
    """Dynamic per-token quantization of x [M, K] bf16: scale[m] = max(amax(|x[m]|) / 448, MIN_SCALE), out = fp8(x /
    scale[m]). Returns ``(out, scale)`` (allocated when None; scale: [M] float32, contiguous)."""
    op = "quantize_fp8_per_token"
    s = stream_of(stream)
    if out is not None and scale is not None and _calls.run(op, (x, out, scale), (), s):
        return out, scale
    xt, qt, res, M, K = _quant_io(op, x, out)
    sres = scale if scale is not None else memory.DeviceArray.empty((M,), F32, device=xt.device)
    st = tensor(op, "scale", sres, F32, inner_contiguous=False)
    dev = same_device(op, xt, qt, st)  # noqa: F841 (one device or an error)
    if M == 0:
        return res, sres
    if vector_step(op, "scale", st, M, "per token") not in (0, 1):
        raise OpError(f"{op}: scale must be contiguous ({M} float32 elements)")
    sx, sq = _quant_rows(op, xt, qt, M, K)
    no_overlap(op, "out", qt, x=xt, scale=st)
    no_overlap(op, "scale", st, x=xt)
    k = get_kernel(quant_base("token"))
    launch = Launch(k, (M, 1, 1), (xt, qt, st, K, sx, sq))
    _calls.launch(op, None if out is None or scale is None else (xt, qt, st), (), [launch], s,
                  relations=[disjoint(xt, qt), disjoint(xt, st), disjoint(qt, st)])
    return res, sres


def quantize_fp8_per_tensor(x, scale, out=None, *, stream=None):
    """Static per-tensor quantization: out = fp8(x / scale[0]) with ``scale`` a one-element float32 device tensor
    (the multiplier the checkpoint's ``input_scale`` holds). Returns ``out`` (allocated when None)."""
    op = "quantize_fp8_per_tensor"
    s = stream_of(stream)
    if out is not None and _calls.run(op, (x, scale, out), (), s):
        return out
    xt, qt, res, M, K = _quant_io(op, x, out)
    st = tensor(op, "scale", scale, F32, inner_contiguous=False)
    if vector_step(op, "scale", st, 1, "per tensor") != 0:
        raise OpError(f"{op}: scale must have one element")
    same_device(op, xt, qt, st)
    if M == 0:
        return res
    sx, sq = _quant_rows(op, xt, qt, M, K)
    no_overlap(op, "out", qt, x=xt, scale=st)
    k = get_kernel(quant_base("tensor"))
    launch = Launch(k, (M, grid_y(op, cdiv(K, k.constexprs["BLOCK"])), 1), (xt, qt, st, K, sx, sq))
    _calls.launch(op, bindable(out, xt, st, qt), (), [launch], s, relations=[disjoint(xt, qt), disjoint(st, qt)])
    return res


def quantize_fp8_per_token_group(x, out=None, scale=None, *, stream=None):
    """Dynamic quantization per token per group of 128 columns (the block GEMM's activation layout):
    scale[m, g] = max(amax(|x[m, 128 g : 128 g + 128]|) / 448, MIN_SCALE). Returns ``(out, scale)`` (allocated when
    None; scale: [M, cdiv(K, 128)] float32)."""
    op = "quantize_fp8_per_token_group"
    s = stream_of(stream)
    if out is not None and scale is not None and _calls.run(op, (x, out, scale), (), s):
        return out, scale
    xt, qt, res, M, K = _quant_io(op, x, out)
    kb = cdiv(K, GROUP)
    sres = scale if scale is not None else memory.DeviceArray.empty((M, kb), F32, device=xt.device)
    st = tensor(op, "scale", sres, F32, ndim=2, shape=(M, kb))
    same_device(op, xt, qt, st)
    if M == 0:
        return res, sres
    sx, sq = _quant_rows(op, xt, qt, M, K)
    ss = row_stride(st) if M > 1 else kb
    f32_aligned(op, "scale", st)
    if ss < kb:
        raise OpError(f"{op}: scale rows overlap (row stride {ss} < {kb})")
    fits_i32(op, scale_stride=ss)
    no_overlap(op, "out", qt, x=xt, scale=st)
    no_overlap(op, "scale", st, x=xt)
    k = get_kernel(quant_base("group"))
    grid = (cdiv(M, k.constexprs["ROWS"]), grid_y(op, cdiv(kb, k.constexprs["GROUPS"])), 1)
    launch = Launch(k, grid, (xt, qt, st, K, sx, sq, ss, M))
    _calls.launch(op, None if out is None or scale is None else (xt, qt, st), (), [launch], s,
                  relations=[disjoint(xt, qt), disjoint(xt, st), disjoint(qt, st)])
    return res, sres
