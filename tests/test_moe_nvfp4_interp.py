"""CPU tests of the NVFP4 (W4A16) expert kernels (kernels_src/moe/nvfp4.py) through vkc_runtime.ops.moe --
decode_gate_up / decode_down / grouped_gemm / sparse_moe_block with :class:`Nvfp4Experts` -- run by Triton's
interpreter on the sm_90a specs with the integer decoder (PRMT=False; the compiled kernels' packed-word decoder is
the gemv family's, checked instruction by instruction in tests/test_gemv_prmt_emulation.py and on the GPU), every
load and store checked against the tensors the test handed the op (tests/test_bounds_interp.py's checker; views
into sentinel-filled buffers, outputs poisoned).

Against float64 numpy of the dequantized weights (tests/refs_nvfp4.py) on fresh random codes and scale bytes
(zero, negative and subnormal scales among them), a different global multiplier per expert and per gate / up half
(a wrong alpha column fails), adversarial ids, K tails against BLOCK_K, H tails against BLOCK_N, strided rows;
the whole block on both paths vs the float64 block; the host checks of the new operand."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import bounds_cases as B, refs_moe as R, refs_nvfp4 as F  # noqa: E402
from tests.kernel_testing import interpreter_active  # noqa: E402
from tests.test_bounds_interp import Cai  # noqa: E402
from tests.test_moe_decode_interp import ref_h, rel, routing  # noqa: E402
from tests.test_moe_grouped_interp import align_np  # noqa: E402
from tests.test_moe_interp import Registry, bf16, np64, workspace  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter (TRITON_INTERPRET=1)")


def moe_env(monkeypatch, constexprs: dict):
    """(ops.moe, its kernel registry, a sentinel arena): the moe ops' kernels in the interpreter with ``constexprs``
    replacing the specs' (the decoder choices), the grouped GEMMs' SM count pinned to the H200's."""
    from tests.ops_fakes import patch_ops
    from vkc_runtime.ops import moe
    from vkc_runtime.ops.moe import grouped_ops
    reg = Registry(constexprs)
    patch_ops(monkeypatch, moe, "get_kernel", reg)
    monkeypatch.setattr(grouped_ops, "_sm_count", lambda dev: 132)
    grouped_ops._calls.clear()
    B.ACTIVE.clear()
    return moe, reg, B.Arena(0, "cpu")


def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


@pytest.fixture()
def M_(monkeypatch):
    env = moe_env(monkeypatch, {"PRMT": False})
    yield env
    env[2].check()
    B.ACTIVE.clear()


