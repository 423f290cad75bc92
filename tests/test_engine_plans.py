"""The engine's GEMM plan warm-up (vkc_engine.gemm_shapes, VkcBackend.warm_gemm_plans, LLM.plan_report) on CPU.

* what is declared: every (N, K) of the checkpoint's linear layers (derived here from the HF model's own
  parameter shapes, not from the engine's formulas) at every M bucket up to the step budget, once, before any
  weight upload, capture or step (a recording numpy backend);
* the real lifecycle: VkcBackend's method drives the real ``vkc_runtime.plans.warmup_gemm`` and ``PlanCache``
  (driver, timer and profiler replaced at the boundary) inside the LLM constructor on the driver-free device
  backend with graphs: readwrite tunes every key and publishes once, after the last tuning launch and before any
  capture; a second engine in frozen mode loads them all, tunes and writes nothing; frozen with a missing key
  raises from the constructor, naming the key, before a weight is read, and writes nothing;
* the 27B shapes the engine declares are exactly the ones the committed sm_90a default plan covers.
"""
from __future__ import annotations

import dataclasses

import pytest

from tests.engine_fixtures import HEADS_27B, MOE_SMALL, make_checkpoint
from tests.engine_numpy_backend import NumpyBackend
from tests.plans_support import FakeTimer, meta
from tests.test_engine_graphs import NumpyGraphBackend
from tests.test_engine_graphs_fake import StreamBackend, launches  # noqa: F401  (fixture)
from tests.test_engine_vkc_backend_fake import fake_vkc  # noqa: F401  (fixture of launches)

pytest.importorskip("transformers")

from vkc_engine import LLM  # noqa: E402
from vkc_engine.backend import VkcBackend  # noqa: E402
from vkc_engine.config import load_config  # noqa: E402
from vkc_engine.gemm_shapes import linear_shapes, plan_line  # noqa: E402

KW = dict(max_num_seqs=5, max_num_batched_tokens=40, max_model_len=256, num_blocks=32, block_size=64,
          strict_graphs=True)
BUCKETS_40 = (1, 2, 4, 8, 16, 32)  # the plan module's pow2 buckets up to a 40-token step


def _hf_linears(model) -> set[tuple[int, int]]:
    """(N, K) of every GEMM the engine runs, from the HF model's parameters (fused as the engine loads them)."""
    sd = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    out = {sd["lm_head.weight"]}
    for name in sd:
        if not name.endswith("input_layernorm.weight"):
            continue
        p = name[:-len("input_layernorm.weight")]
        parts = {"linear_attn.": (["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"], ["out_proj"]),
                 "self_attn.": (["q_proj", "k_proj", "v_proj"], ["o_proj"]),
                 "mlp.": (["gate_proj", "up_proj"], ["down_proj"])}
        for mod, groups in parts.items():
            for group in groups:
                shapes = [sd.get(f"{p}{mod}{g}.weight") for g in group]
                if all(s is not None for s in shapes):
                    assert len({s[1] for s in shapes}) == 1
                    out.add((sum(s[0] for s in shapes), shapes[0][1]))
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("plansck")
    model, _ = make_checkpoint(d, heads=HEADS_27B, seed=4)
    return d, model


class Recording(NumpyGraphBackend):
    """The numpy graph backend recording the order of warm-up, weight uploads, captures and steps."""

    def __init__(self):
        super().__init__()
        self.events, self.warmups = [], []

    def warm_gemm_plans(self, nks, max_m):
        self.events.append("warm")
        self.warmups.append((list(nks), max_m))
        return {"mode": "readwrite", "path": "/x/plans.json", "file": "absent", "fingerprint": "f" * 16,
                "declared": 7, "loaded": 1, "defaults": 2, "tuned": 4, "rejected": 0, "saved": 5}

    def weight(self, parts, dtype, shape=None):
        self.events.append("weight")
        return super().weight(parts, dtype, shape)

    def capture(self, fn):
        self.events.append("capture")
        return super().capture(fn)

    def embedding(self, ids, table, out):
        self.events.append("step")
        return super().embedding(ids, table, out)


