"""Fresh process -> first chunked GDN result on the host: vkc (vendored cubins; numpy + cuda-bindings, no torch)
vs FLA's chunk_gated_delta_rule (torch + Triton JIT; empty and warm Triton cache). Qwen3.6-27B heads (16/48),
one sequence of T tokens. The parent timestamps the child's "READY" line (result copied to the host); the child
then checks the result against the float64 chunked reference (tests/refs_gdn.py) and prints "OK" — the check is
not timed. Usage: python benchmarks/bench_coldstart_gdn.py OUT.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

T, HK, HV = 512, 16, 48
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INPUTS = f"""
import numpy as np
rng = np.random.default_rng(0)
T, HK, HV, D = {T}, {HK}, {HV}, 128
C = 2 * HK * D + HV * D
x = rng.standard_normal((T, C)).astype(np.float32)
qkv = x / (1 + np.exp(-x))
a = (rng.standard_normal((T, HV)) * 2).astype(np.float32)
b = (rng.standard_normal((T, HV)) * 2).astype(np.float32)
A_log = (rng.random(HV) * 2 - 1).astype(np.float32)
dt = (rng.standard_normal(HV) * 0.5).astype(np.float32)
cu = np.array([0, T], np.int32)

def bf16(v):  # round to bf16 (nearest even) and back to float32, as the device sees the inputs
    u = np.ascontiguousarray(v, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)).view(np.float32)
qkv, a, b = bf16(qkv), bf16(a), bf16(b)

def verify(out):
    import sys
    sys.path.insert(0, {REPO!r})
    from tests import refs_gdn
    ref, _ = refs_gdn.chunked(qkv.astype(np.float64), a.astype(np.float64), b.astype(np.float64),
                              A_log.astype(np.float64), dt.astype(np.float64), cu, HK, HV)
    err = refs_gdn.rel_err(np.asarray(out, np.float64).reshape(ref.shape), ref)
    assert np.isfinite(out).all() and err < 2e-2, err
    print("OK", err, flush=True)
"""

VKC_CHILD = INPUTS + """
import vkc_runtime as vr
from vkc_runtime.ops import gdn as G
d = {k: vr.DeviceArray.from_numpy(v, dtype="bfloat16") for k, v in (("qkv", qkv), ("a", a), ("b", b))}
out = G.chunk_gated_delta_rule(d["qkv"], d["a"], d["b"], vr.DeviceArray.from_numpy(A_log),
                               vr.DeviceArray.from_numpy(dt), vr.DeviceArray.from_numpy(cu), HK, HV)
host = out.to_numpy()
print("READY", flush=True)
verify(host)
"""

FLA_CHILD = INPUTS + """
import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
dev = "cuda"
q = torch.from_numpy(qkv[:, :HK * D].copy()).to(dev, torch.bfloat16).view(1, T, HK, D)
k = torch.from_numpy(qkv[:, HK * D:2 * HK * D].copy()).to(dev, torch.bfloat16).view(1, T, HK, D)
v = torch.from_numpy(qkv[:, 2 * HK * D:].copy()).to(dev, torch.bfloat16).view(1, T, HV, D)
at, bt = torch.from_numpy(a).to(dev), torch.from_numpy(b).to(dev)
g = (-torch.from_numpy(A_log).to(dev).exp() * torch.nn.functional.softplus(at + torch.from_numpy(dt).to(dev)))
beta = bt.sigmoid()
o, _ = chunk_gated_delta_rule(q, k, v, g.view(1, T, HV), beta.view(1, T, HV), scale=D ** -0.5,
                              use_qk_l2norm_in_kernel=True, output_final_state=False)
host = o.float().cpu().numpy()
print("READY", flush=True)
verify(host)
"""


def run(code, env):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, f.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    ready = None
    out_lines = []
    for line in p.stdout:
        out_lines.append(line.strip())
        if line.startswith("READY") and ready is None:
            ready = time.perf_counter() - t0
    err = p.stderr.read()
    p.wait()
    ok = p.returncode == 0 and any(x.startswith("OK") for x in out_lines)
    rel = next((float(x.split()[1]) for x in out_lines if x.startswith("OK")), None)
    return {"seconds_to_result": ready, "ok": ok, "rel_err_vs_f64": rel, "stderr": "" if ok else err[-1500:]}


def main(out_path):
    env = dict(os.environ)
    res = {"T": T, "heads": f"{HK}/{HV}", "vkc": [run(VKC_CHILD, env) for _ in range(3)]}
    try:
        import fla  # noqa: F401
        with tempfile.TemporaryDirectory() as cache:
            fenv = {**env, "TRITON_CACHE_DIR": cache}
            res["fla_empty_cache"] = run(FLA_CHILD, fenv)
            res["fla_warm_cache"] = [run(FLA_CHILD, fenv) for _ in range(2)]
    except Exception as e:
        res["fla"] = f"not importable: {type(e).__name__}: {e}"
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "coldstart_gdn.json")
