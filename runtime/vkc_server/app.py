"""The OpenAI-compatible HTTP API (FastAPI) over an :class:`~vkc_server.engine.AsyncEngine`.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream``: server-sent events in OpenAI's
chunk format, ending ``data: [DONE]``), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus).

Errors are OpenAI's body (``{"error": {"message", "type", "param", "code"}}``): invalid JSON or parameters 400,
a prompt that does not fit the context 400 (with both numbers), unknown model 404, missing or wrong API key 401
(when the server has one; /health and /metrics stay open), overload 503 with ``Retry-After`` (more than
``max_waiting`` requests not yet running), an engine that stopped 503. A client that goes away is noticed at
once (a task waits for the ASGI disconnect message), even while its request is still queued, and its sequences
are aborted (their blocks and slot are free before the next step).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from vkc_engine.chat import ChatTemplateError, render_chat

from .engine import AsyncEngine, EngineDead
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body, sampling_params

__all__ = ["build_app"]

RETRY_AFTER_S = 1     # the overload answer's retry hint


class _ClientGone(Exception):
    pass


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the request body is read already, so the next ASGI message is the
    disconnect)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


class _StatusCounter:
    """Pure ASGI middleware counting answers per endpoint and status (no response wrapping: streaming and
    disconnect detection pass through untouched)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")

        async def send_counted(msg):
            if msg["type"] == "http.response.start":
                self.metrics.requests.labels(path if path.startswith(("/v1/", "/health", "/metrics")) else "other",
                                             str(msg["status"])).inc()
            await send(msg)
        await self.app(scope, receive, send_counted)