def _squash(events):
    out = []
    for e in events:
        if not out or out[-1] != e:
            out.append(e)
    return out


def test_warmup_once_with_every_linear_before_weights_and_capture(ckpt):
    d, model = ckpt
    be, logs = Recording(), []
    llm = LLM(d, backend=be, log=logs.append, **KW)
    assert be.warmups == [(sorted(_hf_linears(model)), 40)]
    assert len(be.warmups[0][0]) == 7  # lm_head, GDN in/out, attention qkv/o, MLP gate_up/down
    ev = _squash(be.events)
    # plans first, then the weights, the graph runner's eager warm-up forwards, the captures
    assert ev == ["warm", "weight", "step", "capture"], ev
    assert llm.model.gemm_shapes == linear_shapes(llm.cfg)  # what the model loaded as bf16 linears = the config's
    llm.generate([[5] * 50, [7]], None)
    assert be.events.count("warm") == 1
    assert llm.plan_report["tuned"] == 4
    line = [m for m in logs if m.startswith("GEMM plans:")]
    assert line == [plan_line(llm.plan_report)]
    for part in ("mode readwrite", "/x/plans.json", "fingerprint ffffffffffffffff", "7 keys declared", "loaded 1",
                 "defaults 2", "tuned 4", "rejected 0", "saved 5"):
        assert part in line[0], line


def test_fp8_checkpoint_warms_its_bf16_linears_after_the_weights(tmp_path):
    """An FP8 checkpoint's bf16 linears follow from its stored dtypes: the warm-up comes right after the weights
    (before any step or capture) and declares exactly the bf16 GEMMs the model loaded, no FP8 one."""
    model, _ = make_checkpoint(tmp_path, heads=HEADS_27B, seed=5, fp8={})
    be = Recording()
    llm = LLM(tmp_path, backend=be, **KW)
    ev = _squash(be.events)
    assert ev.index("warm") > ev.index("weight") and ev.index("warm") < ev.index("step") < ev.index("capture"), ev
    assert be.events.count("warm") == 1
    (nks, max_m), = be.warmups
    assert nks == llm.model.gemm_shapes and max_m == KW["max_num_batched_tokens"]
    cfg = llm.cfg
    assert (cfg.vocab_size, cfg.hidden_size) in nks  # the LM head stays bf16
    assert model.vkc_fp8_linears and set(nks) != set(linear_shapes(cfg))  # some projections run the FP8 GEMM


def test_numpy_backend_has_no_plans(ckpt):
    d, _ = ckpt
    llm = LLM(d, backend=NumpyBackend(), enforce_eager=True, **KW)
    assert llm.plan_report is None


def test_moe_layers_declare_no_mlp_gemm(tmp_path):
    model, _ = make_checkpoint(tmp_path, heads=HEADS_27B, moe=MOE_SMALL, seed=3)
    cfg = load_config(tmp_path)
    got = linear_shapes(cfg)
    H = cfg.hidden_size
    assert (2 * cfg.moe_intermediate_size, H) not in got and (H, cfg.moe_intermediate_size) not in got
    assert set(got) == _hf_linears(model)  # the HF MoE model has no mlp.gate_proj: only mixers + lm_head
    assert len(got) == 5


def test_27b_declares_exactly_what_the_committed_default_covers(ckpt):
    from vkc_runtime.plans import defaults
    cfg = load_config(ckpt[0])
    big = dataclasses.replace(cfg, vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_q_heads=24,
                              num_kv_heads=4, head_dim=256, gdn_k_heads=16, gdn_v_heads=48, gdn_head_dim=128)
    assert set(linear_shapes(big)) == set(defaults.COVERED_NK)
    m, plans = defaults.read("sm_90a")
    assert {(k.n, k.k, k.m_bucket) for k in plans} == {(n, k, b) for n, k in defaults.COVERED_NK
                                                       for b in (1 << i for i in range(16))}


