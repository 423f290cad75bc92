"""What every benchmark shares and what can be checked without a GPU: the result format (schema
``vkc-bench/2``), run metadata (commit, date, device, versions), the case lists, the physical limits
(HBM floors, tensor-core peak) and the comparison records that benchmarks/summarize.py turns into tables.

A result JSON (one file per benchmark, merged by tools/gpu/run.sh into results.json keyed by file name):

  schema       "vkc-bench/2"
  bench        "attn" | "gdn" | "gdn_decode" | "norm"
  meta         commit ($VKC_COMMIT when set -- the device copy's .git may be stale --, else git rev-parse HEAD,
               else "unknown"),
               commit_source, dirty, date_utc, device, torch, triton, cuda, fla, python, vkc_arch
  method       how each mode was timed (graph / eager / host: warm-up, repeats, calls per sample, median)
  limits       the physical limits used for "% of limit" (nominal and measured values, which one is used)
  rows         per case: every measured number, the peer's backend as recorded, errors of peers that could
               not run (never silently dropped)
  comparisons  flat list, one per (case, mode, vkc variant, peer): vkc_time, peer_time, unit,
               ratio = peer_time / vkc_time (> 1: vkc faster), pct_limit (vkc's % of the physical limit)

Modes: "device" = both sides captured in CUDA graphs, replays timed (device time, no host cost);
"eager" = both sides called from Python, CUDA events around the calls (host cost included);
"host" = wall clock of back-to-back calls without a sync (host time per call, microseconds).
torch is imported lazily (only by the GPU helpers at the end), so this module imports on any machine.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys

SCHEMA = "vkc-bench/2"
MODES = ("device", "eager", "host")

# Physical limits. Nominal HBM bandwidth from NVIDIA's datasheets, by the card this process runs on (the device
# machine is an H200 SXM or an H100 SXM 80 GB; without a GPU: the H200's); measured copy bandwidth is taken in the
# same process by measured_copy_tbs() and recorded next to the nominal one.
HBM_NOMINAL_BY_CARD = (("H200", 4.8), ("H100 PCIe", 2.0), ("H100 NVL", 3.9), ("H100", 3.35))


def _smi_query(fields: str) -> str:
    """nvidia-smi's CSV line for GPU 0 (``--query-gpu=fields``), "" without a driver. nvidia-smi, not torch: this
    module imports on any machine without importing torch."""
    try:
        q = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader", "-i", "0"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = q.stdout.strip().splitlines()
    return lines[0] if q.returncode == 0 and lines else ""


def _nominal_hbm_tbs() -> tuple[float, str]:
    name = _smi_query("name")
    for key, tbs in HBM_NOMINAL_BY_CARD:
        if key in name:
            return tbs, f"{name} datasheet"
    return 4.8, f"H200 datasheet (card {name or 'unknown'})"


HBM_NOMINAL_TBS, HBM_NOMINAL_SOURCE = _nominal_hbm_tbs()
BF16_DENSE_TFLOPS = 989.0   # dense bf16 tensor-core peak (no sparsity)
L2_BYTES = 60e6

# ------------------------------------------------------------------------------------------------ cases

ATTN_PREFILL_HEADS = ((24, 4), (16, 2))
ATTN_PREFILL_T = (1024, 4096, 8192, 32768)
ATTN_HEAD_DIM = 256
ATTN_DECODE_B = (1, 16, 64, 256)
ATTN_DECODE_L = (512, 4096, 32768)
ATTN_DECODE_MAX_BYTES = 40e9      # paged cache + de-paged copy of K/V, both resident
HOST_VISIBLE_DECODE = 16 * 4096   # B * L at or below which host times and split sweeps are taken


def attn_prefill_cases():
    """[(Hq, Hkv, T)]: causal, one sequence whose cache holds exactly its T tokens, D = 256."""
    return [(hq, hkv, t) for hq, hkv in ATTN_PREFILL_HEADS for t in ATTN_PREFILL_T]


def attn_decode_kv_bytes(B, L, Hkv, D=ATTN_HEAD_DIM, elt=2):
    return 2 * B * L * Hkv * D * elt


def attn_decode_cases(Hkv=4, D=ATTN_HEAD_DIM):
    """[(B, L)] whose paged + de-paged K/V fit in ATTN_DECODE_MAX_BYTES."""
    return [(b, l) for b in ATTN_DECODE_B for l in ATTN_DECODE_L
            if 2 * attn_decode_kv_bytes(b, l, Hkv, D) <= ATTN_DECODE_MAX_BYTES]


GDN_MIXED_LENS = (1, 17, 64, 65, 129, 500, 1000, 1024, 1500, 1800, 2093)  # 8193 tokens ("mixed11x8192")
GDN_HEADS = ((16, 48), (16, 32))


def gdn_prefill_cases():
    """[(name, lens)] of the prefill bench (per head pair)."""
    return [("1x2048", [2048]), ("1x8192", [8192]), ("1x32768", [32768]), ("mixed11x8192", list(GDN_MIXED_LENS))]


GDN_DECODE_B = (1, 16, 64, 256)
NORM_HIDDEN = (2048, 5120)
NORM_TOKENS = (1, 16, 128, 1024, 4096, 16384)
NORM_HOST_MAX_TOKENS = 1024       # host-time rows (bound / validated / torch) at these sizes


def n_sets_for(bytes_per_set, *, lo=2, hi=64, factor=2.5):
    """Input sets to rotate so that all of them together exceed factor x the L2 (small ops never time cache hits)."""
    return max(lo, min(hi, int(factor * L2_BYTES // max(1, bytes_per_set)) + 1))


# ------------------------------------------------------------------------------------------------ limits

def floor_ms(nbytes, tbs):
    """Time to move nbytes at tbs TB/s, in ms."""
    return nbytes / (tbs * 1e12) * 1e3


def attn_decode_bytes(B, L, Hq, Hkv, D=ATTN_HEAD_DIM, elt=2):
    """Compulsory HBM bytes of one decode step: K and V of every sequence read once, q read, out written."""
    return attn_decode_kv_bytes(B, L, Hkv, D, elt) + 2 * B * Hq * D * elt


def attn_prefill_flops(T, Hq, D=ATTN_HEAD_DIM, causal=True):
    """Matmul FLOPs of causal attention over T tokens (QK^T and PV, 2 FLOPs per MAC, half the square)."""
    return 4 * T * T * D * Hq / (2 if causal else 1)


def attn_prefill_set_bytes(T, Hq, Hkv, D=ATTN_HEAD_DIM, elt=2):
    """Bytes one prefill call touches on one side: K, V (T tokens) read, q read, out written."""
    return 2 * T * Hkv * D * elt + 2 * T * Hq * D * elt


def gdn_decode_bytes(B, Hv, D=128):
    """State read + written (fp32) per decode step; q/k/v/a/b/out are < 1% and not counted."""
    return 2 * B * Hv * D * D * 4


def gdn_prefill_bytes(T, N, Hk, Hv, DK=128, DV=128):
    """Compulsory bytes of a GDN prefill: packed qkv, a, b read (bf16), out written (bf16), the final state of
    each sequence written (fp32). A lower bound only: the chunked algorithm is not bandwidth-bound."""
    return T * (2 * Hk * DK + Hv * DV) * 2 + 2 * T * Hv * 2 + T * Hv * DV * 2 + N * Hv * DK * DV * 4


def pct(limit_ms, t_ms):
    """vkc's % of a limit: 100 x (time at the limit) / (measured time)."""
    if limit_ms is None or not t_ms:
        return None
    return 100.0 * limit_ms / t_ms


