"""The sampler (vkc_runtime.ops.sample) on the H200 at Qwen3.6's vocabulary (V = 248320), B in {1, 16, 64}:
greedy and top-p sampling against torch in the same process, graph vs graph (device time) and eager vs eager,
and the HBM floor (the fp32 logits read once at the card's nominal HBM bandwidth).

Peers: greedy = torch.argmax(logits, -1); top-p = softmax(logits / T), a descending sort, cumsum, the tokens past
top_p zeroed, then torch.multinomial (``torch_multinomial``) and the exponential-race draw vLLM uses
(``probs / Exp(1)`` argmax, ``torch_exponential``). vkc-only rows: plain temperature sampling and top-k = 50.
vkc runs with the row-statistics workspace (the parallel pass 1, what the engine passes); ``vkc_serial_graph_us``
is the same op without it (one program per row for every pass), same inputs.
Logits: torch.randn * 3 (a moderately peaked softmax; the top-p set has a few thousand tokens), fp32, rotated
over enough sets to exceed the 60 MB L2. Usage: python benchmarks/bench_sample.py OUT.json
"""
from __future__ import annotations

import os
import sys
import traceback

import torch

from vkc_runtime.ops import sample as S

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as BC  # noqa: E402
from timing import events_ms, graph_ms, method  # noqa: E402

V = 248320
BATCHES = (1, 16, 64)
TEMP, TOP_P = 0.8, 0.9
EAGER = {"inner": 20, "reps": 20, "warm": 2}
GRAPH_INNER = 20
LIMIT = f"HBM floor: the fp32 logits read once at {BC.HBM_NOMINAL_TBS} TB/s nominal"


def torch_top_p(x, gen_kind):
    probs = torch.softmax(x / TEMP, dim=-1)
    ps, idx = torch.sort(probs, dim=-1, descending=True)
    cs = torch.cumsum(ps, dim=-1)
    ps = ps.masked_fill(cs - ps > TOP_P, 0.0)
    if gen_kind == "multinomial":
        pick = torch.multinomial(ps, 1)
    else:
        pick = torch.argmax(ps / torch.empty_like(ps).exponential_(), dim=-1, keepdim=True)
    return idx.gather(-1, pick)[:, 0]


