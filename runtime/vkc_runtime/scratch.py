"""Triton's hidden global scratch: the device memory a kernel with ``global_scratch_size > 0`` gets through its
first hidden pointer (one ``global_scratch_size`` slice per CTA; e.g. TMA descriptors built on the device).

Two sources, neither tied to a stream:

* :class:`GlobalScratch` -- a buffer the caller owns, allocated up front as part of an op's workspace
  (``gdn.workspace_for``, ``attention.prefill_workspace``). Launches that take their scratch from it can be
  captured on any stream without a warm-up; a launch that needs more than it holds is refused.
* :class:`ScratchArena` -- the default of one CUDA context, for launches given no workspace: one buffer,
  grown geometrically on eager launches, never freed while the context lives (a graph may have baked its
  pointer), never grown during stream capture (refused with a clear error: pass a workspace, or run the
  same launches once eagerly -- on any stream -- first).

One buffer, of either kind, must not be used by kernels running concurrently on two streams: give each
stream that runs scratch kernels concurrently its own workspace (ARCHITECTURE.md, "Global scratch and graph
capture").
"""
from __future__ import annotations

import threading

from . import driver
from .errors import LaunchError

__all__ = ["scratch_nbytes", "GlobalScratch", "ScratchArena", "arena", "clear_arenas"]


def scratch_nbytes(gx: int, gy: int, gz: int, num_ctas: int, size: int) -> int:
    """Global scratch a launch needs: one ``size`` slice per CTA (Triton's rule)."""
    return gx * gy * gz * num_ctas * size


def _align_up(p: int, align: int) -> int:
    return (p + align - 1) // align * align


class GlobalScratch:
    """A caller-owned global-scratch buffer of ``nbytes`` bytes (allocates: make it before any graph capture).

    ``get`` hands out its (aligned) pointer for a launch needing ``nbytes`` bytes, or refuses."""

    def __init__(self, nbytes: int, *, device: int | None = None):
        from .memory import DeviceArray
        self.nbytes = int(nbytes)
        if self.nbytes <= 0:
            raise ValueError(f"GlobalScratch needs a positive size, got {nbytes}")
        self.buffer = DeviceArray.empty((self.nbytes,), "uint8", device=device)
        self.ptr = self.buffer.ptr
        self.device = self.buffer.device

    def __repr__(self) -> str:
        return f"<vkc GlobalScratch {self.nbytes} B at {self.ptr:#x}>"

    def get(self, nbytes: int, align: int, stream: int = 0, *, what: str = "kernel") -> int:
        if nbytes <= 0:
            return 0
        p = _align_up(self.ptr, max(1, int(align)))
        if p - self.ptr + nbytes > self.nbytes:
            raise LaunchError(f"{what}: needs {nbytes} bytes of global scratch, the workspace's scratch holds "
                              f"{self.nbytes - (p - self.ptr)}; size the workspace for this batch")
        return p


class ScratchArena:
    """The default global scratch of one context (see the module docstring).

    The launch path is one comparison: a buffer that fits is handed out without asking the driver whether the
    stream is capturing. Growth is ``max(need, 2 * old)``; the old buffer is retired (kept alive), so the
    retired buffers together stay below the live one."""

    def __init__(self, ctx: int = 0, *, alloc=None, is_capturing=None):
        self.ctx = ctx
        self._alloc = alloc or _mem_alloc
        self._is_capturing = is_capturing or _stream_is_capturing
        self.ptr, self.nbytes = 0, 0
        self.retired: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def get(self, nbytes: int, align: int, stream: int = 0, *, what: str = "kernel") -> int:
        if nbytes <= 0:
            return 0
        align = max(1, int(align))
        need = nbytes + (align - 1 if align > 256 else 0)  # cuMemAlloc is 256-byte aligned
        if self.nbytes < need:
            with self._lock:
                if self.nbytes < need:
                    if self._is_capturing(stream):
                        raise LaunchError(
                            f"{what}: needs {nbytes} bytes of global scratch, the context's default scratch holds "
                            f"{self.nbytes} and cannot grow during stream capture (stream {stream:#x}). Pass the "
                            f"op a workspace allocated before capture, or run the same launches once eagerly "
                            f"(on any stream) first.")
                    size = max(need, 2 * self.nbytes)
                    if self.nbytes:
                        self.retired.append((self.ptr, self.nbytes))
                    self.ptr, self.nbytes = self._alloc(size), size
        return _align_up(self.ptr, align)

    def size(self) -> int:
        return self.nbytes


def _mem_alloc(n: int) -> int:
    return int(driver.call_taking_memory(driver.cu.cuMemAlloc, n, detail=f"allocating {n} bytes of global scratch"))


def _stream_is_capturing(s: int) -> bool:
    st = driver.call(driver.cu.cuStreamIsCapturing, s)
    return int(st) != int(driver.cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)


_arenas: dict[int, ScratchArena] = {}


def arena(ctx: int) -> ScratchArena:
    """The default scratch of context ``ctx`` (made on first use)."""
    a = _arenas.get(ctx)
    if a is None:
        a = _arenas.setdefault(ctx, ScratchArena(ctx))
    return a


def clear_arenas() -> None:
    """Forget the arenas (tests; their buffers are not freed: graphs may still use them)."""
    _arenas.clear()
