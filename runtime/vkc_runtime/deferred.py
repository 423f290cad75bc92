"""Driver releases held back during vkc graph captures. ``cuMemFree``, ``cuMemFreeHost``, ``cuStreamDestroy`` and
the graph destroys are not capturable: run while a capture is in progress they invalidate it, and the error only
surfaces at ``cuStreamEndCapture``. Finalizers run whenever Python collects an object, so a capture can meet the
release of anything left over from earlier work (a previous engine's stream, pinned staging ring or graphs,
collected by the cycle collector in the middle of the next engine's capture). ``vkc_runtime.Graph.capture`` runs
inside :func:`frees_deferred`; every finalizer that releases a driver resource (``DeviceArray``, ``Stream``,
``Graph``, the engine's pinned ring) asks :func:`defer` first. Finalizers of other libraries' objects (torch's
graphs and pools, say) cannot be deferred, so the cycle collector is also off while a block is active (as when
the first block began): nothing reachable only through a reference cycle is finalized inside a capture (it is
collected after). A leaf module, so that ``memory``, ``stream`` and the engine use it without importing each
other."""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Callable

__all__ = ["frees_deferred", "defer", "active"]

_lock = threading.Lock()
_depth = 0
_gc_was_enabled = False
_pending: list[Callable[[], None]] = []


@contextlib.contextmanager
def frees_deferred():
    """Hold back frees (and the cycle collector) for the duration of the block; nested and concurrent blocks keep
    them until the last one ends, which then runs them (and turns the collector back on if it was on)."""
    global _depth, _gc_was_enabled
    with _lock:
        if _depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            todo = _pending[:] if _depth == 0 else []
            if todo:
                _pending.clear()
            if _depth == 0 and _gc_was_enabled:
                gc.enable()
        for free in todo:
            free()


def active() -> bool:
    """Whether a :func:`frees_deferred` block (a vkc graph capture) is running."""
    return _depth > 0


def defer(free: Callable[[], None]) -> bool:
    """Queue ``free`` when a :func:`frees_deferred` block is active (True); else False: free now."""
    with _lock:
        if _depth:
            _pending.append(free)
            return True
    return False
