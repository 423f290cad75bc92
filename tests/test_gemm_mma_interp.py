"""CPU tests of kernels_src/gemm/mma.py (the Triton lane of the GEMM family: BF16, and NVFP4 weights as W4A16)
through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), against float64 numpy references on fresh
random data.

Every compiled specialization runs on shapes with M, N and K tails (rows past M / N wrap, K masked per slice);
small tiles give several tile rows and columns under grouped rasterization with a partial last group; operands
are strided views into padded buffers; outputs are poisoned with padding columns that must stay untouched.
NVFP4: the interpreter runs the integer decoder (PRMT=False; the compiled kernels' packed-word decoder is checked
against it and float64 on the GPU), with spread e4m3 scales, a K tail inside a k-slice, the global multiplier,
and cases that a swapped nibble or a scale index off by one group fails.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
pytest.importorskip("ml_dtypes")

from tests import refs_nvfp4 as F  # noqa: E402
from tests.kernel_testing import bf16, bf16_out, device, launch_spec, np64, rng, specs  # noqa: E402
from tests.refs import rel_err  # noqa: E402

DEV = device()
SPECS = specs("gemm")
BF16 = sorted(n for n in SPECS if n.startswith("bf16.mma."))
W4 = sorted(n for n in SPECS if n.startswith("w4a16."))


def strided(a: torch.Tensor, pad: int = 16) -> torch.Tensor:
    """``a`` [R, C] as a view with row stride C + pad (the pad NaN / 0x77 bytes)."""
    fill = float("nan") if a.is_floating_point() else 0x77
    buf = torch.full((a.shape[0], a.shape[1] + pad), fill, dtype=a.dtype, device=DEV)
    buf[:, :a.shape[1]] = a
    return buf[:, :a.shape[1]]


def check(out, ref, tol=1e-2):
    o = np64(out)
    assert np.isfinite(o).all(), f"{np.count_nonzero(~np.isfinite(o))} non-finite outputs (unwritten?)"
    err = rel_err(o, ref)
    assert err < tol, f"rel err {err:.3e}"
    return err


def run_bf16(name, a, w, out, **tile):
    c = {**SPECS[name].constexprs, **tile}
    M, K = a.shape
    N = w.shape[0]
    grid = triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"])
    launch_spec(SPECS[name], (grid,), a, w, out, M, N, K, a.stride(0), w.stride(0), out.stride(0), **tile)


@pytest.mark.parametrize("name", BF16)
def test_bf16_every_spec_with_tails(name):
    """M, N below / past the tile (rows wrap), K = 176 (five 32-wide slices, the last 16 wide), strided x and w."""
    g = rng()
    M, N, K = 37, 200, 176
    a, w = g.standard_normal((M, K)), g.standard_normal((N, K))
    buf, out = bf16_out(M, N)
    run_bf16(name, strided(bf16(a)), strided(bf16(w), 32), out)
    ab, wb = np64(bf16(a)), np64(bf16(w))
    err = check(out, ab @ wb.T)
    assert torch.isnan(buf[:, N:]).all()
    # every row of w and every k matters: the reference with one weight row or one k column changed is far off
    w2 = wb.copy()
    w2[N - 1] *= -1
    assert rel_err(np64(out)[:, N - 1], (ab @ w2.T)[:, N - 1]) > 100 * err
    a2 = ab.copy()
    a2[:, K - 1] += 8.0
    assert rel_err(np64(out), a2 @ wb.T) > 10 * err


def test_bf16_grouped_raster_small_tiles():
    """16 x 16 tiles: 5 tile rows x 7 tile columns under GROUP_M = 2 (a partial last group)."""
    g = rng()
    M, N, K = 75, 104, 96
    a, w = g.standard_normal((M, K)), g.standard_normal((N, K))
    buf, out = bf16_out(M, N)
    run_bf16(BF16[-1], bf16(a), bf16(w), out, BLOCK_M=16, BLOCK_N=16, GROUP_M=2)
    check(out, np64(bf16(a)) @ np64(bf16(w)).T)
    assert torch.isnan(buf[:, N:]).all()


def run_w4(name, a, packed, scales, alpha, out, **tile):
    c = {**SPECS[name].constexprs, **tile}
    M, K = a.shape
    N = packed.shape[0]
    grid = triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"])
    launch_spec(SPECS[name], (grid,), a, packed, scales, out, float(alpha), M, N, K, a.stride(0), packed.stride(0),
                scales.stride(0), out.stride(0), **{"PRMT": False, **tile})


def nvfp4(g, N, K):
    codes = g.integers(0, 16, size=(N, K), dtype=np.uint8)
    s = F.e4m3_encode(2.0 ** g.uniform(-9, 8, size=(N, K // 16)))  # many binades, subnormal scales included
    return F.pack(codes), s


def to_dev(a):
    return torch.from_numpy(np.ascontiguousarray(a)).to(DEV)


@pytest.mark.parametrize("name", W4)
def test_w4a16_every_spec_with_tails(name):
    """K = 176: two full 64-wide slices and a 48-wide tail (3 of 4 scale groups); M, N tails; padded weight and
    scale rows (poisoned pad: a read past K // 16 groups would show)."""
    g = rng()
    M, N, K = 37, 140, 176
    packed, s = nvfp4(g, N, K)
    a = bf16(g.standard_normal((M, K)))
    buf, out = bf16_out(M, N)
    run_w4(name, strided(a), strided(to_dev(packed)), strided(to_dev(s)), 0.37, out)
    check(out, np64(a) @ F.dequant(packed, s, 0.37).T)
    assert torch.isnan(buf[:, N:]).all()


def test_w4a16_nibble_order_scale_index_and_alpha():
    """Low nibbles (even k) and high nibbles (odd k) differ, neighbouring 16-element groups have distinct scales,
    16 x 16 tiles give several programs: swapped nibbles, a scale index off by one group, or alpha not applied
    gives a different output."""
    g = rng()
    M, N, K = 20, 48, 256
    codes = np.zeros((N, K), dtype=np.uint8)
    codes[:, 0::2] = 2   # +1.0 at even k
    codes[:, 1::2] = 15  # -6.0 at odd k
    sv = 2.0 ** g.permutation(np.arange(-8, 8))[np.arange(N * (K // 16)) % 16].reshape(N, K // 16)
    s = F.e4m3_encode(sv)
    packed = F.pack(codes)
    a = bf16(g.standard_normal((M, K)))
    buf, out = bf16_out(M, N)
    run_w4(W4[-1], a, to_dev(packed), to_dev(s), 2.0, out, BLOCK_M=16, BLOCK_N=16, GROUP_M=2)
    check(out, np64(a) @ F.dequant(packed, s, 2.0).T, tol=5e-3)
    swapped = F.pack(np.stack([codes[:, 1::2], codes[:, 0::2]], -1).reshape(N, K))
    for bad in (F.dequant(swapped, s, 2.0), F.dequant(packed, np.roll(s, 1, axis=1), 2.0),
                F.dequant(packed, s, 1.0)):
        assert rel_err(np64(out), np64(a) @ bad.T) > 0.1


def test_nvfp4_dequant_with_tails_and_padding():
    """N = 37 (a partial 16-row block), K = 304 (a 256-wide block and a 48-wide tail); padded weight / scale / out
    rows: out = bf16(W * alpha), nothing written past [N, K], nothing read past K // 16 groups."""
    g = rng()
    N, K = 37, 304
    packed, s = nvfp4(g, N, K)
    spec = SPECS["nvfp4_dequant"]
    c = spec.constexprs
    buf, out = bf16_out(N, K, pad=16)
    launch_spec(spec, (triton.cdiv(N, c["BLOCK_N"]), triton.cdiv(K, c["BLOCK_K"])), strided(to_dev(packed)),
                strided(to_dev(s)), out, 0.37, N, K, K // 2 + 16, K // 16 + 16, out.stride(0), PRMT=False)
    want = np64(bf16(F.dequant(packed, s, 1.0).astype(np.float32) * np.float32(0.37)))  # fp32 product, as the kernel
    np.testing.assert_array_equal(np64(out), want)
    assert torch.isnan(buf[:, K:]).all()
