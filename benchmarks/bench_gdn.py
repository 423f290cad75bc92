"""GDN chunked prefill on the H200: vkc (ops.gdn.chunk_gated_delta_rule) side by side with FLA's
chunk_gated_delta_rule in the same process (skipped cleanly if FLA is not importable).

Shapes: Qwen3.6-27B (16 key / 48 value heads) and 35B-A3B (16 / 32), K = V = 128, 1x2048, 1x8192, 1x32768 and
a mixed varlen batch (8192 tokens in 11 sequences). vkc: one call captured in a vkc CUDA graph, replays
timed with CUDA events (device time), plus eager event timing; FLA: eager event timing (Triton JIT launches;
warm-up first so autotuning is done) and, stricter, its summed kernel device time from torch.profiler
(fla_device_ms: FLA's host overhead excluded). Median of repeats. vkc's time includes the q/k split + L2 norm and the
gate math (g, beta from a, b, A_log, dt_bias); FLA gets g, beta precomputed and does the L2 norm in-kernel
(use_qk_l2norm_in_kernel=True). Usage: python benchmarks/bench_gdn.py OUT.json
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import traceback

import numpy as np
import torch

import vkc_runtime
from vkc_runtime.ops import gdn as G

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import events_ms, graph_ms  # noqa: E402

DK = DV = 128


def stage_ms(call, reps=10):
    """Per-kernel device time inside one op call: every launch is bracketed by CUDA events on its stream
    (G.get_kernel is wrapped for the measurement only). Returns {base: median ms}."""
    orig = G.get_kernel
    log = []

    class Timed:
        def __init__(self, k):
            self.k, self.base, self.constexprs = k, k.base, k.constexprs

        def launch(self, grid, args, stream=0):
            s = torch.cuda.ExternalStream(stream) if stream else torch.cuda.default_stream()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(s)
            self.k.launch(grid, args, stream)
            b.record(s)
            log.append((self.base, a, b))

    G.get_kernel = lambda base: Timed(orig(base))
    try:
        per: dict[str, list[float]] = {}
        for _ in range(reps):
            log.clear()
            call()
            torch.cuda.synchronize()
            for base, a, b in log:
                per.setdefault(base, []).append(a.elapsed_time(b))
    finally:
        G.get_kernel = orig
    return {b: statistics.median(v) for b, v in per.items()}


def profiled_kernels_ms(fn, reps=5):
    """Device time per kernel name (ms per call) of fn, from torch.profiler's CUDA activity (the peer's own
    kernels, without its host overhead). Returns ({name: ms}, total ms)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0) or 0
        if t > 0:
            per[e.key] = per.get(e.key, 0.0) + t / reps / 1e3
    return per, sum(per.values())


