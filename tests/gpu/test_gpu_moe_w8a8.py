"""GPU (H200) checks of the W8A8 path of block-wise FP8 experts (ops/moe/w8a8_ops.py, kernels_src/moe/w8a8.py; the
MoE block's grouped path at every M with a workspace made with w8a8=True) on Qwen3.6-35B-A3B's shapes (E = 256
routed + the shared expert as expert 256, k = 8, H = 2048, I = 512):

- sparse_moe_block at M in {8, 200, 512, 2048, 8192} (8 and 200: the M rule's block_m 16) in each mode ("w8a8":
  h quantized in the gate_up epilogue, block_m 64; "w8a8_unfused": h written as bf16 then quantized, block_m 64 and
  128; the default, bitwise equal to its mode forced at W8A8_BLOCK_M) vs a float64 block that quantizes x and h per row per 128 columns as the kernels do (the
  quantizers' formula, torch's e4m3 rounding) and vs the unquantized float64 block (what W8A16 computes): the
  emulated quantization must explain most of the error (check_quantized); two runs into a poisoned workspace
  bitwise equal;
- capture + replay == eager (torch's and vkc's capture APIs) at M = 512 and 2048;
- each compiled grouped kernel (down, gate_up, gate_up_q at each block_m) over a device align of router-like ids
  with adversarial entries (-1, E', 2^31 - 1, -2^31), in sentinel arenas: selected rows vs float64, rows of dropped
  pairs (and their output multipliers) keep their poisoned bytes, no byte around any tensor written.
Weights: finite random e4m3 bytes with a random multiplier per 128 x 128 block (tests/gpu/test_gpu_moe_quant.py)."""
from __future__ import annotations

import pytest

from tests import bounds_cases as B
from tests.gpu.test_gpu_moe import E, H, I, K, _capture_equal_eager, _poison_ws, near_ties, ref_route
from tests.gpu.test_gpu_moe import router_inputs
from tests.gpu.test_gpu_moe_decode import _ids
from tests.gpu.test_gpu_moe_quant import experts, in_arena

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

FP8_MAX, MIN_SCALE, GROUP = 448.0, 1.0 / (448.0 * 512.0), 128


@pytest.fixture(scope="module")
def moe():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import moe
    from vkc_runtime.ops.moe import w8a8_ops
    if not w8a8_ops.available():
        pytest.skip("this device's artifacts have no W8A8 kernels (not an FP8 arch)")
    return moe


@pytest.fixture(scope="module")
def weights(moe):
    w1, W1 = experts(moe, "fp8", 31, E + 1, 2 * I, H, True)
    w2, W2 = experts(moe, "fp8", 32, E + 1, H, I, False)
    return w1, W1, w2, W2


