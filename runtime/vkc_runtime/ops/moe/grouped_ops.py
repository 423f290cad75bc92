"""Grouped GEMMs of the MoE block (kernels_src/moe/grouped.py): rows grouped by expert in blocks of ``block_m``.

    grouped_gemm(a, w, sorted_ids, block_expert, num_padded, *, a_row_div, out, block_m, act=None,
                 row_scale=None, stream=None)

For every row p < num_padded[0] with f = sorted_ids[p] in [0, P) (P = out.shape[0]) and e =
block_expert[p // block_m] in [0, E'): ``out[f] = act(a[f // a_row_div] @ w[e]^T) * row_scale[f]``; rows never
selected are not written. bf16 in and out, fp32 accumulation. ``act="silu_mul"``: w[e] has 2N rows (gate
rows, then up rows: HF's ``gate_up_proj``) and out[f] = silu(gate) * up (N columns), fused in the GEMM's
epilogue; ``act=None``: N = w.shape[1]. The MoE block: GEMM1 a = x [M, H], a_row_div = k', w = w1 [E', 2I, H],
act="silu_mul" -> h [P, I]; GEMM2 a = h, a_row_div = 1, w = w2 [E', H, I] -> y [P, H].

Layouts and requirements (checked before any launch, :class:`OpError` otherwise):
  a            [a_rows, K] bf16, last dim contiguous, row stride % 16 elements, 16-byte aligned, K % 16 == 0;
               cdiv(P, a_row_div) <= a_rows (so every valid f names a row of a)
  w            [E', R, K] bf16, last dim contiguous, strides % 16 elements, 16-byte aligned, 1 <= E' <= 512
  out          [P, N] bf16, N % 16 == 0, last dim contiguous, row stride % 16 elements, 16-byte aligned,
               overlapping no input
  sorted_ids   int32 [cap], contiguous, cap % block_m == 0 (align's output: ``align_capacity`` sizes it)
  block_expert int32 [>= cap // block_m], contiguous;  num_padded int32 [1];  row_scale fp32 [P], contiguous
The index arrays' values are not read on the host (no sync); the kernel skips what is out of range
(kernels_src/moe/grouped.py states the rule), so no value of them makes it touch memory outside these tensors.

Dispatch (a pure function of host ints, so graph-stable):
  - ``block_m`` is the caller's (the one ``align`` grouped with): :func:`choose_block_m` is the rule the MoE
    block uses: 16 (decode tiles) while the average rows per expert, num_tokens * top_k / num_experts, is at
    most ``SMALL_ROWS_PER_EXPERT`` (each block then holds about one expert's rows and the GEMMs stream the
    active experts' weights), else 64 (prefill tiles: tensor-core tiles with a deep pipeline), and 128 (8-warp
    tiles: twice the reuse of each weight tile) once the average reaches ``LARGE_ROWS_PER_EXPERT``, where the
    padding (under block_m / 2 rows per expert on average) costs at most a quarter of the rows.
  - the grid covers :func:`max_blocks` blocks: align's blocks are contiguous from 0 and there are at most
    (P + min(E', P) * (block_m - 1)) // block_m of them (each non-empty expert pads fewer than block_m rows),
    bounded by len(sorted_ids) / block_m; at M = 1 that is 9 blocks, not the capacity's 242.
  - at block_m 16, the N tile (:func:`plan`): the wide tile (64 columns per program) when its program count,
    blocks * cdiv(N, 64), reaches ``WIDE_MIN_WAVES`` programs per SM, else the narrow one (16 columns, 4x the
    programs: M = 1's 9 experts of GEMM1 are 288 programs instead of 72). At block_m 64 and 128 one tile per act.
``_tile=`` forces a tile of the block_m (benchmarks). The constants are first choices made without a device
to time them; benchmarks/bench_moe_grouped.py times forced alternatives next to the rule's pick.

Quantized experts (ops/moe/experts.py): ``w`` as :class:`~vkc_runtime.ops.moe.nvfp4_ops.Nvfp4Experts` (alpha
[E', 2] with silu_mul, else [E', 1]) runs the W4A16 kernel (kernels_src/moe/nvfp4.py), as
:class:`~vkc_runtime.ops.moe.fp8_ops.Fp8Experts` the W8A16 one (kernels_src/moe/fp8.py): each K step's weight tile
decoded to exact bf16 in registers, then the tensor cores; one tile per block_m and act (the kind's TILES), no
row_scale.

Graphs: the op launches one kernel and needs no workspace; :func:`load_kernels` loads every grouped kernel
(call it before a capture: a module load inside a capture would fail it). Calls with torch tensors are bound
calls (vkc_runtime.bound).
"""
from __future__ import annotations

