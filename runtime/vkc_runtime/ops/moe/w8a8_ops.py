"""Block-wise FP8 experts as W8A8 (kernels_src/moe/w8a8.py): the grouped GEMMs of the MoE block's prefill path on
the FP8 tensor cores, the activations quantized per row per 128 columns (ops.gemm_fp8's
``quantize_fp8_per_token_group`` layout, what Qwen's FP8 checkpoints' own linears do).

    grouped_gemm_w8a8(a, a_scale, w, sorted_ids, block_expert, num_padded, *, a_row_div, out, block_m, act=None,
                      out_scale=None, stream=None, _tile=None)

For the grouped rows (ops/moe/grouped_ops.py's rule: p < num_padded[0], f = sorted_ids[p] in [0, P), e =
block_expert[p // block_m] in [0, E'), r = f // a_row_div < a_rows):

    out[f] = act(sum_kb (a[r, kb] . W[e, :, kb]) * a_scale[r, kb] * w.scale[e, n // 128, kb])

each 128-wide k-slice's product promoted in fp32. ``act="silu_mul"`` (gate_up: w [E', 2N, K], gate rows then up
rows): ``out`` bf16 [P, N], or with ``out_scale`` the down GEMM's input quantized in the epilogue: ``out`` fp8 [P, N]
and ``out_scale`` fp32 [P, N / 128] (scale = max(amax / 448, 1 / (448 * 512)) per row per 128 columns, q =
satfinite(rn(h / scale))). ``act=None`` (down): ``out`` bf16 [P, N], N = w rows.

Layouts and requirements (checked before any launch, :class:`OpError` otherwise):
  a         [a_rows, K] float8_e4m3fn (or its uint8 bytes), last dim contiguous, row stride % 16, 16-byte aligned,
            K % 16 == 0; cdiv(P, a_row_div) <= a_rows
  a_scale   float32 [a_rows, cdiv(K, 128)], last dim contiguous, row stride >= cdiv(K, 128)
  w         :class:`~.fp8_ops.Fp8Experts` [E', R, K] (fp8_ops' checks; gate_up: N = R / 2 a multiple of 128)
  out       [P, N] (bf16; fp8 with out_scale), last dim contiguous, row stride % 16 elements, 16-byte aligned
  out_scale float32 [P, N / 128], last dim contiguous; only with act="silu_mul"
  grouping  sorted_ids / block_expert / num_padded as grouped_ops (their values never read on the host)
No output may overlap an input. Rows never selected are not written.

Tiles (``TILES``: block_m -> kernel -> BLOCK_N, the pick first; ``_tile=`` forces another BLOCK_N): block_m 64 and
128 only (the MoE block's prefill tiles; at block_m 16 the W8A16 kernels stream the weights). The kernels exist on
the FP8 archs (sm_89 and later): :func:`available` says whether this device has them, and the MoE block falls back
to W8A16 where not.

Graphs: one launch, no workspace; calls with torch tensors are bound calls (vkc_runtime.bound).
"""
from __future__ import annotations

from .._check import OpError, cdiv, fits_i32, fp8_tensor, grid_y, row_stride, same_device, stream_of, tensor
from ...bound import CallCache, Launch, disjoint
from ...kernels import get_kernel, has_kernel
from ..gemm_fp8 import GROUP
from . import fp8_ops
from .grouped_ops import MAX_EXPERTS, aligned, grouping, max_blocks, no_overlap

__all__ = ["grouped_gemm_w8a8", "available", "base", "TILES", "W8A8_BASES", "BLOCK_MS"]

F32 = "float32"
# block_m -> kernel -> BLOCK_N tiles, the rule's pick first (kernels_src/moe/w8a8_spec.py compiles the same)
TILES = {
    64: {"down": (128,), "gate_up": (64,), "gate_up_q": (128,)},
    128: {"down": (128,), "gate_up": (64,), "gate_up_q": ()},  # m128.n128.silu.q spills (w8a8_spec.py)
}
BLOCK_MS = tuple(TILES)


def _kernel(act: str | None, quant_out: bool) -> str:
    return "gate_up_q" if quant_out else "gate_up" if act == "silu_mul" else "down"


def base(block_m: int, bn: int, kernel: str) -> str:
    """The kernel name (spelled once: the op calls this, W8A8_BASES is built from it)."""
    return (f"moe.w8a8.grouped.m{block_m}.n{bn}.k128" + (".silu" if kernel != "down" else "")
            + (".q" if kernel == "gate_up_q" else ""))


W8A8_BASES = tuple(base(bm, bn, kn) for bm, per in TILES.items() for kn, bns in per.items() for bn in bns)


def available(device: int | None = None) -> bool:
    """Whether this device's artifacts hold every W8A8 kernel (the FP8 archs)."""
    return all(has_kernel(b, device=device) for b in W8A8_BASES)


_calls = CallCache()


