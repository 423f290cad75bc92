"""GPU (H200) checks of the moe family (vkc_runtime.ops.moe) on Qwen3.6-35B-A3B's shapes (E = 256 routed
experts + the shared one folded in as expert 256, k = 8, H = 2048, I = 512) for M in {1, 3, 16, 100, 2048}:

- route vs a float64 torch router (ids exactly except near-ties, which are counted and printed; weights;
  renormalise on/off; the shared fold); exact ties -> the lower id;
- align: every invariant (tests/refs_moe.check_align) on poisoned buffers inside sentinel arenas, invalid ids,
  all pairs to one expert, empty experts, the one- and two-launch paths;
- combine vs float64;
- route + align + combine captured in a graph (torch's and vkc's capture) replayed into poisoned outputs and
  workspace == eager, bytewise;
- sparse_moe_block (needs ops/moe/grouped_ops.py, helper moegemm's: skipped where absent) vs the float64
  reference and vs HF's Qwen3_5MoeSparseMoeBlock (a tiny random config and the real expert shapes), a poisoned
  workspace, graph replay == eager, all tokens to the same experts."""
from __future__ import annotations

import importlib.util

import pytest

from tests import bounds_cases as B, refs_moe as R

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

E, K, H, I = 256, 8, 2048, 512
MS = (1, 3, 16, 100, 2048)
HAS_GROUPED = importlib.util.find_spec("vkc_runtime.ops.moe.grouped_ops") is not None
needs_grouped = pytest.mark.skipif(not HAS_GROUPED, reason="vkc_runtime.ops.moe.grouped_ops not in this build")


@pytest.fixture(scope="module")
def moe():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import moe
    return moe


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def bf16(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)


def router_inputs(M, seed, E_=E, H_=H):
    g = gen(seed)
    return bf16(g, M, H_), bf16(g, E_, H_, scale=0.02), bf16(g, 1, H_, scale=0.02)


def ref_route(x, gw, k, renorm, sg=None):
    """float64 torch router: (ids [M, k'], weights, probs)."""
    p = torch.softmax(x.double() @ gw.double().T, dim=-1)
    srt, order = torch.sort(p, dim=-1, descending=True, stable=True)
    ids, w = order[:, :k], srt[:, :k]
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    if sg is not None:
        ids = torch.cat([ids, torch.full_like(ids[:, :1], gw.shape[0])], 1)
        w = torch.cat([w, torch.sigmoid(x.double() @ sg.double().T)], 1)
    return ids, w, p


def near_ties(p, k, rel=1e-5):
    s = torch.sort(p, dim=-1, descending=True).values[:, :k + 1]
    return ((s[:, :-1] - s[:, 1:]) <= rel * s[:, 1:]).any(-1)


def run_route(moe, x, gw, k, renorm, sg=None, ws=None):
    M = x.shape[0]
    kout = k + int(sg is not None)
    ids = torch.full((M, kout), -7, dtype=torch.int32, device="cuda")
    wts = torch.full((M, kout), float("nan"), device="cuda")
    moe.route(x, gw, k, renormalize=renorm, shared_gate_w=sg, topk_ids=ids, topk_weights=wts, workspace=ws)
    torch.cuda.synchronize()
    return ids, wts


