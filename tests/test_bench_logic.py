"""The benchmarks' GPU-free logic: case lists, physical limits, comparison records, the result metadata, the
summarizer (new schema and the legacy result files), and that the SDPA peer computes the same attention as
vkc's reference on the de-paged caches with native GQA (CPU torch)."""
from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import subprocess
import sys
import tarfile
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
sys.path.insert(0, BENCH)

import bench_common as C  # noqa: E402
import summarize  # noqa: E402

from tests import refs_attn  # noqa: E402


@pytest.mark.parametrize("mod", ["bench_attn", "bench_gdn", "bench_gdn_decode", "bench_gemm", "bench_gemm_fp8",
                                 "bench_gemm_triton", "bench_gemv", "bench_norm", "bench_sample",
                                 "timing", "summarize", "tune_attn", "tune_conv", "tune_gdn", "tune_gemv", "tune_moe",
                                 "tune_norm", "tune_rope", "ncu_case", "step_timeline"])
def test_benchmarks_import_on_cpu(mod):
    m = importlib.import_module(mod)
    if mod.startswith("bench_"):
        assert callable(m.main) and m.main.__code__.co_argcount == 1  # python3 benchmarks/bench_X.py OUT.json


def test_step_timeline_summarize_charges_overlap_and_gaps():
    """Exclusive time: a PDL kernel that starts before its predecessor ends is charged from that end; a gap
    inside a step is idle, a gap holding a step mark is between steps; per-step figures divide by steps."""
    import step_timeline as T
    iv = [("b", 12.0, 20.0), ("a", 0.0, 10.0),     # step 1: a [0, 10), idle [10, 12), b [12, 20)
          ("c", 18.0, 25.0),                        # c starts under b (PDL): charged [20, 25)
          ("a", 100.0, 110.0), ("b", 109.0, 120.0), ("c", 121.0, 125.0)]  # step 2 after a host gap at 60
    r = T.summarize(iv, 2, marks=[60.0])
    k = {x["name"]: x for x in r["kernels"]}
    assert k["a"]["us"] == 10.0 and k["a"]["calls"] == 1.0 and k["a"]["us_max"] == 10.0
    assert k["b"]["us"] == (8.0 + 10.0) / 2 and k["b"]["us_max"] == 11.0
    assert k["c"]["us"] == (5.0 + 4.0) / 2
    assert r["idle_us"] == (2.0 + 1.0) / 2 and r["between_steps_us"] == 75.0 / 2
    assert r["busy_us"] == sum(x["us"] for x in r["kernels"]) == (23.0 + 24.0) / 2
    assert r["span_us"] == r["busy_us"] + r["idle_us"]
    assert [x["name"] for x in r["kernels"]] == ["a", "b", "c"]  # by time
    assert T.summarize([], 3)["kernels"] == [] and T.summarize([], 3)["steps"] == 3


def test_helpers_other_scripts_use_keep_their_signatures():
    """tune_attn / tune_conv / tune_gdn / ncu_case call into the benchmarks: the call shapes they use."""
    import bench_attn
    import bench_gdn
    import bench_gdn_decode
    seen = []
    orig = bench_attn.timing.events_ms
    try:
        bench_attn.timing.events_ms = lambda fn, **k: (fn(0, None), seen.append(k))[1] or 1.0
        assert bench_attn.time_ms(lambda i: seen.append(i)) == 1.0 and seen[0] == 0  # tune_attn: fn(i)
    finally:
        bench_attn.timing.events_ms = orig
    assert list(inspect.signature(bench_gdn_decode.bench_conv_prefill).parameters)[:2] == ["lens", "C"]
    assert inspect.signature(bench_gdn_decode.bench_conv_prefill).parameters["copy_tbs"].default is None
    assert list(inspect.signature(bench_gdn.vkc_case).parameters)[:3] == ["lens", "hk", "hv"]
    kc, vc, bt, k, v, q, sl, out = bench_attn.decode_inputs(2, 20, dense=False, device="cpu")  # ncu_case
    assert k is None and q.shape == (2, 24, 256) and sl.tolist() == [20, 20]
    import bench_moe  # ncu_case moe: its 35B-A3B block shape
    assert (bench_moe.E, bench_moe.EP, bench_moe.K, bench_moe.H, bench_moe.I) == (256, 257, 8, 2048, 512)
    assert list(inspect.signature(bench_moe.random_weights).parameters) == ["seed"]


