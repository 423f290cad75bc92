"""Typed GEMM ops: ``linear(x, weight)`` = ``x @ weight.T`` (a Linear layer without bias, HF weight layout).

    out[M, N] = x[M, K] @ weight[N, K]^T        bf16 in and out, fp32 accumulation
    linear_w4a16(x, weight_packed, weight_scale, global_scale)
                                                the same with NVFP4 weights dequantized in the kernel (W4A16)
    dequantize_nvfp4(weight_packed, weight_scale, global_scale, out)
                                                out[N, K] bf16 = the NVFP4 weights times the multiplier

and the launchers of the CuTe FP8 GEMMs (:func:`launch_fp8`: fp8 e4m3 operands, per-tensor or per-token x
per-channel fp32 scales in the epilogue; :func:`launch_fp8_block`: 128 x 128 weight-block and 1 x 128 activation
scales promoted per k-slice), which :func:`vkc_runtime.ops.gemm_fp8.linear_fp8` / ``linear_fp8_block`` validate
for and call on sm_90a (that module owns the FP8 API and its checks).

Two lanes (``kernels_src/gemm/``; M, N and K are runtime values in both):

* ``cute``: CuTe DSL WGMMA/TMA GEMMs (artifact kind ``cute-so``), built for sm_90a (``OPTIONAL_BASES``); the
  default wherever they exist.
* ``triton``: the portable Triton GEMM (``gemm.bf16.mma.t*``, cubins, ``BASES``: every arch), lowered to each
  arch's tensor-core MMA (mma.sync on sm_80 / 86 / 89 / 120a / 121a, tcgen05 on sm_100a; wgmma on sm_90a, where
  ``_lane="triton"`` forces it for tests and benchmarks). It also needs K and the x / weight row strides to be
  multiples of 16 (its div=16 specialization). Calls with ``out=`` and torch tensors are bound calls
  (vkc_runtime.bound); the CuTe launch validates on every call.

Requirements (checked here, OpError before any launch; the launcher re-checks them): bf16 2-D tensors on one
device; the last dim contiguous; K and N multiples of 8 (K >= 8), row strides multiples of 8 elements and at least
the row length (a row stride > K or > N is fine: views into wider buffers), every data pointer 16-byte aligned
(TMA); M, N, K < 2^31, row strides < 2^36; ``out`` must not overlap ``x`` or ``weight``. M == 0 or N == 0 returns
``out`` without launching. Without ``out`` the result is allocated with :mod:`vkc_runtime.memory` (pass ``out``
inside graph capture; the launch itself allocates nothing).

``linear_w4a16`` (Triton, every arch: ``gemm.w4a16.t*``) is the large-M side of
:func:`vkc_runtime.ops.gemv.gemv_w4a16` (same operands, layout and checks, see that module: packed e2m1 [N, K/2]
low nibble first, linear e4m3 scales [N, K/16], one fp32 multiplier), for any M: each k-slice of the weights is
decoded to exact bf16 in registers and multiplied on the tensor cores. Bound calls when ``out`` is given. With a
``workspace`` (a contiguous bf16 tensor of at least N * K elements) and M >= :data:`DEQUANT_MIN_M`, it instead
dequantizes the weights once into the workspace (``dequantize_nvfp4``: bf16(W * multiplier), one rounding per
weight) and runs :func:`linear` on them: decoding every k-slice once per 128-row tile costs the fused kernel
0.24-0.40x cuBLAS bf16 at M >= 2048 on the H200, where the bf16 GEMM reaches 0.82-0.99x and the dequantization
adds one pass over the weights (BENCHMARKS.md, session 14).

Tile rule of the CuTe lane (:func:`pick_tile`): among the compiled tiles (128x256, 128x128, 128x64) take the one
with the highest ``useful fraction x last-wave efficiency x tile factor``, where the useful fraction is N / (N
rounded up to the tile width), the wave efficiency is tiles / (waves x SMs) on this device's SM count, and the
tile factor (:data:`TILE_FACTOR`) discounts the narrower tiles' lower MMA work per shared-memory byte. Ties go to
the wider tile. The Triton lane scores its (BLOCK_M, BLOCK_N) tiles (:data:`MMA_TILES`: 128x256, 128x128, 64x128)
the same way with M padding counted too (:func:`pick_mn_tile`, :data:`MMA_TILE_FACTOR`), and so does the
block-scaled FP8 kernel over its (tile_m, tile_n) tiles (:func:`pick_block_tile`: 192x128, 128x128, 128x64,
:data:`FP8_BLOCK_TILE_FACTOR`). The factors are fitted to benchmarks/bench_gemm.py / bench_gemm_fp8.py, which time
every tile (re-fit them from their JSON).

Plans (:func:`plan_tactic`): when the resolved GEMM plan of the device (:mod:`vkc_runtime.plans`: the committed
default plan of the arch, a native plan file, a warm-up's tuned entries) covers the call's (M bucket, N, K), its
tactic is launched instead; the rule above is the default when no plan says otherwise.
"""
from __future__ import annotations

