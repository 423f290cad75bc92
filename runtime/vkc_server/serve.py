"""``vkc serve``: load the model, then answer HTTP on uvicorn until SIGTERM / SIGINT.

The socket opens only once the engine is built (weights read, caches allocated), so the first accepted
request is served by a ready engine: nothing is compiled or tuned at run time. On SIGTERM uvicorn stops
accepting, lets running requests finish for ``graceful_s`` seconds (then cancels them: their sequences are
aborted), and the lifespan shutdown stops the engine thread and drops the engine with its device memory; the
process then exits with status 0.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

__all__ = ["serve", "make_server"]


def make_server(llm, *, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
                api_key: str | None = None, max_waiting: int = 256, graceful_s: int = 30, load_seconds=None,
                log_level: str = "info", log=None):
    """A ``uvicorn.Server`` serving ``llm`` (an LLM, or anything with its step API)."""
    import uvicorn  # noqa: PLC0415

    from .app import build_app  # noqa: PLC0415
    from .engine import AsyncEngine  # noqa: PLC0415
    name = served_model_name or Path(getattr(llm, "model_dir", "model")).name
    engine = AsyncEngine(llm, max_waiting=max_waiting, log=log)
    app = build_app(engine, served_model_names=[name], api_key=api_key, load_seconds=load_seconds)
    cfg = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=graceful_s,
                         access_log=False)
    return uvicorn.Server(cfg)


def serve(model_dir, *, host: str = "127.0.0.1", port: int = 8000, max_num_seqs: int = 32,
          max_model_len: int | None = None, max_num_batched_tokens: int = 2048, memory_fraction: float = 0.85,
          served_model_name: str | None = None, api_key: str | None = None, load_format: str = "safetensors",
          max_waiting: int = 256, backend=None, log=None, quantized_experts: bool = True) -> None:
    """Build the LLM on ``model_dir`` and serve it (blocks until shutdown)."""
    from vkc_engine import LLM  # noqa: PLC0415
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    llm = LLM(model_dir, backend=backend, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
              max_num_batched_tokens=max_num_batched_tokens, memory_fraction=memory_fraction,
              load_format=load_format, log=log, quantized_experts=quantized_experts)
    load_s = time.perf_counter() - t0
    log(f"vkc serve: model loaded in {load_s:.2f} s; listening on http://{host}:{port} (pid {os.getpid()})")
    server = make_server(llm, host=host, port=port, served_model_name=served_model_name, api_key=api_key,
                         max_waiting=max_waiting, load_seconds=load_s, log=log)
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn re-raises the signal after its graceful shutdown
        signal.signal(sig, _exit_cleanly)
    server.run()


def _exit_cleanly(signum, frame):
    raise SystemExit(0)
