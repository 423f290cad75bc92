"""CPU tests of kernels_src/gemm_fp8 (FP8 e4m3 W8A8 GEMMs and the bf16 -> fp8 quantizers) through Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1; tests/interp_fixes.py makes its fp32 -> e4m3 cast round
and saturate like the GPU's), against numpy references built on ml_dtypes (tests/refs_fp8.py).

Quantizers: bit-exact against numpy on rows that exercise rounding to nearest even, saturation at 448, zero rows
(the scale floor), tiny magnitudes (subnormal e4m3 results), K tails and several programs per row; outputs and
scale buffers poisoned with padding that must stay untouched. GEMMs: every compiled specialization on shapes with
M, N and K tails, per-tensor / per-token x per-channel / strided scales, block scales whose every entry matters,
small tiles that give several tile rows and columns (grouped rasterization), poisoned padded outputs.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
pytest.importorskip("ml_dtypes")

from tests import refs_fp8 as R  # noqa: E402
from tests.kernel_testing import bf16, bf16_out, device, launch_spec, np64, rng, specs  # noqa: E402
from tests.refs import rel_err  # noqa: E402

DEV = device()
SPECS = specs("gemm_fp8")
SCALED = sorted(n for n in SPECS if n.startswith("scaled."))
BLOCK = sorted(n for n in SPECS if n.startswith("block."))
NAN_BYTE = 0x7F  # e4m3 NaN: the poison of fp8 outputs


def fp8(bits) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(bits, dtype=np.uint8)).view(torch.float8_e4m3fn).to(DEV)


def bits_of(t) -> np.ndarray:
    return t.cpu().contiguous().view(torch.uint8).numpy()


def f32(t) -> np.ndarray:
    return t.float().cpu().numpy()


def fp8_out(M, K, pad=16):
    buf = torch.full((M, K + pad), NAN_BYTE, dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)
    return buf, buf[:, :K]


def test_reference_rounding_and_saturation():
    """The numpy oracle itself: ties to even, subnormals, saturation, NaN."""
    v = np.array([1.0625, 1.1875, 2 ** -9, 2 ** -10, 3 * 2 ** -10, 449, 1e4, -1e4, 0.0, np.nan], np.float32)
    got = R.to_fp8(v).astype(np.float32)
    want = np.array([1.0, 1.25, 2 ** -9, 0.0, 2 ** -8, 448, 448, -448, 0.0, np.nan], np.float32)
    np.testing.assert_array_equal(got, want)
    q, s = R.quant_token(np.zeros((2, 32), np.float32))
    assert (s == R.MIN_SCALE).all() and (R.fp8_bits(q) == 0).all()


def _token_rows(g, M, K):
    x = g.standard_normal((M, K)).astype(np.float32) * 2.0 ** g.uniform(-3, 3, (M, 1))
    x[1] = 0.0                                     # zero row: the floor, q == 0
    x[2] *= 1e-7                                   # amax / 448 below the floor: q = x / MIN_SCALE, small
    x[3, 5] = 3e4                                  # one outlier: it maps to 448, the rest shrink to subnormals
    x[4, :8] = [1.0, -1.0, 0.5, 448.0, 1.0625, 1.1875, -0.0, 2 ** -9]  # exact values, ties (amax 448: scale 1)
    x[4, 8:] = np.clip(x[4, 8:], -1, 1)
    return np.asarray(bf16(x).float().cpu())      # the bf16 values the kernel sees


@pytest.mark.parametrize("K", [1040, 96])
def test_quant_token_bit_exact(K):
    g = rng()
    M = 6
    x = _token_rows(g, M, K)
    xb, xt = bf16_out(M, K, pad=48)
    xt.copy_(bf16(x))
    buf, q = fp8_out(M, K)
    sbuf = torch.full((M + 3,), float("nan"), dtype=torch.float32, device=DEV)
    sp = SPECS["quant_token"]
    launch_spec(sp, (M,), xt, q, sbuf, K, xt.stride(0), q.stride(0))
    rq, rs = R.quant_token(x)
    np.testing.assert_array_equal(f32(sbuf[:M]), rs)
    np.testing.assert_array_equal(bits_of(q), R.fp8_bits(rq))
    assert np.isnan(f32(sbuf[M:])).all(), "wrote past the scales"
    assert (bits_of(buf[:, K:]) == NAN_BYTE).all(), "wrote past K"
    assert rs[1] == R.MIN_SCALE and rs[4] == 1.0
    assert R.from_bits(bits_of(q)[3, 5]) == 448.0
    assert (R.from_bits(bits_of(q)[2]) != 0).any()  # tiny row: not flushed to zero under the floor


def test_quant_tensor_saturates():
    g = rng()
    M, K = 3, 2080  # three programs per row, a tail in the last
    x = np.asarray(bf16(g.standard_normal((M, K)).astype(np.float32) * 50).float().cpu())
    scale = np.float32(0.3)                        # |x| / 0.3 exceeds 448 often: saturation
    buf, q = fp8_out(M, K)
    s = torch.tensor([scale], dtype=torch.float32, device=DEV)
    sp = SPECS["quant_tensor"]
    launch_spec(sp, (M, triton.cdiv(K, sp.constexprs["BLOCK"])), bf16(x), q, s, K, K, q.stride(0))
    ref = R.quant_tensor(x, scale)
    np.testing.assert_array_equal(bits_of(q), R.fp8_bits(ref))
    assert (np.abs(R.from_bits(bits_of(q))) == 448).sum() > 10
    assert (bits_of(buf[:, K:]) == NAN_BYTE).all()


@pytest.mark.parametrize("M,K", [(4, 400), (6, 2064), (9, 512)])  # M % ROWS != 0: the last program's rows masked
def test_quant_group_bit_exact(M, K):
    g = rng()
    kb = R.group_cols(K)
    x = g.standard_normal((M, K)).astype(np.float32) * 2.0 ** g.uniform(-4, 4, (M, 1))
    x[0, 128:256] = 0.0                            # one zero group: the floor
    x[1, 130] = 5e3                                # an outlier shrinks only its own group
    x[2, -16:] *= 100                              # the partial last group has its own scale
    x = np.asarray(bf16(x).float().cpu())
    buf, q = fp8_out(M, K)
    sbuf = torch.full((M, kb + 5), float("nan"), dtype=torch.float32, device=DEV)
    sc = sbuf[:, :kb]
    sp = SPECS["quant_group"]
    grid = (triton.cdiv(M, sp.constexprs["ROWS"]), triton.cdiv(kb, sp.constexprs["GROUPS"]))
    launch_spec(sp, grid, bf16(x), q, sc, K, K, q.stride(0), sc.stride(0), M)
    rq, rs = R.quant_group(x)
    np.testing.assert_array_equal(f32(sc), rs)
    np.testing.assert_array_equal(bits_of(q), R.fp8_bits(rq))
    assert np.isnan(f32(sbuf[:, kb:])).all() and (bits_of(buf[:, K:]) == NAN_BYTE).all()
    assert rs[0, 1] == R.MIN_SCALE and rs[1, 1] > 10 * rs[1, 0]


def _check(out, ref, tol=1.2e-2):
    o = np64(out)
    assert np.isfinite(o).all(), f"{np.count_nonzero(~np.isfinite(o))} non-finite outputs (unwritten?)"
    err = rel_err(o, ref)
    assert err < tol, f"rel err {err:.3e}"


def _scaled_case(g, M, N, K, mode):
    a, w = R.random_fp8(g, (M, K)), R.random_fp8(g, (N, K))
    if mode == "tensor":
        sa, sw = np.float32([0.37]), np.float32([1.9])
        return a, w, sa, sw, torch.tensor(sa), torch.tensor(sw), 0, 0
    sa = (2.0 ** g.uniform(-6, 2, M)).astype(np.float32)
    sw = (2.0 ** g.uniform(-3, 3, N)).astype(np.float32)
    step = 1 if mode == "channel" else 3
    ta = torch.full((M * step,), float("nan"))
    tw = torch.full((N * step,), float("nan"))
    ta[::step], tw[::step] = torch.from_numpy(sa), torch.from_numpy(sw)
    return a, w, sa, sw, ta, tw, step, step


@pytest.mark.parametrize("name", SCALED)
@pytest.mark.parametrize("mode", ["tensor", "channel", "strided"])
def test_scaled_every_spec(name, mode):
    """M, N below the tile (rows wrap), K tail (176 = 128 + 48), scales broadcast / per row / strided."""
    g = rng()
    M, N, K = 37, 48, 176
    a, w, sa, sw, ta, tw, sta, stw = _scaled_case(g, M, N, K, mode)
    buf, out = bf16_out(M, N)
    c = SPECS[name].constexprs
    grid = triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"])
    launch_spec(SPECS[name], (grid,), fp8(a), fp8(w), out, ta.to(DEV), tw.to(DEV), M, N, K, K, K, out.stride(0),
                sta, stw)
    _check(out, R.gemm_scaled(a, sa, w, sw))
    assert torch.isnan(buf[:, N:]).all()


def test_scaled_grouped_raster_small_tiles():
    """Several tile rows and columns under GROUP_M = 2 (a partial last group), strided operands."""
    g = rng()
    M, N, K = 75, 56, 272
    a, w, sa, sw, ta, tw, sta, stw = _scaled_case(g, M, N, K, "channel")
    ab = np.zeros((M, K + 32), np.uint8)
    ab[:, :K] = a
    at = fp8(ab)[:, :K]
    buf, out = bf16_out(M, N)
    grid = triton.cdiv(M, 16) * triton.cdiv(N, 16)
    launch_spec(SPECS["scaled.t64x128"], (grid,), at, fp8(w), out, ta, tw, M, N, K, at.stride(0), K,
                out.stride(0), sta, stw, BLOCK_M=16, BLOCK_N=16, GROUP_M=2)
    _check(out, R.gemm_scaled(a, sa, w, sw))
    assert torch.isnan(buf[:, N:]).all()


def _block_case(g, M, N, K, spread=4.0):
    a, w = R.random_fp8(g, (M, K)), R.random_fp8(g, (N, K))
    kb, nb = R.group_cols(K), R.group_cols(N)
    sa = (2.0 ** g.uniform(-spread - 1, spread - 1, (M, kb))).astype(np.float32)
    sw = (2.0 ** g.uniform(-spread, spread, (nb, kb))).astype(np.float32)
    return a, w, sa, sw


@pytest.mark.parametrize("name", BLOCK)
def test_block_every_spec(name):
    """N = 200 (two weight-scale rows, the second partial), K = 400 (four k-blocks, the last 16 wide); strided
    activation scales (row stride > cdiv(K, 128))."""
    g = rng()
    M, N, K = 37, 200, 400
    a, w, sa, sw = _block_case(g, M, N, K, spread=1.0)  # every block contributes: the mutations below show
    kb = sa.shape[1]
    sab = torch.full((M, kb + 3), float("nan"))
    sab[:, :kb] = torch.from_numpy(sa)
    sat = sab[:, :kb]
    buf, out = bf16_out(M, N)
    c = SPECS[name].constexprs
    grid = triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"])
    launch_spec(SPECS[name], (grid,), fp8(a), fp8(w), out, sat, torch.from_numpy(sw), M, N, K, K, K,
                out.stride(0), sat.stride(0), kb)
    ref = R.gemm_block(a, sa, w, sw)
    _check(out, ref)
    assert torch.isnan(buf[:, N:]).all()
    # the scales are applied per block: the reference with one full weight block's scale changed, or one
    # k-block's activation scales, is far from the output
    err = rel_err(np64(out), ref)
    sw2 = sw.copy()
    sw2[0, 1] *= 4
    sa2 = sa.copy()
    sa2[:, 2] *= 4
    assert rel_err(np64(out), R.gemm_block(a, sa, w, sw2)) > 10 * err
    assert rel_err(np64(out), R.gemm_block(a, sa2, w, sw)) > 10 * err


def test_block_narrow_tiles_several_programs():
    """A 64-wide N tile (half a weight-scale block) and 16-row M tiles: scale rows picked per column."""
    g = rng()
    M, N, K = 40, 328, 256
    a, w, sa, sw = _block_case(g, M, N, K)
    buf, out = bf16_out(M, N)
    grid = triton.cdiv(M, 16) * triton.cdiv(N, 64)
    launch_spec(SPECS["block.t64x128"], (grid,), fp8(a), fp8(w), out, torch.from_numpy(sa), torch.from_numpy(sw),
                M, N, K, K, K, out.stride(0), sa.shape[1], sw.shape[1], BLOCK_M=16, BLOCK_N=64, GROUP_M=2)
    _check(out, R.gemm_block(a, sa, w, sw))
    assert torch.isnan(buf[:, N:]).all()