from .. import memory, plans
from ..bound import CallCache, Launch, disjoint, run_launches
from ..errors import MissingKernelError
from ..kernels import get_kernel, has_kernel
from ..tensor import TensorRef
from . import gemv as _gemv
from ._check import OpError, bindable, cdiv, fits_i32, row_stride, same_device, stream_of, tensor
from ._check import sm_count as _sm_count

__all__ = ["linear", "linear_w4a16", "dequantize_nvfp4", "DEQUANT_MIN_M", "pick_tile", "pick_mn_tile", "plan_tactic",
           "gemm_base", "mma_base", "w4a16_base", "fp8_base", "fp8_block_base", "has_fp8", "has_fp8_block", "has_cute",
           "launch_fp8", "launch_fp8_block", "pick_block_tile", "FP8_BLOCK_TILES", "FP8_BLOCK_TILE_FACTOR", "TILES",
           "TILE_FACTOR", "MMA_TILES", "MMA_TILE_FACTOR", "LANES", "BASES", "OPTIONAL_BASES", "OpError"]

BF16 = "bfloat16"
TILE_M = 128
TILES = (256, 128, 64)  # tile widths (N) of the compiled kernels, all 128 rows
TILE_FACTOR = {256: 1.0, 128: 0.93, 64: 0.72}
# the block-scaled FP8 kernels' (tile_m, tile_n), kernels_src/gemm/spec.py (a second fp32 tile of registers: no 256
# wide tile; 192 rows: three math warp groups)
FP8_BLOCK_TILES = ((192, 128), (128, 128), (128, 64))
# (fitted: median over session 32's H100 runs of benchmarks/bench_gemm_fp8.py, each tile's time against the
# 192x128 tile's with the wave and padding terms divided out)
FP8_BLOCK_TILE_FACTOR = {(192, 128): 1.0, (128, 128): 0.84, (128, 64): 0.69}
MAX_DIM = 2**31 - 1
# the Triton lane's (BLOCK_M, BLOCK_N) tiles, widest first (kernels_src/gemm/spec.py MMA_TILES)
MMA_TILES = ((128, 256), (128, 128), (64, 128))
MMA_TILE_FACTOR = {(128, 256): 1.0, (128, 128): 0.9, (64, 128): 0.75}
W4A16_TILES = ((128, 128), (64, 128))  # kernels_src/gemm/spec.py W4A16_TILES
DEQUANT_MIN_M = 128  # linear_w4a16 with a workspace: dequantize + the bf16 GEMM from this M on (module docstring)
DEQUANT_BLOCK = (16, 256)  # nvfp4_dequant's (BLOCK_N, BLOCK_K)
LANES = ("cute", "triton")
MAX_STRIDE = 2**36  # elements; TMA strides must stay below 2^40 bytes


def gemm_base(tile_n: int) -> str:
    """The base name of the bf16 GEMM kernel with a 128 x ``tile_n`` tile (kernels_src/gemm/spec.py)."""
    return f"gemm.bf16.t{TILE_M}x{tile_n}"


def fp8_base(tile_n: int) -> str:
    """The base name of the FP8 (e4m3, scaled) GEMM kernel with a 128 x ``tile_n`` tile."""
    return f"gemm.fp8.t{TILE_M}x{tile_n}"


def fp8_block_base(tile_m: int, tile_n: int) -> str:
    """The base name of the block-scaled FP8 GEMM kernel with a ``tile_m`` x ``tile_n`` tile."""
    return f"gemm.fp8_block.t{tile_m}x{tile_n}"


