"""Streams and CUDA graphs.

:func:`resolve_stream` maps what users pass as ``stream=`` to a ``CUstream`` handle (int):

* ``None`` -> 0, the legacy default stream (vkc's documented default);
* an ``int`` handle (0 legacy default, 1 ``CU_STREAM_LEGACY``, 2 ``CU_STREAM_PER_THREAD``, else a handle);
* objects with ``__cuda_stream__()`` returning ``(version, handle)`` (CUDA stream protocol; cuda.core);
* ``.cuda_stream`` (torch.cuda.Stream), ``.ptr`` (cupy.cuda.Stream), ``.handle`` (vkc :class:`Stream`);
* ``cuda.bindings.driver.CUstream`` objects.

:class:`Graph` captures what is launched on a non-default stream and replays it::

    s = Stream()
    g = Graph()
    op(x, out, stream=s)            # run once eagerly first: sizes scratch pools, loads modules
    with g.capture(s):
        op(x, out, stream=s)
    g.replay(s)

Inside a capture: no allocation, synchronisation or host copies. Capture uses
``CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`` by default, so other threads' unsafe calls do not invalidate it.
"""
from __future__ import annotations

import contextlib
import threading
import weakref

from . import deferred, driver
from .errors import CudaError

__all__ = ["resolve_stream", "Stream", "Graph", "is_capturing", "capture_status", "LEGACY_DEFAULT_STREAMS"]

# 0: legacy default (NULL), 1: CU_STREAM_LEGACY, 2: CU_STREAM_PER_THREAD -- none can be captured
LEGACY_DEFAULT_STREAMS = (0, 1, 2)


def resolve_stream(s) -> int:
    """A ``CUstream`` handle (int) for ``s`` (see module doc); TypeError for anything else."""
    if s is None:
        return 0
    t = type(s)
    if t is int:
        if s < 0:
            raise ValueError(f"stream handle must be >= 0, got {s}")
        return s
    if t is bool:
        raise TypeError("stream must be a stream object or an int handle, not bool")
    if t is Stream:
        return s.handle
    f = getattr(s, "__cuda_stream__", None)
    if f is not None:
        v = f() if callable(f) else f
        try:
            _version, handle = v
        except (TypeError, ValueError):
            raise TypeError(f"__cuda_stream__ of {t.__name__} returned {v!r}, expected (version, handle)") from None
        return int(handle)
    if isinstance(s, driver.cu.CUstream):
        return int(s)
    h = getattr(s, "cuda_stream", None)  # torch.cuda.Stream / ExternalStream
    if h is None and "Stream" in t.__name__:  # cupy.cuda.Stream(.ptr) and other *Stream wrappers (.handle)
        h = getattr(s, "ptr", None)
        if h is None or callable(h):
            h = getattr(s, "handle", None)
    if h is not None and not callable(h):
        return int(h)
    if hasattr(t, "__index__"):
        return resolve_stream(int(s))
    raise TypeError(f"cannot use {t.__module__}.{t.__qualname__} as a CUDA stream; pass None, an int handle, a "
                    f"vkc Stream, a torch/cupy stream or an object with __cuda_stream__")


def _destroy_stream(handle: int, ctx: int) -> None:
    if deferred.defer(lambda: _destroy_stream(handle, ctx)):  # a capture runs (vkc_runtime.deferred)
        return
    try:
        driver.call(driver.cu.cuStreamDestroy, handle)
    except Exception:
        pass


class Stream:
    """An owning CUDA stream (``cuStreamCreate``, non-blocking w.r.t. the legacy stream by default)."""

    def __init__(self, *, non_blocking: bool = True, priority: int | None = None, device: int | None = None):
        cu = driver.cu
        self.ctx = driver.ensure_context(device)
        flags = int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING) if non_blocking else 0
        if priority is None:
            h = driver.call(cu.cuStreamCreate, flags)
        else:
            h = driver.call(cu.cuStreamCreateWithPriority, flags, int(priority))
        self.handle = int(h)
        self._finalizer = weakref.finalize(self, _destroy_stream, self.handle, self.ctx)
        self._finalizer.atexit = False

    def __repr__(self) -> str:
        return f"<vkc Stream {self.handle:#x}{' destroyed' if not self.handle else ''}>"

    def __int__(self) -> int:
        return self.handle

    def __cuda_stream__(self):
        return (0, self.handle)

    def synchronize(self) -> None:
        driver.call(driver.cu.cuStreamSynchronize, self.handle)

    def query(self) -> bool:
        """True when all work on the stream has completed."""
        res = driver.cu.cuStreamQuery(self.handle)
        err = res[0] if isinstance(res, tuple) else res
        if err == driver.cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        driver.check(res, "cuStreamQuery")
        return True

    def destroy(self) -> None:
        if self.handle:
            self._finalizer.detach()
            driver.call(driver.cu.cuStreamDestroy, self.handle)
            self.handle = 0

    close = destroy

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False