def test_case_lists():
    assert len(C.attn_prefill_cases()) == 8 and (24, 4, 32768) in C.attn_prefill_cases()
    dec = C.attn_decode_cases()
    assert (64, 32768) in dec and (256, 4096) in dec and (256, 32768) not in dec  # 2 x 34 GB > 40 GB
    assert len(dec) == 11
    for b, l in dec:
        assert 2 * C.attn_decode_kv_bytes(b, l, 4) <= C.ATTN_DECODE_MAX_BYTES
    names = [n for n, _ in C.gdn_prefill_cases()]
    assert names == ["1x2048", "1x8192", "1x32768", "mixed11x8192"]
    mixed = dict(C.gdn_prefill_cases())["mixed11x8192"]
    assert len(mixed) == 11 and sum(mixed) == 8193  # the lengths every earlier run used


def test_limits():
    # decode: K and V of every token (B, L, Hkv, D, bf16) + q read + out written
    assert C.attn_decode_bytes(2, 512, 24, 4, 256) == 2 * 2 * 512 * 4 * 256 * 2 + 2 * 2 * 24 * 256 * 2
    assert math.isclose(C.floor_ms(4.8e12, 4.8), 1000.0)
    assert C.attn_prefill_flops(1024, 24, 256) == 4 * 1024 * 1024 * 256 * 24 / 2
    assert C.attn_prefill_flops(1024, 24, 256, causal=False) == 2 * C.attn_prefill_flops(1024, 24, 256)
    assert C.gdn_decode_bytes(3, 48) == 2 * 3 * 48 * 128 * 128 * 4
    T, N, hk, hv = 100, 2, 16, 48
    assert C.gdn_prefill_bytes(T, N, hk, hv) == (T * (2 * hk * 128 + hv * 128) * 2 + 2 * T * hv * 2
                                                 + T * hv * 128 * 2 + N * hv * 128 * 128 * 4)
    assert C.attn_prefill_set_bytes(10, 24, 4, 256) == 2 * 10 * 4 * 256 * 2 + 2 * 10 * 24 * 256 * 2
    assert math.isclose(C.pct(1.0, 2.0), 50.0) and C.pct(None, 1.0) is None and C.pct(1.0, None) is None


def test_rotation_sets_exceed_l2():
    for nbytes in (1e3, 2e6, 29e6, 117e6):
        n = C.n_sets_for(nbytes, lo=1, hi=10**6)
        assert n * nbytes > 2.5 * C.L2_BYTES
        assert (n - 1) * nbytes <= 2.5 * C.L2_BYTES
    assert C.n_sets_for(1e9, lo=1) == 1 and C.n_sets_for(1e9) == 2
    assert C.n_sets_for(1, hi=64) == 64


def test_comparison_record():
    c = C.comparison("norm", "x", "device", "op", 2.0, "torch", 3.0, unit="us", pct_limit=40.0, limit="L")
    assert c["ratio"] == 1.5 and c["unit"] == "us" and c["pct_limit"] == 40.0 and c["limit"] == "L"
    assert C.comparison("norm", "x", "eager", "op", None, "torch", 3.0) is None
    assert C.comparison("norm", "x", "eager", "op", 1.0, "torch", None) is None
    with pytest.raises(ValueError):
        C.comparison("norm", "x", "graph", "op", 1.0, "torch", 1.0)
    cmp = C.Comparisons()
    cmp.add("norm", "x", "host", "op", 1.0, "torch", 2.0)
    cmp.add("norm", "x", "host", "op", None, "torch", 2.0)
    assert len(cmp) == 1


def test_sdpa_backend_of():
    assert C.sdpa_backend_of(["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<256>>(Params)"]) == "flash"
    assert C.sdpa_backend_of(["flash_fwd_splitkv_kernel", "flash_fwd_splitkv_combine_kernel"]) == "flash"
    assert C.sdpa_backend_of(["cudnn_generated_fort_native_sdpa_sm90_knob_7"]) == "cudnn"
    assert C.sdpa_backend_of(["sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0"]) == "cudnn"
    assert C.sdpa_backend_of(["fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)"]) \
        == "efficient"
    assert C.sdpa_backend_of(["ampere_bf16_s16816gemm", "softmax_warp_forward"]) == "math"
    assert C.sdpa_backend_of(["<profiler failed: X>"]) == "unknown" and C.sdpa_backend_of([]) == "unknown"


