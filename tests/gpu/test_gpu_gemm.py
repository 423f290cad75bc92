"""GPU (H200) checks of ``vkc_runtime.ops.gemm.linear`` (the CuTe DSL sm_90a bf16 GEMM, artifact kind ``cute-so``).

out[M, N] = x[M, K] @ weight[N, K]^T is compared with a float64 product of the same bf16 operands on fresh random
data, per row (a wrong tail row cannot hide in a global norm), for every compiled tile (forced) and the tile the
op picks, into NaN-poisoned outputs between poisoned guard rows/columns (nothing outside out may be written);
strided views, odd but legal shapes, torch/cupy/vkc inputs, CUDA-graph capture and replay on a fresh torch stream
(bitwise equal to eager), and bad inputs refused before any launch (the poisoned output stays untouched).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.gemm_checks import TOL, check_gemm_out, guarded_out

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

MS = [1, 7, 16, 64, 255, 2048]
NKS = [(64, 128), (248, 64), (2048, 4096), (5120, 6144), (10240, 5120), (34816, 5120)]
ODD = [(3, 8, 8), (129, 264, 72), (1000, 8, 4104), (17, 1032, 520), (4097, 136, 200), (300, 2056, 1544)]


@pytest.fixture(scope="module")
def G():
    from vkc_runtime.kernels import has_kernel
    from vkc_runtime.ops import gemm
    if not has_kernel(gemm.OPTIONAL_BASES[0]):
        pytest.skip("no CuTe GEMM for this device's arch (built for sm_90a only)")
    return gemm


def rnd(*shape, scale=1.0, seed=None):
    g = torch.Generator(device="cuda")
    g.manual_seed(int(np.random.SeedSequence().entropy % 2**63) if seed is None else seed)
    return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * scale).to(torch.bfloat16)


def operands(m, n, k, seed=None):
    x = rnd(m, k, seed=seed)
    w = rnd(n, k, scale=k ** -0.5, seed=None if seed is None else seed + 1)
    return x, w


def ref64(x, w):
    return x.double() @ w.double().T


def check(out, ref, buf, what):
    check_gemm_out("gemm", out, ref, buf, what)


def forced(G, monkeypatch, tile):
    monkeypatch.setattr(G, "plan_tactic", lambda m, n, k: None)  # no plan overrides the forced rule
    monkeypatch.setattr(G, "pick_tile", lambda m, n, sms, tiles=G.TILES: tile)


@pytest.mark.parametrize("n,k", NKS)
@pytest.mark.parametrize("m", MS)
def test_linear_matches_float64(G, monkeypatch, m, n, k):
    x, w = operands(m, n, k)
    ref = ref64(x, w)
    s = torch.cuda.current_stream()
    for tile in (None, *G.TILES):
        with monkeypatch.context() as mp:
            if tile is not None:
                forced(G, mp, tile)
            buf, out = guarded_out(m, n)
            assert G.linear(x, w, out, stream=s) is out
            torch.cuda.synchronize()
            check(out, ref, buf, f"M={m} N={n} K={k} tile {tile or 'picked'}")


@pytest.mark.parametrize("m,n,k", ODD)
def test_odd_legal_shapes(G, monkeypatch, m, n, k):
    """Shapes off every tile boundary: K below one 64-wide k-slice or with a partial last slice, N not a multiple
    of any tile width, M not a multiple of 128."""
    x, w = operands(m, n, k)
    ref = ref64(x, w)
    for tile in G.TILES:
        with monkeypatch.context() as mp:
            forced(G, mp, tile)
            buf, out = guarded_out(m, n)
            G.linear(x, w, out, stream=torch.cuda.current_stream())
            torch.cuda.synchronize()
            check(out, ref, buf, f"odd M={m} N={n} K={k} tile {tile}")


def test_strided_views(G):
    """x and weight as column windows of wider buffers (row strides > K), out inside a wider poisoned buffer."""
    m, n, k = 300, 1024, 512
    xb = rnd(m, k + 72)
    wb = rnd(n, k + 8, scale=k ** -0.5)
    x, w = xb[:, 64:64 + k], wb[:, :k]           # offsets of 64 and 0 elements keep 16-byte alignment
    buf, out = guarded_out(m, n, pad=40)
    G.linear(x, w, out, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    check(out, ref64(x, w), buf, "strided views")


def test_allocates_output_and_m_zero(G):
    x, w = operands(37, 2048, 512)
    y = G.linear(x, w)                           # no out: a vkc DeviceArray, on the legacy default stream
    got = torch.from_numpy(y.to_numpy()).cuda().double()
    check(got, ref64(x, w), None, "allocated output")
    out = torch.empty((0, 2048), device="cuda", dtype=torch.bfloat16)
    assert G.linear(torch.empty((0, 512), device="cuda", dtype=torch.bfloat16), w, out) is out


def test_cupy_and_vkc_inputs(G):
    import vkc_runtime as vr
    m, n, k = 19, 256, 320
    xh = np.random.randn(m, k).astype(np.float32)
    wh = (np.random.randn(n, k) / np.sqrt(k)).astype(np.float32)
    x = vr.DeviceArray.from_numpy(xh, dtype="bfloat16")
    w = vr.DeviceArray.from_numpy(wh, dtype="bfloat16")
    out = vr.DeviceArray.empty((m, n), "bfloat16")
    G.linear(x, w, out)
    torch.cuda.synchronize()
    xr, wr = x.to_numpy().astype(np.float64), w.to_numpy().astype(np.float64)
    ref = xr @ wr.T
    got = out.to_numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOL
    cp = pytest.importorskip("cupy")
    xc = cp.asarray(x.to_numpy(raw=True)).view(cp.uint16)  # raw bf16 bits; exposed below as bf16
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)

    class Bf16View:  # cupy has no bfloat16: hand the bits over with a bf16 typestr
        def __init__(self, a):
            self.a = a
            ai = dict(a.__cuda_array_interface__)
            ai["typestr"] = "<V2"
            self.__cuda_array_interface__ = ai

    G.linear(Bf16View(xc), w, y)
    torch.cuda.synchronize()
    assert np.linalg.norm(y.double().cpu().numpy() - ref) / np.linalg.norm(ref) < TOL


def test_graph_capture_replay_equals_eager(G):
    m, n, k = 300, 5120, 2048
    s = torch.cuda.Stream()                      # a fresh torch stream
    x, w = operands(m, n, k)
    eager = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    s.wait_stream(torch.cuda.current_stream())   # the inputs were made on the default stream
    with torch.cuda.stream(s):
        G.linear(x, w, eager, stream=s)          # warm-up outside capture: loads the kernels
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        G.linear(x, w, out, stream=s)
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all(), "the capture ran the kernel"
    for _ in range(2):
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    check(out, ref64(x, w), None, "graph replay")
    x.copy_(rnd(m, k))                            # new inputs, same buffers: the replay reads them
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check(out, ref64(x, w), None, "graph replay, new x")


def test_rows_are_independent(G):
    """Each output row depends only on its own x row: change one row of x, only that row of out changes."""
    m, n, k = 255, 5120, 6144
    x, w = operands(m, n, k)
    c1 = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    c2 = torch.empty_like(c1)
    G.linear(x, w, c1, stream=torch.cuda.current_stream())
    x[200] = rnd(k)
    G.linear(x, w, c2, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    changed = (c1 != c2).any(dim=1).cpu().numpy()
    assert changed[200] and changed.sum() == 1, np.nonzero(changed)


def test_bad_inputs_refused_before_launch(G):
    from vkc_runtime.ops import OpError
    x, w = operands(16, 2048, 4096)
    flat = rnd(16 * 4096 + 64)
    out = torch.full((16, 2048), float("nan"), device="cuda", dtype=torch.bfloat16)
    bad = [
        ((x.half(), w, out), "x must be bfloat16"),
        ((x, w.float(), out), "weight must be bfloat16"),
        ((x, w, out.float()), "out must be bfloat16"),
        ((x, w[:, :4088], out), "expected dim 1 == K"),
        ((x, w, out[:, :2040]), "out has shape"),
        ((x[:, :4092], w[:, :4092], out), "multiples of 8"),
        ((x, w[:2044], out[:, :2044]), "multiples of 8"),
        ((flat[1:16 * 4096 + 1].view(16, 4096), w, out), "x data pointer"),
        ((flat[:16 * 4100].view(16, 4100)[:, :4096], w, out), "x row stride 4100"),
        ((rnd(4096, 16).T, w, out), "contiguous in its last dim"),
    ]
    for args, msg in bad:
        with pytest.raises(OpError, match=msg):
            G.linear(*args, stream=torch.cuda.current_stream())
    overlap = torch.empty(16 * 4096 + 16 * 2048, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(OpError, match="out must not overlap x"):
        G.linear(overlap[:16 * 4096].view(16, 4096), w, overlap[16 * 4096 - 2048:16 * 4096 - 2048 + 16 * 2048]
                 .view(16, 2048))
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all(), "a refused call wrote the output"


def test_c_launcher_refuses_bad_arguments(G):
    """The launcher re-checks on its own (alignment, null, extents, strides) and returns CUDA_ERROR_INVALID_VALUE
    before touching memory."""
    from vkc_runtime.kernels import get_kernel
    k = get_kernel(G.OPTIONAL_BASES[0])
    fn = k.load()
    x, w = operands(16, 2048, 4096)
    out = torch.full((16, 2048), float("nan"), device="cuda", dtype=torch.bfloat16)
    st = torch.cuda.current_stream().cuda_stream
    good = [x.data_ptr(), 4096, w.data_ptr(), 4096, out.data_ptr(), 2048, 16, 2048, 4096, st]
    for i, v in [(0, x.data_ptr() + 2), (2, 0), (4, out.data_ptr() + 8), (6, -1), (6, 2**31), (7, 2044),
                 (8, 4100), (1, 4088), (5, 2040)]:
        args = list(good)
        args[i] = v
        assert fn(*args) == 1, (i, v)
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all()
    assert fn(*good) == 0
    torch.cuda.synchronize()
    check(out, ref64(x, w), None, "raw launcher")


def test_tile_rule_on_this_device(G):
    from vkc_runtime import driver
    sms = driver.sm_count(torch.cuda.current_device())
    assert G.pick_tile(8192, 34816, sms) == 256
    assert G.pick_tile(2048, 64, sms) == 64
