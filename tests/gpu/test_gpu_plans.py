"""GPU (H200) checks of the GEMM plan cache (vkc_runtime.plans) with the sm_90a CuTe GEMM.

Every sm_90a tactic forced one by one through a frozen plan file (not by patching the op) against a float64
product, into NaN-poisoned outputs; a readwrite warm-up tunes the declared keys by the miss method and
publishes them, a fresh cache loads them with zero tuning; a CUDA-graph capture with a loaded frozen plan has
zero plan misses and replays bitwise equal to eager; six fresh processes with one frozen plan pick identical
tactics and give byte-identical outputs (tools/plans/fresh_process_check.py).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.errlog import record

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
SHAPES = [(1, 5120, 6144), (77, 14336, 5120), (300, 5120, 17408), (2048, 34816, 5120), (129, 264, 72)]


@pytest.fixture()
def P(monkeypatch, tmp_path):
    from vkc_runtime import plans
    from vkc_runtime.kernels import has_kernel
    from vkc_runtime.ops import gemm
    if not has_kernel(gemm.OPTIONAL_BASES[0]):
        pytest.skip("no CuTe GEMM for this device's arch (built for sm_90a only)")
    for k in ("VKC_PLAN_CACHE_MODE", "VKC_PLAN_FLASHINFER", "VKC_PLAN_TUNE_DELAY_US"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("VKC_PLAN_CACHE", str(tmp_path / "plans.json"))
    monkeypatch.setenv("VKC_PLAN_DEFAULTS", "0")
    plans.reset()
    yield plans
    plans.reset()


def rnd(*shape, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)


def check(out, x, w, what):
    ref = x.double() @ w.double().T
    o = out.double()
    assert not torch.isnan(o).any(), f"{what}: NaN in the output"
    err = float(torch.linalg.norm(o - ref) / torch.linalg.norm(ref))
    row = float((torch.linalg.norm(o - ref, dim=1) / torch.linalg.norm(ref, dim=1).clamp_min(1e-30)).max())
    record("plans", what=what, rel_err=err, worst_row=row)
    assert err < 1e-2 and row < 2e-2, f"{what}: rel err {err:.2e}, worst row {row:.2e}"


def test_every_tactic_forced_by_a_frozen_plan(P, monkeypatch, tmp_path):
    from vkc_runtime.ops import gemm
    c = P.cache_for_context()
    meta, arch = c.meta, c.arch
    ts = P.tactics.tactics_for(arch)
    assert len(ts) == 3
    for t in ts:
        path = tmp_path / f"t{t.id}.json"
        P.store.publish(path, meta, {P.gemm_key(m, n, k): P.store.entry(arch, P.gemm_key(m, n, k), t.id)
                                     for m, n, k in SHAPES})
        monkeypatch.setenv("VKC_PLAN_CACHE", str(path))
        monkeypatch.setenv("VKC_PLAN_CACHE_MODE", "frozen")
        P.reset()
        for i, (m, n, k) in enumerate(SHAPES):
            x, w = rnd(m, k, seed=10 * i), rnd(n, k, seed=10 * i + 1, scale=k ** -0.5)
            y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            gemm.linear(x, w, y, stream=torch.cuda.current_stream())
            torch.cuda.synchronize()
            assert gemm.plan_tactic(m, n, k).id == t.id
            check(y, x, w, f"tactic {t.id} ({t.base}) M={m} N={n} K={k}")
        rep = P.cache_for_context().report()
        assert (rep["loaded"], rep["tuned"], rep["lazy_misses"], rep["saved"]) == (len(SHAPES), 0, 0, 0)


def test_warmup_tunes_publishes_and_a_fresh_cache_loads(P, tmp_path):
    shapes = [(300, 5120, 6144), (2048, 14336, 5120)]
    rep = P.warmup_gemm(shapes, stream=torch.cuda.current_stream().cuda_stream)
    assert (rep["tuned"], rep["saved"], rep["tune_calls"], rep["rejected"]) == (2, 2, 6, 0), rep
    c = P.cache_for_context()
    file_plans = P.store.load(tmp_path / "plans.json", c.meta)
    assert len(file_plans) == 2
    P.reset()
    rep2 = P.warmup_gemm(shapes)
    assert (rep2["loaded"], rep2["tuned"], rep2["tune_calls"], rep2["saved"]) == (2, 0, 0, 0), rep2
    assert rep2["fingerprint"] == rep["fingerprint"]


def test_bad_delay_is_a_hard_error(P, monkeypatch):
    monkeypatch.setenv("VKC_PLAN_TUNE_DELAY_US", "-5")
    with pytest.raises(P.PlanConfigError):
        P.cache_for_context()


def test_capture_with_a_loaded_plan_has_zero_misses(P, monkeypatch):
    from vkc_runtime.ops import gemm
    shapes = [(300, 5120, 6144), (77, 14336, 5120)]
    P.warmup_gemm(shapes)                                   # readwrite: tune + publish
    monkeypatch.setenv("VKC_PLAN_CACHE_MODE", "frozen")
    P.reset()
    P.warmup_gemm(shapes)                                   # frozen: everything loaded before capture
    c = P.cache_for_context()
    s = torch.cuda.Stream()
    ops = []
    for i, (m, n, k) in enumerate(shapes):
        x, w = rnd(m, k, seed=i), rnd(n, k, seed=i + 7, scale=k ** -0.5)
        ops.append((x, w, torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16),
                    torch.empty((m, n), device="cuda", dtype=torch.bfloat16)))
    s.wait_stream(torch.cuda.current_stream())  # the inputs and outputs were made on the default stream
    with torch.cuda.stream(s):
        for x, w, _, eager in ops:
            gemm.linear(x, w, eager, stream=s)
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with P.capturing(), torch.cuda.graph(g, stream=s):
        for x, w, out, _ in ops:
            gemm.linear(x, w, out, stream=s)
    for _ in range(2):
        for _, _, out, _ in ops:
            out.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        for x, w, out, eager in ops:
            assert torch.equal(out, eager)
            check(out, x, w, "graph replay under a frozen plan")
    rep = c.report()
    assert (rep["lazy_misses"], rep["tuned"], rep["loaded"]) == (0, 0, 2), rep


def test_six_fresh_processes_identical(tmp_path):
    from vkc_runtime.kernels import has_kernel
    from vkc_runtime.ops import gemm
    if not has_kernel(gemm.OPTIONAL_BASES[0]):
        pytest.skip("no CuTe GEMM for this device's arch (built for sm_90a only)")
    r = subprocess.run([sys.executable, str(REPO / "tools" / "plans" / "fresh_process_check.py"), "--procs", "6",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=580, cwd=REPO)
    record("plans", what="fresh processes", summary=r.stdout.strip()[-500:])
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "IDENTICAL" in r.stdout
