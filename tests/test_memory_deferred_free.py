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
