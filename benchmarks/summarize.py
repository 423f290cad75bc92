"""One benchmark run -> the markdown tables for BENCHMARKS.md and the min-max ratio range of every
(family, mode, vkc variant, peer), each stamped with the commit the run measured.

Input: the results.json that tools/gpu/run.sh merges (a dict keyed by file name: "attn.json", "gdn.json", ...),
one benchmark's JSON, or a directory of benchmark JSONs. Schema vkc-bench/2 (benchmarks/bench_common.py) is read
from its "comparisons"; the older per-benchmark formats (no "schema": attn, gdn, gdn_decode, norm) are
converted from their rows, with the commit "unknown" and their peers named as measured then (SDPA with K/V
expanded to the query heads, FLA eager). Ranges are only ever taken within one input, and the output says
when the benchmarks of one input come from more than one commit.

ratio = peer time / vkc time: > 1 means vkc is faster. Modes: device (graph vs graph), eager (events around
Python calls, host included), host (host us per call).
Usage: python benchmarks/summarize.py RESULTS.json [--md OUT.md]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as C  # noqa: E402

BENCH_NAMES = ("attn", "gdn", "gdn_decode", "norm")
MODE_TITLE = {"device": "device time, graph vs graph", "eager": "eager vs eager (host cost included)",
              "host": "host time per call"}


def load(path):
    """{name: benchmark dict} from a merged results.json, a single benchmark JSON or a directory of them."""
    if os.path.isdir(path):
        out = {}
        for f in sorted(os.listdir(path)):
            if f.endswith(".json"):
                with open(os.path.join(path, f)) as fh:
                    out[f] = json.load(fh)
        return out
    with open(path) as fh:
        d = json.load(fh)
    if isinstance(d, dict) and ("rows" in d or d.get("schema") == C.SCHEMA):
        return {os.path.basename(path): d}
    return d


def _bench_name(name, d):
    if isinstance(d, dict) and d.get("bench"):
        return d["bench"]
    stem = os.path.basename(name).rsplit(".", 1)[0]
    return stem if stem in BENCH_NAMES else None


# ------------------------------------------------------------------------------------------- legacy formats

def _legacy_attn(d, cmp):
    for r in d.get("rows", []):
        if r.get("kind") == "prefill":
            fam, case = "attn_prefill", f"{r['Hq']}/{r['Hkv']} T={r['T']}"
            for be in ("flash", "cudnn"):
                p = f"sdpa_{be} (K/V expanded)"
                cmp.add(fam, case, "device", "op", r.get("vkc_graph_ms"), p, r.get(f"{be}_graph_ms"))
                cmp.add(fam, case, "eager", "op", r.get("vkc_ms"), p, r.get(f"{be}_ms"))
                cmp.add(fam, case, "eager", "plan", r.get("vkc_plan_ms"), p, r.get(f"{be}_ms"))
                cmp.add(fam, case, "eager", "op_validated", r.get("vkc_validated_ms"), p, r.get(f"{be}_ms"))
        elif r.get("kind") == "decode":
            fam, case = "attn_decode", f"B={r['B']} L={r['L']}"
            p = "sdpa_default (K/V expanded)"
            floor = r.get("floor_ms")
            lim = f"K+V bytes at {d.get('hbm_tbs', '?')} TB/s"
            cmp.add(fam, case, "device", "op", r.get("vkc_graph_ms"), p, r.get("sdpa_graph_ms"),
                    pct_limit=C.pct(floor, r.get("vkc_graph_ms")), limit=lim)
            cmp.add(fam, case, "eager", "op", r.get("vkc_ms"), p, r.get("sdpa_ms"),
                    pct_limit=C.pct(floor, r.get("vkc_ms")), limit=lim)
            cmp.add(fam, case, "eager", "plan", r.get("vkc_plan_ms"), p, r.get("sdpa_ms"))
            cmp.add(fam, case, "host", "op", r.get("vkc_host_us"), p, r.get("sdpa_host_us"), unit="us")
            cmp.add(fam, case, "host", "plan", r.get("vkc_plan_host_us"), p, r.get("sdpa_host_us"), unit="us")


def _legacy_gdn(d, cmp):
    for r in d.get("rows", []):
        case = f"{r['heads']} {r['case']}"
        cmp.add("gdn_prefill", case, "eager", "op", r.get("vkc_eager_ms"), "fla_chunk", r.get("fla_ms"))
        cmp.add("gdn_prefill", case, "device", "op", r.get("vkc_graph_ms"), "fla_chunk_profiler_kernel_sum",
                r.get("fla_device_ms"))


def _legacy_gdn_decode(d, cmp):
    for r in d.get("rows", []):
        if r.get("op") != "gdn_decode":
            continue
        case = f"Hv={r['Hv']} B={r['B']}"
        lim = f"state bytes at {d.get('hbm_tbs', '?')} TB/s"
        cmp.add("gdn_decode", case, "device", "op", r.get("vkc_graph_us"), "fla_fused_recurrent",
                r.get("fla_graph_us"), unit="us", pct_limit=C.pct(r.get("floor_us"), r.get("vkc_graph_us")), limit=lim)
        cmp.add("gdn_decode", case, "eager", "op", r.get("vkc_eager_us"), "fla_fused_recurrent",
                r.get("fla_eager_us"), unit="us")


def _legacy_norm(d, cmp):
    for r in d.get("rows", []):
        case = f"{r['op']} h={r['hidden']} T={r['tokens']}" if r.get("hidden") else f"{r['op']} T={r['tokens']}"
        lim = f"bytes at {d.get('hbm_tbs', '?')} TB/s"
        pl = r.get("vkc_pct_hbm")
        cmp.add("norm", case, "device", "op", r.get("vkc_graph_us"), "torch", r.get("torch_graph_us"), unit="us",
                pct_limit=pl, limit=lim if pl is not None else None)
        cmp.add("norm", case, "eager", "op", r.get("vkc_us"), "torch", r.get("torch_us"), unit="us")


LEGACY = {"attn": _legacy_attn, "gdn": _legacy_gdn, "gdn_decode": _legacy_gdn_decode, "norm": _legacy_norm}


def comparisons(name, d):
    """(meta, [comparison]) of one benchmark JSON, None if it is not a benchmark this module knows."""
    if not isinstance(d, dict):
        return None
    if d.get("schema") == C.SCHEMA:
        return d.get("meta", {}), list(d.get("comparisons", []))
    bench = _bench_name(name, d)
    if bench not in LEGACY or "rows" not in d:
        return None
    cmp = C.Comparisons()
    LEGACY[bench](d, cmp)
    meta = {"commit": "unknown (legacy format)", "commit_source": "none", "device": d.get("gpu"),
            "torch": d.get("torch"), "date_utc": None}
    return meta, list(cmp)


def collect(results):
    """[(name, meta, comparisons)] for every benchmark in a loaded results dict, in name order."""
    out = []
    for name in sorted(results):
        got = comparisons(name, results[name])
        if got is not None:
            out.append((name, got[0], got[1]))
    return out


# ------------------------------------------------------------------------------------------- output

def _fmt_t(t):
    return "–" if t is None else (f"{t:.4f}" if t < 0.01 else f"{t:.3f}" if t < 10 else f"{t:.1f}")


def _fmt_x(x):
    return "–" if x is None else f"{x:.2f}×"


def _fmt_pct(p):
    return "–" if p is None else (f"{p:.1f}%" if p < 10 else f"{p:.0f}%")


def _ordered(seq):
    seen, out = set(), []
    for x in seq:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def table(cmps, family, mode):
    """Markdown table of one family and mode: a row per (case, vkc variant), per peer its time and ratio."""
    sel = [c for c in cmps if c["family"] == family and c["mode"] == mode]
    if not sel:
        return ""
    peers = _ordered(c["peer"] for c in sel)
    unit = sel[0]["unit"]
    keys = _ordered((c["case"], c["vkc"]) for c in sel)
    by = {(c["case"], c["vkc"], c["peer"]): c for c in sel}
    has_pct = any("pct_limit" in c for c in sel)
    head = ["case", "vkc", f"vkc {unit}"] + [h for p in peers for h in (f"{p} {unit}", f"vs {p}")]
    if has_pct:
        head.append("% of limit")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|"]
    limits = set()
    for case, variant in keys:
        first = next(by[(case, variant, p)] for p in peers if (case, variant, p) in by)
        cells = [case, variant, _fmt_t(first["vkc_time"])]
        for p in peers:
            c = by.get((case, variant, p))
            cells += [_fmt_t(c["peer_time"]), _fmt_x(c["ratio"])] if c else ["–", "–"]
        if has_pct:
            cells.append(_fmt_pct(first.get("pct_limit")))
            if first.get("limit"):
                limits.add(first["limit"])
        lines.append("| " + " | ".join(cells) + " |")
    if limits:
        lines.append("")
        lines.append("% of limit: " + "; ".join(sorted(limits)) + ".")
    return "\n".join(lines)


def ranges(cmps):
    """{(family, mode, vkc variant, peer): (min ratio, max ratio, n, case of min, case of max)}."""
    acc = {}
    for c in cmps:
        acc.setdefault((c["family"], c["mode"], c["vkc"], c["peer"]), []).append(c)
    out = {}
    for k, cs in acc.items():
        lo = min(cs, key=lambda c: c["ratio"])
        hi = max(cs, key=lambda c: c["ratio"])
        out[k] = (lo["ratio"], hi["ratio"], len(cs), lo["case"], hi["case"])
    return out


def backend_warnings(cmps):
    """Comparisons whose recorded SDPA backend is not the one the peer name asked for."""
    bad = []
    for c in cmps:
        want = c["peer"][len("sdpa_"):] if c["peer"].startswith("sdpa_") and " " not in c["peer"] else None
        got = c.get("peer_backend")
        if want and got == "unknown":
            bad.append(f"{c['family']} {c['case']} {c['mode']}: {c['peer']}'s recorded kernels name no known "
                       "backend (the backend was still forced)")
        elif want and got not in (None, want):
            bad.append(f"{c['family']} {c['case']} {c['mode']}: {c['peer']} ran {got}")
    return bad


def _stamp(meta):
    bits = [f"commit `{meta.get('commit', 'unknown')}`"]
    if meta.get("dirty"):
        bits.append("(uncommitted changes)")
    for k in ("date_utc", "device", "torch", "triton", "fla"):
        if meta.get(k):
            bits.append(f"{k} {meta[k]}")
    return ", ".join(bits)


def markdown(results):
    """Everything for BENCHMARKS.md from one run: per benchmark its stamp and tables, then the ranges."""
    parts = []
    collected = collect(results)
    commits = _ordered(m.get("commit", "unknown") for _, m, _ in collected)
    if len(commits) > 1:
        parts.append(f"**Warning: these results come from {len(commits)} commits ({', '.join(commits)}); "
                     "do not merge their ranges.**\n")
    for name, meta, cmps in collected:
        parts.append(f"## {name}: {_stamp(meta)}\n")
        for fam in _ordered(c["family"] for c in cmps):
            for mode in C.MODES:
                t = table(cmps, fam, mode)
                if t:
                    parts.append(f"### {fam}, {MODE_TITLE[mode]}\n\n{t}\n")
        warn = backend_warnings(cmps)
        if warn:
            parts.append("Backend check (kernels recorded after the timings vs the backend each peer forced):\n"
                         + "\n".join(f"- {w}" for w in warn) + "\n")
    parts.append(range_text(collected))
    return "\n".join(parts)


def range_text(collected):
    lines = ["## Ratio ranges (peer time / vkc time; > 1: vkc faster)", ""]
    for name, meta, cmps in collected:
        for (fam, mode, variant, peer), (lo, hi, n, clo, chi) in ranges(cmps).items():
            lines.append(f"- {fam}, {mode}, vkc {variant} vs {peer}: {lo:.2f}–{hi:.2f}× over {n} cases "
                         f"(min {clo}, max {chi}); {name} at commit `{meta.get('commit', 'unknown')}`")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="results.json of one run (tools/gpu/run.sh), one bench JSON or a directory")
    ap.add_argument("--md", help="also write the markdown here")
    a = ap.parse_args(argv)
    text = markdown(load(a.results))
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
