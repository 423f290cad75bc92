"""GPU (H200) checks of quantized experts kept quantized on the device -- NVFP4 (W4A16: ops/moe/nvfp4_ops.py,
kernels_src/moe/nvfp4.py; and packed into the MMA layout by ops.moe.pack_experts, "nvfp4_mma": ops/moe/nvfp4_mma_ops.py,
kernels_src/moe/nvfp4_mma.py) and block-wise FP8 (W8A16: ops/moe/fp8_ops.py, kernels_src/moe/fp8.py) -- on
Qwen3.6-35B-A3B's shapes (E = 256 routed + the shared expert as expert 256, k = 8, H = 2048, I = 512), each test
once per kind:

- sparse_moe_block at M in {1, 3, 16, 100, 2048} (decode path at M <= DECODE_MAX_M, grouped above) vs the float64
  block of the dequantized weights, and vs the same block on the bf16 dequantized weights (exact: power-of-two
  multipliers); two runs into a poisoned workspace bitwise equal; the other path on the same inputs at M <= 16;
- capture + replay == eager (torch's and vkc's capture APIs) at M = 1, 4 and 256;
- each decode kernel with every compiled tile and the grouped kernel at each block_m and act, on views inside
  sentinel arenas: adversarial ids give zero h rows / no contribution (their h rows and weights NaN), rows of
  dropped pairs keep their bytes, no byte around any tensor written.
Random weights: NVFP4 any code byte, e4m3 group scales 2^-3 .. 2^0 with random signs and some zero / subnormal, a
multiplier per expert and per gate / up half; FP8 finite e4m3 bytes, a scale per 128 x 128 block."""
from __future__ import annotations

import pytest

from tests import bounds_cases as B
from tests.gpu.test_gpu_moe import (E, H, I, K, _capture_equal_eager, _poison_ws, close_rows, near_ties, ref_route,
                                    router_inputs)
from tests.gpu.test_gpu_moe_decode import _ids, check_pairs_down, check_pairs_h

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

KINDS = ("nvfp4", "nvfp4_mma", "fp8")
TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@pytest.fixture(scope="module")
def moe():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import moe
    return moe


