"""GPU checks of ``vkc_runtime.ops.gemm_fp4`` (the NVFP4 W4A4 GEMM and the bf16 -> NVFP4 quantizer).

On the H100 / H200 these run the sm_90a build, where Triton emulates the NVFP4 block-scaled MMA in bf16 (exact
products, fp32 accumulation): they check the kernels' source -- indexing, K masks, the nibble order, the e4m3
scales, alpha, the quantizer's rounding -- on a GPU; the native Blackwell lowerings (sm_100a / sm_120a / sm_121a)
are build-verified only. The GEMM is compared with a float64 product of the dequantized operands on fresh random
codes and scales, per row, for every compiled tile (forced) and the picked one, into NaN-poisoned outputs between
guard rows / columns; M in {1, 7, 16, 64, 255, 2048} over Qwen3.5 / 3.6 projection shapes and odd legal shapes.
The quantizer is compared bit for bit with numpy (tests/refs_nvfp4.quant_act). Graph capture and replay on a fresh
torch stream (bitwise equal to eager, new inputs and a new alpha read), and bad inputs refused before any launch.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.errlog import record
from tests.gpu.gemm_checks import check_gemm_out, gen, guarded_out

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")
from tests import refs_nvfp4 as R  # noqa: E402

MS = [1, 7, 16, 64, 255, 2048]
# (N, K): 27B GDN z, MLP down, GDN out; 35B-A3B GDN in, attention out; a narrow N
NKS = [(6144, 5120), (5120, 17408), (5120, 6144), (12352, 2048), (2048, 4096), (96, 5120)]
ODD = [(3, 16, 32), (129, 264, 96), (17, 1032, 544), (300, 200, 416)]
E2M1 = torch.tensor(R.E2M1, dtype=torch.float64)


@pytest.fixture(scope="module")
def G():
    from vkc_runtime.kernels import has_kernel
    from vkc_runtime.ops import gemm_fp4
    if not has_kernel(gemm_fp4.gemm_base(128, 128)):
        pytest.skip("no NVFP4 W4A4 GEMM for this device's arch")
    return gemm_fp4


def operand(g, rows, k, lo, hi):
    """(packed codes [rows, k/2] uint8, e4m3 scales [rows, k/16]) with every code and scales over 2^lo..2^hi."""
    packed = torch.randint(0, 256, (rows, k // 2), generator=g, device="cuda", dtype=torch.int32).to(torch.uint8)
    sc = torch.exp2(torch.rand(rows, k // 16, generator=g, device="cuda") * (hi - lo) + lo)
    return packed, sc.to(torch.float8_e4m3fn)


def dequant(packed, sc):
    """float64 [rows, k] values of an NVFP4 operand."""
    p = packed.long()
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(p.shape[0], -1)
    return E2M1.to(p.device)[codes] * sc.double().repeat_interleave(16, dim=1)


def ref(a, sa, w, sw, alpha):
    A, W = dequant(a, sa), dequant(w, sw)
    return (A @ W.T) * float(alpha), A.abs() @ W.abs().T


def forced(G, mp, tile):
    mp.setattr(G._gemm, "pick_mn_tile", lambda m, n, sms, tiles, factor: tile)


def variants(G, all_tiles):
    from vkc_runtime.kernels import has_kernel
    out = [("picked", None)]
    if all_tiles:
        out += [(f"t{t[0]}x{t[1]}", t) for t in G.TILES if has_kernel(G.gemm_base(*t))]
    return out


def cases():
    for n, k in NKS:
        for m in MS:
            if m == 2048 and n * k > 6144 * 5120:
                continue  # the float64 reference is costly
            yield m, n, k


def _run(G, monkeypatch, m, n, k, label, tile, a, sa, w, sw, alpha, r):
    with monkeypatch.context() as mp:
        if tile is not None:
            forced(G, mp, tile)
        buf, out = guarded_out(m, n)
        assert G.linear_w4a4(a, sa, w, sw, alpha, out, stream=torch.cuda.current_stream()) is out
        torch.cuda.synchronize()
        check_gemm_out("gemm_fp4", out, r[0], buf, f"w4a4 M={m} N={n} K={k} {label}", bound=r[1])


@pytest.mark.parametrize("m,n,k", list(cases()))
def test_w4a4_matches_float64(G, monkeypatch, m, n, k):
    g = gen()
    a, sa = operand(g, m, k, -4, 2)
    w, sw = operand(g, n, k, -9, -5)
    alpha = torch.tensor([0.37], device="cuda")
    r = ref(a, sa, w, sw, 0.37)
    for label, tile in variants(G, m in (7, 255)):
        _run(G, monkeypatch, m, n, k, label, tile, a, sa, w, sw, alpha, r)


@pytest.mark.parametrize("m,n,k", ODD)
def test_odd_legal_shapes(G, monkeypatch, m, n, k):
    """K a multiple of 32 but not of 128 (a partial last slice), N not a multiple of any tile, strided a."""
    g = gen()
    abuf, sabuf = operand(g, m, k + 64, -3, 3)
    a, sa = abuf[:, :k // 2], sabuf[:, :k // 16]       # row strides past K / 2 and K / 16
    w, sw = operand(g, n, k, -3, 3)
    alpha = torch.tensor([1.5], device="cuda")
    r = ref(a, sa, w, sw, 1.5)
    for label, tile in variants(G, True):
        _run(G, monkeypatch, m, n, k, label, tile, a, sa, w, sw, alpha, r)


@pytest.mark.parametrize("m,k", [(1, 5120), (7, 2048), (255, 6144), (1000, 17408), (5, 416)])
def test_quantizer_bit_exact(G, m, k):
    g = gen()
    x = (torch.randn(m, k, generator=g, device="cuda") * torch.exp2(
        torch.rand(m, 1, generator=g, device="cuda") * 12 - 6)).to(torch.bfloat16)
    if m > 2:
        x[1, :16] = 0                 # scale 0, codes 0
        x[2, 16:32] *= 1e4            # its scale saturates at 448 (gs calibrated without it)
    xh = x.float().cpu().numpy()
    calib = np.ones_like(xh, bool)
    if m > 2:
        calib[2, 16:32] = False
    gs = np.float32(448.0 * 6.0 / np.abs(xh[calib]).max())
    s = torch.cuda.current_stream()
    q, sc = G.quantize_nvfp4(x, torch.tensor([gs], device="cuda"), stream=s)  # allocated outputs
    rq, rs = R.quant_act(xh, gs)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(sc.to_numpy().view(np.uint8), rs)
    np.testing.assert_array_equal(q.to_numpy(), rq)
    qo = torch.full((m, k // 2 + 16), 0x7F, dtype=torch.uint8, device="cuda")
    so = torch.full((m, k // 16 + 4), 0x7F, dtype=torch.uint8, device="cuda")
    G.quantize_nvfp4(x, torch.tensor([gs], device="cuda"), qo[:, :k // 2], so[:, :k // 16].view(torch.float8_e4m3fn),
                     stream=s)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(qo[:, :k // 2].cpu().numpy(), rq)
    np.testing.assert_array_equal(so[:, :k // 16].cpu().numpy(), rs)
    assert (qo[:, k // 2:] == 0x7F).all() and (so[:, k // 16:] == 0x7F).all(), "wrote past the rows"


def test_quantize_then_gemm_end_to_end(G):
    """bf16 x and W in NVFP4 (W by the numpy recipe, x by the op), multiplied, against the bf16 product."""
    m, n, k = 300, 2048, 4096
    g = gen()
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    wf = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    exact = x.double() @ wf.double().T
    wp, ws, walpha = R.quantize(wf.float().cpu().numpy())           # W = codes * scale * walpha
    w = torch.from_numpy(wp).cuda()
    sw = torch.from_numpy(ws).cuda().view(torch.float8_e4m3fn)
    gs = 448.0 * 6.0 / float(x.float().abs().max())                  # x = codes * scale / gs
    alpha = torch.tensor([walpha / gs], device="cuda", dtype=torch.float32)
    xq = torch.empty(m, k // 2, dtype=torch.uint8, device="cuda")
    xs = torch.empty(m, k // 16, dtype=torch.float8_e4m3fn, device="cuda")
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    G.linear_nvfp4_w4a4(x, torch.tensor([gs], device="cuda"), w, sw, alpha, out, x_q=xq, x_scale=xs,
                        stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    err = float(torch.linalg.norm(out.double() - exact) / torch.linalg.norm(exact))
    record("gemm_fp4", what="quantize_nvfp4 + linear_w4a4 vs bf16 (both operands NVFP4)", rel_err=err)
    assert err < 0.2, err     # two 4-bit operands: ~10% relative error is the format's, not the kernel's
    assert err > 1e-3, err    # it did quantize


def test_graph_replay_equals_eager(G):
    """Quantizer + GEMM captured on a fresh torch stream; replays read new x, new weights and a new alpha."""
    import vkc_runtime
    m, n, k = 64, 1024, 2048
    g = gen()
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    w, sw = operand(g, n, k, -6, -2)
    gs = torch.tensor([50.0], device="cuda")
    alpha = torch.tensor([0.02], device="cuda")
    xq = torch.empty(m, k // 2, dtype=torch.uint8, device="cuda")
    xs = torch.empty(m, k // 16, dtype=torch.float8_e4m3fn, device="cuda")
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        G.linear_nvfp4_w4a4(x, gs, w, sw, alpha, out, x_q=xq, x_scale=xs, stream=st.cuda_stream)  # loads kernels
    st.synchronize()
    graph = vkc_runtime.Graph()
    with graph.capture(st.cuda_stream):
        G.linear_nvfp4_w4a4(x, gs, w, sw, alpha, out, x_q=xq, x_scale=xs, stream=st.cuda_stream)
    for trial in range(2):
        x.copy_(torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16))
        w2, sw2 = operand(g, n, k, -6, -2)
        w.copy_(w2)
        sw.copy_(sw2)
        alpha.fill_(0.02 * (trial + 2))
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay(st.cuda_stream)
        st.synchronize()
        got = out.clone()
        eager = torch.full_like(out, float("nan"))
        G.linear_nvfp4_w4a4(x, gs, w, sw, alpha, eager, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        assert torch.equal(got.view(torch.int16), eager.view(torch.int16)), f"replay {trial} != eager"
        r = ref(xq, xs, w, sw, float(alpha))
        check_gemm_out("gemm_fp4", got, r[0], None, f"replay {trial}", bound=r[1])


def test_bad_inputs_refused_before_launch(G):
    from vkc_runtime.ops import OpError
    m, n, k = 8, 64, 128
    g = gen()
    a, sa = operand(g, m, k, -2, 2)
    w, sw = operand(g, n, k, -2, 2)
    alpha = torch.tensor([1.0], device="cuda")
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bad = {
        "K not a multiple of 32": lambda: G.linear_w4a4(a[:, :8], sa[:, :1], w[:, :8], sw[:, :1], alpha, out),
        "w K mismatch": lambda: G.linear_w4a4(a, sa, w[:, :32], sw[:, :4], alpha, out),
        "scale shape": lambda: G.linear_w4a4(a, sa[:, :4], w, sw, alpha, out),
        "scale dtype": lambda: G.linear_w4a4(a, sa.float(), w, sw, alpha, out),
        "packed dtype": lambda: G.linear_w4a4(a.to(torch.int16), sa, w, sw, alpha, out),
        "alpha two elements": lambda: G.linear_w4a4(a, sa, w, sw, torch.ones(2, device="cuda"), out),
        "out dtype": lambda: G.linear_w4a4(a, sa, w, sw, alpha, out.float()),
        "out shape": lambda: G.linear_w4a4(a, sa, w, sw, alpha, out[:, :32]),
        "misaligned a": lambda: G.linear_w4a4(
            torch.zeros(m, k // 2 + 1, dtype=torch.uint8, device="cuda")[:, 1:], sa, w, sw, alpha, out),
        "quant K": lambda: G.quantize_nvfp4(torch.zeros(m, 48, dtype=torch.bfloat16, device="cuda"), alpha),
        "quant global scale shape": lambda: G.quantize_nvfp4(torch.zeros(m, 64, dtype=torch.bfloat16,
                                                                         device="cuda"), torch.ones(3, device="cuda")),
    }
    for what, call in bad.items():
        with pytest.raises(OpError):
            call()
        torch.cuda.synchronize()
        assert torch.isnan(out.float()).all(), f"{what}: launched before refusing"
