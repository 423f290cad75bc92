"""The committed default plans and the tactic table: the files are what tools/plans/make_defaults.py writes, each
validates against this runtime's tactic set, the table describes exactly the compiled GEMM kernels of every
committed manifest, the digest is order- and content-sensitive, and ops.gemm.linear launches the plan's tactic
(falling back to the documented rule on a miss, refusing in frozen mode)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import vkc_runtime.driver as D
from tests.ops_fakes import Dev
from tests.plans_support import ARCH, cfg, meta
from vkc_runtime import plans as P
from vkc_runtime.ops import gemm as G
from vkc_runtime.plans import PlanCache, PlanMissError, defaults, gemm_key, tactics as T

REPO = Path(__file__).resolve().parents[1]


def _make_defaults():
    spec = importlib.util.spec_from_file_location("make_defaults", REPO / "tools" / "plans" / "make_defaults.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("arch", list(T.TACTICS))
def test_committed_default_is_generated_and_valid(arch):
    gen = _make_defaults()
    m, plans = defaults.read(arch)
    if m["source"].startswith(("rule:", "none")):
        assert defaults.path_for(arch).read_bytes() == gen.document(arch), "run tools/plans/make_defaults.py"
    if T.tactics_for(arch):
        assert plans and m["sm_count"] == 132
        assert defaults.applicable(m, 132) is None and "114" in defaults.applicable(m, 114)
    else:
        assert plans == {} and "no compiled GEMM tactics" in m["note"]


def test_sm90_rule_default_encodes_the_rule_at_132_sms(tmp_path):
    """The rule-derived document (what tools/plans/make_defaults.py writes where no tuned plan is committed;
    the committed sm_90a default is tuned on the H200 and only validated above)."""
    q = tmp_path / "sm_90a.json"
    q.write_bytes(_make_defaults().document("sm_90a"))
    m, plans = defaults.read("sm_90a", q)
    assert m["source"].startswith("rule:")
    for key, tid in plans.items():
        assert T.by_id("sm_90a", tid).tile_n == G.pick_tile(key.m_bucket, key.n, 132)
    assert {T.by_id("sm_90a", t).tile_n for t in plans.values()} == {64, 128, 256}


def test_tuned_plan_becomes_a_default(tmp_path):
    gen = _make_defaults()
    p = tmp_path / "plans.json"
    P.store.publish(p, meta(), {gemm_key(16, 5120, 6144): P.store.entry(ARCH, gemm_key(16, 5120, 6144), 1)})
    arch, data = gen.from_tuned(p)
    q = tmp_path / "sm_90a.json"
    q.write_bytes(data)
    m, plans = defaults.read(arch, q)
    assert arch == ARCH and plans == {gemm_key(16, 5120, 6144): 1} and m["source"].startswith("tuned: ")


def test_default_rejected_when_tactic_set_changes(tmp_path, monkeypatch):
    p = tmp_path / "sm_90a.json"
    p.write_bytes(defaults.path_for("sm_90a").read_bytes())
    doc = json.loads(p.read_text())
    doc["_metadata"]["tactic_set"]["digest"] = "0" * 64
    p.write_text(json.dumps(doc))
    with pytest.raises(P.PlanFileError, match="tactic_set"):
        defaults.read("sm_90a", p)


@pytest.mark.parametrize("arch", list(T.TACTICS))
def test_table_describes_the_compiled_kernels(arch):
    doc = json.loads((REPO / "manifests" / f"{arch}.json").read_text())
    assert T.check_manifest(arch, doc["kernels"], doc["tactics"]) == []     # block: digest of the same descriptors
    assert doc["tactics"]["digest"] == T.tactic_set(arch)["digest"]
    # the CuTe BF16 GEMM variants are the tactics (the fp8 CuTe kernels of the family, gemm.fp8.*, have none yet;
    # the Triton lane's gemm.bf16.mma.* / gemm.w4a16.* / gemm.nvfp4_dequant pick by rule, ops.gemm)
    compiled = sorted(b for b in doc["kernels"] if (doc["kernels"][b].get("inputs") or {}).get("abi") == "gemm_bf16")
    assert all(b.startswith("gemm.bf16.t") for b in compiled)
    assert compiled == sorted(t.base for t in T.tactics_for(arch)), "every compiled GEMM variant needs a tactic id"
    assert [t.id for t in T.tactics_for(arch)] == list(range(len(T.tactics_for(arch))))


def test_check_manifest_catches_a_changed_kernel():
    doc = json.loads((REPO / "manifests" / "sm_90a.json").read_text())
    doc["kernels"]["gemm.bf16.t128x128"]["inputs"]["config"]["stages"] = 5
    assert "tactic 0" in T.check_manifest("sm_90a", doc["kernels"])[0]
    assert "tactic set" in T.check_manifest("sm_90a", {}, dict(doc["tactics"], digest="0" * 64))[0]
    del doc["kernels"]["gemm.bf16.t128x64"]
    assert any("does not list" in p for p in T.check_manifest("sm_90a", doc["kernels"]))


def test_descriptor_digest_is_content_and_order_sensitive():
    ds = [t.descriptor() for t in T.tactics_for("sm_90a")]
    d0 = T.descriptor_digest(ds)
    assert d0 == T.tactic_set("sm_90a")["digest"] == T.descriptor_digest([dict(x) for x in ds])
    assert T.descriptor_digest(ds[::-1]) != d0
    assert T.descriptor_digest([ds[0] | {"stages": 5}] + ds[1:]) != d0
    assert T.descriptor_digest([ds[0] | {"persistent": not ds[0]["persistent"]}] + ds[1:]) != d0


# ------------------------------------------------------------------ the ops.gemm hook

class FakeKernel:
    device = 0

    def __init__(self, base, calls):
        self.base, self.calls = base, calls

    def launch(self, *args):
        self.calls.append((self.base, args))


@pytest.fixture()
def planned(monkeypatch):
    got: list = []
    monkeypatch.setattr(G, "get_kernel", lambda base: FakeKernel(base, got))
    monkeypatch.setattr(G, "has_kernel", lambda base: True)
    monkeypatch.setattr(G, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(D, "available", lambda: True)
    monkeypatch.setattr(D, "current_context", lambda: 0xC0)
    P.reset()
    yield got
    P.reset()


def _install(mode, dflt):
    c = PlanCache(ARCH, meta(), cfg(mode), path=None if mode != "frozen" else Path("/nonexistent/p.json"),
                  defaults=dflt)
    c.started = True
    P._caches[0xC0] = c
    return c


def test_linear_launches_the_planned_tactic(planned):
    # M = 300 (bucket 256), N = 10240: the rule picks 128x256 at 132 SMs; the plan says 128x64
    assert G.pick_tile(300, 10240, 132) == 256 and G.pick_tile(512, 10240, 132) == 128
    c = _install("readwrite", {gemm_key(300, 10240, 4096): 2})
    G.linear(Dev((300, 4096)), Dev((10240, 4096)), Dev((300, 10240)), stream=0)
    G.linear(Dev((256, 4096)), Dev((10240, 4096)), Dev((256, 10240)), stream=0)   # same bucket
    G.linear(Dev((512, 4096)), Dev((10240, 4096)), Dev((512, 10240)), stream=0)   # a miss: the rule
    assert [b for b, _ in planned] == ["gemm.bf16.t128x64", "gemm.bf16.t128x64", "gemm.bf16.t128x128"]
    assert planned[0][1][6:9] == (300, 10240, 4096)
    assert c.stats["lazy_misses"] == 1


def test_linear_frozen_miss_raises_before_launch(planned):
    _install("frozen", {gemm_key(300, 2048, 4096): 0})
    G.linear(Dev((300, 4096)), Dev((2048, 4096)), Dev((300, 2048)), stream=0)
    with pytest.raises(PlanMissError):
        G.linear(Dev((1024, 4096)), Dev((2048, 4096)), Dev((1024, 2048)), stream=0)
    assert [b for b, _ in planned] == ["gemm.bf16.t128x128"]


def test_declared_shapes_cover_every_bucket_up_to_the_largest_step():
    got = P.declared([(5120, 6144)], 2048)
    assert got == [(1 << i, 5120, 6144) for i in range(12)]
    assert {gemm_key(m, 5120, 6144) for m in range(1, 2049)} == {gemm_key(*s) for s in got}


def test_no_driver_means_the_rule(monkeypatch):
    monkeypatch.setattr(D, "available", lambda: False)
    assert P.gemm_tactic(300, 2048, 4096) is None


def test_no_cache_built_inside_capture(planned):
    with P.capturing():
        assert P.gemm_tactic(300, 2048, 4096) is None
    assert P._caches == {}
