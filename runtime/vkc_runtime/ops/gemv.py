"""Typed ops of the small-M GEMM ("GEMV") family: the decode-side projections, y = x @ W^T.

    gemv(x, weight)                                    y[M, N] = x[M, K] @ weight[N, K]^T
    gemv_w4a16(x, weight_packed, weight_scale, alpha)  the same with NVFP4 weights dequantized in the kernel
    gemv_w8a16(x, weight, weight_scale_inv)            the same with block-wise FP8 weights (W8A16)

bf16 activations in and out, fp32 accumulation, 1 <= M <= :func:`max_m` (64). Each weight byte is read once
(every program holds all M rows of x), so the time is set by the weight bytes; larger M belongs to the GEMM.

Layouts and requirements (checked before any launch, :class:`OpError` otherwise):
  x        [M, K] bf16, last dim contiguous, row stride % 16 elements, 16-byte aligned; K % 16 == 0
  weight   [N, K] bf16 (HF's Linear layout), last dim contiguous, row stride % 16 elements, 16-byte aligned
  out      [M, N] bf16, last dim contiguous (row stride free), 16-byte aligned, not overlapping x or the weights
  NVFP4 (the kernel's own layout: linear, NOT the 32x4x4-swizzled scales of the block-scaled MMA GEMMs):
  weight_packed [N, K/2] uint8: byte j holds k = 2j in its low nibble and k = 2j + 1 in its high nibble (e2m1);
                row stride % 16 bytes (a contiguous tensor: K % 32 == 0), 16-byte aligned
  weight_scale  [N, K/16] float8_e4m3fn (or its uint8 bytes): weight_scale[n, g] scales k in [16 g, 16 g + 16);
                row stride % 16 bytes (a contiguous tensor: K % 256 == 0), 16-byte aligned
  global_scale  one float, the effective MULTIPLIER: W[n, k] = e2m1 * e4m3(weight_scale[n, k // 16]) * global_scale.
                compressed-tensors stores ``weight_global_scale`` as a divisor: pass 1 / weight_global_scale;
                ModelOpt stores ``weight_scale_2`` as a multiplier: pass weight_scale_2 as is. Both formats'
                ``weight_packed`` / ``weight`` and ``weight_scale`` tensors are already in the layout above
                (low nibble first, [N, K/16] e4m3), unless a loader swizzled them.
  block-wise FP8 (Qwen's *-FP8 checkpoints, dequantized in the kernel; the activations stay bf16):
  weight        [N, K] float8_e4m3fn (or its uint8 bytes), last dim contiguous, row stride % 16, 16-byte aligned
  weight_scale_inv  [cdiv(N, 128), cdiv(K, 128)] float32, the MULTIPLIER of each 128 x 128 block (the
                checkpoint's name): W[n, k] = e4m3(weight[n, k]) * weight_scale_inv[n // 128, k // 128]; last dim
                contiguous (any row stride), 16-byte aligned. Unlike ops.gemm_fp8.linear_fp8_block (W8A8: x
                quantized per 1 x 128 group first), x enters the MMA as bf16, so the result is the product of the
                dequantized weights with x itself. The e4m3 NaN codes (0x7F / 0xFF; no checkpoint holds them)
                decode as +-480 in the integer decoders and as NaN in the M = 1 kernel's hardware conversion
                (sm_89+).

Dispatch (:func:`plan`, a pure function of host ints, so graph-stable): M picks the smallest M bucket of
(1, 16, 32, 64) that holds it (:func:`bucket`; M = 1 runs a CUDA-core kernel, no MMA padding; BF16 only for
N in M1_N_RANGE (1024..8192), other N take bucket 16); for each tile of the bucket (:func:`tiles`; wide: 64
weight rows per program, narrow: 16; at M = 1: 4-64) and each split count s
(1..16, at least 4 K tiles per split) the rule estimates the time relative to streaming the weights at full
bandwidth (:func:`_wave_cost`: full waves of resident programs saturate HBM; a last partial wave, or a launch
smaller than the machine, of r programs runs at min(1, r / (0.3 * slots)) of it), times the L2 re-reads of x
(none for the M = 1 FP8 kernel: M1_L2_COST), plus the split-K partials' traffic and the reduce launch, and takes
the cheapest (ties: the first tile of :func:`tiles`, fewer splits).
``slots`` is the SM count times the kernel's occupancy (driver query). Split-K writes fp32 partials [s, M, N]
to a workspace and a second launch sums them in split order (deterministic, no atomics). The constants are
first choices made without a device to time them (benchmarks/bench_gemv.py times forced alternatives next to
the rule's pick; ``vkc tune`` retunes the kernels' warps/stages; BENCHMARKS.md records measurements). NVFP4
kernels come with two weight decoders giving identical results (kernels_src/gemv/gemv.py): ``prmt`` (the
default: packed inline PTX, fewer instructions per weight byte, faster on the H200 at every M of the 27B/35B
shapes but a few at M = 1, BENCHMARKS.md) and ``int``; ``_decoder=`` picks one.

Workspace and graphs: split-K needs ``s * M * N`` fp32 elements. Pass ``workspace=`` (a contiguous 1-D float32
tensor of at least :func:`workspace_elems` elements, e.g. from :func:`workspace`) allocated before graph capture;
without one the op uses a per-device default buffer that grows only on eager calls (inside a capture it raises
OpError if too small). One workspace must not serve two streams at once. Calls with ``out=`` and torch tensors
are bound calls (vkc_runtime.bound) except split-K calls on the default workspace, which validate every time.

Programmatic dependent launch (sm_90a+, ARCHITECTURE.md section 8): the M = 1 BF16 kernel reads its first weight
tile before its device-side wait, so ``weight`` must not be written by the kernel launched just before it on the
same stream (model weights never are; ``VKC_PDL=0`` lifts the rule). x and everything else are read after it.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from .. import memory
from ..bound import CallCache, Launch, disjoint
from ..kernels import get_kernel
from ..stream import is_capturing
from ._check import OpError, fits_i32, row_stride, same_device, stream_of, tensor
from ._check import sm_count as _sm_count

__all__ = ["gemv", "gemv_w4a16", "gemv_w8a16", "max_m", "plan", "Plan", "workspace", "workspace_elems",
           "split_workspace_elems", "BASES", "M_BUCKETS", "BUCKETS", "bucket", "tiles", "TILES", "M1_TILES",
           "M1_N_RANGE", "MAX_SPLIT", "DECODERS", "DEFAULT_DECODER"]

BF16 = "bfloat16"
M_BUCKETS = (16, 32, 64)
# kind -> its M buckets (kernels_src/gemv/spec.py compiles the same); M = 1 runs CUDA-core kernels
BUCKETS = {"bf16": (1,) + M_BUCKETS, "w4a16": (1,) + M_BUCKETS, "w8a16": (1,) + M_BUCKETS}
MAX_SPLIT = 16
MIN_K_TILES_PER_SPLIT = 4
# kind -> (BLOCK_N, BLOCK_K) per tile, wide first (kernels_src/gemv/spec.py compiles the same list)
TILES = {"bf16": ((64, 128), (16, 256)), "w4a16": ((64, 256), (16, 256)), "w8a16": ((64, 128), (16, 128))}
# kind -> the M = 1 bucket's own tiles where they differ from TILES (few weight rows per program)
M1_TILES = {"bf16": ((4, 1024),), "w8a16": ((4, 1024), (8, 512))}
# kind -> the N range whose M = 1 calls take the CUDA-core kernel (outside it: the MMA kernels' M bucket 16).
# BF16 on the H200 (bench_gemv): 6.5 vs 9.0 us at N = 2048 (K 4096), 18.4-19.1 vs 19.3-19.5 at N = 5120-6144, but
# the MMA kernel's 64-row tiles win from N = 9216 on (12.8 vs 13.5, 14.9 vs 16.9 at 12352 x 2048); below N = 1024
# its 4-row tiles give fewer than 256 programs and its 1024-wide K tiles little room to split K
M1_N_RANGE = {"bf16": (1024, 8192)}
_WEIGHT_BYTES_PER_ELEM = {"bf16": 2.0, "w4a16": 0.5 + 1.0 / 16, "w8a16": 1.0 + 4.0 / (128 * 128)}
SPLIT_LAUNCH_COST = 0.03  # the reduce launch, as a fraction of the weight streaming time
L2_COST = 0.25  # an L2 byte (x re-read by every program) relative to an HBM byte
# kind -> L2_COST of its M = 1 bucket where measurement overrules it: the FP8 CUDA-core kernel's 4-row tile
# (n4.k1024, twice the x re-reads of n8.k512) took 2-29% less time on 8 of the 13 FP8 shapes of bench_gemv and
# at most 4% more on the others (H100, BENCHMARKS.md session 35): x costs it nothing the rule can see, and it
# wins the ties
M1_L2_COST = {"w8a16": 0.0}
SATURATE = 0.3  # the fraction of the resident slots that saturates HBM (a partial wave above it runs at full speed)


DECODERS = ("int", "prmt")  # NVFP4 weight decoders (kernels_src/gemv/gemv.py): elementwise / packed inline PTX
DEFAULT_DECODER = "prmt"


def _base(kind: str, bm: int, bn: int, bk: int, decoder: str | None = None) -> str:
    """The kernel name (spelled once: the ops call this, BASES is built from it)."""
    return f"gemv.{kind}.m{bm}.n{bn}.k{bk}" + (f".{decoder}" if kind == "w4a16" else "")


def _reduce_base() -> str:
    return "gemv.splitk_reduce"


def tiles(kind: str, bm: int) -> tuple:
    """The (BLOCK_N, BLOCK_K) tiles compiled for one kind and M bucket, the rule's tie-breaker first (wide, except
    the M = 1 FP8 kernel's 4-row tile)."""
    return M1_TILES.get(kind, TILES[kind]) if bm == 1 else TILES[kind]


