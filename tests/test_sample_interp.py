"""CPU tests of kernels_src/sample (the row sampler and the token-count kernels) through Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1), against the float64 numpy references of refs_sample.py.

Every sampler test runs twice: the row kernel's own pass 1, and the row statistics in parallel slices first
(sample_stats_kernel, partials merged by the row kernel; ties across slices).
Checks: greedy == numpy argmax with ties to the lowest index (ties across blocks, bf16 and a16 variants);
penalties (repetition over prompt + output tokens, presence, frequency; invalid slots read nothing) through the
greedy tokens and the top-n log-probabilities; top-k / top-p / min-p support sets over many seeds, with each
row's filter margins checked so the reference set is the kernel's; determinism under other batch compositions;
a chi-square test of the sampled distribution that a wrong distribution fails; log-probabilities vs numpy
log_softmax; the count kernels (prompt bit, output counts, skipped slots/tokens, reset).
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import refs_sample as R  # noqa: E402
from tests.kernel_testing import device, interpreter_active, launch_spec, specs  # noqa: E402

INTERP = interpreter_active()
DEV = device()
NF, NI = 8, 4


@pytest.fixture(scope="module", params=[None, 96], ids=["serial", "slices"])
def K(request):
    """The kernels; ``span``: None runs the row kernel's own pass 1, else the row statistics first, one program
    per ``span`` logits (several slices even for the tests' short rows, ties across them)."""
    return SimpleNamespace(mod=importlib.import_module("kernels_src.sample.sample"), specs=specs("sample"),
                           span=request.param)


def params(B, **kw):
    from vkc_runtime.ops.sample import host_params
    return host_params(B, **kw)


def run(K, logits, fp, ip, counts=None, n_top=0, variant="any", dtype="f32", **override):
    """Launch the row sampler; returns (tokens, sampled logprobs, top values, top ids) as numpy."""
    B, V = logits.shape
    lt = logits.to(torch.bfloat16 if dtype == "bf16" else torch.float32).to(DEV)
    ft = torch.from_numpy(fp).to(DEV)
    it = torch.from_numpy(ip).to(DEV)
    tok = torch.full((B,), -7, dtype=torch.int32, device=DEV)
    lp = torch.full((B,), float("nan"), dtype=torch.float32, device=DEV)
    nt = max(n_top, 1)
    tv = torch.full((B, nt + 3), float("nan"), dtype=torch.float32, device=DEV)  # + poisoned padding columns
    ti = torch.full((B, nt + 3), -7, dtype=torch.int32, device=DEV)
    if counts is None:
        ct, S, sc = lt, 0, 0
    else:
        ct = torch.from_numpy(counts).to(DEV)
        S, sc = ct.shape[0], ct.stride(0)
    ns = 0 if K.span is None else -(-V // K.span)
    part = torch.full((max(B * ns * 4, 1),), float("nan"), dtype=torch.float32, device=DEV)  # poisoned
    if ns:
        launch_spec(K.specs[f"stats.{dtype}.{variant}"], (B, ns), lt, ft, it, ct, part, lt.stride(0), V, sc, S,
                    K.span, **{k: v for k, v in override.items() if k == "BLOCK"})
        assert not torch.isnan(part.view(-1, 4)[:, :3]).any(), "a partial was not written"  # (m, Z, argmax, -)
    launch_spec(K.specs[f"row.{dtype}.{variant}"], (B,), lt, ft, it, ct, tok, lp, tv, ti, part, lt.stride(0), V, sc,
                S, n_top, tv.stride(0), 1, ns, K.span or 16, **override)
    assert torch.isnan(tv[:, n_top:]).all() and (ti[:, n_top:] == -7).all(), "wrote past n_top"
    return tok.cpu().numpy(), lp.cpu().numpy(), tv[:, :n_top].cpu().numpy(), ti[:, :n_top].cpu().numpy()


def logits_rows(seed, B, V, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, generator=g) * scale


@pytest.mark.parametrize("variant,dtype,V,block", [("any", "f32", 1000, 128), ("a16", "f32", 1024, 256),
                                                    ("any", "bf16", 999, None), ("a16", "bf16", 512, 64)])
def test_greedy_argmax_ties_lowest(K, variant, dtype, V, block):
    B = 6
    x = logits_rows(V, B, V)
    x[1, [5, 700 % V, V - 1]] = 50.0             # a three-way tie across blocks: the lowest index wins
    x[2, [V - 2, V - 1]] = 40.0
    x[3] = -1.0                                   # every value tied
    x[4, 0] = float("-inf")
    fp, ip = params(B, temperature=[0.0, 0.0, -1.0, 0.0, float("nan"), 0.0], top_k=3, top_p=0.5, seed=11)
    over = {} if block is None else {"BLOCK": block}
    tok, lp, _, _ = run(K, x, fp, ip, variant=variant, dtype=dtype, **over)
    xr = x.to(torch.bfloat16).double().numpy() if dtype == "bf16" else x.double().numpy()
    assert np.array_equal(tok, np.argmax(xr, axis=1)), (tok, np.argmax(xr, axis=1))
    assert tok[1] == 5 and tok[2] == V - 2 and tok[3] == 0
    np.testing.assert_allclose(lp, R.log_softmax(xr).max(axis=1), rtol=0, atol=2e-5)


def test_all_minus_inf_row_gives_token_zero(K):
    x = torch.full((2, 300), float("-inf"))
    fp, ip = params(2, temperature=[0.0, 1.0], top_p=0.9)
    tok, _, _, _ = run(K, x, fp, ip, BLOCK=64)
    assert tok.tolist() == [0, 0]


def make_counts(seed, S, V):
    rng = np.random.default_rng(seed)
    counts = np.zeros((S, V), np.int32)
    for s in range(S):
        prompt = rng.choice(V, size=V // 10, replace=False)
        counts[s, prompt] |= R.PROMPT_BIT
        out = rng.choice(V, size=V // 8)           # repeats -> counts > 1
        np.add.at(counts[s], out, 1)
    return counts


def test_penalties_vs_numpy(K):
    B, V, S = 6, 700, 4
    x = logits_rows(3, B, V)
    counts = make_counts(4, S, V)
    assert ((counts & R.COUNT_MASK) > 1).any() and ((counts & R.PROMPT_BIT) != 0).any()
    fp, ip = params(B, temperature=0.0, repetition_penalty=[1.7, 1.0, 1.0, 1.3, 2.0, 1.5],
                    presence_penalty=[0.0, 0.9, 0.0, 0.5, 1.0, 1.0], frequency_penalty=[0.0, 0.0, 0.6, 0.4, 0.3, 0.2],
                    slot=[0, 1, 2, 3, -1, 4])           # rows 4, 5: invalid slots -> no penalties
    n = 20
    tok, lp, tv, ti = run(K, x, fp, ip, counts=counts, n_top=n, BLOCK=128)
    pl = R.processed(x.numpy(), fp, ip, counts)
    assert np.array_equal(pl[4:], x.double().numpy()[4:])
    for b in range(4):  # each penalty moved the row
        assert np.abs(pl[b] - x[b].double().numpy()).max() > 0.1
    assert np.array_equal(tok, np.argmax(pl, axis=1))
    ls = R.log_softmax(pl)
    order = np.argsort(-pl, axis=1, kind="stable")[:, :n]
    assert np.array_equal(ti, order)
    np.testing.assert_allclose(tv, np.take_along_axis(ls, order, 1), rtol=0, atol=3e-5)
    np.testing.assert_allclose(lp, ls.max(axis=1), rtol=0, atol=3e-5)


def test_top_logprobs_ties_short_rows_and_temperature(K):
    B, V = 3, 40
    x = logits_rows(5, B, V)
    x[0, [3, 17, 30]] = 9.0                                   # ties: lower id first
    x[1, 5:] = float("-inf")                                  # 5 finite entries < n
    fp, ip = params(B, temperature=[0.0, 0.0, 0.7], top_p=0.999, seed=2)
    n = 8
    tok, lp, tv, ti = run(K, x, fp, ip, n_top=n, BLOCK=16)
    pl = R.processed(x.numpy(), fp, ip)
    ls = R.log_softmax(pl)
    assert ti[0, :3].tolist() == [3, 17, 30]
    assert ti[1, 5:].tolist() == [-1, -1, -1] and np.isneginf(tv[1, 5:]).all()
    assert np.array_equal(ti[1, :5], np.argsort(-pl[1, :5], kind="stable"))
    for b in (0, 2):
        order = np.argsort(-pl[b], kind="stable")[:n]
        assert np.array_equal(ti[b], order)
        np.testing.assert_allclose(tv[b], ls[b, order], rtol=0, atol=3e-5)
    np.testing.assert_allclose(lp[2], ls[2, tok[2]], rtol=0, atol=3e-5)


FILTERS = [  # (temperature, top_k, top_p, min_p)
    (1.0, 0, 0.8, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 1.0, 0.05), (1.0, 12, 0.6, 0.01), (0.5, 1, 1.0, 0.0),
    (2.0, 0, 0.3, 0.0), (1.0, 0, 1.0, 0.0),
]


@pytest.mark.parametrize("f", FILTERS, ids=lambda f: "T%s_k%s_p%s_minp%s" % f)
def test_sampled_tokens_inside_the_allowed_set(K, f):
    temp, k, p, mp = f
    B, V = 32, 160
    x = logits_rows(int(temp * 10) + k, B, V, scale=2.0)
    fp, ip = params(B, temperature=temp, top_k=k, top_p=p, min_p=mp, seed=np.arange(B) * 7919 + 13, step=5)
    tok, lp, _, _ = run(K, x, fp, ip, BLOCK=64)
    pl = R.processed(x.numpy(), fp, ip)
    ls = R.log_softmax(pl)
    sizes = []
    for b in range(B):
        assert R.margins(pl[b], p, mp) > 1e-5, f"row {b}: data too close to a cut-off (pick another seed)"
        A = R.allowed(pl[b], k, p, mp)
        sizes.append(A.sum())
        assert A[tok[b]], f"row {b}: token {tok[b]} outside the allowed set {np.flatnonzero(A)}"
        assert abs(lp[b] - ls[b, tok[b]]) < 3e-5
    if (k, p, mp) != (0, 1.0, 0.0):
        assert max(sizes) < V  # the filter was active
    assert len(set(tok.tolist())) > (1 if k == 1 else 3)  # not a constant


def test_same_seed_same_token_whatever_the_batch(K):
    V = 300
    x = logits_rows(9, 8, V, scale=1.5)
    kw = dict(temperature=0.9, top_p=0.9, top_k=50, seed=[5, 6, 7, 8, 9, 10, 11, 12], step=3)
    fp, ip = params(8, **kw)
    t1, _, _, _ = run(K, x, fp, ip, BLOCK=64)
    t1b, _, _, _ = run(K, x, fp, ip, BLOCK=64)
    assert np.array_equal(t1, t1b)
    perm = np.array([3, 0, 7, 5])
    fp2, ip2 = fp[perm], ip[perm]
    # another composition: other rows (greedy, different filters) around the permuted ones
    extra = logits_rows(10, 3, V)
    fpe, ipe = params(3, temperature=[0.0, 1.0, 0.5], top_k=[0, 3, 0], seed=99)
    xs = torch.cat([extra[:1], x[perm[:2]], extra[1:], x[perm[2:]]])
    fps = np.concatenate([fpe[:1], fp2[:2], fpe[1:], fp2[2:]])
    ips = np.concatenate([ipe[:1], ip2[:2], ipe[1:], ip2[2:]])
    t2, _, _, _ = run(K, xs, fps, ips, BLOCK=64)
    assert np.array_equal(t2[[1, 2, 5, 6]], t1[perm])
    # the step and the seed matter
    outs = set()
    for step in range(6):
        ip3 = ip.copy()
        ip3[:, 2] = step
        outs.add(tuple(run(K, x, fp, ip3, BLOCK=64)[0].tolist()))
    assert len(outs) > 3


@pytest.mark.parametrize("case", ["top_p", "top_k_min_p"])
def test_distribution_chi_square(K, case):
    """N independent draws (distinct seeds) of one small row; the histogram over the allowed set must match
    p restricted to it; the same statistic against the untruncated or the untempered distribution must be
    far beyond the bound (the test can tell them apart)."""
    V, N = 12, 500
    row = torch.tensor([2.0, 1.6, 1.5, 0.2, -0.3, 1.1, -1.0, 0.9, 0.0, -2.0, 0.5, 1.3])
    x = row.repeat(N, 1)
    if case == "top_p":
        temp, k, p, mp = 0.5, 0, 0.9, 0.0
    else:
        temp, k, p, mp = 0.4, 6, 1.0, 0.1
    fp, ip = params(N, temperature=temp, top_k=k, top_p=p, min_p=mp, seed=np.arange(N) + 1000, step=0)
    tok, _, _, _ = run(K, x, fp, ip, BLOCK=16)
    pl = R.processed(x[:1].numpy(), fp[:1], ip[:1])[0]
    assert R.margins(pl, p, mp) > 1e-3
    A = R.allowed(pl, k, p, mp)
    assert 3 <= A.sum() < V - 2
    w = np.exp(pl - pl.max()) * A
    want = w / w.sum()
    obs = np.bincount(tok, minlength=V)
    assert obs[~A].sum() == 0
    chi, df = R.chi_square(obs, want)
    bound = R.chi2_bound(df)
    assert chi < bound, f"chi2 {chi:.1f} >= {bound:.1f} (df {df})"
    raw = np.exp(x[0].double().numpy() - x[0].max().item()) * A
    for alt in (raw / raw.sum(), A / A.sum()):  # untempered, uniform over the set
        alt_chi = R.chi_square(obs, alt)[0]
        assert alt_chi > 1.5 * bound, f"the test cannot tell a wrong distribution apart ({alt_chi:.1f})"


@pytest.mark.parametrize("case", ["plain", "top_p"])
def test_distribution_across_slices_chi_square(case):
    """Row statistics in slices of 16 logits (a 40-token row, its mass spread over all three slices): the first
    draw starts in the slice its uniform points into, a redraw after a rejection and the filter checks skip the
    slices whose max cannot matter. N draws (distinct seeds) must follow p (restricted to the allowed set); the
    statistic against p with one slice's tokens reweighted must be far beyond the bound."""
    Ks = SimpleNamespace(specs=specs("sample"), span=16)
    V, N = 40, 600
    row = torch.full((V,), float("-inf"))
    row[[1, 6, 13, 17, 20, 26, 31, 33, 36, 39]] = torch.tensor([1.9, 1.5, 2.0, 0.4, 1.4, 0.9, 1.2, 0.1, 1.6, 0.8])
    x = row.repeat(N, 1)
    temp, p = (1.0, 1.0) if case == "plain" else (0.6, 0.85)
    fp, ip = params(N, temperature=temp, top_p=p, seed=np.arange(N) + 77, step=1)
    tok, _, _, _ = run(Ks, x, fp, ip, BLOCK=8)
    pl = R.processed(x[:1].numpy(), fp[:1], ip[:1])[0]
    assert R.margins(pl, p, 0.0) > 1e-3
    A = R.allowed(pl, 0, p, 0.0)
    assert (A & np.isfinite(pl)).sum() == 10 if case == "plain" else 3 <= A.sum() < 8
    w = np.exp(pl - pl.max()) * A
    want = w / w.sum()
    obs = np.bincount(tok, minlength=V)
    assert obs[~A].sum() == 0 and (obs[:16].sum() > 0) and (obs[16:32].sum() > 0) and (obs[32:].sum() > 0)
    chi, df = R.chi_square(obs, want)
    bound = R.chi2_bound(df)
    assert chi < bound, f"chi2 {chi:.1f} >= {bound:.1f} (df {df})"
    for f in (0.25, 4.0):  # the middle slice's tokens reweighted, as a wrong prefix or a skipped slice would
        alt = want.copy()
        alt[16:32] *= f
        alt_chi = R.chi_square(obs, alt / alt.sum())[0]
        assert alt_chi > 1.5 * bound, f"the test cannot tell a wrong distribution apart ({alt_chi:.1f})"


def test_counts_kernels(K):
    S, V = 5, 300
    rng = np.random.default_rng(1)
    base = rng.integers(0, 50, size=(S, V)).astype(np.int32)
    ct = torch.from_numpy(base.copy()).to(DEV)
    # reset slots 1 and 3 (and skip -1, 5, 99)
    slots = torch.tensor([1, -1, 3, 5, 99], dtype=torch.int64, device=DEV)
    launch_spec(K.specs["reset"], (5, triton_cdiv(V, 128)), ct, slots, V, ct.stride(0), S, BLOCK=128)
    want = base.copy()
    want[[1, 3]] = 0
    assert np.array_equal(ct.cpu().numpy(), want)
    # prompt bits (a repeated token, invalid slots and tokens skipped)
    toks = torch.tensor([4, 4, 7, 299, 300, -1, 8, 9], dtype=torch.int32, device=DEV)
    sl = torch.tensor([1, 1, 1, 3, 3, 3, -1, 5], dtype=torch.int64, device=DEV)
    launch_spec(K.specs["counts"], (triton_cdiv(8, 4),), ct, toks, sl, 8, V, ct.stride(0), S, 0, 1, 1, BLOCK=4)
    want[1, [4, 7]] |= R.PROMPT_BIT
    want[3, 299] |= R.PROMPT_BIT
    assert np.array_equal(ct.cpu().numpy(), want)
    # output counts with the slot read from iparams (column 3, stride 4); duplicates accumulate
    _, ip = params(6, slot=[1, 1, 3, -2, 1, 40])
    ipt = torch.from_numpy(ip).to(DEV)
    toks = torch.tensor([4, 4, 299, 5, 10, 11], dtype=torch.int32, device=DEV)
    launch_spec(K.specs["counts"], (2,), ct, toks, ipt, 6, V, ct.stride(0), S, 3, 4, 0, BLOCK=4)
    want[1, 4] += 2
    want[3, 299] += 1
    want[1, 10] += 1
    assert np.array_equal(ct.cpu().numpy(), want)


def triton_cdiv(a, b):
    return -(-a // b)
