"""GPU (H200) checks of NVFP4 linears in the MMA layout (vkc_runtime.ops.nvfp4, kernels_src/gemv/nvfp4_mma.py)
against float64 products of the dequantized weights on fresh random data: the device packer bit for bit against
the numpy packer (zero, negative and subnormal scales included), every compiled kernel and split through forced
plans, M in {1, 7, 16, 64, 255} over the Qwen3.5/3.6 projection shapes plus the large-M dequantize + GEMM path,
poisoned outputs, strided x / out, graph replay == eager on a side stream, bound calls == validated calls, the
dequantizer, and inputs refused before any launch."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.refs import rel_err

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TOL = 1e-2  # bf16 output rounding against float64
SHAPES = [(16480, 5120), (5120, 6144), (14336, 5120), (34816, 5120), (5120, 17408), (12352, 2048), (2048, 4096),
          (48, 2048), (37, 400)]
MS = (1, 7, 16, 64, 255)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
ALPHA = 0.0371


@pytest.fixture(scope="module")
def N4():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import nvfp4
    return nvfp4


def fresh_seed():
    return int(np.random.SeedSequence().entropy % 2**62)


@functools.lru_cache(maxsize=2)
def linear_weights(N, K):
    """Random codes; e4m3 scales over the whole finite range with zero and negative ones mixed in."""
    g = torch.Generator(device="cuda").manual_seed(fresh_seed())
    packed = torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8, generator=g)
    scale = torch.randint(0x01, 0x7F, (N, K // 16), device="cuda", dtype=torch.uint8, generator=g)
    r = torch.rand(N, K // 16, device="cuda", generator=g)
    scale = torch.where(r < 0.01, torch.zeros_like(scale), scale)
    scale = torch.where((r > 0.99) & (scale != 0), scale | 0x80, scale)
    return packed, scale


def packed_weights(N4, N, K):
    packed, scale = linear_weights(N, K)
    ws, ss = N4.mma_shapes(N, K)
    words = torch.full(ws, -1, device="cuda", dtype=torch.int32)
    scales = torch.full(ss, -1, device="cuda", dtype=torch.int32)
    N4.pack(packed, scale, words, scales)
    return N4.MmaWeights(words, scales, N, K, ALPHA)


def dequant64(packed, scale, alpha, rows=8192):
    lut = torch.tensor(E2M1, device="cuda", dtype=torch.float64)
    out = []
    for lo in range(0, packed.shape[0], rows):
        p = packed[lo:lo + rows].long()
        codes = torch.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1)
        s = scale[lo:lo + rows].view(torch.float8_e4m3fn).double().repeat_interleave(16, 1)
        out.append(lut[codes] * s * alpha)
    return torch.cat(out)


def reference(x, N, K):
    packed, scale = linear_weights(N, K)
    w = dequant64(packed, scale, ALPHA)
    return x.double() @ w.T


def test_device_pack_matches_numpy(N4):
    for N, K in ((37, 400), (5120, 6144)):
        w = packed_weights(N4, N, K)
        packed, scale = linear_weights(N, K)
        hw, hs = N4.pack_host(packed.cpu().numpy(), scale.cpu().numpy())
        assert np.array_equal(w.words.cpu().numpy(), hw) and np.array_equal(w.scales.cpu().numpy(), hs)


@pytest.mark.parametrize("N,K", SHAPES)
@pytest.mark.parametrize("M", MS)
def test_linear_vs_float64(N4, N, K, M):
    w = packed_weights(N4, N, K)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    N4.linear_nvfp4(x, w, out)
    err = rel_err(out.double().cpu().numpy(), reference(x, N, K).cpu().numpy())
    assert torch.isfinite(out).all() and err < TOL, err


def test_every_kernel_and_split(N4):
    N, K = 5120, 6144
    w = packed_weights(N4, N, K)
    ws = torch.empty(N4.workspace_elems(16, N), device="cuda", dtype=torch.float32)
    for M in (1, 9, 16):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ref = reference(x, N, K).cpu().numpy()
        bm = 8 if M <= 8 else 16
        for _, wk, r in (t for t in N4.MMA_TILES if t[0] == bm):
            for s in (1, 2, 4, 6):
                per = -(-(-(-K // 128) // s) // wk) * wk
                if -(-(K // 128) // per) != s:
                    continue
                p = N4.MmaPlan(bm, wk, r, s, per * 128)
                out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
                N4.linear_nvfp4(x, w, out, workspace=ws, _plan=p)
                err = rel_err(out.double().cpu().numpy(), ref)
                assert err < TOL, (p, err)


def test_large_m_dequant_path_and_strided(N4):
    N, K, M = 5120, 6144, 300
    w = packed_weights(N4, N, K)
    xb = torch.randn(M, K + 64, device="cuda", dtype=torch.bfloat16)
    x = xb[:, :K]
    ob = torch.full((M, N + 32), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = ob[:, :N]
    dq = torch.empty(N * K, device="cuda", dtype=torch.bfloat16)
    N4.linear_nvfp4(x, w, out, dequant_workspace=dq)
    err = rel_err(out.double().cpu().numpy(), reference(x, N, K).cpu().numpy())
    assert err < TOL and torch.isnan(ob[:, N:]).all()
    # the same call on the MMA kernel (M chunks) agrees
    out2 = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    N4.linear_nvfp4(x, w, out2)
    assert rel_err(out2.double().cpu().numpy(), reference(x, N, K).cpu().numpy()) < TOL


def test_dequantize(N4):
    N, K = 37, 400
    w = packed_weights(N4, N, K)
    out = torch.full((N, K), float("nan"), device="cuda", dtype=torch.bfloat16)
    N4.dequantize(w, out)
    packed, scale = linear_weights(N, K)
    assert torch.equal(out.float(), dequant64(packed, scale, ALPHA).to(torch.bfloat16).float())


def test_graph_replay_equals_eager_and_bound_calls(N4):
    import vkc_runtime
    N, K = 12352, 2048
    w = packed_weights(N4, N, K)
    ws = torch.empty(N4.workspace_elems(16, N), device="cuda", dtype=torch.float32)
    s = torch.cuda.Stream()
    for M in (1, 16):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        eager = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        N4.linear_nvfp4(x, w, eager, workspace=ws)
        again = torch.empty_like(eager)
        N4.linear_nvfp4(x, w, again, workspace=ws)  # a bound call now
        assert torch.equal(eager, again)
        graphed = torch.full_like(eager, float("nan"))
        s.wait_stream(torch.cuda.current_stream())
        g = vkc_runtime.Graph()
        with g.capture(s.cuda_stream):
            N4.linear_nvfp4(x, w, graphed, workspace=ws, stream=s.cuda_stream)
        g.replay(s.cuda_stream)
        s.synchronize()
        assert torch.equal(graphed, eager)


def test_bad_inputs_are_refused(N4):
    from vkc_runtime.ops._check import OpError
    N, K = 48, 2048
    w = packed_weights(N4, N, K)
    x = torch.randn(3, K, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(OpError, match="x has K"):
        N4.linear_nvfp4(torch.randn(3, K - 16, device="cuda", dtype=torch.bfloat16), w)
    with pytest.raises(OpError, match="words"):
        N4.linear_nvfp4(x, w._replace(words=w.words[:1]))
    with pytest.raises(OpError, match="int32"):
        N4.linear_nvfp4(x, w._replace(scales=w.scales.float()))
    with pytest.raises(OpError, match="finite"):
        N4.linear_nvfp4(x, w._replace(global_scale=float("inf")))
    with pytest.raises(OpError, match="aligned"):
        xb = torch.randn(3 * K + 8, device="cuda", dtype=torch.bfloat16)
        N4.linear_nvfp4(xb[1:1 + 3 * K].view(3, K), w)
    with pytest.raises(OpError, match="out"):
        N4.linear_nvfp4(x, w, torch.empty(3, N + 1, device="cuda", dtype=torch.bfloat16))