def _prefill_row():
    return {"kind": "prefill", "Hq": 24, "Hkv": 4, "T": 1024, "peak_ms": 0.01,
            "vkc_graph_ms": 0.05, "vkc_plan_graph_ms": 0.05, "vkc_ms": 0.06, "vkc_plan_ms": 0.055,
            "vkc_validated_ms": 0.09, "vkc_host_us": 10.0, "vkc_plan_host_us": 8.0, "vkc_validated_host_us": 30.0,
            "sdpa_flash_graph_ms": 0.08, "sdpa_flash_ms": 0.1, "sdpa_flash_host_us": 20.0,
            "sdpa_flash_backend_graph": "flash", "sdpa_flash_backend_eager": "flash",
            "sdpa_cudnn_error": "RuntimeError: No available kernel"}


def test_attn_comparisons():
    cmp = C.attn_comparisons(C.Comparisons(), _prefill_row(), ("flash", "cudnn"))
    assert {c["peer"] for c in cmp} == {"sdpa_flash"}  # the failed peer yields no comparison (its row keeps the error)
    by = {(c["mode"], c["vkc"]): c for c in cmp}
    assert set(by) == {("device", "op"), ("device", "plan"), ("eager", "op"), ("eager", "plan"),
                       ("eager", "op_validated"), ("host", "op"), ("host", "plan"), ("host", "op_validated")}
    assert math.isclose(by[("device", "op")]["ratio"], 0.08 / 0.05)
    assert math.isclose(by[("device", "op")]["pct_limit"], 20.0)
    assert math.isclose(by[("host", "op_validated")]["ratio"], 20.0 / 30.0) and by[("host", "op")]["unit"] == "us"
    assert by[("device", "op")]["family"] == "attn_prefill" and by[("device", "op")]["case"] == "24/4 T=1024"
    dec = {"kind": "decode", "B": 1, "L": 512, "floor_ms": 0.001, "vkc_graph_ms": 0.01, "sdpa_flash_graph_ms": 0.02}
    (c,) = C.attn_comparisons(C.Comparisons(), dec, ("flash",))
    assert c["family"] == "attn_decode" and c["ratio"] == 2.0 and math.isclose(c["pct_limit"], 10.0)
    assert "4.8 TB/s" in c["limit"]


def test_family_comparisons_of_other_benches():
    import bench_gdn
    import bench_gdn_decode
    import bench_norm
    cmp = C.Comparisons()
    bench_gdn.gdn_comparisons(cmp, {"heads": "16/48", "case": "1x2048", "floor_ms": 0.01, "vkc_graph_ms": 0.2,
                                    "fla_graph_ms": 0.21, "vkc_eager_ms": 0.22, "fla_ms": 1.0,
                                    "vkc_host_us": 50.0, "fla_host_us": 400.0})
    assert {(c["mode"], c["peer"]) for c in cmp} == {("device", "fla_chunk"), ("eager", "fla_chunk"),
                                                      ("host", "fla_chunk")}  # no profiler sum in this row
    assert math.isclose(next(c for c in cmp if c["mode"] == "device")["ratio"], 1.05)
    cmp = C.Comparisons()
    bench_gdn_decode.decode_comparisons(cmp, {"Hv": 48, "B": 1, "floor_us": 1.0, "vkc_graph_us": 4.0,
                                              "fla_graph_error": "capture failed", "vkc_eager_us": 10.0,
                                              "fla_eager_us": 20.0})
    assert [(c["mode"], c["ratio"]) for c in cmp] == [("eager", 2.0)]  # a failed capture never borrows eager time
    cmp = C.Comparisons()
    row = {"op": "rmsnorm", "hidden": 2048, "tokens": 1, "torch_impl": "F.rms_norm", "floor_us": 0.5,
           "vkc_graph_us": 1.0, "torch_graph_us": 2.0, "vkc_us": 10.0, "torch_us": 9.0, "vkc_validated_us": 20.0,
           "vkc_host_us": 5.0, "torch_host_us": 6.0, "vkc_validated_host_us": 15.0}
    bench_norm.norm_comparisons(cmp, row)
    assert len(cmp) == 5 and {c["case"] for c in cmp} == {"rmsnorm h=2048 T=1"}


