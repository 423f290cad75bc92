"""Overlapped steps (``LLM(async_scheduling=True)``, vkc_engine.llm): each step is queued before the previous
step's draws are read, and the sequences whose next input token that step is still drawing get it on the device
(``backend.copy_rows`` from the draws' buffer, which the next draw overwrites). On the float32 numpy backend,
eager and with its graph stand-in: the same tokens, texts, finish reasons and log-probabilities as steps run one
by one, for every kind of request; a stop on a token costs one extra row, a stop by length none; an abort while a
step is in flight; no block or slot leak."""
from __future__ import annotations

import pytest

from tests.engine_fixtures import HEADS_27B, make_checkpoint, numpy_llm, random_prompt
from tests.engine_numpy_backend import NumpyBackend

pytest.importorskip("transformers")

from tests.test_engine_graphs import NumpyGraphBackend  # noqa: E402
from vkc_engine import SamplingParams  # noqa: E402

V = 300


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    d = tmp_path_factory.mktemp("overlap")
    make_checkpoint(d, heads=HEADS_27B, seed=5)
    return d


def _prompts():
    return [random_prompt(n, V, 40 + n) for n in (5, 1, 17, 9, 30, 3, 12, 2)]


def _params(stop_tok: int, stop_str: str) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),
            SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=12, ignore_eos=True),
            SamplingParams(temperature=0.7, top_k=40, seed=3, max_tokens=7, ignore_eos=True, repetition_penalty=1.3,
                           frequency_penalty=0.4),
            SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3),
            SamplingParams(temperature=0, max_tokens=14, stop_token_ids=[stop_tok]),
            SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, stop=[stop_str]),
            SamplingParams(temperature=1.0, min_p=0.05, seed=5, max_tokens=5, ignore_eos=True, presence_penalty=0.5),
            SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)]


def _run(ck, backend, overlap, prompts, params):
    llm = numpy_llm(ck, backend=backend, max_num_seqs=6, max_num_batched_tokens=40, max_model_len=96,
                    num_blocks=40, async_scheduling=overlap)
    outs = llm.generate(prompts, params)
    assert llm.scheduler.blocks.num_free == 40 and llm.scheduler.slots.num_free == 6
    return llm, outs


def _key(o):
    lps = None if o.logprobs is None else [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs]
    return o.token_ids, o.text, o.finish_reason, lps


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_overlapped_steps_equal_steps_one_by_one(ck, graphs):
    prompts = _prompts()
    _, base = _run(ck, NumpyBackend(), False, prompts, [SamplingParams(temperature=0, max_tokens=14,
                                                                       ignore_eos=True)] * len(prompts))
    # a stop token the greedy run of prompt 4 draws at its 5th token, a stop string inside prompt 5's text
    params = _params(base[4].token_ids[4], base[5].text[3:5])
    mk = NumpyGraphBackend if graphs else NumpyBackend
    one, ref = _run(ck, mk(), False, prompts, params)
    be = mk()
    llm, got = _run(ck, be, True, prompts, params)
    assert [_key(o) for o in got] == [_key(o) for o in ref]
    assert got[4].finish_reason == "stop" and len(got[4].token_ids) <= 5 and got[5].finish_reason == "stop"
    assert llm.num_ahead_steps > 0 and be.copies >= llm.num_ahead_steps and one.num_ahead_steps == 0
    if graphs:
        assert be.replayed  # overlapped decode steps replayed their graphs, fed on the device


def test_a_stop_on_a_token_costs_one_row_a_stop_by_length_none(ck):
    p = random_prompt(7, V, 3)
    base = numpy_llm(ck).generate(p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    draws = {}
    for overlap in (False, True):
        for name, sp in (("length", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)),
                         ("token", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                  stop_token_ids=[base.token_ids[3]]))):
            be = NumpyBackend()
            o = numpy_llm(ck, backend=be, async_scheduling=overlap).generate(p, sp)[0]
            assert o.token_ids == base.token_ids[:10 if name == "length" else base.token_ids.index(base.token_ids[3])
                                                 + 1]
            draws[overlap, name] = be.draws
    assert draws[True, "length"] == draws[False, "length"] == 10
    assert draws[True, "token"] == draws[False, "token"] + 1


def test_abort_while_a_step_is_in_flight(ck):
    pa, pb = random_prompt(11, V, 8), random_prompt(4, V, 9)
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = numpy_llm(ck).generate(pb, sp)[0].token_ids
    llm = numpy_llm(ck)
    ra, rb = llm.add_request(pa, sp), llm.add_request(pb, sp)
    seen = {ra: [], rb: []}
    for _ in range(4):
        for o in llm.step():
            seen[o.request_id] += o.delta_token_ids
    assert llm._inflight is not None and seen[ra]
    llm.abort(ra)
    n_a = len(seen[ra])
    while llm.has_unfinished():
        for o in llm.step():
            seen[o.request_id] += o.delta_token_ids
    assert len(seen[ra]) == n_a and seen[rb] == alone
    llm.drain()
    assert llm.scheduler.blocks.num_free == 80 and llm.scheduler.slots.num_free == 4


def test_switching_overlap_off_mid_run(ck):
    prompts = _prompts()[:4]
    sp = SamplingParams(temperature=0.9, seed=1, max_tokens=10, ignore_eos=True)
    want = [o.token_ids for o in numpy_llm(ck, async_scheduling=False).generate(prompts, [sp] * 4)]
    llm = numpy_llm(ck)
    ids = [llm.add_request(p, sp) for p in prompts]
    toks = {i: [] for i in ids}
    n = 0
    while llm.has_unfinished():
        llm.async_scheduling = n % 3 != 2  # on, on, off, ...
        for o in llm.step():
            toks[o.request_id] += o.delta_token_ids
        n += 1
    assert [toks[i] for i in ids] == want
