"""GPU (H200) checks of the gemv family (small-M GEMM for decode; BF16 and NVFP4-as-W4A16) against float64
products on fresh random data at the Qwen3.5/3.6 projection shapes, M in {1, 7, 16} (and 33, 64 on a subset):
poisoned outputs, every compiled kernel and split-K through forced plans, fp8 and uint8 scale tensors, strided
x/out, graph replay == eager (split-K with a workspace, on a side stream), bound calls == validated calls."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.gpu.paths import validated_then_bound
from tests.refs import rel_err

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TOL = 1e-2  # bf16 output rounding: ~2e-3 measured against float64
SHAPES = [(16480, 5120), (10240, 5120), (6144, 5120), (5120, 6144), (14336, 5120), (34816, 5120), (5120, 17408),
          (12352, 2048), (2048, 4096), (9216, 2048)]
LM_HEAD = [(248320, 5120), (248320, 2048)]  # tests named *large_grid: run.sh's memcheck leaves them out
MS = (1, 7, 16)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
ROWS = 16384  # float64 references in chunks of weight rows


@pytest.fixture(scope="module")
def G():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import gemv
    return gemv


def gen(seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def fresh_seed():
    return int(np.random.SeedSequence().entropy % 2**62)


def poison(M, N):
    return torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)


@functools.lru_cache(maxsize=1)
def bf16_weights(N, K):
    g = gen(fresh_seed())
    return (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).to(torch.bfloat16)


@functools.lru_cache(maxsize=1)
def nvfp4_weights(N, K):
    g = gen(fresh_seed())
    packed = torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8, generator=g)
    scale = torch.randint(0x01, 0x7F, (N, K // 16), device="cuda", dtype=torch.uint8, generator=g)  # all finite > 0
    return packed, scale


def dequant64(packed, scale, alpha):
    lut = torch.tensor(E2M1, device="cuda", dtype=torch.float64)
    p = packed.long()
    codes = torch.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1)  # low nibble = even k
    s = scale.view(torch.float8_e4m3fn).float().double().repeat_interleave(16, 1)
    return lut[codes] * s * alpha


def ref_bf16(x, w):
    xd = x.double()
    return torch.cat([xd @ w[lo:lo + ROWS].double().T for lo in range(0, w.shape[0], ROWS)], 1)


def ref_w4(x, packed, scale, alpha):
    xd = x.double()
    return torch.cat([xd @ dequant64(packed[lo:lo + ROWS], scale[lo:lo + ROWS], alpha).T
                      for lo in range(0, packed.shape[0], ROWS)], 1)


def check(y, ref, what):
    assert not torch.isnan(y).any(), f"{what}: NaN in output (unwritten)"
    err = rel_err(y.double().cpu().numpy(), ref.cpu().numpy())
    assert err < TOL, f"{what}: rel err {err:.3e}"
    return err


def test_dequant_matches_numpy_reference():
    """The torch dequantization used below agrees exactly with tests/refs_nvfp4 (ml_dtypes)."""
    pytest.importorskip("ml_dtypes")
    from tests import refs_nvfp4 as F
    packed, scale = nvfp4_weights(64, 512)
    W = dequant64(packed, scale, 0.375).cpu().numpy()
    assert np.array_equal(W, F.dequant(packed.cpu().numpy(), scale.cpu().numpy(), 0.375))


def _bf16_case(G, N, K, M):
    w = bf16_weights(N, K)
    x = torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16)
    y = poison(M, N)
    G.gemv(x, w, out=y)
    torch.cuda.synchronize()
    check(y, ref_bf16(x, w), f"bf16 M={M} N={N} K={K}")


def _w4_case(G, N, K, M, decoder=None):
    packed, scale = nvfp4_weights(N, K)
    alpha = 0.03125 * (1 + M / 16)
    x = torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16)
    y = poison(M, N)
    sc = scale.view(torch.float8_e4m3fn) if M == 7 else scale  # both accepted dtypes
    G.gemv_w4a16(x, packed, sc, alpha, out=y, _decoder=decoder)
    torch.cuda.synchronize()
    check(y, ref_w4(x, packed, scale, alpha), f"w4a16 {decoder} M={M} N={N} K={K}")


@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("N,K", SHAPES)
def test_gemv_bf16_real_shapes(G, N, K, M):
    _bf16_case(G, N, K, M)


@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("N,K", SHAPES)
def test_gemv_w4a16_real_shapes(G, N, K, M):
    _w4_case(G, N, K, M)


@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("N,K", LM_HEAD)
def test_gemv_lm_head_large_grid(G, N, K, M):
    _bf16_case(G, N, K, M)
    _w4_case(G, N, K, M)
    if M == 7:
        _w4_case(G, N, K, M, "prmt")


@pytest.mark.parametrize("M", [17, 33, 64])
@pytest.mark.parametrize("kind", ["bf16", "w4a16"])
def test_larger_m_buckets(G, kind, M):
    N, K = 5120, 6144
    x = torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16)
    y = poison(M, N)
    if kind == "bf16":
        w = bf16_weights(N, K)
        G.gemv(x, w, out=y)
        ref = ref_bf16(x, w)
    else:
        packed, scale = nvfp4_weights(N, K)
        G.gemv_w4a16(x, packed, scale, 0.5, out=y)
        ref = ref_w4(x, packed, scale, 0.5)
    torch.cuda.synchronize()
    check(y, ref, f"{kind} M={M}")


@pytest.mark.parametrize("kind", ["bf16", "w4a16.int", "w4a16.prmt"])
def test_every_kernel_and_split_through_forced_plans(G, kind):
    """Each compiled (M bucket, tile[, decoder]) kernel, with 1 and several splits, at a real shape with an N
    tail."""
    kind, _, dec = kind.partition(".")
    N, K = 2048 + 40, 4096
    ws = torch.full((G.workspace_elems(64, N),), float("nan"), device="cuda", dtype=torch.float32)
    packed, scale = nvfp4_weights(N, K)
    w = bf16_weights(N, K)
    for bm in G.BUCKETS[kind]:
        M = max(1, bm - 3)
        x = torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16)
        ref = ref_bf16(x, w) if kind == "bf16" else ref_w4(x, packed, scale, 0.25)
        for bn, bk in G.tiles(kind, bm):
            kt = -(-K // bk)
            for s in (1, 3, 8):
                per = -(-kt // s)
                p = G.Plan(bm, bn, bk, -(-kt // per), per * bk)
                y = poison(M, N)
                if kind == "bf16":
                    G.gemv(x, w, out=y, workspace=ws, _plan=p)
                else:
                    G.gemv_w4a16(x, packed, scale, 0.25, out=y, workspace=ws, _plan=p, _decoder=dec)
                torch.cuda.synchronize()
                check(y, ref, f"{kind} {p}")


@pytest.mark.parametrize("decoder", ["int", "prmt"])
def test_w4a16_decoders_exact(G, decoder):
    """One-hot rows of x pick single weight columns: y[m, n] == W[n, k_m] exactly (the dequantized weight is
    exact in bf16 and alpha a power of two) for every k % 16 position of a scale group (every nibble of both
    packed words), groups at the start, middle and end of K, every code and scales over e4m3's range."""
    N, K = 512, 4096
    g = gen(fresh_seed())
    packed = torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8, generator=g)
    scale = torch.randint(0x01, 0x7F, (N, K // 16), device="cuda", dtype=torch.uint8, generator=g)
    W = dequant64(packed, scale, 0.5)
    ks = list(range(16)) + [16 * 77 + j for j in range(16)] + [K - 16 + j for j in range(16)] + [8, 2047, 2048, 3001]
    for lo in range(0, len(ks), 16):
        part = ks[lo:lo + 16]
        x = torch.zeros(len(part), K, device="cuda", dtype=torch.bfloat16)
        x[torch.arange(len(part), device="cuda"), torch.tensor(part, device="cuda")] = 1.0
        y = poison(len(part), N)
        G.gemv_w4a16(x, packed, scale, 0.5, out=y, _decoder=decoder)
        torch.cuda.synchronize()
        for m, k in enumerate(part):
            assert torch.equal(y[m].double(), W[:, k]), (decoder, k)


@pytest.mark.parametrize("M", [1, 7])
@pytest.mark.parametrize("N,K", SHAPES)
def test_w4a16_prmt_decoder_real_shapes(G, N, K, M):
    _w4_case(G, N, K, M, "prmt")


def test_strided_x_and_out(G):
    N, K, M = 6144, 5120, 5
    w = bf16_weights(N, K)
    xb = torch.randn(M, K + 64, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16)
    x = xb[:, 32:32 + K]
    yb = poison(M, N + 24)
    y = yb[:, 8:8 + N]  # 16-byte aligned, row stride N + 24
    G.gemv(x, w, out=y)
    torch.cuda.synchronize()
    check(y, ref_bf16(x, w), "strided")
    assert torch.isnan(yb[:, :8].float()).all() and torch.isnan(yb[:, 8 + N:].float()).all()


@pytest.mark.parametrize("kind", ["bf16", "w4a16"])
def test_graph_replay_equals_eager(G, kind):
    """Split-K (workspace passed) and a direct case captured on a side stream; replay == eager bit for bit."""
    import vkc_runtime
    cases = [(16, 2048, 4096), (1, 16480, 5120)]
    ws = torch.empty(G.workspace_elems(16, 16480), device="cuda", dtype=torch.float32)
    ins, eager, graph = [], [], []
    for M, N, K in cases:
        x = torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16)
        wts = (bf16_weights(N, K),) if kind == "bf16" else (*nvfp4_weights(N, K), 0.125)
        ins.append((x, wts))
        eager.append(poison(M, N))
        graph.append(poison(M, N))

    def call(x, wts, y, stream=None):
        if kind == "bf16":
            G.gemv(x, wts[0], out=y, workspace=ws, stream=stream)
        else:
            G.gemv_w4a16(x, *wts, out=y, workspace=ws, stream=stream)
    for (x, wts), y in zip(ins, eager):
        call(x, wts, y)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    g = vkc_runtime.Graph()
    with g.capture(s.cuda_stream):
        for (x, wts), y in zip(ins, graph):
            call(x, wts, y, stream=s.cuda_stream)
    g.replay(s.cuda_stream)
    torch.cuda.synchronize()
    for ye, yg in zip(eager, graph):
        assert not torch.isnan(ye).any()
        assert torch.equal(ye, yg)
    # a forced split-K plan captured too (whatever the rule picks on this device)
    x, wts = ins[0]
    bn, bk = G.TILES[kind][0]
    p = G.Plan(16, bn, bk, 4, 1024)
    ye, yg = poison(16, 2048), poison(16, 2048)
    if kind == "bf16":
        G.gemv(x, wts[0], out=ye, workspace=ws, _plan=p)
    else:
        G.gemv_w4a16(x, *wts, out=ye, workspace=ws, _plan=p)
    g2 = vkc_runtime.Graph()
    torch.cuda.synchronize()
    with g2.capture(s.cuda_stream):
        if kind == "bf16":
            G.gemv(x, wts[0], out=yg, workspace=ws, _plan=p, stream=s.cuda_stream)
        else:
            G.gemv_w4a16(x, *wts, out=yg, workspace=ws, _plan=p, stream=s.cuda_stream)
    g2.replay(s.cuda_stream)
    torch.cuda.synchronize()
    assert not torch.isnan(ye).any() and torch.equal(ye, yg)


def test_bound_calls_match_validated_calls(G, monkeypatch):
    N, K = 10240, 5120
    w = bf16_weights(N, K)
    packed, scale = nvfp4_weights(N, K)
    ws = torch.empty(G.workspace_elems(16, N), device="cuda", dtype=torch.float32)
    xs = [torch.randn(7, K, device="cuda", generator=gen(100 + i)).to(torch.bfloat16) for i in range(3)]
    res = {}
    for fast in validated_then_bound(monkeypatch):
        got = []
        for x in xs:
            y1, y2 = poison(7, N), poison(7, N)
            G.gemv(x, w, out=y1, workspace=ws)
            G.gemv_w4a16(x, packed, scale, 0.5, out=y2, workspace=ws)
            got += [y1, y2]
        torch.cuda.synchronize()
        assert G._calls.hits == (4 if fast == "1" else 0)
        res[fast] = got
    for a, b in zip(res["0"], res["1"]):
        assert not torch.isnan(a).any() and torch.equal(a, b)


def test_bad_inputs_refused(G):
    from vkc_runtime.ops import OpError
    x = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    w = torch.randn(64, 512, device="cuda").to(torch.bfloat16)
    with pytest.raises(OpError, match="exceeds max_m"):
        G.gemv(torch.randn(65, 512, device="cuda").to(torch.bfloat16), w)
    with pytest.raises(OpError, match="must be bfloat16"):
        G.gemv(x.float(), w)
    with pytest.raises(OpError, match="16-byte aligned"):
        G.gemv(x, torch.randn(64 * 512 + 1, device="cuda").to(torch.bfloat16)[1:].view(64, 512))
    with pytest.raises(OpError, match="weight_scale has shape"):
        G.gemv_w4a16(x, torch.zeros(64, 256, device="cuda", dtype=torch.uint8),
                     torch.zeros(64, 16, device="cuda", dtype=torch.uint8), 1.0)