def build_app(engine: AsyncEngine, *, served_model_names: list[str], api_key: str | None = None,
              load_seconds: float | None = None) -> FastAPI:
    names = list(served_model_names)
    metrics = Metrics(engine)
    if load_seconds is not None:
        metrics.load_seconds.set(load_seconds)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="vkc", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.metrics = engine, metrics
    app.add_middleware(_StatusCounter, metrics=metrics)

    # ----------------------------------------------------------------------------------------- errors
    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e: StarletteHTTPException):
        typ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(e.detail), typ), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        return JSONResponse(error_body(f"internal error: {type(e).__name__}: {e}", "server_error"), status_code=500)

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or token.strip() != api_key:
            raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                           code="invalid_api_key")

    async def parse(request: Request, model):
        check_key(request)
        body = await request.body()
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise APIError(400, "the request body must be a JSON object")
        try:
            req = model.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err.get("loc", ()))
            raise APIError(400, f"invalid parameter {loc}: {err.get('msg')}"
                                + (f" ({len(e.errors())} errors)" if len(e.errors()) > 1 else ""),
                           param=loc or None) from None
        if req.model not in names:
            raise APIError(404, f"the model {req.model!r} does not exist (served: {', '.join(names)})",
                           param="model", code="model_not_found")
        return req

    # ----------------------------------------------------------------------------------------- helpers
    llm_max_len = lambda: engine.llm.max_model_len  # noqa: E731

    def tokenize(prompt) -> list[int]:
        if isinstance(prompt, str):
            try:
                return list(engine.llm.encode(prompt))
            except ValueError as e:
                raise APIError(400, str(e), param="prompt") from None
        vocab = getattr(getattr(engine.llm, "cfg", None), "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in prompt):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
        return list(prompt)

    def fit(ids: list[int], max_tokens: int | None, param: str) -> int:
        L, n = llm_max_len(), len(ids)
        if n == 0:
            raise APIError(400, "the prompt is empty", param=param)
        if n >= L:
            raise APIError(400, f"this model's maximum context length is {L} tokens, the prompt has {n} tokens "
                                "(no room for output)", param=param, code="context_length_exceeded")
        if max_tokens is not None and n + max_tokens > L:
            raise APIError(400, f"this model's maximum context length is {L} tokens, the request needs "
                                f"{n + max_tokens} ({n} in the prompt, {max_tokens} for the completion)",
                           param="max_tokens", code="context_length_exceeded")
        return max_tokens if max_tokens is not None else L - n

    def admit(n_new: int) -> None:
        if not engine.alive:
            raise APIError(503, "the engine is not running", type="server_error", code="engine_unavailable")
        if engine.overloaded(n_new):
            raise APIError(503, f"the server is overloaded ({engine.num_waiting()} requests waiting, limit "
                                f"{engine.max_waiting}); retry later", type="server_error", code="overloaded",
                           headers={"Retry-After": str(RETRY_AFTER_S)})

    def token_text(tid: int) -> str:
        tok = getattr(engine.llm, "tokenizer", None)
        return tok.decode([tid], skip_special_tokens=False) if tok is not None else f"token_id:{tid}"

    def submit_all(subs) -> tuple[asyncio.Queue, dict[str, int]]:
        q: asyncio.Queue = asyncio.Queue()
        index = {}
        try:
            for i, (rid, ids, params) in enumerate(subs):
                engine.submit(rid, ids, params, q)
                index[rid] = i
        except EngineDead as e:
            for rid in index:
                engine.abort(rid)
            raise APIError(503, str(e), type="server_error", code="engine_unavailable") from None
        return q, index

    async def outputs(request: Request, q: asyncio.Queue, index: dict[str, int], t0: float):
        """The RequestOutputs of all choices as they come (until each finished); raises _ClientGone when the
        client disconnects (at once, even while nothing is produced) and APIError when the engine refused a
        choice. Records TTFT / ITL / tokens."""
        left = set(index)
        last: dict[str, float] = {}
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while left:
                if q.empty():
                    get = asyncio.ensure_future(q.get())
                    await asyncio.wait((get, gone), return_when=asyncio.FIRST_COMPLETED)
                    if not get.done():
                        get.cancel()
                        raise _ClientGone()
                    o = get.result()
                else:
                    o = q.get_nowait()
                o = _check(o)
                now = time.perf_counter()
                n = len(o.delta_token_ids)
                if n:
                    metrics.generation_tokens.inc(n)
                    prev = last.get(o.request_id)
                    if prev is None:
                        metrics.ttft.observe(now - t0)
                    else:
                        for _ in range(n):
                            metrics.itl.observe((now - prev) / n)
                    last[o.request_id] = now
                if o.finished:
                    left.discard(o.request_id)
                    metrics.e2e.observe(now - t0)
                yield o
        finally:
            gone.cancel()

    def _check(o):
        if isinstance(o, BaseException):
            if isinstance(o, EngineDead):
                raise APIError(503, str(o), type="server_error", code="engine_unavailable")
            raise APIError(400, str(o))
        return o

    @contextlib.asynccontextmanager
    async def guarded(index: dict[str, int]):
        """Abort whatever has not finished when the consumer leaves (disconnect, error, cancellation)."""
        done: set[str] = set()
        try:
            yield done
        finally:
            for rid in index:
                if rid not in done:
                    engine.abort(rid)

    def sse(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    # ----------------------------------------------------------------------------------------- logprobs
    def completion_logprobs(lps, text_start: int):
        toks = [token_text(lp.token_id) for lp in lps]
        offs, o = [], text_start
        for t in toks:
            offs.append(o)
            o += len(t)
        return {"tokens": toks, "token_logprobs": [lp.logprob for lp in lps],
                "top_logprobs": [{token_text(t): v for t, v in lp.top} for lp in lps], "text_offset": offs}

    def chat_logprobs(lps, n_top: int):
        def entry(tid, v):
            s = token_text(tid)
            return {"token": s, "logprob": v, "bytes": list(s.encode("utf-8"))}
        return {"content": [dict(entry(lp.token_id, lp.logprob),
                                 top_logprobs=[entry(t, v) for t, v in lp.top[:n_top]]) for lp in lps]}

    async def finished_outputs(request: Request, q: asyncio.Queue, index: dict[str, int], t0: float):
        """A non-streaming request's final RequestOutput per request id, or None when the client left."""
        final = {}
        async with guarded(index) as done:
            try:
                async for o in outputs(request, q, index, t0):
                    if o.finished:
                        final[o.request_id] = o
                        done.add(o.request_id)
            except _ClientGone:
                return None
        return final

    async def collected(request: Request, q: asyncio.Queue, index: dict[str, int], t0: float, head: dict,
                        n_prompt: int, choice):
        """A non-streaming request's body: ``choice(o, i)`` of each final output in choice order and the usage;
        499 when the client left."""
        final = await finished_outputs(request, q, index, t0)
        if final is None:
            return Response(status_code=499)
        choices = [choice(final[rid], i) for rid, i in sorted(index.items(), key=lambda kv: kv[1])]
        return dict(head, choices=choices, usage=usage(n_prompt, sum(len(o.token_ids) for o in final.values())))

    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def streamed(request: Request, req, q: asyncio.Queue, index: dict[str, int], t0: float, head: dict,
                 n_prompt: int, chunk, first=()) -> StreamingResponse:
        """A streaming request's SSE response: a chunk per choice in ``first``, then one per output that
        ``chunk(o)`` turns into a choice (None: nothing to send), the error chunk when the engine refused a
        choice, the usage chunk when ``stream_options.include_usage``, ``[DONE]``. A client that leaves ends
        it (what has not finished is aborted)."""
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        async def events():
            ntok = 0
            async with guarded(index) as done:
                for c in first:
                    yield sse(dict(head, choices=[c]))
                try:
                    async for o in outputs(request, q, index, t0):
                        ntok += len(o.delta_token_ids)
                        c = chunk(o)
                        if o.finished:
                            done.add(o.request_id)
                        if c is not None:
                            yield sse(dict(head, choices=[c]))
                except _ClientGone:
                    return
                except APIError as e:
                    yield sse(e.body())
                if include_usage:
                    yield sse(dict(head, choices=[], usage=usage(n_prompt, ntok)))
                yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # ----------------------------------------------------------------------------------------- endpoints
    @app.get("/health")
    async def health():
        if not engine.alive:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "vkc",
                                            "max_model_len": llm_max_len()} for n in names]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        t0 = time.perf_counter()
        req = await parse(request, CompletionRequest)
        if req.echo:
            raise APIError(400, "echo is not supported", param="echo")
        prompts = [tokenize(p) for p in req.prompts()]
        maxes = [fit(ids, req.max_tokens, "prompt") for ids in prompts]
        admit(len(prompts) * req.n)
        cid = engine.new_id("cmpl")
        subs = [(f"{cid}-{pi * req.n + i}", ids, sampling_params(req, mt, req.logprobs, i))
                for pi, (ids, mt) in enumerate(zip(prompts, maxes)) for i in range(req.n)]
        n_prompt = sum(len(p) for p in prompts)
        metrics.prompt_tokens.inc(n_prompt)
        q, index = submit_all(subs)
        head = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": req.model}

        if req.stream:
            sent = {rid: 0 for rid in index}

            def chunk(o):
                lp = None
                if req.logprobs is not None and o.delta_logprobs:
                    lp = completion_logprobs(o.delta_logprobs, sent[o.request_id])
                sent[o.request_id] += len(o.delta_text)
                if o.delta_text or lp is not None or o.finished:
                    return {"index": index[o.request_id], "text": o.delta_text, "logprobs": lp,
                            "finish_reason": o.finish_reason}
                return None
            return streamed(request, req, q, index, t0, head, n_prompt, chunk)

        def choice(o, i):
            lp = completion_logprobs(o.logprobs or [], 0) if req.logprobs is not None else None
            return {"index": i, "text": o.text, "logprobs": lp, "finish_reason": o.finish_reason}
        return await collected(request, q, index, t0, head, n_prompt, choice)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        t0 = time.perf_counter()
        req = await parse(request, ChatCompletionRequest)
        msgs = [m.as_template_input() for m in req.messages]
        try:
            text = render_chat(engine.llm.chat_template, msgs, add_generation_prompt=req.add_generation_prompt,
                               **(req.chat_template_kwargs or {}))
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from None
        ids = tokenize(text)
        mt = fit(ids, req.max_completion_tokens or req.max_tokens, "messages")
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        admit(req.n)
        n_top = req.top_logprobs or 0
        want_lp = n_top if req.logprobs else None
        cid = engine.new_id("chatcmpl")
        subs = [(f"{cid}-{i}", ids, sampling_params(req, mt, want_lp, i)) for i in range(req.n)]
        metrics.prompt_tokens.inc(len(ids))
        q, index = submit_all(subs)
        head = {"id": cid, "object": "chat.completion.chunk" if req.stream else "chat.completion",
                "created": int(time.time()), "model": req.model}

        if req.stream:
            def chunk(o):
                lp = chat_logprobs(o.delta_logprobs, n_top) if want_lp is not None and o.delta_logprobs else None
                if o.delta_text or lp is not None or o.finished:
                    delta = {"content": o.delta_text} if o.delta_text or not o.finished else {}
                    return {"index": index[o.request_id], "delta": delta, "logprobs": lp,
                            "finish_reason": o.finish_reason}
                return None
            roles = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None} for i in range(req.n)]
            return streamed(request, req, q, index, t0, head, len(ids), chunk, first=roles)

        def choice(o, i):
            lp = chat_logprobs(o.logprobs or [], n_top) if want_lp is not None else None
            return {"index": i, "message": {"role": "assistant", "content": o.text}, "logprobs": lp,
                    "finish_reason": o.finish_reason}
        return await collected(request, q, index, t0, head, len(ids), choice)

    return app
