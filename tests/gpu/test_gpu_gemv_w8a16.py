"""GPU (H200) checks of gemv_w8a16 (block-wise FP8 weights dequantized in the kernel, bf16 activations) against
float64 products of the dequantized weights on fresh random data at the Qwen3.5/3.6 projection shapes, M in
{1, 7, 16} (33 and 64 on one shape): poisoned outputs, every compiled kernel and split through forced plans,
float8_e4m3fn and uint8 weight tensors, graph replay == eager on a side stream."""
from __future__ import annotations

import functools

import pytest

from tests.gpu.test_gpu_gemv import SHAPES, check, fresh_seed, gen, poison

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

MS = (1, 7, 16)
ROWS = 8192


@pytest.fixture(scope="module")
def G():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import gemv
    return gemv


@functools.lru_cache(maxsize=1)
def fp8_weights(N, K):
    """e4m3 bytes (every finite code) and fp32 block scales spread over 2^-8 .. 2^0."""
    g = gen(fresh_seed())
    q = torch.randint(0, 256, (N, K), device="cuda", dtype=torch.uint8, generator=g)
    q = torch.where((q & 0x7F) == 0x7F, q ^ 1, q)  # no NaN codes
    sc = torch.exp2(-8 * torch.rand(-(-N // 128), -(-K // 128), device="cuda", generator=g)) * 0.01
    return q, sc.float()


def ref(x, q, sc):
    N, K = q.shape
    xd = x.double()
    out = []
    for lo in range(0, N, ROWS):
        w = q[lo:lo + ROWS].view(torch.float8_e4m3fn).double()
        s = sc.double().repeat_interleave(128, 0)[lo:lo + ROWS][:w.shape[0]].repeat_interleave(128, 1)[:, :K]
        out.append(xd @ (w * s).T)
    return torch.cat(out, 1)


@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("N,K", SHAPES)
def test_real_shapes(G, N, K, M):
    q, sc = fp8_weights(N, K)
    x = torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16)
    y = poison(M, N)
    G.gemv_w8a16(x, q.view(torch.float8_e4m3fn) if M == 7 else q, sc, out=y)
    torch.cuda.synchronize()
    check(y, ref(x, q, sc), f"w8a16 M={M} N={N} K={K}")


@pytest.mark.parametrize("M", [33, 64])
def test_larger_m_buckets(G, M):
    N, K = 5120, 6144
    q, sc = fp8_weights(N, K)
    x = torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16)
    y = poison(M, N)
    G.gemv_w8a16(x, q, sc, out=y)
    torch.cuda.synchronize()
    check(y, ref(x, q, sc), f"w8a16 M={M}")


def test_every_kernel_and_split_through_forced_plans(G):
    N, K = 2048 + 40, 4096
    q, sc = fp8_weights(N, K)
    ws = torch.full((G.workspace_elems(64, N),), float("nan"), device="cuda", dtype=torch.float32)
    for bm in G.BUCKETS["w8a16"]:
        M = max(1, bm - 3)
        x = torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16)
        r = ref(x, q, sc)
        for bn, bk in G.tiles("w8a16", bm):
            kt = -(-K // bk)
            for s in (1, 3, 8):
                per = -(-kt // s)
                p = G.Plan(bm, bn, bk, -(-kt // per), per * bk)
                y = poison(M, N)
                G.gemv_w8a16(x, q, sc, out=y, workspace=ws, _plan=p)
                torch.cuda.synchronize()
                check(y, r, f"w8a16 {p}")


def test_graph_replay_equals_eager(G):
    import vkc_runtime
    cases = [(16, 2048, 4096), (1, 12352, 2048)]
    ws = torch.empty(G.workspace_elems(16, 12352), device="cuda", dtype=torch.float32)
    ins = [(torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16), fp8_weights(N, K))
           for M, N, K in cases[:1]]
    ins += [(torch.randn(M, K, device="cuda", generator=gen(fresh_seed())).to(torch.bfloat16),
             tuple(t.clone() for t in fp8_weights(N, K))) for M, N, K in cases[1:]]
    eager = [poison(x.shape[0], w[0].shape[0]) for x, w in ins]
    graph = [poison(x.shape[0], w[0].shape[0]) for x, w in ins]
    for (x, w), y in zip(ins, eager):
        G.gemv_w8a16(x, *w, out=y, workspace=ws)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    g = vkc_runtime.Graph()
    with g.capture(s.cuda_stream):
        for (x, w), y in zip(ins, graph):
            G.gemv_w8a16(x, *w, out=y, workspace=ws, stream=s.cuda_stream)
    g.replay(s.cuda_stream)
    torch.cuda.synchronize()
    for ye, yg in zip(eager, graph):
        assert not torch.isnan(ye).any()
        assert torch.equal(ye, yg)