def grouped_gemm_w8a8(a, a_scale, w, sorted_ids, block_expert, num_padded, *, a_row_div: int, out, block_m: int,
                      act: str | None = None, out_scale=None, stream=None, _tile: int | None = None):
    """The grouped W8A8 GEMM (module doc). Returns ``out``."""
    op = "grouped_gemm_w8a8"
    s = stream_of(stream)
    quant = out_scale is not None
    key = (op, act, block_m, quant, _tile)
    if type(a_row_div) is int and isinstance(w, fp8_ops.Fp8Experts) and _calls.run(
            key, (a, a_scale, *w, sorted_ids, block_expert, num_padded, out) + ((out_scale,) if quant else ()),
            (a_row_div,), s):
        return out
    if act not in (None, "silu_mul"):
        raise OpError(f"{op}: act must be None or 'silu_mul', got {act!r}")
    if type(block_m) is not int or block_m not in TILES:
        raise OpError(f"{op}: block_m must be one of {BLOCK_MS}, got {block_m!r}")
    if type(a_row_div) is not int or a_row_div < 1:
        raise OpError(f"{op}: a_row_div must be a positive int, got {a_row_div!r}")
    if quant and act != "silu_mul":
        raise OpError(f"{op}: out_scale (the output quantized in the epilogue) needs act='silu_mul'")
    at = fp8_tensor(op, "a", a)
    a_rows, K = at.shape
    kb = cdiv(K, GROUP)
    ast = tensor(op, "a_scale", a_scale, F32, ndim=2, shape=(a_rows, kb))
    q = fp8_ops.experts_refs(op, "w", w, rows=None, K=K, gate_up=act == "silu_mul")
    if not 1 <= q.E <= MAX_EXPERTS:
        raise OpError(f"{op}: w has {q.E} experts, expected 1..{MAX_EXPERTS}")
    N = q.R // 2 if act == "silu_mul" else q.R
    ot = fp8_tensor(op, "out", out) if quant else tensor(op, "out", out, "bfloat16", ndim=2)
    P = ot.shape[0]
    if ot.shape[1] != N:
        raise OpError(f"{op}: out has {ot.shape[1]} columns, expected N={N}")
    if N % 16:
        raise OpError(f"{op}: N={N} output columns must be a multiple of 16 (the kernels' store promise)")
    st, bt, nt = grouping(op, sorted_ids, block_expert, num_padded, block_m)
    refs = [at, ast, *q.tensors, ot, st, bt, nt]
    osr = None
    if quant:
        osr = tensor(op, "out_scale", out_scale, F32, ndim=2, shape=(P, N // GROUP))
        refs.append(osr)
    same_device(op, *refs)
    if cdiv(P, a_row_div) > a_rows:
        raise OpError(f"{op}: out has P={P} rows, a has {a_rows}: need cdiv(P, a_row_div={a_row_div}) <= {a_rows}")
    sa = row_stride(at) if a_rows > 1 else K
    ssa = row_stride(ast) if a_rows > 1 else kb
    so = row_stride(ot) if P > 1 else N
    sos = (row_stride(osr) if P > 1 else N // GROUP) if quant else 0
    aligned(op, "a", at, (sa,))
    aligned(op, "out", ot, (so,))
    if ssa < kb or (quant and sos < N // GROUP):
        raise OpError(f"{op}: scale rows overlap (a_scale row stride {ssa} < {kb} or out_scale's below N / 128)")
    if P > 1 and so < N:
        raise OpError(f"{op}: out rows overlap (row stride {so} < N={N})")
    inputs = [("a", at), ("a_scale", ast), *q.named, ("sorted_ids", st), ("block_expert", bt), ("num_padded", nt)]
    no_overlap(op, ot, inputs + ([("out_scale", osr)] if quant else []))
    if quant:
        no_overlap(op, osr, inputs)
    fits_i32(op, P=P, N=N, K=K, a_rows=a_rows, a_row_div=a_row_div, stride_a=sa, stride_a_scale=ssa,
             a_scale_span=(a_rows - 1) * ssa + kb, stride_out=so, out_scale_span=P * max(sos, 1),
             stride_we=q.strides[0], stride_wn=q.strides[1], cap=st.shape[0])
    nb = max_blocks(P, q.E, block_m, st.shape[0])
    if P == 0 or nb == 0:
        return out
    kernel = _kernel(act, quant)
    tiles = TILES[block_m][kernel]
    if not tiles:
        raise OpError(f"{op}: no {kernel} tile is compiled for block_m={block_m} (quantize h by its own launch)")
    if _tile is not None and _tile not in tiles:
        raise OpError(f"{op}: _tile {_tile!r} is not a compiled {kernel} tile of block_m={block_m}: {tiles}")
    bn = _tile if _tile is not None else tiles[0]
    k = get_kernel(base(block_m, bn, kernel))
    grid = (cdiv(N, bn), grid_y(op, nb), 1)
    args = (at, ast, *q.tensors, ot, osr if quant else ast, st, bt, nt, P, q.E, N, K, a_rows, a_row_div, sa, ssa,
            *q.strides, so, sos)
    slots = (at, ast, *q.tensors, st, bt, nt, ot) + ((osr,) if quant else ())
    outs = (ot, osr) if quant else (ot,)
    _calls.launch(key, slots, (a_row_div,), [Launch(k, grid, args)], s,
                  relations=[disjoint(o, r) for o in outs for r in slots if r is not o])
    return out