# ------------------------------------------------------------------ the real plans lifecycle, driver-free
CTX = 0x77


class ClosingTimer(FakeTimer):
    closed = 0

    def __init__(self, stream=0):
        super().__init__()

    def close(self):
        ClosingTimer.closed += 1


class Profiled:
    """Stands in for plans.gemm_profile.Profiler: each tactic run is a recorded launch."""
    runs: list = []

    def __init__(self, arch, stream=0):
        self.stream = stream

    def make_run(self, key, tactic_id):
        return lambda: Profiled.runs.append((key, tactic_id, self.stream))

    def close(self):
        pass


@pytest.fixture()
def real_plans(monkeypatch, tmp_path):
    """vkc_runtime.plans with the driver, the CUDA timer and the profiler replaced; the cache of context CTX is a
    real PlanCache (sm_90a tactics, fake device metadata) on tmp_path/plans.json, built from the environment."""
    from vkc_runtime import driver, plans
    from vkc_runtime.plans import config, gemm_profile, store, tuning
    path = tmp_path / "plans.json"
    monkeypatch.setenv("VKC_PLAN_CACHE", str(path))
    monkeypatch.setenv("VKC_PLAN_DEFAULTS", "0")
    monkeypatch.setenv("VKC_PLAN_CACHE_MODE", "readwrite")
    monkeypatch.setattr(driver, "ensure_context", lambda device=None: CTX)
    monkeypatch.setattr(tuning, "CudaEventTimer", ClosingTimer)
    monkeypatch.setattr(gemm_profile, "Profiler", Profiled)
    Profiled.runs = []
    published = []
    real_publish = store.publish

    def publish(p, m, cur, before_rename=None):
        published.append((len(Profiled.runs), len(cur)))
        return real_publish(p, m, cur, before_rename)
    monkeypatch.setattr(store, "publish", publish)

    def fresh():  # a new process: a new cache of CTX from the current environment
        plans.reset()
        plans._caches[CTX] = plans.PlanCache("sm_90a", meta(), config.from_env(), path=path)
    fresh()
    yield plans, path, published, fresh
    plans.reset()


class PlanBackend(StreamBackend):
    """The driver-free device backend (graphs on) with VkcBackend's own warm_gemm_plans, recording the order."""
    warm_gemm_plans = VkcBackend.warm_gemm_plans

    def __init__(self):
        super().__init__()
        self.events = []

    def weight(self, parts, dtype, shape=None):
        self.events.append("weight")
        return super().weight(parts, dtype, shape)

    def capture(self, fn):
        self.events.append(("capture", len(Profiled.runs)))
        return super().capture(fn)


def _expected_keys(model):
    from vkc_runtime.plans import gemm_key
    return {gemm_key(b, n, k) for n, k in _hf_linears(model) for b in BUCKETS_40}


