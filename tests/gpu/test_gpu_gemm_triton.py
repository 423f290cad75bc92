"""GPU (H200) checks of the GEMM family's Triton lane: ``ops.gemm.linear(_lane="triton")`` (the portable BF16 GEMM
every arch without the CuTe kernel runs; on sm_90a Triton lowers it to wgmma, elsewhere to mma.sync / tcgen05,
which this machine cannot run: those archs are build-verified) and ``ops.gemm.linear_w4a16`` (NVFP4 weights
dequantized in the kernel, any M).

Against float64 products of the same operands (NVFP4: of the exactly dequantized weights) on fresh random data,
per row, for every compiled tile (forced) and the rule's pick, into NaN-poisoned outputs between poisoned guard
rows / columns; odd legal shapes; strided views; graph capture on a fresh torch stream replayed bitwise equal to
eager; W4A16 agrees with the GEMV (``gemv_w4a16``) where both run; bad inputs refused before any launch.
"""
from __future__ import annotations

import pytest

from tests.gpu.gemm_checks import check_gemm_out
from tests.gpu.test_gpu_gemm import guarded_out, operands, ref64, rnd
from tests.gpu.test_gpu_gemv import dequant64, nvfp4_weights

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

MS = [1, 7, 16, 64, 255, 2048]
NKS = [(64, 128), (248, 64), (2048, 4096), (5120, 6144), (12352, 2048), (34816, 5120)]
ODD = [(3, 8, 16), (129, 264, 80), (1000, 8, 4112), (17, 1032, 528), (4097, 136, 208), (300, 2056, 1552)]


@pytest.fixture(scope="module")
def G():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import gemm
    return gemm


def check(out, ref, buf, what):
    check_gemm_out("gemm_triton", out, ref, buf, what)


def forced(G, mp, tile):
    mp.setattr(G, "pick_mn_tile", lambda m, n, sms, tiles, factor: tile)


def run_all_tiles(G, monkeypatch, tiles, call, ref, m, n, what):
    for tile in (None, *tiles):
        with monkeypatch.context() as mp:
            if tile is not None:
                forced(G, mp, tile)
            buf, out = guarded_out(m, n)
            assert call(out) is out
            torch.cuda.synchronize()
            check(out, ref, buf, f"{what} tile {tile or 'picked'}")


@pytest.mark.parametrize("n,k", NKS)
@pytest.mark.parametrize("m", MS)
def test_bf16_triton_lane_matches_float64(G, monkeypatch, m, n, k):
    x, w = operands(m, n, k)
    s = torch.cuda.current_stream()
    run_all_tiles(G, monkeypatch, G.MMA_TILES, lambda out: G.linear(x, w, out, stream=s, _lane="triton"),
                  ref64(x, w), m, n, f"triton M={m} N={n} K={k}")


@pytest.mark.parametrize("m,n,k", ODD)
def test_bf16_triton_odd_legal_shapes(G, monkeypatch, m, n, k):
    """K below one 32-wide k-slice or with a partial last slice, N and M off every tile boundary."""
    x, w = operands(m, n, k)
    s = torch.cuda.current_stream()
    run_all_tiles(G, monkeypatch, G.MMA_TILES, lambda out: G.linear(x, w, out, stream=s, _lane="triton"),
                  ref64(x, w), m, n, f"triton odd M={m} N={n} K={k}")


def test_bf16_triton_strided_views_and_cute_agreement(G):
    m, n, k = 300, 1024, 512
    xb = rnd(m, k + 80)
    wb = rnd(n, k + 16, scale=k ** -0.5)
    x, w = xb[:, 64:64 + k], wb[:, :k]
    buf, out = guarded_out(m, n, pad=40)
    G.linear(x, w, out, stream=torch.cuda.current_stream(), _lane="triton")
    torch.cuda.synchronize()
    check(out, ref64(x, w), buf, "triton strided views")
    if G.has_cute():  # both lanes on the same operands: both within bf16 rounding of float64, so of each other
        c = torch.empty_like(out)
        G.linear(x, w, c, stream=torch.cuda.current_stream(), _lane="cute")
        torch.cuda.synchronize()
        assert float((c.double() - out.double()).norm() / out.double().norm()) < 1e-2


def w4_case(m, n, k, alpha=0.37):
    packed, scale = nvfp4_weights(n, k)
    x = rnd(m, k, scale=0.05)
    return x, packed, scale, alpha, x.double() @ dequant64(packed, scale, alpha).T


W4_NKS = [(64, 256), (2048, 4096), (5120, 6144), (12352, 2048), (5120, 17408)]


