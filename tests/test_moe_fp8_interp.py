"""CPU tests of the block-wise FP8 (W8A16) expert kernels (kernels_src/moe/fp8.py) through vkc_runtime.ops.moe --
decode_gate_up / decode_down / grouped_gemm / sparse_moe_block with :class:`Fp8Experts` -- run by Triton's
interpreter on the sm_90a specs, with the integer e4m3 decoding (NATIVE=False, what sm_80 / sm_86 run) and with the
hardware conversion's semantics (NATIVE=True), every load and store checked against the tensors the test handed the
op (tests/test_bounds_interp.py's checker; views into sentinel-filled buffers, outputs poisoned).

Against float64 numpy of the dequantized weights (e4m3 * the 128 x 128 block scale) on fresh random finite e4m3
bytes (subnormals and zeros among them) and random scales (a different one per block: a wrong block index fails),
adversarial ids, K tails against BLOCK_K and the scale blocks, H tails against BLOCK_N, strided rows; the whole
block on both paths; the host checks of the new operand."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
ml_dtypes = pytest.importorskip("ml_dtypes")

from tests import bounds_cases as B, refs_moe as R  # noqa: E402
from tests.kernel_testing import interpreter_active  # noqa: E402
from tests.test_bounds_interp import Cai  # noqa: E402
from tests.test_moe_decode_interp import ref_h, rel, routing  # noqa: E402
from tests.test_moe_grouped_interp import align_np  # noqa: E402
from tests.test_moe_nvfp4_interp import moe_env  # noqa: E402
from tests.test_moe_interp import bf16, np64, workspace  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter (TRITON_INTERPRET=1)")

def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


@pytest.fixture(params=[False, True], ids=["int", "native"])
def M_(request, monkeypatch):
    env = moe_env(monkeypatch, {"NATIVE": request.param})
    yield env
    env[2].check()
    B.ACTIVE.clear()


def experts(rng, E, R_, K):
    """Random FP8 experts: (q [E, R, K] u8 finite e4m3, scale [E, cdiv(R, 128), cdiv(K, 128)] f32) and the float64
    weights they stand for."""
    q = rng.integers(0, 256, (E, R_, K), dtype=np.uint8)
    q[(q & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    sc = rng.uniform(0.002, 0.02, (E, -(-R_ // 128), -(-K // 128))).astype(np.float32)
    vals = q.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    full = np.repeat(np.repeat(sc.astype(np.float64), 128, axis=1), 128, axis=2)[:, :R_, :K]
    return (q, sc), vals * full


def put_experts(moe, ar, parts):
    q, sc = parts
    return moe.Fp8Experts(Cai(ar.put(torch.from_numpy(q))), Cai(ar.put(torch.from_numpy(sc))))


@pytest.mark.parametrize("tile", [(8, 256), (16, 256), (8, 512)])
def test_gate_up_fp8_vs_float64(M_, tile):
    """I = 128 (gate and up one scale block row each), H = 272 (three scale columns, a K tail); x rows strided."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops as D
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    M, k, Ep, H, I = 3, 4, 7, 272, 128
    ids = routing(rng, M, k, Ep, 3)
    parts, W1 = experts(rng, Ep, 2 * I, H)
    x = ar.put(bf16(g, M, H + 32))[:, 16:16 + H]
    out = ar.poison((M * k, I), torch.bfloat16)
    D.decode_gate_up(Cai(x), put_experts(moe, ar, parts), Cai(ar.put(B.i32(ids.tolist()))), out=Cai(out),
                     _tile=tile)
    ar.check()
    assert reg.launched == [f"moe.w8a16.decode.gate_up.n{tile[0]}.k{tile[1]}"]
    ref = ref_h(np64(x), W1, ids, I)
    got = np64(out)
    bad = ~((ids >= 0) & (ids < Ep)).reshape(-1)
    assert (got[bad] == 0).all()
    assert np.isfinite(got).all()
    assert rel(got[~bad], ref[~bad]) < 1e-2