def quant_deq(v):
    """v [rows, C] -> its per-row-per-128-column e4m3 quantization, dequantized (float64): the quantizers' formula
    (scale = max(amax / 448, MIN_SCALE) in fp32, q = satfinite(rn(v / scale)))."""
    rows, C = v.shape
    g = v.float().view(rows, C // GROUP, GROUP)
    s = torch.clamp(g.abs().amax(-1, keepdim=True) / FP8_MAX, min=MIN_SCALE)
    q = torch.clamp(g / s, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.double() * s.double()).view(rows, C)


def ref_block(x, gw, sg, W1, W2, quant: str | None):
    """The block in float64: quant None (unquantized activations), "fused" (h quantized from fp32) or "unfused"
    (h rounded to bf16 first); each pick's down row rounded to bf16 as the grouped path writes y."""
    ids, w, _ = ref_route(x, gw, K, True, sg)
    X = quant_deq(x) if quant else x.double()
    out = torch.zeros_like(x, dtype=torch.float64)
    for e in torch.unique(ids).tolist():
        m, j = torch.nonzero(ids == e, as_tuple=True)
        gu = X[m] @ W1[e].T
        h = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        if quant == "unfused":
            h = h.to(torch.bfloat16)
        if quant:
            h = quant_deq(h)
        y = (h @ W2[e].T).to(torch.bfloat16).double()
        out.index_add_(0, m, y * w[m, j][:, None])
    return out


def _poison(ws):
    _poison_ws(ws)
    for a in (ws.xq, ws.xs, ws.hq, ws.hs):
        a.fill_bytes(0xFF)


def _run(moe, x, gw, sg, w1, w2, ws, mode=None, bm=None):
    out = torch.full(x.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    moe.sparse_moe_block(x, gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out,
                         path="grouped", _fp8_mode=mode, _block_m=bm)
    torch.cuda.synchronize()
    return out


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def check_quantized(out, emu, full, ok, tag):
    """``out`` vs the block with the kernels' quantization emulated (``emu``) and without it (``full``), rows ``ok``.
    The emulation cannot be exact: the FP8 MMAs accumulate a 128-wide slice with fewer bits than fp32 (h off by
    ~1e-3 relative), which moves some of h's e4m3 roundings by one step; so the check is that the emulated
    quantization explains most of the error (a wrong multiplier, slice or group gives errors of the order of the
    output, a quantization step skipped or added one of the order of e_full)."""
    e_emu, e_full = _rel(out[ok], emu[ok]), _rel(out[ok], full[ok])
    print(f"{tag}: rel err vs the emulated-quantization block {e_emu:.2e}, vs the unquantized block {e_full:.2e}")
    assert torch.isfinite(out.float()).all(), tag
    assert e_full < 6e-2, (tag, e_full)  # two e4m3 roundings of the activations (3 mantissa bits)
    assert e_emu < 1.5e-2 and e_emu < 0.5 * e_full, (tag, e_emu, e_full)


@pytest.mark.parametrize("M", (8, 200, 512, 2048, 8192))  # 8 / 200: the M rule's block_m 16, W8A8 still runs
@pytest.mark.parametrize("mode,bm", [(None, None), ("w8a8", 64), ("w8a8_unfused", 64), ("w8a8_unfused", 128)])
def test_block_w8a8_vs_float64(moe, weights, M, mode, bm):
    w1, W1, w2, W2 = weights
    x, gw, sg = router_inputs(M, 1300 + M)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True, w8a8=True)
    assert ws.xq is not None
    got_mode = moe.fp8_mode("fp8", bm or moe.W8A8_BLOCK_M, ws, mode)
    assert got_mode != "w8a16" and moe.choose_path(M, "fp8") == "grouped"
    _poison(ws)
    out = _run(moe, x, gw, sg, w1, w2, ws, mode, bm)
    ok = ~near_ties(ref_route(x, gw, K, True, sg)[2], K)
    emu = ref_block(x, gw, sg, W1, W2, None if got_mode == "w8a16" else
                    "fused" if got_mode == "w8a8" else "unfused")
    tag = f"M={M} {got_mode} block_m={bm or moe.W8A8_BLOCK_M}"
    check_quantized(out, emu, ref_block(x, gw, sg, W1, W2, None), ok, tag)
    _poison(ws)
    again = _run(moe, x, gw, sg, w1, w2, ws, mode, bm)
    assert torch.equal(out.view(torch.uint16), again.view(torch.uint16)), "not deterministic / poisoned workspace"
    if mode is None:  # the default: the rule's mode grouped by W8A8_BLOCK_M rows whatever block_m_for says
        forced = _run(moe, x, gw, sg, w1, w2, ws, got_mode, moe.W8A8_BLOCK_M)
        assert torch.equal(out.view(torch.uint16), forced.view(torch.uint16)), "default != its forced mode and tile"


@pytest.mark.parametrize("M", (512, 2048))
def test_block_w8a8_graph_replay_equals_eager(moe, weights, M):
    w1, W1, w2, W2 = weights
    x, gw, sg = router_inputs(M, 1400 + M)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True, w8a8=True)
    assert moe.fp8_mode("fp8", moe.block_m_for(M, K + 1, E + 1), ws) != "w8a16"
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")

    def call(s):
        moe.sparse_moe_block(x, gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out, stream=s)

    call(torch.cuda.current_stream().cuda_stream)
    (eager,) = _capture_equal_eager(call, lambda: _poison(ws), [out])
    mode = moe.fp8_mode("fp8", moe.W8A8_BLOCK_M, ws)
    emu = ref_block(x, gw, sg, W1, W2, "fused" if mode == "w8a8" else "unfused")
    check_quantized(eager, emu, ref_block(x, gw, sg, W1, W2, None), ~near_ties(ref_route(x, gw, K, True, sg)[2], K),
                    f"captured W8A8 block M={M}")


