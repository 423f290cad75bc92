"""Fresh process -> first correct result: vkc (vendored cubin, driver API, no torch) vs Triton JIT (torch +
triton, empty and warm Triton cache). Wall time measured by the parent from spawn to exit.
Usage: python benchmarks/bench_coldstart.py OUT.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

VKC_CHILD = r"""
import numpy as np
import vkc_runtime as vr
n = 1 << 20
x = np.random.rand(n).astype(np.float32); y = np.random.rand(n).astype(np.float32)
dx, dy = vr.DeviceArray.from_numpy(x), vr.DeviceArray.from_numpy(y)
out = vr.DeviceArray.empty((n,), "float32")
vr.get_kernel("selftest.scale_add.b1024").launch(((n + 1023) // 1024, 1, 1), (dx.ptr, dy.ptr, out.ptr, n, 0.5), 0)
got = out.to_numpy()
assert np.allclose(got, x + np.float32(0.5) * y, rtol=1e-6, atol=1e-6), "wrong result"
print("OK")
"""

TRITON_CHILD = r"""
import torch, triton, triton.language as tl
@triton.jit
def scale_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + alpha * tl.load(y_ptr + offs, mask=m), mask=m)
n = 1 << 20
x = torch.rand(n, device="cuda"); y = torch.rand(n, device="cuda"); out = torch.empty_like(x)
scale_add_kernel[((n + 1023) // 1024,)](x, y, out, n, 0.5, BLOCK=1024)
assert torch.allclose(out, x + 0.5 * y), "wrong result"
print("OK")
"""


def run(code, env):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:  # @triton.jit needs a file
        f.write(code)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, f.name], capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    return dt, p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stderr[-1500:]


def main(out_path):
    res = {}
    env = dict(os.environ)
    vk = [run(VKC_CHILD, env) for _ in range(5)]
    res["vkc_s"] = sorted(t for t, ok, _ in vk if ok)
    res["vkc_ok"] = all(ok for _, ok, _ in vk)
    res["vkc_err"] = next((e for _, ok, e in vk if not ok), "")
    with tempfile.TemporaryDirectory() as cache:
        tenv = {**env, "TRITON_CACHE_DIR": cache}
        cold = run(TRITON_CHILD, tenv)
        warm = [run(TRITON_CHILD, tenv) for _ in range(3)]
    res["triton_empty_cache_s"] = cold[0]
    res["triton_empty_cache_ok"] = cold[1]
    res["triton_warm_cache_s"] = sorted(t for t, ok, _ in warm if ok)
    res["triton_err"] = cold[2] if not cold[1] else ""
    if res["vkc_s"]:
        res["vkc_median_s"] = res["vkc_s"][len(res["vkc_s"]) // 2]
    ph = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "coldstart_phases.py")],
                        capture_output=True, text=True, env=env)
    res["vkc_phases_ms"] = json.loads(ph.stdout.strip().splitlines()[-1]) if ph.returncode == 0 else ph.stderr[-800:]
    bare = "import time; t=time.perf_counter(); import numpy; from cuda.bindings import driver as cu; cu.cuInit(0)"
    res["python_numpy_cuinit_s"] = run(bare + "\nprint('OK')", env)[0]
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "coldstart.json")
