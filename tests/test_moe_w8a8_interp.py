"""CPU tests of the block-wise FP8 W8A8 grouped expert kernels (kernels_src/moe/w8a8.py) through vkc_runtime.ops.moe --
grouped_gemm_w8a8 and sparse_moe_block's W8A8 path -- run by Triton's interpreter on the sm_90a specs, every load
and store checked against the tensors the test handed the op (tests/test_bounds_interp.py's checker; views into
sentinel-filled buffers, outputs poisoned).

Against float64 numpy on fresh random e4m3 activations and weights, a different multiplier per (row, k-slice) and
per 128 x 128 weight block (a wrong slice, row or block index fails), adversarial ids, a partial last k-slice,
strided rows, an N tail against BLOCK_N; the epilogue's quantized h against the quantizers' formula (its
multipliers exactly, its e4m3 values within one e4m3 step); the whole block vs a float64 block that quantizes x and
h as the kernels do; the rule and the host checks."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
ml_dtypes = pytest.importorskip("ml_dtypes")

from tests import bounds_cases as B, refs_fp8 as F, refs_moe as R  # noqa: E402
from tests.kernel_testing import interpreter_active  # noqa: E402
from tests.test_bounds_interp import Cai  # noqa: E402
from tests.test_moe_decode_interp import rel, routing  # noqa: E402
from tests.test_moe_fp8_interp import _seed, experts, put_experts  # noqa: E402
from tests.test_moe_grouped_interp import align_np  # noqa: E402
from tests.test_moe_interp import bf16, np64, workspace  # noqa: E402
from tests.test_moe_nvfp4_interp import moe_env  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter (TRITON_INTERPRET=1)")


@pytest.fixture()
def M_(monkeypatch):
    from vkc_runtime.ops import gemm_fp8
    from vkc_runtime.ops.moe import w8a8_ops
    env = moe_env(monkeypatch, {})
    monkeypatch.setattr(gemm_fp8, "get_kernel", env[1])  # the block's activation quantizer
    w8a8_ops._calls.clear()
    yield env
    env[2].check()
    B.ACTIVE.clear()


def _strided(ar, arr, pad):
    """A view of ``arr`` (2-D numpy) inside a wider arena buffer (row stride = cols + pad)."""
    r, c = arr.shape
    buf = ar.poison((r, c + pad), torch.from_numpy(arr[:0]).dtype)
    buf[:, :c] = torch.from_numpy(np.ascontiguousarray(arr))
    return buf[:, :c]


def _acts(rng, ar, rows, K):
    """Random e4m3 activations [rows, K] and multipliers [rows, cdiv(K, 128)] (strided views) and their float64
    values."""
    bits = F.random_fp8(rng, (rows, K))
    sa = rng.uniform(2.0 ** -6, 2.0 ** -3, (rows, F.group_cols(K))).astype(np.float32)
    vals = F.from_bits(bits) * np.repeat(sa.astype(np.float64), F.GROUP, axis=1)[:, :K]
    return _strided(ar, bits, 16), _strided(ar, sa, 3), vals


def _deq(q_bytes, scale, N):
    return F.from_bits(q_bytes) * np.repeat(scale.astype(np.float64), F.GROUP, axis=-1)[..., :N]


@pytest.mark.parametrize("block_m,kernel,block_k", [(64, "down", 128), (64, "gate_up", 128), (64, "gate_up_q", 128),
                                                    (128, "down", 128), (128, "gate_up", 128), (64, "down", 64),
                                                    (64, "gate_up_q", 64)])
def test_grouped_w8a8_vs_float64(M_, block_m, kernel, block_k):
    """K = 272 (three k-slices, the last partial); gate_up N = 256 (two weight-scale rows per half, two output
    groups), down N = 176 (a tail against BLOCK_N 128); a's rows and multipliers strided; bad ids dropped.
    block_k 64: the mma.sync archs' half-slice k-steps (w8a8_spec.py), two steps per multiplier."""
    moe, reg, ar = M_
    reg.constexprs["BLOCK_K"] = block_k
    from vkc_runtime.ops.moe import w8a8_ops as W
    rng = np.random.default_rng(_seed())
    M, k, E, K = 24, 3, 5, 272
    act = None if kernel == "down" else "silu_mul"
    quant = kernel == "gate_up_q"
    N = 256 if act else 176
    ids = routing(rng, M, k, E, 3)
    P = M * k
    parts, Wd = experts(rng, E, 2 * N if act else N, K)
    div = k if act else 1
    a, sa, A = _acts(rng, ar, -(-P // div), K)
    sid, bex, npad = align_np(ids, E, block_m, rng)
    out = ar.poison((P, N), torch.uint8 if quant else torch.bfloat16)
    osc = ar.poison((P, N // 128), torch.float32) if quant else None
    before = out.clone(), (osc.clone() if quant else None)
    W.grouped_gemm_w8a8(Cai(a), Cai(sa), put_experts(moe, ar, parts), Cai(ar.put(torch.from_numpy(sid))),
                        Cai(ar.put(torch.from_numpy(bex))), Cai(ar.put(B.i32([npad]))), a_row_div=div, out=Cai(out),
                        block_m=block_m, act=act, out_scale=Cai(osc) if quant else None)
    ar.check()
    assert reg.launched == [W.base(block_m, W.TILES[block_m][kernel][0], kernel)]
    flat = ids.reshape(-1)
    for f in range(P):
        e = flat[f]
        if not 0 <= e < E:
            assert B.same_bytes(out[f], before[0][f]), f"dropped row {f} written"
            if quant:
                assert B.same_bytes(osc[f], before[1][f])
            continue
        y = Wd[e] @ A[f // div]
        if act:
            y = R.silu(y[:N]) * y[N:]
        if not quant:
            assert rel(np64(out[f]), y) < 1e-2, f
            continue
        s = osc[f].numpy()
        want = np.maximum(np.abs(y).reshape(-1, 128).max(axis=1) / 448.0, float(F.MIN_SCALE))
        np.testing.assert_allclose(s, want, rtol=1e-4)
        got = _deq(out[f].numpy(), s, N)
        step = np.abs(y) * 2.0 ** -3 + np.repeat(s, 128) * 2.0 ** -9  # one e4m3 step (normal / subnormal)
        assert (np.abs(got - y) <= step).all(), f
        assert rel(got, y) < 0.05


def _ref_block_w8a8(x, gw, sg, W1, W2, k, fused):
    """The MoE block in float64 with x and h quantized per row per 128 columns as the W8A8 path does (h rounded to
    bf16 first without the fused epilogue), each pick's down row rounded to bf16 (the grouped path)."""
    ids, w, _ = R.route(x, gw, k, True, sg)
    xq, xs = F.quant_group(x.astype(np.float32))
    X = _deq(F.fp8_bits(xq), xs, x.shape[1])
    I = W2.shape[2]
    out = np.zeros_like(x)
    for m in range(x.shape[0]):
        for j, e in enumerate(ids[m]):
            gu = W1[e] @ X[m]
            h = R.silu(gu[:I]) * gu[I:]
            if not fused:
                h = h.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
            hq, hs = F.quant_group(h[None].astype(np.float32))
            y = W2[e] @ _deq(F.fp8_bits(hq), hs, I)[0]
            out[m] += w[m, j] * y.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    return out


@pytest.mark.parametrize("mode,M", [("w8a8", 64), ("w8a8_unfused", 64), (None, 7)])
def test_block_w8a8_vs_float64(M_, mode, M):
    """M = 64 tokens, k' = 3 over E' = 9 experts: block_m 64, the grouped path; H = 256, I = 128. M = 7 with the
    default mode: the M rule says block_m 16, the block still runs W8A8 grouped by W8A8_BLOCK_M rows (7 and 21 rows:
    the quantizer's last 4-row tile part masked)."""
    moe, reg, ar = M_
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    E, k, H, I = 8, 2, 256, 128
    x, gw, sg = bf16(g, M, H), bf16(g, E, H, scale=0.3), bf16(g, 1, H, scale=0.2)
    p1, W1 = experts(rng, E + 1, 2 * I, H)
    p2, W2 = experts(rng, E + 1, H, I)
    ws = workspace(moe, ar, M, E, k, H, I, True, w8a8=True)
    assert moe.block_m_for(M, k + 1, E + 1) == (64 if M == 64 else 16) and moe.choose_path(M, "fp8") == "grouped"
    assert moe.fp8_mode("fp8", 64, ws) == ("w8a8" if moe.FUSED_H_QUANT else "w8a8_unfused")
    out = ar.poison((M, H), torch.bfloat16)
    moe.sparse_moe_block(Cai(ar.put(x)), Cai(ar.put(gw)), put_experts(moe, ar, p1), put_experts(moe, ar, p2), k,
                         renormalize=True, shared_gate_w=Cai(ar.put(sg)), workspace=ws, out=Cai(out), _fp8_mode=mode)
    ar.check()
    fused = (mode or moe.fp8_mode("fp8", moe.W8A8_BLOCK_M, ws)) == "w8a8"
    w8 = [b for b in reg.launched if ".w8a8." in b]
    assert w8 == ["moe.w8a8.grouped.m64.n128.k128.silu.q" if fused else "moe.w8a8.grouped.m64.n64.k128.silu",
                  "moe.w8a8.grouped.m64.n128.k128"], reg.launched
    assert reg.launched.count("gemm_fp8.quant_group") == (1 if fused else 2)
    assert not any(".w8a16." in b for b in reg.launched)
    ref = _ref_block_w8a8(np64(x), np64(gw), np64(sg), W1, W2, k, fused)
    got = np64(out)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())


def test_fp8_mode_rule(monkeypatch):
    from vkc_runtime.ops import moe
    from vkc_runtime.ops.moe import block
    q8, plain = SimpleNamespace(xq=object()), SimpleNamespace(xq=None)
    pick = "w8a8" if moe.FUSED_H_QUANT else "w8a8_unfused"
    assert moe.fp8_mode("fp8", 64, q8) == pick and moe.fp8_mode("fp8", 128, q8) == "w8a8_unfused"
    assert moe.fp8_mode("fp8", 16, q8) == "w8a16"          # no W8A8 tile at block_m 16 (the block groups by 64)
    assert moe.fp8_mode("fp8", 128, plain) == "w8a16"      # no W8A8 buffers (bf16 workspace, or not an FP8 arch)
    assert moe.fp8_mode(None, 128, q8) == "w8a16" and moe.fp8_mode("nvfp4", 128, q8) == "w8a16"
    assert moe.fp8_mode("fp8", 16, q8, "w8a16") == "w8a16"
    for kind, bm, ws in (("fp8", 16, q8), ("fp8", 64, plain), (None, 64, q8), ("fp8", 128, q8)):
        with pytest.raises(moe.OpError, match="_fp8_mode"):
            moe.fp8_mode(kind, bm, ws, "w8a8")
    with pytest.raises(moe.OpError, match="_fp8_mode must be"):
        moe.fp8_mode("fp8", 64, q8, "w4a4")
    monkeypatch.setattr(block, "W8A8_GROUPED", False)    # the switch (bench_engine --moe-fp8 w8a16): W8A16 by default
    assert moe.fp8_mode("fp8", 64, q8) == "w8a16" and moe.fp8_mode("fp8", 64, q8, "w8a8_unfused") == "w8a8_unfused"


def test_w8a8_refused_before_launch(M_):
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import w8a8_ops as W
    rng = np.random.default_rng(_seed())
    K, N, E = 256, 128, 3
    parts, _ = experts(rng, E, 2 * N, K)
    w = put_experts(moe, ar, parts)
    sid, bex, npad = align_np(routing(rng, 4, 2, E, 0), E, 64, rng)
    grp = [Cai(ar.put(torch.from_numpy(sid))), Cai(ar.put(torch.from_numpy(bex))), Cai(ar.put(B.i32([npad])))]
    a = Cai(ar.poison((4, K), torch.uint8))
    sa = Cai(ar.poison((4, 2), torch.float32))
    h = Cai(ar.poison((8, N), torch.bfloat16))
    hq, hs = Cai(ar.poison((8, N), torch.uint8)), Cai(ar.poison((8, 1), torch.float32))
    bad = [
        (dict(a=Cai(ar.poison((4, K), torch.bfloat16))), "a must be float8_e4m3fn"),
        (dict(a_scale=Cai(ar.poison((4, 3), torch.float32))), "a_scale has shape"),
        (dict(block_m=16), "block_m must be one of"),
        (dict(out_scale=hs, act=None, out=hq), "out_scale .* needs act='silu_mul'"),
        (dict(out=hq, out_scale=Cai(ar.poison((8, 2), torch.float32))), "out_scale has shape"),
        (dict(out=Cai(ar.poison((8, 64), torch.bfloat16))), "expected N=128"),
        (dict(_tile=64, out=hq, out_scale=hs), "not a compiled gate_up_q tile"),
        (dict(block_m=128, out=hq, out_scale=hs), "no gate_up_q tile is compiled for block_m=128"),
    ]
    for change, msg in bad:
        kw = dict(a=a, a_scale=sa, w=w, out=h, block_m=64, act="silu_mul", out_scale=None)
        kw.update(change)
        with pytest.raises(moe.OpError, match=msg):
            W.grouped_gemm_w8a8(kw.pop("a"), kw.pop("a_scale"), kw.pop("w"), *grp, a_row_div=2, **kw)
    # the block: W8A8 forced with a workspace made without its buffers
    g = torch.Generator().manual_seed(_seed())
    H, I = 256, 128
    x, gw = Cai(ar.put(bf16(g, 64, H))), Cai(ar.put(bf16(g, 8, H)))
    p1, _ = experts(rng, 9, 2 * I, H)
    p2, _ = experts(rng, 9, H, I)
    ws = workspace(moe, ar, 64, 8, 2, H, I, True)
    with pytest.raises(moe.OpError, match="w8a8=True"):
        moe.sparse_moe_block(x, gw, put_experts(moe, ar, p1), put_experts(moe, ar, p2), 2, renormalize=True,
                             shared_gate_w=Cai(ar.put(bf16(g, 1, H))), workspace=ws,
                             out=Cai(ar.poison((64, H), torch.bfloat16)), _fp8_mode="w8a8")
    assert not any(".w8a8." in b for b in reg.launched)
