"""GDN packed decode step + causal conv1d (update / prefill) on the H200: achieved HBM bandwidth, % of the HBM
floor, and FLA's fused_recurrent_gated_delta_rule side by side in the same process when FLA is importable.

Decode bytes = the state read + written (bench_common.gdn_decode_bytes; qkv/a/b/o are < 1% and not counted);
floor = bytes at the card's nominal HBM bandwidth (pct_floor) and at the copy bandwidth measured in this process
(pct_copy). Inputs rotate over enough state-pool regions to exceed the 60 MB L2. Both sides are timed the same
three ways (bench_common modes): device = many calls captured in one CUDA graph (vkc_runtime.Graph /
torch.cuda.CUDAGraph; a capture failure is recorded as fla_graph_error), eager = CUDA events around 50
back-to-back Python calls (host cost included; FLA after its JIT warm-up), host = wall clock per call.
FLA gets q/k at the key heads where its version groups value heads itself (fla_mode), else expanded outside
the timed region. Usage: python benchmarks/bench_gdn_decode.py OUT.json
"""
from __future__ import annotations

import os
import sys
import traceback

import torch

from vkc_runtime.ops import conv as CV
from vkc_runtime.ops import gdn_decode as GD

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as BC  # noqa: E402
from timing import events_ms, graph_ms, host_us, method  # noqa: E402

DEVICE = "cuda"  # the CPU dry run (tests/test_bench_logic.py) sets "cpu"

HBM_TBS = BC.HBM_NOMINAL_TBS
L2_BYTES = BC.L2_BYTES
D = 128
EAGER = {"inner": 50, "reps": 20, "warm": 2}
DECODE_HV = (48, 32)   # value heads (16 key heads): Qwen3.6-27B, 35B-A3B
CONV_C = (10240, 8192)
CONV_UPDATE_B = (1, 64, 256)
CONV_PREFILL_LENS = ([8192], [512] * 16, [37, 1000, 3, 2000, 130] * 4)
HOST_N = 100


def vkc_graph_ms(fn, n_sets, inner=50):
    return graph_ms(fn, vkc=True, n_sets=n_sets, inner=inner)


def _fla():
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        return fused_recurrent_gated_delta_rule
    except Exception as e:  # FLA missing or broken: report, never crash
        print(f"FLA unavailable: {type(e).__name__}: {e}")
        return None


