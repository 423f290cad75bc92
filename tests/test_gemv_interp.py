"""CPU tests of kernels_src/gemv (small-M GEMM for decode, BF16 and NVFP4-as-W4A16) through Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1), against float64 numpy references on fresh random data.

Every compiled specialization runs at least once; masked tails in N, K and M; split-K partials and their
reduce (poisoned workspace, several splits, a K tail in the last split); poisoned outputs with padding columns
that must stay untouched; NVFP4: the numpy layout helpers against ml_dtypes, all 16 e2m1 codes and a wide
range of e4m3 scales (subnormals included), nibble order and scale placement cases that a swapped nibble or an
off-by-one scale index fails, and the global scale as a multiplier.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
pytest.importorskip("ml_dtypes")

from tests import refs_nvfp4 as F  # noqa: E402
from tests.kernel_testing import device, launch_spec, np64, specs  # noqa: E402
from tests.refs import rel_err  # noqa: E402

DEV = device()
SPECS = specs("gemv")
BF16_SPECS = sorted(n for n in SPECS if n.startswith("bf16."))
W4_SPECS = sorted(n for n in SPECS if n.startswith("w4a16.") and n.endswith(".int"))  # .prmt: inline PTX


def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


def rnd(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(DEV)


def cfg(name):
    c = SPECS[name].constexprs
    return c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"]


def run_reduce(ws, y, M, N, split):
    r = SPECS["splitk_reduce"]
    launch_spec(r, (triton.cdiv(N, r.constexprs["BLOCK"]), M), ws, y, M, N, y.stride(0), split)


def check(y, ref, tol=1e-2):
    o = np64(y)
    assert np.isfinite(o).all(), f"{np.count_nonzero(~np.isfinite(o))} non-finite outputs (unwritten?)"
    err = rel_err(o, ref)
    assert err < tol, f"rel err {err:.3e}"


def run_bf16(name, x, w, y, split_tiles=None, block_k=None):
    """Launch one bf16 spec on x [M, K], w [N, K] into y [M, N] (views); split_tiles: K tiles per split
    (None: one split). Returns the workspace (or None)."""
    bm, bn, bk = cfg(name)
    bk = block_k or bk
    M, K = x.shape
    N = w.shape[0]
    kt = triton.cdiv(K, bk)
    per = kt if split_tiles is None else split_tiles
    split = triton.cdiv(kt, per)
    ws = torch.full((max(split, 1) * M * N,), float("nan"), dtype=torch.float32, device=DEV)
    launch_spec(SPECS[name], (triton.cdiv(N, bn), split), x, w, y, ws, M, N, K, x.stride(0), w.stride(0),
                y.stride(0), per * bk, **({"BLOCK_K": bk} if block_k else {}))
    if split > 1:
        run_reduce(ws, y, M, N, split)
    return split


def padded_out(M, N, pad=16):
    yb = torch.full((M, N + pad), float("nan"), dtype=torch.bfloat16, device=DEV)
    return yb, yb[:, :N]


@pytest.mark.parametrize("name", BF16_SPECS)
def test_bf16_every_spec_with_tails(name):
    """N tail (not a multiple of BLOCK_N), K tail (K % BLOCK_K != 0), M below the bucket, strided x and out."""
    bm, bn, bk = cfg(name)
    g = torch.Generator().manual_seed(_seed())
    M = max(1, bm - 3)
    N, K = 2 * bn + 5, bk + 48
    xb = rnd(g, M, K + 32)
    x = xb[:, 16:16 + K]
    w = rnd(g, N, K, scale=0.5)
    yb, y = padded_out(M, N)
    run_bf16(name, x, w, y)
    check(y, np64(x) @ np64(w).T)
    assert torch.isnan(yb[:, N:].float()).all(), "wrote past N"


@pytest.mark.parametrize("name,M,split_tiles", [("bf16.m16.n64.k128", 1, 1), ("bf16.m32.n16.k256", 20, 2),
                                                ("bf16.m64.n64.k128", 64, 3), ("bf16.m1.n4.k1024", 1, 1),
                                                ("bf16.m1.n4.k1024", 1, 4)])
def test_bf16_split_k(name, M, split_tiles):
    """Several splits (the last one shorter and with a K tail), poisoned workspace, deterministic reduce:
    the split result equals the float64 product and is bit-identical on a second run."""
    bm, bn, bk = cfg(name)
    g = torch.Generator().manual_seed(_seed())
    N, K = bn + 7, 5 * bk + 32
    x, w = rnd(g, M, K), rnd(g, N, K, scale=0.5)
    yb, y = padded_out(M, N)
    split = run_bf16(name, x, w, y, split_tiles=split_tiles)
    assert split > 1
    check(y, np64(x) @ np64(w).T)
    assert torch.isnan(yb[:, N:].float()).all()
    y2 = torch.empty_like(y)
    run_bf16(name, x, w, y2, split_tiles=split_tiles)
    assert torch.equal(y.view(torch.int16), y2.view(torch.int16))


@pytest.mark.parametrize("name", ["bf16.m16.n16.k256", "bf16.m1.n4.k1024"])
def test_bf16_each_weight_row_and_k_matters(name):
    """One-hot x picks single weight columns: y[m, n] == w[n, k_m] exactly (no mixing of rows or columns; the
    M = 1 kernel takes one one-hot row per launch, the K positions at both sides of its tile boundaries)."""
    g = torch.Generator().manual_seed(_seed())
    N, K = 40, 2048 + 16
    ks = [0, 255, 256, 1023, 1024, 2047, 2063]
    x = torch.zeros(len(ks), K, dtype=torch.bfloat16)
    for m, k in enumerate(ks):
        x[m, k] = 1.0
    w = rnd(g, N, K)
    rows = [x] if cfg(name)[0] > 1 else [x[m:m + 1] for m in range(len(ks))]
    ys = []
    for xr in rows:
        y = torch.full((xr.shape[0], N), float("nan"), dtype=torch.bfloat16)
        run_bf16(name, xr, w, y, split_tiles=triton.cdiv(K, cfg(name)[2]))
        ys.append(y)
    y = torch.cat(ys)
    for m, k in enumerate(ks):
        assert torch.equal(y[m], w[:, k]), (m, k)


# ----------------------------------------------------------------------------------------------- NVFP4

def test_e2m1_table_and_pack_roundtrip():
    assert np.array_equal(F.E2M1, F.e2m1_table_from_ml_dtypes())
    rng = np.random.default_rng(_seed())
    codes = rng.integers(0, 16, size=(3, 64), dtype=np.uint8)
    p = F.pack(codes)
    assert p.shape == (3, 32) and np.array_equal(F.unpack(p), codes)
    assert F.pack(np.array([[3, 12]], dtype=np.uint8))[0, 0] == 0xC3  # low nibble first


def run_w4(name, x, packed, scales, alpha, y, split_tiles=None, N=None):
    bm, bn, bk = cfg(name)
    M, K = x.shape
    N = packed.shape[0] if N is None else N
    kt = triton.cdiv(K, bk)
    per = kt if split_tiles is None else split_tiles
    split = triton.cdiv(kt, per)
    ws = torch.full((split * M * N,), float("nan"), dtype=torch.float32, device=DEV)
    launch_spec(SPECS[name], (triton.cdiv(N, bn), split), x, packed, scales, y, ws, float(alpha), M, N, K,
                x.stride(0), packed.stride(0), scales.stride(0), y.stride(0), per * bk)
    if split > 1:
        run_reduce(ws, y, M, N, split)
    return split


def nvfp4_data(rng, N, K, spread=True):
    codes = rng.integers(0, 16, size=(N, K), dtype=np.uint8)
    if spread:  # e4m3 scales over many binades, subnormals (< 2^-6) included
        sv = 2.0 ** rng.uniform(-9, 8, size=(N, K // 16))
    else:
        sv = rng.uniform(0.5, 2.0, size=(N, K // 16))
    s = F.e4m3_encode(sv)
    return F.pack(codes), s


def to_dev(a):
    return torch.from_numpy(np.ascontiguousarray(a)).to(DEV)


@pytest.mark.parametrize("name", W4_SPECS)
def test_w4a16_every_spec_with_tails(name):
    bm, bn, bk = cfg(name)
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    M = max(1, bm - 5)
    N, K = bn + 9, bk + 96  # K tail of 6 scale groups
    packed, s = nvfp4_data(rng, N, K)
    # padded rows (row strides of 16 bytes, as the runtime requires), the pad poisoned with codes/scales
    pb = np.full((N, K // 2 + 16), 0x77, dtype=np.uint8)
    pb[:, :K // 2] = packed
    sb = np.full((N, triton.cdiv(K // 16, 16) * 16 + 16), 0x7E, dtype=np.uint8)
    sb[:, :K // 16] = s
    alpha = 0.37
    x = rnd(g, M, K)
    yb, y = padded_out(M, N)
    run_w4(name, x, to_dev(pb)[:, :K // 2], to_dev(sb)[:, :K // 16], alpha, y)
    check(y, np64(x) @ F.dequant(packed, s, alpha).T)
    assert torch.isnan(yb[:, N:].float()).all()


@pytest.mark.parametrize("name,M,split_tiles", [("w4a16.m16.n16.k256.int", 3, 1), ("w4a16.m64.n64.k256.int", 33, 2),
                                                ("w4a16.m1.n64.k256.int", 1, 2)])
def test_w4a16_split_k(name, M, split_tiles):
    bm, bn, bk = cfg(name)
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    N, K = 2 * bn + 3, 3 * bk + 32
    packed, s = nvfp4_data(rng, N, K)
    x = rnd(g, M, K)
    yb, y = padded_out(M, N)
    assert run_w4(name, x, to_dev(packed), to_dev(s), 2.5, y, split_tiles=split_tiles) > 1
    check(y, np64(x) @ F.dequant(packed, s, 2.5).T)
    assert torch.isnan(yb[:, N:].float()).all()


@pytest.mark.parametrize("name", ["w4a16.m16.n16.k256.int", "w4a16.m1.n16.k256.int"])
def test_w4a16_all_codes_and_scales_exact(name):
    """x = identity rows: y[m, n] = W[n, k_m] exactly (the dequantized weight is exact in bf16 and alpha is a
    power of two): all 16 codes at even and odd k, scales spanning e4m3's range including subnormals. The M = 1
    kernel runs one identity row per launch."""
    bm = cfg(name)[0]
    rng = np.random.default_rng(_seed())
    N, K = 16, 256
    codes = rng.integers(0, 16, size=(N, K), dtype=np.uint8)
    codes[:, :32] = np.tile(np.arange(16, dtype=np.uint8), 2)  # every code at an even and at an odd k
    sbytes = rng.integers(1, 0x7F, size=(N, K // 16), dtype=np.uint8)  # finite positive e4m3, subnormals too
    sbytes[0, :4] = [0x01, 0x07, 0x08, 0x7E]  # smallest subnormal, largest subnormal, smallest normal, 448
    packed = F.pack(codes)
    ks = list(range(0, 16)) + [17, 31, 32, 100, 129, 255]
    for lo in range(0, len(ks), 16):
        part = ks[lo:lo + 16]
        x = torch.zeros(len(part), K, dtype=torch.bfloat16)
        for m, k in enumerate(part):
            x[m, k] = 1.0
        y = torch.full((len(part), N), float("nan"), dtype=torch.bfloat16)
        for r0 in range(0, len(part), bm):
            run_w4(name, x[r0:r0 + bm], to_dev(packed), to_dev(sbytes), 0.5, y[r0:r0 + bm])
        W = F.dequant(packed, sbytes, 0.5)
        for m, k in enumerate(part):
            assert np.array_equal(np64(y[m]), W[:, k]), (k, np64(y[m])[:4], W[:4, k])


@pytest.mark.parametrize("name", ["w4a16.m16.n64.k256.int", "w4a16.m1.n64.k256.int"])
def test_w4a16_nibble_order_and_scale_index(name):
    """A weight whose low nibbles (even k) and high nibbles (odd k) differ, and whose 16-element groups have
    distinct scales: swapped nibbles or a scale index off by one group gives a different y."""
    bm = cfg(name)[0]  # the M = 1 kernel runs the 3 rows one launch each
    N, K = 64, 512
    codes = np.zeros((N, K), dtype=np.uint8)
    codes[:, 0::2] = 2  # +1.0 at even k (low nibble)
    codes[:, 1::2] = 15  # -6.0 at odd k (high nibble)
    rng = np.random.default_rng(_seed())
    sv = 2.0 ** rng.permutation(np.arange(-8, 8))[np.arange(N * (K // 16)) % 16].reshape(N, K // 16)
    sv = np.where(np.arange(K // 16) % 2 == 0, sv, sv[:, ::-1])  # exact in e4m3, neighbours differ
    s = F.e4m3_encode(sv)
    packed = F.pack(codes)
    g = torch.Generator().manual_seed(_seed())
    x = rnd(g, 3, K)
    y = torch.full((3, N), float("nan"), dtype=torch.bfloat16)
    for r0 in range(0, 3, bm):
        run_w4(name, x[r0:r0 + bm], to_dev(packed), to_dev(s), 1.0, y[r0:r0 + bm])
    ref = np64(x) @ F.dequant(packed, s, 1.0).T
    check(y, ref, tol=5e-3)
    swapped = F.pack(np.stack([codes[:, 1::2], codes[:, 0::2]], -1).reshape(N, K))
    shifted = np.roll(s, 1, axis=1)
    for bad in (F.dequant(swapped, s, 1.0), F.dequant(packed, shifted, 1.0)):
        assert rel_err(np64(y), np64(x) @ bad.T) > 0.1


def test_quantize_recipe_roundtrip():
    """The test-data quantizer: dequant(quantize(w)) is close to w (block amax / 6 scales)."""
    rng = np.random.default_rng(_seed())
    w = rng.standard_normal((8, 64))
    p, s, a = F.quantize(w)
    assert rel_err(F.dequant(p, s, a), w) < 0.15


def test_prmt_specs_mirror_the_int_specs():
    """The .prmt kernels (inline PTX: the interpreter cannot run them; tests/gpu compares them with .int bit for
    bit) are the .int specs with the decoder switched, nothing else."""
    prmt = sorted(n for n in SPECS if n.endswith(".prmt"))
    assert [n[:-5] + ".int" for n in prmt] == W4_SPECS
    for n in prmt:
        a, b = SPECS[n], SPECS[n[:-5] + ".int"]
        assert a.constexprs == {**b.constexprs, "PRMT": True} and b.constexprs["PRMT"] is False
        assert (a.entry, a.args, a.num_warps, a.num_stages, a.overrides) == (b.entry, b.args, b.num_warps,
                                                                              b.num_stages, b.overrides)