def _cases():
    from vkc_runtime.ops.moe import w8a8_ops as W
    return [(bm, kn, bn) for bm, per in W.TILES.items() for kn, bns in per.items() for bn in bns]


@pytest.mark.parametrize("block_m,kernel,bn", _cases())
def test_grouped_w8a8_kernel_bad_ids(moe, block_m, kernel, bn):
    """One grouped W8A8 GEMM over a device align of router-like ids with bad entries, every operand a view in a
    sentinel arena, outputs poisoned: selected rows vs float64, dropped rows untouched."""
    from vkc_runtime.ops.moe import w8a8_ops as W
    M, k, Ep = 64, K + 1, 17
    seed = 1500 + block_m + bn + len(kernel)
    g = torch.Generator(device="cuda").manual_seed(seed)
    ar = B.Arena(seed, "cuda")
    ids = _ids(g, M, k, Ep)
    act = None if kernel == "down" else "silu_mul"
    quant = kernel == "gate_up_q"
    R, K_ = (2 * I, H) if act else (H, I)
    w, Wd = experts(moe, "fp8", seed + 1, Ep, R, K_, act is not None)
    w = in_arena(ar, w)
    P = M * k
    div = k if act else 1
    rows = -(-P // div)
    a_bits = torch.randint(0, 256, (rows, K_), dtype=torch.uint8, device="cuda", generator=g)
    a_bits[(a_bits & 0x7F) == 0x7F] = 0x38
    sa = torch.rand(rows, K_ // GROUP, device="cuda", generator=g) * 0.1 + 0.01
    A = a_bits.view(torch.float8_e4m3fn).double() * sa.double().repeat_interleave(GROUP, 1)
    a, sa = ar.put(a_bits), ar.put(sa)
    cap = moe.align_capacity(P, Ep, block_m)
    st, bt, nt = ar.poison((cap,), torch.int32), ar.poison((cap // block_m,), torch.int32), ar.poison((1,), torch.int32)
    ws = moe.moe_workspace(M, Ep - 1, k - 1, H, I, shared=True)
    moe.align(ar.put(ids), Ep, block_m, sorted_ids=st, block_expert=bt, num_padded=nt, workspace=ws)
    N_ = R // 2 if act else R
    out = ar.poison((P, N_), torch.uint8 if quant else torch.bfloat16)
    osc = ar.poison((P, N_ // GROUP), torch.float32) if quant else None
    before = out.clone(), (osc.clone() if quant else None)
    W.grouped_gemm_w8a8(a, sa, w, st, bt, nt, a_row_div=div, out=out, out_scale=osc, block_m=block_m, act=act,
                        _tile=bn)
    torch.cuda.synchronize()
    ar.check()
    flat = ids.view(-1).tolist()
    sel = [f for f in range(P) if 0 <= flat[f] < Ep]
    dropped = [f for f in range(P) if f not in sel]
    assert dropped and sel
    assert torch.equal(out[dropped].view(torch.uint8), before[0][dropped].view(torch.uint8)), "a dropped row written"
    ref = torch.stack([Wd[flat[f]] @ A[f // div] for f in sel])
    if act:
        ref = torch.nn.functional.silu(ref[:, :N_]) * ref[:, N_:]
    if quant:
        assert torch.equal(osc[dropped], before[1][dropped]), "a dropped row's multipliers written"
        s = osc[sel]
        want = torch.clamp(ref.float().view(len(sel), -1, GROUP).abs().amax(-1) / FP8_MAX, min=MIN_SCALE)
        torch.testing.assert_close(s, want, rtol=3e-3, atol=0)  # h's amax: the FP8 MMAs' accumulation (above)
        got = out[sel].view(torch.float8_e4m3fn).double() * s.double().repeat_interleave(GROUP, 1)
    else:
        got = out[sel].double()
    err = _rel(got, ref)
    print(f"grouped W8A8 {kernel} block_m={block_m} BLOCK_N={bn}: rel err {err:.3e}")
    assert err < (4e-2 if quant else 1e-2), err