def bench_case(B, mode, copy_tbs):
    nbytes = B * V * 4
    n_sets = BC.n_sets_for(nbytes)
    g = torch.Generator(device="cuda").manual_seed(B)
    xs = [torch.randn(B, V, device="cuda", generator=g) * 3 for _ in range(n_sets)]
    kw = {"greedy": dict(temperature=0.0), "top_p": dict(temperature=TEMP, top_p=TOP_P),
          "temperature": dict(temperature=TEMP), "top_k50": dict(temperature=TEMP, top_k=50)}[mode]
    fp, ip = S.host_params(B, seed=list(range(B)), step=3, **kw)
    fpd, ipd = torch.from_numpy(fp).cuda(), torch.from_numpy(ip).cuda()
    tok = torch.empty(B, dtype=torch.int32, device="cuda")
    row = {"op": "sample", "mode": mode, "B": B, "V": V, "bytes": nbytes, "n_sets": n_sets,
           "floor_us": nbytes / (BC.HBM_NOMINAL_TBS * 1e12) * 1e6,
           "floor_copy_us": BC.floor_ms(nbytes, copy_tbs) * 1e3}

    # a torch buffer (what sample_workspace allocates), so that eager calls are bound calls like the others
    ws = torch.empty(B * -(-V // S.SPAN) * 4, dtype=torch.float32, device="cuda")

    def f(i, stream=None):
        S.sample(xs[i], fpd, ipd, out=tok, workspace=ws, stream=stream)

    def f_serial(i, stream=None):
        S.sample(xs[i], fpd, ipd, out=tok, stream=stream)
    row["vkc_graph_us"] = graph_ms(f, vkc=True, n_sets=n_sets, inner=GRAPH_INNER) * 1e3
    row["vkc_eager_us"] = events_ms(f, n_sets=n_sets, **EAGER) * 1e3
    row["vkc_serial_graph_us"] = graph_ms(f_serial, vkc=True, n_sets=n_sets, inner=GRAPH_INNER) * 1e3
    row["vkc_pct_floor"] = BC.pct(row["floor_us"], row["vkc_graph_us"])
    row["vkc_tbs"] = nbytes / (row["vkc_graph_us"] * 1e-6) / 1e12
    peers = {"greedy": {"torch_argmax": lambda x: torch.argmax(x, dim=-1)},
             "top_p": {"torch_exponential": lambda x: torch_top_p(x, "exponential"),   # multinomial last: a
                       "torch_multinomial": lambda x: torch_top_p(x, "multinomial")}}.get(mode, {})  # failed capture
    for name, fn in peers.items():
        out = torch.empty(B, dtype=torch.int64, device="cuda")

        def fp_(i, stream=None, fn=fn, out=out):
            out.copy_(fn(xs[i]))
        try:
            row[f"{name}_eager_us"] = events_ms(fp_, n_sets=n_sets, **EAGER) * 1e3
        except Exception as e:  # noqa: BLE001
            row[f"{name}_eager_error"] = BC.err(e)
        try:
            row[f"{name}_graph_us"] = graph_ms(fp_, vkc=False, n_sets=n_sets, inner=GRAPH_INNER) * 1e3
            row[f"{name}_speedup"] = row[f"{name}_graph_us"] / row["vkc_graph_us"]
        except Exception as e:  # noqa: BLE001 - recorded, never replaced by the eager time
            row[f"{name}_graph_error"] = BC.err(e)
            traceback.print_exc()
    return row


def main(out_path: str) -> None:
    torch.manual_seed(0)
    copy_tbs = BC.measured_copy_tbs()
    rows, cmp = [], BC.Comparisons()
    for mode in ("greedy", "top_p", "temperature", "top_k50"):
        for B in BATCHES:
            r = bench_case(B, mode, copy_tbs)
            rows.append(r)
            case = f"{mode} B={B} V={V}"
            for peer in ("torch_argmax", "torch_multinomial", "torch_exponential"):
                for m, key in (("device", "graph"), ("eager", "eager")):
                    cmp.add("sample", case, m, "op", r.get(f"vkc_{key}_us"), peer, r.get(f"{peer}_{key}_us"),
                            unit="us", pct_limit=BC.pct(r["floor_us"], r.get(f"vkc_{key}_us")), limit=LIMIT)
    meth = method(eager_used=EAGER, graph_used={"inner": GRAPH_INNER, "reps": 20},
                  inputs="rotating fp32 logit sets (n_sets per row) > 2.5 x the 60 MB L2, torch.randn * 3",
                  peer="torch.argmax; softmax + sort + cumsum top-p + torch.multinomial / exponential race")
    res = BC.result("sample", method=meth, limits=BC.hbm_limits(copy_tbs), rows=rows, comparisons=cmp)
    BC.write(out_path, res)
    print(f"{'mode':<12}{'B':>4}{'floor us':>10}{'vkc us':>9}{'%floor':>8}{'eager':>8}{'serial':>8}  peers (graph us, "
          "x vkc)")
    for r in rows:
        peers = "  ".join(f"{p}={r[p + '_graph_us']:.1f} ({r[p + '_speedup']:.2f}x)"
                          for p in ("torch_argmax", "torch_multinomial", "torch_exponential")
                          if p + "_graph_us" in r)
        errs = "  ".join(f"{k}: {v[:60]}" for k, v in r.items() if k.endswith("_error"))
        print(f"{r['mode']:<12}{r['B']:>4}{r['floor_us']:>10.2f}{r['vkc_graph_us']:>9.1f}{r['vkc_pct_floor']:>8.1f}"
              f"{r['vkc_eager_us']:>8.1f}{r['vkc_serial_graph_us']:>8.1f}  {peers} {errs}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench_sample.json")
