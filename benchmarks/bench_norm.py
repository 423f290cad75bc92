"""Achieved HBM bandwidth of the norm-family kernels vs torch doing the same op, in one process (H200).

Bytes = each input read once + each output written once. Inputs are rotated over enough copies to
exceed the 60 MB L2. CUDA events around many launches, after warm-up; median of repeats.
Usage: python benchmarks/bench_norm.py OUT.json
"""
from __future__ import annotations

import json
import statistics
import sys

import torch
import torch.nn.functional as F

import vkc_runtime
from vkc_runtime.ops import norm as N

HBM_TBS = 4.26  # measured device-to-device copy ceiling (DESIGN.md section 8)
L2_BYTES = 60e6


def time_ms(fn, sets, reps=30, inner=None):
    """Median ms per call over `reps` event-timed batches, cycling through the input sets."""
    inner = inner or max(1, min(200, int(2e9 // max(1, sets[0][1]))))
    for i in range(3 * len(sets)):
        fn(*sets[i % len(sets)][0])
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(inner):
            fn(*sets[i % len(sets)][0])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def make_sets(make, nbytes):
    copies = max(2, int(2.5 * L2_BYTES // max(nbytes, 1)) + 1)
    copies = min(copies, 64)
    return [(make(), nbytes) for _ in range(copies)]


def main(out_path: str) -> None:
    torch.manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for hidden in (2048, 5120):
        w = (torch.randn(hidden, device="cuda") * 0.1).to(torch.bfloat16)
        w1 = (1.0 + w.float()).to(torch.bfloat16)
        for T in (1, 16, 128, 1024, 4096, 16384):
            # rmsnorm: read x, write y
            nb = 2 * T * hidden * 2
            sets = make_sets(lambda: (torch.randn(T, hidden, device="cuda").to(torch.bfloat16),
                                      torch.empty(T, hidden, device="cuda", dtype=torch.bfloat16)), nb)
            t_vkc = time_ms(lambda x, y: N.rmsnorm(x, w, 1e-6, out=y, stream=stream), sets)
            t_torch = time_ms(lambda x, y: torch.nn.functional.rms_norm(x, (hidden,), w1, 1e-6), sets)
            rows.append(_row("rmsnorm", hidden, T, nb, t_vkc, t_torch, "F.rms_norm(x, w+1)"))
            # add_rmsnorm: read x, r; write r, y
            nb = 4 * T * hidden * 2
            sets = make_sets(lambda: (torch.randn(T, hidden, device="cuda").to(torch.bfloat16),
                                      torch.randn(T, hidden, device="cuda").to(torch.bfloat16),
                                      torch.empty(T, hidden, device="cuda", dtype=torch.bfloat16)), nb)
            t_vkc = time_ms(lambda x, r, y: N.add_rmsnorm(x, r, w, 1e-6, out=y, stream=stream), sets)

            def torch_add_norm(x, r, y):
                r.add_(x)
                return F.rms_norm(r, (hidden,), w1, 1e-6)
            t_torch = time_ms(torch_add_norm, sets)
            rows.append(_row("add_rmsnorm", hidden, T, nb, t_vkc, t_torch, "r.add_(x); F.rms_norm(r, w+1)"))
    # the other memory-bound ops at Qwen3.6-27B shapes, large token count
    T = 8192
    for name, nb, make, f_vkc, f_torch, tdesc in _others(T, stream):
        sets = make_sets(make, nb)
        rows.append(_row(name, 0, T, nb, time_ms(f_vkc, sets), time_ms(f_torch, sets), tdesc))
    res = {"gpu": torch.cuda.get_device_name(), "hbm_tbs": HBM_TBS, "torch": torch.__version__,
           "vkc_arch": vkc_runtime.doctor.report()["selected_arch"] if hasattr(vkc_runtime, "doctor") else None,
           "rows": rows}
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'op':<14}{'hidden':>7}{'T':>7}{'vkc us':>10}{'torch us':>10}{'vkc TB/s':>10}{'% HBM':>7}{'x torch':>9}")
    for r in rows:
        print(f"{r['op']:<14}{r['hidden']:>7}{r['tokens']:>7}{r['vkc_us']:>10.2f}{r['torch_us']:>10.2f}"
              f"{r['vkc_tbs']:>10.2f}{r['vkc_pct_hbm']:>7.1f}{r['speedup_vs_torch']:>9.2f}")


def _row(op, hidden, T, nb, t_vkc, t_torch, tdesc):
    return {"op": op, "hidden": hidden, "tokens": T, "bytes": nb, "vkc_us": t_vkc * 1e3, "torch_us": t_torch * 1e3,
            "vkc_tbs": nb / (t_vkc * 1e-3) / 1e12, "torch_tbs": nb / (t_torch * 1e-3) / 1e12,
            "vkc_pct_hbm": 100 * nb / (t_vkc * 1e-3) / 1e12 / HBM_TBS, "speedup_vs_torch": t_torch / t_vkc,
            "torch_impl": tdesc}


def _others(T, stream):
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
           lambda x, y: N.silu_mul(x, out=y, stream=stream), torch_silu_mul, "F.silu(g) * u")
    yield ("gated_rmsnorm", T * 3 * 48 * 128 * 2,
           lambda: (torch.randn(T, 48 * 128, **bf), torch.randn(T, 48 * 128, **bf), torch.empty(T, 48 * 128, **bf)),
           lambda x, z, y: N.gated_rmsnorm(x, z, wg, 1e-6, out=y, stream=stream), torch_gated, "eager fp32 chain")
    yield ("sigmoid_mul", T * 3 * H * D * 2, lambda: (torch.randn(T, H * D, **bf), torch.randn(T, H * 2 * D, **bf)),
           lambda x, qg: N.sigmoid_mul(x, qg.view(T, H, 2, D)[:, :, 1], out=x, stream=stream), torch_sig,
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
           lambda qg, k: N.qk_norm_rope(qg, k, pos, wq, wk, H, Hkv, D, 1e-6, 1e7, q_out=qo, k_out=ko, stream=stream),
           torch_qk, "eager q/k norm without rope")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "norm_bench.json")