def mma_base(bm: int, bn: int) -> str:
    """The base name of the Triton bf16 GEMM kernel with a ``bm`` x ``bn`` tile."""
    return f"gemm.bf16.mma.t{bm}x{bn}"


def w4a16_base(bm: int, bn: int) -> str:
    """The base name of the Triton NVFP4 W4A16 GEMM kernel with a ``bm`` x ``bn`` tile."""
    return f"gemm.w4a16.t{bm}x{bn}"


DEQUANT_BASE = "gemm.nvfp4_dequant"
BASES = tuple(mma_base(*t) for t in MMA_TILES) + tuple(w4a16_base(*t) for t in W4A16_TILES) + (DEQUANT_BASE,)
# the CuTe lane: sm_90a
OPTIONAL_BASES = (tuple(gemm_base(t) for t in TILES) + tuple(fp8_base(t) for t in TILES)
                  + tuple(fp8_block_base(*t) for t in FP8_BLOCK_TILES))

_calls = CallCache(per_key=8)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pick_tile(m: int, n: int, sms: int, tiles=TILES) -> int:
    """The tile width for an [m, n] output on ``sms`` SMs (module docstring)."""
    def score(tn: int) -> tuple[float, int]:
        n_tiles = _cdiv(n, tn)
        total = _cdiv(max(m, 1), TILE_M) * n_tiles
        waves = _cdiv(total, sms)
        return (n / (n_tiles * tn)) * (total / (waves * sms)) * TILE_FACTOR[tn], tn
    return max(tiles, key=score)


def pick_mn_tile(m: int, n: int, sms: int, tiles, factor) -> tuple[int, int]:
    """The (BLOCK_M, BLOCK_N) of ``tiles`` with the highest ``useful fraction of the padded M x N x last-wave
    efficiency x factor[tile]`` for an [m, n] output on ``sms`` SMs; ties go to the earlier (wider) tile."""
    best = None
    for t in tiles:
        bm, bn = t
        tm, tn = cdiv(max(m, 1), bm), cdiv(n, bn)
        total = tm * tn
        useful = (max(m, 1) / (tm * bm)) * (n / (tn * bn))
        score = useful * (total / (cdiv(total, sms) * sms)) * factor[t]
        if best is None or score > best[0] + 1e-9:
            best = (score, t)
    return best[1]


def pick_block_tile(m: int, n: int, sms: int) -> tuple[int, int]:
    """The block-scaled FP8 kernel's (tile_m, tile_n) for an [m, n] output on ``sms`` SMs (:func:`pick_mn_tile`
    over :data:`FP8_BLOCK_TILES`)."""
    return pick_mn_tile(m, n, sms, FP8_BLOCK_TILES, FP8_BLOCK_TILE_FACTOR)


def has_cute() -> bool:
    """Whether this device's arch has the CuTe bf16 GEMM (sm_90a)."""
    return has_kernel(OPTIONAL_BASES[0])


def plan_tactic(m: int, n: int, k: int):
    """The tactic (:class:`vkc_runtime.plans.tactics.Tactic`) the resolved plan names for this call, or None: then
    :func:`pick_tile` decides. No plan file is read or written inside a graph capture."""
    return plans.gemm_tactic(m, n, k)


def _span(t, ld: int) -> tuple[int, int]:
    rows, cols = t.shape
    return t.ptr, t.ptr + ((rows - 1) * ld + cols) * 2


def _check_layout(op: str, name: str, t, cols_name: str) -> int:
    rows, cols = t.shape
    ld = row_stride(t) if rows > 1 else cols  # one row: its stride is never used
    if ld < cols:
        raise OpError(f"{op}: {name} rows overlap (row stride {ld} < {cols_name} = {cols})")
    if ld % 8:
        raise OpError(f"{op}: {name} row stride {ld} must be a multiple of 8 elements (16-byte TMA pitch)")
    if ld >= MAX_STRIDE:
        raise OpError(f"{op}: {name} row stride {ld} exceeds {MAX_STRIDE - 1} elements")
    if t.ptr % 16:
        raise OpError(f"{op}: {name} data pointer {t.ptr:#x} is not 16-byte aligned")
    return ld


