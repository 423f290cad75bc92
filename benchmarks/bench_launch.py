"""Host time per launch of an empty kernel: vkc native launcher vs vkc's cuda-bindings fallback vs raw
cuda-bindings (tuple args) vs Triton JIT, plus CUDA-graph replay per kernel. Each mode in its own process.

Launches are issued in bursts of 256 (well under the driver's queue depth, so the host never waits on
the GPU) and only the issuing is timed; median over bursts.
Usage: python benchmarks/bench_launch.py OUT.json
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

BURST, BURSTS = 256, 60


def _bursts(launch, sync):
    for _ in range(3):
        for _ in range(BURST):
            launch()
        sync()
    per = []
    for _ in range(BURSTS):
        t0 = time.perf_counter()
        for _ in range(BURST):
            launch()
        per.append((time.perf_counter() - t0) / BURST * 1e6)
        sync()
    return statistics.median(per)


def mode_vkc():
    import vkc_runtime as vr
    from vkc_runtime import driver, native
    k = vr.get_kernel("selftest.empty")
    buf = vr.DeviceArray.empty((256,), "uint8")
    args = (buf.ptr, 7)
    us = _bursts(lambda: k.launch((1, 1, 1), args, 0), lambda: driver.check(driver.cu.cuCtxSynchronize()))
    return {"us_per_launch": us, "native": k.native, "native_reason": native.native_reason()}


def mode_graph():
    import vkc_runtime as vr
    k = vr.get_kernel("selftest.empty")
    buf = vr.DeviceArray.empty((256,), "uint8")
    s = vr.Stream()
    g = vr.Graph()
    n = 1000
    with g.capture(s):
        for _ in range(n):
            k.launch((1, 1, 1), (buf.ptr, 7), s)
    g.replay(s)
    s.synchronize()
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        g.replay(s)
        s.synchronize()
        ts.append((time.perf_counter() - t0) / n * 1e6)
    return {"us_per_kernel": statistics.median(ts), "note": "wall time incl. GPU execution of 1000 empty kernels"}


def mode_cuda_bindings():
    import ctypes

    from cuda.bindings import driver as cu
    import vkc_runtime as vr
    k = vr.get_kernel("selftest.empty")
    k.load()
    fn = k.function
    buf = vr.DeviceArray.empty((256,), "uint8")
    types = (ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)
    vals = (buf.ptr, 7, 0, 0)

    def launch():
        (err,) = cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, (vals, types), 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(err)
    return {"us_per_launch": _bursts(launch, lambda: cu.cuCtxSynchronize())}


def mode_triton():
    import torch
    import triton

    @triton.jit
    def empty_kernel(x_ptr, n):
        pass
    x = torch.empty(256, device="cuda", dtype=torch.uint8)
    return {"us_per_launch": _bursts(lambda: empty_kernel[(1,)](x, 7), torch.cuda.synchronize),
            "triton": triton.__version__}


def run_child(mode, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    out = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(out_path):
    res = {
        "vkc_native": run_child("vkc"),
        "vkc_cuda_bindings_fallback": run_child("vkc", {"VKC_NATIVE": "0"}),
        "raw_cuda_bindings_tuple_args": run_child("cuda_bindings"),
        "triton_jit": run_child("triton"),
        "cuda_graph_replay": run_child("graph"),
        "burst": BURST, "bursts": BURSTS,
    }
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    for k, v in res.items():
        print(f"{k:<32} {v}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(globals()[f"mode_{sys.argv[2]}"]()))
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "launch_bench.json")
