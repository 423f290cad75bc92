"""GPU (H200) checks of the MoE grouped GEMMs (vkc_runtime.ops.moe.grouped_gemm) on the Qwen3.6-35B-A3B expert
shapes (E' = 256 routed + 1 shared, H = 2048, I = 512, k' = 8 + 1) against float64 torch references on fresh
random data, M in {1, 3, 16, 100, 2048}: every row of GEMM1 (x -> h, SwiGLU fused) and GEMM2 (h -> y, the
routing weights as row_scale), poisoned outputs (rows of dropped pairs must stay poisoned), the block_m rule
and every compiled tile (forced), empty experts, all pairs on one expert, graph replay == eager (both GEMMs
captured on a side stream), bound calls == validated calls, bad inputs refused."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.gpu.paths import validated_then_bound

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

E_ROUTED, TOP_K, H, I = 256, 8, 2048, 512
E = E_ROUTED + 1          # the shared expert stacked as expert 256
KP = TOP_K + 1            # pairs per token
MS = (1, 3, 16, 100, 2048)
TOL = 1e-2                # per-row relative error; bf16 output rounding is ~3e-3


@pytest.fixture(scope="module")
def G():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops.moe import grouped_ops
    return grouped_ops


def fresh_seed():
    return int(np.random.SeedSequence().entropy % 2**62)


def gen(seed=None):
    g = torch.Generator(device="cuda")
    g.manual_seed(fresh_seed() if seed is None else seed)
    return g


@functools.lru_cache(maxsize=1)
def weights():
    g = gen()
    w1 = (torch.randn(E, 2 * I, H, device="cuda", generator=g) * H ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, device="cuda", generator=g) * I ** -0.5).to(torch.bfloat16)
    return w1, w2


def routing(M, g, *, one_expert=None, drop=0):
    """[M, k'] int32: top-8 distinct routed experts uniformly at random (or all on ``one_expert``) + the shared
    expert; ``drop`` pairs replaced by invalid ids (-1 / E)."""
    if one_expert is None:
        ids = torch.rand(M, E_ROUTED, device="cuda", generator=g).argsort(1)[:, :TOP_K]
    else:
        ids = torch.full((M, TOP_K), one_expert, device="cuda", dtype=torch.long)
    ids = torch.cat([ids, torch.full((M, 1), E_ROUTED, device="cuda", dtype=torch.long)], 1)
    if drop:
        flat = ids.view(-1)
        pos = torch.randperm(flat.numel(), device="cuda", generator=g)[:drop]
        flat[pos] = torch.where(torch.arange(drop, device="cuda") % 2 == 0, -1, E)
    return ids.to(torch.int32)


def align(ids, bm, *, shuffle_g=None):
    """The contract's align in torch (host syncs allowed in a test): sorted_ids [cap], block_expert [cap // bm],
    num_padded [1]; pairs of an expert in shuffled order when ``shuffle_g`` is given."""
    flat = ids.reshape(-1).long()
    P = flat.numel()
    valid = (flat >= 0) & (flat < E)
    key = torch.where(valid, flat, E)
    if shuffle_g is not None:  # a random order inside each expert group
        perm = torch.randperm(P, device="cuda", generator=shuffle_g)
        order = perm[torch.argsort(key[perm], stable=True)]
    else:
        order = torch.argsort(key, stable=True)
    nvalid = int(valid.sum())
    order = order[:nvalid]
    e_of = flat[order]
    counts = torch.bincount(flat[valid], minlength=E)
    padded = (counts + bm - 1) // bm * bm
    starts = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts
    cap = -(-(P + E * (bm - 1)) // bm) * bm
    sorted_ids = torch.full((cap,), P, device="cuda", dtype=torch.int32)
    rank = torch.arange(nvalid, device="cuda") - first[e_of]
    sorted_ids[starts[e_of] + rank] = order.to(torch.int32)
    block_expert = torch.full((cap // bm,), -1, device="cuda", dtype=torch.int32)
    nb = int(padded.sum()) // bm
    block_expert[:nb] = torch.repeat_interleave(torch.arange(E, device="cuda"), padded // bm).to(torch.int32)
    num_padded = torch.tensor([nb * bm], device="cuda", dtype=torch.int32)
    return sorted_ids, block_expert, num_padded


def ref_gemm(a, w, ids, div, act, scale=None):
    """float64 [P, N] for the valid pairs (rows of invalid pairs NaN), grouped by expert."""
    flat = ids.reshape(-1).long()
    P = flat.numel()
    N = w.shape[1] // 2 if act == "silu_mul" else w.shape[1]
    out = torch.full((P, N), float("nan"), device="cuda", dtype=torch.float64)
    for e in torch.unique(flat[(flat >= 0) & (flat < E)]).tolist():
        f = torch.nonzero(flat == e).view(-1)
        y = a[f // div].double() @ w[e].double().T
        if act == "silu_mul":
            g, u = y[:, :N], y[:, N:]
            y = g * torch.sigmoid(g) * u
        if scale is not None:
            y = y * scale[f].double()[:, None]
        out[f] = y
    return out


def check(out, ref, what):
    valid = ~torch.isnan(ref[:, 0])
    o = out.double()
    assert not torch.isnan(o[valid]).any(), f"{what}: {int(torch.isnan(o[valid]).any(1).sum())} valid rows unwritten"
    err = (o[valid] - ref[valid]).norm(dim=1) / ref[valid].norm(dim=1).clamp_min(1e-30)
    assert float(err.max()) < TOL, f"{what}: max row error {float(err.max()):.3e}"
    assert torch.isnan(o[~valid]).all(), f"{what}: a row of a dropped pair was written"


def poison(P, N):
    return torch.full((P, N), float("nan"), device="cuda", dtype=torch.bfloat16)


def block(G, x, ids, bm, tw, *, tiles=(None, None), drop_check=True):
    """GEMM1 then GEMM2 through the op; returns (h, y, the index arrays)."""
    w1, w2 = weights()
    M = x.shape[0]
    P = M * KP
    idx = align(ids, bm, shuffle_g=gen())
    h, y = poison(P, I), poison(P, H)
    G.grouped_gemm(x, w1, *idx, a_row_div=KP, out=h, block_m=bm, act="silu_mul", _tile=tiles[0])
    G.grouped_gemm(h, w2, *idx, a_row_div=1, out=y, block_m=bm, row_scale=tw.reshape(-1), _tile=tiles[1])
    torch.cuda.synchronize()
    return h, y, idx


def inputs(M, g, **kw):
    x = torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16)
    ids = routing(M, g, **kw)
    tw = torch.rand(M, KP, device="cuda", generator=g)
    return x, ids, tw


@pytest.mark.parametrize("M", MS)
def test_real_shapes_rule(G, M):
    """The block_m the rule picks for M, both GEMMs, three dropped pairs (their rows stay poisoned)."""
    g = gen()
    w1, w2 = weights()
    x, ids, tw = inputs(M, g, drop=min(3, M * KP - 1))
    bm = G.choose_block_m(M, KP, E)
    assert bm == (16 if M <= 456 else 64)
    h, y, _ = block(G, x, ids, bm, tw)
    check(h, ref_gemm(x, w1, ids, KP, "silu_mul"), f"GEMM1 M={M} bm={bm}")
    check(y, ref_gemm(h, w2, ids, 1, None, tw.reshape(-1)), f"GEMM2 M={M} bm={bm}")


def _tile_cases():
    from vkc_runtime.ops.moe.grouped_ops import TILES
    cases = []
    for bm, per in TILES.items():
        for t1, t2 in zip(per["silu_mul"], per[None]):
            for M in ((3, 100) if bm == 16 else (16, 2048) if bm == 64 else (100, 2048)):
                cases.append((M, bm, t1, t2))
    return cases


@pytest.mark.parametrize("M,bm,t1,t2", _tile_cases())
def test_every_tile_forced(G, M, bm, t1, t2):
    g = gen()
    w1, w2 = weights()
    x, ids, tw = inputs(M, g)
    h, y, _ = block(G, x, ids, bm, tw, tiles=(t1, t2))
    check(h, ref_gemm(x, w1, ids, KP, "silu_mul"), f"GEMM1 M={M} bm={bm} tile={t1}")
    check(y, ref_gemm(h, w2, ids, 1, None, tw.reshape(-1)), f"GEMM2 M={M} bm={bm} tile={t2}")


@pytest.mark.parametrize("M,bm", [(100, 16), (100, 64), (2048, 64)])
def test_all_pairs_to_one_expert_others_empty(G, M, bm):
    """Every routed pair on expert 5 (TOP_K copies per token: many blocks of one expert) + the shared expert;
    254 experts empty."""
    g = gen()
    w1, w2 = weights()
    x, ids, tw = inputs(M, g, one_expert=5)
    h, y, (st, be, npad) = block(G, x, ids, bm, tw)
    assert int(npad) == (-(-M * TOP_K // bm) + -(-M // bm)) * bm
    check(h, ref_gemm(x, w1, ids, KP, "silu_mul"), "GEMM1 one expert")
    check(y, ref_gemm(h, w2, ids, 1, None, tw.reshape(-1)), "GEMM2 one expert")


def test_graph_replay_equals_eager(G):
    """Both GEMMs of M = 1, 16 and 2048 (block_m from the rule) captured on a side stream with every buffer
    allocated before; replay == eager bit for bit, and a second replay after new inputs were copied in matches a
    new eager run."""
    import vkc_runtime
    w1, w2 = weights()
    G.load_kernels()
    cases = []
    for M in (1, 16, 2048):
        g = gen()
        x, ids, tw = inputs(M, g)
        bm = G.choose_block_m(M, KP, E)
        idx = align(ids, bm)
        P = M * KP
        cases.append(dict(x=x, ids=ids, tw=tw.reshape(-1).contiguous(), idx=idx, bm=bm,
                          he=poison(P, I), ye=poison(P, H), hg=poison(P, I), yg=poison(P, H)))

    def run(c, h, y, stream=None):
        G.grouped_gemm(c["x"], w1, *c["idx"], a_row_div=KP, out=h, block_m=c["bm"], act="silu_mul", stream=stream)
        G.grouped_gemm(h, w2, *c["idx"], a_row_div=1, out=y, block_m=c["bm"], row_scale=c["tw"], stream=stream)
    for c in cases:
        run(c, c["he"], c["ye"])
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    gr = vkc_runtime.Graph()
    with gr.capture(s.cuda_stream):
        for c in cases:
            run(c, c["hg"], c["yg"], stream=s.cuda_stream)
    gr.replay(s.cuda_stream)
    torch.cuda.synchronize()
    for c in cases:
        assert not torch.isnan(c["ye"]).any()
        assert torch.equal(c["he"], c["hg"]) and torch.equal(c["ye"], c["yg"])
    # new routing and activations copied into the captured buffers, replayed: equal to eager on the new data
    for c in cases:
        M = c["x"].shape[0]
        g = gen()
        x2, ids2, tw2 = inputs(M, g)
        c["x"].copy_(x2)
        c["tw"].copy_(tw2.reshape(-1))
        for dst, src in zip(c["idx"], align(ids2, c["bm"])):
            dst.copy_(src)
        c["hg"].fill_(float("nan"))
        c["yg"].fill_(float("nan"))
    torch.cuda.synchronize()
    gr.replay(s.cuda_stream)
    torch.cuda.synchronize()
    for c in cases:
        he, ye = poison(*c["hg"].shape), poison(*c["yg"].shape)
        run(c, he, ye)
        torch.cuda.synchronize()
        assert torch.equal(he, c["hg"]) and torch.equal(ye, c["yg"])


def test_bound_calls_match_validated_calls(G, monkeypatch):
    w1, w2 = weights()
    M = 16
    bm = G.choose_block_m(M, KP, E)
    sets = []
    for _ in range(3):
        x, ids, tw = inputs(M, gen())
        sets.append((x, align(ids, bm), tw.reshape(-1).contiguous()))
    res = {}
    for fast in validated_then_bound(monkeypatch):
        got = []
        for x, idx, tw in sets:
            h, y = poison(M * KP, I), poison(M * KP, H)
            G.grouped_gemm(x, w1, *idx, a_row_div=KP, out=h, block_m=bm, act="silu_mul")
            G.grouped_gemm(h, w2, *idx, a_row_div=1, out=y, block_m=bm, row_scale=tw)
            got += [h, y]
        torch.cuda.synchronize()
        assert G._calls.hits == (4 if fast == "1" else 0)
        res[fast] = got
    for a, b in zip(res["0"], res["1"]):
        assert not torch.isnan(a).any() and torch.equal(a, b)


def test_bad_inputs_refused(G):
    from vkc_runtime.ops import OpError
    w1, _ = weights()
    M = 4
    x, ids, _ = inputs(M, gen())
    idx = align(ids, 16)
    h = poison(M * KP, I)
    with pytest.raises(OpError, match="block_m"):
        G.grouped_gemm(x, w1, *idx, a_row_div=KP, out=h, block_m=32, act="silu_mul")
    with pytest.raises(OpError, match="columns"):
        G.grouped_gemm(x, w1, *idx, a_row_div=KP, out=h, block_m=16, act=None)
    with pytest.raises(OpError, match="a_row_div"):  # P = 36 rows of out, a has 4: f // 1 would pass its end
        G.grouped_gemm(x, w1, *idx, a_row_div=1, out=h, block_m=16, act="silu_mul")
    buf = torch.randn(M * H + M * KP * I, device="cuda").to(torch.bfloat16)
    xa = buf[:M * H].view(M, H)
    alias = buf[M * H - I:M * H - I + M * KP * I].view(M * KP, I)  # its first row is x's last 512 elements
    with pytest.raises(OpError, match="overlap"):
        G.grouped_gemm(xa, w1, *idx, a_row_div=KP, out=alias, block_m=16, act="silu_mul")
    with pytest.raises(OpError, match="int32"):
        G.grouped_gemm(x, w1, idx[0].long(), *idx[1:], a_row_div=KP, out=h, block_m=16, act="silu_mul")
    assert torch.isnan(h).all()