def test_git_commit_env_first_then_git(monkeypatch):
    monkeypatch.delenv("VKC_COMMIT", raising=False)
    commit, source, _ = C.git_commit()
    if source == "git":
        assert len(commit) == 40
    monkeypatch.setenv("VKC_COMMIT", "abc1234")
    assert C.git_commit() == ("abc1234", "env VKC_COMMIT", None)  # wins over a (possibly stale) .git

    def no_git(*a, **k):
        raise OSError("no git")
    monkeypatch.setattr(subprocess, "run", no_git)
    assert C.git_commit() == ("abc1234", "env VKC_COMMIT", None)
    monkeypatch.delenv("VKC_COMMIT")
    assert C.git_commit()[0] == "unknown"


def _synthetic(commit, ratio_scale=1.0):
    cmp = C.Comparisons()
    for i, (b, l) in enumerate(((1, 512), (16, 4096), (64, 32768))):
        r = {"kind": "decode", "B": b, "L": l, "floor_ms": 0.01 * (i + 1), "vkc_graph_ms": 0.02 * (i + 1),
             "vkc_plan_graph_ms": 0.02 * (i + 1), "vkc_ms": 0.05, "vkc_plan_ms": 0.04,
             "sdpa_flash_graph_ms": 0.02 * (i + 1) * (0.8 + 0.2 * i) * ratio_scale, "sdpa_flash_ms": 0.05,
             "sdpa_flash_backend_graph": "flash", "sdpa_flash_backend_eager": "flash",
             "sdpa_cudnn_graph_ms": 0.03, "sdpa_cudnn_backend_graph": "flash", "sdpa_cudnn_backend_eager": "cudnn"}
        C.attn_comparisons(cmp, r, ("flash", "cudnn"))
    res = {"schema": C.SCHEMA, "bench": "attn", "meta": {"commit": commit, "date_utc": "2026-12-01T10:00:00Z",
                                                          "device": "NVIDIA H200"},
           "method": {}, "limits": {}, "rows": [], "comparisons": list(cmp)}
    return json.loads(json.dumps(res))  # as read back from disk


def test_summarize_new_schema(tmp_path):
    run = {"attn.json": _synthetic("1" * 40), "env.txt": "device ...", "runtime_bench.jsonl": [{"x": 1}]}
    p = tmp_path / "results.json"
    p.write_text(json.dumps(run))
    loaded = summarize.load(str(p))
    (name, meta, cmps), = summarize.collect(loaded)
    assert name == "attn.json" and meta["commit"] == "1" * 40
    rng = summarize.ranges(cmps)
    lo, hi, n, clo, chi = rng[("attn_decode", "device", "op", "sdpa_flash")]
    assert n == 3 and math.isclose(lo, 0.8) and math.isclose(hi, 1.2) and clo == "B=1 L=512" and chi == "B=64 L=32768"
    md = summarize.markdown(loaded)
    assert "### attn_decode, device time, graph vs graph" in md and "| B=16 L=4096 | op |" in md
    assert "vkc op vs sdpa_flash: 0.80–1.20× over 3 cases" in md and f"commit `{'1' * 40}`" in md
    assert "Warning" not in md
    assert "sdpa_cudnn ran flash" in md  # a peer whose recorded backend differs is flagged
    out = tmp_path / "t.md"
    assert summarize.main([str(p), "--md", str(out)]) == 0 and out.read_text() == md


def test_summarize_warns_on_mixed_commits(tmp_path):
    run = {"attn.json": _synthetic("a" * 40), "attn2.json": _synthetic("b" * 40, 2.0)}
    md = summarize.markdown(run)
    assert "come from 2 commits" in md


def test_summarize_single_file_and_result_builder(tmp_path):
    cmp = C.Comparisons()
    cmp.add("norm", "rmsnorm h=2048 T=1", "device", "op", 1.0, "torch", 2.0, unit="us", pct_limit=5.0, limit="L")
    res = C.result("norm", method={}, limits=C.hbm_limits(4.2), rows=[], comparisons=cmp)
    assert res["schema"] == C.SCHEMA and res["meta"]["commit"] and "date_utc" in res["meta"]
    assert "torch" in res["meta"] and "triton" in res["meta"]
    p = tmp_path / "norm.json"
    C.write(str(p), res)
    md = summarize.markdown(summarize.load(str(p)))
    assert "| rmsnorm h=2048 T=1 | op | 1.000 | 2.000 | 2.00× | 5.0% |" in md


LEGACY = os.path.join(ROOT, "benchmarks", "results", "2026-11-30-h200-session6.tgz")  # archived session results


