"""GPU (H200) checks of ``vkc_runtime.ops.gemm_fp8`` (Triton FP8 e4m3 W8A8 GEMMs and the bf16 -> fp8 quantizers).

The GEMMs are compared with a float64 product of the DEQUANTIZED operands (fp8 values times their scales) on fresh
random data, per row, for every compiled tile (forced) and the tile the op picks, into NaN-poisoned outputs between
poisoned guard rows / columns; M in {1, 7, 16, 64, 255, 2048, 8192} over the Qwen3.5 27B / 35B-A3B projection
shapes; per-tensor, per-token x per-channel and block-wise (128x128 weight blocks, 1x128 activation groups) scales.
The quantizers are compared bit for bit with numpy + ml_dtypes (tests/refs_fp8.py). CUDA-graph capture and replay on
a fresh torch stream (bitwise equal to eager, new inputs read), torch and vkc inputs, and bad inputs refused before
any launch (the poisoned output stays untouched).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.errlog import record
from tests.gpu.gemm_checks import TOL, check_gemm_out, gen, guarded_out

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")
from tests import refs_fp8 as R  # noqa: E402

MS = [1, 7, 16, 64, 255, 2048, 8192]
# (N, K): 27B GDN qkv / z / b+a fused, attention qkv, GDN out, MLP gate+up, down; 35B-A3B GDN in, attention qkv,
# GDN out, attention out
NKS = [(10240, 5120), (6144, 5120), (96, 5120), (14336, 5120), (5120, 6144), (34816, 5120), (5120, 17408),
       (8192, 2048), (9216, 2048), (2048, 4096), (2048, 8192)]
BIG_M_NKS = [(10240, 5120), (5120, 17408), (8192, 2048)]  # M = 8192: the float64 reference is costly
ODD = [(3, 16, 16), (129, 264, 80), (1000, 8, 4112), (17, 1032, 528), (300, 200, 400), (4097, 136, 208)]


@pytest.fixture(scope="module")
def G():
    from vkc_runtime.kernels import has_kernel
    from vkc_runtime.ops import gemm_fp8
    if not has_kernel(gemm_fp8.gemm_base("scaled", 128, 128)):
        pytest.skip("no FP8 GEMM for this device's arch")
    return gemm_fp8


def fp8_rand(g, *shape):
    """Random e4m3 values over several binades (some subnormals), as torch float8_e4m3fn."""
    v = torch.randn(*shape, generator=g, device="cuda") * torch.exp2(
        torch.rand(*shape, generator=g, device="cuda") * 4 - 2) * 16
    return v.clamp(-448, 448).to(torch.float8_e4m3fn)


def pos_scales(g, *shape, lo=-6.0, hi=2.0):
    return torch.exp2(torch.rand(*shape, generator=g, device="cuda") * (hi - lo) + lo)


def ref_scaled(a, sa, w, sw):
    """(float64 product, its bound |A| @ |W|^T): check() floors each row's norm at 1e-3 of the bound's."""
    m, n = a.shape[0], w.shape[0]
    sa = sa.double().reshape(-1).expand(m) if sa.numel() == 1 else sa.double().reshape(-1)
    sw = sw.double().reshape(-1).expand(n) if sw.numel() == 1 else sw.double().reshape(-1)
    A, W = a.double() * sa[:, None], w.double() * sw[:, None]
    return A @ W.T, A.abs() @ W.abs().T


def ref_block(a, sa, w, sw):
    m, k = a.shape
    n = w.shape[0]
    sa_full = sa.double().repeat_interleave(128, dim=1)[:, :k]
    sw_full = sw.double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:n, :k]
    A, W = a.double() * sa_full, w.double() * sw_full
    return A @ W.T, A.abs() @ W.abs().T  # as ref_scaled


def check(out, ref, buf, what):
    check_gemm_out("gemm_fp8", out, ref[0], buf, what, bound=ref[1])


def forced(G, mp, tile):
    mp.setattr(G, "pick_tile", lambda m, n, sms, tiles=None: tile)


def tiles_here(G, kind):
    from vkc_runtime.kernels import has_kernel
    return [t for t in G.TILES[kind] if has_kernel(G.gemm_base(kind, *t))]


def scaled_variants(G, all_tiles: bool):
    """(label, lane, tile forcer or None) of linear_fp8: the default pick, then, with ``all_tiles``, every Triton
    tile and every CuTe tile (sm_90a) forced."""
    out = [("picked", None, None)]
    if all_tiles:
        out += [(f"triton t{t[0]}x{t[1]}", "triton", (lambda mp, t=t: forced(G, mp, t)))
                for t in tiles_here(G, "scaled")]
        if G._cute_available():
            cute = G._cute
            out += [(f"cute t128x{tn}", "cute", (lambda mp, tn=tn: mp.setattr(
                cute, "pick_tile", lambda m, n, sms, tiles=None: tn))) for tn in cute.TILES]
    return out


def block_variants(G, all_tiles: bool):
    """(label, lane, tile forcer or None) of linear_fp8_block, as :func:`scaled_variants` (CuTe: its block tiles)."""
    out = [("picked", None, None)]
    if all_tiles:
        out += [(f"triton t{t[0]}x{t[1]}", "triton", (lambda mp, t=t: forced(G, mp, t)))
                for t in tiles_here(G, "block")]
        cute = G._cute
        if cute.has_fp8_block():
            out += [(f"cute t{t[0]}x{t[1]}", "cute", (lambda mp, t=t: mp.setattr(
                cute, "pick_block_tile", lambda m, n, sms: t))) for t in cute.FP8_BLOCK_TILES]
    return out


def block_lanes(G):
    return ["triton"] + (["cute"] if G._cute.has_fp8_block() else [])


def cases():
    for n, k in NKS:
        for m in MS:
            if m == 8192 and (n, k) not in BIG_M_NKS:
                continue
            yield m, n, k


@pytest.mark.parametrize("m,n,k", list(cases()))
def test_scaled_matches_float64(G, monkeypatch, m, n, k):
    g = gen()
    a, w = fp8_rand(g, m, k), fp8_rand(g, n, k)
    scales = {"tensor": (torch.tensor([0.0071], device="cuda"), torch.tensor([0.013], device="cuda")),
              "channel": (pos_scales(g, m), pos_scales(g, n, 1, lo=-9, hi=-5))}
    s = torch.cuda.current_stream()
    for mode, (sa, sw) in scales.items():
        ref = ref_scaled(a, sa, w, sw)
        for label, lane, force in scaled_variants(G, m in (7, 255, 2048)):
            with monkeypatch.context() as mp:
                if force is not None:
                    force(mp)
                buf, out = guarded_out(m, n)
                assert G.linear_fp8(a, sa, w, sw, out, stream=s, _lane=lane) is out
                torch.cuda.synchronize()
                check(out, ref, buf, f"scaled/{mode} M={m} N={n} K={k} {label}")


@pytest.mark.parametrize("m,n,k", list(cases()))
def test_block_matches_float64(G, monkeypatch, m, n, k):
    g = gen()
    a, w = fp8_rand(g, m, k), fp8_rand(g, n, k)
    sa = pos_scales(g, m, -(-k // 128))
    sw = pos_scales(g, -(-n // 128), -(-k // 128), lo=-10, hi=-6)
    ref = ref_block(a, sa, w, sw)
    s = torch.cuda.current_stream()
    for label, lane, force in block_variants(G, m in (7, 255, 2048)):
        with monkeypatch.context() as mp:
            if force is not None:
                force(mp)
            buf, out = guarded_out(m, n)
            assert G.linear_fp8_block(a, sa, w, sw, out, stream=s, _lane=lane) is out
            torch.cuda.synchronize()
            check(out, ref, buf, f"block M={m} N={n} K={k} {label}")


@pytest.mark.parametrize("m,n,k", ODD)
def test_odd_legal_shapes(G, monkeypatch, m, n, k):
    """K not a multiple of 128 (a partial last k-slice and scale group), N not a multiple of any tile or of 128."""
    g = gen()
    a, w = fp8_rand(g, m, k), fp8_rand(g, n, k)
    sa, sw = pos_scales(g, m), pos_scales(g, n)
    ba, bw = pos_scales(g, m, -(-k // 128)), pos_scales(g, -(-n // 128), -(-k // 128))
    for label, lane, force in scaled_variants(G, True)[1:]:
        if lane == "cute" and n % 8:
            continue  # the CuTe lane needs N % 8 == 0 (the op runs the Triton kernel then)
        with monkeypatch.context() as mp:
            force(mp)
            buf, out = guarded_out(m, n)
            G.linear_fp8(a, sa, w, sw, out, stream=torch.cuda.current_stream(), _lane=lane)
            torch.cuda.synchronize()
            check(out, ref_scaled(a, sa, w, sw), buf, f"odd scaled M={m} N={n} K={k} {label}")
    for label, lane, force in block_variants(G, True)[1:]:
        if lane == "cute" and n % 8:
            continue
        with monkeypatch.context() as mp:
            force(mp)
            buf, out = guarded_out(m, n)
            G.linear_fp8_block(a, ba, w, bw, out, stream=torch.cuda.current_stream(), _lane=lane)
            torch.cuda.synchronize()
            check(out, ref_block(a, ba, w, bw), buf, f"odd block M={m} N={n} K={k} {label}")


@pytest.mark.parametrize("m,k", [(1, 5120), (7, 2048), (255, 6144), (2048, 17408), (5, 400)])
def test_quantizers_bit_exact(G, m, k):
    g = gen()
    x = (torch.randn(m, k, generator=g, device="cuda") * torch.exp2(
        torch.rand(m, 1, generator=g, device="cuda") * 12 - 6)).to(torch.bfloat16)
    if m > 2:
        x[1] = 0
        x[2, 3] = 3e4
    xh = x.float().cpu().numpy()
    s = torch.cuda.current_stream()
    q, sc = G.quantize_fp8_per_token(x, stream=s)  # allocated outputs (vkc DeviceArrays)
    rq, rs = R.quant_token(xh)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(sc.to_numpy(), rs)
    np.testing.assert_array_equal(q.to_numpy(), R.fp8_bits(rq))
    qo = torch.full((m, k), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    so = torch.full((m,), float("nan"), device="cuda")
    G.quantize_fp8_per_token(x, qo, so, stream=s)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(so.cpu().numpy(), rs)
    np.testing.assert_array_equal(qo.view(torch.uint8).cpu().numpy(), R.fp8_bits(rq))
    st = torch.tensor([0.02], device="cuda")
    G.quantize_fp8_per_tensor(x, st, qo, stream=s)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(qo.view(torch.uint8).cpu().numpy(), R.fp8_bits(R.quant_tensor(xh, np.float32(0.02))))
    kb = -(-k // 128)
    sg = torch.full((m, kb), float("nan"), device="cuda")
    G.quantize_fp8_per_token_group(x, qo, sg, stream=s)
    torch.cuda.synchronize()
    gq, gs = R.quant_group(xh)
    np.testing.assert_array_equal(sg.cpu().numpy(), gs)
    np.testing.assert_array_equal(qo.view(torch.uint8).cpu().numpy(), R.fp8_bits(gq))


def test_quantize_then_gemm_end_to_end(G):
    """bf16 x and W quantized by the ops, multiplied by both GEMMs, against the bf16 product in float64."""
    m, n, k = 300, 6144, 5120
    g = gen()
    x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
    wf = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    exact = x.double() @ wf.double().T
    s = torch.cuda.current_stream()
    xq = torch.empty(m, k, device="cuda", dtype=torch.float8_e4m3fn)
    xs = torch.empty(m, device="cuda")
    wq = torch.empty(n, k, device="cuda", dtype=torch.float8_e4m3fn)
    ws = torch.empty(n, device="cuda")
    G.quantize_fp8_per_token(x, xq, xs, stream=s)
    G.quantize_fp8_per_token(wf, wq, ws, stream=s)   # per output channel
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    G.linear_fp8(xq, xs, wq, ws, out, stream=s)
    torch.cuda.synchronize()
    err = float(torch.linalg.norm(out.double() - exact) / torch.linalg.norm(exact))
    record("gemm_fp8", what="quantize per token + linear_fp8 vs bf16", rel_err=err)
    assert err < 0.06, err   # e4m3 quantization error of both operands
    # block path: x per token per 128 columns, W with one per-tensor scale broadcast over its 128x128 blocks
    xg = torch.empty(m, -(-k // 128), device="cuda")
    G.quantize_fp8_per_token_group(x, xq, xg, stream=s)
    wt = (wf.float().abs().amax() / 448).reshape(1)
    G.quantize_fp8_per_tensor(wf, wt, wq, stream=s)
    wblk = wt.expand(-(-n // 128), -(-k // 128)).contiguous()
    out.fill_(float("nan"))
    G.linear_fp8_block(xq, xg, wq, wblk, out, stream=s)
    torch.cuda.synchronize()
    err = float(torch.linalg.norm(out.double() - exact) / torch.linalg.norm(exact))
    record("gemm_fp8", what="quantize per group + linear_fp8_block vs bf16", rel_err=err)
    assert err < 0.06, err
    check(out, ref_block(xq, xg, wq, wblk), None, "quantize_group + linear_fp8_block")


def test_graph_capture_replay_equals_eager(G):
    m, n, k = 300, 5120, 2048
    s = torch.cuda.Stream()
    g = gen()
    x = (torch.randn(m, k, generator=g, device="cuda")).to(torch.bfloat16)
    w, sw = fp8_rand(g, n, k), pos_scales(g, n, lo=-8, hi=-6)
    bsw = pos_scales(g, -(-n // 128), -(-k // 128), lo=-8, hi=-6)
    xq = torch.empty(m, k, device="cuda", dtype=torch.float8_e4m3fn)
    xs = torch.empty(m, device="cuda")
    xg = torch.empty(m, -(-k // 128), device="cuda")
    xq2 = torch.empty_like(xq)
    lanes = ["triton"] + (["cute"] if G._cute_available() else [])
    blanes = block_lanes(G)
    nb = len(blanes)
    outs = [[torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(nb + len(lanes))]
            for _ in range(2)]  # [eager, graph] x [block per lane, per-token per lane]

    def step(o):
        G.quantize_fp8_per_token(x, xq, xs, stream=s)
        for lane, oi in zip(lanes, o[nb:]):
            G.linear_fp8(xq, xs, w, sw, oi, stream=s, _lane=lane)
        G.quantize_fp8_per_token_group(x, xq2, xg, stream=s)
        for lane, oi in zip(blanes, o[:nb]):
            G.linear_fp8_block(xq2, xg, w, bsw, oi, stream=s, _lane=lane)

    s.wait_stream(torch.cuda.current_stream())    # the inputs and outputs were made on the default stream
    with torch.cuda.stream(s):
        step(outs[0])                             # eager warm-up: loads the kernels
    s.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        step(outs[1])
    torch.cuda.synchronize()
    assert all(torch.isnan(o.float()).all() for o in outs[1]), "the capture ran a kernel"
    for _ in range(2):
        for o in outs[1]:
            o.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        for e, o in zip(outs[0], outs[1]):
            assert torch.equal(o, e)
    x.copy_(torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16))  # same buffers, new values
    graph.replay()
    torch.cuda.synchronize()
    for lane, o in zip(lanes, outs[1][nb:]):
        check(o, ref_scaled(xq, xs, w, sw), None, f"graph replay, new x (per token, {lane})")
    for lane, o in zip(blanes, outs[1][:nb]):
        check(o, ref_block(xq2, xg, w, bsw), None, f"graph replay, new x (block, {lane})")


def test_vkc_inputs_and_allocated_outputs(G):
    import vkc_runtime as vr
    m, n, k = 19, 256, 320
    xh = np.random.randn(m, k).astype(np.float32)
    x = vr.DeviceArray.from_numpy(xh, dtype="bfloat16")
    q, s = G.quantize_fp8_per_token(x)
    rq, rs = R.quant_token(x.to_numpy().astype(np.float32))
    np.testing.assert_array_equal(s.to_numpy(), rs)
    np.testing.assert_array_equal(q.to_numpy(), R.fp8_bits(rq))
    g = gen()
    w, sw = fp8_rand(g, n, k), pos_scales(g, n)
    y = G.linear_fp8(q, s, w, sw)
    got = torch.from_numpy(y.to_numpy()).cuda().double()
    qa = torch.from_numpy(q.to_numpy()).cuda().view(torch.float8_e4m3fn)
    check(got, ref_scaled(qa, torch.from_numpy(s.to_numpy()).cuda(), w, sw), None, "vkc arrays, allocated out")


def test_bad_inputs_refused_before_launch(G):
    from vkc_runtime.ops import OpError
    g = gen()
    m, n, k = 16, 2048, 4096
    a, w = fp8_rand(g, m, k), fp8_rand(g, n, k)
    sa, sw = pos_scales(g, m), pos_scales(g, n)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    flat = fp8_rand(g, m * 4104 + 64)
    bad = [
        ((a.to(torch.bfloat16), sa, w, sw, out), "x_q must be float8_e4m3fn"),
        ((a, sa, w.to(torch.float8_e5m2), sw, out), "w_q must be float8_e4m3fn"),
        ((a, sa.double(), w, sw, out), "x_scale must be float32"),
        ((a, sa, w, sw, out.float()), "out must be bfloat16"),
        ((a, sa[:5], w, sw, out), "x_scale has shape"),
        ((a, sa, w, sw[:7], out), "w_scale has shape"),
        ((a, sa, w[:, :4080], sw, out), "expected dim 1 == K"),
        ((a[:, :4088], sa, w[:, :4088], sw, out), "K = 4088"),
        ((flat[8:m * k + 8].view(m, k), sa, w, sw, out), "x_q data pointer"),
        ((flat[:m * 4104].view(m, 4104)[:, :k], sa, w, sw, out), "x_q row stride 4104"),
    ]
    for args, msg in bad:
        with pytest.raises(OpError, match=msg):
            G.linear_fp8(*args, stream=torch.cuda.current_stream())
    kb = k // 128
    with pytest.raises(OpError, match="convert weight_scale_inv to float32"):
        G.linear_fp8_block(a, pos_scales(g, m, kb), w, pos_scales(g, n // 128, kb).to(torch.bfloat16), out)
    with pytest.raises(OpError, match="x_scale has shape"):
        G.linear_fp8_block(a, pos_scales(g, m, kb + 1), w, pos_scales(g, n // 128, kb), out)
    with pytest.raises(OpError, match="x must be bfloat16"):
        G.quantize_fp8_per_token(a, torch.empty_like(a), torch.empty(m, device="cuda"))
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all(), "a refused call wrote the output"


def test_cute_launcher_refuses_bad_arguments(G):
    """The CuTe FP8 C launcher re-checks on its own and returns CUDA_ERROR_INVALID_VALUE before touching memory."""
    if not G._cute_available():
        pytest.skip("no CuTe FP8 GEMM on this arch")
    from vkc_runtime.kernels import get_kernel
    fn = get_kernel(G._cute.fp8_base(G._cute.TILES[0])).load()
    g = gen()
    m, n, k = 16, 2048, 4096
    a, w = fp8_rand(g, m, k), fp8_rand(g, n, k)
    sa, sw = pos_scales(g, m), pos_scales(g, n)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    st = torch.cuda.current_stream().cuda_stream
    good = [a.data_ptr(), k, w.data_ptr(), k, out.data_ptr(), n, sa.data_ptr(), 1, sw.data_ptr(), 1, m, n, k, st]
    for i, v in [(0, a.data_ptr() + 8), (6, 0), (6, sa.data_ptr() + 2), (8, 0), (7, -1), (9, 2**31),
                 (12, 4088), (1, 4104), (11, 2044), (10, 2**31)]:
        args = list(good)
        args[i] = v
        assert fn(*args) == 1, (i, v)
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all()
    assert fn(*good) == 0
    torch.cuda.synchronize()
    check(out, ref_scaled(a, sa, w, sw), None, "raw CuTe launcher")


def test_cute_block_launcher_refuses_bad_arguments(G):
    """The CuTe block-scaled FP8 C launcher re-checks its scale matrices and returns CUDA_ERROR_INVALID_VALUE before
    touching memory."""
    if not G._cute.has_fp8_block():
        pytest.skip("no CuTe block-scaled FP8 GEMM on this arch")
    from vkc_runtime.kernels import get_kernel
    fn = get_kernel(G._cute.fp8_block_base(*G._cute.FP8_BLOCK_TILES[0])).load()
    g = gen()
    m, n, k = 16, 2048, 4096
    kb = k // 128
    a, w = fp8_rand(g, m, k), fp8_rand(g, n, k)
    sa, sw = pos_scales(g, m, kb), pos_scales(g, n // 128, kb, lo=-8, hi=-6)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    st = torch.cuda.current_stream().cuda_stream
    good = [a.data_ptr(), k, w.data_ptr(), k, out.data_ptr(), n, sa.data_ptr(), kb, sw.data_ptr(), kb, m, n, k, st]
    for i, v in [(0, a.data_ptr() + 8), (6, 0), (6, sa.data_ptr() + 2), (8, 0), (8, sw.data_ptr() + 1),
                 (7, kb - 1), (9, kb - 1), (7, -1), (7, 2**31), (9, 2**31), (7, 2**28), (12, 4088), (1, 4104)]:
        args = list(good)
        args[i] = v
        assert fn(*args) == 1, (i, v)
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all()
    assert fn(*good) == 0
    torch.cuda.synchronize()
    check(out, ref_block(a, sa, w, sw), None, "raw CuTe block launcher")
