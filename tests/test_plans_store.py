"""The native plan file (vkc_runtime.plans.store, .config): path identity, whole-file rejection (every metadata
field, malformed JSON, duplicate keys, unknown runner/tactic), sorted round trip and current-wins merge,
atomic publish when the writer is killed between write and rename, two processes publishing at once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plans_support import ARCH, ent, meta, plans_of
from vkc_runtime.plans import config as C
from vkc_runtime.plans import gemm_key, store

REPO = Path(__file__).resolve().parents[1]


def doc_text(m, plans):
    return store.dumps(m, plans).decode()


# ------------------------------------------------------------------ path identity

def test_default_path_deterministic_and_namespaced_by_every_input(tmp_path):
    m = meta()
    p = store.default_path(tmp_path, m)
    assert p == store.default_path(tmp_path, meta())
    assert p.parent.parent.parent.parent == tmp_path / "vkc" / "gemm_plans"
    assert p.name == "plans.json" and p.parent.parent.name == ARCH
    changed = {"cuda_driver": 12080, "cuda_runtime": "cuda-bindings 12.9", "kernel_set": "cd" * 32,
               "device_name": "NVIDIA H100", "cc": "9.1", "sm_count": 114, "out_dtype": "fp16",
               "scale_layout": "nvfp4", "tactic_set": {**m["tactic_set"], "digest": "0" * 64},
               "timing": {**m["timing"], "delay_us": 0}, "bucket_version": "other", "format": "x", "sm": "sm_100a"}
    assert set(changed) == set(store.META_FIELDS)
    seen = {p}
    for f, v in changed.items():
        q = store.default_path(tmp_path, meta(**{f: v}))
        assert q not in seen, f"the namespace ignores {f}"
        seen.add(q)


def test_cache_root_and_env(tmp_path):
    assert C.cache_root({"XDG_CACHE_HOME": str(tmp_path), "HOME": "/h"}) == tmp_path
    assert C.cache_root({"XDG_CACHE_HOME": "rel/dir", "HOME": "/h"}) == Path("/h/.cache")
    assert C.cache_root({}) is None
    c = C.from_env({"VKC_PLAN_CACHE": str(tmp_path / "f.json"), "VKC_PLAN_CACHE_MODE": "frozen",
                    "VKC_PLAN_TUNE_DELAY_US": "0"})
    assert (c.mode, c.path, c.delay_us, c.defaults) == ("frozen", tmp_path / "f.json", 0, True)
    assert C.from_env({}).delay_us == 5000 and C.from_env({}).mode == "readwrite"


@pytest.mark.parametrize("env", [{"VKC_PLAN_TUNE_DELAY_US": v} for v in ("-1", "5e3", "", " ", "1.5", "99999999999",
                                                                          "0x10", "٣")]
                         + [{"VKC_PLAN_CACHE_MODE": "ro"}, {"VKC_PLAN_DEFAULTS": "yes"}])
def test_bad_env_is_an_error(env):
    with pytest.raises(C.PlanConfigError):
        C.from_env(env)


# ------------------------------------------------------------------ rejection

def test_round_trip_sorted_and_deterministic():
    m = meta()
    rows = plans_of((64, 5120, 6144, 2), (1, 5120, 6144, 1), (2048, 14336, 5120, 0), (1, 256, 64, 2))
    text = doc_text(m, reversed(list(rows.values())))
    assert text == doc_text(m, rows.values())
    back = store.parse(text, m)
    assert back == rows
    keys = [(e["n"], e["k"], e["m_bucket"]) for e in json.loads(text)["plans"]]
    assert keys == sorted(keys) == [(256, 64, 1), (5120, 6144, 1), (5120, 6144, 64), (14336, 5120, 2048)]


@pytest.mark.parametrize("field", store.META_FIELDS)
def test_every_metadata_field_rejects_the_file(field):
    m = meta()
    text = doc_text(m, [ent(16, 5120, 6144, 1)])
    other = {"format": "vkc_gemm_plans_v0", "cuda_driver": 12000, "cuda_runtime": "x", "kernel_set": "0" * 64,
             "device_name": "NVIDIA H100", "sm": "sm_100a", "cc": "10.0", "sm_count": 100, "out_dtype": "fp16",
             "scale_layout": "nvfp4", "tactic_set": {**m["tactic_set"], "count": 4},
             "timing": {**m["timing"], "repeats": 5}, "bucket_version": "v0"}[field]
    with pytest.raises(store.PlanFileError):
        store.parse(text, meta(**{field: other}))            # the process differs
    doc = json.loads(text)
    doc["_metadata"][field] = other
    with pytest.raises(store.PlanFileError):
        store.parse(json.dumps(doc), m)                      # the file differs
    del doc["_metadata"][field]
    with pytest.raises(store.PlanFileError, match="schema"):
        store.parse(json.dumps(doc), m)                      # the file lacks it


def test_unknown_fields_are_ignored():
    m = meta()
    doc = json.loads(doc_text(m, [ent(16, 5120, 6144, 1)]))
    doc["_metadata"]["future"] = 1
    doc["plans"][0]["note"] = "x"
    doc["extra"] = []
    assert list(store.parse(json.dumps(doc), m).values())[0]["tactic"] == 1


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"_metadata": {}, "plans": []}', "\ufeff{}",
                                  '{"_metadata": NaN, "plans": []}'])
def test_malformed_json_rejected(text):
    with pytest.raises(store.PlanFileError):
        store.parse(text, meta())


def test_duplicate_json_keys_and_plan_keys_rejected():
    m = meta()
    text = doc_text(m, [ent(16, 5120, 6144, 1)])
    dup_obj = text.replace('"tactic": 1,', '"tactic": 1, "tactic": 2,', 1)
    assert dup_obj != text
    with pytest.raises(store.PlanFileError, match="duplicate JSON object key"):
        store.parse(dup_obj, m)
    doc = json.loads(text)
    doc["plans"].append(dict(doc["plans"][0], tactic=2, base="gemm.bf16.t128x64"))  # conflicting
    with pytest.raises(store.PlanFileError, match="appears twice"):
        store.parse(json.dumps(doc), m)
    doc["plans"][1] = dict(doc["plans"][0])                                           # identical duplicate
    with pytest.raises(store.PlanFileError, match="appears twice"):
        store.parse(json.dumps(doc), m)


@pytest.mark.parametrize("mut,msg", [
    ({"tactic": 3}, "no GEMM tactic id"), ({"tactic": -1}, "schema"), ({"tactic": True}, "schema"),
    ({"runner": "CutlassFp4GemmRunner"}, "unknown runner"), ({"base": "gemm.bf16.t128x64"}, "launches"),
    ({"dtype": "fp8"}, "dtype/layout"), ({"sm": "sm_100a"}, "sm"), ({"m_bucket": 3}, "schema"),
    ({"tactic_set_version": 2}, "tactic_set_version"), ({"n": 0}, "schema"), ({"k": "6144"}, "schema"),
])
def test_bad_plan_entry_rejects_the_whole_file(mut, msg):
    m = meta()
    doc = json.loads(doc_text(m, [ent(1, 5120, 6144, 2), ent(16, 5120, 6144, 1)]))
    doc["plans"][1].update(mut)
    with pytest.raises(store.PlanFileError, match=msg):
        store.parse(json.dumps(doc), m)


def test_load_refuses_non_regular_and_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        store.load(tmp_path / "none.json", meta())
    with pytest.raises(store.PlanFileError, match="not a regular file"):
        store.load(tmp_path, meta())


def test_merge_current_wins_prior_kept():
    prior = plans_of((1, 5120, 6144, 2), (16, 5120, 6144, 2))
    cur = plans_of((16, 5120, 6144, 1), (64, 5120, 6144, 0))
    got = store.merge(prior, cur)
    assert {k.m_bucket: e["tactic"] for k, e in got.items()} == {1: 2, 16: 1, 64: 0}


# ------------------------------------------------------------------ publish

def test_publish_merges_with_file_and_leaves_no_temp(tmp_path):
    p, m = tmp_path / "d" / "plans.json", meta()
    n, rej = store.publish(p, m, plans_of((1, 5120, 6144, 2), (16, 5120, 6144, 2)))
    assert (n, rej) == (2, False)
    n, rej = store.publish(p, m, plans_of((16, 5120, 6144, 1)))
    assert (n, rej) == (2, False)
    assert {k.m_bucket: e["tactic"] for k, e in store.load(p, m).items()} == {1: 2, 16: 1}
    assert sorted(x.name for x in p.parent.iterdir()) == ["plans.json", "plans.json.lock"]
    assert p.read_bytes() == store.dumps(m, store.load(p, m).values())


def test_publish_replaces_a_rejected_file_and_cleans_up_on_error(tmp_path):
    p, m = tmp_path / "plans.json", meta()
    p.write_text("{broken")
    assert store.publish(p, m, plans_of((1, 5120, 6144, 2))) == (1, True)
    old = p.read_bytes()

    def boom(tmp):
        assert tmp.parent == p.parent and tmp.read_bytes().startswith(b"{")
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        store.publish(p, m, plans_of((16, 5120, 6144, 1)), before_rename=boom)
    assert p.read_bytes() == old
    assert sorted(x.name for x in p.parent.iterdir()) == ["plans.json", "plans.json.lock"]


_CHILD = r"""
import os, signal, sys
sys.path.insert(0, {repo!r})
from tests.plans_support import meta, plans_of
from vkc_runtime.plans import store
from pathlib import Path
p = Path({path!r})
def die(tmp):
    print(tmp, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
store.publish(p, meta(), plans_of(*{rows!r}), before_rename=die if {kill!r} else None)
"""


def _child(path, rows, kill):
    return subprocess.run([sys.executable, "-c", _CHILD.format(repo=str(REPO), path=str(path), rows=rows, kill=kill)],
                          capture_output=True, text=True, timeout=120)


def test_killed_between_write_and_rename_leaves_the_old_file(tmp_path):
    p, m = tmp_path / "plans.json", meta()
    store.publish(p, m, plans_of((1, 5120, 6144, 2)))
    old = p.read_bytes()
    r = _child(p, [(1, 5120, 6144, 0), (16, 5120, 6144, 1)], kill=True)
    assert r.returncode == -9, r.stderr
    tmp = Path(r.stdout.strip())
    assert tmp.is_file() and tmp.parent == p.parent            # the complete new bytes, never renamed
    assert json.loads(tmp.read_text())["plans"][0]["tactic"] == 0
    assert p.read_bytes() == old                                # old complete file
    store.publish(p, m, plans_of((64, 5120, 6144, 1)))          # the next writer sweeps the dead writer's temp
    assert not tmp.exists()
    assert sorted(x.name for x in p.parent.iterdir()) == ["plans.json", "plans.json.lock"]
    assert {k.m_bucket for k in store.load(p, m)} == {1, 64}


def test_two_processes_at_once_leave_one_valid_file(tmp_path):
    p, m = tmp_path / "plans.json", meta()
    a = [(b, 5120, 6144, 1) for b in (1, 2, 4, 8)]
    b = [(b, 14336, 5120, 0) for b in (1, 2, 4, 8)]
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD.format(repo=str(REPO), path=str(p), rows=rows,
                                                                     kill=False)])
             for rows in (a, b, a, b)]
    assert [q.wait(timeout=120) for q in procs] == [0, 0, 0, 0]
    got = store.load(p, m)                                       # valid, and the lock made the merges see each other
    assert got == plans_of(*a, *b)
    assert sorted(x.name for x in p.parent.iterdir()) == ["plans.json", "plans.json.lock"]


def test_gemm_key_buckets():
    assert gemm_key(1, 8, 8).m_bucket == 1 and gemm_key(3, 8, 8).m_bucket == 2
    assert gemm_key(255, 8, 8).m_bucket == 128 and gemm_key(256, 8, 8).m_bucket == 256
    assert gemm_key(10**6, 8, 8).m_bucket == 32768
    with pytest.raises(ValueError):
        gemm_key(0, 8, 8)
