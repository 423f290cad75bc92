"""Shared pieces of the plan-cache CPU tests: the metadata of a fake sm_90a process, plan entries, a fake timer."""
from __future__ import annotations

from vkc_runtime.plans import gemm_key, store
from vkc_runtime.plans.config import PlanConfig

ARCH = "sm_90a"


def meta(**over):
    m = store.metadata(arch=ARCH, device_name="NVIDIA H200", cc=(9, 0), sm_count=132, cuda_driver=13000,
                       cuda_runtime="cuda-bindings 13.0.0", kernel_set="ab" * 32, delay_us=5000)
    m.update(over)
    return m


def ent(m, n, k, tactic):
    return store.entry(ARCH, gemm_key(m, n, k), tactic)


def plans_of(*rows):
    return {store.entry_key(e): e for e in (ent(*r) for r in rows)}


def cfg(mode="readwrite", **kw):
    return PlanConfig(mode=mode, **kw)


class FakeTimer:
    """Records the timing sequence; each record() reads the next injected timestamp (us)."""

    def __init__(self, times_us=None):
        self.log: list = []
        self.clock = 0.0
        self.durations = list(times_us or [])

    def synchronize(self):
        self.log.append("sync")

    def delay(self, us):
        self.log.append(("delay", us))

    def record(self):
        self.log.append("record")
        if self.log.count("record") % 2 == 0:  # the end event of a timed block
            self.clock += self.durations.pop(0) if self.durations else 1.0
        return self.clock

    def elapsed_us(self, a, b):
        return b - a
