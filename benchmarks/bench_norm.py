"""Achieved HBM bandwidth of the norm-family kernels vs torch doing the same op, in one process (H200).

Bytes = each input read once + each output written once. Inputs are rotated over enough copies to
exceed the 60 MB L2. CUDA events around many launches, after warm-up; median of repeats.
Usage: python benchmarks/bench_norm.py OUT.json
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

import vkc_runtime
from vkc_runtime.ops import norm as N

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

HBM_TBS = 4.26  # measured device-to-device copy ceiling (DESIGN.md section 8)
L2_BYTES = 60e6


def _inner(sets):
    return max(len(sets), min(200, int(2e9 // max(1, sets[0][1]))))


def time_ms(fn, sets, reps=30):
    """Eager: median ms per call over `reps` event-timed batches, cycling through the input sets (host
    launch overhead included: at small sizes this is what a Python caller sees)."""
    return timing.events_ms(lambda i, st: fn(*sets[i][0]), n_sets=len(sets), inner=_inner(sets), reps=reps)


def graph_ms(fn, sets, vkc: bool, reps=20):
    """Device time per call: `inner` calls captured in one CUDA graph (vkc_runtime.Graph for vkc,
    torch.cuda.CUDAGraph for torch) on a side stream, replays timed with events."""
    def call(i, st):
        return fn(*sets[i][0], stream=st) if vkc else fn(*sets[i][0])
    return timing.graph_ms(call, vkc=vkc, n_sets=len(sets), inner=_inner(sets), reps=reps)


def make_sets(make, nbytes):
    copies = max(2, int(2.5 * L2_BYTES // max(nbytes, 1)) + 1)
    copies = min(copies, 64)
    return [(make(), nbytes) for _ in range(copies)]


def measure(name, hidden, T, nb, make, f_vkc, f_torch, tdesc):
    sets = make_sets(make, nb)
    t_vkc, t_torch = time_ms(f_vkc, sets), time_ms(f_torch, sets)
    g_vkc, g_torch = graph_ms(f_vkc, sets, vkc=True), graph_ms(f_torch, sets, vkc=False)
    return {"op": name, "hidden": hidden, "tokens": T, "bytes": nb, "torch_impl": tdesc,
            "vkc_us": t_vkc * 1e3, "torch_us": t_torch * 1e3, "vkc_graph_us": g_vkc * 1e3,
            "torch_graph_us": g_torch * 1e3,
            "vkc_tbs": nb / (g_vkc * 1e-3) / 1e12, "torch_tbs": nb / (g_torch * 1e-3) / 1e12,
            "vkc_pct_hbm": 100 * nb / (g_vkc * 1e-3) / 1e12 / HBM_TBS,
            "speedup_vs_torch": g_torch / g_vkc, "eager_speedup_vs_torch": t_torch / t_vkc}


def main(out_path: str) -> None:
    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    rows = []
    for hidden in (2048, 5120):
        w = (torch.randn(hidden, device="cuda") * 0.1).to(torch.bfloat16)
        w1 = (1.0 + w.float()).to(torch.bfloat16)
        for T in (1, 16, 128, 1024, 4096, 16384):
            rows.append(measure(
                "rmsnorm", hidden, T, 2 * T * hidden * 2,
                lambda: (torch.randn(T, hidden, **bf), torch.empty(T, hidden, **bf)),
                lambda x, y, stream=0: N.rmsnorm(x, w, 1e-6, out=y, stream=stream),
                lambda x, y: F.rms_norm(x, (hidden,), w1, 1e-6), "F.rms_norm(x, w+1)"))

            def torch_add_norm(x, r, y):
                r.add_(x)
                return F.rms_norm(r, (hidden,), w1, 1e-6)
            rows.append(measure(
                "add_rmsnorm", hidden, T, 4 * T * hidden * 2,
                lambda: (torch.randn(T, hidden, **bf), torch.randn(T, hidden, **bf), torch.empty(T, hidden, **bf)),
                lambda x, r, y, stream=0: N.add_rmsnorm(x, r, w, 1e-6, out=y, stream=stream),
                torch_add_norm, "r.add_(x); F.rms_norm(r, w+1)"))
    T = 8192  # the other memory-bound ops at Qwen3.6-27B shapes
    for args in _others(T):
        rows.append(measure(args[0], 0, T, *args[1:]))
    res = {"gpu": torch.cuda.get_device_name(), "hbm_tbs": HBM_TBS, "torch": torch.__version__,
           "vkc_arch": vkc_runtime.doctor.report()["selected_arch"],
           "method": "graph = CUDA-graph replay of many calls over rotated inputs > L2 (device time); eager = "
                     "Python calls timed with events (includes host overhead); bandwidth from graph times",
           "rows": rows}
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'op':<14}{'hidden':>7}{'T':>7}{'vkc us':>9}{'torch us':>9}{'vkc TB/s':>9}{'% HBM':>7}{'x torch':>8}"
          f"{'eager vkc':>10}{'eager torch':>12}")
    for r in rows:
        print(f"{r['op']:<14}{r['hidden']:>7}{r['tokens']:>7}{r['vkc_graph_us']:>9.2f}{r['torch_graph_us']:>9.2f}"
              f"{r['vkc_tbs']:>9.2f}{r['vkc_pct_hbm']:>7.1f}{r['speedup_vs_torch']:>8.2f}{r['vkc_us']:>10.2f}"
              f"{r['torch_us']:>12.2f}")


def _others(T):
    bf = dict(device="cuda", dtype=torch.bfloat16)
    H, D, Hkv, I = 24, 256, 4, 17408
    wq, wk = torch.randn(D, **bf), torch.randn(D, **bf)
    wg = torch.randn(128, **bf)
    pos = torch.arange(T, device="cuda", dtype=torch.int32)

    def torch_silu_mul(x, y):
        g, u = x.chunk(2, dim=-1)
        return F.silu(g) * u

    def torch_gated(x, z, y):
        xf = x.float().view(T, 48, 128)
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return ((n * wg.float()) * F.silu(z.float().view(T, 48, 128))).to(torch.bfloat16)

    def torch_sig(x, qg):
        return x * torch.sigmoid(qg.view(T, H, 2, D)[:, :, 1].reshape(T, H * D))

    yield ("silu_mul", T * 3 * I * 2, lambda: (torch.randn(T, 2 * I, **bf), torch.empty(T, I, **bf)),
           lambda x, y, stream=0: N.silu_mul(x, out=y, stream=stream), torch_silu_mul, "F.silu(g) * u")
    yield ("gated_rmsnorm", T * 3 * 48 * 128 * 2,
           lambda: (torch.randn(T, 48 * 128, **bf), torch.randn(T, 48 * 128, **bf), torch.empty(T, 48 * 128, **bf)),
           lambda x, z, y, stream=0: N.gated_rmsnorm(x, z, wg, 1e-6, out=y, stream=stream), torch_gated,
           "eager fp32 chain")
    yield ("sigmoid_mul", T * 3 * H * D * 2, lambda: (torch.randn(T, H * D, **bf), torch.randn(T, H * 2 * D, **bf)),
           lambda x, qg, stream=0: N.sigmoid_mul(x, qg.view(T, H, 2, D)[:, :, 1], out=x, stream=stream), torch_sig,
           "x * sigmoid(gate view)")
    qk_bytes = T * (H * D * 2 + Hkv * D * 2) * 2 + T * 4

    def torch_qk(qg, k):
        q = qg.view(T, H, 2, D)[:, :, 0].float()
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + wq.float())
        kk = k.view(T, Hkv, D).float()
        kk = kk * torch.rsqrt(kk.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + wk.float())
        return q.to(torch.bfloat16), kk.to(torch.bfloat16)  # (no rope: torch side does less work)
    qo, ko = torch.empty(T, H, D, **bf), torch.empty(T, Hkv, D, **bf)
    yield ("qk_norm_rope", qk_bytes, lambda: (torch.randn(T, H * 2 * D, **bf), torch.randn(T, Hkv * D, **bf)),
           lambda qg, k, stream=0: N.qk_norm_rope(qg, k, pos, wq, wk, H, Hkv, D, 1e-6, 1e7, q_out=qo, k_out=ko,
                                                  stream=stream),
           torch_qk, "eager q/k norm without rope")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "norm_bench.json")