from .._check import BF16, OpError, cdiv, fits_i32, grid_y, row_stride, same_device, stream_of, tensor
from .._check import sm_count as _sm_count
from ...bound import CallCache, Launch, disjoint
from ...kernels import get_kernel
from . import experts as _xk

__all__ = ["grouped_gemm", "choose_block_m", "max_blocks", "plan", "load_kernels", "BLOCK_MS", "ACTS",
           "GROUPED_BASES", "SMALL_ROWS_PER_EXPERT", "LARGE_ROWS_PER_EXPERT", "WIDE_MIN_WAVES", "MAX_EXPERTS"]

ACTS = (None, "silu_mul")
MAX_EXPERTS = 512
SMALL_ROWS_PER_EXPERT = 16
LARGE_ROWS_PER_EXPERT = 256
WIDE_MIN_WAVES = 2
# block_m -> act -> (BLOCK_N, BLOCK_K) per tile, the rule's preference order (kernels_src/moe/grouped_spec.py
# compiles the same list)
TILES = {
    16: {None: ((64, 64), (16, 256)), "silu_mul": ((64, 64), (16, 256))},
    64: {None: ((128, 64),), "silu_mul": ((64, 64),)},
    128: {None: ((128, 64),), "silu_mul": ((64, 64),)},
}
BLOCK_MS = tuple(TILES)


def _base(block_m: int, bn: int, bk: int, act: str | None) -> str:
    """The kernel name (spelled once: the op calls this, GROUPED_BASES is built from it)."""
    return f"moe.grouped.m{block_m}.n{bn}.k{bk}" + (".silu" if act == "silu_mul" else "")


GROUPED_BASES = tuple(_base(bm, bn, bk, act) for bm, per in TILES.items() for act, tiles in per.items()
                      for bn, bk in tiles) + \
    tuple(_xk.module(w).base("grouped", t, bm, act) for w in _xk.KINDS
          for bm, per in _xk.module(w).TILES["grouped"].items() for act, tiles in per.items() for t in tiles)
BASES = GROUPED_BASES


def choose_block_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """The block_m the MoE block groups with for ``num_tokens`` (a host-known maximum, e.g. the workspace's)
    tokens of ``top_k`` pairs each (k', the shared expert included) over ``num_experts`` (E'): the rule in the
    module doc."""
    if num_tokens < 0 or top_k < 1 or num_experts < 1:
        raise OpError(f"choose_block_m: need num_tokens >= 0, top_k >= 1, num_experts >= 1, got "
                      f"{num_tokens}, {top_k}, {num_experts}")
    pairs = num_tokens * top_k
    if pairs <= SMALL_ROWS_PER_EXPERT * num_experts:
        return 16
    return 64 if pairs < LARGE_ROWS_PER_EXPERT * num_experts else 128


