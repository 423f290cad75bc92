"""GPU (H200, sm_90a) checks of vkc_runtime itself with the self-test kernels: the launch ABI for every
scalar width through both launchers, tensors from vkc/torch/cupy, streams and graphs, cuLaunchKernelEx
attributes on the real driver, error paths, integrity refusal, threads, and host time per launch."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

import vkc_runtime as vr  # noqa: E402
from vkc_runtime import artifacts, doctor, driver, interop, kernels, memory, native, pack, scratch, stream  # noqa: E402


def _sync():
    driver.call(driver.cu.cuCtxSynchronize)


def _cdiv(a, b):
    return (a + b - 1) // b


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for k in ("VKC_NATIVE", "VKC_ARCH", "VKC_LIBCUDA"):
        monkeypatch.delenv(k, raising=False)
    kernels.clear_cache()
    yield
    kernels.clear_cache()


@pytest.fixture(params=["native", "python"])
def kind(request, monkeypatch):
    if request.param == "native":
        if not native.native_available():
            pytest.fail(f"native launcher unavailable on the GPU box: {native.native_reason()}")
    else:
        monkeypatch.setenv("VKC_NATIVE", "0")
    return request.param


def test_doctor_on_gpu():
    r = doctor.report(deep=True)
    print(doctor.format_report(r))
    assert r["driver"]["available"] and r["devices"] and r["devices"][0]["cc"] == "9.0"
    assert r["selected"] == {"arch": "sm_90a", "how": "exact"}
    assert r["arches"]["sm_90a"]["complete"], r["arches"]["sm_90a"]
    assert r["native"]["available"], r["native"]


def test_abi_probe_every_scalar_width(kind):
    out = vr.DeviceArray.zeros((16,), "float64")
    k = kernels.get_kernel("selftest.abi_probe")
    vals = (out.ptr, True, -5, -300, -70000, -(2**40) + 3, 2**32 - 1, 0.333, 1.00390625 + 2**-20, 0.1, 0.1, 1234)
    k.launch(1, vals)
    _sync()
    assert k.native == (kind == "native")
    got = out.to_numpy()[:11].tolist()
    want = [1.0, -5.0, -300.0, -70000.0, float(-(2**40) + 3), float(2**32 - 1), float(np.float16(0.333)),
            1.0078125, float(np.float32(0.1)), 0.1, 1234.0]
    assert got == want


def test_scale_add_device_array(kind):
    rng = np.random.default_rng(1)
    n = 5000
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    X, Y = vr.DeviceArray.from_numpy(x), vr.DeviceArray.from_numpy(y)
    O = vr.DeviceArray.full((n,), np.nan, "float32")
    k = kernels.get_kernel("selftest.scale_add.b1024")
    k.launch(_cdiv(n, 1024), (X.ptr, Y.ptr, O.ptr, n, 0.1))
    _sync()
    np.testing.assert_allclose(O.to_numpy(), x + np.float32(0.1) * y, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        k.launch(1, (X.ptr + 4, Y.ptr, O.ptr, n - 1, 0.1))


def test_scale_add_torch_and_cupy_inputs_on_their_streams():
    torch = pytest.importorskip("torch")
    n = 3000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    o = torch.full((n,), float("nan"), device="cuda")
    k = kernels.get_kernel("selftest.scale_add.b1024")
    tx, ty, to = (memory.as_tensor(t, nm) for t, nm in ((x, "x"), (y, "y"), (o, "o")))
    assert tx.ptr == x.data_ptr() and tx.dtype == "float32" and tx.device == 0
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    k.launch(_cdiv(n, 1024), (tx.ptr, ty.ptr, to.ptr, n, 2.0), stream=s)
    s.synchronize()
    torch.testing.assert_close(o, x + 2.0 * y)
    try:
        import cupy as cp
    except Exception:
        pytest.skip("cupy not importable")
    a = cp.arange(n, dtype=cp.float32)
    b = cp.ones(n, dtype=cp.float32)
    c = cp.zeros(n, dtype=cp.float32)
    ta = memory.as_tensor(a, "a")
    assert ta.ptr == a.data.ptr and ta.shape == (n,)
    cs = cp.cuda.Stream(non_blocking=True)
    k.launch(_cdiv(n, 1024), (ta.ptr, memory.as_tensor(b).ptr, memory.as_tensor(c).ptr, n, -1.0), stream=cs)
    cs.synchronize()
    assert cp.asnumpy(c).tolist() == (np.arange(n, dtype=np.float32) - 1.0).tolist()


def test_graph_capture_replay_equals_eager():
    n = 4096
    x = np.arange(n, dtype=np.float32)
    X, Y = vr.DeviceArray.from_numpy(x), vr.DeviceArray.from_numpy(np.ones(n, np.float32))
    O = vr.DeviceArray.zeros((n,), "float32")
    s = vr.Stream()
    k = kernels.get_kernel("selftest.scale_add.b1024")
    args = (X.ptr, Y.ptr, O.ptr, n, 3.0)
    k.launch(n // 1024, args, s)  # eager first (loads the module)
    s.synchronize()
    eager = O.to_numpy()
    O.fill_bytes(0)
    g = vr.Graph()
    with g.capture(s):
        assert stream.is_capturing(s)
        k.launch(n // 1024, args, s)
    assert not stream.is_capturing(s)
    s.synchronize()
    assert not O.to_numpy().any()  # captured, not run
    g.replay(s)
    s.synchronize()
    np.testing.assert_array_equal(O.to_numpy(), eager)
    with pytest.raises(ValueError, match="default stream"):
        with vr.Graph().capture(None):
            pass
    g2 = vr.Graph()
    with pytest.raises(RuntimeError, match="inside"):
        with g2.capture(s):
            k.launch(n // 1024, args, s)
            raise RuntimeError("inside")
    assert not stream.is_capturing(s) and not g2.ready
    k.launch(n // 1024, args, s)  # the stream is usable after the aborted capture
    s.synchronize()


def test_scratch_arena_on_real_driver():
    """The default scratch is one buffer per context, whatever the stream: grown eagerly, reused (not grown)
    inside a capture on another stream."""
    ctx = driver.ensure_context()
    s, s2 = vr.Stream(), vr.Stream()
    arena = scratch.ScratchArena(ctx)
    p = arena.get(1 << 20, 128, s.handle)
    assert p % 128 == 0 and arena.size() >= 1 << 20
    g = vr.Graph()
    with g.capture(s2):
        assert arena.get(1 << 10, 128, s2.handle) == p
        with pytest.raises(vr.LaunchError, match="cannot grow during stream capture"):
            arena.get(1 << 24, 128, s2.handle)


def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    a = vr.DeviceArray.from_numpy(np.array([[1.0, 2.5, -3.0]], np.float32), dtype="bfloat16")
    t = torch.from_dlpack(a)
    assert t.dtype == torch.bfloat16 and t.data_ptr() == a.ptr and t.shape == (1, 3)
    assert t.float().cpu().tolist() == [[1.0, 2.5, -3.0]]
    tb = torch.randn(4, 6, device="cuda").to(torch.bfloat16)[:, 1:5]
    r = memory.as_tensor(tb, "tb")  # duck-typed torch path
    assert (r.ptr, r.shape, r.strides, r.dtype) == (tb.data_ptr(), (4, 4), (6, 1), "bfloat16")
    r2 = interop._from_dlpack(tb, "tb")  # the capsule path on the same tensor
    assert (r2.ptr, r2.shape, r2.strides, r2.dtype, r2.device) == (r.ptr, r.shape, r.strides, "bfloat16", 0)
    try:  # torch < 2.11 raised TypeError for bf16 here; 2.11 reports typestr "<V2", which vkc reads as bf16
        cai = tb.__cuda_array_interface__
    except TypeError:
        return
    assert cai["typestr"] == "<V2"
    r3 = interop._from_cai(cai, tb, "tb")
    assert (r3.ptr, r3.shape, r3.strides, r3.dtype) == (r.ptr, r.shape, r.strides, "bfloat16")


def _empty_fn():
    e = kernels.get_kernel("selftest.empty")
    e.load()
    return e, int(e.function)


def test_launch_ex_attributes_on_real_driver(kind):
    e, fn = _empty_fn()
    names = ["x_ptr", "n", "global_scratch", "profile_scratch"]
    mk = (lambda *a: native.NATIVE.Launcher(fn, *a)) if kind == "native" else \
        (lambda *a: pack.PyLauncher(e.function, *a))
    for num_ctas, pdl, coop in ((2, False, False), (1, True, False), (1, False, True), (2, True, False)):
        lau = mk("pipp", names, [0, 0, 0, 0], 2, 32, 0, num_ctas, pdl, coop, f"empty.{num_ctas}{pdl}{coop}")
        assert lau.uses_ex
        lau.launch(4, 1, 1, 0, (0, 0), 0)
        _sync()
    bad = mk("pipp", names, [0, 0, 0, 0], 2, 64, 0, 1, False, False, "empty.badblock")  # .reqntid is 32
    with pytest.raises(vr.CudaError) as ei:
        bad.launch(1, 1, 1, 0, (0, 0), 0)
    assert ei.value.name.startswith("CUDA_ERROR_") and "empty.badblock" in str(ei.value)
    e.launch(1, (0, 0))  # context still healthy
    _sync()


def test_integrity_refused_before_load(tmp_path, monkeypatch):
    src = artifacts.find_root()
    root = tmp_path / "root"
    (root / "manifests").mkdir(parents=True)
    shutil.copy(src / "manifests" / "sm_90a.json", root / "manifests")
    shutil.copytree(src / "vendored" / "sm_90a" / "selftest", root / "vendored" / "sm_90a" / "selftest")
    p = root / "vendored" / "sm_90a" / "selftest" / "empty.cubin"
    b = bytearray(p.read_bytes())
    b[-1] ^= 0xFF
    p.write_bytes(bytes(b))
    monkeypatch.setenv("VKC_ARTIFACT_ROOT", str(root))
    kernels.clear_cache()
    with pytest.raises(vr.IntegrityError, match="expected sha256"):
        kernels.get_kernel("selftest.empty").load()


def test_launch_from_another_thread():
    errs = []

    def work():
        try:
            e = kernels.get_kernel("selftest.empty")
            e.launch(1, (0, 0))
            _sync()
        except Exception as ex:  # pragma: no cover
            errs.append(ex)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errs


_RAW_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int (*i_u)(unsigned); typedef int (*i_pi)(int*, int); typedef int (*i_ppi)(void**, int);
typedef int (*i_p)(void*); typedef int (*i_ppc)(void**, const void*); typedef int (*i_pppc)(void**, void*, const char*);
typedef int (*i_v)(void);
typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                        void**);
int main(int argc, char** argv) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) { printf("dlopen failed\n"); return 1; }
  FILE* f = fopen(argv[1], "rb"); fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
  char* img = malloc(n); if (fread(img, 1, n, f) != (size_t)n) return 2; fclose(f);
  int dev; void *ctx, *mod, *fn;
  ((i_u)dlsym(h, "cuInit"))(0);
  ((i_pi)dlsym(h, "cuDeviceGet"))(&dev, 0);
  ((i_ppi)dlsym(h, "cuDevicePrimaryCtxRetain"))(&ctx, dev);
  ((i_p)dlsym(h, "cuCtxSetCurrent"))(ctx);
  if (((i_ppc)dlsym(h, "cuModuleLoadData"))(&mod, img)) return 3;
  if (((i_pppc)dlsym(h, "cuModuleGetFunction"))(&fn, mod, argv[2])) return 4;
  launch_t launch = (launch_t)dlsym(h, "cuLaunchKernel");
  i_v sync = (i_v)dlsym(h, "cuCtxSynchronize");
  unsigned long long p0 = 0, g = 0, pr = 0; int nn = 0;
  void* args[4] = {&p0, &nn, &g, &pr};
  int iters = atoi(argv[3]);
  for (int i = 0; i < 200; ++i) launch(fn, 1, 1, 1, 32, 1, 1, 0, 0, args, 0);
  sync();
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < iters; ++i) if (launch(fn, 1, 1, 1, 32, 1, 1, 0, 0, args, 0)) return 5;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  sync();
  printf("%.4f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / iters / 1e3);
  return 0;
}
"""


