"""`vkc generate` (streaming, exit status) and chat templates, on the numpy backend (no GPU)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.engine_fixtures import make_checkpoint
from tests.engine_numpy_backend import NumpyBackend

pytest.importorskip("transformers")

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    d = tmp_path_factory.mktemp("click")
    make_checkpoint(d, layer_types=["linear_attention", "full_attention"], hidden=128, intermediate=256, seed=6)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return d


def test_generate_streams_the_same_text_as_the_api(ck, monkeypatch):
    import vkc_engine.backend as B
    from vkc_cli.main import main
    from vkc_engine import LLM, SamplingParams
    monkeypatch.setattr(B, "VkcBackend", NumpyBackend)
    r = CliRunner().invoke(main, ["generate", "--model", str(ck), "--prompt", "the quick", "--max-tokens", "6",
                                  "--ignore-eos", "--max-model-len", "64", "--max-num-seqs", "2",
                                  "--max-num-batched-tokens", "32"])
    assert r.exit_code == 0, r.output
    want = LLM(ck, backend=NumpyBackend(), max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32).generate(
        "the quick", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert want.text in r.output and "6 tokens in" in r.output and "finish: length" in r.output
    assert "loading weights" in r.output and "KV cache:" in r.output


def test_generate_reports_a_bad_model_in_one_line(tmp_path):
    from vkc_cli.main import main
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe"}))
    r = CliRunner().invoke(main, ["generate", "--model", str(tmp_path), "--prompt", "x"])
    assert r.exit_code == 1 and "num_hidden_layers is missing" in r.output and "Traceback" not in r.output


def test_chat_template(ck):
    from vkc_engine import LLM, SamplingParams
    from vkc_engine.chat import ChatTemplateError, render_chat
    msgs = [{"role": "user", "content": "héllo"}]
    assert render_chat(TEMPLATE, msgs) == "<|user|>héllo\n<|assistant|>"
    with pytest.raises(ChatTemplateError, match="boom"):
        render_chat("{{ raise_exception('boom') }}", msgs)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render_chat(None, msgs)
    llm = LLM(ck, backend=NumpyBackend(), max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32)
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    a = llm.chat(msgs, sp)[0]
    b = llm.generate(render_chat(TEMPLATE, msgs), sp)[0]
    assert a.token_ids == b.token_ids and a.prompt == "<|user|>héllo\n<|assistant|>"


def test_dummy_load_format(ck):
    import numpy as np
    from vkc_engine import LLM, SamplingParams
    llm = LLM(ck, backend=NumpyBackend(), max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32,
              load_format="dummy")
    lg = llm.prompt_logits([1, 2, 3, 4, 5])
    assert lg.shape == (5, llm.cfg.vocab_size) and np.isfinite(lg).all() and lg.std() > 0
    out = llm.generate([3, 4], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3
    with pytest.raises(ValueError, match="load_format"):
        LLM(ck, backend=NumpyBackend(), load_format="gguf")


def test_bench_engine_runs_on_the_numpy_backend(ck):
    from benchmarks.bench_engine import SHAPES, run
    from vkc_engine.config import parse_config
    assert parse_config(SHAPES["27b"]).layer_types.count("full_attention") == 16  # the real 27B layout
    moe = parse_config(SHAPES["35b-a3b"])
    assert moe.is_moe and moe.layer_types[3::4] == ("full_attention",) * 10 and moe.layer_types.count(
        "full_attention") == 10 and (moe.num_experts, moe.num_experts_per_tok, moe.gdn_qkv_dim) == (256, 8, 8192)
    res = run(ck, batches=(1, 2), prefill=24, steps=2, backend=NumpyBackend(), load_format="safetensors")
    assert res["prefill"]["tokens"] == 24 and [d["batch"] for d in res["decode"]] == [1, 2]
    assert all(d["ms_per_step"] > 0 for d in res["decode"])