def test_summarize_legacy_results(tmp_path):
    with tarfile.open(LEGACY) as tar:
        tar.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    loaded = summarize.load(str(tmp_path / "2026-11-30-h200-session6" / "final"))
    (name, meta, cmps), = summarize.collect(loaded)
    assert name == "attn.json" and meta["commit"].startswith("unknown")
    rng = summarize.ranges(cmps)
    lo, hi, n, _, _ = rng[("attn_decode", "device", "op", "sdpa_default (K/V expanded)")]
    assert n == 11 and 1.0 < lo < hi  # what BENCHMARKS.md reported as "1.43-7.2x SDPA" in graphs
    assert ("attn_prefill", "device", "op", "sdpa_flash (K/V expanded)") in rng


def test_sdpa_peer_matches_reference_prefill_and_decode():
    """The peer's inputs and call (bench_attn.paged de-paging + native GQA) compute vkc's attention."""
    import bench_attn
    torch.manual_seed(0)
    Hq, Hkv, D, T = 6, 2, 64, 40
    kc, vc, bt, k, v = bench_attn.paged(1, T, Hkv, D, bs=16, device="cpu")
    assert k.shape == (1, Hkv, T, D) and k.is_contiguous()  # never expanded to the query heads
    q = torch.randn(T, Hq, D, dtype=torch.bfloat16)
    with bench_attn.sdpa_ctx("flash"):
        o = bench_attn.sdpa_gqa(q.permute(1, 0, 2).unsqueeze(0).contiguous(), k, v, True)
    f = lambda t: t.float().numpy()  # noqa: E731
    ref = refs_attn.prefill(f(q), f(kc), f(vc), bt.numpy(), np.array([0, T]), np.array([T]), D ** -0.5)
    assert refs_attn.rel_err(o[0].permute(1, 0, 2).float().numpy(), ref) < 2e-2
    B, L = 3, 33
    kc, vc, bt, k, v, q, sl, out = bench_attn.decode_inputs(B, L, Hq, Hkv, D, device="cpu")
    with bench_attn.sdpa_ctx("flash"):
        o = bench_attn.sdpa_gqa(q.unsqueeze(2), k, v, False)
    ref = refs_attn.decode(f(q), f(kc), f(vc), bt.numpy(), sl.numpy(), D ** -0.5)
    assert refs_attn.rel_err(o[:, :, 0].float().numpy(), ref) < 2e-2
    # a shared block table keeps the layout across rotated sets (one plan serves them all)
    given = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    kc2, _, bt2, k2, _ = bench_attn.paged(1, T, Hkv, D, bs=16, device="cpu", bt=given)
    assert bt2 is given and torch.equal(k2[0, :, 17], kc2[0, 1]) and torch.equal(k2[0, :, 39], kc2[1, 7])


def test_timing_method_describes_every_mode():
    import timing
    m = timing.method(graph_used={"inner": 3})
    assert {"device", "eager", "host", "statistic"} <= set(m) and m["graph_used"] == {"inner": 3}


# ------------------------------------------------------------------------------------ CPU dry runs of main()
# Each benchmark's main() runs end to end on CPU at tiny sizes: the timers call the functions they time (a few
# times, every input set) and return fixed numbers, the vkc ops are stand-ins that check each call binds to
# the real op's signature, the peers are real torch (SDPA on CPU) or stand-ins for FLA. What this catches:
# wrong call signatures, missing keys, broken result JSON, comparisons that mix modes.

FLASH_NAME = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>(Flash_fwd_params)"


def _binder(real, ret=None):
    sig = inspect.signature(real)

    def f(*a, **k):
        sig.bind(*a, **k)
        return ret(*a, **k) if callable(ret) else ret
    return f


def _plan_cls(real, **attrs):
    init, run = inspect.signature(real.__init__), inspect.signature(real.run)

    class Plan:
        def __init__(self, *a, **k):
            init.bind(self, *a, **k)
            self.__dict__.update(attrs)

        def run(self, *a, **k):
            run.bind(self, *a, **k)
            return k.get("out")
    return Plan


