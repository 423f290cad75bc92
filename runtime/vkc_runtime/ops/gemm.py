"""Typed GEMM ops: ``linear(x, weight)`` = ``x @ weight.T`` (a Linear layer without bias, HF weight layout).

    out[M, N] = x[M, K] @ weight[N, K]^T        bf16 in and out, fp32 accumulation

and the launcher of the CuTe FP8 GEMM (:func:`launch_fp8`: fp8 e4m3 operands, per-tensor or per-token x
per-channel fp32 scales in the epilogue), which :func:`vkc_runtime.ops.gemm_fp8.linear_fp8` validates for and calls
on sm_90a (that module owns the FP8 API and its checks).

The kernels are CuTe DSL WGMMA/TMA GEMMs (``kernels_src/gemm/``, artifact kind ``cute-so``), built for sm_90a
only so far: on other archs :func:`linear` raises MissingKernelError (the bases are ``OPTIONAL_BASES``, so the
import-time completeness check does not require them). M, N and K are runtime values.

Requirements (checked here, OpError before any launch; the launcher re-checks them): bf16 2-D tensors on one
device; the last dim contiguous; K and N multiples of 8 (K >= 8), row strides multiples of 8 elements and at least
the row length (a row stride > K or > N is fine: views into wider buffers), every data pointer 16-byte aligned
(TMA); M, N, K < 2^31, row strides < 2^36; ``out`` must not overlap ``x`` or ``weight``. M == 0 or N == 0 returns
``out`` without launching. Without ``out`` the result is allocated with :mod:`vkc_runtime.memory` (pass ``out``
inside graph capture; the launch itself allocates nothing).

Tile rule (:func:`pick_tile`): among the compiled tiles (128x256, 128x128, 128x64) take the one with the highest
``useful fraction x last-wave efficiency x tile factor``, where the useful fraction is N / (N rounded up to the
tile width), the wave efficiency is tiles / (waves x SMs) on this device's SM count, and the tile factor
(:data:`TILE_FACTOR`) discounts the narrower tiles' lower MMA work per shared-memory byte. Ties go to the wider
tile. The factors are first guesses (benchmarks/bench_gemm.py times every tile: re-fit them from its JSON).

Plans (:func:`plan_tactic`): when the resolved GEMM plan of the device (:mod:`vkc_runtime.plans`: the committed
default plan of the arch, a native plan file, a warm-up's tuned entries) covers the call's (M bucket, N, K), its
tactic is launched instead; the rule above is the default when no plan says otherwise.
"""
from __future__ import annotations

from .. import memory, plans
from ..errors import MissingKernelError
from ..kernels import get_kernel, has_kernel
from ._check import OpError, row_stride, same_device, stream_of, tensor
from ._check import sm_count as _sm_count

__all__ = ["linear", "pick_tile", "plan_tactic", "gemm_base", "fp8_base", "has_fp8", "launch_fp8", "TILES",
           "TILE_FACTOR", "BASES", "OPTIONAL_BASES", "OpError"]

BF16 = "bfloat16"
TILE_M = 128
TILES = (256, 128, 64)  # tile widths (N) of the compiled kernels, all 128 rows
TILE_FACTOR = {256: 1.0, 128: 0.93, 64: 0.72}
MAX_DIM = 2**31 - 1
MAX_STRIDE = 2**36  # elements; TMA strides must stay below 2^40 bytes


def gemm_base(tile_n: int) -> str:
    """The base name of the bf16 GEMM kernel with a 128 x ``tile_n`` tile (kernels_src/gemm/spec.py)."""
    return f"gemm.bf16.t{TILE_M}x{tile_n}"


def fp8_base(tile_n: int) -> str:
    """The base name of the FP8 (e4m3, scaled) GEMM kernel with a 128 x ``tile_n`` tile."""
    return f"gemm.fp8.t{TILE_M}x{tile_n}"


BASES: tuple[str, ...] = ()  # nothing required on every arch yet
OPTIONAL_BASES = tuple(gemm_base(t) for t in TILES) + tuple(fp8_base(t) for t in TILES)  # sm_90a


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


def linear(x, weight, out=None, *, stream=None):
    """out[M, N] = x[M, K] @ weight[N, K]^T (bf16; module docstring for the requirements). Returns ``out``."""
    op = "linear"
    s = stream_of(stream)
    xt = tensor(op, "x", x, BF16, ndim=2)
    M, K = xt.shape
    wt = tensor(op, "weight", weight, BF16, ndim=2)
    N, Kw = wt.shape
    if Kw != K:
        raise OpError(f"{op}: weight has shape {tuple(wt.shape)}, expected dim 1 == K = {K} (x is {tuple(xt.shape)})")
    res = out if out is not None else memory.DeviceArray.empty((M, N), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, N))
    same_device(op, xt, wt, yt)
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
    if not has_kernel(OPTIONAL_BASES[0]):
        raise MissingKernelError(f"{op}: no bf16 GEMM kernel for this device's arch (the CuTe GEMM is built for "
                                 f"sm_90a only so far)", missing=[OPTIONAL_BASES[0]])
    k0 = get_kernel(OPTIONAL_BASES[0])
    t = plan_tactic(M, N, K)
    tn = t.tile_n if t is not None else pick_tile(M, N, _sm_count(k0.device))
    if _cdiv(M, TILE_M) * _cdiv(N, tn) > MAX_DIM:
        raise OpError(f"{op}: M = {M}, N = {N} need more than {MAX_DIM} tiles")
    base = t.base if t is not None else gemm_base(tn)
    k = k0 if base == OPTIONAL_BASES[0] else get_kernel(base)
    k.launch(xt.ptr, lda, wt.ptr, ldw, yt.ptr, ldc, M, N, K, s)
    return res


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
