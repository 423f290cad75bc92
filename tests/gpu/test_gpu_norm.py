"""GPU (H200) checks of the row families (norm, rope, act, embedding) against float64 references: fresh random
data, poisoned outputs, awkward sizes, strided/unaligned inputs (both specializations), torch/cupy/vkc inputs,
graph replay."""
from __future__ import annotations

import numpy as np
import pytest

from tests import refs
from tests.gpu.errlog import record
from tests.gpu.paths import validated_then_bound

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TOL = 1e-2  # bf16 outputs: typically 2e-3..4e-3


@pytest.fixture(scope="module")
def vr():
    import vkc_runtime
    return vkc_runtime


@pytest.fixture(scope="module")
def N():
    from vkc_runtime.ops import norm
    return norm


@pytest.fixture(scope="module")
def RO():
    from vkc_runtime.ops import rope
    return rope


@pytest.fixture(scope="module")
def AC():
    from vkc_runtime.ops import act
    return act


@pytest.fixture(scope="module")
def EM():
    from vkc_runtime.ops import embedding
    return embedding


def rnd(*shape, scale=1.0, seed=None):
    g = torch.Generator(device="cuda")
    g.manual_seed(int(np.random.SeedSequence().entropy % 2**63) if seed is None else seed)
    return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * scale).to(torch.bfloat16)


def poison(*shape):
    return torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)


def np64(t):
    return t.float().cpu().numpy().astype(np.float64)


def check(out, ref, what):
    o = np64(out) if isinstance(out, torch.Tensor) else out
    assert not np.isnan(o).any(), f"{what}: NaN in output (unwritten or bad math)"
    err = refs.rel_err(o, ref)
    record("norm", what=what, rel_err=err)
    assert err < TOL, f"{what}: rel err {err:.3e}"
    return err


def unaligned(shape):
    """A bf16 tensor view whose data pointer is 2 bytes past a 16-byte boundary (forces the .any variant)."""
    n = int(np.prod(shape))
    base = rnd(n + 8)
    return base[1:n + 1].view(*shape)


@pytest.mark.parametrize("M,Ncols", [(1, 2048), (7, 5120), (257, 2048), (33, 1000), (4, 16384), (1, 5120)])
def test_rmsnorm(N, M, Ncols):
    x, w = rnd(M, Ncols), rnd(Ncols, scale=0.1)
    y = poison(M, Ncols)
    N.rmsnorm(x, w, 1e-6, out=y)
    torch.cuda.synchronize()
    check(y, refs.rmsnorm(np64(x), np64(w), 1e-6), f"rmsnorm {M}x{Ncols}")


@pytest.mark.parametrize("M,Ncols", [(1, 2048), (5, 5120), (300, 5120), (9, 1000)])
def test_add_rmsnorm(N, M, Ncols):
    x, r, w = rnd(M, Ncols), rnd(M, Ncols), rnd(Ncols, scale=0.1)
    r0 = np64(r)
    y = poison(M, Ncols)
    N.add_rmsnorm(x, r, w, 1e-6, out=y)
    torch.cuda.synchronize()
    ref_y, ref_r = refs.add_rmsnorm(np64(x), r0, np64(w), 1e-6)
    assert np.array_equal(np64(r), ref_r), "residual must be exactly bf16(x + r)"
    check(y, ref_y, f"add_rmsnorm {M}x{Ncols}")


def test_rmsnorm_strided_and_unaligned(N):
    M, C = 65, 2048
    wide = rnd(M, C + 64)
    x = wide[:, 16:16 + C]  # strided rows, 16-element aligned -> .a16
    w = rnd(C, scale=0.1)
    y = poison(M, C)
    N.rmsnorm(x, w, 1e-6, out=y)
    x2 = unaligned((M, C))
    y2 = poison(M, C)
    N.rmsnorm(x2, w, 1e-6, out=y2)
    torch.cuda.synchronize()
    check(y, refs.rmsnorm(np64(x), np64(w), 1e-6), "rmsnorm strided")
    check(y2, refs.rmsnorm(np64(x2), np64(w), 1e-6), "rmsnorm unaligned")


@pytest.mark.parametrize("M,H", [(1, 48), (33, 32), (4, 3), (1024, 48)])
def test_gated_rmsnorm(N, M, H):
    x, z, w = rnd(M, H * 128), rnd(M, H * 128), rnd(128, scale=0.5)
    y = poison(M, H * 128)
    N.gated_rmsnorm(x, z, w, 1e-6, out=y)
    torch.cuda.synchronize()
    check(y, refs.gated_rmsnorm(np64(x), np64(z), np64(w), 1e-6), f"gated {M}x{H}")


