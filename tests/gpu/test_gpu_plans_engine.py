"""GPU (H200): the engine's GEMM plan warm-up end to end, each engine in a fresh process.

A tiny dense checkpoint with the real Qwen3.6-27B heads (tests/engine_fixtures.make_checkpoint, as in
tests/gpu/test_gpu_engine.py), the committed default plan off (``VKC_PLAN_DEFAULTS=0``: every key comes from
the file), a tmp plan file (``VKC_PLAN_CACHE``):

1. a readwrite process: the LLM constructor tunes every declared key (linear_shapes x the M buckets up to the
   step budget) and saves them all; CUDA graphs captured (buckets 24 and 32 run the CuTe GEMM inside the capture);
   20 greedy requests; teacher-forced logits twice (the in-process rerun difference);
2. a fresh frozen process on that file: loads every key, tunes, saves and rejects nothing, no per-call miss
   through capture, decode and prefill (a frozen miss would raise: strict_graphs), the file unchanged, the GEMMs
   inside the capture all answered by the plan; its greedy tokens equal the first's and its logits are within
   the engine's own rerun difference of them (zero for deterministic kernels);
3. ``vkc generate --frozen-plans --plans-file`` on the same file: exit 0 and a plan line with nothing tuned; on a
   missing file: exit 1 with the one-line error, nothing created.

The child is this module run as ``python -m tests.gpu.test_gpu_plans_engine child CKPT OUT``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
HEADS_27B = dict(linear_num_key_heads=16, linear_num_value_heads=48, num_attention_heads=24, num_key_value_heads=4)
LAYERS = ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"]
ENGINE = dict(max_num_seqs=32, max_num_batched_tokens=512, max_model_len=1024, num_blocks=200, block_size=64)


def _child(ckpt: str, out: str) -> None:
    from vkc_engine import LLM, SamplingParams
    from vkc_engine import backend as B
    from vkc_runtime import plans
    from vkc_runtime.ops import gemm as G

    state = {"capturing": False}
    counts = {"capture_calls": 0, "capture_planned": 0}
    orig_capture, orig_plan = B.VkcBackend.capture, G.plan_tactic

    def capture(self, fn):
        state["capturing"] = True
        try:
            return orig_capture(self, fn)
        finally:
            state["capturing"] = False

    def plan_tactic(m, n, k):
        t = orig_plan(m, n, k)
        if state["capturing"]:
            counts["capture_calls"] += 1
            counts["capture_planned"] += t is not None
        return t
    B.VkcBackend.capture, G.plan_tactic = capture, plan_tactic

    logs: list[str] = []
    llm = LLM(ckpt, strict_graphs=True, log=logs.append, **ENGINE)
    assert llm.graphs is not None and llm.graphs.buckets[-2:] == (24, 32), llm.graphs
    start = dict(llm.plan_report)
    V = llm.cfg.vocab_size
    rng = np.random.default_rng(31)
    prompts = [[int(t) for t in rng.integers(0, V, int(n))] for n in rng.integers(1, 120, 20)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    ids = [int(t) for t in rng.integers(0, V, 300)]
    a, b = llm.prompt_logits(ids), llm.prompt_logits(ids)
    np.save(out + ".npy", a)
    Path(out).write_text(json.dumps({
        "start": start, "end": plans.cache_for_context().report(), "tokens": [o.token_ids for o in outs],
        "rerun": float(np.abs(a - b).max()), "finite": bool(np.isfinite(a).all()), **counts,
        "plan_lines": [m for m in logs if m.startswith("GEMM plans:")]}, default=str))


def _run(args, env, timeout=480):
    base = {k: v for k, v in os.environ.items() if not k.startswith("VKC_PLAN_")}
    return subprocess.run([sys.executable, *args], env={**base, **env}, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vkc_runtime.kernels import has_kernel
    from vkc_runtime.ops import gemm
    if not has_kernel(gemm.OPTIONAL_BASES[0]):
        pytest.skip("no CuTe GEMM for this device's arch (built for sm_90a only)")
    from tests.engine_fixtures import make_checkpoint
    d = tmp_path_factory.mktemp("plans_engine")
    make_checkpoint(d, heads=HEADS_27B, layer_types=LAYERS, hidden=512, intermediate=1024, seed=17)
    return d


def test_readwrite_then_frozen_fresh_processes(ckpt, tmp_path):
    from tests.gpu.errlog import record
    from vkc_engine.config import load_config
    from vkc_engine.gemm_shapes import linear_shapes
    plan = tmp_path / "plans.json"
    env = {"VKC_PLAN_CACHE": str(plan), "VKC_PLAN_DEFAULTS": "0"}
    n_keys = len(linear_shapes(load_config(ckpt))) * 10  # M buckets 1 .. 512

    r1 = _run(["-m", "tests.gpu.test_gpu_plans_engine", "child", str(ckpt), str(tmp_path / "rw.json")],
              {**env, "VKC_PLAN_CACHE_MODE": "readwrite"})
    assert r1.returncode == 0, r1.stdout[-2000:] + r1.stderr[-4000:]
    rw = json.loads((tmp_path / "rw.json").read_text())
    s, e = rw["start"], rw["end"]
    record("plans", what="engine readwrite start", **{k: s[k] for k in ("declared", "loaded", "tuned", "saved")},
           capture_calls=rw["capture_calls"], line=rw["plan_lines"])
    assert (s["mode"], s["declared"], s["tuned"], s["saved"], s["loaded"], s["rejected"]) == \
        ("readwrite", n_keys, n_keys, n_keys, 0, 0), s
    assert s["file"] == "absent" and s["path"] == str(plan) and e["lazy_misses"] == 0, e
    assert rw["plan_lines"] and f"{n_keys} keys declared" in rw["plan_lines"][0] and rw["finite"]
    assert rw["capture_calls"] > 0 and rw["capture_planned"] == rw["capture_calls"], rw
    saved = plan.read_bytes()
    st = plan.stat()

    r2 = _run(["-m", "tests.gpu.test_gpu_plans_engine", "child", str(ckpt), str(tmp_path / "fz.json")],
              {**env, "VKC_PLAN_CACHE_MODE": "frozen"})
    assert r2.returncode == 0, r2.stdout[-2000:] + r2.stderr[-4000:]
    fz = json.loads((tmp_path / "fz.json").read_text())
    s2, e2 = fz["start"], fz["end"]
    assert (s2["mode"], s2["declared"], s2["loaded"], s2["tuned"], s2["saved"], s2["rejected"]) == \
        ("frozen", n_keys, n_keys, 0, 0, 0), s2
    assert s2["file"] == f"valid, {n_keys} plans" and s2["fingerprint"] == s["fingerprint"]
    assert (e2["lazy_misses"], e2["tuned"], e2["tune_calls"], e2["saved"]) == (0, 0, 0, 0), e2
    assert fz["capture_calls"] == rw["capture_calls"] and fz["capture_planned"] == fz["capture_calls"]
    assert plan.read_bytes() == saved and plan.stat().st_mtime_ns == st.st_mtime_ns
    a, b = np.load(str(tmp_path / "rw.json") + ".npy"), np.load(str(tmp_path / "fz.json") + ".npy")
    diff = float(np.abs(a - b).max())
    record("plans", what="engine frozen vs readwrite process", max_abs=diff, rerun=max(rw["rerun"], fz["rerun"]),
           tokens_equal=fz["tokens"] == rw["tokens"])
    assert diff <= max(rw["rerun"], fz["rerun"]), diff
    assert fz["tokens"] == rw["tokens"]

    gen = ["-m", "vkc_cli", "generate", "--model", str(ckpt), "--prompt", "the quick brown fox", "--max-tokens", "4",
           "--max-num-seqs", "32", "--max-num-batched-tokens", "512", "--max-model-len", "1024",
           "--memory-fraction", "0.05"]
    r3 = _run(gen + ["--frozen-plans", "--plans-file", str(plan)], {"VKC_PLAN_DEFAULTS": "0"})
    assert r3.returncode == 0, r3.stderr[-4000:]
    line = [x for x in r3.stderr.splitlines() if x.startswith("GEMM plans:")]
    assert line and "mode frozen" in line[0] and f"loaded {n_keys}" in line[0] and "tuned 0" in line[0], r3.stderr
    assert plan.read_bytes() == saved
    missing = tmp_path / "none" / "plans.json"
    r4 = _run(gen + ["--frozen-plans", "--plans-file", str(missing)], {}, timeout=120)
    assert r4.returncode == 1 and "frozen GEMM plans: plan file" in r4.stderr and not missing.parent.exists()


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        _child(sys.argv[2], sys.argv[3])
