"""GPU-suite bookkeeping: after each test module, one line in pytest's terminal output with the device memory the
driver reports free, what torch's caching allocator reserves, and how many vkc driver calls had to release other
allocators' caches to get memory (vkc_runtime.driver.oom_retries). A long run in one process accumulates torch's
cache; these lines show where memory went when a late module fails."""
from __future__ import annotations

import sys

import pytest


@pytest.fixture(scope="module", autouse=True)
def _memory_line(request):
    yield
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    from vkc_runtime import driver
    free, total = torch.cuda.mem_get_info()
    line = (f"[gpu memory after {request.module.__name__.rsplit('.', 1)[-1]}] free {free / 2**30:.1f} of "
            f"{total / 2**30:.1f} GiB, torch reserved {torch.cuda.memory_reserved() / 2**30:.1f} GiB, vkc "
            f"out-of-memory retries {driver.oom_retries()}")
    rep = request.config.pluginmanager.get_plugin("terminalreporter")
    cap = request.config.pluginmanager.get_plugin("capturemanager")
    if rep is not None and cap is not None:
        with cap.global_and_fixture_disabled():  # teardown output is captured otherwise
            rep.write_line(line)