def experts(rng, E, R_, K, n_alpha):
    """Random NVFP4 experts: (codes [E, R, K/2] u8, scales [E, R, K/16] u8, alpha [E, n_alpha] f32) and the float64
    weights [E, R, K] they stand for. Scale bytes: magnitudes 2^-6 .. 2^1 with random signs, a few zero and
    subnormal ones; alpha differs per expert, and the up half's is 4x the gate half's (a swap shows)."""
    codes = rng.integers(0, 256, (E, R_, K // 2), dtype=np.uint8)
    sc = (rng.integers(0x08, 0x40, (E, R_, K // 16)) | (rng.integers(0, 2, (E, R_, K // 16)) << 7)).astype(np.uint8)
    flat = sc.reshape(-1)
    idx = rng.choice(flat.size, size=max(2, flat.size // 50), replace=False)
    flat[idx[0::2]] = 0x00                               # zero scales
    flat[idx[1::2]] = rng.integers(1, 8, idx[1::2].size)  # subnormals
    alpha = (rng.uniform(0.05, 0.12, (E, n_alpha)) * (1 + 3 * np.arange(n_alpha))).astype(np.float32)
    W = np.stack([F.dequant(codes[e], sc[e], 1.0) for e in range(E)])
    half = R_ // n_alpha
    for j in range(n_alpha):
        W[:, j * half:(j + 1) * half] *= alpha[:, j].astype(np.float64)[:, None, None]
    return (codes, sc, alpha), W


def put_experts(moe, ar, parts, layout="linear"):
    """The experts on the arena as ``Nvfp4Experts`` or, layout "mma", as ``Nvfp4MmaExperts`` (the experts' rows
    stacked and packed by ops.nvfp4.pack_host, as pack_experts packs them on the device)."""
    from vkc_runtime.ops.nvfp4 import pack_host
    codes, sc, alpha = parts
    put = lambda t: Cai(ar.put(torch.from_numpy(np.ascontiguousarray(t))))  # noqa: E731
    if layout == "linear":
        return moe.Nvfp4Experts(put(codes), put(sc), put(alpha))
    E, R_, Kh = codes.shape
    words, scales = pack_host(codes.reshape(E * R_, Kh), sc.reshape(E * R_, -1))
    return moe.Nvfp4MmaExperts(put(words.reshape(E, R_ // 16, *words.shape[1:])),
                               put(scales.reshape(E, R_ // 16, *scales.shape[1:])), put(alpha), R_, 2 * Kh)


@pytest.mark.parametrize("tile", [(8, 512), (4, 512), (8, 256)])
@pytest.mark.parametrize("M,k,Ep,H,I,n_bad", [(1, 3, 6, 64, 32, 1), (2, 3, 7, 544, 48, 2)])
def test_gate_up_nvfp4_vs_float64(M_, tile, M, k, Ep, H, I, n_bad):
    """H = 544 > BLOCK_K (a partial last step, the prefetched next step partial then empty); x rows strided; bad
    ids give zero rows; either alpha column used for both halves would be far off (checked)."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops as D
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    ids = routing(rng, M, k, Ep, n_bad)
    parts, W1 = experts(rng, Ep, 2 * I, H, 2)
    x = ar.put(bf16(g, M, H + 32))[:, 16:16 + H]
    out = ar.poison((M * k, I), torch.bfloat16)
    D.decode_gate_up(Cai(x), put_experts(moe, ar, parts), Cai(ar.put(B.i32(ids.tolist()))), out=Cai(out),
                     _tile=tile)
    ar.check()
    assert reg.launched == [f"moe.w4a16.decode.gate_up.n{tile[0]}.k{tile[1]}"]
    ref = ref_h(np64(x), W1, ids, I)
    got = np64(out)
    bad = ~((ids >= 0) & (ids < Ep)).reshape(-1)
    assert (got[bad] == 0).all(), "an invalid id's h row is not zero"
    assert np.isfinite(got).all()
    assert rel(got[~bad], ref[~bad]) < 1e-2
    a = parts[2].astype(np.float64)
    for col in (0, 1):  # one alpha column used for both halves: far from the result (each column matters)
        W1s = np.concatenate([W1[:, :I] * (a[:, col] / a[:, 0])[:, None, None],
                              W1[:, I:] * (a[:, col] / a[:, 1])[:, None, None]], axis=1)
        assert rel(ref_h(np64(x), W1s, ids, I)[~bad], ref[~bad]) > 0.2, "the test cannot tell the alpha columns apart"


@pytest.mark.parametrize("tile", [(4, 64, 9), (4, 128, 16), (4, 64, 16), (2, 128, 16)])
@pytest.mark.parametrize("M,k,Ep,H,I,n_bad", [(1, 9, 12, 44, 160, 2), (2, 16, 20, 20, 64, 3), (3, 5, 7, 36, 96, 1)])
def test_down_nvfp4_vs_float64(M_, tile, M, k, Ep, H, I, n_bad):
    """k' = 9 (the 9-slot tile's 8 + 1 both live), 16 (every slot of a 16-slot tile live; more than a 9-slot tile
    holds: refused) or 5 (the 9-slot tile's second group empty); H tails against BLOCK_N, out rows strided; I = 160
    (a partial K step); h rows and routing weights of bad ids are NaN and must not matter; alpha per expert."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops as D
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    ids = routing(rng, M, k, Ep, n_bad)
    bad = ~((ids >= 0) & (ids < Ep))
    hh = bf16(g, M * k, I)
    hh[torch.from_numpy(bad.reshape(-1))] = float("nan")
    wts = torch.rand(M, k, generator=g) + 0.1
    wts[torch.from_numpy(bad)] = float("nan")
    parts, W2 = experts(rng, Ep, H, I, 1)
    ob = ar.poison((M, -(-H // 16) * 16 + 16), torch.bfloat16)
    out = ob[:, :H]
    before = ob.clone()
    args = (Cai(ar.put(hh)), put_experts(moe, ar, parts), Cai(ar.put(B.i32(ids.tolist()))), Cai(ar.put(wts)))
    if tile[2] < k:
        with pytest.raises(moe.OpError, match="fewer than"):
            D.decode_down(*args, out=Cai(out), _tile=tile)
        assert reg.launched == [] and B.same_bytes(ob, before)
        return
    D.decode_down(*args, out=Cai(out), _tile=tile)
    ar.check()
    assert B.same_bytes(ob[:, H:], before[:, H:]), "bytes past H of an out row were written"
    assert reg.launched == [f"moe.w4a16.decode.down.n{tile[0]}.k{tile[1]}.s{tile[2]}"]
    Hd, Wt = np64(hh), wts.double().numpy()
    ref = R.pairs_down(Hd, W2, ids, Wt)
    got = np64(out)
    assert np.isfinite(got).all()
    assert rel(got, ref) < 1e-2


@pytest.mark.parametrize("layout", ["linear", "mma"])
@pytest.mark.parametrize("act", [None, "silu_mul"])
@pytest.mark.parametrize("block_m", [16, 64])
def test_grouped_nvfp4_vs_float64(M_, act, block_m, layout):
    """The grouped W4A16 GEMM over a numpy align of random ids (bad ones dropped): selected rows vs float64,
    unselected rows keep their poisoned bytes; K = 96 (a partial K step of 64; in the MMA layout a k block half
    padding), N = 48 (< BLOCK_N; 3 row blocks of 16 an expert in the MMA layout)."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import grouped_ops as G
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    M, k, E, K, N = 6, 3, 5, 96, 48
    ids = routing(rng, M, k, E, 2)
    P = M * k
    R_ = 2 * N if act else N
    parts, W = experts(rng, E, R_, K, 2 if act else 1)
    div = k if act else 1
    a = ar.put(bf16(g, -(-P // div), K))
    sid, bex, npad = align_np(ids, E, block_m, rng)
    out = ar.poison((P, N), torch.bfloat16)
    before = out.clone()
    G.grouped_gemm(Cai(a), put_experts(moe, ar, parts, layout), Cai(ar.put(torch.from_numpy(sid))),
                   Cai(ar.put(torch.from_numpy(bex))), Cai(ar.put(B.i32([npad]))), a_row_div=div, out=Cai(out),
                   block_m=block_m, act=act)
    ar.check()
    assert reg.launched[-1].startswith(f"moe.w4a16.{'mma.' if layout == 'mma' else ''}grouped.m{block_m}.")
    A = np64(a)
    got = np64(out)
    flat = ids.reshape(-1)
    for f in range(P):
        e = flat[f]
        if not 0 <= e < E:
            assert B.same_bytes(out[f], before[f]), f"row {f} of a dropped pair was written"
            continue
        y = W[e] @ A[f // div]
        if act:
            y = R.silu(y[:N]) * y[N:]
        assert rel(got[f], y) < 1e-2, f


@pytest.mark.parametrize("path,layout", [("decode", "linear"), ("grouped", "linear"), ("grouped", "mma")])
@pytest.mark.parametrize("M,E,k,H,I", [(1, 16, 4, 128, 64), (3, 8, 2, 64, 32)])
def test_block_nvfp4_vs_float64(M_, path, layout, M, E, k, H, I):
    """sparse_moe_block with NVFP4 experts (the shared expert stacked as expert E) on both paths vs the float64
    block of the dequantized weights; the MMA layout's decode kernels are Gluon (no interpreter: GPU tests)."""
    moe, reg, ar = M_
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    Ep = E + 1
    x, gw, sg = bf16(g, M, H), bf16(g, E, H, scale=0.3), bf16(g, 1, H, scale=0.2)
    p1, W1 = experts(rng, Ep, 2 * I, H, 2)
    p2, W2 = experts(rng, Ep, H, I, 1)
    ws = workspace(moe, ar, M, E, k, H, I, True)
    out = ar.poison((M, H), torch.bfloat16)
    moe.sparse_moe_block(Cai(ar.put(x)), Cai(ar.put(gw)), put_experts(moe, ar, p1, layout),
                         put_experts(moe, ar, p2, layout), k,
                         renormalize=True, shared_gate_w=Cai(ar.put(sg)), workspace=ws, out=Cai(out), path=path)
    ar.check()
    assert any(".w4a16." in b for b in reg.launched) and not any(b.startswith("moe.decode.") or
                                                                  b.startswith("moe.grouped.") for b in reg.launched)
    ref = R.block(np64(x), np64(gw), W1, W2, k, True, np64(sg))
    got = np64(out)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())


def test_nvfp4_experts_refused_before_launch(M_):
    """Wrong code / scale dtypes, K not a multiple of 32, alpha of the wrong shape, bf16 w1 with NVFP4 w2: an
    OpError naming the operand, nothing launched."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops as D
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    x = Cai(ar.put(bf16(g, 1, 64)))
    ids = Cai(ar.put(B.i32([[0, 1]])))
    h = Cai(ar.poison((2, 32), torch.bfloat16))
    (c, s, a), _ = experts(rng, 3, 64, 64, 2)
    put = lambda t: Cai(ar.put(torch.from_numpy(np.ascontiguousarray(t))))  # noqa: E731
    cases = [
        (moe.Nvfp4Experts(put(c.view(np.int8)), put(s), put(a)), "w1.codes"),
        (moe.Nvfp4Experts(put(c), put(s.astype(np.int32)), put(a)), "w1.scales"),
        (moe.Nvfp4Experts(put(c), put(s), put(a[:, :1])), "w1.alpha"),
        (moe.Nvfp4Experts(put(c), put(s), put(a.astype(np.float64))), "w1.alpha"),
        (moe.Nvfp4Experts(put(c), put(s[:, :, :2]), put(a)), "w1.scales"),
    ]
    for w, what in cases:
        with pytest.raises(moe.OpError, match=what.replace(".", r"\.")):
            D.decode_gate_up(x, w, ids, out=h)
    (c2, s2, a2), _ = experts(rng, 3, 64, 48, 2)  # K = 48: not a multiple of 32
    x48 = Cai(ar.put(bf16(g, 1, 48)))
    with pytest.raises(moe.OpError, match="multiple of 32"):
        D.decode_gate_up(x48, moe.Nvfp4Experts(put(c2), put(s2), put(a2)), ids, out=h)
    ws = workspace(moe, ar, 1, 2, 2, 64, 32, False)
    with pytest.raises(moe.OpError, match="both"):
        moe.sparse_moe_block(x, Cai(ar.put(bf16(g, 2, 64))), Cai(ar.put(bf16(g, 2, 64, 64))),
                             moe.Nvfp4Experts(put(c[:2, :64, :16]), put(s[:2, :64, :2]), put(a[:2, :1])), 2,
                             renormalize=True, workspace=ws, out=Cai(ar.poison((1, 64), torch.bfloat16)))
    assert reg.launched == []


def test_nvfp4_mma_experts_refused_before_launch(M_):
    """MMA-layout experts: words of the wrong dtype or shape, rows / k not multiples of 16, rows or K that do not
    match the call, alpha of the wrong shape, scales of another layout: an OpError naming the operand, nothing
    launched."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops as D
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    x = Cai(ar.put(bf16(g, 1, 64)))
    ids = Cai(ar.put(B.i32([[0, 1]])))
    h = Cai(ar.poison((2, 32), torch.bfloat16))
    put = lambda t: Cai(ar.put(torch.from_numpy(np.ascontiguousarray(t))))  # noqa: E731
    wshape, sshape = moe.nvfp4_mma_shapes(3, 64, 64)
    w = rng.integers(-2**31, 2**31, wshape, dtype=np.int64).astype(np.int32)
    sc = rng.integers(-2**31, 2**31, sshape, dtype=np.int64).astype(np.int32)
    a = np.ones((3, 2), np.float32)
    cases = [
        (moe.Nvfp4MmaExperts(put(w.view(np.float32)), put(sc), put(a), 64, 64), "w1.words"),
        (moe.Nvfp4MmaExperts(put(w[:, :2]), put(sc), put(a), 64, 64), "w1.words"),
        (moe.Nvfp4MmaExperts(put(w), put(sc[:, :2]), put(a), 64, 64), "w1.scales"),
        (moe.Nvfp4MmaExperts(put(w), put(sc), put(a[:, :1]), 64, 64), "w1.alpha"),
        (moe.Nvfp4MmaExperts(put(w), put(sc), put(a), 56, 64), "w1.rows"),
        (moe.Nvfp4MmaExperts(put(w), put(sc), put(a), 64, 48), "w1 holds experts of"),
        (moe.Nvfp4Experts(put(w), put(sc), put(a)), "w1.codes"),
    ]
    for wt, what in cases:
        with pytest.raises(moe.OpError, match=what.replace(".", r"\.")):
            D.decode_gate_up(x, wt, ids, out=h)
    assert reg.launched == []
