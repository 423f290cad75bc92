"""GPU (H200) checks of the sampler family through vkc_runtime.ops.sample at Qwen3.6's vocabulary (V = 248320)
against float64 torch references: greedy == torch.argmax (ties: lowest index; fp32 and bf16 logits), penalties
through greedy tokens and top-20 log-probabilities, sampled tokens inside the top-k / top-p / min-p set for
every row and step, a chi-square test of the sampled distribution, the same token for the same (seed, step)
in other batch compositions, graph replay (sample + count update) == eager, and the count ops."""
from __future__ import annotations

import numpy as np
import pytest

from tests import refs_sample as R

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

V = 248320


@pytest.fixture(scope="module")
def S():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import sample
    return sample


def gen(seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def dev_params(S, B, **kw):
    fp, ip = S.host_params(B, **kw)
    return torch.from_numpy(fp).cuda(), torch.from_numpy(ip).cuda()


def processed(logits, fp, ip, counts=None):
    """float64 torch twin of refs_sample.processed."""
    x = logits.double()
    fp, ip = fp.double(), ip
    if counts is not None:
        Sn = counts.shape[0]
        rep = torch.where(fp[:, 3] > 0, fp[:, 3], torch.ones_like(fp[:, 3]))[:, None]
        pres, freq = fp[:, 4:5], fp[:, 5:6]
        slot = ip[:, 3]
        valid = (slot >= 0) & (slot < Sn) & ((rep[:, 0] != 1) | (pres[:, 0] != 0) | (freq[:, 0] != 0))
        c = counts[slot.clamp(0, Sn - 1)].long()
        n = (c & R.COUNT_MASK).double()
        y = torch.where(c != 0, torch.where(x > 0, x / rep, x * rep), x)
        y = y - freq * n - torch.where(n > 0, pres, torch.zeros_like(pres))
        x = torch.where(valid[:, None], y, x)
    t = fp[:, 0]
    return x / torch.where(t > 0, t, torch.ones_like(t))[:, None]


def call(S, logits, fp, ip, counts=None, n_top=0, lp=True, par=False):
    """``par``: with a (poisoned) row-statistics workspace (the parallel pass 1)."""
    B = logits.shape[0]
    out = torch.full((B,), -7, dtype=torch.int32, device="cuda")
    lpo = torch.full((B,), float("nan"), device="cuda") if lp else None
    tv = torch.full((B, n_top), float("nan"), device="cuda") if n_top else None
    ti = torch.full((B, n_top), -7, dtype=torch.int32, device="cuda") if n_top else None
    ws = None
    if par:
        ws = torch.full((B * -(-logits.shape[1] // S.SPAN) * 4,), float("nan"), device="cuda")
    S.sample(logits, fp, ip, counts=counts, out=out, logprobs=lpo, top_logprobs=tv, top_ids=ti, workspace=ws)
    torch.cuda.synchronize()
    return out, lpo, tv, ti


def check_members(pl, tok, fp, ip, vslack=1e-4, mslack=1e-5):
    """Every sampled token satisfies the joint filters of its row (float64, with fp32-noise slack)."""
    m = pl.max(1, keepdim=True).values
    w = torch.exp(pl - m)
    Z = w.sum(1)
    ls = pl.gather(1, tok.long()[:, None])
    gt = pl > ls + vslack
    cnt = gt.sum(1)
    mass = (w * gt).sum(1) / Z
    k, p, mp = ip[:, 0], fp[:, 1].double(), fp[:, 2].double()
    ok_k = (k <= 0) | (k >= pl.shape[1]) | (cnt < k)
    ok_p = (p >= 1) | (mass < p + mslack)
    ok_m = (mp <= 0) | ((ls[:, 0] - m[:, 0]) >= torch.log(mp.clamp(1e-30, 1.0)) - vslack)
    bad = ~(ok_k & ok_p & ok_m)
    assert not bad.any(), f"rows {torch.nonzero(bad).flatten().tolist()[:10]} sampled outside their set"
    assert (tok >= 0).all() and (tok < pl.shape[1]).all()


@pytest.mark.parametrize("par", [False, True], ids=["serial", "slices"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 7, 64])
def test_greedy_argmax(S, B, dtype, par):
    x = (torch.randn(B, V, generator=gen(B), device="cuda") * 3).to(dtype)
    x[0, [1000, 200000, V - 1]] = 40.0  # a tie across the row (and its slices): the lowest index
    if B > 1:
        x[1, [V - 2, V - 1]] = 41.0
    fp, ip = dev_params(S, B, temperature=0.0, top_p=0.5, top_k=3, seed=1)
    tok, lp, _, _ = call(S, x, fp, ip, par=par)
    ref = torch.argmax(x.double(), dim=1)
    assert torch.equal(tok.long(), ref)
    assert tok[0].item() == 1000 and (B == 1 or tok[1].item() == V - 2)
    lsm = torch.log_softmax(x.double(), dim=1).max(1).values
    assert (lp.double() - lsm).abs().max().item() < 1e-4


def counts_for(S, slots, g):
    counts = torch.zeros(slots, V, dtype=torch.int32, device="cuda")
    for s in range(slots):
        prompt = torch.randint(0, V, (3000,), generator=g, device="cuda", dtype=torch.int32)
        S.add_prompt_tokens(counts, prompt, torch.full((3000,), s, dtype=torch.int64, device="cuda"))
    return counts


@pytest.mark.parametrize("B", [7, 64])
def test_penalties_and_top_logprobs(S, B):
    g = gen(100 + B)
    x = torch.randn(B, V, generator=g, device="cuda") * 3
    nslots = B + 2
    counts = counts_for(S, nslots, g)
    # output tokens: popular tokens of each row (so penalties move the top), several times each
    top = torch.topk(x, 8, dim=1).indices.to(torch.int32)
    slot = torch.randperm(nslots, generator=g, device="cuda")[:B]
    slot[::5] = -1
    fp, ip = dev_params(S, B, temperature=0.0, repetition_penalty=1.4, presence_penalty=0.7, frequency_penalty=0.3,
                        slot=slot.cpu().numpy())
    for rep in range(3):
        S.add_output_tokens(counts, top[:, rep % 4].contiguous(), ip)
    torch.cuda.synchronize()
    tok, lp, tv, ti = call(S, x, fp, ip, counts=counts, n_top=20)
    pl = processed(x, fp, ip, counts)
    valid = slot >= 0
    assert (torch.argmax(pl, 1)[valid] != torch.argmax(x, 1)[valid]).all()  # the penalties moved every top
    assert torch.equal(tok.long(), torch.argmax(pl, 1))
    ls = torch.log_softmax(pl, 1)
    ref = torch.topk(pl, 20, dim=1)
    assert torch.equal(ti.long(), ref.indices)
    assert (tv.double() - ls.gather(1, ref.indices)).abs().max().item() < 1e-4
    assert (lp.double() - ls.max(1).values).abs().max().item() < 1e-4


FILTERS = [  # per-row (temperature, top_k, top_p, min_p), cycled over the batch
    (1.0, 0, 0.9, 0.0), (0.7, 50, 1.0, 0.0), (1.0, 0, 1.0, 0.05), (0.8, 20, 0.8, 0.01), (1.2, 0, 0.5, 0.0),
    (1.0, 1000, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.6, 5, 0.95, 0.1),
]


@pytest.mark.parametrize("par", [False, True], ids=["serial", "slices"])
@pytest.mark.parametrize("B", [1, 7, 64])
@pytest.mark.parametrize("scale", [1.0, 4.0])  # flat (large sets) and peaked logits
def test_sampled_tokens_inside_the_allowed_set(S, B, scale, par):
    g = gen(7 * B + int(scale))
    x = torch.randn(B, V, generator=g, device="cuda") * scale
    f = [FILTERS[(b + int(scale)) % len(FILTERS)] for b in range(B)]
    cols = list(zip(*f))
    seen = set()
    for step in range(6):
        fp, ip = dev_params(S, B, temperature=cols[0], top_k=cols[1], top_p=cols[2], min_p=cols[3],
                            seed=np.arange(B) + 17, step=step)
        tok, lp, _, _ = call(S, x, fp, ip, par=par)
        pl = processed(x, fp, ip)
        check_members(pl, tok, fp, ip)
        ls = torch.log_softmax(pl, 1).gather(1, tok.long()[:, None])[:, 0]
        assert (lp.double() - ls).abs().max().item() < 1e-4
        seen.add(tuple(tok.tolist()))
    assert len(seen) > 1  # the steps draw differently


def test_row_statistics_in_parallel_give_the_same_tokens(S):
    """B = 64 mixed rows (greedy, every filter, penalties on some), bf16 logits: the same tokens with and without
    the workspace at every step, log-probabilities equal up to the normalizer's summation order; a row asking for
    top-n log-probabilities (its own pass 1) beside them."""
    B, nslots = 64, 70
    g = gen(21)
    x = (torch.randn(B, V, generator=g, device="cuda") * 2).to(torch.bfloat16)
    counts = counts_for(S, nslots, g)
    f = [FILTERS[b % len(FILTERS)] for b in range(B)]
    cols = list(zip(*f))
    for step in range(4):
        fp, ip = dev_params(S, B, temperature=[0.0 if b % 5 == 0 else t for b, t in enumerate(cols[0])],
                            top_k=cols[1], top_p=cols[2], min_p=cols[3], seed=np.arange(B) * 3 + 7, step=step,
                            repetition_penalty=1.3, presence_penalty=0.4, slot=[b if b % 3 else -1 for b in range(B)])
        t0, l0, _, _ = call(S, x, fp, ip, counts=counts)
        t1, l1, _, _ = call(S, x, fp, ip, counts=counts, par=True)
        assert torch.equal(t0, t1), f"step {step}: rows {torch.nonzero(t0 != t1).flatten().tolist()[:8]}"
        assert (l0 - l1).abs().max().item() < 1e-5
        t2, l2, tv, ti = call(S, x, fp, ip, counts=counts, n_top=5, par=True)
        assert torch.equal(t0, t2) and torch.isfinite(tv).all()


def test_distribution_chi_square(S):
    """2048 draws (256 rows x 8 steps, distinct seeds) from a row with 7 likely tokens among 248320: the
    histogram over the top-k = 5 set matches p restricted to it; the uniform and the untruncated-then-cut
    alternatives (uniform, another temperature) are outside it."""
    B, steps = 256, 8
    base = torch.randn(V, generator=gen(5), device="cuda") * 0.5 - 12.0
    ids = torch.tensor([7, 90000, 123, 248319, 5000, 77, 160000])
    vals = torch.tensor([3.0, 2.6, 2.1, 1.7, 1.2, 1.0, 0.8], device="cuda")
    base[ids.cuda()] = vals
    x = base.repeat(B, 1)
    obs = torch.zeros(V, dtype=torch.int64, device="cuda")
    for step in range(steps):
        fp, ip = dev_params(S, B, temperature=1.0, top_k=5, seed=np.arange(B) * 31 + 3, step=step)
        tok, _, _, _ = call(S, x, fp, ip, lp=False)
        obs += torch.bincount(tok.long(), minlength=V)
    obs = obs.cpu().numpy()
    allowed = ids[:5].numpy()
    assert obs.sum() == B * steps and obs[allowed].sum() == B * steps, "samples outside the top-5 set"
    w = np.exp(vals[:5].double().cpu().numpy())
    chi, df = R.chi_square(obs[allowed], w / w.sum())
    bound = R.chi2_bound(df)
    assert chi < bound, f"chi2 {chi:.1f} >= {bound:.1f}"
    assert R.chi_square(obs[allowed], np.full(5, 0.2))[0] > 3 * bound
    w2 = np.exp(2 * vals[:5].double().cpu().numpy())  # temperature 0.5 instead of 1
    assert R.chi_square(obs[allowed], w2 / w2.sum())[0] > bound


def test_same_seed_same_token_in_any_batch(S):
    B = 64
    g = gen(3)
    x = torch.randn(B, V, generator=g, device="cuda") * 2
    f = [FILTERS[b % len(FILTERS)] for b in range(B)]
    cols = list(zip(*f))
    kw = dict(temperature=cols[0], top_k=cols[1], top_p=cols[2], min_p=cols[3], seed=np.arange(B) * 5 + 1, step=9)
    fp, ip = dev_params(S, B, **kw)
    t64, _, _, _ = call(S, x, fp, ip, lp=False)
    for rows in ([5], [0], [17, 3, 63, 8, 40, 2, 33]):
        r = torch.tensor(rows, device="cuda")
        t, _, _, _ = call(S, x[r].contiguous(), fp[r].contiguous(), ip[r].contiguous(), lp=False)
        assert torch.equal(t, t64[r]), rows
    # inside a batch with other rows around (greedy and other seeds)
    other = torch.randn(3, V, generator=g, device="cuda")
    fo, io = dev_params(S, 3, temperature=[0.0, 1.0, 0.3], top_k=[0, 7, 0], seed=12345, step=1)
    r = torch.tensor([9, 10, 11], device="cuda")
    t, _, _, _ = call(S, torch.cat([other[:2], x[r], other[2:]]), torch.cat([fo[:2], fp[r], fo[2:]]),
                      torch.cat([io[:2], ip[r], io[2:]]), lp=False)
    assert torch.equal(t[2:5], t64[r])


@pytest.mark.parametrize("api", ["torch", "vkc"])
def test_graph_replay_equals_eager(S, api):
    import vkc_runtime as vr
    B, nslots = 16, 20
    g = gen(11)
    xs = [torch.randn(B, V, generator=g, device="cuda") * 3 for _ in range(3)]
    x = torch.empty_like(xs[0])
    fpd, ipd = dev_params(S, B)
    counts_g = counts_for(S, nslots, g)
    counts_e = counts_g.clone()
    outs = [torch.empty(B, dtype=torch.int32, device="cuda"), torch.empty(B, device="cuda"),
            torch.empty(B, 20, device="cuda"), torch.empty(B, 20, dtype=torch.int32, device="cuda"),
            torch.empty(B, dtype=torch.int32, device="cuda")]

    wsd = S.sample_workspace(B, V)  # the parallel row statistics (rows without top-n; these all ask for 20)

    def step(stream, counts, o):
        S.sample(x, fpd, ipd, counts=counts, out=o[0], logprobs=o[1], top_logprobs=o[2], top_ids=o[3],
                 workspace=wsd, stream=stream)
        S.sample(x, fpd, ipd, counts=counts, out=o[4], workspace=wsd, stream=stream)
        S.add_output_tokens(counts, o[0], ipd, stream=stream)

    def params(i):
        f = FILTERS
        return S.host_params(B, temperature=[f[(b + i) % 8][0] if b % 4 else 0.0 for b in range(B)],
                             top_k=[f[(b + i) % 8][1] for b in range(B)], top_p=[f[(b + i) % 8][2] for b in range(B)],
                             min_p=[f[(b + i) % 8][3] for b in range(B)], repetition_penalty=1.2,
                             presence_penalty=0.5, frequency_penalty=0.25, seed=np.arange(B) + 100 * i, step=i,
                             slot=[(b * 3 + i) % (nslots + 2) - 1 for b in range(B)])
    x.copy_(xs[0])
    fp0, ip0 = params(0)
    fpd.copy_(torch.from_numpy(fp0))
    ipd.copy_(torch.from_numpy(ip0))
    warm = [torch.empty_like(t) for t in outs]
    step(torch.cuda.current_stream().cuda_stream, counts_g.clone(), warm)  # loads the kernels before capture
    torch.cuda.synchronize()
    if api == "torch":
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            step(torch.cuda.current_stream().cuda_stream, counts_g, outs)
        replay = tg.replay
    else:
        s = vr.Stream()
        vg = vr.Graph()
        with vg.capture(s):
            step(s.handle, counts_g, outs)

        def replay():
            vg.replay(s)
            s.synchronize()
    for i in range(3):
        x.copy_(xs[i])
        fpi, ipi = params(i)
        fpd.copy_(torch.from_numpy(fpi))
        ipd.copy_(torch.from_numpy(ipi))
        for t in outs:
            t.fill_(-3)
        torch.cuda.synchronize()
        replay()
        torch.cuda.synchronize()
        eager = [torch.full_like(t, -5) for t in outs]
        before = counts_e.clone()
        step(torch.cuda.current_stream().cuda_stream, counts_e, eager)
        torch.cuda.synchronize()
        for a, b in zip(outs, eager):
            assert torch.equal(a, b), i
        assert torch.equal(counts_g, counts_e), i
        assert not torch.equal(counts_e, before)  # the count update ran
        check_members(processed(x, fpd, ipd, before), outs[0], fpd, ipd)
        assert torch.equal(outs[4], outs[0])  # the parallel row statistics (no top-n) draw the same tokens


def test_count_ops_and_skipped_indices(S):
    nslots = 6
    counts = torch.randint(0, 9, (nslots, V), dtype=torch.int32, device="cuda")
    c0 = counts.clone()
    S.reset_counts(counts, torch.tensor([2, -1, 4, 6, 2**40], dtype=torch.int64, device="cuda"))
    want = c0.clone()
    want[[2, 4]] = 0
    torch.cuda.synchronize()
    assert torch.equal(counts, want)
    toks = torch.tensor([0, V - 1, V, -1, 5, 5], dtype=torch.int32, device="cuda")
    S.add_prompt_tokens(counts, toks, torch.tensor([2, 2, 2, 2, -3, 2**33], dtype=torch.int64, device="cuda"))
    want[2, 0] |= R.PROMPT_BIT
    want[2, V - 1] |= R.PROMPT_BIT
    torch.cuda.synchronize()
    assert torch.equal(counts, want)
    _, ip = dev_params(S, 4, slot=[4, 4, 99, -1])
    S.add_output_tokens(counts, torch.tensor([3, 3, 1, 1], dtype=torch.int32, device="cuda"), ip)
    want[4, 3] += 2
    torch.cuda.synchronize()
    assert torch.equal(counts, want)
    # a row whose slot is out of range reads no counts: same tokens as without the buffer
    x = torch.randn(4, V, generator=gen(1), device="cuda")
    fp, ip = dev_params(S, 4, temperature=0.0, repetition_penalty=2.0, slot=[99, -1, 2**40, 6])
    a, _, _, _ = call(S, x, fp, ip, counts=counts)
    b, _, _, _ = call(S, x, fp, ip)
    assert torch.equal(a, b) and torch.equal(a.long(), torch.argmax(x, 1))
