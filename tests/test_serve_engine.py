"""vkc_server end to end on the real engine: LLM on the numpy backend with a tiny random checkpoint, served by
uvicorn; the official client's streamed greedy chat completion equals LLM.chat's offline output, and a
completion with penalties and logprobs equals LLM.generate's. Plus `vkc serve`'s argument wiring."""
from __future__ import annotations

import json

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

from tests.engine_fixtures import make_checkpoint  # noqa: E402
from tests.engine_numpy_backend import NumpyBackend  # noqa: E402
from tests.serve_fakes import ServerThread  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
            "<think></think>{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    make_checkpoint(d, layer_types=["linear_attention", "full_attention"], hidden=128, intermediate=256, seed=9)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return d


def test_served_outputs_equal_the_offline_engine(ck):
    from vkc_engine import LLM, SamplingParams
    from vkc_server.app import build_app
    from vkc_server.engine import AsyncEngine
    llm = LLM(ck, backend=NumpyBackend(), max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64)
    msgs = [{"role": "user", "content": "the quick brown"}]
    want_chat = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                         enable_thinking=False)[0]
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, repetition_penalty=1.5, frequency_penalty=0.5,
                        logprobs=2)
    want_cmpl = llm.generate("fox jumps", sp)[0]
    assert len(want_chat.token_ids) == 8 and want_chat.text
    with ServerThread(build_app(AsyncEngine(llm), served_model_names=["tiny"])) as st:
        c = openai.OpenAI(base_url=st.url + "/v1", api_key="x", max_retries=0, timeout=60)
        chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True,
                                                            "chat_template_kwargs": {"enable_thinking": False}}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == want_chat.text
        assert chunks[-1].usage.completion_tokens == 8
        assert chunks[-1].usage.prompt_tokens == len(want_chat.prompt_token_ids)
        r = c.completions.create(model="tiny", prompt="fox jumps", max_tokens=6, temperature=0, logprobs=2,
                                 frequency_penalty=0.5, extra_body={"ignore_eos": True, "repetition_penalty": 1.5})
        assert r.choices[0].text == want_cmpl.text and r.usage.completion_tokens == 6
        np.testing.assert_allclose(r.choices[0].logprobs.token_logprobs, [lp.logprob for lp in want_cmpl.logprobs],
                                   rtol=1e-5, atol=1e-6)
        tok = llm.tokenizer
        assert r.choices[0].logprobs.tokens == [tok.decode([t], skip_special_tokens=False)
                                                for t in want_cmpl.token_ids]
    assert llm.scheduler.blocks.num_free == llm.scheduler.blocks.num_blocks


def test_cli_serve_passes_its_options(ck, monkeypatch):
    from click.testing import CliRunner

    import vkc_server
    from vkc_cli.main import main
    got = {}
    monkeypatch.setattr(vkc_server, "serve", lambda model_dir, **kw: got.update(kw, model_dir=model_dir))
    r = CliRunner().invoke(main, ["serve", "--model", str(ck), "--port", "9123", "--max-num-seqs", "5",
                                  "--max-model-len", "128", "--gpu-memory-fraction", "0.5", "--served-model-name", "m",
                                  "--api-key", "k", "--host", "0.0.0.0", "--dequantize-experts"])
    assert r.exit_code == 0, r.output
    assert got == dict(model_dir=str(ck), host="0.0.0.0", port=9123, max_num_seqs=5, max_model_len=128,
                       max_num_batched_tokens=2048, memory_fraction=0.5, served_model_name="m", api_key="k",
                       max_waiting=256, load_format="safetensors", quantized_experts=False, log=got["log"])
