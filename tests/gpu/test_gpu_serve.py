"""`vkc serve` for real on the GPU: a tiny random checkpoint (the 27B head configuration, tests/engine_fixtures.py)
served by a `vkc serve` subprocess; the official OpenAI client's streamed greedy chat completion equals
LLM.chat's offline greedy output for the same prompt (same kernels, batch of one: exactly equal), 8 concurrent
streams complete, a penalized completion with logprobs equals LLM.generate's, and SIGTERM stops the server
cleanly (exit status 0). Needs fastapi, uvicorn, pydantic, prometheus-client, openai, httpx."""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.engine_fixtures import make_checkpoint

pytestmark = pytest.mark.gpu
pytest.importorskip("torch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

HEADS = dict(linear_num_key_heads=16, linear_num_value_heads=48, num_attention_heads=24, num_key_value_heads=4)
LAYERS = ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
            "<think></think>{% endif %}{% endif %}")
MSGS = [{"role": "user", "content": "the quick brown fox"}]
MAX_LEN = 512


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    try:
        from vkc_runtime.ops import gemm  # noqa: F401
    except ImportError:
        pytest.skip("vkc_runtime.ops.gemm is not in this tree")
    from vkc_engine import LLM, SamplingParams
    d = tmp_path_factory.mktemp("gpu_serve")
    make_checkpoint(d, heads=HEADS, layer_types=LAYERS, hidden=512, intermediate=1024, seed=21)
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    # the server's settings (max_num_seqs 8, the default step budget and block size), its own small cache
    llm = LLM(d, max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=MAX_LEN, num_blocks=32, block_size=64)
    want = {
        "chat": llm.chat(MSGS, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), enable_thinking=False)[0],
        "cmpl": llm.generate("fox jumps over", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                               repetition_penalty=1.3, presence_penalty=0.4,
                                                               frequency_penalty=0.3, logprobs=3))[0],
    }
    del llm
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    log = open(d / "serve.log", "w+")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "vkc_cli.main", "serve", "--model", str(d), "--port", str(port),
                             "--max-model-len", str(MAX_LEN), "--max-num-seqs", "8", "--gpu-memory-fraction", "0.2",
                             "--served-model-name", "tiny"], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail("vkc serve exited early:\n" + log.read())
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() - t0 > 180:
                pytest.fail("vkc serve did not become healthy in 180 s")
            time.sleep(0.05)
        yield url, want, proc, time.perf_counter() - t0, log
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_streamed_greedy_chat_equals_the_offline_engine(served):
    url, want, _, ready_s, _ = served
    chunks = list(_client(url).chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=48, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == want["chat"].text
    assert chunks[-1].usage.completion_tokens == 48
    assert chunks[-1].usage.prompt_tokens == len(want["chat"].prompt_token_ids)
    print(f"\nvkc serve: healthy {ready_s:.2f} s after the process started")


def test_penalized_completion_with_logprobs_equals_the_offline_engine(served):
    url, want, _, _, _ = served
    r = _client(url).completions.create(model="tiny", prompt="fox jumps over", max_tokens=24, temperature=0,
                                        logprobs=3, presence_penalty=0.4, frequency_penalty=0.3,
                                        extra_body={"ignore_eos": True, "repetition_penalty": 1.3})
    w = want["cmpl"]
    assert r.choices[0].text == w.text
    got = r.choices[0].logprobs.token_logprobs
    assert max(abs(a - b.logprob) for a, b in zip(got, w.logprobs)) < 1e-4
    assert all(len(t) <= 3 for t in r.choices[0].logprobs.top_logprobs)


def test_concurrent_streams_complete(served):
    url, _, _, _, _ = served
    c = _client(url)

    def one(i):
        n = 0
        for ch in c.completions.create(model="tiny", prompt=f"stream {i}", max_tokens=32, temperature=0.8, seed=i,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}):
            if ch.usage is not None:
                n = ch.usage.completion_tokens
        return n
    with cf.ThreadPoolExecutor(8) as ex:
        assert list(ex.map(one, range(8))) == [32] * 8
    m = httpx.get(url + "/metrics").text
    assert "vkc_time_to_first_token_seconds_count" in m and "vkc_kv_blocks_total" in m


def test_sigterm_stops_the_server(served):
    url, _, proc, _, log = served
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail("vkc serve did not stop within 60 s of SIGTERM")
    log.seek(0)
    out = log.read()
    assert rc == 0, out
    assert "model loaded in" in out