BASES = tuple(_base(k, bm, bn, bk, d) for k in TILES for bm in BUCKETS[k] for bn, bk in tiles(k, bm)
              for d in (DECODERS if k == "w4a16" else (None,))) + (_reduce_base(),)


def max_m() -> int:
    """The largest M these ops take (a GEMM dispatcher sends M <= max_m() here)."""
    return M_BUCKETS[-1]


def bucket(kind: str, M: int, N: int | None = None) -> int:
    """The M bucket of ``kind`` a call of M rows (and N outputs) takes: the smallest that holds M, except that
    M = 1 with N outside M1_N_RANGE[kind] takes the next one (the MMA kernels)."""
    b = next(b for b in BUCKETS[kind] if M <= b)
    lo, hi = M1_N_RANGE.get(kind, (0, 1 << 62))
    if b == 1 and N is not None and not lo <= N <= hi:
        return next(x for x in BUCKETS[kind] if x > 1)
    return b


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Plan(NamedTuple):
    bm: int
    bn: int
    bk: int
    split: int
    k_split: int  # K elements per split, a multiple of bk


def _wave_cost(ctas: int, slots: int) -> float:
    """Time of ``ctas`` equal programs on ``slots`` resident-CTA slots, relative to the same bytes streamed at
    full bandwidth: full waves run saturated; a partial wave (or a launch smaller than the machine) of r
    programs runs at the fraction min(1, r / (SATURATE * slots)) of the bandwidth."""
    full, r = divmod(ctas, slots)
    t = full * slots + (max(r, SATURATE * slots) if r else 0)
    return t / ctas