@pytest.fixture
def dry(monkeypatch):
    """Fake timers and CUDA calls; returns the log of timer calls."""
    import timing
    log = []

    def events_ms(fn, *, n_sets=1, inner=5, reps=30, warm=3):
        log.append(("eager", n_sets))
        for i in range(n_sets):
            fn(i, None)
        return 1.0

    def graph_ms(fn, *, vkc, n_sets=1, inner=5, reps=20, kernels=None):
        log.append(("graph", vkc, n_sets, inner))
        assert inner >= 1
        for i in range(inner):
            fn(i % n_sets, 7 if vkc else None)
        if kernels is not None:
            kernels.append(FLASH_NAME)
        return 0.5

    def host_us(fn, *, n=100, warm=3, n_sets=1):
        log.append(("host", n_sets))
        for i in range(n_sets + 1):
            fn(i % n_sets, None)
        return 10.0

    def kernel_names(fn, n=1):
        fn()
        return [FLASH_NAME]
    for name, f in (("events_ms", events_ms), ("graph_ms", graph_ms), ("host_us", host_us),
                    ("kernel_names", kernel_names)):
        monkeypatch.setattr(timing, name, f)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *a: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(C, "measured_copy_tbs", lambda *a, **k: 4.0)
    return log, {"events_ms": events_ms, "graph_ms": graph_ms, "host_us": host_us}


def _check_result(path, bench, families):
    res = json.loads(path.read_text())
    assert res["schema"] == C.SCHEMA and res["bench"] == bench
    assert res["meta"]["commit"] and res["meta"]["date_utc"] and "torch" in res["meta"] and res["method"]
    assert res["limits"]["hbm_nominal_tbs"] == 4.8
    assert {c["family"] for c in res["comparisons"]} == set(families)
    for c in res["comparisons"]:
        assert c["mode"] in C.MODES and c["ratio"] == c["peer_time"] / c["vkc_time"]
    md = summarize.markdown({f"{bench}.json": res})
    assert "Ratio ranges" in md
    return res


def test_dry_run_bench_attn(dry, monkeypatch, tmp_path):
    import bench_attn as M
    from vkc_runtime.ops import attn as A
    monkeypatch.setattr(M, "DEVICE", "cpu")
    monkeypatch.setattr(C, "ATTN_HEAD_DIM", 64)
    monkeypatch.setattr(C, "attn_prefill_cases", lambda: [(6, 2, 40)])
    monkeypatch.setattr(C, "attn_decode_cases", lambda Hkv=4, D=64: [(2, 33), (1, 2000)])
    monkeypatch.setattr(C, "HOST_VISIBLE_DECODE", 100)
    fake = types.SimpleNamespace(
        prefill=_binder(A.prefill), decode=_binder(A.decode), PrefillPlan=_plan_cls(A.PrefillPlan),
        DecodePlan=_plan_cls(A.DecodePlan, num_splits=3, batch=types.SimpleNamespace(tma=False)),
        decode_workspace=_binder(A.decode_workspace, object()),
        prefill_uses_tma=_binder(A.prefill_uses_tma, True), num_splits_for=A.num_splits_for)
    monkeypatch.setattr(M, "A", fake)
    monkeypatch.setattr(M, "warm_host", lambda *a: None)
    monkeypatch.setattr(M, "host_profile", lambda *a: {"B": 1, "L": 512})
    out = tmp_path / "attn.json"
    M.main(str(out))
    res = _check_result(out, "attn", ["attn_prefill", "attn_decode"])
    pre, dec1, dec2, host = res["rows"]
    assert pre["kind"] == "prefill" and dec1["kind"] == "decode" and host["kind"] == "decode_host"
    for r, peers in ((pre, M.PREFILL_PEERS), (dec1, M.DECODE_PEERS)):
        assert r["sdpa_flash_backend_ok"] is True and r["sdpa_flash_backend_graph"] == "flash"
        for be in peers:  # CPU torch has no cuDNN / mem-efficient SDPA: recorded, not dropped
            assert f"sdpa_{be}_ms" in r or f"sdpa_{be}_error" in r
    assert "sdpa_cudnn_error" in pre and {c["peer"] for c in res["comparisons"]} == {"sdpa_flash"}
    assert pre["n_sets"] > 1 and dec1["n_sets"] > 1  # tiny inputs rotate
    assert "vkc_validated_host_us" in pre and "vkc_validated_host_us" in dec1 and "vkc_host_us" not in dec2
    assert dec1["split_sweep_graph_ms"] == {}  # L = 33 < 64: no forced split fits
    assert dec1["vkc_pct_floor"] == 100 * dec1["floor_ms"] / 0.5
    modes = {(c["family"], c["mode"], c["vkc"]) for c in res["comparisons"]}
    assert ("attn_decode", "device", "plan") in modes and ("attn_prefill", "host", "op_validated") in modes
    log, _ = dry
    assert all(e[3] >= e[2] for e in log if e[0] == "graph")  # every rotated set is in the graph