def test_readwrite_tunes_every_key_and_publishes_after_the_warmup(launches, real_plans, ckpt):  # noqa: F811
    plans, path, published, fresh = real_plans
    d, model = ckpt
    be = PlanBackend()
    llm = LLM(d, backend=be, **KW)
    keys = _expected_keys(model)
    tuned = {k for k, _, _ in Profiled.runs}
    assert tuned == keys and len(keys) == 7 * len(BUCKETS_40)
    assert {s for _, _, s in Profiled.runs} == {be._s}  # timed on the backend's stream
    n_runs = len(Profiled.runs)
    assert n_runs == len(keys) * 3 * 13  # 3 tactics x (3 warm-ups + 10 timed)
    assert published == [(n_runs, len(keys))]  # once, after the last tuning launch
    caps = [e for e in be.events if isinstance(e, tuple)]
    assert caps and all(n == n_runs for _, n in caps) and be.events.index("weight") < be.events.index(caps[0])
    rep = llm.plan_report
    assert (rep["mode"], rep["declared"], rep["tuned"], rep["saved"], rep["loaded"], rep["rejected"]) == \
        ("readwrite", len(keys), len(keys), len(keys), 0, 0)
    assert rep["path"] == str(path) and rep["file"] == "absent" and rep["lazy_misses"] == 0
    assert set(plans.store.load(path, meta())) == keys

    # a fresh process in frozen mode: everything loads, nothing is tuned or written
    before = path.read_bytes()
    import os
    os.environ["VKC_PLAN_CACHE_MODE"] = "frozen"  # restored by the fixture's monkeypatch
    fresh()
    Profiled.runs, published[:] = [], []
    llm2 = LLM(d, backend=PlanBackend(), **KW)
    rep2 = llm2.plan_report
    assert (rep2["mode"], rep2["loaded"], rep2["tuned"], rep2["saved"], rep2["declared"]) == \
        ("frozen", len(keys), 0, 0, len(keys))
    assert rep2["file"] == f"valid, {len(keys)} plans" and rep2["fingerprint"] == rep["fingerprint"]
    assert Profiled.runs == [] and published == [] and path.read_bytes() == before


def test_frozen_miss_fails_the_constructor_before_any_weight(launches, real_plans, ckpt, monkeypatch):  # noqa: F811
    plans, path, published, fresh = real_plans
    d, model = ckpt
    keys = sorted(_expected_keys(model))
    have = {k: plans.store.entry("sm_90a", k, 1) for k in keys[1:]}  # every key but one
    plans.store.publish(path, meta(), have)
    published[:] = []
    before = path.read_bytes()
    monkeypatch.setenv("VKC_PLAN_CACHE_MODE", "frozen")
    fresh()
    be = PlanBackend()
    with pytest.raises(plans.PlanMissError) as ei:
        LLM(d, backend=be, **KW)
    msg = str(ei.value)
    assert str(keys[0]) in msg and f"1 of {len(keys)} declared keys" in msg and "nothing was tuned or written" in msg
    assert be.events == [] and Profiled.runs == [] and published == [] and path.read_bytes() == before


def test_frozen_without_the_file_fails_and_creates_nothing(launches, real_plans, ckpt, monkeypatch):  # noqa: F811
    plans, path, published, fresh = real_plans
    monkeypatch.setenv("VKC_PLAN_CACHE_MODE", "frozen")
    fresh()
    with pytest.raises(plans.PlanMissError, match="file absent"):
        LLM(ckpt[0], backend=PlanBackend(), **KW)
    assert not path.exists() and not list(path.parent.glob("*.lock")) and Profiled.runs == []


def test_backend_declares_one_key_per_bucket(monkeypatch):
    """VkcBackend.warm_gemm_plans hands the plan module's own buckets of 1 .. max_m to warmup_gemm, on its
    stream, once; an arch without GEMM tactics declares nothing."""
    from types import SimpleNamespace

    from vkc_runtime import plans
    calls = []
    cache = SimpleNamespace(arch="sm_90a", report=lambda: {"declared": 0})
    monkeypatch.setattr(plans, "cache_for_context", lambda ctx=None, log=None: cache)
    monkeypatch.setattr(plans, "warmup_gemm", lambda shapes, **kw: calls.append((sorted(shapes), kw)) or {"ok": 1})
    be = SimpleNamespace(_s=0x1234)
    assert VkcBackend.warm_gemm_plans(be, [(64, 32), (96, 48)], 300) == {"ok": 1}
    want = sorted((b, n, k) for n, k in [(64, 32), (96, 48)] for b in (1, 2, 4, 8, 16, 32, 64, 128, 256))
    assert calls == [(want, {"stream": 0x1234})]
    cache.arch = "sm_80"
    assert VkcBackend.warm_gemm_plans(be, [(64, 32)], 300) == {"declared": 0} and len(calls) == 1