def experts(moe, kind, seed, Ep, R, K_, gate_up, pow2=False):
    """Random experts of ``kind`` [Ep, R, K_] (module doc): (the op's weight object, float64 weights)."""
    if kind == "nvfp4_mma":  # the same random NVFP4 experts, packed on the device
        lin, W = experts(moe, "nvfp4", seed, Ep, R, K_, gate_up, pow2)
        wshape, sshape = moe.nvfp4_mma_shapes(Ep, R, K_)
        words = torch.full(wshape, -1, dtype=torch.int32, device="cuda")
        scales = torch.full(sshape, -1, dtype=torch.int32, device="cuda")
        return moe.pack_experts(lin, words, scales, gate_up=gate_up), W
    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "fp8":
        q = torch.randint(0, 256, (Ep, R, K_), dtype=torch.uint8, device="cuda", generator=g)
        q[(q & 0x7F) == 0x7F] = 0x3C
        shape = (Ep, -(-R // 128), -(-K_ // 128))
        sc = (2.0 ** -torch.randint(6, 10, shape, device="cuda", generator=g).float() if pow2 else
              torch.rand(shape, device="cuda", generator=g) * 0.01 + 0.002)
        full = sc.double().repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :R, :K_]
        return moe.Fp8Experts(q, sc), q.view(torch.float8_e4m3fn).double() * full
    n_alpha = 2 if gate_up else 1
    codes = torch.randint(0, 256, (Ep, R, K_ // 2), dtype=torch.uint8, device="cuda", generator=g)
    sc = torch.randint(0x20, 0x39, (Ep, R, K_ // 16), dtype=torch.int32, device="cuda", generator=g)
    sc |= torch.randint(0, 2, sc.shape, device="cuda", generator=g, dtype=torch.int32) << 7
    sc[..., 3] = 0
    sc[..., 5] = 3
    sc = sc.to(torch.uint8)
    alpha = (2.0 ** -torch.randint(5, 9, (Ep, n_alpha), device="cuda", generator=g).float() if pow2 else
             torch.rand(Ep, n_alpha, device="cuda", generator=g) * 0.05 + 0.02)
    t = torch.tensor(TABLE, dtype=torch.float64, device="cuda")
    vals = torch.stack([t[(codes & 15).long()], t[(codes >> 4).long()]], -1).reshape(Ep, R, K_)
    sf = sc.view(torch.float8_e4m3fn).double().repeat_interleave(16, dim=-1)
    a = alpha.double().repeat_interleave(R // n_alpha, dim=1)[:, :, None]
    return moe.Nvfp4Experts(codes, sc, alpha), vals * sf * a


def in_arena(ar, w):
    return type(w)(*(ar.put(t) if torch.is_tensor(t) else t for t in w))


def ref_block64(x, gw, W1, W2, k, sg):
    ids, w, _ = ref_route(x, gw, k, True, sg)
    xd = x.double()
    out = torch.zeros_like(xd)
    for e in torch.unique(ids).tolist():
        m, j = torch.nonzero(ids == e, as_tuple=True)
        gu = xd[m] @ W1[e].T
        hh = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
        out.index_add_(0, m, (hh @ W2[e].T) * w[m, j][:, None])
    return out


@pytest.fixture(scope="module", params=KINDS)
def weights(moe, request):
    kind = request.param
    w1, W1 = experts(moe, kind, 11, E + 1, 2 * I, H, True, pow2=True)
    w2, W2 = experts(moe, kind, 12, E + 1, H, I, False, pow2=True)
    return kind, w1, W1, w2, W2


def run(moe, x, gw, w1, w2, sg, ws, path=None):
    out = torch.full(x.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    moe.sparse_moe_block(x, gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out, path=path)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("M", (1, 3, 16, 100, 2048))
def test_block_vs_float64_and_bf16(moe, weights, M):
    kind, w1, W1, w2, W2 = weights
    x, gw, sg = router_inputs(M, 700 + M)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    _poison_ws(ws)
    out = run(moe, x, gw, w1, w2, sg, ws)
    ref = ref_block64(x, gw, W1, W2, K, sg)
    _, _, p = ref_route(x, gw, K, True, sg)
    close_rows(out, ref, ~near_ties(p, K), f"{kind} block M={M} ({moe.choose_path(M, kind)})")
    _poison_ws(ws)
    again = run(moe, x, gw, w1, w2, sg, ws)
    assert torch.equal(out.view(torch.uint16), again.view(torch.uint16)), "not deterministic / poisoned workspace"
    bf = run(moe, x, gw, W1.to(torch.bfloat16), W2.to(torch.bfloat16), sg, ws)
    rel = ((out.double() - bf.double()).norm() / bf.double().norm()).item()
    print(f"{kind} M={M}: vs the bf16 dequantized block relative error {rel:.3e}")
    assert rel < 1e-2
    if M <= 16:
        other = "grouped" if moe.choose_path(M, kind) == "decode" else "decode"
        o2 = run(moe, x, gw, w1, w2, sg, ws, path=other)
        close_rows(o2, out.double(), torch.ones(M, dtype=torch.bool, device="cuda"), f"{kind} {other} M={M}")


@pytest.mark.parametrize("M", (1, 4, 256))
def test_block_graph_replay_equals_eager(moe, weights, M):
    kind, w1, W1, w2, W2 = weights
    x, gw, sg = router_inputs(M, 800 + M)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")

    def call(s):
        moe.sparse_moe_block(x, gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out, stream=s)

    call(torch.cuda.current_stream().cuda_stream)
    (eager,) = _capture_equal_eager(call, lambda: _poison_ws(ws), [out])
    ref = ref_block64(x, gw, W1, W2, K, sg)
    _, _, p = ref_route(x, gw, K, True, sg)
    close_rows(eager, ref, ~near_ties(p, K), f"captured {kind} block M={M}")


def _nth(tiles, i):
    """The i-th compiled tile of a kernel, wrapping around (the kernels have 3 to 5)."""
    return tiles[i % len(tiles)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tile", [0, 1, 2, 3, 4])
def test_decode_kernels_bad_ids_and_guard_bytes(moe, kind, tile):
    """The real H and I with E' = 17 experts in sentinel arenas, M = 4, k' = 9, four adversarial ids."""
    from vkc_runtime.ops.moe import decode_ops as D, experts as X
    M, k, Ep = 4, K + 1, 17
    g = torch.Generator(device="cuda").manual_seed(950 + tile)
    ar = B.Arena(950 + tile, "cuda")
    ids = _ids(g, M, k, Ep)
    bad = ~((ids >= 0) & (ids < Ep))
    flat_bad = bad.view(-1)
    w1, W1 = experts(moe, kind, 960 + tile, Ep, 2 * I, H, True)
    w2, W2 = experts(moe, kind, 970 + tile, Ep, H, I, False)
    w1, w2 = in_arena(ar, w1), in_arena(ar, w2)
    x = ar.put(torch.randn(M, H, generator=g, device="cuda").to(torch.bfloat16))
    it = ar.put(ids)
    h = ar.poison((M * k, I), torch.bfloat16)
    D.decode_gate_up(x, w1, it, out=h, _tile=_nth(X.module(kind).TILES["gate_up"], tile))
    torch.cuda.synchronize()
    ar.check()
    assert torch.equal(h[flat_bad].float(), torch.zeros_like(h[flat_bad].float())), "a bad id's h row is not 0"
    check_pairs_h(h, x, W1, ids, k, Ep, I, flat_bad)
    hn = ar.put(torch.where(flat_bad[:, None], float("nan"), h.float()).to(torch.bfloat16))
    wts = torch.rand(M, k, generator=g, device="cuda") + 0.1
    wts[bad] = float("nan")
    out = ar.poison((M, H), torch.bfloat16)
    D.decode_down(hn, w2, it, ar.put(wts), out=out, _tile=_nth(X.module(kind).TILES["down"], tile))
    torch.cuda.synchronize()
    ar.check()
    check_pairs_down(out, h, W2, ids, wts, k, Ep)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block_m", [16, 64, 128])
@pytest.mark.parametrize("act", [None, "silu_mul"])
def test_grouped_kernel(moe, kind, block_m, act):
    """One grouped GEMM over a device align of router-like ids with bad entries, in sentinel arenas: selected rows
    vs float64, rows of dropped pairs keep their poisoned bytes."""
    from vkc_runtime.ops.moe import grouped_ops as G
    M, k, Ep = 64, K + 1, 17
    g = torch.Generator(device="cuda").manual_seed(990 + block_m)
    ar = B.Arena(990 + block_m, "cuda")
    ids = _ids(g, M, k, Ep)
    R, K_ = (2 * I, H) if act else (H, I)
    w, W = experts(moe, kind, 991 + block_m, Ep, R, K_, act is not None)
    w = in_arena(ar, w)
    P = M * k
    div = k if act else 1
    a = ar.put(torch.randn(-(-P // div), K_, generator=g, device="cuda").to(torch.bfloat16))
    cap = moe.align_capacity(P, Ep, block_m)
    st = ar.poison((cap,), torch.int32)
    bt = ar.poison((cap // block_m,), torch.int32)
    nt = ar.poison((1,), torch.int32)
    ws = moe.moe_workspace(M, Ep - 1, k - 1, H, I, shared=True)
    moe.align(ar.put(ids), Ep, block_m, sorted_ids=st, block_expert=bt, num_padded=nt, workspace=ws)
    N_ = R // 2 if act else R
    out = ar.poison((P, N_), torch.bfloat16)
    before = out.clone()
    G.grouped_gemm(a, w, st, bt, nt, a_row_div=div, out=out, block_m=block_m, act=act)
    torch.cuda.synchronize()
    ar.check()
    flat = ids.view(-1).tolist()
    sel = [f for f in range(P) if 0 <= flat[f] < Ep]
    dropped = [f for f in range(P) if f not in sel]
    assert torch.equal(out[dropped].view(torch.uint8), before[dropped].view(torch.uint8)), "a dropped row written"
    ad = a.double()
    ref = torch.stack([W[flat[f]] @ ad[f // div] for f in sel])
    if act:
        ref = torch.nn.functional.silu(ref[:, :N_]) * ref[:, N_:]
    err = ((out[sel].double() - ref).norm() / ref.norm()).item()
    print(f"grouped {kind} block_m={block_m} act={act}: rel err {err:.3e}")
    assert err < 1e-2, err
