"""NVFP4 expert weights for the MoE ops (kernels_src/moe/nvfp4.py): :class:`Nvfp4Experts` passed where the ops take
bf16 ``w1`` / ``w2`` runs W4A16 -- the weights stay 4-bit on the device and are decoded in the kernels (bf16
activations, fp32 sums) -- on both paths of :func:`~vkc_runtime.ops.moe.sparse_moe_block`:

    w1 = Nvfp4Experts(codes, scales, alpha)     # codes uint8 [E', 2I, H/2], scales uint8 [E', 2I, H/16], alpha [E', 2]
    w2 = Nvfp4Experts(codes, scales, alpha)     # [E', H, I/2], [E', H, I/16], alpha fp32 [E', 1] (or [E'])
    decode_gate_up(x, w1, ids, out=h); decode_down(h, w2, ids, wts, out=y); grouped_gemm(a, w1, ..., act="silu_mul")

Layout (HF's linear NVFP4 layout, expert after expert, as a checkpoint stores each expert's projections): byte j
of a row holds k = 2j in its low nibble and k = 2j + 1 in its high nibble (e2m1); ``scales[e, r, g]`` is the e4m3
byte that scales k in [16g, 16g + 16); ``alpha`` the effective global multiplier of each expert's projection
(compressed-tensors: 1 / weight_global_scale, ModelOpt: weight_scale_2), two columns for w1 -- the gate rows'
and the up rows' (gate_proj and up_proj each carry one) -- one for w2.
W[e, r, k] = e2m1 * e4m3 * alpha. Requirements (checked before any launch, :class:`OpError` otherwise): codes /
scales uint8, contiguous, 16-byte aligned, K % 32 == 0 (whole 16-byte code rows); alpha float32 contiguous with
E' rows. Scale bytes are values, never addresses: any byte is safe (a NaN code gives NaN outputs, as the
dequantized weight would).

Tiles (``TILES``, the rule's pick first; ``_tile=`` forces another, as for the bf16 kernels): gate_up
(BLOCK_N, BLOCK_K), down (BLOCK_N, BLOCK_K, SB), grouped (block_m -> act -> (BLOCK_N, BLOCK_K)). The decode picks
are the H200's fastest at M = 1 on the 35B-A3B shape (benchmarks/bench_moe.py nvfp4, session 17: gate_up n8.k256
10.95 us vs 12.72 / 17.94; down n4.k64 11.18 us vs 11.48 / 11.83). A down tile's third number is how many slots
(k') it holds: 16 (one tile), or 9 (8 + 1 apart: the 35B-A3B's 8 picks + the shared expert without 7 dead lanes;
decode_down takes the first tile holding k').
"""
from __future__ import annotations

from typing import Any, NamedTuple

from .._check import OpError, same_device, tensor
from .common import ExpertRefs, contiguous

__all__ = ["Nvfp4Experts", "experts_refs", "TILES", "NVFP4_BASES", "base"]

ALPHA_COLUMNS_ARG = True  # the grouped kernel takes n_alpha (ops/moe/grouped_ops.py)


class Nvfp4Experts(NamedTuple):
    """NVFP4 expert weights (module doc): ``codes`` uint8 [E', R, K/2], ``scales`` uint8 [E', R, K/16], ``alpha``
    float32 [E', A] (A = 2 for gate_up weights, 1 for down) or [E'] (A = 1)."""
    codes: Any
    scales: Any
    alpha: Any


# kernel -> its tiles, the rule's pick first (kernels_src/moe/nvfp4_spec.py compiles the same)
TILES = {
    "gate_up": ((8, 256), (8, 512), (4, 512)),
    "down": ((4, 64, 9), (4, 64, 16), (4, 128, 16), (2, 128, 16)),
    "grouped": {16: {None: ((64, 64),), "silu_mul": ((64, 64),)},
                64: {None: ((128, 64),), "silu_mul": ((64, 64),)},
                128: {None: ((128, 64),), "silu_mul": ((64, 64),)}},
}


def base(kind: str, tile: tuple, block_m: int | None = None, act: str | None = None) -> str:
    """The kernel name (spelled once: the ops call this, NVFP4_BASES is built from it)."""
    if kind == "gate_up":
        return f"moe.w4a16.decode.gate_up.n{tile[0]}.k{tile[1]}"
    if kind == "down":
        return f"moe.w4a16.decode.down.n{tile[0]}.k{tile[1]}.s{tile[2]}"
    return f"moe.w4a16.grouped.m{block_m}.n{tile[0]}.k{tile[1]}" + (".silu" if act == "silu_mul" else "")


NVFP4_BASES = tuple([base(k, t) for k in ("gate_up", "down") for t in TILES[k]] +
                    [base("grouped", t, bm, act) for bm, per in TILES["grouped"].items() for act, ts in per.items()
                     for t in ts])


def experts_refs(op: str, name: str, w: Nvfp4Experts, *, rows: int | None, K: int | None, gate_up: bool,
                 E: int | None = None) -> ExpertRefs:
    """Check NVFP4 experts ``w`` (module doc) for ``rows`` rows of ``K`` each (None: any), gate_up weights (two
    alpha columns) or down weights (one); the refs and byte strides the kernels take."""
    if not isinstance(w, Nvfp4Experts):
        raise OpError(f"{op}: {name} must be Nvfp4Experts, got {type(w).__name__}")
    n_alpha = 2 if gate_up else 1
    q = tensor(op, f"{name}.codes", w.codes, "uint8", ndim=3)
    Ep, R, Kh = q.shape
    Kw = 2 * Kh
    if (rows is not None and R != rows) or (K is not None and Kw != K) or (E is not None and Ep != E):
        raise OpError(f"{op}: {name}.codes has shape {tuple(q.shape)}, expected "
                      f"[{E if E is not None else 'E'}, {rows if rows is not None else 'R'}, "
                      f"{K // 2 if K is not None else 'K/2'}]")
    if Ep < 1 or R < 1 or Kw == 0 or Kw % 32:
        raise OpError(f"{op}: {name}: need E' >= 1, R >= 1 and K a positive multiple of 32, got "
                      f"{Ep} x {R} x {Kw}")
    s = tensor(op, f"{name}.scales", w.scales, "uint8", ndim=3, shape=(Ep, R, Kw // 16))
    a = tensor(op, f"{name}.alpha", w.alpha, "float32")
    if not (a.shape == (Ep, n_alpha) or (n_alpha == 1 and a.shape == (Ep,))):
        raise OpError(f"{op}: {name}.alpha must be float32 [{Ep}, {n_alpha}]"
                      + (f" or [{Ep}]" if n_alpha == 1 else "") + f", got {tuple(a.shape)}")
    for n, t in (("codes", q), ("scales", s), ("alpha", a)):
        contiguous(op, f"{name}.{n}", t)
        if t.ptr % 16:
            raise OpError(f"{op}: {name}.{n} must be 16-byte aligned")
    same_device(op, q, s, a)
    return ExpertRefs((q, s, a), (R * Kh, Kh, R * (Kw // 16), Kw // 16),
                      [(f"{name}.codes", q), (f"{name}.scales", s), (f"{name}.alpha", a)], Ep, R, Kw, q)
