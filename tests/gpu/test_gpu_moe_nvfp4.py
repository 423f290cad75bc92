"""GPU (H200) checks of NVFP4 experts (W4A16: ops/moe/nvfp4_ops.py, kernels_src/moe/nvfp4.py) on Qwen3.6-35B-A3B's
shapes (E = 256 routed + the shared expert as expert 256, k = 8, H = 2048, I = 512):

- sparse_moe_block with Nvfp4Experts at M in {1, 3, 16, 100, 2048} (decode path at M <= DECODE_MAX_M, grouped
  above) vs the float64 block of the dequantized weights (a different multiplier per expert and per gate / up),
  and vs the same block on the bf16 dequantized weights (exact in bf16: alpha a power of two); two runs into a
  poisoned workspace bitwise equal;
- capture + replay == eager (torch's and vkc's capture APIs) at M = 1, 4 and 256;
- each decode kernel with every compiled tile and the grouped kernel at each block_m, on views inside sentinel
  arenas: adversarial ids give zero h rows / no contribution (their h rows and weights NaN), no byte around any
  tensor written; compute-sanitizer runs these under tools/gpu/run.sh memcheck."""
from __future__ import annotations

import pytest

from tests import bounds_cases as B
from tests.gpu.test_gpu_moe import (E, H, I, K, _capture_equal_eager, _poison_ws, close_rows, near_ties, ref_route,
                                    router_inputs)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@pytest.fixture(scope="module")
def moe():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import moe
    return moe