def capture_status(stream) -> str:
    """``"none" | "active" | "invalidated"`` for a stream (``cuStreamIsCapturing``)."""
    h = resolve_stream(stream)
    st = driver.call(driver.cu.cuStreamIsCapturing, h)
    S = driver.cu.CUstreamCaptureStatus
    v = int(st)
    if v == int(S.CU_STREAM_CAPTURE_STATUS_NONE):
        return "none"
    if v == int(S.CU_STREAM_CAPTURE_STATUS_ACTIVE):
        return "active"
    return "invalidated"


def is_capturing(stream) -> bool:
    """True while ``stream`` is being captured into a graph (also when the capture was invalidated)."""
    return capture_status(stream) != "none"


_MODES = {"thread_local": "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL", "global": "CU_STREAM_CAPTURE_MODE_GLOBAL",
          "relaxed": "CU_STREAM_CAPTURE_MODE_RELAXED"}


class Graph:
    """A captured and instantiated CUDA graph (see module doc)."""

    def __init__(self):
        self.graph = None
        self.exec = None
        self.stream = None  # handle the graph was captured on (default replay stream)
        self.keepalive: list = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<vkc Graph {'ready' if self.exec is not None else 'empty'}>"

    @property
    def ready(self) -> bool:
        return self.exec is not None

    def keep(self, *objs) -> None:
        """Keep buffers used by the graph alive as long as the graph (the graph does not own them)."""
        self.keepalive.extend(objs)

    @contextlib.contextmanager
    def capture(self, stream, mode: str = "thread_local"):
        """Capture everything launched on ``stream`` inside the ``with`` block, then instantiate it."""
        cu = driver.cu
        h = resolve_stream(stream)
        if h in LEGACY_DEFAULT_STREAMS:
            raise ValueError(f"cannot capture a CUDA graph on the default stream (handle {h}); create a "
                             f"vkc_runtime.Stream() (or a torch/cupy stream) and launch on it")
        if mode not in _MODES:
            raise ValueError(f"capture mode must be one of {sorted(_MODES)}, got {mode!r}")
        if self.exec is not None:
            raise RuntimeError("this Graph already holds a captured graph; call reset() or use a new Graph")
        if is_capturing(h):
            raise RuntimeError(f"stream {h:#x} is already capturing")
        # the whole capture, its end included, inside frees_deferred: no finalizer releases a driver resource and
        # the cycle collector is off until the stream has stopped capturing (held frees run after EndCapture)
        with deferred.frees_deferred():
            driver.call(cu.cuStreamBeginCapture, h, getattr(cu.CUstreamCaptureMode, _MODES[mode]))
            try:
                yield self
            except BaseException:
                self._abort(h)
                raise
            try:
                graph = driver.call(cu.cuStreamEndCapture, h)
            except CudaError as e:
                raise CudaError(e.name, e.code, e.call,
                                "graph capture failed (invalidated by a non-capturable call inside the capture, e.g. "
                                "a synchronisation, a host copy, an allocation, or work on the legacy default "
                                "stream)") from None
        try:
            ex = driver.call(cu.cuGraphInstantiate, graph, 0)
        except BaseException:
            _quiet(cu.cuGraphDestroy, graph)
            raise
        self.graph, self.exec, self.stream = graph, ex, h

    def _abort(self, h: int) -> None:
        cu = driver.cu
        try:
            res = cu.cuStreamEndCapture(h)
        except Exception:
            return
        g = res[1] if isinstance(res, tuple) and len(res) > 1 else None
        if g is not None and int(g):
            _quiet(cu.cuGraphDestroy, g)

    def replay(self, stream=None) -> None:
        """Launch the instantiated graph on ``stream`` (default: the stream it was captured on)."""
        if self.exec is None:
            raise RuntimeError("Graph.replay() before a successful capture")
        h = self.stream if stream is None else resolve_stream(stream)
        driver.call(driver.cu.cuGraphLaunch, self.exec, h)

    launch = replay

    def reset(self) -> None:
        """Destroy the executable and the graph (buffers in keepalive are released)."""
        ex, g = self.exec, self.graph
        self.exec = self.graph = None
        _destroy_graph(ex, g)
        self.keepalive.clear()

    def __del__(self):
        ex, g = self.exec, self.graph
        if ex is None and g is None:
            return
        self.exec = self.graph = None
        try:
            _destroy_graph(ex, g)
        except Exception:
            pass


def _destroy_graph(ex, g) -> None:
    """A collected Graph's handles (deferred while a capture runs: vkc_runtime.deferred)."""
    if deferred.defer(lambda: _destroy_graph(ex, g)):
        return
    cu = driver.cu
    if ex is not None:
        _quiet(cu.cuGraphExecDestroy, ex)
    if g is not None:
        _quiet(cu.cuGraphDestroy, g)


def _quiet(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:
        pass
