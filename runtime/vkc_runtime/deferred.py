"""Driver releases held back during vkc graph captures. ``cuMemFree``, ``cuMemFreeHost``, ``cuStreamDestroy`` and
the graph destroys are not capturable: run while a capture is in progress they invalidate it, and the error only
surfaces at ``cuStreamEndCapture``. Finalizers run whenever Python collects an object, so a capture can meet the
release of anything left over from earlier work (a previous engine's stream, pinned staging ring or graphs,
collected by the cycle collector in the middle of the next engine's capture). ``vkc_runtime.Graph.capture`` runs
inside :func:`frees_deferred`; every finalizer that releases a driver resource (``DeviceArray``, ``Stream``,
``Graph``, the engine's pinned ring) asks :func:`defer` first. A leaf module, so that ``memory``, ``stream`` and
the engine use it without importing each other."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable

__all__ = ["frees_deferred", "defer"]

_lock = threading.Lock()
_depth = 0
_pending: list[Callable[[], None]] = []


@contextlib.contextmanager
def frees_deferred():
    """Hold back frees for the duration of the block; nested and concurrent blocks keep them until the last one
    ends, which then runs them."""
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            todo = _pending[:] if _depth == 0 else []
            if todo:
                _pending.clear()
        for free in todo:
            free()


def defer(free: Callable[[], None]) -> bool:
    """Queue ``free`` when a :func:`frees_deferred` block is active (True); else False: free now."""
    with _lock:
        if _depth:
            _pending.append(free)
            return True
    return False
