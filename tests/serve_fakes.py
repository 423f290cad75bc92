"""A fake engine with LLM's step API (vkc_engine.llm.LLM: add_request / step / abort / has_unfinished, encode,
tokenizer, chat_template, max_model_len, scheduler's waiting / running / blocks / slots) for the HTTP layer's
tests, and a uvicorn server running in a thread.

Tokens are deterministic: choice k of a request with prompt ids P and seed s produces token
``T(P, s, k) = 97 + (sum(P) + s + 7 k) % 26`` (a lowercase letter under the character tokenizer), so a test knows
every stream's complete text. Each running sequence holds one block and one slot; finishing or aborting frees
them. ``paused`` keeps everything waiting (overload tests); ``step_delay`` slows each step (disconnect tests).
"""
from __future__ import annotations

import socket
import threading
import time
from collections import deque
from types import SimpleNamespace

from vkc_engine.llm import RequestOutput
from vkc_engine.sampler import Logprob

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
            "<nothink>{% endif %}{% endif %}")


class CharTokenizer:
    def encode(self, text):
        return SimpleNamespace(ids=[ord(c) % 128 for c in text])

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class _Pool:
    def __init__(self, n):
        self.num_blocks = self.num_slots = n
        self.num_free = n


def token(prompt, seed, k) -> int:
    return 97 + (sum(prompt) + (seed or 0) + 7 * k) % 26


def expected_text(prompt_ids, seed, n) -> str:
    return "".join(chr(token(prompt_ids, seed, k)) for k in range(n))


class FakeLLM:
    def __init__(self, *, max_num_seqs: int = 256, max_model_len: int = 256, step_delay: float = 0.0):
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.tokenizer = CharTokenizer()
        self.chat_template = TEMPLATE
        self.cfg = SimpleNamespace(vocab_size=128)
        self.scheduler = SimpleNamespace(waiting=deque(), running=[], blocks=_Pool(max_num_seqs),
                                         slots=_Pool(max_num_seqs))
        self.step_delay = step_delay
        self.paused = False
        self.added: dict[str, tuple] = {}   # request id -> (prompt ids, params)
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.steps = 0
        self.thread_ids: set[int] = set()

    def encode(self, text):
        return self.tokenizer.encode(text).ids

    def add_request(self, prompt, params, request_id=None):
        self.thread_ids.add(threading.get_ident())
        ids = list(prompt)
        if len(ids) >= self.max_model_len:
            raise ValueError("prompt too long")
        if request_id in self.added:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.added[request_id] = (ids, params)
        self.scheduler.waiting.append(SimpleNamespace(rid=request_id, ids=ids, params=params, out=[]))
        return request_id

    def has_unfinished(self):
        return bool(self.scheduler.waiting or self.scheduler.running)

    def _release(self, seq):
        self.scheduler.running.remove(seq)
        self.scheduler.blocks.num_free += 1
        self.scheduler.slots.num_free += 1

    def abort(self, request_id):
        self.thread_ids.add(threading.get_ident())
        s = self.scheduler
        for seq in list(s.waiting):
            if seq.rid == request_id:
                s.waiting.remove(seq)
                self.aborted.append(request_id)
        for seq in list(s.running):
            if seq.rid == request_id:
                self._release(seq)
                self.aborted.append(request_id)

    def step(self):
        self.thread_ids.add(threading.get_ident())
        if self.step_delay:
            time.sleep(self.step_delay)
        s = self.scheduler
        if self.paused:
            time.sleep(0.005)
            return []
        while s.waiting and len(s.running) < self.max_num_seqs:
            s.running.append(s.waiting.popleft())
            s.blocks.num_free -= 1
            s.slots.num_free -= 1
        self.steps += 1
        outs = []
        for seq in list(s.running):
            p = seq.params
            k = len(seq.out)
            t = token(seq.ids, p.seed, k)
            seq.out.append(t)
            text = "".join(chr(x) for x in seq.out)
            reason = None
            for st in p.stop:
                if st in text:
                    text, reason = text[:text.index(st)], "stop"
                    break
            if reason is None and (len(seq.out) >= p.max_tokens or len(seq.ids) + len(seq.out) >= self.max_model_len):
                reason = "length"
            lp = None
            if p.logprobs is not None:
                lp = Logprob(t, -0.5 - 0.01 * k, [(97 + (t - 97 + j) % 26, -0.5 - 0.01 * k - j)
                                                   for j in range(p.logprobs)])
                seq.lps = getattr(seq, "lps", []) + [lp]
            delta = text[len(getattr(seq, "text", "")):]
            seq.text = text
            if reason is not None:
                self._release(seq)
                self.finished.append(seq.rid)
            outs.append(RequestOutput(seq.rid, None, seq.ids, list(seq.out), text, delta, [t], reason is not None,
                                      reason, None if lp is None else list(seq.lps), None if lp is None else [lp]))
        return outs


def free_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


class ServerThread:
    """uvicorn serving ``app`` on a free port of 127.0.0.1 in a daemon thread; ``url`` once started."""

    def __init__(self, app, graceful_s: int = 5):
        import uvicorn
        self.sock = free_socket()
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=graceful_s,
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > 20:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(20)
        self.sock.close()