def linear(x, weight, out=None, *, stream=None, _lane: str | None = None):
    """out[M, N] = x[M, K] @ weight[N, K]^T (bf16; module docstring for the requirements). Returns ``out``.
    ``_lane`` forces "cute" or "triton" (tests, benchmarks); by default the CuTe lane runs where it exists."""
    op = "linear"
    s = stream_of(stream)
    if _lane is not None and _lane not in LANES:
        raise OpError(f"{op}: _lane must be None, 'cute' or 'triton', got {_lane!r}")
    if out is not None and _lane != "cute" and _calls.run((op, _lane), (x, weight, out), (), s):
        return out
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, K = xt.shape
    wt = tensor(op, "weight", weight, BF16, ndim=2)
    N, Kw = wt.shape
    if Kw != K:
        raise OpError(f"{op}: weight has shape {tuple(wt.shape)}, expected dim 1 == K = {K} (x is {tuple(xt.shape)})")
    res = out if out is not None else memory.DeviceArray.empty((M, N), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, N))
    dev = same_device(op, xt, wt, yt)
    if M == 0 or N == 0:
        return res
    if K == 0 or K % 8 or N % 8:
        raise OpError(f"{op}: K = {K} and N = {N} must be positive multiples of 8 (16-byte TMA rows)")
    for name, v in (("M", M), ("N", N), ("K", K)):
        if v > MAX_DIM:
            raise OpError(f"{op}: {name} = {v} exceeds {MAX_DIM}")
    lda = _check_layout(op, "x", xt, "K")
    ldw = _check_layout(op, "weight", wt, "K")
    ldc = _check_layout(op, "out", yt, "N")
    c0, c1 = _span(yt, ldc)
    for name, t, ld in (("x", xt, lda), ("weight", wt, ldw)):
        a0, a1 = _span(t, ld)
        if a0 < c1 and c0 < a1:
            raise OpError(f"{op}: out must not overlap {name}")
    lane = _lane or ("cute" if has_cute() else "triton")
    if lane == "triton":
        _launch_mma(op, (op, _lane), xt, wt, yt, lda, ldw, ldc, M, N, K, dev, s, out)
        return res
    if not has_cute():
        raise MissingKernelError(f"{op}: no CuTe bf16 GEMM for this device's arch (built for sm_90a; "
                                 f"the Triton lane runs everywhere)", missing=[OPTIONAL_BASES[0]])
    k0 = get_kernel(OPTIONAL_BASES[0])
    t = plan_tactic(M, N, K)
    tn = t.tile_n if t is not None else pick_tile(M, N, _sm_count(k0.device))
    if _cdiv(M, TILE_M) * _cdiv(N, tn) > MAX_DIM:
        raise OpError(f"{op}: M = {M}, N = {N} need more than {MAX_DIM} tiles")
    base = t.base if t is not None else gemm_base(tn)
    k = k0 if base == OPTIONAL_BASES[0] else get_kernel(base)
    k.launch(xt.ptr, lda, wt.ptr, ldw, yt.ptr, ldc, M, N, K, s)
    return res


def _launch_mma(op, key, xt, wt, yt, lda, ldw, ldc, M, N, K, dev, s, out):
    """The Triton lane: its div=16 promises checked, the tile picked, one launch (bound when ``out`` was given)."""
    if K % 16 or lda % 16 or ldw % 16:
        raise OpError(f"{op}: the Triton lane needs K ({K}) and the x / weight row strides ({lda} / {ldw}) to be "
                      f"multiples of 16")
    fits_i32(op, stride_x=lda, stride_w=ldw, stride_out=ldc)
    tiles = tuple(t for t in MMA_TILES if has_kernel(mma_base(*t)))
    if not tiles:
        raise MissingKernelError(f"{op}: no Triton bf16 GEMM in this arch's artifacts",
                                 missing=[mma_base(*MMA_TILES[0])])
    bm, bn = pick_mn_tile(M, N, _sm_count(dev), tiles, MMA_TILE_FACTOR)
    grid = cdiv(M, bm) * cdiv(N, bn)
    fits_i32(op, grid=grid)
    launch = Launch(get_kernel(mma_base(bm, bn)), (grid, 1, 1), (xt, wt, yt, M, N, K, lda, ldw, ldc))
    _calls.launch(key, bindable(out, xt, wt, yt), (), [launch], s,
                  relations=[disjoint(xt, yt), disjoint(wt, yt)])