def nvfp4_experts(moe, seed, Ep, R, K_, n_alpha, pow2=False):
    """Random codes, e4m3 scales (2^-3 .. 2^0, random signs, some zero / subnormal), alpha per expert and
    module (powers of two with ``pow2``): (Nvfp4Experts, float64 weights [Ep, R, K_])."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    codes = torch.randint(0, 256, (Ep, R, K_ // 2), dtype=torch.uint8, device="cuda", generator=g)
    sc = torch.randint(0x20, 0x39, (Ep, R, K_ // 16), dtype=torch.int32, device="cuda", generator=g)
    sc |= torch.randint(0, 2, sc.shape, device="cuda", generator=g, dtype=torch.int32) << 7
    sc[..., 3] = 0
    sc[..., 5] = 3
    sc = sc.to(torch.uint8)
    if pow2:
        alpha = 2.0 ** -torch.randint(5, 9, (Ep, n_alpha), device="cuda", generator=g).float()
    else:
        alpha = torch.rand(Ep, n_alpha, device="cuda", generator=g) * 0.05 + 0.02
    t = torch.tensor(TABLE, dtype=torch.float64, device="cuda")
    vals = torch.stack([t[(codes & 15).long()], t[(codes >> 4).long()]], -1).reshape(Ep, R, K_)
    sf = sc.view(torch.float8_e4m3fn).double().repeat_interleave(16, dim=-1)
    half = R // n_alpha
    a = alpha.double().repeat_interleave(half, dim=1)[:, :, None]
    return moe.Nvfp4Experts(codes, sc, alpha), vals * sf * a


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


@pytest.fixture(scope="module")
def weights(moe):
    q1, W1 = nvfp4_experts(moe, 11, E + 1, 2 * I, H, 2, pow2=True)
    q2, W2 = nvfp4_experts(moe, 12, E + 1, H, I, 1, pow2=True)
    return q1, W1, q2, W2


def run(moe, x, gw, w1, w2, sg, ws, path=None):
    out = torch.full(x.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    moe.sparse_moe_block(x, gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out, path=path)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("M", (1, 3, 16, 100, 2048))
def test_block_nvfp4_vs_float64_and_bf16(moe, weights, M):
    q1, W1, q2, W2 = weights
    x, gw, sg = router_inputs(M, 700 + M)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    _poison_ws(ws)
    out = run(moe, x, gw, q1, q2, sg, ws)
    ref = ref_block64(x, gw, W1, W2, K, sg)
    _, _, p = ref_route(x, gw, K, True, sg)
    ok = ~near_ties(p, K)
    close_rows(out, ref, ok, f"nvfp4 block M={M} ({moe.choose_path(M)})")
    _poison_ws(ws)
    again = run(moe, x, gw, q1, q2, sg, ws)
    assert torch.equal(out.view(torch.uint16), again.view(torch.uint16)), "not deterministic / poisoned workspace"
    bf = run(moe, x, gw, W1.to(torch.bfloat16), W2.to(torch.bfloat16), sg, ws)  # exact: alpha powers of two
    rel = ((out.double() - bf.double()).norm() / bf.double().norm()).item()
    print(f"M={M}: NVFP4 vs bf16 dequantized relative error {rel:.3e}")
    assert rel < 1e-2
    if M <= 16:  # the other path on the same inputs
        other = "grouped" if moe.choose_path(M) == "decode" else "decode"
        o2 = run(moe, x, gw, q1, q2, sg, ws, path=other)
        close_rows(o2, out.double(), torch.ones(M, dtype=torch.bool, device="cuda"), f"nvfp4 {other} M={M}")


@pytest.mark.parametrize("M", (1, 4, 256))
def test_block_nvfp4_graph_replay_equals_eager(moe, weights, M):
    q1, W1, q2, W2 = weights
    x, gw, sg = router_inputs(M, 800 + M)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")

    def call(s):
        moe.sparse_moe_block(x, gw, q1, q2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out, stream=s)

    call(torch.cuda.current_stream().cuda_stream)
    (eager,) = _capture_equal_eager(call, lambda: _poison_ws(ws), [out])
    ref = ref_block64(x, gw, W1, W2, K, sg)
    _, _, p = ref_route(x, gw, K, True, sg)
    close_rows(eager, ref, ~near_ties(p, K), f"captured nvfp4 block M={M}")


def _ids(g, M, k, Ep):
    ids = torch.rand(M, Ep - 1, generator=g, device="cuda").argsort(1)[:, :k - 1]
    ids = torch.cat([ids, torch.full((M, 1), Ep - 1, device="cuda", dtype=torch.long)], 1)
    for i, v in enumerate([-1, Ep, 2**31 - 1, -2**31]):
        ids[i % M, (3 * i) % k] = v
    return ids.to(torch.int32)


def _arena_experts(ar, q):
    return type(q)(ar.put(q.codes), ar.put(q.scales), ar.put(q.alpha))


@pytest.mark.parametrize("tile", [0, 1, 2])
def test_decode_kernels_bad_ids_and_guard_bytes(moe, tile):
    """The real H and I with E' = 17 experts in sentinel arenas, M = 4, k' = 9, four adversarial ids."""
    from vkc_runtime.ops.moe import decode_ops as D, nvfp4_ops as N
    M, k, Ep = 4, K + 1, 17
    g = torch.Generator(device="cuda").manual_seed(950 + tile)
    ar = B.Arena(950 + tile, "cuda")
    ids = _ids(g, M, k, Ep)
    bad = ~((ids >= 0) & (ids < Ep))
    flat_bad = bad.view(-1)
    q1, W1 = nvfp4_experts(moe, 960 + tile, Ep, 2 * I, H, 2)
    q2, W2 = nvfp4_experts(moe, 970 + tile, Ep, H, I, 1)
    q1, q2 = _arena_experts(ar, q1), _arena_experts(ar, q2)
    x = ar.put(torch.randn(M, H, generator=g, device="cuda").to(torch.bfloat16))
    it = ar.put(ids)
    h = ar.poison((M * k, I), torch.bfloat16)
    D.decode_gate_up(x, q1, it, out=h, _tile=N.TILES["gate_up"][tile])
    torch.cuda.synchronize()
    ar.check()
    assert torch.equal(h[flat_bad].float(), torch.zeros_like(h[flat_bad].float())), "a bad id's h row is not 0"
    xd = x.double()
    ref_h = torch.zeros(M * k, I, dtype=torch.float64, device="cuda")
    for f in range(M * k):
        e = int(ids.view(-1)[f])
        if 0 <= e < Ep:
            gu = W1[e] @ xd[f // k]
            ref_h[f] = torch.nn.functional.silu(gu[:I]) * gu[I:]
    ok = ~flat_bad
    err = ((h.double() - ref_h)[ok].norm() / ref_h[ok].norm()).item()
    assert err < 1e-2, err
    hn = ar.put(torch.where(flat_bad[:, None], float("nan"), h.float()).to(torch.bfloat16))
    wts = torch.rand(M, k, generator=g, device="cuda") + 0.1
    wts[bad] = float("nan")
    out = ar.poison((M, H), torch.bfloat16)
    D.decode_down(hn, q2, it, ar.put(wts), out=out, _tile=N.TILES["down"][tile])
    torch.cuda.synchronize()
    ar.check()
    ref = torch.zeros(M, H, dtype=torch.float64, device="cuda")
    hd = h.double()
    for f in range(M * k):
        e = int(ids.view(-1)[f])
        if 0 <= e < Ep:
            ref[f // k] += wts.view(-1)[f].double() * (W2[e] @ hd[f])
    assert torch.isfinite(out.float()).all()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err


@pytest.mark.parametrize("block_m", [16, 64, 128])
@pytest.mark.parametrize("act", [None, "silu_mul"])
def test_grouped_nvfp4_kernel(moe, block_m, act):
    """One grouped W4A16 GEMM over a device align of router-like ids with bad entries, in sentinel arenas:
    selected rows vs float64, rows of dropped pairs keep their poisoned bytes."""
    from vkc_runtime.ops.moe import grouped_ops as G
    M, k, Ep = 64, K + 1, 17
    g = torch.Generator(device="cuda").manual_seed(990 + block_m)
    ar = B.Arena(990 + block_m, "cuda")
    ids = _ids(g, M, k, Ep)
    R, K_ = (2 * I, H) if act else (H, I)
    q, W = nvfp4_experts(moe, 991 + block_m, Ep, R, K_, 2 if act else 1)
    q = _arena_experts(ar, q)
    P = M * k
    div = k if act else 1
    a = ar.put(torch.randn(-(-P // div), K_, generator=g, device="cuda").to(torch.bfloat16))
    cap = moe.align_capacity(P, Ep, block_m)
    st = ar.poison((cap,), torch.int32)
    bt = ar.poison((cap // block_m,), torch.int32)
    nt = ar.poison((1,), torch.int32)
    ws = moe.moe_workspace(M, Ep - 1, k - 1, H, I, shared=True)
    it = ar.put(ids)
    moe.align(it, Ep, block_m, sorted_ids=st, block_expert=bt, num_padded=nt, workspace=ws)
    N_ = R // 2 if act else R
    out = ar.poison((P, N_), torch.bfloat16)
    before = out.clone()
    G.grouped_gemm(a, q, st, bt, nt, a_row_div=div, out=out, block_m=block_m, act=act)
    torch.cuda.synchronize()
    ar.check()
    flat = ids.view(-1).tolist()
    ad = a.double()
    sel = [f for f in range(P) if 0 <= flat[f] < Ep]
    for f in range(P):
        if f not in sel:
            assert torch.equal(out[f].view(torch.uint8), before[f].view(torch.uint8)), f"row {f} written"
    ref = torch.stack([W[flat[f]] @ ad[f // div] for f in sel])
    if act:
        ref = torch.nn.functional.silu(ref[:, :N_]) * ref[:, N_:]
    got = out[sel].double()
    err = ((got - ref).norm() / ref.norm()).item()
    print(f"grouped nvfp4 block_m={block_m} act={act}: rel err {err:.3e}")
    assert err < 1e-2, err
