"""Both host paths of an op, for the bound-call GPU tests."""
from __future__ import annotations


def validated_then_bound(monkeypatch):
    """Yield "0" then "1" with VKC_FASTPATH set to it and every bound call forgotten before each pass: the first
    pass validates every call, the second binds on its first call of a layout and replays the rest."""
    from vkc_runtime import bound
    for fast in ("0", "1"):
        monkeypatch.setenv("VKC_FASTPATH", fast)
        bound.clear_bound_calls()
        yield fast