def linear_w4a16(x, weight_packed, weight_scale, global_scale, out=None, *, stream=None, workspace=None):
    """out[M, N] bf16 = x[M, K] @ W^T with NVFP4 weights W[n, k] = e2m1(weight_packed) * e4m3(weight_scale[n,
    k // 16]) * global_scale, any M (operands as :func:`vkc_runtime.ops.gemv.gemv_w4a16`'s). ``workspace``: see the
    module docstring (large M: dequantize + the bf16 GEMM). Returns ``out``."""
    op = "linear_w4a16"
    s = stream_of(stream)
    alpha = _gemv.global_multiplier(op, global_scale)
    if out is not None and workspace is None and \
            _calls.run((op,), (x, weight_packed, weight_scale, out), (alpha,), s):
        return out
    pt, st, N, K = _gemv.nvfp4_weights(op, weight_packed, weight_scale)
    xt = tensor(op, "x", x, BF16, ndim=2)
    M = xt.shape[0]
    if xt.shape[1] != K:
        raise OpError(f"{op}: x has K={xt.shape[1]}, the weights have K={K}")
    res = out if out is not None else memory.DeviceArray.empty((M, N), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, N))
    dev = same_device(op, xt, pt, st, yt)
    if M == 0 or N == 0:
        return res
    sw, ss = _gemv.nvfp4_strides(op, pt, st, yt)
    lda = row_stride(xt) if M > 1 else K
    ldc = row_stride(yt) if M > 1 else N
    if xt.ptr % 16 or lda % 16:
        raise OpError(f"{op}: x must be 16-byte aligned with a row stride that is a multiple of 16 (got {lda})")
    if ldc < N:
        raise OpError(f"{op}: out rows overlap (row stride {ldc} < N = {N})")
    _gemv._no_overlap(op, xt, yt, "x", "out")
    fits_i32(op, M=M, N=N, stride_x=lda, stride_out=ldc)
    if workspace is not None:
        wv = _dequant_view(op, workspace, N, K, dev, (xt, yt))
        if M >= DEQUANT_MIN_M:
            _launch_dequant(op, pt, st, wv, alpha, N, K, sw, ss, s)
            return linear(xt, wv, yt, stream=s)
    tiles = tuple(t for t in W4A16_TILES if has_kernel(w4a16_base(*t)))
    if not tiles:
        raise MissingKernelError(f"{op}: no W4A16 GEMM in this arch's artifacts", missing=[w4a16_base(*W4A16_TILES[0])])
    bm, bn = pick_mn_tile(M, N, _sm_count(dev), tiles, MMA_TILE_FACTOR)
    grid = cdiv(M, bm) * cdiv(N, bn)
    fits_i32(op, grid=grid)
    launch = Launch(get_kernel(w4a16_base(bm, bn)), (grid, 1, 1), (xt, pt, st, yt, alpha, M, N, K, lda, sw, ss, ldc))
    _calls.launch((op,), bindable(None if workspace is not None else out, xt, pt, st, yt), (alpha,), [launch], s,
                  relations=[disjoint(t, yt) for t in (xt, pt, st)])
    return res


def _dequant_view(op, workspace, N, K, dev, others):
    """The [N, K] bf16 view at the front of a contiguous bf16 workspace of >= N * K elements (checked)."""
    wt = tensor(op, "workspace", workspace, BF16, ndim=1)
    if wt.shape[0] > 1 and wt.strides[0] != 1:
        raise OpError(f"{op}: workspace must be contiguous")
    if wt.shape[0] < N * K:
        raise OpError(f"{op}: workspace has {wt.shape[0]} bf16 elements, the dequantized weights need {N * K}")
    if wt.ptr % 16:
        raise OpError(f"{op}: workspace must be 16-byte aligned")
    same_device(op, wt, *others)
    view = TensorRef(wt.ptr, (N, K), (K, 1), BF16, dev, workspace)
    for t, name in zip(others, ("x", "out")):
        _gemv._no_overlap(op, t, view, name, "workspace")
    return view


