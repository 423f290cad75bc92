"""The plan cache (vkc_runtime.plans.cache, .tuning): lookup priority, the miss timing method through a fake timer,
single-flight tuning, the warm-up lifecycle (load before warm-up, publish only after success, frozen misses fail
before anything is tuned or written), per-call misses, and no parsing or writing inside a capture."""
from __future__ import annotations

import threading
import time

import pytest

from tests.plans_support import ARCH, FakeTimer, cfg, meta, plans_of
from vkc_runtime.plans import PlanCache, PlanError, PlanMissError, capturing, gemm_key, store
from vkc_runtime.plans.tuning import measure, select

K1, K16, K64 = gemm_key(1, 5120, 6144), gemm_key(16, 5120, 6144), gemm_key(64, 5120, 6144)


class Runs:
    """make_run for the cache: counts launches per (key, tactic)."""

    def __init__(self):
        self.calls: dict = {}

    def __call__(self, key, tid):
        def run():
            self.calls[(key, tid)] = self.calls.get((key, tid), 0) + 1
        return run


def new(tmp_path, mode="readwrite", defaults=None, fi=None, path="plans.json", **kw):
    return PlanCache(ARCH, meta(), cfg(mode, **kw), path=None if path is None else tmp_path / path,
                     defaults=defaults, flashinfer=fi)


# ------------------------------------------------------------------ timing method

def test_measure_method_3_warmups_sync_delay_10_timed():
    t, n = FakeTimer([50.0]), []
    us = measure(t, lambda: (n.append(1), t.log.append("run"))[0], delay_us=5000)
    assert us == 5.0
    assert t.log == ["run"] * 3 + ["sync", ("delay", 5000), "record"] + ["run"] * 10 + ["record", "sync"]
    t = FakeTimer([10.0])
    measure(t, lambda: None, delay_us=0)
    assert ("delay", 0) not in t.log and t.log[:2] == ["sync", "record"]
    assert select([(2, 1.0), (0, 1.0), (1, 3.0)]) == 0
    with pytest.raises(RuntimeError):
        measure(FakeTimer([-5.0]), lambda: None, delay_us=0)


# ------------------------------------------------------------------ lookup priority

def test_priority_flashinfer_then_native_then_default(tmp_path):
    store.publish(tmp_path / "plans.json", meta(), plans_of((1, 5120, 6144, 1), (16, 5120, 6144, 1)))
    c = new(tmp_path, defaults={K1: 2, K16: 2, K64: 2}, fi=lambda: {K1: 0})
    c.start()
    assert c.lookup(K1) == (0, "flashinfer")
    assert c.lookup(K16) == (1, "file")
    assert c.lookup(K64) == (2, "default")
    assert c.lookup(gemm_key(128, 5120, 6144)) is None
    assert (c.stats["imported"], c.stats["loaded"], c.stats["defaults"]) == (1, 2, 3)


def test_loaded_hit_runs_no_tuning_and_miss_tunes_once(tmp_path):
    store.publish(tmp_path / "plans.json", meta(), plans_of((1, 5120, 6144, 1)))
    c, runs, t = new(tmp_path), Runs(), FakeTimer([30.0, 20.0, 40.0])
    c.warmup([K1], runs, t)
    assert runs.calls == {} and t.log == [] and c.stats["tuned"] == 0 and c.stats["saved"] == 0
    c.warmup([K1, K16, K16], runs, t)
    assert c.lookup(K16) == (1, "tuned")                            # tactic 1 took 20 us
    assert runs.calls == {(K16, 0): 13, (K16, 1): 13, (K16, 2): 13}  # 3 warm-ups + 10 timed each, once
    assert c.stats["tuned"] == 1 and c.stats["tune_calls"] == 3
    c.warmup([K16], runs, t)
    assert c.stats["tune_calls"] == 3                              # a tuned key is a hit now


def test_single_flight(tmp_path):
    c = new(tmp_path, path=None)
    c.start()
    gate, entered = threading.Event(), []

    def make_run(key, tid):
        def run():
            entered.append(tid)
            gate.wait(5)
        return run

    out = []
    ths = [threading.Thread(target=lambda: out.append(c._tune(K16, make_run, FakeTimer([1.0] * 3))))
           for _ in range(4)]
    for th in ths:
        th.start()
    time.sleep(0.2)
    gate.set()
    for th in ths:
        th.join(10)
    assert out == [0, 0, 0, 0] and c.stats["tune_calls"] == 3 and c.stats["tuned"] == 1


