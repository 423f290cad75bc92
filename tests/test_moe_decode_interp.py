"""CPU tests of the MoE block's decode path (kernels_src/moe/decode.py through vkc_runtime.ops.moe.decode_ops and
sparse_moe_block: validation, grids and argument lists as on the GPU) with the kernels run by Triton's
interpreter on the sm_90a specs, every load and store checked against the tensors the test handed the op
(tests/test_bounds_interp.py's checker; the tensors are views into sentinel-filled buffers, outputs poisoned).

Against float64 numpy on fresh random data: each kernel with every compiled tile, adversarial ids (negative,
== E', 2^31 - 1, -2^31: a zero h row, no contribution, no weight byte of theirs read, NaN routing weights and h
rows of theirs ignored), a K tail against BLOCK_K, strided rows, an H tail against BLOCK_N; the whole block at
M = 1..DECODE_MAX_M with and without the shared expert vs the float64 block and vs its grouped path on the same
inputs; two runs bitwise equal."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import bounds_cases as B, refs_moe as R  # noqa: E402
from tests.kernel_testing import interpreter_active  # noqa: E402
from tests.test_bounds_interp import Cai  # noqa: E402
from tests.test_moe_interp import M_, Registry, bf16, np64, workspace  # noqa: E402,F401

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter (TRITON_INTERPRET=1)")

BAD_IDS = (-1, None, 2**31 - 1, -2**31)  # None: E' (one past the last expert)


def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


def routing(rng, M, k, Ep, n_bad):
    """ids [M, k] int32 (distinct experts per row, like a router) with n_bad adversarial entries."""
    ids = np.stack([rng.choice(Ep, size=k, replace=False) for _ in range(M)]).astype(np.int64)
    for i in range(n_bad):
        m, j = int(rng.integers(0, M)), int(rng.integers(0, k))
        v = BAD_IDS[i % len(BAD_IDS)]
        ids[m, j] = Ep if v is None else v
    return ids


def ref_h(X, W1, ids, I):
    """float64 h [M * k, I]: silu(gate) * up per pair, 0 for an id outside [0, E')."""
    M, k = ids.shape
    out = np.zeros((M * k, I))
    for m in range(M):
        for j in range(k):
            e = ids[m, j]
            if 0 <= e < W1.shape[0]:
                gu = W1[e] @ X[m]
                out[m * k + j] = R.silu(gu[:I]) * gu[I:]
    return out


def rel(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


@pytest.mark.parametrize("tile", [(8, 256), (8, 512), (16, 512)])
@pytest.mark.parametrize("M,k,Ep,H,I,n_bad", [(1, 3, 8, 64, 32, 1), (5, 4, 9, 528, 48, 4)])
def test_gate_up_vs_float64(M_, tile, M, k, Ep, H, I, n_bad):
    """x rows strided, H = 528 > BLOCK_K (steps of 256 or 512, a tail of 16 in the last one: the next step's
    prefetched tile is partial, then fully masked); bad ids give zero rows."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops as D
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    ids = routing(rng, M, k, Ep, n_bad)
    xb = bf16(g, M, H + 32)
    x = ar.put(xb)[:, 16:16 + H]
    w1 = ar.put(bf16(g, Ep, 2 * I, H, scale=0.2))
    out = ar.poison((M * k, I), torch.bfloat16)
    D.decode_gate_up(Cai(x), Cai(w1), Cai(ar.put(B.i32(ids.tolist()))), out=Cai(out), _tile=tile)
    ar.check()
    ref = ref_h(np64(x), np64(w1), ids, I)
    got = np64(out)
    bad = ~((ids >= 0) & (ids < Ep)).reshape(-1)
    assert bad.any()
    assert (got[bad] == 0).all(), "an invalid id's h row is not zero"
    assert np.isfinite(got).all()
    assert rel(got[~bad], ref[~bad]) < 1e-2
    assert reg.launched == [D._base("gate_up", tile)]


_DOWN_CASES = [(1, 9, 12, 44, 32, 2), (3, 3, 6, 64, 528, 3), (2, 16, 20, 44, 160, 3)]


@pytest.mark.parametrize("tile,M,k,Ep,H,I,n_bad", [(t, *c) for t in [(8, 128, 9), (4, 128, 9), (4, 64, 16),
                                                                    (4, 128, 16), (2, 128, 16)] for c in _DOWN_CASES
                                                   if c[1] <= t[2]])
def test_down_vs_float64(M_, tile, M, k, Ep, H, I, n_bad):
    """k' = 9 (the 8 + 1 tile: both slot tiles live), 3 (the second slot tile of s9 all masked) or 16 (= SB:
    every slot of the tile live); H = 44 (a tail against BLOCK_N 4 and 8, out rows strided); I = 528 or 160 >
    BLOCK_K (K steps with a partial last one); h rows and routing weights of bad ids are NaN and must not matter."""
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
    h = ar.put(hh)
    w2 = ar.put(bf16(g, Ep, H, I, scale=0.2))
    ob = ar.poison((M, -(-H // 16) * 16 + 16), torch.bfloat16)  # out rows strided past H
    out = ob[:, :H]
    before = ob.clone()
    D.decode_down(Cai(h), Cai(w2), Cai(ar.put(B.i32(ids.tolist()))), Cai(ar.put(wts)), out=Cai(out), _tile=tile)
    ar.check()
    assert B.same_bytes(ob[:, H:], before[:, H:]), "bytes past H of an out row were written"
    Hd, W2, Wt = np64(h), np64(w2), wts.double().numpy()
    ref = R.pairs_down(Hd, W2, ids, Wt)
    got = np64(out)
    assert np.isfinite(got).all()
    assert rel(got, ref) < 1e-2
    assert reg.launched == [D._base("down", tile)]


def test_all_ids_invalid_touch_no_weight(M_):
    """Every id out of range: h is all zeros and out all zeros, and no weight byte is read (the weights sit in
    an arena whose views are outside the address checker's allowed ranges: any access to them fails)."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops as D
    g = torch.Generator().manual_seed(_seed())
    M, k, Ep, H, I = 2, 4, 5, 64, 32
    ids = np.array([[-1, Ep, 2**31 - 1, -2**31], [Ep + 3, -7, Ep, -1]])
    it = ar.put(B.i32(ids.tolist()))
    x = ar.put(bf16(g, M, H))
    off_limits = Untouchable(_seed(), "cpu")
    w1 = off_limits.put(bf16(g, Ep, 2 * I, H))
    w2 = off_limits.put(bf16(g, Ep, H, I))
    h = ar.poison((M * k, I), torch.bfloat16)
    out = ar.poison((M, H), torch.bfloat16)
    D.decode_gate_up(Cai(x), Cai(w1), Cai(it), out=Cai(h))
    assert (np64(h) == 0).all()
    hh = ar.put(torch.full((M * k, I), float("nan")).to(torch.bfloat16))
    D.decode_down(Cai(hh), Cai(w2), Cai(it), Cai(ar.put(torch.full((M, k), float("nan")))), out=Cai(out))
    assert (np64(out) == 0).all()
    ar.check()


class Untouchable(B.Arena):
    """An arena the kernels may resolve pointers in but never access (its views are in no allowed range)."""

    def ranges(self):
        return []


def _inputs(g, M, E, k, H, I, shared):
    Ep = E + int(shared)
    x, gw = bf16(g, M, H), bf16(g, E, H, scale=0.3)
    w1, w2 = bf16(g, Ep, 2 * I, H, scale=0.2), bf16(g, Ep, H, I, scale=0.2)
    sg = bf16(g, 1, H, scale=0.2) if shared else None
    return x, gw, w1, w2, sg


def _block(moe, ar, ins, k, shared, path):
    x, gw, w1, w2, sg = ins
    M, H = x.shape
    E, I = gw.shape[0], w2.shape[2]
    ws = workspace(moe, ar, M, E, k, H, I, shared)
    out = ar.poison((M, H), torch.bfloat16)
    moe.sparse_moe_block(Cai(ar.put(x)), Cai(ar.put(gw)), Cai(ar.put(w1)), Cai(ar.put(w2)), k, renormalize=True,
                         shared_gate_w=None if sg is None else Cai(ar.put(sg)), workspace=ws, out=Cai(out), path=path)
    ar.check()
    return out


@pytest.mark.parametrize("M,E,k,H,I,shared", [(1, 16, 4, 128, 64, True), (3, 8, 2, 64, 32, False),
                                              (4, 12, 3, 256, 32, True)])
def test_block_decode_path(M_, monkeypatch, M, E, k, H, I, shared):
    """The rule picks the decode path for M <= DECODE_MAX_M (four launches); vs the float64 block, vs the
    grouped path on the same inputs, and two runs bitwise equal."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import grouped_ops
    monkeypatch.setattr(grouped_ops, "_sm_count", lambda dev: 132)
    assert M <= moe.DECODE_MAX_M and moe.choose_path(M) == "decode"
    g = torch.Generator().manual_seed(_seed())
    ins = _inputs(g, M, E, k, H, I, shared)
    out = _block(moe, ar, ins, k, shared, None)
    assert [b.split(".")[1] for b in reg.launched] == ["route", "route", "decode", "decode"]
    ref = R.block(*(np64(t) for t in ins[:4]), k, True, None if ins[4] is None else np64(ins[4]))
    got = np64(out)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    again = _block(moe, ar, ins, k, shared, "decode")
    assert B.same_bytes(out, again), "two runs of the decode path differ"
    reg.launched.clear()
    grouped = _block(moe, ar, ins, k, shared, "grouped")
    assert "moe.combine" in reg.launched and not any(".decode." in b for b in reg.launched)
    np.testing.assert_allclose(got, np64(grouped), rtol=2e-2, atol=1e-2 * np.abs(ref).max())


def test_block_rule_takes_grouped_above_decode_max_m(M_, monkeypatch):
    """M = DECODE_MAX_M + 1 runs the grouped path (DECODE_MAX_M lowered to keep the case small)."""
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import decode_ops, grouped_ops
    monkeypatch.setattr(decode_ops, "DECODE_MAX_M", 2)
    monkeypatch.setattr(grouped_ops, "_sm_count", lambda dev: 132)
    g = torch.Generator().manual_seed(_seed())
    ins = _inputs(g, 3, 8, 2, 64, 32, True)
    _block(moe, ar, ins, 2, True, None)
    assert reg.launched[-1] == "moe.combine" and not any(".decode." in b for b in reg.launched)
