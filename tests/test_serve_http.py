"""vkc_server's HTTP layer against a fake engine (tests/serve_fakes.py: LLM's step API, deterministic tokens),
served by uvicorn on a free port: every endpoint through the official ``openai`` client and through raw
``httpx``, streaming and not, the error cases (status + OpenAI error body), API key on and off, a disconnect
mid-stream (the sequence is aborted at once), 200 concurrent streams (nothing lost, duplicated or out of
order), overload (503 + Retry-After)."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.serve_fakes import TEMPLATE, FakeLLM, ServerThread, expected_text  # noqa: E402
from vkc_engine.chat import render_chat  # noqa: E402
from vkc_server.app import build_app  # noqa: E402
from vkc_server.engine import AsyncEngine  # noqa: E402

MODEL = "tiny"
H = httpx.Client(timeout=30)  # one client (connection reuse) for the raw requests


def _serve(fake, **kw):
    eng = AsyncEngine(fake, max_waiting=kw.pop("max_waiting", 1000))
    return ServerThread(build_app(eng, served_model_names=[MODEL], load_seconds=1.25, **kw)), eng


@pytest.fixture(scope="module")
def srv():
    fake = FakeLLM()
    st, eng = _serve(fake)
    with st:
        yield st, fake, eng


def _client(url, key="none"):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def _enc(text):
    return [ord(c) % 128 for c in text]


def _chat_ids(msgs, **kw):
    return _enc(render_chat(TEMPLATE, msgs, **kw))


def _sse(resp_text):
    """The data payloads of an SSE body (the last must be [DONE])."""
    lines = [ln for ln in resp_text.split("\n") if ln]
    assert all(ln.startswith("data: ") for ln in lines), resp_text[:300]
    data = [ln[len("data: "):] for ln in lines]
    assert data[-1] == "[DONE]" and "[DONE]" not in data[:-1]
    return [json.loads(d) for d in data[:-1]]


# ----------------------------------------------------------------------------------------------- endpoints
def test_models_health_metrics(srv):
    st, fake, _ = srv
    c = _client(st.url)
    assert [m.id for m in c.models.list().data] == [MODEL]
    r = H.get(st.url + "/v1/models")
    assert r.status_code == 200 and r.json()["data"][0]["max_model_len"] == fake.max_model_len
    assert H.get(st.url + "/health").json() == {"status": "ok"}
    c.completions.create(model=MODEL, prompt="abc", max_tokens=3)
    m = H.get(st.url + "/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    body = m.text
    for name in ("vkc_requests_total", "vkc_prompt_tokens_total", "vkc_generation_tokens_total", "vkc_queue_waiting",
                 "vkc_time_to_first_token_seconds_bucket", "vkc_inter_token_latency_seconds_bucket",
                 "vkc_kv_blocks_used", "vkc_kv_blocks_total", "vkc_state_slots_used", "vkc_model_load_seconds 1.25"):
        assert name in body, name
    assert 'vkc_requests_total{endpoint="/v1/completions",status="200"}' in body
    tok = [ln for ln in body.splitlines() if ln.startswith("vkc_generation_tokens_total")]
    assert float(tok[0].split()[-1]) >= 3


def test_completions(srv):
    st, fake, _ = srv
    c = _client(st.url)
    r = c.completions.create(model=MODEL, prompt="hello", max_tokens=5, temperature=0)
    assert r.choices[0].text == expected_text(_enc("hello"), None, 5) and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 5 and r.usage.total_tokens == 10
    assert r.object == "text_completion" and r.model == MODEL
    # n, seed, several prompts (text and token ids), stop: choice i of prompt p at index p * n + i
    r = c.completions.create(model=MODEL, prompt=["ab", "xyz"], n=2, seed=10, max_tokens=4, stop=["@@"])
    want = [expected_text(_enc(p), 10 + i, 4) for p in ("ab", "xyz") for i in range(2)]
    assert sorted((ch.index, ch.text) for ch in r.choices) == list(enumerate(want))
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 16
    r = c.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=3)
    assert r.choices[0].text == expected_text([5, 6, 7], None, 3)
    # the engine got the parameters
    rid = [k for k, (ids, _) in fake.added.items() if ids == [5, 6, 7]][-1]
    r = c.completions.create(model=MODEL, prompt="q", max_tokens=2, temperature=0.3, top_p=0.5,
                             presence_penalty=0.5, frequency_penalty=-0.5,
                             extra_body={"top_k": 7, "min_p": 0.1, "repetition_penalty": 1.2, "ignore_eos": True})
    p = [prm for ids, prm in fake.added.values() if ids == _enc("q")][-1]
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.presence_penalty, p.frequency_penalty, p.repetition_penalty,
            p.ignore_eos, p.max_tokens) == (0.3, 0.5, 7, 0.1, 0.5, -0.5, 1.2, True, 2)
    assert rid
    # a stop string cuts the text and finishes with "stop"
    full = expected_text(_enc("hello"), None, 8)
    r = c.completions.create(model=MODEL, prompt="hello", max_tokens=8, stop=full[3:5])
    assert r.choices[0].text == full[:3] and r.choices[0].finish_reason == "stop"
    # raw httpx: the same JSON
    h = H.post(st.url + "/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 5})
    assert h.status_code == 200 and h.json()["choices"][0]["text"] == expected_text(_enc("hello"), None, 5)


def test_completions_stream(srv):
    st, _, _ = srv
    c = _client(st.url)
    chunks = list(c.completions.create(model=MODEL, prompt="hello", max_tokens=6, stream=True,
                                       stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == expected_text(_enc("hello"), None, 6)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens == 5
    with httpx.stream("POST", st.url + "/v1/completions",
                      json={"model": MODEL, "prompt": "hey", "max_tokens": 4, "stream": True, "n": 2, "seed": 3}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse(r.read().decode())
    got = {0: "", 1: ""}
    for e in events:
        assert e["object"] == "text_completion"
        got[e["choices"][0]["index"]] += e["choices"][0]["text"]
    assert got == {i: expected_text(_enc("hey"), 3 + i, 4) for i in range(2)}


def test_chat(srv):
    st, fake, _ = srv
    c = _client(st.url)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)
    assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
    assert r.choices[0].message.content == expected_text(_chat_ids(msgs), None, 4)
    assert r.usage.prompt_tokens == len(_chat_ids(msgs))
    # chat_template_kwargs reach the template; content parts are joined
    parts = [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]
    r = c.chat.completions.create(model=MODEL, messages=parts, max_completion_tokens=3,
                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    ids = _chat_ids([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert ids != _chat_ids([{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == expected_text(ids, None, 3)
    assert list(fake.added.values())[-1][0] == ids
    # streaming: role first, then content, finish_reason last
    chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, stream=True, n=2, seed=1))
    first = [ch for ch in chunks if ch.choices and ch.choices[0].delta.role == "assistant"]
    assert {ch.choices[0].index for ch in first} == {0, 1}
    for i in range(2):
        mine = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == i]
        assert "".join(x.delta.content or "" for x in mine) == expected_text(_chat_ids(msgs), 1 + i, 5)
        assert mine[-1].finish_reason == "length" and all(x.finish_reason is None for x in mine[:-1])
    with httpx.stream("POST", st.url + "/v1/chat/completions",
                      json={"model": MODEL, "messages": msgs, "max_tokens": 3, "stream": True}) as h:
        events = _sse(h.read().decode())
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == expected_text(_chat_ids(msgs), None,
                                                                                                  3)


def test_logprobs(srv):
    st, _, _ = srv
    c = _client(st.url)
    msgs = [{"role": "user", "content": "lp"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert [x.token for x in content] == list(r.choices[0].message.content)
    assert [x.logprob for x in content] == pytest.approx([-0.5, -0.51, -0.52])
    assert [len(x.top_logprobs) for x in content] == [2, 2, 2]
    assert content[0].top_logprobs[0].token == content[0].token and content[0].bytes == list(content[0].token.encode())
    chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, logprobs=True, top_logprobs=1,
                                            stream=True))
    streamed = [x for ch in chunks if ch.choices and ch.choices[0].logprobs for x in ch.choices[0].logprobs.content]
    assert [x.token for x in streamed] == [x.token for x in content]
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3)
    assert r.choices[0].logprobs is None
    r = c.completions.create(model=MODEL, prompt="lp", max_tokens=3, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset == [0, 1, 2]
    assert lp.token_logprobs == pytest.approx([-0.5, -0.51, -0.52]) and all(len(t) == 2 for t in lp.top_logprobs)


# ----------------------------------------------------------------------------------------------- errors
def _err(r, status, code=None, param=None):
    assert r.status_code == status, (r.status_code, r.text)
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if code is not None:
        assert e["code"] == code
    if param is not None:
        assert e["param"] == param
    return e


def test_errors_raw(srv):
    st, fake, _ = srv
    u = st.url
    for path in ("/v1/completions", "/v1/chat/completions"):
        _err(H.post(u + path, content=b"{not json", headers={"content-type": "application/json"}), 400)
        _err(H.post(u + path, content=b"[1, 2]"), 400)
    _err(H.post(u + "/v1/completions", json={"model": "nope", "prompt": "x"}), 404, "model_not_found", "model")
    _err(H.post(u + "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
         404, "model_not_found")
    long = "x" * fake.max_model_len
    e = _err(H.post(u + "/v1/completions", json={"model": MODEL, "prompt": long}), 400, "context_length_exceeded")
    assert str(fake.max_model_len) in e["message"] and str(len(long)) in e["message"]
    e = _err(H.post(u + "/v1/completions", json={"model": MODEL, "prompt": "x" * 200, "max_tokens": 100}), 400,
             "context_length_exceeded")
    assert "256" in e["message"] and "300" in e["message"] and "200" in e["message"]
    e = _err(H.post(u + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 10,
                                                          "messages": [{"role": "user", "content": long}]}), 400,
             "context_length_exceeded")
    for bad in ({"max_tokens": -1}, {"max_tokens": 0}, {"top_p": 0}, {"top_p": 1.5}, {"temperature": -0.1},
                {"n": 0}, {"logprobs": 21}, {"presence_penalty": 3}, {"top_k": -5}, {"prompt": []}):
        body = {"model": MODEL, "prompt": "x", **bad}
        e = _err(H.post(u + "/v1/completions", json=body), 400)
        assert e["param"] == next(iter(bad)) or e["param"].startswith(next(iter(bad))), (bad, e)
    _err(H.post(u + "/v1/completions", json={"model": MODEL, "prompt": [1, 500]}), 400, param="prompt")
    _err(H.post(u + "/v1/chat/completions", json={"model": MODEL, "messages": []}), 400, param="messages")
    _err(H.post(u + "/v1/completions", json={"prompt": "x"}), 400, param="model")
    _err(H.get(u + "/v1/nothing"), 404)
    assert all(len(v[0]) < fake.max_model_len for v in fake.added.values())  # nothing rejected reached the engine


def test_errors_through_the_client(srv):
    st, _, _ = srv
    c = _client(st.url)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="context length"):
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 300}])
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt="x", top_p=1.5)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt="x", max_tokens=-1)


def test_api_key():
    fake = FakeLLM()
    st, _ = _serve(fake, api_key="sekrit")
    with st:
        assert _client(st.url, "sekrit").completions.create(model=MODEL, prompt="ab", max_tokens=2).choices[0].text
        with pytest.raises(openai.AuthenticationError):
            _client(st.url, "wrong").completions.create(model=MODEL, prompt="ab", max_tokens=2)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            _err(H.post(st.url + "/v1/chat/completions", headers=headers,
                            json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}), 401,
                 "invalid_api_key")
            _err(H.get(st.url + "/v1/models", headers=headers), 401)
        assert H.get(st.url + "/health").status_code == 200 and H.get(st.url + "/metrics").status_code == 200
        n = len(fake.added)
        assert n == 1  # the refused requests never reached the engine


# ----------------------------------------------------------------------------------------------- load
def _wait(cond, timeout=10.0):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.005)
    return True


def test_disconnect_mid_stream_aborts_at_once():
    fake = FakeLLM(step_delay=0.01)
    st, eng = _serve(fake)
    with st:
        for path, body in (("/v1/completions", {"prompt": "abc"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "abc"}]})):
            n_abort = len(fake.aborted)
            with httpx.stream("POST", st.url + path, json={"model": MODEL, "max_tokens": 200,
                                                           "stream": True, **body}) as r:
                it = r.iter_lines()
                got = [next(it) for _ in range(6)]
                assert any(ln.startswith("data: {") for ln in got)
            t0 = time.monotonic()
            assert _wait(lambda: len(fake.aborted) > n_abort, 2.0), "the sequence was not aborted"
            dt = time.monotonic() - t0
            assert dt < 1.0
            assert _wait(lambda: not fake.scheduler.running)
            assert fake.scheduler.blocks.num_free == fake.scheduler.blocks.num_blocks
            assert fake.aborted[-1] not in fake.finished
        # a non-streaming request whose client goes away is aborted too
        fake.step_delay = 0.05
        n_abort = len(fake.aborted)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(st.url + "/v1/completions", json={"model": MODEL, "prompt": "zz", "max_tokens": 200},
                       timeout=0.3)
        assert _wait(lambda: len(fake.aborted) > n_abort, 3.0)
    assert fake.thread_ids and len(fake.thread_ids) == 1  # only the engine thread touched the engine


def test_200_concurrent_streams_complete_and_in_order():
    fake = FakeLLM(max_num_seqs=64)
    st, eng = _serve(fake)
    N = 200

    async def one(client, i):
        prompt = f"req {i:03d}"
        n_tok = 5 + i % 7
        kind = i % 2
        if kind:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": n_tok, "stream": True}
            path = "/v1/completions"
        else:
            body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": n_tok,
                    "stream": True}
            path = "/v1/chat/completions"
        async with client.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            events = _sse((await r.aread()).decode())
        ids = {e["id"] for e in events}
        assert len(ids) == 1
        if kind:
            text = "".join(e["choices"][0]["text"] for e in events)
            want = expected_text(_enc(prompt), None, n_tok)
        else:
            text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
            want = expected_text(_chat_ids([{"role": "user", "content": prompt}]), None, n_tok)
        assert text == want, (i, text, want)
        return ids.pop()

    async def run_all():
        limits = httpx.Limits(max_connections=N, max_keepalive_connections=N)
        async with httpx.AsyncClient(base_url=st.url, limits=limits, timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(N)))

    with st:
        ids = asyncio.run(run_all())
    assert len(set(ids)) == N
    assert len(fake.added) == N and len(fake.finished) == N and not fake.aborted
    assert not fake.has_unfinished()


def test_overload_503_with_retry_after():
    fake = FakeLLM(max_num_seqs=4)
    fake.paused = True
    st, eng = _serve(fake, max_waiting=3)

    async def go():
        async with httpx.AsyncClient(base_url=st.url, timeout=30) as client:
            body = {"model": MODEL, "prompt": "ab", "max_tokens": 3}
            held = [asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(3)]
            while len(fake.scheduler.waiting) < 3:
                await asyncio.sleep(0.01)
            r = await client.post("/v1/completions", json=body)
            _err(r, 503, "overloaded")
            assert r.headers["retry-after"] == "1"
            r = await client.post("/v1/completions", json=dict(body, n=2))
            _err(r, 503, "overloaded")
            with pytest.raises(openai.InternalServerError):  # the client's view (retries off)
                _client(st.url).completions.create(model=MODEL, prompt="ab", max_tokens=3)
            fake.paused = False
            done = await asyncio.gather(*held)
            assert [d.status_code for d in done] == [200] * 3
            assert (await client.post("/v1/completions", json=body)).status_code == 200

    with st:
        asyncio.run(go())
    assert len(fake.finished) == 4 and not fake.aborted


def test_shutdown_ends_streams_and_stops_the_engine():
    fake = FakeLLM(step_delay=0.01)
    st, eng = _serve(fake)
    with st:
        with httpx.stream("POST", st.url + "/v1/completions",
                          json={"model": MODEL, "prompt": "abc", "max_tokens": 50, "stream": True}) as r:
            it = r.iter_lines()
            next(it)
            st.server.should_exit = True  # what SIGTERM does
            rest = "\n".join(it)
        assert "[DONE]" in rest
    assert not eng.alive and not eng._thread.is_alive()
    assert not fake.has_unfinished() or fake.aborted


def test_bench_serve_client_side_against_the_fake():
    """benchmarks/bench_serve.py's load generator and stream parser (the GPU run drives them against vkc serve)."""
    from benchmarks.bench_serve import _load
    fake = FakeLLM(max_num_seqs=8)
    st, _ = _serve(fake)

    def body(w, i):
        return {"model": MODEL, "prompt": [w + 1, i + 1], "max_tokens": 6, "stream": True, "logprobs": 0,
                "stream_options": {"include_usage": True}}
    with st:
        res = asyncio.run(_load(st.url, 4, 0.5, body, True))
    assert res["errors"] == 0 and res["completed"] >= 4 and res["output_tokens"] == 6 * res["completed"]
    assert res["ttft_ms"]["n"] == res["completed"] and res["itl_ms"]["n"] == 5 * res["completed"]
    assert len(fake.finished) == res["completed"]