def make(lens, hk, hv, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = int(sum(lens))
    C = 2 * hk * DK + hv * DV
    qkv = torch.nn.functional.silu(torch.randn(T, C, generator=g, device="cuda")).to(torch.bfloat16)
    a = (torch.randn(T, hv, generator=g, device="cuda") * 2).to(torch.bfloat16)
    b = (torch.randn(T, hv, generator=g, device="cuda") * 2).to(torch.bfloat16)
    A_log = (torch.rand(hv, generator=g, device="cuda") * 2 - 1).float()
    dt = (torch.randn(hv, generator=g, device="cuda") * 0.5).float()
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    return qkv, a, b, A_log, dt, cu


def vkc_case(lens, hk, hv, seed=0):
    """One prefill call on fresh inputs with a workspace, output and zero-initialized slot states allocated
    up front (graph-capturable): returns (call(stream=None), inputs, workspace)."""
    T, N = int(sum(lens)), len(lens)
    inputs = make(lens, hk, hv, seed)
    ws = G.workspace_for(T, N, hk, hv)
    out = torch.empty(T, hv, DV, device="cuda", dtype=torch.bfloat16)
    state = torch.zeros(N, hv, DK, DV, device="cuda")
    slot = torch.arange(N, dtype=torch.int32, device="cuda")

    def call(stream=None):
        G.chunk_gated_delta_rule(*inputs, hk, hv, state=state, slot_idx=slot, out=out, workspace=ws, stream=stream)
    return call, inputs, ws


def fla_setup(qkv, a, b, A_log, dt, cu, hk, hv, state0):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    T = qkv.shape[0]
    q = qkv[:, :hk * DK].reshape(1, T, hk, DK)
    k = qkv[:, hk * DK:2 * hk * DK].reshape(1, T, hk, DK)
    v = qkv[:, 2 * hk * DK:].reshape(1, T, hv, DV)
    g = (-A_log.exp() * torch.nn.functional.softplus(a.float() + dt)).view(1, T, hv).contiguous()
    beta = b.float().sigmoid().view(1, T, hv).contiguous()
    cul = cu.long()
    mode = "native GQA"
    try:  # FLA versions with grouped value heads take q, k at Hk heads
        fla_chunk(q.contiguous(), k.contiguous(), v.contiguous(), g, beta, initial_state=state0,
                  output_final_state=True, cu_seqlens=cul, use_qk_l2norm_in_kernel=True)
        qq, kk = q.contiguous(), k.contiguous()
    except Exception:
        mode = "q/k expanded to Hv heads"
        rep = hv // hk
        qq = q.repeat_interleave(rep, dim=2).contiguous()
        kk = k.repeat_interleave(rep, dim=2).contiguous()
    vv = v.contiguous()

    def run():
        return fla_chunk(qq, kk, vv, g, beta, initial_state=state0, output_final_state=True, cu_seqlens=cul,
                         use_qk_l2norm_in_kernel=True)
    return run, mode


def main(out_path):
    torch.manual_seed(0)
    rows = []
    try:
        import fla  # noqa: F401
        have_fla = True
        fla_version = getattr(fla, "__version__", "?")
    except Exception as e:
        have_fla, fla_version = False, f"not importable: {type(e).__name__}: {e}"
    mixed = [1, 17, 64, 65, 129, 500, 1000, 1024, 1500, 1800, 2093]
    cases = [("1x2048", [2048]), ("1x8192", [8192]), ("1x32768", [32768]), ("mixed11x8192", mixed)]
    for hk, hv in ((16, 48), (16, 32)):
        for name, lens in cases:
            T, N = sum(lens), len(lens)
            call, (qkv, a, b, A_log, dt, cu), ws = vkc_case(lens, hk, hv)
            row = {"heads": f"{hk}/{hv}", "case": name, "tokens": T, "seqs": N,
                   "workspace_mb": ws.nbytes / 1e6}
            row["vkc_graph_ms"] = graph_ms(lambda i, st: call(st), vkc=True)
            row["vkc_eager_ms"] = events_ms(lambda i, st: call(st))
            try:
                row["vkc_stage_ms"] = stage_ms(call)
            except Exception as e:  # the breakdown is diagnostic: never lose the row for it
                row["vkc_stage_ms"] = {}
                row["vkc_stage_error"] = f"{type(e).__name__}: {e}"
            if have_fla:
                try:
                    run, mode = fla_setup(qkv, a, b, A_log, dt, cu, hk, hv, torch.zeros(N, hv, DK, DV, device="cuda"))
                    row["fla_ms"] = events_ms(lambda i, st: run())
                    row["fla_mode"] = mode
                    row["speedup_vs_fla"] = row["fla_ms"] / row["vkc_graph_ms"]
                    # FLA's device time alone (its host launch overhead excluded): the stricter comparison
                    row["fla_kernels_ms"], row["fla_device_ms"] = profiled_kernels_ms(run)
                    row["speedup_vs_fla_device"] = row["fla_device_ms"] / row["vkc_graph_ms"]
                except Exception as e:
                    row["fla_error"] = f"{type(e).__name__}: {e}"
                    traceback.print_exc()
            rows.append(row)
            print(json.dumps(row), flush=True)
            call = ws = qkv = None  # free this case before the next one
            torch.cuda.empty_cache()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "fla": fla_version,
           "vkc_arch": vkc_runtime.doctor.report()["selected_arch"],
           "method": "vkc: CUDA-graph replay (device time) and eager events; FLA: eager events after warm-up; "
                     "median of 30 x 5 calls",
           "rows": rows}
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'heads':<7}{'case':<14}{'T':>7}{'vkc graph ms':>14}{'vkc eager ms':>14}{'FLA ms':>10}{'x FLA':>8}"
          f"{'FLA dev ms':>12}{'x dev':>7}")
    for r in rows:
        fl, sp = r.get("fla_ms"), r.get("speedup_vs_fla")
        fd, sd = r.get("fla_device_ms"), r.get("speedup_vs_fla_device")
        fl_s = f"{fl:.3f}" if fl else "-"
        sp_s = f"{sp:.2f}" if sp else "-"
        print(f"{r['heads']:<7}{r['case']:<14}{r['tokens']:>7}{r['vkc_graph_ms']:>14.3f}{r['vkc_eager_ms']:>14.3f}"
              f"{fl_s:>10}{sp_s:>8}{(f'{fd:.3f}' if fd else '-'):>12}{(f'{sd:.2f}' if sd else '-'):>7}   " + " ".join(f"{b.split('.', 1)[1]}={t:.3f}" for b, t in r["vkc_stage_ms"].items()))

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gdn_bench.json")