@pytest.mark.parametrize("tile", [(4, 128, 9), (2, 128, 9), (4, 64, 16), (4, 128, 16), (2, 128, 16)])
def test_down_fp8_vs_float64(M_, tile):
    """k' = 9 (the s9 tile: 8 + 1 slots, both live); H = 44 (a tail against BLOCK_N, out rows strided); I = 160
    (two scale columns, a partial K step); bad ids' h rows and routing weights NaN."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops as D
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    M, k, Ep, H, I = 2, 9, 12, 44, 160
    ids = routing(rng, M, k, Ep, 2)
    bad = ~((ids >= 0) & (ids < Ep))
    hh = bf16(g, M * k, I)
    hh[torch.from_numpy(bad.reshape(-1))] = float("nan")
    wts = torch.rand(M, k, generator=g) + 0.1
    wts[torch.from_numpy(bad)] = float("nan")
    parts, W2 = experts(rng, Ep, H, I)
    ob = ar.poison((M, 64), torch.bfloat16)
    out = ob[:, :H]
    before = ob.clone()
    D.decode_down(Cai(ar.put(hh)), put_experts(moe, ar, parts), Cai(ar.put(B.i32(ids.tolist()))), Cai(ar.put(wts)),
                  out=Cai(out), _tile=tile)
    ar.check()
    assert B.same_bytes(ob[:, H:], before[:, H:])
    assert reg.launched == [f"moe.w8a16.decode.down.n{tile[0]}.k{tile[1]}.s{tile[2]}"]
    Hd, Wt = np64(hh), wts.double().numpy()
    ref = R.pairs_down(Hd, W2, ids, Wt)
    got = np64(out)
    assert np.isfinite(got).all()
    assert rel(got, ref) < 1e-2


@pytest.mark.parametrize("act", [None, "silu_mul"])
def test_grouped_fp8_vs_float64(M_, act):
    """block_m 16; K = 160 (a partial K step, two scale columns); N = 128 with silu_mul (gate and up one scale row
    each), 48 plain."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import grouped_ops as G
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    M, k, E, K = 6, 3, 5, 160
    N = 128 if act else 48
    ids = routing(rng, M, k, E, 2)
    P = M * k
    parts, W = experts(rng, E, 2 * N if act else N, K)
    div = k if act else 1
    a = ar.put(bf16(g, -(-P // div), K))
    sid, bex, npad = align_np(ids, E, 16, rng)
    out = ar.poison((P, N), torch.bfloat16)
    before = out.clone()
    G.grouped_gemm(Cai(a), put_experts(moe, ar, parts), Cai(ar.put(torch.from_numpy(sid))),
                   Cai(ar.put(torch.from_numpy(bex))), Cai(ar.put(B.i32([npad]))), a_row_div=div, out=Cai(out),
                   block_m=16, act=act)
    ar.check()
    assert reg.launched[-1].startswith("moe.w8a16.grouped.m16.")
    A, got, flat = np64(a), np64(out), ids.reshape(-1)
    for f in range(P):
        e = flat[f]
        if not 0 <= e < E:
            assert B.same_bytes(out[f], before[f])
            continue
        y = W[e] @ A[f // div]
        if act:
            y = R.silu(y[:N]) * y[N:]
        assert rel(got[f], y) < 1e-2, f


@pytest.mark.parametrize("path", ["decode", "grouped"])
def test_block_fp8_vs_float64(M_, path):
    moe, reg, ar = M_
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    M, E, k, H, I = 2, 8, 2, 128, 128
    x, gw, sg = bf16(g, M, H), bf16(g, E, H, scale=0.3), bf16(g, 1, H, scale=0.2)
    p1, W1 = experts(rng, E + 1, 2 * I, H)
    p2, W2 = experts(rng, E + 1, H, I)
    ws = workspace(moe, ar, M, E, k, H, I, True)
    out = ar.poison((M, H), torch.bfloat16)
    moe.sparse_moe_block(Cai(ar.put(x)), Cai(ar.put(gw)), put_experts(moe, ar, p1), put_experts(moe, ar, p2), k,
                         renormalize=True, shared_gate_w=Cai(ar.put(sg)), workspace=ws, out=Cai(out), path=path)
    ar.check()
    assert any(".w8a16." in b for b in reg.launched)
    assert not any(b.startswith(("moe.decode.", "moe.grouped.")) for b in reg.launched)
    ref = R.block(np64(x), np64(gw), W1, W2, k, True, np64(sg))
    got = np64(out)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())


def test_fp8_experts_refused_before_launch(M_):
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops as D
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    x = Cai(ar.put(bf16(g, 1, 128)))
    ids = Cai(ar.put(B.i32([[0, 1]])))
    (q, sc), _ = experts(rng, 3, 256, 128)
    put = lambda t: Cai(ar.put(torch.from_numpy(np.ascontiguousarray(t))))  # noqa: E731
    h = Cai(ar.poison((2, 128), torch.bfloat16))
    for w, what in [(moe.Fp8Experts(put(q.view(np.int8)), put(sc)), "w1.q"),
                    (moe.Fp8Experts(put(q), put(sc.astype(np.float64))), "w1.scale"),
                    (moe.Fp8Experts(put(q), put(sc[:, :1])), "w1.scale")]:
        with pytest.raises(moe.OpError, match=what.replace(".", r"\.")):
            D.decode_gate_up(x, w, ids, out=h)
    (q2, s2), _ = experts(rng, 3, 192, 128)  # I = 96: the gate / up halves are not whole scale blocks
    with pytest.raises(moe.OpError, match="multiple of 128"):
        D.decode_gate_up(x, moe.Fp8Experts(put(q2), put(s2)), ids, out=Cai(ar.poison((2, 96), torch.bfloat16)))
    assert reg.launched == []