# ------------------------------------------------------------------------------------------------ records

def comparison(family, case, mode, vkc, vkc_time, peer, peer_time, *, unit="ms", pct_limit=None, limit=None,
               peer_backend=None):
    """One vkc-vs-peer figure; None when either time is missing (a peer that could not run is in the row)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} not in {MODES}")
    if vkc_time is None or peer_time is None or vkc_time <= 0 or peer_time <= 0:
        return None
    c = {"family": family, "case": case, "mode": mode, "vkc": vkc, "peer": peer, "unit": unit,
         "vkc_time": float(vkc_time), "peer_time": float(peer_time), "ratio": float(peer_time) / float(vkc_time)}
    if pct_limit is not None:
        c["pct_limit"] = float(pct_limit)
        c["limit"] = limit
    if peer_backend is not None:
        c["peer_backend"] = peer_backend
    return c


class Comparisons(list):
    def add(self, *args, **kw):
        c = comparison(*args, **kw)
        if c is not None:
            self.append(c)
        return c


def sdpa_backend_of(kernel_names):
    """Which SDPA backend a list of CUDA kernel names belongs to: "flash" (torch's FlashAttention-2,
    pytorch_flash::flash_fwd*), "cudnn" (cudnn* / cuDNN's *_fprop_* fused kernels), "efficient"
    (fmha_cutlass*, mem-efficient attention), "math" (a softmax between GEMMs), else "unknown"."""
    low = [n.lower() for n in kernel_names if not n.startswith("<")]
    if any("pytorch_flash" in n or "flash_fwd" in n for n in low):
        return "flash"
    if any("cudnn" in n or "fprop" in n for n in low):
        return "cudnn"
    if any("fmha_cutlass" in n or "memeffattention" in n or "attentionkernel" in n for n in low):
        return "efficient"
    if any("softmax" in n for n in low):
        return "math"
    return "unknown"


def attn_comparisons(cmp, r, peers):
    """The comparisons of one bench_attn row (prefill or decode) against each SDPA backend in peers:
    device (graph vs graph), eager (events vs events), host (us per call) for vkc's op, plan and validated op.
    % of limit: prefill vs the bf16 dense peak, decode vs the HBM floor at the nominal bandwidth."""
    kind = r["kind"]
    fam = "attn_" + kind
    if kind == "prefill":
        case = f"{r['Hq']}/{r['Hkv']} T={r['T']}"
        lim, limit = r.get("peak_ms"), f"bf16 dense peak {BF16_DENSE_TFLOPS:.0f} TFLOPS (nominal)"
    elif kind == "decode":
        case = f"B={r['B']} L={r['L']}"
        lim, limit = r.get("floor_ms"), f"HBM floor (K+V+q+out) at {HBM_NOMINAL_TBS} TB/s nominal"
    else:
        raise ValueError(f"row kind {kind!r}")
    for be in peers:
        p = f"sdpa_{be}"
        for variant, key in (("op", "vkc_graph_ms"), ("plan", "vkc_plan_graph_ms")):
            cmp.add(fam, case, "device", variant, r.get(key), p, r.get(p + "_graph_ms"),
                    pct_limit=pct(lim, r.get(key)), limit=limit, peer_backend=r.get(p + "_backend_graph"))
        for variant, key in (("op", "vkc_ms"), ("plan", "vkc_plan_ms"), ("op_validated", "vkc_validated_ms")):
            cmp.add(fam, case, "eager", variant, r.get(key), p, r.get(p + "_ms"),
                    pct_limit=pct(lim, r.get(key)), limit=limit, peer_backend=r.get(p + "_backend_eager"))
        for variant, key in (("op", "vkc_host_us"), ("plan", "vkc_plan_host_us"),
                             ("op_validated", "vkc_validated_host_us")):
            cmp.add(fam, case, "host", variant, r.get(key), p, r.get(p + "_host_us"), unit="us",
                    peer_backend=r.get(p + "_backend_eager"))
    return cmp


def git_commit(repo=None):
    """(commit, source, dirty): $VKC_COMMIT when set (the run script knows what it copied; a copied .git can be
    stale), else git rev-parse HEAD of the checkout, else "unknown"."""
    env = os.environ.get("VKC_COMMIT", "").strip()
    if env:
        return env, "env VKC_COMMIT", None
    repo = repo or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        h = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if h.returncode == 0 and h.stdout.strip():
            st = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
            return h.stdout.strip(), "git", bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown", "none", None


def versions():
    """Python, torch, triton and FLA versions: from the imported module, else the installed distribution
    (importlib.metadata: nothing is imported just to be named), else "not installed"."""
    from importlib import metadata
    v = {"python": platform.python_version()}
    for mod, dists in (("torch", ("torch",)), ("triton", ("triton",)), ("fla", ("fla-core", "flash-linear-attention"))):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__version__", None):
            v[mod] = m.__version__
            continue
        v[mod] = "not installed"
        for d in dists:
            try:
                v[mod] = metadata.version(d)
                break
            except metadata.PackageNotFoundError:
                continue
    return v


def meta(**extra):
    commit, source, dirty = git_commit()
    m = {"commit": commit, "commit_source": source, "dirty": dirty,
         "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), **versions()}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        m.update(device=torch.cuda.get_device_name(0), sm_count=p.multi_processor_count, cuda=torch.version.cuda)
        smi = _smi_query("driver_version,clocks.sm,clocks.max.sm")  # driver, SM clock now, max SM clock
        if smi:
            m["nvidia_smi"] = smi
    try:
        import vkc_runtime
        m["vkc_arch"] = vkc_runtime.doctor.report()["selected_arch"]
    except Exception as e:  # noqa: BLE001
        m["vkc_arch"] = f"unknown: {type(e).__name__}"
    m.update(extra)
    return m


def result(bench, *, method, limits, rows, comparisons, **extra):
    return {"schema": SCHEMA, "bench": bench, "meta": meta(), "method": method, "limits": limits, "rows": rows,
            "comparisons": [c for c in comparisons if c is not None], **extra}


def write(path, res):
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)


def rel_err(a, b):
    """||a - b|| / ||b|| of two tensors of one shape (float), inf when the shapes differ."""
    if tuple(a.shape) != tuple(b.shape):
        return float("inf")
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# A peer's output vs vkc's on the same inputs, to tell whether a peer call variant computes the same function:
# far above bf16 rounding of two implementations (~1e-2), far below a wrong head mapping (~1).
PEER_REL_TOL = 0.1


def err(e):
    return f"{type(e).__name__}: {str(e)[:300]}"


def best_alternative(row, alts):
    """Store ``alts`` (name -> time in µs, or an error record) in ``row`` with the fastest timed one and its % of
    ``row["floor_us"]``."""
    row["alternatives"] = alts
    timed = {k: v for k, v in alts.items() if isinstance(v, float)}
    if timed:
        best = min(timed, key=timed.get)
        row["best_alternative"] = best
        row["best_alternative_pct_floor"] = 100 * row["floor_us"] / timed[best]


# ------------------------------------------------------------------------------------------------ GPU helpers

@contextlib.contextmanager
def validated():
    """Bound calls off: every vkc call validates its inputs (VKC_FASTPATH=0), the pre-bound-call path."""
    from vkc_runtime.bound import clear_bound_calls
    old = os.environ.get("VKC_FASTPATH")
    os.environ["VKC_FASTPATH"] = "0"
    clear_bound_calls()
    try:
        yield
    finally:
        if old is None:
            del os.environ["VKC_FASTPATH"]
        else:
            os.environ["VKC_FASTPATH"] = old
        clear_bound_calls()


def measured_copy_tbs(nbytes=1 << 30):
    """Device-to-device copy bandwidth (read + write bytes / time), CUDA graph of 5 copies, median of 20."""
    import torch
    import timing
    a = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = timing.graph_ms(lambda i, st: b.copy_(a), vkc=False, inner=5, reps=20)
    a = b = None  # noqa: F841
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e12


def hbm_limits(copy_tbs):
    return {"hbm_nominal_tbs": HBM_NOMINAL_TBS, "hbm_measured_copy_tbs": copy_tbs,
            "hbm_used_for_pct_limit": f"nominal {HBM_NOMINAL_TBS} TB/s ({HBM_NOMINAL_SOURCE}); *_pct_copy columns "
                                      "use the measured copy",
            "bf16_dense_tflops_nominal": BF16_DENSE_TFLOPS}
