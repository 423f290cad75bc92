"""The GEMM plan switches of the command line and what `vkc doctor` / `/metrics` show of the plan cache (CPU).

* `vkc generate` / `vkc serve`: `--frozen-plans` and `--plans-file` (in --help) reach vkc_runtime.plans' own
  settings (the VKC_PLAN_* environment read by ``plans.config.from_env``) before the engine is built; a frozen run
  whose named file does not exist fails with one clear line and builds nothing;
* `vkc tune plans --write-defaults`: the default-plan document it writes validates as the arch's default plan;
* `vkc doctor`: the "gemm plans:" line shows mode, path, the file's state (absent / valid with N plans / rejected
  with the reason) and the fingerprint, and reading it writes nothing;
* `/metrics`: the LLM's plan report as gauges.
"""
from __future__ import annotations

import os
import types

import pytest
from click.testing import CliRunner

from tests.plans_support import ARCH, ent, meta, plans_of
from vkc_cli.main import main


@pytest.fixture()
def plan_env(monkeypatch):
    """The VKC_PLAN_* settings, restored after the test (the CLI writes os.environ)."""
    for k in ("VKC_PLAN_CACHE", "VKC_PLAN_CACHE_MODE", "VKC_PLAN_DEFAULTS", "VKC_PLAN_TUNE_DELAY_US"):
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    return monkeypatch


class Built(Exception):
    pass


def _stub_engine(monkeypatch, seen):
    """vkc_engine.LLM and vkc_server.serve replaced: they record the plan settings in force when called."""
    import vkc_engine
    from vkc_runtime.plans import config

    def record(*a, **kw):
        seen.append(config.from_env())
        raise Built("stub")
    monkeypatch.setattr(vkc_engine, "LLM", record)
    try:
        import vkc_server
        monkeypatch.setattr(vkc_server, "serve", record)
    except ImportError:
        pass


@pytest.mark.parametrize("cmd", ["generate", "serve"])
def test_help_shows_the_plan_options(cmd):
    out = CliRunner().invoke(main, [cmd, "--help"]).output
    assert "--frozen-plans" in out and "--plans-file" in out and "VKC_PLAN_CACHE_MODE=frozen" in out


def _args(cmd, d):
    return [cmd, "--model", str(d)] + (["--prompt", "hi"] if cmd == "generate" else [])


@pytest.mark.parametrize("cmd", ["generate", "serve"])
def test_flags_reach_the_plan_config(cmd, plan_env, tmp_path):
    if cmd == "serve":
        pytest.importorskip("vkc_server")
    seen = []
    _stub_engine(plan_env, seen)
    f = tmp_path / "p.json"
    f.write_text("{}")
    r = CliRunner().invoke(main, _args(cmd, tmp_path) + ["--frozen-plans", "--plans-file", str(f)])
    assert r.exit_code == 1 and "Built: stub" in r.output, r.output
    assert [(c.mode, c.path) for c in seen] == [("frozen", f.resolve())]
    os.environ.pop("VKC_PLAN_CACHE_MODE")
    os.environ.pop("VKC_PLAN_CACHE")
    r = CliRunner().invoke(main, _args(cmd, tmp_path) + ["--plans-file", str(f)])
    assert [(c.mode, c.path) for c in seen[1:]] == [("readwrite", f.resolve())]
    os.environ.pop("VKC_PLAN_CACHE")
    r = CliRunner().invoke(main, _args(cmd, tmp_path))
    assert [(c.mode, c.path) for c in seen[2:]] == [("readwrite", None)]


@pytest.mark.parametrize("cmd", ["generate", "serve"])
def test_frozen_with_a_missing_file_fails_before_the_engine(cmd, plan_env, tmp_path):
    if cmd == "serve":
        pytest.importorskip("vkc_server")
    seen = []
    _stub_engine(plan_env, seen)
    missing = tmp_path / "nope" / "plans.json"
    r = CliRunner().invoke(main, _args(cmd, tmp_path) + ["--frozen-plans", "--plans-file", str(missing)])
    assert r.exit_code == 1 and seen == [] and not missing.parent.exists()
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: frozen GEMM plans: plan file") and \
        f"{missing} does not exist" in lines[0], r.output


def test_bad_plan_setting_is_one_line(plan_env, tmp_path):
    seen = []
    _stub_engine(plan_env, seen)
    plan_env.setenv("VKC_PLAN_TUNE_DELAY_US", "-1")
    r = CliRunner().invoke(main, _args("generate", tmp_path))
    assert r.exit_code == 1 and seen == [] and r.output.startswith("Error: GEMM plan settings: VKC_PLAN_TUNE_DELAY_US")


def test_tune_plans_needs_a_shape_or_write_defaults(plan_env, tmp_path):
    r = CliRunner().invoke(main, ["tune", "plans"])
    assert r.exit_code == 2 and "--write-defaults" in r.output
    r = CliRunner().invoke(main, ["tune", "plans", "--out", str(tmp_path / "a"), "--write-defaults",
                                  str(tmp_path / "b")])
    assert r.exit_code == 2 and "exclude each other" in r.output