@lru_cache(maxsize=4096)
def plan(kind: str, M: int, N: int, K: int, num_sms: int, ctas_per_sm: tuple[int, ...] = (1, 1)) -> Plan:
    """The kernel, split count and per-split K for one call (the rule in the module doc). ``ctas_per_sm``: the
    occupancy of each tile's kernel (wide, narrow) for this M bucket."""
    if kind not in TILES:
        raise OpError(f"gemv: unknown kind {kind!r}")
    if not 1 <= M <= max_m():
        raise OpError(f"gemv: M={M} is outside 1..{max_m()} (larger M belongs to the GEMM)")
    bm = bucket(kind, M, N)
    wb = _WEIGHT_BYTES_PER_ELEM[kind]
    best = None
    for t, (bn, bk) in enumerate(tiles(kind, bm)):
        slots = max(1, num_sms) * max(1, ctas_per_sm[t] if t < len(ctas_per_sm) else 1)
        nb = _cdiv(N, bn)
        kt = _cdiv(K, bk)
        l2 = M1_L2_COST.get(kind, L2_COST) if bm == 1 else L2_COST
        x_cost = l2 * (2.0 * bm) / (bn * wb)  # x bytes re-read from L2 per weight byte
        for s in range(1, min(MAX_SPLIT, max(1, kt // MIN_K_TILES_PER_SPLIT)) + 1):
            per = _cdiv(kt, s)
            if _cdiv(kt, per) != s:  # that many splits would leave one empty
                continue
            extra = 0.0
            if s > 1:  # the reduce launch, and the fp32 partials written and read back, per weight byte
                extra = SPLIT_LAUNCH_COST + 2.0 * 4.0 * s * M / (K * wb)
            cost = _wave_cost(nb * s, slots) * (1.0 + x_cost) + extra
            if best is None or cost < best[0] - 1e-9:
                best = (cost, Plan(bm, bn, bk, s, per * bk))
    return best[1]


def workspace_elems(M: int, N: int) -> int:
    """fp32 elements of a workspace that serves any split the rule may pick for M rows and N outputs."""
    return MAX_SPLIT * int(M) * int(N)


def split_workspace_elems(M: int, N: int, K: int, *, kind: str = "bf16", device: int | None = None) -> int:
    """fp32 workspace elements the rule's plan for one call (M rows, [N, K] weights) needs on this device: 0 when
    it does not split K. Loads the M bucket's kernels (their occupancy feeds the rule): call it before a capture."""
    if kind not in TILES:
        raise OpError(f"gemv: unknown kind {kind!r}")
    if not 1 <= M <= max_m():
        raise OpError(f"gemv: M={M} is outside 1..{max_m()} (larger M belongs to the GEMM)")
    bm = bucket(kind, M, N)
    dec = DEFAULT_DECODER if kind == "w4a16" else None
    kerns = [get_kernel(_base(kind, bm, bn, bk, dec), device=device) for bn, bk in tiles(kind, bm)]
    p = plan(kind, int(M), int(N), int(K), _sm_count(kerns[0].device),
             tuple(max(1, k.max_active_blocks()) for k in kerns))
    return p.split * int(M) * int(N) if p.split > 1 else 0


def workspace(max_m_rows: int, max_n: int, *, device: int | None = None) -> memory.DeviceArray:
    """A split-K workspace for calls with M <= max_m_rows and N <= max_n (allocate before graph capture)."""
    if not (1 <= max_m_rows <= max_m() and max_n >= 1):
        raise OpError(f"gemv workspace: need 1 <= max_m_rows <= {max_m()} and max_n >= 1")
    return memory.DeviceArray.empty((workspace_elems(max_m_rows, max_n),), "float32", device=device)


_default_ws: dict[int, memory.DeviceArray] = {}
_retired: list = []  # replaced default workspaces stay allocated (a launch in flight may still use one)
_calls = CallCache()


def _no_overlap(op, a, b, an, bn):
    def span(t):
        hi = t.ptr + sum((s - 1) * st for s, st in zip(t.shape, t.strides)) * t.itemsize + t.itemsize
        return t.ptr, hi
    (a0, a1), (b0, b1) = span(a), span(b)
    if a0 < b1 and b0 < a1:
        raise OpError(f"{op}: {bn} must not overlap {an}")


def _aligned(op, name, t, stride_name=None, stride=None):
    if t.ptr % 16:
        raise OpError(f"{op}: {name} must be 16-byte aligned")
    if stride is not None and stride % 16:
        raise OpError(f"{op}: {stride_name or name + ' row stride'} ({stride}) must be a multiple of 16 elements")


def _workspace(op, ws, need: int, device: int, s: int):
    """The TensorRef of the workspace for a split call (the caller's, or the grown default)."""
    if ws is not None:
        wt = tensor(op, "workspace", ws, "float32", ndim=1)
        if wt.shape[0] > 1 and wt.strides[0] != 1:
            raise OpError(f"{op}: workspace must be contiguous")
        if wt.shape[0] < need:
            raise OpError(f"{op}: workspace has {wt.shape[0]} float32 elements, this call needs {need} "
                          f"(gemv.workspace / workspace_elems size it)")
        _aligned(op, "workspace", wt)
        return wt
    cur = _default_ws.get(device)
    if cur is None or cur.size < need:
        if is_capturing(s):
            raise OpError(f"{op}: split-K needs a workspace of {need} float32 elements inside graph capture: pass "
                          f"workspace= (gemv.workspace) allocated before the capture")
        if cur is not None:
            _retired.append(cur)
        cur = memory.DeviceArray.empty((max(need, 2 * (cur.size if cur is not None else 0)),), "float32",
                                       device=device if device >= 0 else None)
        _default_ws[device] = cur
    return memory.as_tensor(cur, "workspace")


def _prepare(op, x, out, N, K, dev_refs, *, any_m: bool = False):
    """Shared validation of x and out (M <= max_m() unless ``any_m``); returns (xt, M, yt, res)."""
    xt = tensor(op, "x", x, BF16, ndim=2)
    M = xt.shape[0]
    if xt.shape[1] != K:
        raise OpError(f"{op}: x has K={xt.shape[1]}, the weights have K={K}")
    if M > max_m() and not any_m:
        raise OpError(f"{op}: M={M} exceeds max_m()={max_m()} (use the GEMM for larger M)")
    res = out if out is not None else memory.DeviceArray.empty((M, N), BF16, device=xt.device)
    yt = tensor(op, "out", res, BF16, ndim=2, shape=(M, N))
    same_device(op, xt, yt, *dev_refs)
    return xt, M, yt, res


def _run(op, key, kind, xt, yt, res, M, N, K, wrefs, scalars, mid_args, workspace_arg, s, out, slots_in, forced,
         decoder=None):
    dev = same_device(op, xt, yt, *wrefs)
    sms = _sm_count(dev)
    bm = bucket(kind, M, N)
    kerns = [get_kernel(_base(kind, bm, bn, bk, decoder)) for bn, bk in tiles(kind, bm)]
    p = forced if forced is not None else plan(kind, M, N, K, sms, tuple(max(1, k.max_active_blocks()) for k in kerns))
    if forced is not None:
        _check_forced(op, kind, p, M, K)
    k = kerns[tiles(kind, bm).index((p.bn, p.bk))] if p.bm == bm else get_kernel(_base(kind, p.bm, p.bn, p.bk, decoder))
    sy = row_stride(yt)
    sx = row_stride(xt) if M > 1 else 0
    _aligned(op, "x", xt, "x row stride", sx)
    fits_i32(op, M=M, N=N, K=K, stride_x=sx, stride_out=sy, k_split=p.k_split, partials=p.split * M * N,
             grid=_cdiv(N, p.bn))
    # a caller's workspace is checked (dtype, layout) always, its size only where this call splits K
    need = p.split * M * N if p.split > 1 else 0
    user_ws = _workspace(op, workspace_arg, need, dev, s) if workspace_arg is not None else None
    ws_t = yt  # never dereferenced as the workspace when split == 1
    if p.split > 1:
        ws_t = user_ws if user_ws is not None else _workspace(op, None, p.split * M * N, dev, s)
    launches = [Launch(k, (_cdiv(N, p.bn), p.split, 1), (xt, *mid_args[0], yt, ws_t, *mid_args[1], M, N, K, sx,
                                                         *mid_args[2], sy, p.k_split))]
    if p.split > 1:
        r = get_kernel(_reduce_base())
        launches.append(Launch(r, (_cdiv(N, r.constexprs["BLOCK"]), M, 1), (ws_t, yt, M, N, sy, p.split)))
    bind = out is not None and (p.split == 1 or workspace_arg is not None)
    slots = None
    if bind:
        slots = tuple(slots_in) + ((user_ws,) if user_ws is not None else ())
    _calls.launch(key, slots, scalars, launches, s,
                  relations=[disjoint(xt, yt)] + [disjoint(w, yt) for w in wrefs])
    return res


def _check_forced(op, kind, p, M, K):
    if not isinstance(p, Plan) or p.bm not in BUCKETS[kind] or (p.bn, p.bk) not in tiles(kind, p.bm) or M > p.bm:
        raise OpError(f"{op}: _plan {p!r} names no compiled kernel for M={M}")
    if p.k_split < p.bk or p.k_split % p.bk or p.split != _cdiv(K, p.k_split) or not 1 <= p.split <= MAX_SPLIT:
        raise OpError(f"{op}: _plan {p!r}: k_split must be a multiple of {p.bk} and split == cdiv(K, k_split)")


def gemv(x, weight, out=None, *, stream=None, workspace=None, _plan: Plan | None = None):
    """y [M, N] bf16 = x [M, K] @ weight [N, K]^T, 1 <= M <= max_m(); layouts, dispatch and workspace in the
    module doc. Returns ``out`` (allocated when None). ``_plan`` forces a :class:`Plan` (benchmarks, tuning)."""
    op = "gemv"
    s = stream_of(stream)
    key = (op, workspace is None, _plan)
    tensors = (x, weight, out) if workspace is None else (x, weight, out, workspace)
    if out is not None and _calls.run(key, tensors, (), s):
        return out
    wt = tensor(op, "weight", weight, BF16, ndim=2)
    N, K = wt.shape
    if K == 0 or K % 16:
        raise OpError(f"{op}: K={K} must be a positive multiple of 16")
    xt, M, yt, res = _prepare(op, x, out, N, K, (wt,))
    if M == 0 or N == 0:
        return res
    sw = row_stride(wt)
    _aligned(op, "weight", wt, "weight row stride", sw)
    _aligned(op, "out", yt)
    _no_overlap(op, xt, yt, "x", "out")
    _no_overlap(op, wt, yt, "weight", "out")
    fits_i32(op, stride_w=sw)
    return _run(op, key, "bf16", xt, yt, res, M, N, K, (wt,), (), ((wt,), (), (sw,)), workspace, s, out,
                (xt, wt, yt), _plan)


def global_multiplier(op: str, global_scale) -> float:
    """The NVFP4 global multiplier as a finite float (checked before a bound call replays)."""
    try:
        alpha = float(global_scale)
    except (TypeError, ValueError):
        raise OpError(f"{op}: global_scale must be a float, got {type(global_scale).__name__}") from None
    if not math.isfinite(alpha):
        raise OpError(f"{op}: global_scale must be finite, got {alpha}")
    return alpha


def nvfp4_weights(op: str, weight_packed, weight_scale):
    """The NVFP4 weight operands (layout in the module doc) checked: (packed ref, scale ref, N, K)."""
    pt = tensor(op, "weight_packed", weight_packed, "uint8", ndim=2)
    N, Kh = pt.shape
    K = 2 * Kh
    if K == 0 or K % 16:
        raise OpError(f"{op}: K = 2 * weight_packed.shape[1] = {K} must be a positive multiple of 16")
    try:
        st = tensor(op, "weight_scale", weight_scale, "float8_e4m3fn", ndim=2, shape=(N, K // 16))
    except OpError as e:
        if "must be float8_e4m3fn" not in str(e):
            raise
        st = tensor(op, "weight_scale", weight_scale, "uint8", ndim=2, shape=(N, K // 16))
    return pt, st, N, K


def nvfp4_strides(op: str, pt, st, yt) -> tuple[int, int]:
    """The packed / scale row strides (bytes), their alignment and out's checked; out must not overlap them."""
    sw, ss = row_stride(pt), row_stride(st)
    _aligned(op, "weight_packed", pt, "weight_packed row stride", sw)
    _aligned(op, "weight_scale", st, "weight_scale row stride", ss)
    _aligned(op, "out", yt)
    _no_overlap(op, pt, yt, "weight_packed", "out")
    _no_overlap(op, st, yt, "weight_scale", "out")
    fits_i32(op, stride_w=sw, stride_s=ss)
    return sw, ss


def gemv_w4a16(x, weight_packed, weight_scale, global_scale, out=None, *, stream=None, workspace=None,
               _plan: Plan | None = None, _decoder: str | None = None):
    """y [M, N] bf16 = x [M, K] @ W^T with NVFP4 weights W[n, k] = e2m1(weight_packed) * e4m3(weight_scale[n,
    k // 16]) * global_scale (dequantized in the kernel, exact in bf16 before the global scale), 1 <= M <= max_m().
    ``global_scale``: the effective multiplier (compressed-tensors: 1 / weight_global_scale; ModelOpt:
    weight_scale_2). Layouts, dispatch and workspace in the module doc. ``_decoder``: "prmt" (the default) or
    "int", the kernels' weight decoder (identical results; benchmarks and tests)."""
    op = "gemv_w4a16"
    s = stream_of(stream)
    dec = DEFAULT_DECODER if _decoder is None else _decoder
    if dec not in DECODERS:
        raise OpError(f"{op}: _decoder must be one of {DECODERS}, got {_decoder!r}")
    alpha = global_multiplier(op, global_scale)
    key = (op, workspace is None, _plan, dec)
    tensors = (x, weight_packed, weight_scale, out) if workspace is None else \
        (x, weight_packed, weight_scale, out, workspace)
    if out is not None and _calls.run(key, tensors, (alpha,), s):
        return out
    pt, st, N, K = nvfp4_weights(op, weight_packed, weight_scale)
    xt, M, yt, res = _prepare(op, x, out, N, K, (pt, st))
    if M == 0 or N == 0:
        return res
    sw, ss = nvfp4_strides(op, pt, st, yt)
    _no_overlap(op, xt, yt, "x", "out")
    return _run(op, key, "w4a16", xt, yt, res, M, N, K, (pt, st), (alpha,), ((pt, st), (alpha,), (sw, ss)),
                workspace, s, out, (xt, pt, st, yt), _plan, dec)


def gemv_w8a16(x, weight, weight_scale_inv, out=None, *, stream=None, workspace=None, _plan: Plan | None = None):
    """y [M, N] bf16 = x [M, K] @ W^T with block-wise FP8 weights W[n, k] = e4m3(weight[n, k]) *
    weight_scale_inv[n // 128, k // 128] dequantized in the kernel (x stays bf16), 1 <= M <= max_m(). Layouts,
    dispatch and workspace in the module doc."""
    op = "gemv_w8a16"
    s = stream_of(stream)
    key = (op, workspace is None, _plan)
    tensors = (x, weight, weight_scale_inv, out) if workspace is None else \
        (x, weight, weight_scale_inv, out, workspace)
    if out is not None and _calls.run(key, tensors, (), s):
        return out
    try:
        wt = tensor(op, "weight", weight, "float8_e4m3fn", ndim=2)
    except OpError as e:
        if "must be float8_e4m3fn" not in str(e):
            raise
        wt = tensor(op, "weight", weight, "uint8", ndim=2)
    N, K = wt.shape
    if K == 0 or K % 16:
        raise OpError(f"{op}: K={K} must be a positive multiple of 16")
    st = tensor(op, "weight_scale_inv", weight_scale_inv, "float32", ndim=2, shape=(_cdiv(N, 128), _cdiv(K, 128)))
    xt, M, yt, res = _prepare(op, x, out, N, K, (wt, st))
    if M == 0 or N == 0:
        return res
    sw, ss = row_stride(wt), row_stride(st)
    _aligned(op, "weight", wt, "weight row stride", sw)
    _aligned(op, "weight_scale_inv", st)
    _aligned(op, "out", yt)
    _no_overlap(op, xt, yt, "x", "out")
    _no_overlap(op, wt, yt, "weight", "out")
    _no_overlap(op, st, yt, "weight_scale_inv", "out")
    fits_i32(op, stride_w=sw, stride_s=ss)
    return _run(op, key, "w8a16", xt, yt, res, M, N, K, (wt, st), (), ((wt, st), (), (sw, ss)), workspace, s, out,
                (xt, wt, st, yt), _plan)
