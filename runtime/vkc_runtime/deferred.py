"""Device frees held back during vkc graph captures (``cuMemFree`` is not capturable: it would invalidate a
capture in progress, and the error would only surface at a later launch). ``vkc_runtime.Graph.capture`` runs
inside :func:`frees_deferred`; ``DeviceArray``'s finalizer asks :func:`defer` first. A leaf module, so that
``memory`` and ``stream`` both use it without importing each other."""
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