@pytest.mark.parametrize("T,Hq,Hkv,D", [(1, 24, 4, 256), (5, 16, 2, 256), (300, 24, 4, 256), (7, 8, 2, 128),
                                        (300, 12, 4, 128)])  # d128: 8 heads a program on sm_90a, the last masked
def test_qk_norm_rope(RO, T, Hq, Hkv, D):
    qg, k = rnd(T, Hq * 2 * D), rnd(T, Hkv * D)
    pos = torch.randint(0, 4096, (T,), device="cuda", dtype=torch.int32)
    wq, wk = rnd(D, scale=0.1), rnd(D, scale=0.1)
    qo, ko = poison(T, Hq, D), poison(T, Hkv, D)
    RO.qk_norm_rope(qg, k, pos, wq, wk, Hq, Hkv, D, 1e-6, 1e7, q_out=qo, k_out=ko)
    torch.cuda.synchronize()
    rq, rk = refs.qk_norm_rope(np64(qg), np64(k), pos.cpu().numpy(), np64(wq), np64(wk), 1e-6, 1e7, Hq, Hkv, D, D // 4)
    check(qo, rq, f"q {T},{Hq},{D}")
    check(ko, rk, f"k {T},{Hkv},{D}")


@pytest.mark.parametrize("M,I", [(1, 17408), (64, 512), (3, 1000)])
def test_silu_mul(AC, M, I):
    x = rnd(M, 2 * I)
    y = poison(M, I)
    AC.silu_mul(x, out=y)
    torch.cuda.synchronize()
    check(y, refs.silu_mul(np64(x)), f"silu_mul {M}x{I}")


@pytest.mark.parametrize("T,H,D", [(1, 24, 256), (37, 16, 256), (5, 8, 128)])
def test_sigmoid_mul_reads_gate_in_place(AC, T, H, D):
    qg = rnd(T, H * 2 * D)
    gate = qg.view(T, H, 2, D)[:, :, 1]  # the gate halves, strided
    x = rnd(T, H * D)
    ref = refs.sigmoid_mul(np64(x), np64(gate))
    AC.sigmoid_mul(x, gate, out=x)  # in place
    torch.cuda.synchronize()
    check(x, ref, f"sigmoid_mul {T},{H},{D}")


@pytest.mark.parametrize("T,V,Ncols", [(1, 1000, 2048), (70, 5000, 5120), (9, 300, 1000)])
def test_embedding(EM, T, V, Ncols):
    table = rnd(V, Ncols)
    ids = torch.randint(0, V, (T,), device="cuda", dtype=torch.int32)
    if T > 2:
        ids[0], ids[1] = -1, V  # out of range -> zero rows, no OOB read
    out = poison(T, Ncols)
    EM.embedding(ids, table, out=out)
    torch.cuda.synchronize()
    assert torch.equal(out, refs_embedding_torch(ids, table))


def refs_embedding_torch(ids, table):
    ref = refs.embedding(ids.cpu().numpy(), np64(table))
    return torch.from_numpy(ref).to(torch.bfloat16).cuda()


def test_cupy_and_vkc_inputs(vr, EM):
    cp = pytest.importorskip("cupy")
    V, C, T = 512, 2048, 9
    table = rnd(V, C)
    ids = cp.asarray(np.random.randint(0, V, size=T).astype(np.int32))  # cupy int32 ids
    out = vr.DeviceArray.empty((T, C), "bfloat16")  # vkc's own array as output
    EM.embedding(ids, table, out=out)
    torch.cuda.synchronize()
    got = out.to_numpy()  # bf16 comes back as exact float32 values
    ref = refs.embedding(cp.asnumpy(ids), np64(table))
    assert np.array_equal(got.astype(np.float64), ref)


def test_graph_replay_equals_eager(vr, N, RO, AC):
    T, C, H, D = 32, 2048, 16, 256
    s = vr.Stream()
    x, r0, w = rnd(T, C), rnd(T, C), rnd(C, scale=0.1)
    qg, k = rnd(T, H * 2 * D), rnd(T, 2 * D)
    pos = torch.arange(T, device="cuda", dtype=torch.int32)
    wq, wk = rnd(D, scale=0.1), rnd(D, scale=0.1)
    r, y = r0.clone(), poison(T, C)
    qo, ko = poison(T, H, D), poison(T, 2, D)
    a = rnd(T, 2 * 512)
    act = poison(T, 512)
    torch.cuda.synchronize()

    def seq():
        N.add_rmsnorm(x, r, w, 1e-6, out=y, stream=s)
        RO.qk_norm_rope(qg, k, pos, wq, wk, H, 2, D, 1e-6, 1e7, q_out=qo, k_out=ko, stream=s)
        AC.sigmoid_mul(qo.view(T, H * D), qg.view(T, H, 2, D)[:, :, 1], out=qo.view(T, H * D), stream=s)
        AC.silu_mul(a, out=act, stream=s)

    seq()
    s.synchronize()
    eager = [t.clone() for t in (r, y, qo, ko, act)]
    g = vr.Graph()
    r.copy_(r0); torch.cuda.synchronize()
    with g.capture(s):
        seq()
    for _ in range(2):  # replay twice from fresh poison: same bits each time
        r.copy_(r0)
        for t in (y, qo, ko, act):
            t.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay(s)
        s.synchronize()
        for e, t in zip(eager, (r, y, qo, ko, act)):
            assert torch.equal(e, t)


def test_bound_calls_match_validated_calls(N, RO, AC, EM, monkeypatch):
    """Every row op (norm, rope, act, embedding), three calls each on its own tensors (one layout): with bound calls
    the first validates and the other two replay through _native.BoundCall; every output (and add_rmsnorm's
    in-place residual) is byte-identical to validated calls (VKC_FASTPATH=0) on the same inputs, NaN-poisoned
    first."""
    M, H = 9, 48

    def inputs(i):  # the same values in both runs (seeded), fresh tensors (new pointers) per call
        s = 100 * i
        return dict(x=rnd(M, 5120, seed=s), r=rnd(M, 5120, seed=s + 1), w=rnd(5120, scale=0.1, seed=s + 2),
                    gx=rnd(M, H * 128, seed=s + 3), gz=rnd(M, H * 128, seed=s + 4), gw=rnd(128, seed=s + 5),
                    qg=rnd(M, 24 * 512, seed=s + 6), k=rnd(M, 4 * 256, seed=s + 7),
                    pos=torch.randint(0, 5000, (M,), device="cuda", dtype=torch.int32,
                                      generator=torch.Generator(device="cuda").manual_seed(s + 8)),
                    wq=rnd(256, scale=0.1, seed=s + 9), wk=rnd(256, scale=0.1, seed=s + 10),
                    su=rnd(M, 2 * 17408, seed=s + 11), sx=rnd(M, 24 * 256, seed=s + 12),
                    ids=torch.randint(0, 1000, (M,), device="cuda", dtype=torch.int32,
                                      generator=torch.Generator(device="cuda").manual_seed(s + 13)),
                    table=rnd(1000, 2048, seed=s + 14))
    outs = {}
    for fast in validated_then_bound(monkeypatch):
        got = []
        for i in range(3):
            a = inputs(i)
            o = dict(rms=poison(M, 5120), add=poison(M, 5120), gated=poison(M, H * 128), qo=poison(M, 24, 256),
                     ko=poison(M, 4, 256), silu=poison(M, 17408), sig=poison(M, 24 * 256), emb=poison(M, 2048))
            N.rmsnorm(a["x"], a["w"], 1e-6, out=o["rms"])
            N.add_rmsnorm(a["x"], a["r"], a["w"], 1e-6, out=o["add"])
            N.gated_rmsnorm(a["gx"], a["gz"], a["gw"], out=o["gated"])
            RO.qk_norm_rope(a["qg"], a["k"], a["pos"], a["wq"], a["wk"], 24, 4, 256, q_out=o["qo"], k_out=o["ko"])
            AC.silu_mul(a["su"], out=o["silu"])
            AC.sigmoid_mul(a["sx"], a["qg"].view(M, 24, 2, 256)[:, :, 1], out=o["sig"])
            EM.embedding(a["ids"], a["table"], out=o["emb"])
            o["residual"] = a["r"]
            got.append(o)
        torch.cuda.synchronize()
        hits = sum(m._calls.hits for m in (N, RO, AC, EM))
        assert hits == (14 if fast == "1" else 0), hits  # 7 ops x 2 replays
        outs[fast] = got
    for a, b in zip(outs["0"], outs["1"]):
        for k in a:
            assert not torch.isnan(a[k].float()).any() and torch.equal(a[k], b[k]), k
