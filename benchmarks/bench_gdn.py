"""GDN chunked prefill on the H200: vkc (ops.gdn.chunk_gated_delta_rule) side by side with FLA's
chunk_gated_delta_rule in the same process (rows without FLA say why, fla_error).

Shapes: Qwen3.6-27B (16 key / 48 value heads) and 35B-A3B (16 / 32), K = V = 128 (bench_common.GDN_HEADS,
gdn_prefill_cases: 1x2048, 1x8192, 1x32768 and a mixed varlen batch of 8193 tokens in 11 sequences).
Both sides are timed the same three ways (bench_common modes): device = the call captured in a CUDA graph
(vkc_runtime.Graph / torch.cuda.CUDAGraph; FLA's JIT and autotune are done by the eager calls before capture;
a case FLA cannot be captured for gets fla_graph_error and fla_graph_status "capture failed", never a
fallback), eager = CUDA events around back-to-back calls (host cost included), host = wall clock per call.
FLA's summed kernel time from torch.profiler (fla_device_ms), a cross-check of its graph time, is taken after
all timings. vkc's time includes the q/k split + L2 norm and the gate math (g, beta from a, b, A_log,
dt_bias); FLA gets g, beta precomputed outside its timing and does the L2 norm in-kernel
(use_qk_l2norm_in_kernel=True), q/k at the key heads where its version supports it (fla_mode).
Usage: python benchmarks/bench_gdn.py OUT.json
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import traceback

import numpy as np
import torch

from vkc_runtime.ops import gdn as G

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as C  # noqa: E402
from timing import events_ms, graph_ms, host_us, method  # noqa: E402

DEVICE = "cuda"  # the CPU dry run (tests/test_bench_logic.py) sets "cpu"

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
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    T = int(sum(lens))
    C = 2 * hk * DK + hv * DV
    qkv = torch.nn.functional.silu(torch.randn(T, C, generator=g, device=DEVICE)).to(torch.bfloat16)
    a = (torch.randn(T, hv, generator=g, device=DEVICE) * 2).to(torch.bfloat16)
    b = (torch.randn(T, hv, generator=g, device=DEVICE) * 2).to(torch.bfloat16)
    A_log = (torch.rand(hv, generator=g, device=DEVICE) * 2 - 1).float()
    dt = (torch.randn(hv, generator=g, device=DEVICE) * 0.5).float()
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=DEVICE)
    return qkv, a, b, A_log, dt, cu


def vkc_case(lens, hk, hv, seed=0):
    """One prefill call on fresh inputs with a workspace, output and zero-initialized slot states allocated
    up front (graph-capturable): returns (call(stream=None), inputs, workspace); call.out and call.state are
    the output and the slot states it writes."""
    T, N = int(sum(lens)), len(lens)
    inputs = make(lens, hk, hv, seed)
    ws = G.workspace_for(T, N, hk, hv)
    out = torch.empty(T, hv, DV, device=DEVICE, dtype=torch.bfloat16)
    state = torch.zeros(N, hv, DK, DV, device=DEVICE)
    slot = torch.arange(N, dtype=torch.int32, device=DEVICE)

    def call(stream=None):
        G.chunk_gated_delta_rule(*inputs, hk, hv, state=state, slot_idx=slot, out=out, workspace=ws, stream=stream)
    call.out, call.state = out, state
    return call, inputs, ws


def fla_setup(qkv, a, b, A_log, dt, cu, hk, hv, state0, vkc_out=None, expand=False):
    """FLA's call on the same inputs: q/k at the key heads (native GQA) when FLA accepts them and its output
    matches vkc_out (vkc's output from the same zero initial state), else (or with expand=True) q/k expanded
    to the value heads outside the timed region. Returns (run, mode, rel err vs vkc_out or None)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    T = qkv.shape[0]
    q = qkv[:, :hk * DK].reshape(1, T, hk, DK)
    k = qkv[:, hk * DK:2 * hk * DK].reshape(1, T, hk, DK)
    vv = qkv[:, 2 * hk * DK:].reshape(1, T, hv, DV).contiguous()
    g = (-A_log.exp() * torch.nn.functional.softplus(a.float() + dt)).view(1, T, hv).contiguous()
    beta = b.float().sigmoid().view(1, T, hv).contiguous()
    cul = cu.long()

    def call(qq, kk):
        return fla_chunk(qq, kk, vv, g, beta, initial_state=state0, output_final_state=True, cu_seqlens=cul,
                         use_qk_l2norm_in_kernel=True)

    def check(qq, kk):
        o = call(qq, kk)[0]
        return None if vkc_out is None else C.rel_err(o[0], vkc_out)
    qq, kk = q.contiguous(), k.contiguous()
    mode, rel = "native GQA", None
    if expand:
        mode = "q/k expanded to Hv heads (as in the timed pass)"
    else:
        try:  # FLA versions with grouped value heads take q, k at Hk heads
            rel = check(qq, kk)
            if rel is not None and not rel <= C.PEER_REL_TOL:
                mode = f"q/k expanded to Hv heads (native output rel err {rel:.3g} vs vkc)"
        except Exception as e:  # noqa: BLE001
            mode = f"q/k expanded to Hv heads (native: {C.err(e)[:80]})"
    if mode != "native GQA":
        rep = hv // hk
        qq = q.repeat_interleave(rep, dim=2).contiguous()
        kk = k.repeat_interleave(rep, dim=2).contiguous()
        rel = check(qq, kk)

    def run():
        return call(qq, kk)
    return run, mode, rel


def fla_kernel_pass(rows):
    """After every timing: FLA's summed kernel device time per case (torch.profiler over a few eager calls on
    fresh inputs of the case's shapes), a cross-check of its graph time: fla_kernels_ms, fla_device_ms."""
    for row in rows:
        if "fla_ms" not in row:
            continue
        hk, hv = map(int, row["heads"].split("/"))
        lens = dict(C.gdn_prefill_cases())[row["case"]]
        try:
            qkv, a, b, A_log, dt, cu = make(lens, hk, hv, seed=1)
            state0 = torch.zeros(len(lens), hv, DK, DV, device=DEVICE)
            run = fla_setup(qkv, a, b, A_log, dt, cu, hk, hv, state0, expand=row["fla_mode"] != "native GQA")[0]
            row["fla_kernels_ms"], row["fla_device_ms"] = profiled_kernels_ms(run)
        except Exception as e:  # noqa: BLE001 - a cross-check only
            row["fla_kernels_error"] = C.err(e)
        qkv = a = b = run = None
        torch.cuda.empty_cache()


def gdn_comparisons(cmp, row):
    case = f"{row['heads']} {row['case']}"
    lim, limit = row["floor_ms"], f"HBM floor of the compulsory bytes at {C.HBM_NOMINAL_TBS} TB/s (a lower bound only)"
    cmp.add("gdn_prefill", case, "device", "op", row.get("vkc_graph_ms"), "fla_chunk", row.get("fla_graph_ms"),
            pct_limit=C.pct(lim, row.get("vkc_graph_ms")), limit=limit)
    cmp.add("gdn_prefill", case, "device", "op", row.get("vkc_graph_ms"), "fla_chunk_profiler_kernel_sum",
            row.get("fla_device_ms"), pct_limit=C.pct(lim, row.get("vkc_graph_ms")), limit=limit)
    cmp.add("gdn_prefill", case, "eager", "op", row.get("vkc_eager_ms"), "fla_chunk", row.get("fla_ms"),
            pct_limit=C.pct(lim, row.get("vkc_eager_ms")), limit=limit)
    cmp.add("gdn_prefill", case, "host", "op", row.get("vkc_host_us"), "fla_chunk", row.get("fla_host_us"), unit="us")


def main(out_path):
    torch.manual_seed(0)
    rows, cmp = [], C.Comparisons()
    try:
        import fla  # noqa: F401
        have_fla = True
        fla_version = getattr(fla, "__version__", "?")
    except Exception as e:
        have_fla, fla_version = False, f"not importable: {type(e).__name__}: {e}"
    for hk, hv in C.GDN_HEADS:
        for name, lens in C.gdn_prefill_cases():
            T, N = sum(lens), len(lens)
            call, (qkv, a, b, A_log, dt, cu), ws = vkc_case(lens, hk, hv)
            row = {"heads": f"{hk}/{hv}", "case": name, "tokens": T, "seqs": N,
                   "workspace_mb": ws.nbytes / 1e6, "bytes": C.gdn_prefill_bytes(T, N, hk, hv)}
            row["floor_ms"] = C.floor_ms(row["bytes"], C.HBM_NOMINAL_TBS)
            row["footprint_mb"] = (row["bytes"] + ws.nbytes) / 1e6  # one set: inputs, outputs, workspace > L2
            row["vkc_eager_ms"] = events_ms(lambda i, st: call(st))
            row["vkc_graph_ms"] = graph_ms(lambda i, st: call(st), vkc=True)
            row["vkc_host_us"] = host_us(lambda i, st: call(st), n=30)
            try:
                row["vkc_stage_ms"] = stage_ms(call)
            except Exception as e:  # the breakdown is diagnostic: never lose the row for it
                row["vkc_stage_ms"] = {}
                row["vkc_stage_error"] = f"{type(e).__name__}: {e}"
            if not have_fla:
                row["fla_error"] = fla_version
            else:
                try:
                    call.state.zero_()  # vkc once from the zero state FLA starts from: the same-result check
                    call()
                    torch.cuda.synchronize()
                    state0 = torch.zeros(N, hv, DK, DV, device=DEVICE)
                    run, mode, rel = fla_setup(qkv, a, b, A_log, dt, cu, hk, hv, state0, call.out.clone())
                    row["fla_mode"], row["fla_vs_vkc_rel_err"] = mode, rel
                    row["fla_ms"] = events_ms(lambda i, st: run())  # also finishes FLA's JIT + autotune
                    row["fla_host_us"] = host_us(lambda i, st: run(), n=30)
                    try:  # graph vs graph: FLA captured like vkc
                        row["fla_graph_ms"] = graph_ms(lambda i, st: run(), vkc=False)
                        row["fla_graph_status"] = "captured"
                    except Exception as e:  # noqa: BLE001 - recorded explicitly, no fallback
                        row["fla_graph_status"] = "capture failed"
                        row["fla_graph_error"] = C.err(e)
                        traceback.print_exc()
                        try:
                            torch.cuda.synchronize()
                        except Exception:  # noqa: BLE001
                            pass
                except Exception as e:
                    row["fla_error"] = C.err(e)
                    traceback.print_exc()
            rows.append(row)
            print(json.dumps(row), flush=True)
            call = ws = qkv = None  # free this case before the next one
            torch.cuda.empty_cache()
    if have_fla:  # last: the profiler leaves CUPTI attached, which slows every later launch
        fla_kernel_pass(rows)
    for row in rows:
        gdn_comparisons(cmp, row)
    meth = method(eager_used={"inner": 5, "reps": 30, "warm": 3}, graph_used={"inner": 5, "reps": 20},
                  host_used={"n": 30, "warm": 3},
                  inputs="fresh torch.randn per case, one set: inputs + outputs + workspace (footprint_mb) exceed "
                         "the 60 MB L2 at every case; zero initial states",
                  peer=f"fla {fla_version} chunk_gated_delta_rule, initial_state and output_final_state as vkc")
    res = C.result("gdn", method=meth, limits=C.hbm_limits(None), rows=rows, comparisons=cmp, fla=fla_version)
    C.write(out_path, res)
    import summarize
    print(summarize.markdown({"gdn.json": res}))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gdn_bench.json")