def bench_decode(B, hk, hv, fla, copy_tbs):
    state_bytes = BC.gdn_decode_bytes(B, hv, D)
    per_set = B * hv * D * D * 4
    n_sets = max(2, min(32, int(2.5 * L2_BYTES // per_set) + 1))
    g = torch.Generator(device=DEVICE).manual_seed(B * hv)
    C = 2 * hk * D + hv * D
    qkv = [(torch.randn(B, C, device=DEVICE, generator=g)).to(torch.bfloat16) for _ in range(n_sets)]
    a = [(torch.randn(B, hv, device=DEVICE, generator=g)).to(torch.bfloat16) for _ in range(n_sets)]
    b = [(torch.randn(B, hv, device=DEVICE, generator=g)).to(torch.bfloat16) for _ in range(n_sets)]
    A_log = torch.rand(hv, device=DEVICE) * 2 - 1
    dt_bias = torch.randn(hv, device=DEVICE) * 0.5
    pool = torch.randn(n_sets * B, hv, D, D, device=DEVICE) * 0.1  # distinct slots per set: > L2 in total
    slots = [torch.arange(i * B, (i + 1) * B, device=DEVICE, dtype=torch.int32) for i in range(n_sets)]
    out = torch.empty(B, hv, D, device=DEVICE, dtype=torch.bfloat16)
    row = {"op": "gdn_decode", "B": B, "Hk": hk, "Hv": hv, "state_bytes": state_bytes,
           "floor_us": state_bytes / (HBM_TBS * 1e12) * 1e6,
           "floor_copy_us": BC.floor_ms(state_bytes, copy_tbs) * 1e3, "n_sets": n_sets}
    for tile in ("bv32", "bv16"):
        def f(i, stream=None, tile=tile):
            GD.recurrent_decode(qkv[i], a[i], b[i], A_log, dt_bias, pool, slots[i], hk, hv, out=out, stream=stream,
                                _tile=tile)
        t = vkc_graph_ms(f, n_sets)
        row[f"vkc_{tile}_graph_us"] = t * 1e3
        row[f"vkc_{tile}_pct_floor"] = 100 * row["floor_us"] / (t * 1e3)
    def f_auto(i, stream=None):
        GD.recurrent_decode(qkv[i], a[i], b[i], A_log, dt_bias, pool, slots[i], hk, hv, out=out, stream=stream)
    row["vkc_graph_us"] = vkc_graph_ms(f_auto, n_sets) * 1e3
    row["vkc_eager_us"] = events_ms(f_auto, n_sets=n_sets, **EAGER) * 1e3
    row["vkc_host_us"] = host_us(f_auto, n=HOST_N, n_sets=n_sets)
    row["vkc_pct_floor"] = 100 * row["floor_us"] / row["vkc_graph_us"]
    row["vkc_pct_copy"] = 100 * row["floor_copy_us"] / row["vkc_graph_us"]
    row["vkc_tbs"] = state_bytes / (row["vkc_graph_us"] * 1e-6) / 1e12
    if fla is None:
        row["fla_error"] = "FLA not importable"
        return row
    try:
        def fla_inputs(i, rep):
            x = qkv[i]
            q = x[:, :hk * D].reshape(B, 1, hk, D)
            k = x[:, hk * D:2 * hk * D].reshape(B, 1, hk, D)
            if rep > 1:
                q, k = q.repeat_interleave(rep, 2), k.repeat_interleave(rep, 2)
            v = x[:, 2 * hk * D:].contiguous().view(B, 1, hv, D)
            gg = (-torch.exp(A_log) * torch.nn.functional.softplus(a[i].float() + dt_bias)).view(B, 1, hv)
            beta = torch.sigmoid(b[i].float()).view(B, 1, hv)
            return q.contiguous(), k.contiguous(), v, gg.contiguous(), beta.contiguous(), pool[i * B:(i + 1) * B]

        def call(inp):
            q, k, v, gg, beta, st = inp
            return fla(q, k, v, g=gg, beta=beta, scale=D ** -0.5, initial_state=st, output_final_state=True,
                       use_qk_l2norm_in_kernel=True)
        # the same-result check: vkc once on set 0 from a copy of its states, FLA from that copy
        st0 = pool[0:B].clone()
        GD.recurrent_decode(qkv[0], a[0], b[0], A_log, dt_bias, pool, slots[0], hk, hv, out=out)
        vkc_o = out.clone()

        def check(rep):
            o = call(fla_inputs(0, rep)[:5] + (st0,))[0]
            return BC.rel_err(o.reshape(B, hv, D), vkc_o)
        rep, row["fla_mode"] = 1, "native GQA"
        try:  # q/k at the key heads (FLA versions that group value heads); else expanded before timing
            rel = check(1)
            if not rel <= BC.PEER_REL_TOL:
                row["fla_mode"] = f"q/k expanded to Hv heads (native output rel err {rel:.3g} vs vkc)"
        except Exception as e:  # noqa: BLE001
            row["fla_mode"] = f"q/k expanded to Hv heads (native: {BC.err(e)[:80]})"
        if row["fla_mode"] != "native GQA":
            rep = hv // hk
            rel = check(rep)
        row["fla_vs_vkc_rel_err"] = rel
        ins = [fla_inputs(i, rep) for i in range(n_sets)]

        def f_fla(i, stream=None):
            return call(ins[i])
        row["fla_eager_us"] = events_ms(f_fla, n_sets=n_sets, **EAGER) * 1e3
        row["fla_host_us"] = host_us(f_fla, n=HOST_N, n_sets=n_sets)
        try:
            row["fla_graph_us"] = graph_ms(f_fla, vkc=False, n_sets=n_sets, inner=50) * 1e3
            row["fla_pct_floor"] = 100 * row["floor_us"] / row["fla_graph_us"]
            row["speedup_vs_fla"] = row["fla_graph_us"] / row["vkc_graph_us"]  # graph vs graph only
        except Exception as e:  # noqa: BLE001 - recorded, never replaced by the eager time
            row["fla_graph_error"] = BC.err(e)
        row["eager_speedup_vs_fla"] = row["fla_eager_us"] / row["vkc_eager_us"]
    except Exception as e:
        row["fla_error"] = BC.err(e)
        traceback.print_exc()
    return row


def bench_conv_update(B, C, copy_tbs=None):
    nbytes = B * C * 2 * 2 + 2 * B * 3 * C * 2 + C * 4 * 2  # x + y, state read + write, weights
    per_set = B * 3 * C * 2 + B * C * 4
    n_sets = max(2, min(64, int(2.5 * L2_BYTES // per_set) + 1))
    xs = [torch.randn(B, C, device=DEVICE).to(torch.bfloat16) for _ in range(n_sets)]
    w = (torch.randn(C, 4, device=DEVICE) * 0.5).to(torch.bfloat16)
    pool = torch.randn(n_sets * B, 3, C, device=DEVICE).to(torch.bfloat16)
    slots = [torch.arange(i * B, (i + 1) * B, device=DEVICE, dtype=torch.int32) for i in range(n_sets)]
    y = torch.empty(B, C, device=DEVICE, dtype=torch.bfloat16)

    def f(i, stream=None):
        CV.causal_conv1d_update(xs[i], w, pool, slots[i], out=y, stream=stream)
    t = vkc_graph_ms(f, n_sets)
    return {"op": "conv_update", "B": B, "C": C, "bytes": nbytes, "vkc_graph_us": t * 1e3,
            "vkc_eager_us": events_ms(f, n_sets=n_sets, inner=50, reps=20, warm=2) * 1e3,
            "vkc_tbs": nbytes / (t * 1e-3) / 1e12, "vkc_pct_hbm": 100 * nbytes / (t * 1e-3) / 1e12 / HBM_TBS,
            "vkc_pct_copy": 100 * nbytes / (t * 1e-3) / 1e12 / copy_tbs if copy_tbs else None}


def bench_conv_prefill(lens, C, copy_tbs=None):
    T = sum(lens)
    N = len(lens)
    nbytes = 2 * T * C * 2 + 2 * N * 3 * C * 2
    n_sets = max(2, min(16, int(2.5 * L2_BYTES // (2 * T * C * 2)) + 1))
    xs = [torch.randn(T, C, device=DEVICE).to(torch.bfloat16) for _ in range(n_sets)]
    ys = [torch.empty(T, C, device=DEVICE, dtype=torch.bfloat16) for _ in range(n_sets)]
    w = (torch.randn(C, 4, device=DEVICE) * 0.5).to(torch.bfloat16)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), device=DEVICE, dtype=torch.int32)
    pool = torch.randn(N, 3, C, device=DEVICE).to(torch.bfloat16)
    slots = torch.arange(N, device=DEVICE, dtype=torch.int32)

    def f(i, stream=None):
        CV.causal_conv1d(xs[i], w, cu, conv_state=pool, slot_idx=slots, out=ys[i], stream=stream)
    t = vkc_graph_ms(f, n_sets, inner=20)
    return {"op": "conv_prefill", "T": T, "N": N, "C": C, "bytes": nbytes, "vkc_graph_us": t * 1e3,
            "vkc_tbs": nbytes / (t * 1e-3) / 1e12, "vkc_pct_hbm": 100 * nbytes / (t * 1e-3) / 1e12 / HBM_TBS,
            "vkc_pct_copy": 100 * nbytes / (t * 1e-3) / 1e12 / copy_tbs if copy_tbs else None}


def decode_comparisons(cmp, r):
    case = f"Hv={r['Hv']} B={r['B']}"
    lim, limit = r["floor_us"], f"HBM floor (state read + write) at {HBM_TBS} TB/s nominal"
    cmp.add("gdn_decode", case, "device", "op", r.get("vkc_graph_us"), "fla_fused_recurrent", r.get("fla_graph_us"),
            unit="us", pct_limit=BC.pct(lim, r.get("vkc_graph_us")), limit=limit)
    cmp.add("gdn_decode", case, "eager", "op", r.get("vkc_eager_us"), "fla_fused_recurrent", r.get("fla_eager_us"),
            unit="us", pct_limit=BC.pct(lim, r.get("vkc_eager_us")), limit=limit)
    cmp.add("gdn_decode", case, "host", "op", r.get("vkc_host_us"), "fla_fused_recurrent", r.get("fla_host_us"),
            unit="us")


def main(out_path: str) -> None:
    torch.manual_seed(0)
    fla = _fla()
    copy_tbs = BC.measured_copy_tbs()
    rows, cmp = [], BC.Comparisons()
    for hv in DECODE_HV:
        for B in BC.GDN_DECODE_B:
            r = bench_decode(B, 16, hv, fla, copy_tbs)
            decode_comparisons(cmp, r)
            rows.append(r)
    for Cn in CONV_C:
        for B in CONV_UPDATE_B:
            rows.append(bench_conv_update(B, Cn, copy_tbs))
        for lens in CONV_PREFILL_LENS:
            rows.append(bench_conv_prefill(lens, Cn, copy_tbs))
    fla_version = None if fla is None else getattr(sys.modules.get("fla"), "__version__", "?")
    meth = method(eager_used=EAGER, graph_used={"inner": 50, "reps": 20, "conv_prefill_inner": 20},
                  host_used={"n": HOST_N, "warm": 3},
                  inputs="rotating sets (n_sets per row) > 2.5 x the 60 MB L2, torch.randn states and inputs",
                  peer=f"fla {fla_version} fused_recurrent_gated_delta_rule, initial_state = the same pool rows, "
                       "output_final_state=True (a new state tensor, same bytes written); conv rows have no peer")
    res = BC.result("gdn_decode", method=meth, limits=BC.hbm_limits(copy_tbs), rows=rows, comparisons=cmp,
                   fla=fla_version, hbm_tbs=HBM_TBS)
    BC.write(out_path, res)
    print(f"{'decode':<8}{'B':>5}{'Hv':>4}{'floor us':>10}{'vkc us':>9}{'%floor':>8}{'bv32':>8}{'bv16':>8}"
          f"{'FLA us':>9}{'FLA %':>7}{'x FLA':>7}{'eager':>8}")
    for r in rows:
        if r["op"] != "gdn_decode":
            continue
        fu = r.get("fla_graph_us", float("nan"))
        print(f"{'':<8}{r['B']:>5}{r['Hv']:>4}{r['floor_us']:>10.1f}{r['vkc_graph_us']:>9.1f}{r['vkc_pct_floor']:>8.1f}"
              f"{r['vkc_bv32_graph_us']:>8.1f}{r['vkc_bv16_graph_us']:>8.1f}{fu:>9.1f}"
              f"{r.get('fla_pct_floor', float('nan')):>7.1f}{r.get('speedup_vs_fla', float('nan')):>7.2f}"
              f"{r['vkc_eager_us']:>8.1f}")
    print(f"{'conv':<14}{'shape':>22}{'us':>9}{'TB/s':>7}{'% HBM':>7}")
    for r in rows:
        if r["op"] == "conv_update":
            print(f"{'update':<14}{'B=%d C=%d' % (r['B'], r['C']):>22}{r['vkc_graph_us']:>9.1f}{r['vkc_tbs']:>7.2f}"
                  f"{r['vkc_pct_hbm']:>7.1f}")
        elif r["op"] == "conv_prefill":
            print(f"{'prefill':<14}{'T=%d N=%d C=%d' % (r['T'], r['N'], r['C']):>22}{r['vkc_graph_us']:>9.1f}"
                  f"{r['vkc_tbs']:>7.2f}{r['vkc_pct_hbm']:>7.1f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench_gdn_decode.json")
