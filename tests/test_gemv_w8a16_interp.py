"""CPU tests of the block-wise FP8 GEMV (kernels_src/gemv/gemv.py gemv_w8a16_kernel: e4m3 weights with one fp32
multiplier per 128 x 128 block, bf16 activations) through Triton's interpreter, against float64 products of the
weights decoded by ml_dtypes, on fresh random data.

Every compiled specialization with tails in N (two scale rows), K (a last scale block of 16) and M; strided x and
out into poisoned padding that must stay untouched; split-K through a poisoned workspace and the reduce; every
one of the 256 e4m3 codes exact (the two NaN codes decode as +-480, as the kernel documents); scales that differ
by powers of two per block, so a scale taken from the wrong block (row / column swapped, off by one) fails."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
ml_dtypes = pytest.importorskip("ml_dtypes")

from tests.kernel_testing import device, launch_spec, np64, specs  # noqa: E402
from tests.refs import rel_err  # noqa: E402

DEV = device()
SPECS = specs("gemv")
W8_SPECS = sorted(n for n in SPECS if n.startswith("w8a16."))


def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


def decode(codes: np.ndarray) -> np.ndarray:
    """e4m3fn bytes -> float64 (ml_dtypes), the NaN codes as the kernel decodes them (+-480)."""
    v = codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return np.where((codes & 0x7F) == 0x7F, np.where(codes & 0x80, -480.0, 480.0), v)


def finite_codes(rng, *shape):
    c = rng.integers(0, 256, size=shape, dtype=np.uint8)
    return np.where((c & 0x7F) == 0x7F, c ^ 0x01, c).astype(np.uint8)  # no NaN codes in random weights


def run(name, x, codes, scales, y, split_tiles=None, arch=None):
    """Launch one w8a16 spec (``arch``: with that arch's overrides, e.g. the M = 1 kernel's integer decoder on
    sm_80): x [M, K] bf16, codes [N, K] uint8, scales [cdiv(N,128), cdiv(K,128)] fp32 -> y."""
    c = SPECS[name].constexprs
    bn, bk = c["BLOCK_N"], c["BLOCK_K"]
    M, K = x.shape
    N = codes.shape[0]
    kt = triton.cdiv(K, bk)
    per = kt if split_tiles is None else split_tiles
    split = triton.cdiv(kt, per)
    ws = torch.full((split * M * N,), float("nan"), dtype=torch.float32, device=DEV)
    launch_spec(SPECS[name], (triton.cdiv(N, bn), split), x, codes, scales, y, ws, M, N, K, x.stride(0),
                codes.stride(0), scales.stride(0), y.stride(0), per * bk, arch=arch)
    if split > 1:
        r = SPECS["splitk_reduce"]
        launch_spec(r, (triton.cdiv(N, r.constexprs["BLOCK"]), M), ws, y, M, N, y.stride(0), split)
    return split


def case(rng, g, M, N, K, scale_spread=4.0):
    x = (torch.randn(M, K, generator=g)).to(torch.bfloat16)
    codes = finite_codes(rng, N, K)
    sc = np.exp2(rng.uniform(-scale_spread, scale_spread, size=(-(-N // 128), -(-K // 128)))) * 1e-2
    return x, codes, sc.astype(np.float32)


def reference(x, codes, sc):
    N, K = codes.shape
    s_full = np.repeat(np.repeat(sc.astype(np.float64), 128, 0)[:N], 128, 1)[:, :K]
    return np64(x) @ (decode(codes) * s_full).T


def strided(M, N, pad=16):
    yb = torch.full((M, N + pad), float("nan"), dtype=torch.bfloat16, device=DEV)
    return yb, yb[:, :N]


@pytest.mark.parametrize("name", W8_SPECS)
def test_every_spec_with_tails(name):
    """N = 200 (two scale rows, a tail in each tile size), K = 400 (a last scale block of 16), M below the bucket,
    x and out strided; the padding of out stays NaN."""
    seed = _seed()
    rng, g = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    bm = SPECS[name].constexprs["BLOCK_M"]
    M, N, K = max(1, bm - 3), 200, 400
    x, codes, sc = case(rng, g, M, N, K)
    xb = torch.zeros(M, K + 32, dtype=torch.bfloat16)
    xb[:, :K] = x
    yb, y = strided(M, N)
    run(name, xb[:, :K].to(DEV), torch.from_numpy(codes).to(DEV), torch.from_numpy(sc).to(DEV), y)
    err = rel_err(np64(y), reference(x, codes, sc))
    assert err < 1e-2, f"{name} seed {seed}: rel err {err:.3e}"
    assert torch.isnan(yb[:, N:]).all(), "wrote past out's columns"


@pytest.mark.parametrize("name,M,split_tiles", [("w8a16.m16.n64.k128", 1, 1), ("w8a16.m32.n16.k128", 20, 2),
                                                 ("w8a16.m64.n64.k128", 64, 3)])
def test_split_k(name, M, split_tiles):
    """K = 1040: 9 K tiles (the last one of 16) split 9 / 5 / 3 ways; partials through a NaN-poisoned workspace."""
    seed = _seed()
    rng, g = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    N, K = 136, 1040
    x, codes, sc = case(rng, g, M, N, K)
    y = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    split = run(name, x.to(DEV), torch.from_numpy(codes).to(DEV), torch.from_numpy(sc).to(DEV), y, split_tiles)
    assert split == -(-9 // split_tiles) > 1
    err = rel_err(np64(y), reference(x, codes, sc))
    assert err < 1e-2, f"{name} seed {seed}: rel err {err:.3e}"


@pytest.mark.parametrize("name", ["w8a16.m16.n16.k128", "w8a16.m16.n64.k128"])
def test_all_codes_exact(name):
    """W[n, k_m] = code 16 n + m (all 256 codes over 16 x 16 entries) and one-hot x rows selecting k_m: y[m, n]
    is the decoded code times the block's power-of-two scale, exactly (a code has <= 4 significant bits)."""
    N, K, M = 16, 256, 16
    ks = np.arange(M) * 16 + 5
    codes = np.zeros((N, K), np.uint8)
    for n in range(N):
        codes[n, ks] = (16 * n + np.arange(M)).astype(np.uint8)
    sc = np.array([[2.0 ** -3, 2.0 ** 5]], np.float32)  # k_m >= 128 take the second block's scale
    x = torch.zeros(M, K, dtype=torch.bfloat16)
    x[np.arange(M), ks] = 1.0
    y = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    run(name, x.to(DEV), torch.from_numpy(codes).to(DEV), torch.from_numpy(sc).to(DEV), y)
    want = reference(x, codes, sc)
    got = np64(y)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} codes wrong, first (m, n) {tuple(bad[0])}: {got[tuple(bad[0])]} vs " \
                          f"{want[tuple(bad[0])]}"