def _fake_fla_modules(monkeypatch, chunk=None, recurrent=None):
    fla = types.ModuleType("fla")
    fla.__version__ = "0.0-fake"
    ops = types.ModuleType("fla.ops")
    gdr = types.ModuleType("fla.ops.gated_delta_rule")
    gdr.chunk_gated_delta_rule = chunk
    gdr.fused_recurrent_gated_delta_rule = recurrent
    for name, m in (("fla", fla), ("fla.ops", ops), ("fla.ops.gated_delta_rule", gdr)):
        monkeypatch.setitem(sys.modules, name, m)


def _fill_out(*a, **k):
    k["out"].fill_(1.0)  # the stand-in's "result", which the same-result check compares the peer with
    return k["out"]


@pytest.mark.parametrize("capture_ok,native_ok", [(True, True), (False, True), (True, False)])
def test_dry_run_bench_gdn(dry, monkeypatch, tmp_path, capture_ok, native_ok):
    import bench_gdn as M
    from vkc_runtime.ops import gdn as G
    calls = []
    hk, hv = 2, 4

    def fla_chunk(q, k, v, g, beta, *, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel):
        T = v.shape[1]
        assert q.shape == k.shape and q.shape[:2] == (1, T) and g.shape == beta.shape == (1, T, hv)
        assert cu_seqlens.dtype == torch.long and initial_state.shape[0] == len(cu_seqlens) - 1
        assert not initial_state.any()  # FLA starts from the zero state vkc's check call started from
        calls.append(q.shape[2])
        o = torch.ones_like(v) if (native_ok or q.shape[2] == hv) else 3 * torch.ones_like(v)
        return o, torch.empty_like(initial_state)
    _fake_fla_modules(monkeypatch, chunk=fla_chunk)
    monkeypatch.setattr(M, "DEVICE", "cpu")
    monkeypatch.setattr(C, "GDN_HEADS", ((hk, hv),))
    monkeypatch.setattr(C, "gdn_prefill_cases", lambda: [("1x64", [64]), ("mixed", [1, 30, 33])])
    monkeypatch.setattr(M, "G", types.SimpleNamespace(workspace_for=_binder(G.workspace_for,
                                                                           types.SimpleNamespace(nbytes=1e6)),
                                                      chunk_gated_delta_rule=_binder(G.chunk_gated_delta_rule,
                                                                                     _fill_out),
                                                      get_kernel=G.get_kernel))
    log, fakes = dry
    monkeypatch.setattr(M, "events_ms", fakes["events_ms"])
    monkeypatch.setattr(M, "host_us", fakes["host_us"])

    def graph_ms(fn, *, vkc, **k):
        if not vkc and not capture_ok:
            raise RuntimeError("operation not permitted when stream is capturing")
        return fakes["graph_ms"](fn, vkc=vkc, **k)
    monkeypatch.setattr(M, "graph_ms", graph_ms)
    monkeypatch.setattr(M, "profiled_kernels_ms", lambda run, reps=5: ({"k": 0.4}, 0.4))
    out = tmp_path / "gdn.json"
    M.main(str(out))
    res = _check_result(out, "gdn", ["gdn_prefill"])
    for r in res["rows"]:
        assert r["fla_ms"] == 1.0 and r["fla_host_us"] == 10.0 and r["fla_vs_vkc_rel_err"] == 0.0
        assert r["fla_device_ms"] == 0.4  # the profiler pass after all timings
        if native_ok:
            assert r["fla_mode"] == "native GQA"
        else:
            assert r["fla_mode"].startswith("q/k expanded to Hv heads (native output rel err 2")
        if capture_ok:
            assert r["fla_graph_status"] == "captured" and r["fla_graph_ms"] == 0.5
        else:
            assert r["fla_graph_status"] == "capture failed" and "fla_graph_ms" not in r and r["fla_graph_error"]
    assert set(calls) == ({hk} if native_ok else {hk, hv})  # the timed calls use the checked variant
    peers = {(c["mode"], c["peer"]) for c in res["comparisons"]}
    assert (("device", "fla_chunk") in peers) == capture_ok
    assert ("eager", "fla_chunk") in peers and ("device", "fla_chunk_profiler_kernel_sum") in peers