def _raw_c_launch_us(tmp_path, cubin, entry, iters):
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("g++")
    if cc is None:
        return None
    src = tmp_path / "raw.c"
    src.write_text(_RAW_C)
    exe = tmp_path / "raw"
    subprocess.run([cc, *(["-x", "c"] if cc.endswith("g++") else []), "-O2", str(src), "-o", str(exe), "-ldl"],
                   check=True)
    out = subprocess.run([str(exe), str(cubin), entry, str(iters)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def test_host_time_per_launch(kind, tmp_path):
    e = kernels.get_kernel("selftest.empty")
    args = (0, 0)
    for _ in range(200):
        e.launch(1, args)
    _sync()
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        e.launch(1, args)
    dt = (time.perf_counter() - t0) / n
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        kernels.get_kernel("selftest.empty").launch(1, args)
    dt_get = (time.perf_counter() - t0) / n
    _sync()
    res = {"launcher": kind, "kernel_launch_us": dt * 1e6, "get_kernel_and_launch_us": dt_get * 1e6}
    t0 = time.perf_counter()
    for _ in range(n):
        driver.ensure_context()
    res["ensure_context_us"] = (time.perf_counter() - t0) / n * 1e6
    if kind == "native":
        lau = e._launcher
        t0 = time.perf_counter()
        for _ in range(n):
            lau.launch(1, 1, 1, 0, args, 0)
        res["raw_native_launch_us"] = (time.perf_counter() - t0) / n * 1e6
        _sync()
        s = vr.Stream()
        g = vr.Graph()
        with g.capture(s):
            for _ in range(100):
                e.launch(1, args, s)
        g.replay(s)
        s.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            g.replay(s)
        s.synchronize()
        res["graph_replay_us_per_kernel"] = (time.perf_counter() - t0) / 100 / 100 * 1e6
        raw = _raw_c_launch_us(tmp_path, e.artifacts.path("selftest.empty"), e.spec.name, n)
        if raw is not None:
            res["raw_c_cuLaunchKernel_us"] = raw  # the driver's own cost: the floor for any launcher
            res["native_overhead_over_c_us"] = res["kernel_launch_us"] - raw
    print(json.dumps(res))
    out = os.environ.get("VKC_BENCH_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(res) + "\n")
    assert dt < (15e-6 if kind == "native" else 60e-6), res
    if "native_overhead_over_c_us" in res:
        assert res["native_overhead_over_c_us"] < 3.0, res
