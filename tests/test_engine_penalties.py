"""Penalties (repetition, presence, frequency) and log-probabilities in the engine, on the numpy backend:
the host sampler against a direct float64 computation (tests/refs_sample.py, the kernel's formulas), and the
LLM's greedy outputs / reported logprobs against step-by-step teacher-forced logits with the penalties applied
by hand (slot reuse, preemption, mixed batches)."""
from __future__ import annotations

import numpy as np
import pytest

from tests import refs_sample as R
from vkc_engine.sampler import PROMPT_BIT, HostCounts, SamplingParams, make_generator, sample_rows


def _fp_ip(params, slots):
    fp = np.zeros((len(params), 8), np.float32)
    ip = np.zeros((len(params), 4), np.int64)
    for b, p in enumerate(params):
        fp[b, :6] = (p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty)
        ip[b, 3] = slots[b]
    return fp, ip


def test_host_sampler_penalties_and_logprobs_match_the_reference():
    rng = np.random.default_rng(1)
    V, S = 50, 4
    counts = HostCounts(S, V)
    for s in range(S):
        counts.init(s, rng.integers(0, V, 6), rng.integers(0, V, 9))
    c0 = counts.counts.copy()
    assert (c0[0] & PROMPT_BIT).sum() > 0 and ((c0 & (PROMPT_BIT - 1)) > 1).any()
    logits = (rng.standard_normal((6, V)) * 3).astype(np.float32)
    params = [SamplingParams(temperature=0, repetition_penalty=1.7, logprobs=5),
              SamplingParams(temperature=0, presence_penalty=1.5, frequency_penalty=0.9, logprobs=0),
              SamplingParams(temperature=0.7, repetition_penalty=0.6, frequency_penalty=-0.4, logprobs=3),
              SamplingParams(temperature=0, logprobs=2),                                   # no penalties
              SamplingParams(temperature=0, repetition_penalty=2.0, presence_penalty=-1.0),  # slot -1: none
              SamplingParams(temperature=1.3, presence_penalty=2.0, logprobs=5)]
    slots = [0, 1, 2, 3, -1, 3]
    res = sample_rows(logits, params, [make_generator(b) for b in range(6)], counts=counts, slots=slots)
    fp, ip = _fp_ip(params, slots)
    x = R.processed(logits, fp, ip, c0)
    for b in (0, 1, 3, 4):  # greedy rows: the argmax of the penalized logits
        assert res.tokens[b] == int(np.argmax(x[b]))
    assert res.tokens[4] == int(np.argmax(logits[4]))  # no slot: untouched
    ls = R.log_softmax(x)
    np.testing.assert_allclose(res.logprobs, ls[np.arange(6), res.tokens], rtol=1e-5, atol=1e-5)
    for b, p in enumerate(params):
        n = p.logprobs or 0
        want = np.argsort(-ls[b], kind="stable")[:n]
        assert res.top_ids[b, :n].tolist() == want.tolist()
        np.testing.assert_allclose(res.top_logprobs[b, :n], ls[b, want], rtol=1e-5, atol=1e-5)
    # the penalties changed the answer somewhere (the test would see a missing penalty)
    assert any(int(np.argmax(x[b])) != int(np.argmax(logits[b])) for b in (0, 1))
    # sampled tokens of rows with a slot were counted, the slot -1 row's was not
    d = counts.counts - c0
    want = np.zeros_like(d)
    for b, s in enumerate(slots):
        if s >= 0:
            want[s, res.tokens[b]] += 1
    assert (d == want).all()


