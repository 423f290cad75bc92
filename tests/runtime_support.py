"""Shared helpers for the CPU tests of vkc_runtime (tests/test_runtime_*.py).

* :class:`FakeCu`: a stand-in for ``cuda.bindings.driver`` (monkeypatched into ``vkc_runtime.driver.cu``)
  that records calls and keeps a byte-accurate fake device memory.
* :func:`make_root` / :func:`add_kernel`: build an artifact root (manifests + vendored files) in a tmp dir.
* :func:`build_fake_libcuda`: compile a tiny fake ``libcuda.so.1`` for the native launcher (via VKC_LIBCUDA).
"""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

from cuda.bindings import driver as _real

from vkc_contract import abi
from vkc_contract.hashing import sha256_bytes

S = _real.CUresult.CUDA_SUCCESS
DA = _real.CUdevice_attribute
FA = _real.CUfunction_attribute


class FakeCu:
    """Records driver calls; returns what cuda-bindings would (``(CUresult, value...)`` tuples)."""

    def __init__(self, cc=(9, 0), n_devices=1, optin=227 * 1024, sm=132, max_threads=1024, static_smem=0):
        self.cc = cc
        self.n_devices = n_devices
        self.optin = optin
        self.sm = sm
        self.max_threads = max_threads
        self.static_smem = static_smem
        self.log: list[tuple] = []
        self.current = 0
        self.stack: list[int] = []
        self.primary = 0xC0C0
        self.next_ptr = 0x7F00_0000_0000
        self.mem: dict[int, bytearray] = {}
        self.freed: list[int] = []
        self.loaded: list[bytes] = []
        self.capturing: dict[int, bool] = {}
        self.launches: list[dict] = []
        self.launch_result = S
        self.param_sizes: list[int] | None = None
        self.next_stream = 0x5000
        self.end_capture_result = S

    def __getattr__(self, name):  # enums and struct types come from the real module
        return getattr(_real, name)

    def names(self) -> list[str]:
        return [c[0] for c in self.log]

    def calls(self, name: str) -> list[tuple]:
        return [c[1:] for c in self.log if c[0] == name]

    def _r(self, name, *args):
        self.log.append((name, *args))

    # -- init / device / context ------------------------------------------------------------------
    def cuInit(self, flags):
        self._r("cuInit", flags)
        return (S,)

    def cuGetErrorName(self, err):
        return (S, _real.CUresult(int(err)).name.encode())

    def cuDriverGetVersion(self):
        return (S, 13000)

    def cuDeviceGetCount(self):
        return (S, self.n_devices)

    def cuDeviceGet(self, i):
        return (S, int(i))

    def cuDeviceGetName(self, n, dev):
        return (S, b"Fake H200" + b"\0" * (n - 9))

    def cuDeviceGetAttribute(self, attr, dev):
        vals = {
            int(DA.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR): self.cc[0],
            int(DA.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR): self.cc[1],
            int(DA.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT): self.sm,
            int(DA.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN): self.optin,
        }
        return (S, vals[int(attr)])

    def cuCtxGetCurrent(self):
        return (S, self.current)

    def cuCtxGetDevice(self):
        return (S, 0)

    def cuDevicePrimaryCtxRetain(self, dev):
        self._r("cuDevicePrimaryCtxRetain", dev)
        return (S, self.primary)

    def cuCtxSetCurrent(self, ctx):
        self._r("cuCtxSetCurrent", int(ctx))
        self.current = int(ctx)
        return (S,)

    def cuCtxPushCurrent(self, ctx):
        self._r("cuCtxPushCurrent", int(ctx))
        self.stack.append(self.current)
        self.current = int(ctx)
        return (S,)

    def cuCtxPopCurrent(self):
        self._r("cuCtxPopCurrent")
        old, self.current = self.current, self.stack.pop()
        return (S, old)

    # -- modules ----------------------------------------------------------------------------------
    def cuModuleLoadData(self, data):
        self._r("cuModuleLoadData", len(data))
        self.loaded.append(bytes(data))
        return (S, 0xA000 + len(self.loaded))

    def cuModuleGetFunction(self, mod, name):
        self._r("cuModuleGetFunction", mod, name)
        return (S, 0xF000 + len(self.loaded))

    def cuFuncGetAttribute(self, attr, fn):
        if int(attr) == int(FA.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK):
            return (S, self.max_threads)
        if int(attr) == int(FA.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES):
            return (S, self.static_smem)
        raise AssertionError(f"unexpected cuFuncGetAttribute({attr})")

    def cuFuncSetAttribute(self, fn, attr, value):
        self._r("cuFuncSetAttribute", fn, int(attr), value)
        return (S,)

    # -- memory -----------------------------------------------------------------------------------
    def cuMemAlloc(self, n):
        self._r("cuMemAlloc", n)
        p = self.next_ptr
        self.next_ptr += (n + 511) // 256 * 256 + 256
        self.mem[p] = bytearray(n)
        return (S, p)

    def cuMemFree(self, p):
        self._r("cuMemFree", int(p))
        self.freed.append(int(p))
        self.mem.pop(int(p), None)
        return (S,)

    def _find(self, p, n):
        for base, buf in self.mem.items():
            if base <= p and p + n <= base + len(buf):
                return buf, p - base
        raise AssertionError(f"fake device access out of bounds: {p:#x}+{n}")

    def cuMemcpyHtoD(self, dst, src, n):
        self._r("cuMemcpyHtoD", int(dst), n)
        buf, off = self._find(int(dst), n)
        buf[off:off + n] = ctypes.string_at(int(src), n)
        return (S,)

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self._r("cuMemcpyHtoDAsync", int(dst), n, int(stream))
        return self.cuMemcpyHtoD(dst, src, n)

    def cuMemcpyDtoH(self, dst, src, n):
        self._r("cuMemcpyDtoH", int(src), n)
        buf, off = self._find(int(src), n)
        ctypes.memmove(int(dst), bytes(buf[off:off + n]), n)
        return (S,)

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        self._r("cuMemcpyDtoHAsync", int(src), n, int(stream))
        return self.cuMemcpyDtoH(dst, src, n)

    def cuMemcpyDtoD(self, dst, src, n):
        self._r("cuMemcpyDtoD", int(dst), int(src), n)
        sbuf, soff = self._find(int(src), n)
        dbuf, doff = self._find(int(dst), n)
        dbuf[doff:doff + n] = bytes(sbuf[soff:soff + n])
        return (S,)

    def cuMemsetD8(self, dst, value, n):
        self._r("cuMemsetD8", int(dst), value, n)
        buf, off = self._find(int(dst), n)
        buf[off:off + n] = bytes([value]) * n
        return (S,)

    def cuMemsetD8Async(self, dst, value, n, stream):
        self._r("cuMemsetD8Async", int(dst), value, n, int(stream))
        return self.cuMemsetD8(dst, value, n)

    # -- streams and graphs -----------------------------------------------------------------------
    def cuStreamCreate(self, flags):
        self._r("cuStreamCreate", flags)
        self.next_stream += 0x10
        return (S, self.next_stream)

    def cuStreamDestroy(self, s):
        self._r("cuStreamDestroy", int(s))
        return (S,)

    def cuStreamSynchronize(self, s):
        self._r("cuStreamSynchronize", int(s))
        return (S,)

    def cuStreamIsCapturing(self, s):
        st = _real.CUstreamCaptureStatus
        return (S, st.CU_STREAM_CAPTURE_STATUS_ACTIVE if self.capturing.get(int(s)) else
                st.CU_STREAM_CAPTURE_STATUS_NONE)

    def cuStreamBeginCapture(self, s, mode):
        self._r("cuStreamBeginCapture", int(s), int(mode))
        self.capturing[int(s)] = True
        return (S,)

    def cuStreamEndCapture(self, s):
        self._r("cuStreamEndCapture", int(s))
        self.capturing[int(s)] = False
        if self.end_capture_result != S:
            return (self.end_capture_result, 0)
        return (S, 0x6A00)

    def cuGraphInstantiate(self, g, flags):
        self._r("cuGraphInstantiate", int(g), flags)
        return (S, 0x6E00)

    def cuGraphLaunch(self, ex, s):
        self._r("cuGraphLaunch", int(ex), int(s))
        return (S,)

    def cuGraphDestroy(self, g):
        self._r("cuGraphDestroy", int(g))
        return (S,)

    def cuGraphExecDestroy(self, ex):
        self._r("cuGraphExecDestroy", int(ex))
        return (S,)

    # -- launches ---------------------------------------------------------------------------------
    def _params(self, addr: int) -> list[bytes] | None:
        if self.param_sizes is None:
            return None
        out = []
        for i, size in enumerate(self.param_sizes):
            p = ctypes.c_void_p.from_address(int(addr) + 8 * i).value
            out.append(ctypes.string_at(p, size))
        return out

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self._r("cuLaunchKernel", f, gx, gy, gz, bx, by, bz, smem, int(stream), params, extra)
        self.launches.append(dict(kind="plain", f=f, grid=(gx, gy, gz), block=(bx, by, bz), shared=smem,
                                  stream=int(stream), params=self._params(params)))
        return (self.launch_result,)

    def cuLaunchKernelEx(self, cfg, f, params, extra):
        self._r("cuLaunchKernelEx", f)
        raw = ctypes.string_at(cfg.getPtr(), 56)  # the real CUlaunchConfig struct cuda-bindings built
        attrs = [(int(a.id), a) for a in cfg.attrs]
        self.launches.append(dict(kind="ex", f=f, grid=(cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                                  block=(cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ), shared=cfg.sharedMemBytes,
                                  stream=int(cfg.hStream), attrs=attrs, raw=raw, params=self._params(params)))
        return (self.launch_result,)


# ----------------------------------------------------------------------------------- artifact roots
def signature(*args):
    """[(name, type, div)] -> manifest signature + params lists."""
    sig, params = [], []
    for name, ty, div in args:
        s = {"name": name, "type": ty}
        p = {"name": name, "type": ty, "code": abi.pack_code(ty), "size": abi.param_size(ty)}
        if div:
            s["divisibility"] = div
            p["divisibility"] = div
        sig.append(s)
        params.append(p)
    for h in abi.HIDDEN_PARAMS:
        params.append({"name": h, "type": abi.HIDDEN_TYPE, "code": "p", "size": 8, "hidden": True})
    return sig, params


DEFAULT_SIG = (("x", "*bf16", 16), ("n_cols", "i32", None), ("eps", "fp32", None))


def add_kernel(root: Path, arch: str, base: str, *, data: bytes | None = None, sig=DEFAULT_SIG, shared=0,
               num_warps=4, num_ctas=1, gss=0, gsa=1, pdl=False, coop=False, entry="rmsnorm_kernel",
               write_file=True, suffix=".cubin", constexprs=None) -> dict:
    family, name = base.split(".", 1)
    data = data if data is not None else (b"\x7fELF fake cubin " + base.encode() + b" " + arch.encode())
    rel = f"vendored/{arch}/{family}/{name}{suffix}"
    if write_file:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    s, params = signature(*sig)
    entry_d = {
        "inputs": {"family": family, "source": f"kernels_src/{family}/x.py", "entry": entry, "signature": s,
                   "constexprs": dict(constexprs or {}), "num_warps": num_warps, "num_stages": 1, "num_ctas": num_ctas,
                   "options": {"enable_fp_fusion": True}, "scratch": []},
        "artifact": {"path": rel, "sha256": sha256_bytes(data), "size": len(data)},
        "launch": {"name": entry, "num_warps": num_warps, "num_ctas": num_ctas, "shared": shared,
                   "global_scratch_size": gss, "global_scratch_align": gsa, "profile_scratch_size": 0,
                   "profile_scratch_align": 1, "launch_pdl": pdl, "launch_cooperative_grid": coop, "tmem_size": 0},
        "params": params,
        "resources": {"sass_arch": arch, "registers": 26, "stack": 0, "local": 0, "shared_static": 0},
    }
    mp = root / "manifests" / f"{arch}.json"
    doc = json.loads(mp.read_text()) if mp.exists() else {"schema_version": 1, "arch": arch, "toolchain": {},
                                                          "kernels": {}}
    doc["kernels"][base] = entry_d
    mp.parent.mkdir(parents=True, exist_ok=True)
    mp.write_text(json.dumps(doc, sort_keys=True, indent=2) + "\n")
    return entry_d


def make_root(tmp: Path, arches=("sm_90a",), bases=("norm.rmsnorm.b2048",), **kw) -> Path:
    root = tmp / "artifacts_root"
    (root / "manifests").mkdir(parents=True, exist_ok=True)
    (root / "manifests" / "schema.json").write_text("{}\n")
    for a in arches:
        mp = root / "manifests" / f"{a}.json"
        if not mp.exists():
            mp.write_text(json.dumps({"schema_version": 1, "arch": a, "toolchain": {}, "kernels": {}}) + "\n")
        for b in bases:
            add_kernel(root, a, b, **kw)
    return root


# ----------------------------------------------------------------------------------- fake libcuda
FAKE_LIBCUDA_C = r"""
#include <stdint.h>
#include <string.h>
typedef int CUresult;
static int g_sizes[256]; static int g_n = 0;
static unsigned char g_params[8192]; static int g_params_len = 0;
static unsigned g_grid[3], g_block[3], g_shared; static uintptr_t g_stream, g_fn;
static int g_plain = 0, g_ex = 0, g_result = 0;
static unsigned char g_config[56]; static unsigned char g_attrs[72 * 8]; static unsigned g_nattrs = 0;
void fake_set_sizes(int n, const int* s) { g_n = n; for (int i = 0; i < n; ++i) g_sizes[i] = s[i]; }
void fake_set_result(int r) { g_result = r; }
int fake_plain_calls(void) { return g_plain; }
int fake_ex_calls(void) { return g_ex; }
const unsigned char* fake_params(void) { return g_params; }
int fake_params_len(void) { return g_params_len; }
const unsigned* fake_grid(void) { return g_grid; }
const unsigned* fake_block(void) { return g_block; }
unsigned fake_shared(void) { return g_shared; }
uintptr_t fake_stream(void) { return g_stream; }
uintptr_t fake_fn(void) { return g_fn; }
const unsigned char* fake_config(void) { return g_config; }
const unsigned char* fake_attrs(void) { return g_attrs; }
unsigned fake_nattrs(void) { return g_nattrs; }
static uintptr_t g_ctx = 0;
void fake_set_ctx(uintptr_t c) { g_ctx = c; }
CUresult cuCtxGetCurrent(void** c) { *c = (void*)g_ctx; return 0; }
static unsigned char g_hist[16][512]; static uintptr_t g_hist_fn[16]; static int g_nhist = 0;
int fake_hist_count(void) { return g_nhist; }
const unsigned char* fake_hist_params(int i) { return g_hist[i % 16]; }
uintptr_t fake_hist_fn(int i) { return g_hist_fn[i % 16]; }
static void record(void** params) {
  int off = 0;
  for (int i = 0; i < g_n; ++i) { memcpy(g_params + off, params[i], g_sizes[i]); off += g_sizes[i]; }
  g_params_len = off;
  if (off <= 512) { memcpy(g_hist[g_nhist % 16], g_params, off); g_hist_fn[g_nhist % 16] = g_fn; }
  g_nhist++;
}
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void* stream, void** params, void** extra) {
  (void)extra; g_plain++; g_fn = (uintptr_t)f; g_grid[0] = gx; g_grid[1] = gy; g_grid[2] = gz;
  g_block[0] = bx; g_block[1] = by; g_block[2] = bz; g_shared = smem; g_stream = (uintptr_t)stream;
  record(params); return g_result;
}
CUresult cuLaunchKernelEx(const void* cfg, void* f, void** params, void** extra) {
  (void)extra; g_ex++; g_fn = (uintptr_t)f; memcpy(g_config, cfg, 56);
  const unsigned* u = (const unsigned*)cfg;
  g_grid[0] = u[0]; g_grid[1] = u[1]; g_grid[2] = u[2]; g_block[0] = u[3]; g_block[1] = u[4]; g_block[2] = u[5];
  g_shared = u[6];
  g_stream = *(const uintptr_t*)((const char*)cfg + 32);
  const void* attrs = *(const void* const*)((const char*)cfg + 40);
  g_nattrs = *(const unsigned*)((const char*)cfg + 48);
  if (g_nattrs <= 8 && attrs) memcpy(g_attrs, attrs, 72 * g_nattrs);
  record(params); return g_result;
}
CUresult cuGetErrorName(CUresult r, const char** s) {
  *s = r == 1 ? "CUDA_ERROR_INVALID_VALUE" : r == 700 ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
"""


def find_cc() -> str | None:
    for c in ("cc", "gcc", "clang", "g++"):
        if shutil.which(c):
            return c
    return None


def build_fake_libcuda(tmp: Path) -> Path | None:
    cc = find_cc()
    if cc is None:
        return None
    src = tmp / "fake_libcuda.c"
    out = tmp / "libcuda.so.1"
    src.write_text(FAKE_LIBCUDA_C)
    lang = ["-x", "c"] if cc == "g++" else []
    subprocess.run([cc, *lang, "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out


# ----------------------------------------------------------------------------------- fixtures
import pytest  # noqa: E402

_VKC_ENV = ("VKC_ARCH", "VKC_ARTIFACT_ROOT", "VKC_NATIVE", "VKC_DEVICE", "VKC_LIBCUDA")


@pytest.fixture
def clean_env(monkeypatch):
    for k in _VKC_ENV:
        monkeypatch.delenv(k, raising=False)
    yield monkeypatch


@pytest.fixture
def fake_cu(monkeypatch, clean_env):
    from vkc_runtime import driver, kernels
    f = FakeCu()
    monkeypatch.setattr(driver, "cu", f)
    driver.reset_caches()
    kernels.clear_cache()
    yield f
    driver.reset_caches()
    kernels.clear_cache()


def native_module():
    """vkc_runtime._native or None."""
    from vkc_runtime import native
    return native.NATIVE


def real_driver_present() -> bool:
    """True where libcuda loads and cuInit succeeds (the GPU box): tests that assume no driver skip there."""
    try:
        res = _real.cuInit(0)
        return (res[0] if isinstance(res, tuple) else res) == S
    except Exception:
        return False


no_real_driver = pytest.mark.skipif(real_driver_present(), reason="assumes a machine without a CUDA driver")
