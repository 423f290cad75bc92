"""vkc_server: ``vkc serve``, an OpenAI-compatible HTTP server on vkc_engine's step API (FastAPI + uvicorn).

    from vkc_server import serve
    serve("/path/to/Qwen3.6-27B", port=8000)        # or: vkc serve --model /path/to/Qwen3.6-27B

Modules: protocol (request schema -> SamplingParams, OpenAI error body), engine (the step loop in one thread,
per-request asyncio queues), metrics (Prometheus), app (the endpoints), serve (LLM + uvicorn).
Imports vkc_engine; vkc_engine never imports it. Needs the ``serve`` extra (fastapi, uvicorn, pydantic,
prometheus-client).
"""
from .serve import make_server, serve

__all__ = ["serve", "make_server"]