def _launch_dequant(op, pt, st, yt, alpha, N, K, sw, ss, s):
    ldo = row_stride(yt) if N > 1 else K
    if yt.ptr % 16 or ldo % 16:
        raise OpError(f"{op}: out must be 16-byte aligned with a row stride that is a multiple of 16 (got {ldo})")
    fits_i32(op, K=K, stride_out=ldo)
    bn, bk = DEQUANT_BLOCK
    if not has_kernel(DEQUANT_BASE):
        raise MissingKernelError(f"{op}: no NVFP4 dequantization kernel in this arch's artifacts",
                                 missing=[DEQUANT_BASE])
    run_launches([Launch(get_kernel(DEQUANT_BASE), (cdiv(N, bn), cdiv(K, bk), 1),
                         (pt, st, yt, alpha, N, K, sw, ss, ldo))], s)


def dequantize_nvfp4(weight_packed, weight_scale, global_scale, out, *, stream=None):
    """out[N, K] bf16 = bf16(e2m1(weight_packed) * e4m3(weight_scale[n, k // 16]) * global_scale) (operands as
    :func:`vkc_runtime.ops.gemv.gemv_w4a16`'s; out's row stride a multiple of 16, 16-byte aligned). Returns out."""
    op = "dequantize_nvfp4"
    s = stream_of(stream)
    alpha = _gemv.global_multiplier(op, global_scale)
    pt, st, N, K = _gemv.nvfp4_weights(op, weight_packed, weight_scale)
    yt = tensor(op, "out", out, BF16, ndim=2, shape=(N, K))
    same_device(op, pt, st, yt)
    if N == 0:
        return out
    sw, ss = _gemv.nvfp4_strides(op, pt, st, yt)
    _launch_dequant(op, pt, st, yt, alpha, N, K, sw, ss, s)
    return out


def has_fp8() -> bool:
    """Whether this device's arch has the CuTe FP8 GEMM (sm_90a)."""
    return has_kernel(fp8_base(TILES[0]))


def launch_fp8(x_ptr: int, lda: int, w_ptr: int, ldw: int, out_ptr: int, ldc: int, sa_ptr: int, sa_step: int,
               sw_ptr: int, sw_step: int, M: int, N: int, K: int, stream: int) -> None:
    """out = (x @ w^T) * sa[m * sa_step] * sw[n * sw_step] with the CuTe FP8 GEMM, on arguments the caller validated
    (vkc_runtime.ops.gemm_fp8.linear_fp8: fp8 x [M, K] / w [N, K] with 16-byte rows and K % 16 == 0, bf16 out with
    N and ldc multiples of 8, fp32 scale vectors whose last element index fits int32); the C launcher re-checks and
    returns CUDA_ERROR_INVALID_VALUE (LaunchError) rather than touch memory. Tile: :func:`pick_tile`."""
    k0 = get_kernel(fp8_base(TILES[0]))
    tn = pick_tile(M, N, _sm_count(k0.device))
    k = k0 if tn == TILES[0] else get_kernel(fp8_base(tn))
    k.launch(x_ptr, lda, w_ptr, ldw, out_ptr, ldc, sa_ptr, sa_step, sw_ptr, sw_step, M, N, K, stream)


def has_fp8_block() -> bool:
    """Whether this device's arch has the CuTe block-scaled FP8 GEMM (sm_90a)."""
    return has_kernel(fp8_block_base(*FP8_BLOCK_TILES[0]))


def launch_fp8_block(x_ptr: int, lda: int, w_ptr: int, ldw: int, out_ptr: int, ldc: int, sa_ptr: int, ldsa: int,
                     sw_ptr: int, ldsw: int, M: int, N: int, K: int, stream: int) -> None:
    """out = sum_kt (x[:, kt] @ w[:, kt]^T) * sa[m, kt] * sw[n // 128, kt] with the CuTe block-scaled FP8 GEMM, on
    arguments the caller validated (vkc_runtime.ops.gemm_fp8.linear_fp8_block: as :func:`launch_fp8`, with fp32
    sa [M, cdiv(K, 128)] / sw [cdiv(N, 128), cdiv(K, 128)] of row strides ldsa / ldsw); the C launcher re-checks.
    Tile: :func:`pick_block_tile`."""
    k0 = get_kernel(fp8_block_base(*FP8_BLOCK_TILES[0]))
    t = pick_block_tile(M, N, _sm_count(k0.device))
    k = k0 if t == FP8_BLOCK_TILES[0] else get_kernel(fp8_block_base(*t))
    k.launch(x_ptr, lda, w_ptr, ldw, out_ptr, ldc, sa_ptr, ldsa, sw_ptr, ldsw, M, N, K, stream)