def max_blocks(pairs: int, num_experts: int, block_m: int, cap: int) -> int:
    """The blocks a grid must cover: align fills blocks from 0, at most (P + min(E', P)(block_m - 1)) //
    block_m of them, and never more than the cap // block_m that sorted_ids holds."""
    return min(cap // block_m, (pairs + min(num_experts, pairs) * (block_m - 1)) // block_m)


def plan(block_m: int, act: str | None, blocks: int, N: int, num_sms: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) of the kernel for ``blocks`` blocks and N output columns (the rule in the module
    doc)."""
    if block_m not in TILES:
        raise OpError(f"grouped_gemm: block_m must be one of {BLOCK_MS}, got {block_m}")
    tiles = TILES[block_m][act]
    if len(tiles) == 1:
        return tiles[0]
    wide, narrow = tiles
    return wide if blocks * cdiv(N, wide[0]) >= WIDE_MIN_WAVES * max(1, num_sms) else narrow


def load_kernels(*, device: int | None = None) -> None:
    """Load every grouped kernel in the current context (before a graph capture)."""
    for b in GROUPED_BASES:
        get_kernel(b, device=device).load()


_calls = CallCache()


def _span(t) -> tuple[int, int]:
    if any(n == 0 for n in t.shape):
        return t.ptr, t.ptr
    return t.ptr, t.ptr + sum((s - 1) * st for s, st in zip(t.shape, t.strides)) * t.itemsize + t.itemsize


def no_overlap(op, out, others):
    """Refuse ``out`` overlapping any (name, ref) of ``others``."""
    o0, o1 = _span(out)
    for name, t in others:
        a0, a1 = _span(t)
        if a0 < o1 and o0 < a1:
            raise OpError(f"{op}: out must not overlap {name}")


def _index(op, name, obj, dtype, n=None):
    t = tensor(op, name, obj, dtype, ndim=1)
    if n is not None and t.shape[0] != n:
        raise OpError(f"{op}: {name} must have {n} elements, got {t.shape[0]}")
    if t.shape[0] > 1 and t.strides[0] != 1:
        raise OpError(f"{op}: {name} must be contiguous")
    if t.ptr % 16:
        raise OpError(f"{op}: {name} must be 16-byte aligned")
    return t


def aligned(op, name, t, strides):
    """A 16-byte aligned ref whose ``strides`` are multiples of 16 elements."""
    if t.ptr % 16:
        raise OpError(f"{op}: {name} must be 16-byte aligned")
    for s in strides:
        if s % 16:
            raise OpError(f"{op}: {name} strides {tuple(t.strides)} must be multiples of 16 elements")


def grouping(op, sorted_ids, block_expert, num_padded, block_m: int):
    """The grouping arrays' refs (module doc's layouts: cap a multiple of block_m, block_expert >= cap // block_m
    entries, num_padded one)."""
    st = _index(op, "sorted_ids", sorted_ids, "int32")
    cap = st.shape[0]
    if cap % block_m:
        raise OpError(f"{op}: sorted_ids has {cap} entries, not a multiple of block_m={block_m}")
    bt = _index(op, "block_expert", block_expert, "int32")
    if bt.shape[0] < cap // block_m:
        raise OpError(f"{op}: block_expert has {bt.shape[0]} entries, sorted_ids needs {cap // block_m}")
    return st, bt, _index(op, "num_padded", num_padded, "int32", 1)


def grouped_gemm(a, w, sorted_ids, block_expert, num_padded, *, a_row_div: int, out, block_m: int,
                 act: str | None = None, row_scale=None, stream=None, _tile: tuple[int, int] | None = None):
    """out[f] = act(a[f // a_row_div] @ w[e]^T) (* row_scale[f]) for the grouped rows (module doc). Returns
    ``out``. ``_tile`` forces a (BLOCK_N, BLOCK_K) tile of ``block_m`` (benchmarks)."""
    op = "grouped_gemm"
    s = stream_of(stream)
    kind = _xk.kind_of(w)
    key = (op, act, block_m, row_scale is None, _tile, kind)
    tensors = (a, *_xk.flat(w), sorted_ids, block_expert, num_padded, out) + \
        (() if row_scale is None else (row_scale,))
    if type(a_row_div) is int and _calls.run(key, tensors, (a_row_div,), s):
        return out
    if act not in ACTS:
        raise OpError(f"{op}: act must be one of {ACTS}, got {act!r}")
    if type(block_m) is not int or block_m not in TILES:
        raise OpError(f"{op}: block_m must be one of {BLOCK_MS}, got {block_m!r}")
    if type(a_row_div) is not int or a_row_div < 1:
        raise OpError(f"{op}: a_row_div must be a positive int, got {a_row_div!r}")
    if out is None:
        raise OpError(f"{op}: out= is required (rows never selected are left as they are)")
    if kind and row_scale is not None:
        raise OpError(f"{op}: row_scale is not supported with quantized ({kind}) experts")
    at = tensor(op, "a", a, BF16, ndim=2)
    a_rows, K = at.shape
    if kind:
        q = _xk.module(kind).experts_refs(op, "w", w, rows=None, K=K, gate_up=act == "silu_mul")
        wt, E, R, Kw = q.codes, q.E, q.R, q.K
    else:
        wt = tensor(op, "w", w, BF16, ndim=3)
        E, R, Kw = wt.shape
    if Kw != K:
        raise OpError(f"{op}: a has K={K}, w has K={Kw}")
    if K == 0 or K % 16:
        raise OpError(f"{op}: K={K} must be a positive multiple of 16")
    if not 1 <= E <= MAX_EXPERTS:
        raise OpError(f"{op}: w has {E} experts, expected 1..{MAX_EXPERTS}")
    if act == "silu_mul" and R % 2:
        raise OpError(f"{op}: act='silu_mul' needs an even number of weight rows (gate then up), got {R}")
    N = R // 2 if act == "silu_mul" else R
    ot = tensor(op, "out", out, BF16, ndim=2)
    P = ot.shape[0]
    if ot.shape[1] != N:
        raise OpError(f"{op}: out has {ot.shape[1]} columns, expected N={N}"
                      + (" (w.shape[1] // 2 with act='silu_mul')" if act else ""))
    if N % 16:
        raise OpError(f"{op}: N={N} output columns must be a multiple of 16 (the kernels' store promise)")
    st, bt, nt = grouping(op, sorted_ids, block_expert, num_padded, block_m)
    cap = st.shape[0]
    refs = [at, *(q.tensors if kind else (wt,)), ot, st, bt, nt]
    rt = None
    if row_scale is not None:
        rt = _index(op, "row_scale", row_scale, "float32", P)
        refs.append(rt)
    dev = same_device(op, *refs)
    if cdiv(P, a_row_div) > a_rows:
        raise OpError(f"{op}: out has P={P} rows, a has {a_rows}: need cdiv(P, a_row_div={a_row_div}) <= {a_rows}")
    sa = row_stride(at) if a_rows > 1 else K
    so = row_stride(ot) if P > 1 else N
    if kind:
        swe, swn = q.strides[:2]
        wnamed = q.named
    else:
        swe = int(wt.strides[0]) if E > 1 else R * K
        swn = int(wt.strides[1]) if R > 1 else K
        if wt.strides[2] != 1 and K > 1:
            raise OpError(f"{op}: w must be contiguous in its last dim")
        aligned(op, "w", wt, (swe, swn))
        wnamed = [("w", wt)]
    aligned(op, "a", at, (sa,))
    aligned(op, "out", ot, (so,))
    if P > 1 and so < N:
        raise OpError(f"{op}: out rows overlap (row stride {so} < N={N})")
    no_overlap(op, ot, [("a", at), *wnamed, ("sorted_ids", st), ("block_expert", bt), ("num_padded", nt)]
                + ([("row_scale", rt)] if rt is not None else []))
    fits_i32(op, P=P, N=N, K=K, a_rows=a_rows, a_row_div=a_row_div, stride_a=sa, stride_we=swe, stride_wn=swn,
             stride_out=so, cap=cap)
    nb = max_blocks(P, E, block_m, cap)
    if P == 0 or N == 0 or nb == 0:
        return out
    tiles = _xk.module(kind).TILES["grouped"][block_m][act] if kind else TILES[block_m][act]
    if _tile is not None:
        if _tile not in tiles:
            raise OpError(f"{op}: _tile {_tile!r} is not a compiled tile of block_m={block_m} act={act!r}: {tiles}")
        bn, bk = _tile
    elif kind:
        bn, bk = tiles[0]
    else:
        bn, bk = plan(block_m, act, nb, N, _sm_count(dev))
    grid = (cdiv(N, bn), grid_y(op, nb), 1)
    if kind:
        k = get_kernel(_xk.module(kind).base("grouped", (bn, bk), block_m, act))
        args = (at, *q.tensors, ot, st, bt, nt, P, E, N, K, a_rows, a_row_div, sa, *q.strides, so) + \
            ((2 if act == "silu_mul" else 1,) if getattr(_xk.module(kind), "ALPHA_COLUMNS_ARG", False) else ())
        slots = (at, *q.tensors, st, bt, nt, ot)
    else:
        k = get_kernel(_base(block_m, bn, bk, act))
        args = (at, wt, ot, st, bt, nt, rt if rt is not None else st, P, E, N, K, a_rows, a_row_div, sa, swe, swn,
                so, int(rt is not None))
        slots = (at, wt, st, bt, nt, ot) + ((rt,) if rt is not None else ())
    _calls.launch(key, slots, (a_row_div,), [Launch(k, grid, args)], s,
                  relations=[disjoint(ot, r) for r in slots if r is not ot])
    return out
