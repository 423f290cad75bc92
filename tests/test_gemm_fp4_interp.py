"""CPU tests of kernels_src/gemm_fp4 (the NVFP4 W4A4 GEMM and the bf16 -> NVFP4 activation quantizer) through
Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1; tests/interp_fixes.py items 4 and 7 make its e4m3
cast and its dot_scaled e4m3 scales behave like the GPU), against numpy references (tests/refs_nvfp4.py).

Quantizer: the e2m1 rounding at every midpoint of the grid (hand-written codes, not the reference's), bit-exact
codes and scale bytes on rows with zero groups, scales that underflow to 0 and saturate at 448, K tails inside a
program and rows past M in the last program, poisoned padding that must stay untouched. GEMM: every compiled tile
with M and N below and past the tile, a K tail (a half slice), strided rows, scales whose every entry matters,
alpha read from the device, small tiles over several tile rows and columns (grouped rasterization).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
pytest.importorskip("ml_dtypes")

from tests import refs_nvfp4 as R  # noqa: E402
from tests.kernel_testing import bf16, bf16_out, device, launch_spec, np64, rng, specs  # noqa: E402
from tests.refs import rel_err  # noqa: E402

DEV = device()
SPECS = specs("gemm_fp4")
GEMMS = sorted(n for n in SPECS if n.startswith("w4a4."))
POISON = 0x7F  # e4m3 NaN, and an e2m1 pair (+6 high, -6... any code): bytes the kernels must not write


def u8(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.uint8)).to(DEV)


def e4m3(a) -> torch.Tensor:
    return u8(a).view(torch.float8_e4m3fn)


def bytes_of(t) -> np.ndarray:
    return t.cpu().contiguous().view(torch.uint8).numpy()


def f32(v) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.float32, device=DEV)


def quant(x: np.ndarray, gs: float, pad=16):
    """Run the quantizer on bf16(x) [M, K] into poisoned padded buffers; returns (packed, scales, their buffers)."""
    M, K = x.shape
    qb = torch.full((M, K // 2 + pad), POISON, dtype=torch.uint8, device=DEV)
    sb = torch.full((M, K // 16 + pad), POISON, dtype=torch.uint8, device=DEV)
    q, s = qb[:, :K // 2], sb[:, :K // 16].view(torch.float8_e4m3fn)
    xt = bf16(x)
    sp = SPECS["quant"]
    grid = (triton.cdiv(M, sp.constexprs["ROWS"]), triton.cdiv(K // 16, sp.constexprs["GROUPS"]))
    launch_spec(sp, grid, xt, f32(gs), q, s, M, K, xt.stride(0), qb.stride(0), sb.stride(0))
    return bytes_of(q), bytes_of(s), qb, sb


def test_e2m1_rounding_at_every_midpoint():
    """gs = 1 and a group whose amax is 6: its scale is 1.0 and the codes are the e2m1 rounding of the values."""
    vals = [0.25, 0.26, 0.75, 0.74, 1.25, 1.26, 1.75, 2.5, 2.6, 3.5, 3.4, 5.0, 5.1, 6.0, -0.25, -5.0]
    want = [0, 1, 2, 1, 2, 3, 4, 4, 5, 6, 5, 6, 7, 7, 0, 8 + 6]  # ties to the even code; -0.25 -> +0
    x = np.array([vals], np.float32)
    x = np.asarray(bf16(x).float().cpu())           # every value above is exact in bf16
    q, s, _, _ = quant(x, 1.0)
    assert R.e4m3_decode(s)[0, 0] == 1.0
    np.testing.assert_array_equal(R.unpack(q)[0], want)
    np.testing.assert_array_equal(R.e2m1_code(x[0]), want)  # the reference agrees with the table


@pytest.mark.parametrize("M,K", [(5, 416), (4, 128), (9, 48)])  # 416 = 3 programs of 8 groups + 2 groups
def test_quant_bit_exact(M, K):
    g = rng()
    x = g.standard_normal((M, K)).astype(np.float32) * 2.0 ** g.uniform(-4, 4, (M, 1))
    x[0, :16] = 0.0                                  # a zero group: scale 0, codes 0
    x[1, 16:32] *= 1e-9                              # a scale below e4m3's smallest subnormal: 0
    x[min(2, M - 1), -16:] *= 1e4                    # saturates the last group's scale at 448
    x = np.asarray(bf16(x).float().cpu())
    gs = 448.0 * 6.0 / float(np.abs(x[:, :-16]).max())  # calibrated without the outlier group
    q, s, qb, sb = quant(x, gs)
    rq, rs = R.quant_act(x, gs)
    np.testing.assert_array_equal(s, rs)
    np.testing.assert_array_equal(q, rq)
    assert (bytes_of(qb)[:, K // 2:] == POISON).all() and (bytes_of(sb)[:, K // 16:] == POISON).all()
    d = R.e4m3_decode(s)
    assert d[0, 0] == 0 and (R.unpack(q)[0, :16] == 0).all()
    assert d[1, 1] == 0
    assert d[min(2, M - 1), -1] == 448.0
    # the dequantized values approximate x (gs is a divisor): codes * scale / gs. The bound is the format's, for
    # these inputs: over 3000 seeds the numpy reference's error had median 0.095 at every shape and max 0.12 / 0.18
    # / 0.34 at 5 x 416 / 4 x 128 / 9 x 48 (432 values, where one row of scale up to 2^4 dominates the norm); a gs
    # used as a multiplier or a scale off by a power of two lands far above it
    back = R.dequant(q, s, 1.0 / gs)
    ok = np.ones_like(x, bool)
    ok[min(2, M - 1), -16:] = False
    assert rel_err(back[ok], x[ok]) < 0.4


def _gemm_case(g, M, N, K):
    a, w = g.integers(0, 16, (M, K)), g.integers(0, 16, (N, K))
    sa = R.e4m3_encode(2.0 ** g.uniform(-6, 3, (M, K // 16)))
    sw = R.e4m3_encode(2.0 ** g.uniform(-4, 4, (N, K // 16)))
    return R.pack(a), sa, R.pack(w), sw


def _check(out, ref, tol=1e-2):
    o = np64(out)
    assert np.isfinite(o).all(), f"{np.count_nonzero(~np.isfinite(o))} non-finite outputs (unwritten?)"
    err = rel_err(o, ref)
    assert err < tol, f"rel err {err:.3e}"


@pytest.mark.parametrize("name", GEMMS)
def test_gemm_every_spec(name):
    """M, N below the tile (rows wrap), K = 160 (a slice and a quarter: the packed and scale masks), a with
    padded rows, alpha from the device."""
    g = rng()
    M, N, K = 37, 48, 160
    a, sa, w, sw = _gemm_case(g, M, N, K)
    ab = np.full((M, K // 2 + 16), POISON, np.uint8)
    ab[:, :K // 2] = a
    at = u8(ab)[:, :K // 2]
    sab = np.full((M, K // 16 + 3), POISON, np.uint8)
    sab[:, :K // 16] = sa
    sat = e4m3(sab)[:, :K // 16]
    buf, out = bf16_out(M, N)
    c = SPECS[name].constexprs
    grid = triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"])
    launch_spec(SPECS[name], (grid,), at, sat, u8(w), e4m3(sw), f32(0.37), out, M, N, K, at.stride(0),
                sat.stride(0), K // 2, K // 16, out.stride(0))
    _check(out, R.gemm_w4a4(a, sa, w, sw, 0.37))
    assert torch.isnan(buf[:, N:]).all()


def test_gemm_grouped_raster_small_tiles():
    """Several tile rows and columns under GROUP_M = 2 (a partial last group), two K slices."""
    g = rng()
    M, N, K = 75, 56, 256
    a, sa, w, sw = _gemm_case(g, M, N, K)
    buf, out = bf16_out(M, N)
    grid = triton.cdiv(M, 16) * triton.cdiv(N, 16)
    launch_spec(SPECS["w4a4.t64x128"], (grid,), u8(a), e4m3(sa), u8(w), e4m3(sw), f32(2.0), out, M, N, K, K // 2,
                K // 16, K // 2, K // 16, out.stride(0), BLOCK_M=16, BLOCK_N=16, GROUP_M=2)
    _check(out, R.gemm_w4a4(a, sa, w, sw, 2.0))
    assert torch.isnan(buf[:, N:]).all()


def test_every_scale_and_nibble_matters():
    """One weight scale and one high nibble changed: only the output entries they feed move."""
    g = rng()
    M, N, K = 16, 16, 128
    a, sa, w, sw = _gemm_case(g, M, N, K)
    outs = []
    for variant in range(3):
        w2, sw2 = w.copy(), sw.copy()
        if variant == 1:
            sw2[3, 5] = R.e4m3_encode(R.e4m3_decode(sw2[3, 5]) * 2.0)
        if variant == 2:
            w2[7, 10] ^= 0x30                          # k = 21's code (high nibble of byte 10)
        _, out = bf16_out(M, N)
        launch_spec(SPECS["w4a4.t64x128"], (1,), u8(a), e4m3(sa), u8(w2), e4m3(sw2), f32(1.0), out, M, N, K,
                    K // 2, K // 16, K // 2, K // 16, out.stride(0))
        _check(out, R.gemm_w4a4(a, sa, w2, sw2, 1.0))
        outs.append(np64(out))
    assert (outs[1][:, 3] != outs[0][:, 3]).any() and (np.delete(outs[1], 3, 1) == np.delete(outs[0], 3, 1)).all()
    assert (outs[2][:, 7] != outs[0][:, 7]).any() and (np.delete(outs[2], 7, 1) == np.delete(outs[0], 7, 1)).all()
