"""Stream resolution, owning streams and graph capture with a fake driver (CPU)."""
from __future__ import annotations

import gc

import pytest
from cuda.bindings import driver as cu_real

from vkc_runtime import driver
from vkc_runtime.errors import CudaError
from vkc_runtime.stream import Graph, Stream, capture_status, is_capturing, resolve_stream

try:
    from .runtime_support import no_real_driver, clean_env, fake_cu  # noqa: F401
except ImportError:  # tests/ not a package
    from runtime_support import no_real_driver, clean_env, fake_cu  # noqa: F401


class TorchLikeStream:
    cuda_stream = 0x1234


class Stream2:  # cupy.cuda.Stream-like: class name contains "Stream", handle in .ptr
    ptr = 0x5678


class Protocol:
    def __cuda_stream__(self):
        return (0, 0x9ABC)


class PtrHolder:
    ptr = 0x1000


def test_resolve_stream_variants():
    assert resolve_stream(None) == 0
    assert resolve_stream(0) == 0 and resolve_stream(2) == 2 and resolve_stream(0xDEAD) == 0xDEAD
    assert resolve_stream(TorchLikeStream()) == 0x1234
    assert resolve_stream(Stream2()) == 0x5678
    assert resolve_stream(Protocol()) == 0x9ABC
    assert resolve_stream(cu_real.CUstream(0x77)) == 0x77
    with pytest.raises(ValueError):
        resolve_stream(-1)
    with pytest.raises(TypeError):
        resolve_stream(True)
    with pytest.raises(TypeError, match="cannot use .*PtrHolder as a CUDA stream"):
        resolve_stream(PtrHolder())
    with pytest.raises(TypeError):
        resolve_stream("0")

    class Bad:
        def __cuda_stream__(self):
            return 5
    with pytest.raises(TypeError, match="expected \\(version, handle\\)"):
        resolve_stream(Bad())


def test_owning_stream(fake_cu):
    s = Stream()
    assert fake_cu.calls("cuStreamCreate") == [(int(cu_real.CUstream_flags.CU_STREAM_NON_BLOCKING),)]
    h = s.handle
    assert resolve_stream(s) == h and s.__cuda_stream__() == (0, h) and int(s) == h
    s.synchronize()
    assert fake_cu.calls("cuStreamSynchronize") == [(h,)]
    s.destroy()
    assert fake_cu.calls("cuStreamDestroy") == [(h,)] and s.handle == 0
    s.destroy()  # idempotent
    assert len(fake_cu.calls("cuStreamDestroy")) == 1
    s2 = Stream(non_blocking=False)
    h2 = s2.handle
    assert fake_cu.calls("cuStreamCreate")[-1] == (0,)
    del s2
    gc.collect()
    assert fake_cu.calls("cuStreamDestroy")[-1] == (h2,)


def test_graph_capture_and_replay(fake_cu):
    s = Stream()
    g = Graph()
    with g.capture(s):
        assert is_capturing(s) and capture_status(s) == "active"
    assert not is_capturing(s)
    mode = int(cu_real.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    assert fake_cu.calls("cuStreamBeginCapture") == [(s.handle, mode)]
    assert fake_cu.calls("cuStreamEndCapture") == [(s.handle,)]
    assert fake_cu.calls("cuGraphInstantiate") == [(0x6A00, 0)]
    g.replay()
    other = Stream()
    g.replay(other)
    assert fake_cu.calls("cuGraphLaunch") == [(0x6E00, s.handle), (0x6E00, other.handle)]
    with pytest.raises(RuntimeError, match="already holds"):
        with g.capture(s):
            pass
    g.reset()
    assert fake_cu.calls("cuGraphExecDestroy") == [(0x6E00,)] and fake_cu.calls("cuGraphDestroy") == [(0x6A00,)]
    with pytest.raises(RuntimeError, match="before a successful capture"):
        g.replay()


def test_graph_capture_cleans_up_on_exception(fake_cu):
    s = Stream()
    g = Graph()
    with pytest.raises(KeyError):
        with g.capture(s):
            raise KeyError("boom")
    assert fake_cu.calls("cuStreamEndCapture") == [(s.handle,)]
    assert fake_cu.calls("cuGraphDestroy") == [(0x6A00,)]
    assert "cuGraphInstantiate" not in fake_cu.names()
    assert not g.ready and not is_capturing(s)


def test_graph_capture_invalidated(fake_cu):
    s = Stream()
    fake_cu.end_capture_result = cu_real.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    g = Graph()
    with pytest.raises(CudaError, match="CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.*non-capturable"):
        with g.capture(s):
            pass
    assert not g.ready


def test_graph_refuses_default_streams(fake_cu):
    g = Graph()
    for h in (None, 0, 1, 2):
        with pytest.raises(ValueError, match="default stream"):
            with g.capture(h):
                pass
    assert "cuStreamBeginCapture" not in fake_cu.names()
    with pytest.raises(ValueError, match="capture mode"):
        with g.capture(Stream(), mode="weird"):
            pass


@no_real_driver
def test_is_capturing_without_driver(clean_env):
    driver.reset_caches()
    try:
        with pytest.raises(driver.DriverUnavailable):
            is_capturing(0x10)
    finally:
        driver.reset_caches()


def test_releases_collected_inside_a_capture_run_after_its_end(fake_cu):
    """A stream and a graph dropped inside the capture (and the collector, off there) are released only once the
    stream has stopped capturing: after cuStreamEndCapture, not when the ``with`` body ends."""
    s = Stream()
    g = Graph()
    leftover, old = Stream(), Graph()
    with old.capture(leftover):
        pass
    with g.capture(s):
        assert not gc.isenabled()
        del leftover, old
        gc.collect()
        assert "cuStreamDestroy" not in fake_cu.names()
    assert gc.isenabled()
    names = fake_cu.names()
    ends = [i for i, n in enumerate(names) if n == "cuStreamEndCapture"]
    assert names.index("cuStreamDestroy") > ends[-1] and names.index("cuGraphExecDestroy") > ends[-1]