@pytest.mark.parametrize("n,k", W4_NKS)
@pytest.mark.parametrize("m", MS)
def test_w4a16_gemm_matches_float64(G, monkeypatch, m, n, k):
    x, p, sc, alpha, ref = w4_case(m, n, k)
    s = torch.cuda.current_stream()
    run_all_tiles(G, monkeypatch, G.W4A16_TILES, lambda out: G.linear_w4a16(x, p, sc, alpha, out, stream=s),
                  ref, m, n, f"w4a16 M={m} N={n} K={k}")


def test_w4a16_gemm_agrees_with_the_gemv(G):
    from vkc_runtime.ops import gemv
    x, p, sc, alpha, ref = w4_case(48, 5120, 6144)
    a = torch.empty((48, 5120), device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    G.linear_w4a16(x, p, sc.view(torch.float8_e4m3fn), alpha, a, stream=torch.cuda.current_stream())
    gemv.gemv_w4a16(x, p, sc, alpha, b, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    check(a, ref, None, "w4a16 gemm (e4m3 scales)")
    assert float((a.double() - b.double()).norm() / b.double().norm()) < 1e-2


@pytest.mark.parametrize("n,k", [(5120, 6144), (12352, 2048), (34816, 5120)])
@pytest.mark.parametrize("m", [128, 255, 2048])
def test_w4a16_workspace_dequantizes_then_gemm(G, m, n, k):
    """M >= DEQUANT_MIN_M with a workspace: the weights dequantized once (bf16(W * alpha)) and the bf16 GEMM (CuTe
    on sm_90a); below it the fused kernel (M = 127)."""
    x, p, sc, alpha, ref = w4_case(m, n, k)
    ws = torch.full((n * k + 8,), float("nan"), device="cuda", dtype=torch.bfloat16)
    buf, out = guarded_out(m, n)
    G.linear_w4a16(x, p, sc, alpha, out, stream=torch.cuda.current_stream(), workspace=ws)
    torch.cuda.synchronize()
    check(out, ref, buf, f"w4a16 dequant + gemm M={m} N={n} K={k}")
    assert torch.isnan(ws[n * k:].float()).all(), "wrote past the dequantized weights"
    want = (dequant64(p, sc, 1.0).float() * torch.tensor(alpha, dtype=torch.float32)).to(torch.bfloat16)
    assert torch.equal(ws[:n * k].view(n, k), want), "dequantized weights != bf16(W * alpha)"
    x1 = x[:G.DEQUANT_MIN_M - 1]
    out1 = torch.empty((x1.shape[0], n), device="cuda", dtype=torch.bfloat16)
    ws.fill_(float("nan"))
    G.linear_w4a16(x1, p, sc, alpha, out1, stream=torch.cuda.current_stream(), workspace=ws)
    torch.cuda.synchronize()
    if x1.shape[0]:
        check(out1, ref[:x1.shape[0]], None, f"w4a16 fused below DEQUANT_MIN_M N={n} K={k}")
    assert torch.isnan(ws.float()).all(), "the fused path touched the workspace"


@pytest.mark.parametrize("which", ["bf16", "w4a16"])
def test_graph_capture_replay_equals_eager(G, which):
    m, n, k = 300, 5120, 2048
    s = torch.cuda.Stream()
    if which == "bf16":
        x, w = operands(m, n, k)

        def call(out):
            return G.linear(x, w, out, stream=s, _lane="triton")
    else:
        x, p, sc, alpha, _ = w4_case(m, n, k)

        def call(out):
            return G.linear_w4a16(x, p, sc, alpha, out, stream=s)
    eager = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(eager, float("nan"))
    s.wait_stream(torch.cuda.current_stream())  # the inputs and outputs were made on the default stream
    with torch.cuda.stream(s):
        call(eager)
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        call(out)
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all(), "the capture ran the kernel"
    for _ in range(2):
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    x.copy_(rnd(m, k, scale=0.05))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref = ref64(x, w) if which == "bf16" else x.double() @ dequant64(p, sc, alpha).T
    check(out, ref, None, f"{which} graph replay, new x")


def test_bad_inputs_refused_before_launch(G):
    from vkc_runtime.ops import OpError
    out = torch.full((16, 2048), float("nan"), device="cuda", dtype=torch.bfloat16)
    x, w = operands(16, 2048, 4104)
    with pytest.raises(OpError, match="the Triton lane needs K"):
        G.linear(x, w, out, _lane="triton")
    x, p, sc, alpha, _ = w4_case(16, 2048, 4096)
    bad = [
        ((x[:, :4080], p, sc, alpha), "x has K=4080"),
        ((x, p, sc[:, :255], alpha), "weight_scale has shape"),
        ((x, p.view(torch.int8), sc, alpha), "weight_packed must be uint8"),
        ((x, p, sc, float("nan")), "global_scale must be finite"),
        ((x.half(), p, sc, alpha), "x must be bfloat16"),
    ]
    for args, msg in bad:
        with pytest.raises(OpError, match=msg):
            G.linear_w4a16(*args, out, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all(), "a refused call wrote the output"
