"""Achieved HBM bandwidth of the row kernels (norm, rope, act, embedding) vs torch doing the same op, in one
process (H200).

Bytes = each input read once + each output written once; % of limit at the card's nominal HBM bandwidth (vkc_pct_hbm)
and at the copy bandwidth measured in this process (vkc_pct_copy). Inputs rotate over enough copies to exceed
the 60 MB L2. Both sides are timed the same three ways (bench_common modes): device = many calls in one CUDA
graph (vkc_runtime.Graph / torch.cuda.CUDAGraph), eager = CUDA events around back-to-back Python calls (host
cost included), host = wall clock per call at tokens <= 1024 for vkc's bound calls (out= given: no
revalidation after the first call), vkc with VKC_FASTPATH=0 (every call validated) and torch.
Usage: python benchmarks/bench_norm.py OUT.json
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

from vkc_runtime.ops import act as AC, norm as N, rope as RO

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as C  # noqa: E402
import timing  # noqa: E402

DEVICE = "cuda"  # the CPU dry run (tests/test_bench_logic.py) sets "cpu"

HBM_TBS = C.HBM_NOMINAL_TBS
L2_BYTES = C.L2_BYTES
HOST_N = 200
COPY_TBS = None  # measured in main()
OTHERS_T = 8192


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


def host_us(fn, sets):
    """Host us per call, rotating over the sets (back-to-back calls, no sync inside)."""
    return timing.host_us(lambda i, st: fn(*sets[i][0]), n=HOST_N, n_sets=len(sets))


def measure(name, hidden, T, nb, make, f_vkc, f_torch, tdesc, host=False):
    sets = make_sets(make, nb)
    t_vkc, t_torch = time_ms(f_vkc, sets), time_ms(f_torch, sets)
    g_vkc, g_torch = graph_ms(f_vkc, sets, vkc=True), graph_ms(f_torch, sets, vkc=False)
    r = {"op": name, "hidden": hidden, "tokens": T, "bytes": nb, "torch_impl": tdesc, "n_sets": len(sets),
         "vkc_us": t_vkc * 1e3, "torch_us": t_torch * 1e3, "vkc_graph_us": g_vkc * 1e3,
         "torch_graph_us": g_torch * 1e3,
         "vkc_tbs": nb / (g_vkc * 1e-3) / 1e12, "torch_tbs": nb / (g_torch * 1e-3) / 1e12,
         "floor_us": C.floor_ms(nb, HBM_TBS) * 1e3, "floor_copy_us": C.floor_ms(nb, COPY_TBS) * 1e3,
         "vkc_pct_hbm": 100 * nb / (g_vkc * 1e-3) / 1e12 / HBM_TBS,
         "vkc_pct_copy": 100 * nb / (g_vkc * 1e-3) / 1e12 / COPY_TBS,
         "speedup_vs_torch": g_torch / g_vkc, "eager_speedup_vs_torch": t_torch / t_vkc}
    if host:
        r["vkc_host_us"], r["torch_host_us"] = host_us(f_vkc, sets), host_us(f_torch, sets)
        with C.validated():
            r["vkc_validated_host_us"] = host_us(f_vkc, sets)
            r["vkc_validated_us"] = time_ms(f_vkc, sets) * 1e3
    return r


def norm_comparisons(cmp, r):
    case = f"{r['op']} h={r['hidden']} T={r['tokens']}" if r["hidden"] else f"{r['op']} T={r['tokens']}"
    lim, limit = r["floor_us"], f"HBM floor (inputs read + outputs written) at {HBM_TBS} TB/s nominal"
    fam = "norm"
    cmp.add(fam, case, "device", "op", r["vkc_graph_us"], "torch", r["torch_graph_us"], unit="us",
            pct_limit=C.pct(lim, r["vkc_graph_us"]), limit=limit, peer_backend=r["torch_impl"])
    cmp.add(fam, case, "eager", "op", r["vkc_us"], "torch", r["torch_us"], unit="us",
            pct_limit=C.pct(lim, r["vkc_us"]), limit=limit, peer_backend=r["torch_impl"])
    cmp.add(fam, case, "eager", "op_validated", r.get("vkc_validated_us"), "torch", r["torch_us"], unit="us",
            pct_limit=C.pct(lim, r.get("vkc_validated_us")), limit=limit, peer_backend=r["torch_impl"])
    cmp.add(fam, case, "host", "op", r.get("vkc_host_us"), "torch", r.get("torch_host_us"), unit="us",
            peer_backend=r["torch_impl"])
    cmp.add(fam, case, "host", "op_validated", r.get("vkc_validated_host_us"), "torch", r.get("torch_host_us"),
            unit="us", peer_backend=r["torch_impl"])


def main(out_path: str) -> None:
    global COPY_TBS
    torch.manual_seed(0)
    COPY_TBS = C.measured_copy_tbs()
    bf = dict(device=DEVICE, dtype=torch.bfloat16)
    rows = []
    for hidden in C.NORM_HIDDEN:
        w = (torch.randn(hidden, device=DEVICE) * 0.1).to(torch.bfloat16)
        w1 = (1.0 + w.float()).to(torch.bfloat16)
        for T in C.NORM_TOKENS:
            host = T <= C.NORM_HOST_MAX_TOKENS
            rows.append(measure(
                "rmsnorm", hidden, T, 2 * T * hidden * 2,
                lambda: (torch.randn(T, hidden, **bf), torch.empty(T, hidden, **bf)),
                lambda x, y, stream=0: N.rmsnorm(x, w, 1e-6, out=y, stream=stream),
                lambda x, y: F.rms_norm(x, (hidden,), w1, 1e-6), "F.rms_norm(x, w+1)", host))

            def torch_add_norm(x, r, y):
                r.add_(x)
                return F.rms_norm(r, (hidden,), w1, 1e-6)
            rows.append(measure(
                "add_rmsnorm", hidden, T, 4 * T * hidden * 2,
                lambda: (torch.randn(T, hidden, **bf), torch.randn(T, hidden, **bf), torch.empty(T, hidden, **bf)),
                lambda x, r, y, stream=0: N.add_rmsnorm(x, r, w, 1e-6, out=y, stream=stream),
                torch_add_norm, "r.add_(x); F.rms_norm(r, w+1)", host))
    T = OTHERS_T  # the other memory-bound ops at Qwen3.6-27B shapes
    for args in _others(T):
        rows.append(measure(args[0], 0, T, *args[1:]))
    cmp = C.Comparisons()
    for r in rows:
        norm_comparisons(cmp, r)
    meth = timing.method(eager_used={"inner": "max(n_sets, min(200, 2e9 // bytes))", "reps": 30, "warm": 3},
                         graph_used={"inner": "max(n_sets, min(200, 2e9 // bytes))", "reps": 20},
                         host_used={"n": HOST_N, "warm": 3, "tokens": f"<= {C.NORM_HOST_MAX_TOKENS}"},
                         inputs="bf16 torch.randn, rotating n_sets copies > 2.5 x the 60 MB L2",
                         peer="torch eager ops (torch_impl per row), the same calls captured for device time")
    res = C.result("norm", method=meth, limits=C.hbm_limits(COPY_TBS), rows=rows, comparisons=cmp,
                   hbm_tbs=HBM_TBS)
    C.write(out_path, res)
    print(f"{'op':<14}{'hidden':>7}{'T':>7}{'vkc us':>9}{'torch us':>9}{'vkc TB/s':>9}{'% HBM':>7}{'x torch':>8}"
          f"{'eager vkc':>10}{'eager torch':>12}")
    for r in rows:
        print(f"{r['op']:<14}{r['hidden']:>7}{r['tokens']:>7}{r['vkc_graph_us']:>9.2f}{r['torch_graph_us']:>9.2f}"
              f"{r['vkc_tbs']:>9.2f}{r['vkc_pct_hbm']:>7.1f}{r['speedup_vs_torch']:>8.2f}{r['vkc_us']:>10.2f}"
              f"{r['torch_us']:>12.2f}")


def _others(T):
    bf = dict(device=DEVICE, dtype=torch.bfloat16)
    H, D, Hkv, I = 24, 256, 4, 17408
    wq, wk = torch.randn(D, **bf), torch.randn(D, **bf)
    wg = torch.randn(128, **bf)
    pos = torch.arange(T, device=DEVICE, dtype=torch.int32)

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
           lambda x, y, stream=0: AC.silu_mul(x, out=y, stream=stream), torch_silu_mul, "F.silu(g) * u")
    yield ("gated_rmsnorm", T * 3 * 48 * 128 * 2,
           lambda: (torch.randn(T, 48 * 128, **bf), torch.randn(T, 48 * 128, **bf), torch.empty(T, 48 * 128, **bf)),
           lambda x, z, y, stream=0: N.gated_rmsnorm(x, z, wg, 1e-6, out=y, stream=stream), torch_gated,
           "eager fp32 chain")
    yield ("sigmoid_mul", T * 3 * H * D * 2, lambda: (torch.randn(T, H * D, **bf), torch.randn(T, H * 2 * D, **bf)),
           lambda x, qg, stream=0: AC.sigmoid_mul(x, qg.view(T, H, 2, D)[:, :, 1], out=x, stream=stream), torch_sig,
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
           lambda qg, k, stream=0: RO.qk_norm_rope(qg, k, pos, wq, wk, H, Hkv, D, 1e-6, 1e7, q_out=qo, k_out=ko,
                                                  stream=stream),
           torch_qk, "eager q/k norm without rope")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "norm_bench.json")
