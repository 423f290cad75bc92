"""DeviceArray frees during a vkc graph capture wait for its end (cuMemFree would invalidate the capture)."""
from types import SimpleNamespace

from vkc_runtime import deferred as D
from vkc_runtime import memory as M


def _record(monkeypatch):
    calls = []
    monkeypatch.setattr(M.driver, "call", lambda fn, *a: calls.append((fn, a)))
    monkeypatch.setattr(M.driver, "current_context", lambda: 7)
    monkeypatch.setattr(M.driver, "cu", SimpleNamespace(cuMemFree="free", cuCtxPushCurrent="push",
                                                        cuCtxPopCurrent="pop"))
    return calls


def test_frees_inside_nested_blocks_run_when_the_last_ends(monkeypatch):
    calls = _record(monkeypatch)
    with D.frees_deferred():
        M._free_device(0x100, 7)
        with D.frees_deferred():
            M._free_device(0x200, 7)
        assert calls == []  # the outer capture still runs
    assert calls == [("free", (0x100,)), ("free", (0x200,))]
    M._free_device(0x300, 7)  # no capture: at once
    assert calls[-1] == ("free", (0x300,))


def test_an_exception_inside_still_releases_the_held_frees(monkeypatch):
    calls = _record(monkeypatch)
    try:
        with D.frees_deferred():
            M._free_device(0x400, 7)
            raise RuntimeError("capture failed")
    except RuntimeError:
        pass
    assert calls == [("free", (0x400,))]


def test_stream_graph_and_pinned_releases_wait_for_the_capture(monkeypatch):
    """Every finalizer that releases a driver resource defers inside a capture: a stream's cuStreamDestroy, a
    collected Graph's destroys, the engine's pinned ring's cuMemFreeHost (a previous engine collected in the
    middle of the next one's capture invalidated it on the H200)."""
    from vkc_engine import backend as B
    from vkc_runtime import stream as S
    calls = []

    def rec(name):  # a driver function that records its call (Graph's destroys call the function directly)
        return lambda *a: calls.append((name, a))
    monkeypatch.setattr(S.driver, "call", lambda fn, *a: fn(*a))
    monkeypatch.setattr(S.driver, "cu", SimpleNamespace(cuStreamDestroy=rec("sdestroy"),
                                                        cuGraphExecDestroy=rec("xdestroy"),
                                                        cuGraphDestroy=rec("gdestroy")))
    drv = SimpleNamespace(cu=SimpleNamespace(cuMemFreeHost=rec("hfree")), call=lambda fn, *a: fn(*a))
    g = S.Graph()
    g.exec, g.graph = 0x10, 0x20
    with D.frees_deferred():
        S._destroy_stream(0x30, 7)
        del g
        B._free_host(drv, 0x40)
        assert calls == []
    assert sorted(calls) == [("gdestroy", (0x20,)), ("hfree", (0x40,)), ("sdestroy", (0x30,)), ("xdestroy", (0x10,))]
    calls.clear()
    S._destroy_stream(0x50, 7)  # no capture: at once
    assert calls == [("sdestroy", (0x50,))]


def test_the_cycle_collector_is_off_inside_and_restored_after():
    import gc
    assert gc.isenabled()
    with D.frees_deferred():
        assert not gc.isenabled()
        with D.frees_deferred():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with D.frees_deferred():
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()