def test_each_block_scale_lands_on_its_block():
    """N = 256, K = 384: six blocks with scales 2^0 .. 2^5; each output checked per block against the float64
    product (a scale from the wrong block is off by a power of two: far outside the tolerance)."""
    seed = _seed()
    rng, g = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    N, K, M = 256, 384, 4
    codes = finite_codes(rng, N, K)
    sc = np.exp2(np.arange(6, dtype=np.float32)).reshape(2, 3)
    for kb in range(3):  # x nonzero in one K block at a time: y then isolates that block column's scales
        x = torch.zeros(M, K, dtype=torch.bfloat16)
        x[:, 128 * kb:128 * (kb + 1)] = torch.randn(M, 128, generator=g).to(torch.bfloat16)
        y = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=DEV)
        run("w8a16.m16.n64.k128", x.to(DEV), torch.from_numpy(codes).to(DEV), torch.from_numpy(sc).to(DEV), y)
        ref = reference(x, codes, sc)
        for nb in range(2):
            rows = slice(128 * nb, 128 * (nb + 1))
            err = rel_err(np64(y)[:, rows], ref[:, rows])
            assert err < 1e-2, f"block ({nb}, {kb}) seed {seed}: rel err {err:.3e}"


M1_SPECS = [n for n in W8_SPECS if ".m1." in n]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])  # the hardware e4m3 conversion / the integer decoder
@pytest.mark.parametrize("name", M1_SPECS)
def test_m1_kernel_codes_blocks_and_split(name, arch):
    """The CUDA-core M = 1 kernel, both decoders: every finite code exact (one-hot x picks one column per
    launch, 16 codes per column), each 128 x 128 block's scale on its block (scales 2^0 .. 2^5: a wrong block is
    off by a power of two), and split-K with a K tail through a NaN-poisoned workspace; N and K tails masked,
    the padding past N untouched."""
    assert SPECS[name].for_arch(arch).constexprs["NATIVE"] == (arch != "sm_80")
    N, K = 256, 384
    codes = np.zeros((N, K), np.uint8)
    cols = (5, 200, 383)  # one K position per scale column block
    for j, k in enumerate(cols):
        codes[:, k] = ((np.arange(N) + 85 * j) % 256).astype(np.uint8)
    codes = np.where((codes & 0x7F) == 0x7F, codes ^ 0x01, codes).astype(np.uint8)
    sc = np.exp2(np.arange(6, dtype=np.float32)).reshape(2, 3)
    for k in cols:
        x = torch.zeros(1, K, dtype=torch.bfloat16)
        x[0, k] = 1.0
        yb, y = strided(1, N)
        run(name, x.to(DEV), torch.from_numpy(codes).to(DEV), torch.from_numpy(sc).to(DEV), y, arch=arch)
        want = reference(x, codes, sc)
        bad = np.argwhere(np64(y) != want)
        assert bad.size == 0, f"k={k}: {len(bad)} wrong, first {tuple(bad[0])}: {np64(y)[tuple(bad[0])]} vs " \
                              f"{want[tuple(bad[0])]}"
        assert torch.isnan(yb[:, N:].float()).all(), "wrote past N"
    seed = _seed()
    rng, g = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    bk = SPECS[name].constexprs["BLOCK_K"]
    N, K = 136, 2 * bk + 144  # 3 K tiles, the last one partial
    x, codes, sc = case(rng, g, 1, N, K)
    y = torch.full((1, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    split = run(name, x.to(DEV), torch.from_numpy(codes).to(DEV), torch.from_numpy(sc).to(DEV), y, 1, arch=arch)
    assert split == 3
    err = rel_err(np64(y), reference(x, codes, sc))
    assert err < 1e-2, f"{name} {arch} seed {seed}: rel err {err:.3e}"
