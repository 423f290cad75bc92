"""vkc_engine's model wiring on CPU: the engine on the float32 numpy backend (tests/engine_numpy_backend.py)
against HF transformers' Qwen3_5ForCausalLM in fp32 on tiny random checkpoints (tests/engine_fixtures.py):
teacher-forced logits at every position, chunked prefill, greedy decode through the scheduler, batches,
preemption, both name layouts, sharding, tied embeddings, stop conditions and streaming."""
from __future__ import annotations

import pytest

from tests.engine_fixtures import HEADS_27B, HEADS_35B, checkpoint, hf_greedy, hf_logits
from tests.engine_fixtures import numpy_llm as _llm, random_prompt as _prompt, rel_err as _rel

pytest.importorskip("transformers")

from vkc_engine import SamplingParams  # noqa: E402

TOL = 2e-5  # max |engine - HF| / max |HF| of fp32 vs fp64-accumulated numpy: far below any wiring error


@pytest.fixture(scope="module")
def ck27(tmp_path_factory):
    return checkpoint(tmp_path_factory, "ck27", heads=HEADS_27B, seed=1)


@pytest.fixture(scope="module")
def ck35vlm(tmp_path_factory):
    return checkpoint(tmp_path_factory, "ck35vlm", heads=HEADS_35B, vlm=True, shards=3, tie=True, seed=2,
                      layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention",
                                   "linear_attention"])


@pytest.mark.parametrize("n", [1, 17, 100])
def test_teacher_forced_logits_match_hf(ck27, n):
    d, model, _ = ck27
    llm = _llm(d)
    ids = _prompt(n, llm.cfg.vocab_size, n)
    ref = hf_logits(model, ids)
    got = llm.prompt_logits(ids)
    assert got.shape == ref.shape
    assert _rel(got, ref) < TOL, _rel(got, ref)
    kinds = ("gdn_decode", "attn_decode") if n == 1 else ("gdn_prefill", "attn_prefill")  # one token: decode ops
    assert set(kinds) <= set(llm.backend.calls)


def test_chunked_prefill_equals_unchunked_and_hf(ck27):
    d, model, _ = ck27
    llm = _llm(d)
    ids = _prompt(61, llm.cfg.vocab_size, 5)
    ref = hf_logits(model, ids)
    whole = llm.prompt_logits(ids)
    for chunk in (1, 7, 16, 33):
        got = llm.prompt_logits(ids, chunk=chunk)
        assert _rel(got, whole) < 1e-5 and _rel(got, ref) < TOL, chunk


def test_vlm_wrapped_sharded_tied_matches_hf(ck35vlm):
    d, model, _ = ck35vlm
    logs = []
    llm = _llm(d, log=logs.append)
    assert llm.cfg.vlm_wrapped and llm.cfg.tie_word_embeddings
    assert any("mtp.* tensors" in m and "model.visual.* tensors" in m for m in logs)
    ids = _prompt(30, llm.cfg.vocab_size, 9)
    assert _rel(llm.prompt_logits(ids), hf_logits(model, ids)) < TOL


def test_greedy_decode_matches_hf(ck27):
    d, model, _ = ck27
    llm = _llm(d)
    ids = _prompt(13, llm.cfg.vocab_size, 3)
    want, margins = hf_greedy(model, ids, 16)
    assert min(margins) > 1e-3  # this fixture's continuation has no near-tie (else the comparison is noise)
    out = llm.generate(ids, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    assert out.token_ids == want
    assert out.finish_reason == "length"
    calls = llm.backend.calls
    assert {"attn_decode", "gdn_decode", "conv_decode"} <= set(calls)


@pytest.mark.parametrize("overlap", [False, True], ids=["one-by-one", "overlapped"])
def test_batch_equals_alone_and_preemption_recomputes(ck27, overlap):
    d, model, _ = ck27
    V = 300
    prompts = [_prompt(n, V, 100 + n) for n in (3, 40, 1, 25, 9, 60)]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    alone = [_llm(d).generate(p, sp)[0].token_ids for p in prompts[:3]]
    # a small KV cache and token budget force chunked prefill, mixed steps and preemption (overlapped steps admit
    # later -- a finished sequence's room comes back one step later -- so they need a smaller cache to preempt)
    llm = _llm(d, num_blocks=7 if overlap else 8, max_num_batched_tokens=20, max_num_seqs=4, max_model_len=80,
               async_scheduling=overlap)
    outs = llm.generate(prompts, sp)
    assert llm.scheduler.num_preemptions > 0 and (llm.num_ahead_steps > 0) == overlap
    assert [o.token_ids for o in outs[:3]] == alone
    for p, o in zip(prompts[3:], outs[3:]):
        want, _ = hf_greedy(model, p, 10)
        assert o.token_ids == want
    assert llm.scheduler.blocks.num_free == (7 if overlap else 8) and llm.scheduler.slots.num_free == 4


def test_seeded_sampling_reproducible_and_streaming(ck27):
    d, _, tok = ck27
    llm = _llm(d)
    sp = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=7, max_tokens=12, ignore_eos=True)
    deltas = []
    a = llm.generate("the quick brown", sp, on_output=lambda outs: deltas.extend(o.delta_text for o in outs))[0]
    b = llm.generate("the quick brown", sp)[0]
    assert a.token_ids == b.token_ids
    assert "".join(deltas) == a.text == tok.decode(a.token_ids)
    c = llm.generate("the quick brown", SamplingParams(temperature=0.9, seed=8, max_tokens=12, ignore_eos=True))[0]
    assert c.token_ids != a.token_ids  # another seed, another draw (300-token vocabulary, 12 draws)


def test_stop_string_and_eos(ck27):
    d, _, tok = ck27
    llm = _llm(d)
    base = llm.generate("héllo", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert len(base.text) > 4
    stop = base.text[2:4]
    deltas = []
    o = llm.generate("héllo", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]),
                     on_output=lambda outs: deltas.extend(x.delta_text for x in outs))[0]
    assert o.finish_reason == "stop" and o.text == base.text[:base.text.find(stop)]
    assert "".join(deltas) == o.text
    first = base.token_ids[3]
    o = llm.generate("héllo", SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[first]))[0]
    assert o.finish_reason == "stop" and o.token_ids == base.token_ids[:4]
    assert o.text == tok.decode(base.token_ids[:3])


def test_abort_frees_everything(ck27):
    d, _, _ = ck27
    llm = _llm(d)
    rid = llm.add_request(_prompt(30, 300, 1), SamplingParams(max_tokens=50))
    llm.step()
    assert llm.scheduler.blocks.num_free < 80
    llm.abort(rid)
    assert not llm.has_unfinished()
    assert llm.scheduler.blocks.num_free == 80 and llm.scheduler.slots.num_free == 4
