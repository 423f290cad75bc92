"""`vkc serve` under load, measured from outside: a `vkc serve` subprocess, then N concurrent streaming clients
for S seconds per concurrency level, each sending completion requests back to back.

    python benchmarks/bench_serve.py [OUT.json] [--tiny]          # a tiny random checkpoint (the default;
                                                                  #   needs torch + transformers to make it)
    python benchmarks/bench_serve.py --shape 27b                  # the real 27B shape, random weights (dummy)
    python benchmarks/bench_serve.py --model DIR [--clients 1,8,64] [--seconds 60] [--max-tokens 128]
                                     [--prompt-len 128] [--max-num-seqs 64] [--out F]

Cold start: process start -> /health answers (``ready_s``) -> first completed request (``first_request_s``,
the figure to set against a JIT engine's warm-up), with the weights + cache load time the server reports
(``vkc_model_load_seconds`` in /metrics) split out. Per concurrency level: completed requests, errors (any
non-200 or broken stream counts; none are expected), output tokens/s over the window, TTFT and inter-token
latency p50/p90/p99 (ITL: gaps between a stream's consecutive token chunks). Without a tokenizer (``--shape``)
the requests ask for ``logprobs: 0`` so every token arrives as its own chunk even when its text is empty.
Prompts are token ids (random, fixed seed) so every request has exactly ``--prompt-len`` prompt tokens.

Prints one JSON object and writes it to --out.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _pct(xs, q):
    return float(np.percentile(np.asarray(xs, np.float64), q)) if len(xs) else None


def _summary(xs, scale=1e3):
    return {f"p{q}": (None if not xs else _pct(xs, q) * scale) for q in (50, 90, 99)} | {"n": len(xs)}


async def _stream_one(client, body, per_token: bool):
    """One streaming request: (ttft_s, [itl_s], n_tokens) or raises."""
    t0 = time.perf_counter()
    first, last, itl, ntok = None, None, [], 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError(ev["error"]["message"])
            if ev.get("usage"):
                ntok = ev["usage"]["completion_tokens"]
            if not ev.get("choices"):
                continue
            ch = ev["choices"][0]
            n = len(ch["logprobs"]["tokens"]) if per_token and ch.get("logprobs") else (1 if ch.get("text") else 0)
            if n == 0:
                continue
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                itl += [(now - last) / n] * n
            last = now
    if first is None:
        raise RuntimeError("a stream ended without tokens")
    return first - t0, itl, ntok


async def _load(url, clients, seconds, make_body, per_token):
    import httpx  # noqa: PLC0415
    ttft, itl, ntok, done, errors = [], [], 0, 0, []
    stop_at = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def worker(w):
            nonlocal ntok, done
            i = 0
            while time.perf_counter() < stop_at:
                try:
                    t, gaps, n = await _stream_one(client, make_body(w, i), per_token)
                except Exception as e:  # noqa: BLE001 -- counted and reported
                    errors.append(f"{type(e).__name__}: {e}")
                else:
                    ttft.append(t)
                    itl.extend(gaps)
                    ntok += n
                    done += 1
                i += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(clients)))
        wall = time.perf_counter() - t0
    return {"clients": clients, "seconds": wall, "completed": done, "errors": len(errors), "error_samples": errors[:5],
            "output_tokens": ntok, "output_tok_s": ntok / wall, "requests_s": done / wall,
            "ttft_ms": _summary(ttft), "itl_ms": _summary(itl)}


def _metric(text, name):
    for ln in text.splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[-1])
    return None


def run(model_dir, *, clients=(1, 8, 64), seconds=60.0, max_tokens=128, prompt_len=128, max_num_seqs=64,
        max_model_len=4096, load_format="safetensors", vocab=None, per_token=False, extra_args=()):
    import httpx  # noqa: PLC0415
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "vkc_cli.main", "serve", "--model", str(model_dir), "--port", str(port),
           "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len), "--served-model-name", "bench",
           "--max-waiting", "100000", "--load-format", load_format, *extra_args]
    log_path = Path(tempfile.mkdtemp()) / "serve.log"
    log = open(log_path, "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError("vkc serve exited:\n" + log_path.read_text()[-3000:])
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        ready = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        V = vocab or 200
        prompts = [[int(t) for t in rng.integers(1, V, prompt_len)] for _ in range(256)]

        def body(w, i):
            b = {"model": "bench", "prompt": prompts[(w * 7919 + i) % len(prompts)], "max_tokens": max_tokens,
                 "temperature": 0.8, "seed": w * 100003 + i, "stream": True, "ignore_eos": True,
                 "stream_options": {"include_usage": True}}
            if per_token:
                b["logprobs"] = 0
            return b
        r = httpx.post(url + "/v1/completions", timeout=600,
                       json={"model": "bench", "prompt": prompts[0], "max_tokens": 16, "ignore_eos": True})
        r.raise_for_status()
        first = time.perf_counter() - t0
        metrics = httpx.get(url + "/metrics").text
        res = {"cold_start": {"ready_s": ready, "first_request_s": first,
                              "load_s": _metric(metrics, "vkc_model_load_seconds")},
               "config": {"max_tokens": max_tokens, "prompt_len": prompt_len, "max_num_seqs": max_num_seqs,
                          "seconds": seconds, "load_format": load_format}, "levels": []}
        for c in clients:
            res["levels"].append(asyncio.run(_load(url, c, seconds, body, per_token)))
            print(json.dumps(res["levels"][-1]), file=sys.stderr, flush=True)
        proc.send_signal(signal.SIGTERM)
        res["sigterm_exit"] = proc.wait(120)
        return res
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_path", nargs="?", default=None, help="result JSON (as tools/gpu/run.sh passes it)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--model", help="an HF model directory")
    g.add_argument("--tiny", action="store_true", help="a tiny random checkpoint (tests/engine_fixtures.py; the "
                                                      "default)")
    g.add_argument("--shape", help="a real shape with random weights (benchmarks/bench_engine.py SHAPES)")
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    clients = tuple(int(c) for c in a.clients.split(","))
    kw = dict(clients=clients, seconds=a.seconds, max_tokens=a.max_tokens, prompt_len=a.prompt_len,
              max_num_seqs=a.max_num_seqs, max_model_len=a.max_model_len)
    with tempfile.TemporaryDirectory() as d:
        if a.model:
            cfg = json.loads((Path(a.model) / "config.json").read_text())
            vocab = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
            res = run(a.model, vocab=vocab, per_token=not (Path(a.model) / "tokenizer.json").is_file(), **kw)
        elif not a.shape:
            from tests.engine_fixtures import make_checkpoint  # noqa: PLC0415
            heads = dict(linear_num_key_heads=16, linear_num_value_heads=48, num_attention_heads=24,
                         num_key_value_heads=4)
            make_checkpoint(d, heads=heads, hidden=512, intermediate=1024, seed=3)
            res = run(d, vocab=300, per_token=True, **kw)  # byte-level BPE pieces: count tokens, not text chunks
        else:
            from benchmarks.bench_engine import SHAPES  # noqa: PLC0415
            (Path(d) / "config.json").write_text(json.dumps(SHAPES[a.shape]))
            res = run(d, vocab=SHAPES[a.shape]["vocab_size"], per_token=True, load_format="dummy", **kw)
    res["model"] = a.model or a.shape or "tiny"
    txt = json.dumps(res, indent=1)
    print(txt)
    for out in (a.out, a.out_path):
        if out:
            Path(out).write_text(txt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