def test_sampling_rows_draw_from_the_penalized_distribution():
    rng = np.random.default_rng(2)
    V = 12
    counts = HostCounts(1, V)
    counts.init(0, [0, 1, 2], [3, 3, 4])
    logits = rng.standard_normal(V).astype(np.float32) * 2
    p = SamplingParams(temperature=0.8, repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.7)
    fp, ip = _fp_ip([p], [0])
    want = np.exp(R.log_softmax(R.processed(logits[None], fp, ip, counts.counts.copy())[0]))
    frozen = counts.counts.copy()
    gen = make_generator(5)
    draws = []
    for _ in range(3000):  # one row per call, the count row restored: every draw sees the same counts
        counts.counts[...] = frozen
        draws.append(sample_rows(logits[None], [p], [gen], counts=counts, slots=[0]).tokens[0])
    stat, df = R.chi_square(np.bincount(draws, minlength=V), want)
    assert stat < R.chi2_bound(df)


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.engine_fixtures import make_checkpoint
    d = tmp_path_factory.mktemp("pen")
    make_checkpoint(d, layer_types=["linear_attention", "full_attention"], hidden=128, intermediate=256, seed=8)
    return d


def _llm(ck, **kw):
    from tests.engine_numpy_backend import NumpyBackend
    from vkc_engine import LLM
    return LLM(ck, backend=NumpyBackend(), **{"max_model_len": 64, "max_num_seqs": 2, "max_num_batched_tokens": 32,
                                              **kw})


def _by_hand(ref, prompt, p: SamplingParams, n):
    """Greedy with penalties, one teacher-forced forward per token: (tokens, sampled logprobs, top ids)."""
    toks, lps, tops = [], [], []
    for _ in range(n):
        lg = ref.prompt_logits(list(prompt) + toks)[-1].astype(np.float64)
        seen = set(prompt) | set(toks)
        cnt = np.bincount(np.array(toks, np.int64), minlength=lg.shape[0]).astype(np.float64)
        rep = np.float32(p.repetition_penalty)
        mask = np.zeros(lg.shape[0], bool)
        mask[list(seen)] = True
        x = np.where(mask, np.where(lg > 0, lg / rep, lg * rep), lg)
        x = x - np.float32(p.frequency_penalty) * cnt - np.where(cnt > 0, np.float32(p.presence_penalty), 0.0)
        ls = R.log_softmax(x)
        t = int(np.argmax(x))
        toks.append(t)
        lps.append(ls[t])
        tops.append(np.argsort(-ls, kind="stable")[:3].tolist())
    return toks, lps, tops


def test_llm_greedy_penalties_and_logprobs_equal_the_direct_computation(ck):
    ref = _llm(ck)
    prompts = [[129, 155, 248, 187, 162, 139, 139], [9, 10, 11, 12]]  # plain greedy: 139 next (in the prompt)
    ps = [SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, repetition_penalty=4.0, presence_penalty=3.0,
                         frequency_penalty=2.0, logprobs=3),
          SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=3)]
    want = [_by_hand(ref, pr, p, 5) for pr, p in zip(prompts, ps)]
    plain = _llm(ck).generate(prompts[0], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0].token_ids
    assert plain != want[0][0], "the penalties must change this greedy output (else the test proves nothing)"
    # one batch (penalized and plain rows together), slot reuse (max_num_seqs 1: the second prompt takes the
    # first one's slot), and preemption (a cache too small for both: recompute sets the count row up again)
    for kw in (dict(), dict(max_num_seqs=1), dict(num_blocks=4, block_size=4, max_model_len=16)):
        llm = _llm(ck, **kw)
        outs = llm.generate(prompts * 2, ps * 2)
        for o, (toks, lps, tops) in zip(outs, want * 2):
            assert o.token_ids == toks, kw
            assert [lp.token_id for lp in o.logprobs] == toks
            np.testing.assert_allclose([lp.logprob for lp in o.logprobs], lps, rtol=2e-4, atol=2e-4)
            assert [[t for t, _ in lp.top] for lp in o.logprobs] == tops
        if "num_blocks" in kw:
            assert llm.scheduler.num_preemptions > 0


def test_bad_penalty_parameters():
    for bad in (dict(repetition_penalty=0), dict(repetition_penalty=float("nan")), dict(presence_penalty=float("inf")),
                dict(logprobs=21), dict(logprobs=-1)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
