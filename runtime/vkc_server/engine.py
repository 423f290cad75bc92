"""The engine behind the HTTP layer: one background thread owns the LLM and runs its step loop; every request
gets an asyncio queue of its outputs.

The engine object is anything with LLM's step API (vkc_engine.llm.LLM, or the tests' fake):
``add_request(token_ids, params, request_id)``, ``step() -> [RequestOutput]``, ``abort(request_id)``,
``has_unfinished()``, ``encode(text)``, ``tokenizer``, ``chat_template``, ``max_model_len`` and
``scheduler`` (``waiting``, ``running``, ``blocks.num_free/num_blocks``, ``slots.num_free/num_slots``: read
for the metrics and the overload check).

Only the engine thread touches the engine. The event loop hands it commands (add, abort) through a locked list
and a wake-up event; the thread applies them between steps (an abort frees the sequence's blocks and slot
before the next step), runs a step, and posts the step's outputs back to the loop in one
``call_soon_threadsafe``. A request's queue receives its RequestOutputs, the last one finished; an add the
engine refused puts the exception there instead (as does an engine that stops: EngineDead).
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
import traceback

__all__ = ["AsyncEngine", "EngineDead"]


class EngineDead(RuntimeError):
    """The engine thread stopped (shut down, or a step raised): no request can be served."""


class _Request:
    __slots__ = ("queue", "loop")

    def __init__(self, loop, queue=None):
        self.loop, self.queue = loop, queue if queue is not None else asyncio.Queue()


class AsyncEngine:
    def __init__(self, llm, *, max_waiting: int = 256, log=None):
        self.llm = llm
        self.max_waiting = int(max_waiting)
        self.log = log or (lambda msg: None)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._adds: list = []
        self._aborts: list[str] = []
        self._reqs: dict[str, _Request] = {}   # engine thread only
        self._ids = itertools.count()
        self._stop = False
        self.error: BaseException | None = None
        self.stats = {"waiting": 0, "running": 0, "steps": 0}
        self._thread = threading.Thread(target=self._loop, name="vkc-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ loop side
    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}-{time.monotonic_ns() % 10**9}"

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop

    def num_waiting(self) -> int:
        """Requests not yet running: queued adds plus the scheduler's waiting queue (a snapshot)."""
        with self._lock:
            pending = len(self._adds)
        return pending + len(self.llm.scheduler.waiting)

    def overloaded(self, n_new: int = 1) -> bool:
        return self.num_waiting() + n_new > self.max_waiting

    def submit(self, request_id: str, token_ids: list[int], params, queue: asyncio.Queue | None = None
               ) -> asyncio.Queue:
        """Queue a request (call on the event loop); returns the queue its outputs arrive on (``queue``: share
        one among the choices of an HTTP request; outputs carry their request id)."""
        if not self.alive:
            raise EngineDead("the engine is not running" + (f": {self.error}" if self.error else ""))
        r = _Request(asyncio.get_running_loop(), queue)
        with self._lock:
            self._adds.append((request_id, token_ids, params, r))
        self._wake.set()
        return r.queue

    def abort(self, request_id: str) -> None:
        """Cancel a request (safe from any thread, for finished or unknown ids too)."""
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort everything, stop the thread and drop the engine (its device memory goes with it)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)
        self.llm = _Stopped(self.llm)

    # ------------------------------------------------------------------------------------------ thread side
    def _apply_commands(self) -> None:
        with self._lock:
            adds, self._adds = self._adds, []
            aborts, self._aborts = self._aborts, []
        for rid in aborts:
            self.llm.abort(rid)
            self._reqs.pop(rid, None)
        aborted = set(aborts)
        for rid, ids, params, r in adds:
            if rid in aborted:
                continue
            try:
                self.llm.add_request(ids, params, request_id=rid)
            except Exception as e:  # noqa: BLE001 -- handed to the request as its answer
                r.loop.call_soon_threadsafe(r.queue.put_nowait, e)
                continue
            self._reqs[rid] = r

    def _post(self, outs) -> None:
        by_loop: dict = {}
        for o in outs:
            r = self._reqs.get(o.request_id)
            if r is None:
                continue
            if o.finished:
                del self._reqs[o.request_id]
            by_loop.setdefault(r.loop, []).append((r.queue, o))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_deliver, items)

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._apply_commands()
                if not self.llm.has_unfinished():
                    self._update_stats()
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                outs = self.llm.step()
                self.stats["steps"] += 1
                self._update_stats()
                if outs:
                    self._post(outs)
        except BaseException as e:  # noqa: BLE001 -- every waiting request learns why
            self.error = e
            self.log("engine step failed:\n" + traceback.format_exc())
        finally:
            self._stop = True
            err = EngineDead(f"the engine stopped: {self.error}" if self.error else "the server is shutting down")
            with self._lock:
                adds, self._adds = self._adds, []
            pending = [r for *_, r in adds] + list(self._reqs.values())
            for rid in list(self._reqs):
                try:
                    self.llm.abort(rid)
                except Exception:  # noqa: BLE001
                    pass
            self._reqs.clear()
            for r in pending:
                try:
                    r.loop.call_soon_threadsafe(r.queue.put_nowait, err)
                except RuntimeError:  # that loop is closed already
                    pass

    def _update_stats(self) -> None:
        s = self.llm.scheduler
        self.stats.update(waiting=len(s.waiting), running=len(s.running),
                          blocks_used=s.blocks.num_blocks - s.blocks.num_free, blocks_total=s.blocks.num_blocks,
                          slots_used=s.slots.num_slots - s.slots.num_free, slots_total=s.slots.num_slots)


def _deliver(items) -> None:
    for q, o in items:
        q.put_nowait(o)


class _Stopped:
    """What is left of the engine after shutdown: its scheduler view for a last metrics scrape, nothing else."""

    def __init__(self, llm):
        self.scheduler = _EmptyScheduler(llm.scheduler)
        self.max_model_len = llm.max_model_len
        self.tokenizer = getattr(llm, "tokenizer", None)
        self.chat_template = getattr(llm, "chat_template", None)


class _EmptyScheduler:
    def __init__(self, s):
        self.waiting, self.running = (), ()
        self.blocks, self.slots = s.blocks, s.slots