# ------------------------------------------------------------------ lifecycle

def test_load_before_warmup_and_publish_only_after_success(tmp_path):
    p = tmp_path / "plans.json"
    c = new(tmp_path)
    c.start()
    assert c.started and not c.ready and not p.exists()

    def failing(key, tid):
        if key == K64:
            raise RuntimeError("launch failed")
        return lambda: None
    with pytest.raises(RuntimeError, match="launch failed"):
        c.warmup([K1, K16, K64], failing, FakeTimer())
    assert not p.exists() and not c.ready                          # nothing published after a failed warm-up
    c.warmup([K1, K16], Runs(), FakeTimer())
    assert c.ready and c.stats["saved"] == 2
    assert {k.m_bucket for k in store.load(p, meta())} == {1, 16}
    c2 = new(tmp_path)                                              # a fresh process loads them: zero tuning
    c2.warmup([K1, K16], Runs(), FakeTimer())
    assert c2.stats["loaded"] == 2 and c2.stats["tuned"] == 0 and c2.stats["tune_calls"] == 0


def test_frozen_miss_fails_before_tuning_or_writing(tmp_path):
    p = tmp_path / "plans.json"
    store.publish(p, meta(), plans_of((1, 5120, 6144, 1)))
    before = p.read_bytes()
    c, runs = new(tmp_path, "frozen"), Runs()
    with pytest.raises(PlanMissError, match="1 of 2 declared keys"):
        c.warmup([K1, K16], runs, FakeTimer())
    assert runs.calls == {} and not c.ready and p.read_bytes() == before
    assert c.choose(K1) == 1
    with pytest.raises(PlanMissError):
        c.choose(K16)
    assert c.stats["lazy_misses"] == 1


def test_frozen_rejects_a_bad_file_and_needs_one(tmp_path):
    (tmp_path / "plans.json").write_text('{"_metadata": {}}')
    with pytest.raises(PlanError, match="rejected"):
        new(tmp_path, "frozen").start()
    with pytest.raises(PlanError, match="needs a plan file"):
        new(tmp_path, "frozen", path=None).start()


def test_readwrite_rejected_file_is_reported_and_replaced(tmp_path):
    p = tmp_path / "plans.json"
    p.write_text("not json")
    c = new(tmp_path)
    rep = c.start()
    assert rep["rejected"] == 1 and rep["loaded"] == 0 and "malformed JSON" in rep["rejections"][0]
    c.warmup([K1], Runs(), FakeTimer())
    assert list(store.load(p, meta())) == [K1]


def test_off_mode_tunes_in_process_and_touches_no_file(tmp_path):
    p = tmp_path / "plans.json"
    store.publish(p, meta(), plans_of((1, 5120, 6144, 1)))
    before = p.read_bytes()
    c = new(tmp_path, "off")
    c.warmup([K1, K16], Runs(), FakeTimer())
    assert c.stats["loaded"] == 0 and c.stats["tuned"] == 2 and c.stats["saved"] == 0
    assert p.read_bytes() == before


def test_per_call_miss_is_counted_and_falls_back(tmp_path):
    c = new(tmp_path, defaults={K1: 2})
    c.start()
    assert c.choose(K1) == 2 and c.choose(K16) is None and c.stats["lazy_misses"] == 1


def test_nothing_parsed_tuned_or_written_inside_capture(tmp_path):
    c = new(tmp_path)
    with capturing():
        with pytest.raises(PlanError, match="inside a graph capture"):
            c.start()
    c.start()
    with capturing():
        with pytest.raises(PlanError, match="inside a graph capture"):
            c.warmup([K1], Runs(), FakeTimer())
        with pytest.raises(PlanError, match="inside a graph capture"):
            c.save()
        assert c.choose(K1) is None                                  # lookups are fine
    assert not (tmp_path / "plans.json").exists()


def test_report_and_start_line(tmp_path):
    c = new(tmp_path, defaults={K1: 2})
    rep = c.start()
    for k in ("path", "mode", "fingerprint", "loaded", "tuned", "rejected", "saved", "imported", "defaults"):
        assert k in rep
    assert rep["fingerprint"] == store.fingerprint(meta()) and len(rep["fingerprint"]) == 16
    line = c.start_line()
    assert "mode=readwrite" in line and rep["fingerprint"] in line and "loaded=0" in line
    assert c.selected() == {str(K1): 2}