def test_dry_run_bench_gdn_decode(dry, monkeypatch, tmp_path):
    import bench_gdn_decode as M
    from vkc_runtime.ops import conv as CV
    from vkc_runtime.ops import gdn_decode as GD
    heads = []

    def fla(q, k, v, *, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel):
        heads.append(q.shape[2])
        assert q.shape == k.shape and v.shape[:2] == q.shape[:2] and initial_state.shape[0] == q.shape[0]
        return torch.ones_like(v), torch.empty_like(initial_state)
    monkeypatch.setattr(M, "_fla", lambda: fla)
    monkeypatch.setattr(M, "DEVICE", "cpu")
    monkeypatch.setattr(M, "DECODE_HV", (4,))
    monkeypatch.setattr(C, "GDN_DECODE_B", (1, 2))
    monkeypatch.setattr(M, "CONV_C", (64,))
    monkeypatch.setattr(M, "CONV_UPDATE_B", (1, 3))
    monkeypatch.setattr(M, "CONV_PREFILL_LENS", ([5, 9],))
    monkeypatch.setattr(M, "GD", types.SimpleNamespace(recurrent_decode=_binder(GD.recurrent_decode, _fill_out)))
    monkeypatch.setattr(M, "CV", types.SimpleNamespace(causal_conv1d_update=_binder(CV.causal_conv1d_update),
                                                       causal_conv1d=_binder(CV.causal_conv1d)))
    log, fakes = dry
    for name in ("events_ms", "graph_ms", "host_us"):
        monkeypatch.setattr(M, name, fakes[name])
    out = tmp_path / "gdn_decode.json"
    M.main(str(out))
    res = _check_result(out, "gdn_decode", ["gdn_decode"])
    dec = [r for r in res["rows"] if r["op"] == "gdn_decode"]
    assert len(dec) == 2 and all(r["fla_mode"] == "native GQA" and r["fla_vs_vkc_rel_err"] == 0.0 for r in dec)
    assert set(heads) == {16}
    assert all(r["speedup_vs_fla"] == 1.0 and r["eager_speedup_vs_fla"] == 1.0 for r in dec)
    assert {r["op"] for r in res["rows"]} == {"gdn_decode", "conv_update", "conv_prefill"}
    assert all("vkc_pct_copy" in r for r in res["rows"])


def test_dry_run_bench_norm(dry, monkeypatch, tmp_path):
    import bench_norm as M
    from vkc_runtime.ops import act as AC, norm as N, rope as RO
    monkeypatch.setattr(M, "DEVICE", "cpu")
    monkeypatch.setattr(C, "NORM_HIDDEN", (64,))
    monkeypatch.setattr(C, "NORM_TOKENS", (1, 4000))
    monkeypatch.setattr(M, "OTHERS_T", 4)
    for name, mod, ops in (("N", N, ("rmsnorm", "add_rmsnorm", "gated_rmsnorm")), ("RO", RO, ("qk_norm_rope",)),
                           ("AC", AC, ("silu_mul", "sigmoid_mul"))):
        monkeypatch.setattr(M, name, types.SimpleNamespace(**{n: _binder(getattr(mod, n)) for n in ops}))
    out = tmp_path / "norm.json"
    M.main(str(out))
    res = _check_result(out, "norm", ["norm"])
    by = {(r["op"], r["tokens"]): r for r in res["rows"]}
    assert set(by) >= {("rmsnorm", 1), ("add_rmsnorm", 4000), ("silu_mul", 4), ("qk_norm_rope", 4)}
    small = by[("rmsnorm", 1)]
    assert {"vkc_host_us", "torch_host_us", "vkc_validated_host_us", "vkc_validated_us"} <= set(small)
    assert "vkc_host_us" not in by[("rmsnorm", 4000)]
    hosts = [c for c in res["comparisons"] if c["mode"] == "host"]
    assert {c["vkc"] for c in hosts} == {"op", "op_validated"} and all(c["case"].endswith("T=1") for c in hosts)


@pytest.mark.parametrize("card,tbs", [("NVIDIA H200", 4.8), ("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0),
                                      ("NVIDIA H100 NVL", 3.9), ("", 4.8)])
def test_nominal_hbm_follows_the_card(monkeypatch, card, tbs):
    monkeypatch.setattr(C, "_smi_query", lambda fields: card)
    got, source = C._nominal_hbm_tbs()
    assert got == tbs and ("datasheet" in source)