def test_tune_plans_write_defaults(plan_env, tmp_path, monkeypatch):
    """--write-defaults: every covered key at every bucket is declared in mode off with the defaults off; the
    tuned entries become a default plan document that defaults.read accepts for the arch."""
    from vkc_runtime import plans
    from vkc_runtime.plans import defaults
    got = {}
    cache = plans.PlanCache(ARCH, meta(), plans.config.PlanConfig(mode="off"), path=None)

    def warmup(shapes, log=None):
        got["env"] = plans.config.from_env()
        got["shapes"] = list(shapes)
        for m, n, k in shapes:  # what a warm-up would tune: the rule's tactic stands in for the timing
            cache._native[plans.gemm_key(m, n, k)] = {**ent(m, n, k, 1), "_source": "tuned"}
        cache.stats["tuned"] = len(shapes)
        return cache.report()
    monkeypatch.setattr(plans, "warmup_gemm", warmup)
    monkeypatch.setattr(plans, "cache_for_context", lambda ctx=None, log=None: cache)
    out = tmp_path / "sm_90a.json"
    r = CliRunner().invoke(main, ["tune", "plans", "--write-defaults", str(out)])
    assert r.exit_code == 0, r.output
    assert (got["env"].mode, got["env"].defaults) == ("off", False)
    assert len(got["shapes"]) == 16 * len(defaults.COVERED_NK)
    m, p = defaults.read(ARCH, out)
    assert len(p) == 16 * len(defaults.COVERED_NK) and set(p.values()) == {1}
    assert m["source"].startswith("tuned: vkc tune plans --write-defaults on NVIDIA H200") and m["sm_count"] == 132
    assert f"wrote {len(p)} default plans -> {out}" in r.output and "defaults/sm_90a.json" in r.output


# ----------------------------------------------------------------------------------- doctor
def test_doctor_on_cpu_shows_mode_and_path(plan_env, tmp_path):
    from vkc_runtime import driver
    if driver.available():
        pytest.skip("assumes a machine without a CUDA driver")
    f = tmp_path / "p.json"
    plan_env.setenv("VKC_PLAN_CACHE", str(f))
    plan_env.setenv("VKC_PLAN_CACHE_MODE", "frozen")
    out = CliRunner().invoke(main, ["doctor"]).output
    line = next(x for x in out.splitlines() if x.startswith("gemm plans:"))
    assert f"mode frozen, file {f} (state and fingerprint unknown: no usable CUDA driver/device" in line, line
    assert not f.exists()


@pytest.fixture()
def fake_identity(plan_env, tmp_path, monkeypatch):
    """plans.inspect's device side replaced: a usable 'driver' and the fake H200 metadata."""
    from vkc_runtime import driver, plans
    path = tmp_path / "d" / "plans.json"
    monkeypatch.setattr(driver, "available", lambda: True)
    monkeypatch.setattr(driver, "ensure_context", lambda device=None: 1)
    monkeypatch.setattr(plans, "_identity",
                        lambda ctx: (ARCH, 132, meta(), plans.config.from_env(), path))
    return plans, path


def _line(plans):
    from vkc_runtime.doctor import _plans_line
    return _plans_line(plans.status(resolve=True), ARCH)


def test_doctor_file_states(fake_identity):
    plans, path = fake_identity
    fp = plans.store.fingerprint(meta())
    assert plans.inspect() == {"arch": ARCH, "mode": "readwrite", "path": str(path), "fingerprint": fp,
                               "file": "absent"}
    assert f"file {path} (absent), fingerprint {fp}" in _line(plans)
    assert not path.parent.exists()  # reading wrote nothing
    plans.store.publish(path, meta(), plans_of((16, 5120, 6144, 1), (300, 14336, 5120, 0)))
    before = path.read_bytes()
    assert f"file {path} (valid, 2 plans), fingerprint {fp}" in _line(plans)
    assert plans.inspect()["plans"] == 2
    other = plans.store.dumps(meta(sm_count=114), [ent(16, 5120, 6144, 1)])
    path.write_bytes(other)
    line = _line(plans)
    assert f"file {path} (rejected: _metadata.sm_count is 114, this process has 132)" in line, line
    path.write_bytes(before)
    os.environ["VKC_PLAN_CACHE_MODE"] = "off"
    assert "(not read (mode off))" in _line(plans)
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["plans.json",
                                                                                             "plans.json.lock"]


# ----------------------------------------------------------------------------------- /metrics
def test_metrics_show_the_plan_report():
    pytest.importorskip("prometheus_client")
    from vkc_server.metrics import Metrics
    rep = {"mode": "frozen", "path": "/p/plans.json", "fingerprint": "ab" * 8, "declared": 60, "loaded": 12,
           "defaults": 48, "tuned": 0, "rejected": 0, "saved": 0}
    eng = types.SimpleNamespace(stats={}, alive=True, num_waiting=lambda: 0, llm=types.SimpleNamespace(plan_report=rep))
    text = Metrics(eng).render().decode()
    assert 'vkc_gemm_plans{count="declared"} 60.0' in text and 'vkc_gemm_plans{count="loaded"} 12.0' in text
    assert 'vkc_gemm_plans{count="defaults"} 48.0' in text and 'vkc_gemm_plans{count="tuned"} 0.0' in text
    assert 'vkc_gemm_plans_info{fingerprint="abababababababab",mode="frozen",path="/p/plans.json"} 1.0' in text
    eng.llm = types.SimpleNamespace()  # an engine without plans: no plan gauges
    assert "vkc_gemm_plans" not in Metrics(eng).render().decode()
