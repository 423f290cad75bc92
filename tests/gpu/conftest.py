"""GPU-suite bookkeeping: after each test module, one line in pytest's terminal output with the device memory the
driver reports free, what torch's caching allocator reserves, and how many vkc driver calls had to release other
allocators' caches to get memory (vkc_runtime.driver.oom_retries). A long run in one process accumulates torch's
cache; these lines show where memory went when a late module fails. And each failure's report at once (the log,
and $VKC_ERR_DIR/failures.txt), not only in the summary a time limit can cut off."""
from __future__ import annotations

import os
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


def pytest_runtest_logreport(report):
    """A failure's report as soon as it happens: into the log (the summary at the end is lost when a device call's
    time limit cuts the run) and, when VKC_ERR_DIR is set (tools/gpu/run.sh), appended to failures.txt there."""
    if not report.failed:
        return
    text = f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n"
    d = os.environ.get("VKC_ERR_DIR")
    if d:
        with open(os.path.join(d, "failures.txt"), "a") as f:
            f.write(text)
    print("\n" + text, file=sys.__stderr__, flush=True)