def check_route(ids, wts, ref, tag, k=K):
    rid, rw, p = ref
    tie = near_ties(p, k)
    ok = ~tie
    if tie.any():
        print(f"{tag}: {int(tie.sum())} near-tie rows of {p.shape[0]} (ids compared as top-(k+2) membership)")
        top = torch.sort(p[tie], dim=-1, descending=True, stable=True).indices[:, :k + 2]
        for r, t in zip(ids[tie][:, :k].tolist(), top.tolist()):
            assert set(r) <= set(t), (r, t)
    assert torch.equal(ids[ok].long(), rid[ok]), tag
    torch.testing.assert_close(wts[ok].double(), rw[ok], rtol=2e-5, atol=2e-6)
    assert int(tie.sum()) <= max(2, p.shape[0] // 20), f"{tag}: too many near-ties"


@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("renorm,shared", [(True, True), (False, False), (True, False)])
def test_route_vs_float64(moe, M, renorm, shared):
    x, gw, sg = router_inputs(M, M)
    sg = sg if shared else None
    ws = moe.moe_workspace(M, E, K, H, I, shared=shared)
    ws.part.fill_bytes(0xFF)
    ids, wts = run_route(moe, x, gw, K, renorm, sg, ws)
    check_route(ids, wts, ref_route(x, gw, K, renorm, sg), f"M={M}")
    ids2, wts2 = run_route(moe, x, gw, K, renorm, sg)  # no workspace: allocated per call, same bits
    assert torch.equal(ids, ids2) and torch.equal(wts, wts2)


def test_route_exact_ties_lower_id(moe):
    """Small-integer data: logits exact in fp32 in any summation order; many exact ties among the picks."""
    g = gen(3)
    M = 64
    x = torch.randint(-2, 3, (M, H), generator=g, device="cuda").to(torch.bfloat16)
    gw = (torch.randint(-1, 2, (E, H), generator=g, device="cuda") / 64).to(torch.bfloat16)
    gw[7] = gw[3]
    gw[200] = gw[3]
    ids, wts = run_route(moe, x, gw, K, False)
    rid, rw, p = ref_route(x, gw, K, False)
    assert torch.equal(ids.long(), rid)
    torch.testing.assert_close(wts.double(), rw, rtol=1e-5, atol=0)


def run_align(moe, ar, ids, Ep, bm):
    M, k = ids.shape
    P = M * k
    cap = moe.align_capacity(P, Ep, bm)
    st, bt, nt = ar.poison((cap,), torch.int32), ar.poison((cap // bm,), torch.int32), ar.poison((1,), torch.int32)
    ws = moe.moe_workspace(M, Ep - 1, k - 1, 64, 16, shared=True)
    ws.hist.fill_bytes(0xFF)
    moe.align(ar.put(ids), Ep, bm, sorted_ids=st, block_expert=bt, num_padded=nt, workspace=ws)
    torch.cuda.synchronize()
    ar.check()
    return R.check_align(ids.cpu().numpy(), Ep, bm, st.cpu().numpy(), bt.cpu().numpy(), nt.cpu().numpy(), cap)


@pytest.mark.parametrize("M", MS + (8192,))
@pytest.mark.parametrize("case", ["router", "invalid", "one_expert", "few_experts"])
def test_align_invariants(moe, M, case):
    ar = B.Arena(M, "cuda")
    Ep, k = E + 1, K + 1
    g = gen(M + 1)
    ids = torch.randint(0, E, (M, k), generator=g, device="cuda", dtype=torch.int32)
    ids[:, -1] = E
    if case == "invalid":
        bad = torch.tensor([-1, Ep, 2**31 - 1, -2**31, 1000], dtype=torch.int32, device="cuda")
        flat = ids.view(-1)
        flat[::3] = bad.repeat(flat.numel())[:flat[::3].numel()]
    elif case == "one_expert":
        ids[:] = 17
    elif case == "few_experts":
        ids = torch.where(ids % 2 == 0, 0, 255).to(torch.int32)
    for bm in (16, 64):
        run_align(moe, ar, ids, Ep, bm)


@pytest.mark.parametrize("M", MS)
def test_combine_vs_float64(moe, M):
    g = gen(M + 2)
    k = K + 1
    ids = torch.randint(0, E + 1, (M, k), generator=g, device="cuda", dtype=torch.int32)
    ids.view(-1)[::7] = -1
    y = bf16(g, M * k, H)
    bad = ~((ids >= 0) & (ids <= E)).view(-1)
    y[bad] = float("nan")
    w = torch.rand(M, k, generator=g, device="cuda")
    out = torch.full((M, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    moe.combine(y, ids, w, E + 1, out=out)
    ok = (~bad).view(M, k).double()
    ref = torch.einsum("mk,mkh->mh", w.double() * ok, y.double().nan_to_num(0.0).view(M, k, H))
    torch.testing.assert_close(out.double(), ref, rtol=8e-3, atol=1e-2)


def _capture_equal_eager(call, poison, outs):
    """Capture call(stream) with torch's and vkc's capture APIs, replay into poisoned outputs/workspace: equal to
    an eager call bytewise."""
    from tests.gpu.test_gpu_capture import _capture
    eager = None
    for api in ("torch", "vkc"):
        replay, _keep = _capture(api, call)
        for _ in range(2):
            for o in outs:
                o.view(torch.uint8).fill_(0xFF)
            poison()
            torch.cuda.synchronize()
            replay()
            got = [o.clone() for o in outs]
            if eager is None:
                for o in outs:
                    o.view(torch.uint8).fill_(0xFF)
                poison()
                call(torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                eager = [o.clone() for o in outs]
            for a, b in zip(got, eager):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), "graph replay != eager"
    return eager


def _poison_ws(ws):
    for a in (ws.topk_ids, ws.topk_weights, ws.part, ws.hist, ws.sorted_ids, ws.block_expert, ws.num_padded,
              ws.h, ws.y):
        a.fill_bytes(0xFF)


@pytest.mark.parametrize("M", (1, 16, 2048))
def test_routing_pieces_graph_replay_equals_eager(moe, M):
    """route -> align -> combine (y from the caller) with a workspace, captured."""
    x, gw, sg = router_inputs(M, 40 + M)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    kout, Ep = K + 1, E + 1
    bm = moe.block_m_for(M, kout, Ep)
    cap = moe.align_capacity(M * kout, Ep, bm)
    ids = torch.empty(M, kout, dtype=torch.int32, device="cuda")
    wts = torch.empty(M, kout, device="cuda")
    st = torch.empty(cap, dtype=torch.int32, device="cuda")
    bt = torch.empty(cap // bm, dtype=torch.int32, device="cuda")
    nt = torch.empty(1, dtype=torch.int32, device="cuda")
    y = bf16(gen(1), M * kout, H)
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")

    def call(s):
        moe.route(x, gw, K, renormalize=True, shared_gate_w=sg, topk_ids=ids, topk_weights=wts, workspace=ws,
                  stream=s)
        moe.align(ids, Ep, bm, sorted_ids=st, block_expert=bt, num_padded=nt, workspace=ws, stream=s)
        moe.combine(y, ids, wts, Ep, out=out, stream=s)

    call(torch.cuda.current_stream().cuda_stream)  # eager warm-up (loads nothing new: the workspace did)
    _capture_equal_eager(call, lambda: _poison_ws(ws), [ids, wts, st, bt, nt, out])
    check_route(ids, wts, ref_route(x, gw, K, True, sg), f"captured M={M}")
    R.check_align(ids.cpu().numpy(), Ep, bm, st.cpu().numpy(), bt.cpu().numpy(), nt.cpu().numpy(), cap)


# ------------------------------------------------------------------------------------------- the whole block

def expert_weights(seed, Ep=E + 1, H_=H, I_=I, scale=0.02):
    g = gen(seed)
    return bf16(g, Ep, 2 * I_, H_, scale=scale), bf16(g, Ep, H_, I_, scale=scale)


def ref_block(x, gw, w1, w2, k, renorm, sg):
    """float64 torch block (the shared expert as expert E of w1 / w2)."""
    ids, w, _ = ref_route(x, gw, k, renorm, sg)
    xd = x.double()
    out = torch.zeros_like(xd)
    Ip = w2.shape[2]
    for e in torch.unique(ids).tolist():
        m, j = torch.nonzero(ids == e, as_tuple=True)
        gu = xd[m] @ w1[e].double().T
        hh = torch.nn.functional.silu(gu[:, :Ip]) * gu[:, Ip:]
        out.index_add_(0, m, (hh @ w2[e].double().T) * w[m, j][:, None])
    return out, ids


def run_block(moe, x, gw, w1, w2, k, sg, ws, renorm=True):
    out = torch.full(x.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    moe.sparse_moe_block(x, gw, w1, w2, k, renormalize=renorm, shared_gate_w=sg, workspace=ws, out=out)
    torch.cuda.synchronize()
    return out


def close_rows(out, ref, ok, tag, tol=2e-2):
    err = (out.double() - ref)[ok].abs().max().item()
    scale = ref[ok].abs().max().item()
    print(f"{tag}: max |err| {err:.3e} of max |ref| {scale:.3e}")
    assert err <= tol * scale, tag


@needs_grouped
@pytest.mark.parametrize("M", MS)
def test_block_vs_float64(moe, M):
    x, gw, sg = router_inputs(M, 100 + M)
    w1, w2 = expert_weights(M)
    ws = moe.moe_workspace(max(M, 16), E, K, H, I, shared=True)
    _poison_ws(ws)
    out = run_block(moe, x, gw, w1, w2, K, sg, ws)
    ref, _ = ref_block(x, gw, w1, w2, K, True, sg)
    _, _, p = ref_route(x, gw, K, True, sg)
    ok = ~near_ties(p, K)
    close_rows(out, ref, ok, f"block M={M}")
    _poison_ws(ws)
    again = run_block(moe, x, gw, w1, w2, K, sg, ws)
    assert torch.equal(out.view(torch.uint16), again.view(torch.uint16)), "not deterministic / poisoned workspace"


@needs_grouped
@pytest.mark.parametrize("M", (1, 4, 8, 2048))  # M <= ops.moe.DECODE_MAX_M (4): the decode path
def test_block_graph_replay_equals_eager(moe, M):
    x, gw, sg = router_inputs(M, 200 + M)
    w1, w2 = expert_weights(M + 1)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")

    def call(s):
        moe.sparse_moe_block(x, gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out, stream=s)

    call(torch.cuda.current_stream().cuda_stream)
    (eager,) = _capture_equal_eager(call, lambda: _poison_ws(ws), [out])
    ref, _ = ref_block(x, gw, w1, w2, K, True, sg)
    _, _, p = ref_route(x, gw, K, True, sg)
    close_rows(eager, ref, ~near_ties(p, K), f"captured block M={M}")


@needs_grouped
@pytest.mark.parametrize("M", (3, 100, 2048))
def test_block_all_tokens_to_the_same_experts(moe, M):
    """Experts 0..7 dominate every token's logits (248 experts get no pair; 8 get all M)."""
    x, gw, sg = router_inputs(M, 300 + M)
    u = torch.randn(H, generator=gen(7), device="cuda")
    u = u / u.norm()
    for e in range(K):  # logit of expert e ~ (1 - e / 20) * (12 + N(0, 1)) >= 5.5; the others ~ N(0, 0.94) < 4.6
        gw[e] = (u * (1.0 - 0.05 * e)).to(torch.bfloat16)
    x = (x.float() + 12 * u[None]).to(torch.bfloat16)
    w1, w2 = expert_weights(M + 2)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    _poison_ws(ws)
    out = run_block(moe, x, gw, w1, w2, K, sg, ws)
    ref, ids = ref_block(x, gw, w1, w2, K, True, sg)
    assert set(torch.unique(ids[:, :K]).tolist()) == set(range(K))
    close_rows(out, ref, torch.ones(M, dtype=torch.bool, device="cuda"), f"one-group block M={M}")


def hf_block(Ep_routed, k, H_, I_, seed, scale):
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as HM
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    cfg = Qwen3_5MoeTextConfig(hidden_size=H_, num_experts=Ep_routed, num_experts_per_tok=k, moe_intermediate_size=I_,
                               shared_expert_intermediate_size=I_, norm_topk_prob=True, hidden_act="silu")
    torch.manual_seed(seed)
    blk = HM.Qwen3_5MoeSparseMoeBlock(cfg).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in blk.parameters():
            p.copy_(torch.randn_like(p) * scale)
    se = blk.shared_expert
    w1 = torch.cat([blk.experts.gate_up_proj, torch.cat([se.gate_proj.weight, se.up_proj.weight])[None]]).contiguous()
    w2 = torch.cat([blk.experts.down_proj, se.down_proj.weight[None]]).contiguous()
    return blk, blk.gate.weight.detach().contiguous(), w1.detach(), w2.detach(), \
        blk.shared_expert_gate.weight.detach().contiguous()


@needs_grouped
@pytest.mark.parametrize("cfg", ["tiny", "35b"])
@pytest.mark.parametrize("M", MS)
def test_block_vs_hf(moe, cfg, M):
    """vs HF's Qwen3_5MoeSparseMoeBlock (bf16). HF rounds the router logits to bf16 before its softmax, so rows
    where its top-k set differs from vkc's (fp32 logits) are counted and left out."""
    E_, k, H_, I_ = (16, 4, 128, 64) if cfg == "tiny" else (E, K, H, I)
    blk, gw, w1, w2, sg = hf_block(E_, k, H_, I_, seed=M, scale=0.05 if cfg == "tiny" else 0.02)
    x = bf16(gen(400 + M), M, H_)
    with torch.no_grad():
        hf = blk(x[None])[0]
        _, _, hf_ids = blk.gate(x)
    ws = moe.moe_workspace(M, E_, k, H_, I_, shared=True)
    out = run_block(moe, x, gw, w1, w2, k, sg, ws)
    ref, ids = ref_block(x, gw, w1, w2, k, True, sg)
    same = (torch.sort(hf_ids, -1).values == torch.sort(ids[:, :k], -1).values).all(-1)
    print(f"{cfg} M={M}: HF's top-{k} set differs on {int((~same).sum())} of {M} rows")
    assert int(same.sum()) >= int(0.8 * M)
    close_rows(out, ref, torch.ones_like(same), f"{cfg} M={M} vs float64 (all rows)")
    if not same.any():  # M < 5 only: nothing left to compare with HF
        return
    close_rows(out, ref, same, f"{cfg} M={M} vs float64")
    err_vkc = (out.double() - ref)[same].abs().max().item()
    err_hf = (hf.double() - ref)[same].abs().max().item()
    print(f"{cfg} M={M}: max err vs float64: vkc {err_vkc:.3e}, HF {err_hf:.3e}")
    assert err_vkc <= 2 * err_hf + 1e-6 * ref.abs().max().item(), "vkc is further from float64 than HF's bf16 block"
    close_rows(out, hf.double(), same, f"{cfg} M={M} vs HF", tol=4e-2)
