"""GPU (H200) checks of the attention family through vkc_runtime.ops.attn: shuffled paged caches,
lengths at block boundaries and 4097, mixed batches, prefix + chunk, GQA 6 and 8, D 256/128, the gate
epilogue, poisoned outputs/scratch/unused cache slots, graph replay == eager. Reference: float32 math on
de-paged K/V in torch (== float64 numpy within bf16 noise); relative errors per case in
$VKC_ERR_DIR/attn_errors.json (tests/gpu/errlog.py)."""
from __future__ import annotations


import numpy as np
import pytest

from tests.gpu.errlog import record
from tests.gpu.paths import validated_then_bound

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TOL = 1e-2


@pytest.fixture(scope="module")
def A():
    from vkc_runtime.ops import attn
    return attn


def cdiv(a, b):
    return -(-a // b)


def rnd(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(torch.bfloat16)


def make_paged(lens, Hkv, D, bs, extra_cols=2, interleaved=False):
    """Shuffled paged caches with random rows 0..L-1 per sequence, NaN everywhere else; block table columns
    past a sequence's blocks hold garbage ids. interleaved: k and v blocks alternate in one allocation."""
    nblk = [cdiv(L, bs) for L in lens]
    nb = sum(nblk) + 5
    perm = torch.randperm(nb, device="cuda").to(torch.int32)
    width = max(max(nblk), 1) + extra_cols
    bt = torch.full((len(lens), width), 10**7, dtype=torch.int32, device="cuda")
    if interleaved:
        kv = torch.full((nb, 2, bs, Hkv, D), float("nan"), dtype=torch.bfloat16, device="cuda")
        kc, vc = kv[:, 0], kv[:, 1]
    else:
        kc = torch.full((nb, bs, Hkv, D), float("nan"), dtype=torch.bfloat16, device="cuda")
        vc = torch.full_like(kc, float("nan"))
    used = 0
    for i, L in enumerate(lens):
        ids = perm[used:used + nblk[i]]
        used += nblk[i]
        bt[i, :nblk[i]] = ids
        if L:
            n = torch.arange(L, device="cuda")
            kc[ids[n // bs].long(), n % bs] = rnd(L, Hkv, D)
            vc[ids[n // bs].long(), n % bs] = rnd(L, Hkv, D)
    return kc, vc, bt


def depage(cache, row, L):
    bs = cache.shape[1]
    n = torch.arange(L, device="cuda")
    return cache[row[n // bs].long(), n % bs].float()


def ref_attn(q, k, v, scale, q_pos, gate=None):
    """float32 math: q [Lq, Hq, D], k/v [L, Hkv, D]."""
    Hq, Hkv = q.shape[1], k.shape[1]
    g = Hq // Hkv
    kh, vh = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("rhd,nhd->hrn", q.float(), kh) * scale
    vis = torch.arange(k.shape[0], device="cuda")[None, :] <= q_pos[:, None]
    s = s.masked_fill(~vis[None], float("-inf"))
    o = torch.einsum("hrn,nhd->rhd", torch.softmax(s, -1), vh)
    if gate is not None:
        o = o * torch.sigmoid(gate.float())
    return o


def rel(out, ref):
    o = out.float()
    assert torch.isfinite(o).all(), f"{(~torch.isfinite(o)).sum().item()} non-finite outputs"
    return ((o - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def prefill_case(A, q_lens, prefix, Hq, Hkv, D, bs, gate, use_tma=None, interleaved=False):
    lens = [a + b for a, b in zip(q_lens, prefix)]
    kc, vc, bt = make_paged(lens, Hkv, D, bs, interleaved=interleaved)
    T = sum(q_lens)
    q = rnd(T, Hq, D)
    cu = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32, device="cuda")
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    gt = rnd(T, Hq, 2, D)[:, :, 1] if gate else None
    out = torch.full((T, Hq, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    scale = D ** -0.5
    A.prefill(q, kc, vc, bt, cu, sl, scale, gate=gt, out=out, use_tma=use_tma)
    torch.cuda.synchronize()
    ref = torch.empty(T, Hq, D, device="cuda")
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        if b > a:
            L = lens[i]
            pos = torch.arange(L - (b - a), L, device="cuda")
            ref[a:b] = ref_attn(q[a:b], depage(kc, bt[i], L), depage(vc, bt[i], L), scale, pos,
                                None if gt is None else gt[a:b])
    return rel(out, ref)


@pytest.mark.parametrize("D", [256, 128])
@pytest.mark.parametrize("Hq,Hkv", [(24, 4), (16, 2)])
@pytest.mark.parametrize("gate", [False, True])
@pytest.mark.parametrize("bs,use_tma", [(16, None), (64, None), (64, False), (128, None)])
def test_prefill_mixed(A, D, Hq, Hkv, gate, bs, use_tma):
    q_lens = [1, 15, 16, 17, 63, 64, 65, 300, 0, 129]
    prefix = [0, 0, 16, 100, 1, 64, 0, 700, 3, 4097 - 129]
    probe = torch.empty(1, bs, Hkv, D, dtype=torch.bfloat16, device="cuda")
    tma = A.prefill_uses_tma(probe, gate=gate) and use_tma is not False
    # on the H200 the TMA kernel takes every block size that is a multiple of its key tile
    assert tma == (bs % (64 if D == 256 else 128) == 0 and use_tma is not False)
    err = prefill_case(A, q_lens, prefix, Hq, Hkv, D, bs, gate, use_tma=use_tma, interleaved=bs == 128)
    record("attn", what=f"prefill mixed D={D} {Hq}/{Hkv} bs={bs} gate={gate} tma={tma}", rel_err=err)
    assert err < TOL


@pytest.mark.parametrize("T,bs", [(4097, 16), (8192, 16), (4097, 64), (8192, 64)])
def test_prefill_long_single(A, T, bs):
    err = prefill_case(A, [T], [0], 24, 4, 256, bs, True)
    record("attn", what=f"prefill single T={T} bs={bs}", rel_err=err)
    assert err < TOL


def test_prefill_tma_refuses_what_it_cannot_read(A):
    kc = torch.zeros(4, 16, 2, 256, dtype=torch.bfloat16, device="cuda")
    q = torch.zeros(3, 4, 256, dtype=torch.bfloat16, device="cuda")
    one = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    with pytest.raises(A.OpError, match="multiple of 64"):
        A.prefill(q, kc, kc, one, torch.tensor([0, 3], dtype=torch.int32, device="cuda"),
                  torch.tensor([3], dtype=torch.int32, device="cuda"), 0.1, use_tma=True)


def decode_case(A, lens, Hq, Hkv, D, bs, gate, workspace=None, max_seq_len=None, **kw):
    kc, vc, bt = make_paged(lens, Hkv, D, bs)
    B = len(lens)
    q = rnd(B, Hq, D)
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    gt = rnd(B, Hq, 2, D)[:, :, 1] if gate else None
    out = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    A.decode(q, kc, vc, bt, sl, D ** -0.5, gate=gt, out=out, workspace=workspace, max_seq_len=max_seq_len, **kw)
    torch.cuda.synchronize()
    ref = torch.zeros(B, Hq, D, device="cuda")
    for b, L in enumerate(lens):
        if L:
            ref[b] = ref_attn(q[b:b + 1], depage(kc, bt[b], L), depage(vc, bt[b], L), D ** -0.5,
                              torch.tensor([L - 1], device="cuda"), None if gt is None else gt[b:b + 1])[0]
    return rel(out, ref), out


@pytest.mark.parametrize("D", [256, 128])
@pytest.mark.parametrize("Hq,Hkv", [(24, 4), (16, 2)])
@pytest.mark.parametrize("gate", [False, True])
def test_decode_mixed(A, D, Hq, Hkv, gate):
    lens = [1, 15, 16, 17, 4097, 64, 65, 0, 1000, 2048]
    ws = A.decode_workspace(16, Hq, D, 64)
    ws.part_o.fill_bytes(0xFF)  # NaN scratch: every value the combine reads must be written first
    ws.part_lse.fill_bytes(0xFF)
    torch.cuda.synchronize()
    err, out = decode_case(A, lens, Hq, Hkv, D, 16, gate, workspace=ws)
    record("attn", what=f"decode mixed D={D} {Hq}/{Hkv} gate={gate}", rel_err=err)
    assert err < TOL
    assert torch.all(out[7] == 0)


@pytest.mark.parametrize("B,L", [(1, 32768), (64, 4096), (256, 512)])
def test_decode_sizes(A, B, L):
    lens = [L - (i % 7) for i in range(B)]
    err, _ = decode_case(A, lens, 24, 4, 256, 16, True)
    record("attn", what=f"decode B={B} L={L}", rel_err=err)
    assert err < TOL


@pytest.mark.parametrize("splits", [2, 7, 64])
@pytest.mark.parametrize("fused", [False, True])
def test_decode_forced_splits(A, splits, fused):
    """Every split count, combined in the split launch (decode_fused: tickets per group) or by the combine
    kernel, on NaN-poisoned partials; the fused path leaves every ticket counter at zero."""
    lens = [1, 15, 16, 17, 4097, 64, 65, 0, 1000, 2048]
    ws = A.decode_workspace(16, 24, 256, 64)
    ws.part_o.fill_bytes(0xFF)
    ws.part_lse.fill_bytes(0xFF)
    torch.cuda.synchronize()
    err, out = decode_case(A, lens, 24, 4, 256, 16, True, workspace=ws, num_splits=splits, fused=fused)
    record("attn", what=f"decode splits={splits} fused={fused}", rel_err=err)
    assert err < TOL
    assert torch.all(out[7] == 0)
    assert not ws.counters.to_numpy().any()


@pytest.mark.parametrize("D", [256, 128])
@pytest.mark.parametrize("splits,fused", [(None, None), (1, None), (7, False), (7, True), (64, True)])
def test_decode_tma(A, D, splits, fused):
    """Block size 64: the TMA kernels (sm_90a / sm_100a artifacts; the plan says it takes them) on every path --
    one split (direct), split + combine, fused -- with partial last tiles, exact tile ends and an empty
    sequence, on NaN-poisoned partials, against the float32 reference."""
    from vkc_runtime.kernels import has_kernel
    Hq, Hkv = 24, 4
    lens = [1, 63, 64, 65, 4097, 0, 1000, 2048, 128, 200]
    ws = A.decode_workspace(16, Hq, D, 64, num_kv_heads=Hkv)
    assert has_kernel(f"attn.decode_split.d{D}.tma") and ws.scratch is not None
    bt = torch.zeros(len(lens), 70, dtype=torch.int32, device="cuda")
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    plan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=64, workspace=ws)
    assert plan.batch.tma and not A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D,
                                               block_size=16, workspace=ws).batch.tma
    ws.part_o.fill_bytes(0xFF)
    ws.part_lse.fill_bytes(0xFF)
    torch.cuda.synchronize()
    err, out = decode_case(A, lens, Hq, Hkv, D, 64, True, workspace=ws, num_splits=splits, fused=fused)
    record("attn", what=f"decode tma D={D} splits={splits} fused={fused}", rel_err=err)
    assert err < TOL
    assert torch.all(out[5] == 0)
    assert not ws.counters.to_numpy().any()


def _graph_case(A):
    """A decode batch for the graph tests: 24/4 x 256, block 16, lengths 17/300/4097/1, a strided gate."""
    Hq, Hkv, D, bs = 24, 4, 256, 16
    lens = [17, 300, 4097, 1]
    kc, vc, bt = make_paged(lens, Hkv, D, bs)
    B = len(lens)
    q, gt = rnd(B, Hq, D), rnd(B, Hq, 2, D)[:, :, 1]
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return Hq, Hkv, D, bs, lens, kc, vc, bt, B, q, gt, sl, A.decode_workspace(B, Hq, D, 32)


def test_decode_fused_graph_replays(A):
    """Replaying a captured fused decode: each launch must find its counters at zero (the last split of
    each group resets them), so every replay reproduces the eager result."""
    import vkc_runtime
    Hq, Hkv, D, bs, lens, kc, vc, bt, B, q, gt, sl, ws = _graph_case(A)
    eager = torch.empty(B, Hq, D, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        A.decode(q, kc, vc, bt, sl, D ** -0.5, gate=gt, out=eager, workspace=ws, num_splits=13, fused=True,
                 stream=s.cuda_stream)
    s.synchronize()
    g = vkc_runtime.Graph()
    graph_out = torch.full_like(eager, float("nan"))
    with g.capture(s.cuda_stream):
        A.decode(q, kc, vc, bt, sl, D ** -0.5, gate=gt, out=graph_out, workspace=ws, num_splits=13, fused=True,
                 stream=s.cuda_stream)
    for _ in range(3):
        graph_out.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay(s.cuda_stream)
        s.synchronize()
        assert torch.equal(eager, graph_out)
    assert not ws.counters.to_numpy().any()


def _plan_layers_match(plan, qs, layers, gts, want):
    """Run each layer (q, caches, gate) through ``plan`` eagerly on a side stream (which also sizes the TMA
    scratch), then again from one captured graph, into NaN-poisoned outputs: both give ``want``'s bytes."""
    import vkc_runtime
    D = qs[0].shape[-1]
    outs = [torch.full_like(w, float("nan")) for w in want]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    torch.cuda.synchronize()

    def run_all():
        for q, (kc, vc), g, o in zip(qs, layers, gts, outs):
            plan.run(q, kc, vc, D ** -0.5, gate=g, out=o, stream=s.cuda_stream)
    run_all()
    s.synchronize()
    for w, o in zip(want, outs):
        assert torch.equal(w, o)
    graph = vkc_runtime.Graph()
    with graph.capture(s.cuda_stream):
        run_all()
    for o in outs:
        o.fill_(float("nan"))
    torch.cuda.synchronize()
    graph.replay(s.cuda_stream)
    s.synchronize()
    for w, o in zip(want, outs):
        assert torch.equal(w, o)


def _dense(ts):
    return [t if isinstance(t, torch.Tensor) else torch.from_dlpack(t) for t in ts]


@pytest.mark.parametrize("bs", [16, 64], ids=["gather", "tma"])
def test_decode_plan_matches_decode(A, bs):
    """A DecodePlan made once and run for two layers (own caches, q, gate) gives decode()'s bytes, eagerly
    and replayed from a CUDA graph (block 64: the TMA kernels, their descriptors in the workspace's scratch)."""
    Hq, Hkv, D = 24, 4, 256
    lens = [17, 300, 4097, 1, 0]
    B = len(lens)
    kc, vc, bt = make_paged(lens, Hkv, D, bs)
    layers = [(kc, vc), (torch.randn_like(kc), torch.randn_like(vc))]  # two layers, one block table
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ws = A.decode_workspace(B, Hq, D, 64)
    plan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=bs, workspace=ws)
    qs = [rnd(B, Hq, D) for _ in layers]
    gts = [rnd(B, Hq, 2, D)[:, :, 1] for _ in layers]
    want = _dense([A.decode(q, kc, vc, bt, sl, D ** -0.5, gate=g, workspace=ws)
                   for q, (kc, vc), g in zip(qs, layers, gts)])
    _plan_layers_match(plan, qs, layers, gts, want)


def test_prefill_plan_matches_prefill(A):
    """A PrefillPlan made once and run for two layers (own caches, q, gate; one TMA-able block size) gives
    prefill()'s bytes, eagerly and replayed from a CUDA graph."""
    Hq, Hkv, D, bs = 24, 4, 256, 64
    q_lens, prefix = [300, 17, 1000, 1], [0, 4000, 64, 0]
    lens = [a + b for a, b in zip(q_lens, prefix)]
    kc, vc, bt = make_paged(lens, Hkv, D, bs)
    layers = [(kc, vc), (torch.randn_like(kc), torch.randn_like(vc))]  # two layers, one block table
    T = sum(q_lens)
    cu = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32, device="cuda")
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    qs = [rnd(T, Hq, D) for _ in layers]
    gts = [rnd(T, Hq, 2, D)[:, :, 1], None]
    want = _dense([A.prefill(q, kc, vc, bt, cu, sl, D ** -0.5, gate=g, max_seqlen_q=max(q_lens))
                   for q, (kc, vc), g in zip(qs, layers, gts)])
    plan = A.PrefillPlan(cu, sl, bt, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=bs,
                         max_seqlen_q=max(q_lens))
    _plan_layers_match(plan, qs, layers, gts, want)


def test_bound_calls_match_validated_calls(A, monkeypatch):
    """Four layers per op with their own tensors: the first call validates and binds, the other three replay the
    bound call (no revalidation; the native BoundCall re-reads each torch tensor and patches its pointer). Every
    output is byte-identical to validated calls (VKC_FASTPATH=0) on the same inputs, NaN-poisoned first."""
    Hq, Hkv, D = 24, 4, 256
    lens = [17, 300, 4097, 1]
    B, n = len(lens), 4
    kc, vc, bt = make_paged(lens, Hkv, D, 16)
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ws = A.decode_workspace(B, Hq, D, 64)
    dec = [(rnd(B, Hq, D), torch.randn_like(kc), torch.randn_like(vc), rnd(B, Hq, 2, D)[:, :, 1]) for _ in range(n)]
    q_lens, prefix = [300, 17, 1000, 1], [0, 4000, 64, 0]
    plens = [a + b for a, b in zip(q_lens, prefix)]
    pkc, pvc, pbt = make_paged(plens, Hkv, D, 64)
    T = sum(q_lens)
    cu = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32, device="cuda")
    psl = torch.tensor(plens, dtype=torch.int32, device="cuda")
    pre = [(rnd(T, Hq, D), torch.randn_like(pkc), torch.randn_like(pvc), rnd(T, Hq, 2, D)[:, :, 1]) for _ in range(n)]
    kv = [(rnd(37, Hkv, D), rnd(37, Hkv, D)) for _ in range(n)]
    slots = torch.randperm(kc.shape[0] * 16, device="cuda")[:37].to(torch.int32)
    outs = {}
    for fast in validated_then_bound(monkeypatch):
        dplan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=16, workspace=ws)
        pplan = A.PrefillPlan(cu, psl, pbt, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=64,
                              max_seqlen_q=max(q_lens))
        o = outs[fast] = {k: [torch.full_like(x[0], float("nan")) for x in xs]
                          for k, xs in (("decode", dec), ("dplan", dec), ("prefill", pre), ("pplan", pre))}
        caches = [(torch.zeros_like(kc), torch.zeros_like(vc)) for _ in range(n)]
        torch.cuda.synchronize()
        for i in range(n):
            q, k, v, g = dec[i]
            A.decode(q, k, v, bt, sl, D ** -0.5, gate=g, out=o["decode"][i], workspace=ws)
            dplan.run(q, k, v, D ** -0.5, gate=g, out=o["dplan"][i])
            q, k, v, g = pre[i]
            A.prefill(q, k, v, pbt, cu, psl, D ** -0.5, gate=g, out=o["prefill"][i], max_seqlen_q=max(q_lens))
            pplan.run(q, k, v, D ** -0.5, gate=g, out=o["pplan"][i])
            A.reshape_and_cache(*kv[i], *caches[i], slots)
        torch.cuda.synchronize()
        o["caches"] = [c for pair in caches for c in pair]
        from vkc_runtime.ops.attn import cache_ops, decode_ops, prefill_ops
        hits = (decode_ops._decode_calls.hits, dplan._calls.hits, prefill_ops._prefill_calls.hits, pplan._calls.hits,
                cache_ops._rac_calls.hits)
        assert hits == ((n - 1,) * 5 if fast == "1" else (0,) * 5), hits
    for k in outs["0"]:
        for a, b in zip(outs["0"][k], outs["1"][k]):
            assert torch.isfinite(a.float()).all() and torch.equal(a, b), k


@pytest.mark.parametrize("bs,D,aligned", [(16, 256, True), (64, 256, True), (64, 128, False), (16, 128, True)])
def test_reshape_and_cache(A, bs, D, aligned):
    """Block sizes 16 and 64, both head dims; k/v rows offset by one element (unaligned: the .any kernel)."""
    T, Hkv, nb = 37, 4, 9
    if aligned:
        k, v = rnd(T, Hkv, D), rnd(T, Hkv, D)
    else:
        k, v = rnd(T * Hkv * D + 1)[1:].view(T, Hkv, D), rnd(T * Hkv * D + 1)[1:].view(T, Hkv, D)
    kc, vc = rnd(nb, bs, Hkv, D), rnd(nb, bs, Hkv, D)
    k0, v0 = kc.clone(), vc.clone()
    slots = torch.randperm(nb * bs, device="cuda")[:T].to(torch.int32)
    slots[3] = -1
    slots[5] = nb * bs + 3
    A.reshape_and_cache(k, v, kc, vc, slots)
    torch.cuda.synchronize()
    for t, s in enumerate(slots.tolist()):
        if 0 <= s < nb * bs:
            k0[s // bs, s % bs], v0[s // bs, s % bs] = k[t], v[t]
    assert torch.equal(kc, k0) and torch.equal(vc, v0)


def test_prefill_graph_replay_matches_eager(A):
    """TMA prefill (descriptors built on the device in global scratch) captured after one eager call."""
    import vkc_runtime
    Hq, Hkv, D, bs = 24, 4, 256, 64
    q_lens, prefix = [300, 17, 1000], [0, 4000, 64]
    lens = [a + b for a, b in zip(q_lens, prefix)]
    kc, vc, bt = make_paged(lens, Hkv, D, bs)
    T = sum(q_lens)
    q, gt = rnd(T, Hq, D), rnd(T, Hq, 2, D)[:, :, 1]
    cu = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32, device="cuda")
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    assert A.prefill_uses_tma(kc, gate=True)
    eager = torch.empty(T, Hq, D, dtype=torch.bfloat16, device="cuda")
    graph_out = torch.full_like(eager, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        A.prefill(q, kc, vc, bt, cu, sl, D ** -0.5, gate=gt, out=eager, stream=s.cuda_stream)
    s.synchronize()
    g = vkc_runtime.Graph()
    with g.capture(s.cuda_stream):
        A.prefill(q, kc, vc, bt, cu, sl, D ** -0.5, gate=gt, out=graph_out, stream=s.cuda_stream)
    g.replay(s.cuda_stream)
    s.synchronize()
    assert torch.equal(eager, graph_out)


def test_graph_replay_matches_eager(A):
    import vkc_runtime
    Hq, Hkv, D, bs, lens, kc, vc, bt, B, q, gt, sl, ws = _graph_case(A)
    cap = bt.shape[1] * bs
    eager = torch.empty(B, Hq, D, dtype=torch.bfloat16, device="cuda")
    graph_out = torch.full_like(eager, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        A.decode(q, kc, vc, bt, sl, D ** -0.5, gate=gt, out=eager, workspace=ws, max_seq_len=cap, stream=s.cuda_stream)
    s.synchronize()
    g = vkc_runtime.Graph()
    with g.capture(s.cuda_stream):
        A.decode(q, kc, vc, bt, sl, D ** -0.5, gate=gt, out=graph_out, workspace=ws, max_seq_len=cap,
                 stream=s.cuda_stream)
    g.replay(s.cuda_stream)
    s.synchronize()
    assert torch.equal(eager, graph_out)


def test_validation_errors(A):
    kc, vc, bt = make_paged([16], 2, 256, 16)
    q = rnd(1, 5, 256)  # 5 q heads vs 2 kv heads
    with pytest.raises(A.OpError):
        A.decode(q, kc, vc, bt, torch.tensor([16], dtype=torch.int32, device="cuda"), 0.1)
    kc2 = rnd(4, 16, 2, 96)
    with pytest.raises(A.OpError):
        A.decode(rnd(1, 4, 96), kc2, kc2.clone(), bt, torch.tensor([16], dtype=torch.int32, device="cuda"), 0.1)
    with pytest.raises(A.OpError):
        A.decode(rnd(1, 4, 256), kc, vc, bt, torch.tensor([16], dtype=torch.int32, device="cuda"), 0.1,
                 max_seq_len=10**6)


def test_decode_split_count_fills_waves(A):
    """The split heuristic gets the loaded kernel's occupancy from the driver and picks full waves."""
    from vkc_runtime.kernels import get_kernel
    occ = get_kernel("attn.decode_split.d256").max_active_blocks()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert 1 <= occ <= 32
    for B, L in [(16, 32768), (64, 4096), (1, 32768)]:
        s = A.num_splits_for(B, 4, L, sms, ctas_per_sm=occ)
        waves = -(-(B * 4 * s) // (occ * sms))
        print(f"decode B={B} L={L}: occupancy {occ}/SM, {s} splits, {B * 4 * s} CTAs in {waves} wave(s)")
        assert B * 4 * s / (waves * occ * sms) > 0.75
