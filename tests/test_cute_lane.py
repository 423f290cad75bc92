"""The CuTe DSL lane on the CPU: the export-header check, the generated C glue + driver shim (compiled here with
gcc against stand-ins for the DSL's exported entry points: argument rules, descriptor packing, behaviour without a
driver), the embedded-cubin scanner, the committed sm_90a artifact (loads without a driver through the runtime
loader, refuses cleanly), regen failing loudly without a DSL, and, when the DSL is installed, the lane rebuilt from
two other directories byte-identical to the committed files and manifest entries."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from vkc import cute_glue, cute_lane, discover, hostelf, manifest
from vkc_contract import layout
from tests.aot_tree import REPO, make_tree

ARCH = "sm_90a"
SPECS = discover.cute_specs_for_arch(REPO, ARCH)
JOB = SPECS[0].job_json()
FP8 = next(s for s in SPECS if s.abi == "gemm_fp8")
FP8_JOB = FP8.job_json()
BLOCK = next(s for s in SPECS if s.abi == "gemm_fp8_block")
BLOCK_JOB = BLOCK.job_json()
HOST = layout.current_host_platform()


def _has_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _dsl() -> str | None:
    try:
        return cute_lane.dsl_python(REPO)
    except cute_lane.CuteLaneError:
        return None


def test_specs_and_symbols():
    assert [s.base for s in SPECS] == ["gemm.bf16.t128x256", "gemm.bf16.t128x128", "gemm.bf16.t128x64",
                                       "gemm.fp8.t128x256", "gemm.fp8.t128x128", "gemm.fp8.t128x64",
                                       "gemm.fp8_block.t192x128", "gemm.fp8_block.t128x128", "gemm.fp8_block.t128x64"]
    assert [s.abi for s in SPECS] == ["gemm_bf16"] * 3 + ["gemm_fp8"] * 3 + ["gemm_fp8_block"] * 3
    assert SPECS[0].symbol == "vkc_cute_gemm_bf16_t128x256" and FP8.symbol == "vkc_cute_gemm_fp8_t128x256"
    assert BLOCK.symbol == "vkc_cute_gemm_fp8_block_t192x128"
    assert FP8_JOB["kernel_class"] == "Sm90FP8Gemm" and BLOCK_JOB["kernel_class"] == "Sm90FP8BlockGemm"
    assert JOB["export"] == "gemm_bf16_t128x256" and JOB["module"] == "kernels_src.gemm.sm90_wgmma"
    assert discover.cute_specs_for_arch(REPO, "sm_80") == []


# ---------------------------------------------------------------- header check
def good_facts(name):
    rows = ["void *data", "int32_t dynamic_shapes[2]", "int64_t dynamic_strides[1]"]
    return {"tensor_structs": {f"{name}_Tensor_{t}_t": list(rows) for t in "awc"},
            "ciface": f"_mlir_{name}__mlir_ciface_fn", "init": f"_mlir_{name}_cuda_init",
            "load_to_device": f"_mlir_{name}_cuda_load_to_device",
            "wrapper_args": "a, w, c, &ctas, &stream, &ret", "wrapper_nargs": 6}


def good_fp8_facts(name):
    f = good_facts(name)
    vec = ["void *data", "int32_t dynamic_shapes[1]", "int64_t dynamic_strides[1]"]
    f["tensor_structs"].update({f"{name}_Tensor_{t}_t": list(vec) for t in ("scale_a", "scale_w")})
    f.update(wrapper_args="a, w, c, scale_a, scale_w, &ctas, &stream, &ret", wrapper_nargs=8)
    return f


def good_block_facts(name):
    f = good_fp8_facts(name)
    rows = ["void *data", "int32_t dynamic_shapes[2]", "int64_t dynamic_strides[1]"]
    f["tensor_structs"].update({f"{name}_Tensor_{t}_t": list(rows) for t in ("scale_a", "scale_w")})
    return f


def test_header_check_accepts_the_expected_layout():
    assert cute_glue.check_header(JOB, good_facts(JOB["export"])) == []
    assert cute_glue.check_header(FP8_JOB, good_fp8_facts(FP8_JOB["export"])) == []
    assert cute_glue.check_header(BLOCK_JOB, good_block_facts(BLOCK_JOB["export"])) == []
    assert cute_glue.check_header(FP8_JOB, good_facts(FP8_JOB["export"])), "the bf16 layout passed for fp8"
    assert cute_glue.check_header(JOB, good_fp8_facts(JOB["export"])), "the fp8 layout passed for bf16"
    assert cute_glue.check_header(BLOCK_JOB, good_fp8_facts(BLOCK_JOB["export"])), "scale vectors passed for block"
    assert cute_glue.check_header(FP8_JOB, good_block_facts(FP8_JOB["export"])), "scale matrices passed for fp8"


@pytest.mark.parametrize("mutate", [
    lambda f, n: f["tensor_structs"].__setitem__(f"{n}_Tensor_scale_a_t", ["void *data", "int32_t dynamic_shapes[1]"]),
    lambda f, n: f["tensor_structs"].pop(f"{n}_Tensor_scale_w_t"),
    lambda f, n: f.__setitem__("wrapper_args", "a, w, c, scale_w, scale_a, &ctas, &stream, &ret"),
    lambda f, n: f.__setitem__("wrapper_args", "a, w, c, scale_a, scale_w, &stream, &ret"),  # no grid cap
    lambda f, n: f.__setitem__("wrapper_nargs", 5),
])
def test_header_check_refuses_other_fp8_layouts(mutate):
    f = good_fp8_facts(FP8_JOB["export"])
    mutate(f, FP8_JOB["export"])
    assert cute_glue.check_header(FP8_JOB, f), "an unexpected layout was accepted"


@pytest.mark.parametrize("mutate", [
    lambda f, n: f["tensor_structs"].__setitem__(f"{n}_Tensor_a_t", ["void *data", "int64_t dynamic_shapes[2]",
                                                                       "int64_t dynamic_strides[1]"]),
    lambda f, n: f["tensor_structs"].__setitem__(f"{n}_Tensor_w_t", ["void *data", "int32_t dynamic_shapes[2]"]),
    lambda f, n: f["tensor_structs"].__setitem__(f"{n}_Tensor_c_t", ["void *data", "int32_t dynamic_shapes[1]",
                                                                       "int64_t dynamic_strides[1]"]),
    lambda f, n: f.__setitem__("wrapper_args", "a, w, c, stream, &ret"),
    lambda f, n: f.__setitem__("wrapper_args", "a, w, c, &stream, &ret"),  # the kernel takes no grid cap
    lambda f, n: f.__setitem__("ciface", None),
])
def test_header_check_refuses_other_layouts(mutate):
    f = good_facts(JOB["export"])
    mutate(f, JOB["export"])
    assert cute_glue.check_header(JOB, f), "an unexpected layout was accepted"


# ---------------------------------------------------------------- glue, compiled and run without a driver
STUB = r"""
#include <stdint.h>
/* stand-ins for one exported object: record what the glue passes */
typedef struct { void *data; int32_t shape[2]; int64_t stride[1]; } desc;
int init_calls, load_calls, launch_calls;
int32_t last_nargs, last_shapes[6], last_ctas;
int64_t last_strides[3];
void *last_ptrs[3], *last_stream;
void _mlir_P_cuda_init(void **a) { init_calls++; **(void ***)a[0] = (void *)0x1; **(int32_t **)((char *)a + 8) = 0; }
void _mlir_P_cuda_load_to_device(void **a) { load_calls++; **(int32_t **)((char *)a + 16) = 0; }
void _mlir_P__mlir_ciface_fn(void **args, int32_t n) {
    launch_calls++; last_nargs = n;
    for (int i = 0; i < 3; i++) {
        desc *d = (desc *)args[i];
        last_ptrs[i] = d->data; last_shapes[2 * i] = d->shape[0]; last_shapes[2 * i + 1] = d->shape[1];
        last_strides[i] = d->stride[0];
    }
    last_ctas = *(int32_t *)args[3];
    last_stream = *(void **)args[4];
    *(int32_t *)args[5] = 0;
}
"""
# a 'driver' that is always there; its current device (fake_device, -1: no context) has fake_sms[device] SMs
FAKE_DRIVER = r"""
int fake_device, fake_sms[2] = {132, 114};
int vkc_cute_driver_status(void) { return 0; }
int _cudaGetDevice(int *device) { if (fake_device < 0) return 201; *device = fake_device; return 0; }
int _cudaDeviceGetAttribute(int *value, int attr, int device) {
    if (attr != 16 || device < 0 || device > 1) return 1;
    *value = fake_sms[device];
    return 0;
}
"""
FAKE_STATE = "fake_device; fake_sms;"
STATE = ("init_calls; load_calls; launch_calls; last_nargs; last_shapes; last_strides; last_ptrs; last_stream; "
         "last_ctas; _cudaGetDevice;")


def _build(d: Path, shim: str) -> ctypes.CDLL:
    h = {"init": "_mlir_P_cuda_init", "load_to_device": "_mlir_P_cuda_load_to_device",
         "ciface": "_mlir_P__mlir_ciface_fn"}
    (d / "glue.c").write_text(cute_glue.generate([JOB], {JOB["base"]: SPECS[0].symbol}, {JOB["base"]: h}))
    (d / "stub.c").write_text(STUB)
    (d / "exports.map").write_text(cute_glue.version_script([SPECS[0].symbol]).replace(
        "local: *;", STATE.replace("_cudaGetDevice;", "_cudaGetDevice;" if shim == "real" else FAKE_STATE)
        + " local: *;"))
    src = REPO / cute_lane.SHIM_DIR
    if shim == "real":
        shim_src = [str(src / "vkc_cute_shim.c")]
    else:
        (d / "fake.c").write_text(FAKE_DRIVER)
        shim_src = ["fake.c"]
    flags = [f for f in cute_lane.CFLAGS if f != "-fvisibility=hidden"]  # the stubs' counters are read from here
    subprocess.run(["gcc", *flags, "-shared", f"-I{src}", "-Wl,--no-undefined",
                    "-Wl,--version-script=exports.map", "-o", "t.so", "glue.c", *shim_src, "stub.c"],
                   cwd=d, check=True)
    lib = ctypes.CDLL(str(d / "t.so"))
    fn = getattr(lib, SPECS[0].symbol)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_void_p]
    fn.restype = ctypes.c_int32
    return lib, fn


@pytest.fixture(scope="module")
def glue_real(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    return _build(tmp_path_factory.mktemp("glue_real"), "real")


@pytest.fixture(scope="module")
def glue_fake(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    return _build(tmp_path_factory.mktemp("glue_fake"), "fake")


def counter(lib, name):
    return ctypes.c_int.in_dll(lib, name).value


GOOD = (0x1000, 4096, 0x2000, 4096, 0x3000, 2048, 300, 2048, 4096, 0x77)


@pytest.mark.parametrize("i, value", [
    (0, 0), (0, 0x1008), (2, 0x2004), (4, 0x3001),                      # null / misaligned pointers
    (6, -1), (6, 2**31), (7, 2040 + 4), (7, 0), (8, 4100), (8, 0), (8, 2**31),  # m, n, k
    (1, 4095), (1, 4100), (3, 2048), (5, 2040), (5, 2**36), (1, -8),     # row strides
])
def test_glue_refuses_bad_arguments(glue_fake, i, value):
    lib, fn = glue_fake
    assert lib.vkc_cute_load(0) == 0
    before = counter(lib, "launch_calls")
    args = list(GOOD)
    args[i] = value
    assert fn(*args) == 1, (i, value)
    assert counter(lib, "launch_calls") == before


def test_glue_packs_descriptors(glue_fake):
    lib, fn = glue_fake
    assert lib.vkc_cute_load(0) == 0
    loads = counter(lib, "load_calls")
    assert lib.vkc_cute_load(0) == 0 and counter(lib, "load_calls") == loads  # idempotent per device
    assert lib.vkc_cute_load(1) == 0 and counter(lib, "load_calls") == loads + 1
    assert counter(lib, "init_calls") == 1  # the library once, whatever the device
    assert lib.vkc_cute_load(64) == 1 and lib.vkc_cute_load(-1) == 1
    assert fn(*GOOD) == 0
    assert counter(lib, "last_nargs") == 6 and counter(lib, "last_ctas") == 132   # the grid cap: device 0's SMs
    shapes = list((ctypes.c_int32 * 6).in_dll(lib, "last_shapes"))
    strides = list((ctypes.c_int64 * 3).in_dll(lib, "last_strides"))
    ptrs = list((ctypes.c_void_p * 3).in_dll(lib, "last_ptrs"))
    assert shapes == [300, 4096, 2048, 4096, 300, 2048]          # a [m, k], w [n, k], c [m, n]
    assert strides == [4096, 4096, 2048] and ptrs == [0x1000, 0x2000, 0x3000]
    assert ctypes.c_void_p.in_dll(lib, "last_stream").value == 0x77
    wide = (0x1000, 8192, 0x2000, 4104, 0x3000, 2304) + GOOD[6:]   # row strides wider than the rows
    assert fn(*wide) == 0 and list((ctypes.c_int64 * 3).in_dll(lib, "last_strides")) == [8192, 4104, 2304]
    n = counter(lib, "launch_calls")
    assert fn(0, 0, 0, 0, 0, 0, 0, 0, 0, None) == 0 and counter(lib, "launch_calls") == n  # m == 0: nothing


def test_glue_grid_cap_follows_the_current_device(glue_fake):
    lib, fn = glue_fake
    assert lib.vkc_cute_load(0) == 0 and lib.vkc_cute_load(1) == 0
    dev = ctypes.c_int.in_dll(lib, "fake_device")
    try:
        dev.value = 1
        assert fn(*GOOD) == 0 and counter(lib, "last_ctas") == 114      # device 1's SM count
        dev.value = 0
        assert fn(*GOOD) == 0 and counter(lib, "last_ctas") == 132
        n = counter(lib, "launch_calls")
        dev.value = -1                                                  # no current context: refused, no launch
        assert fn(*GOOD) == 3 and counter(lib, "launch_calls") == n
    finally:
        dev.value = 0


def test_glue_without_driver(glue_real):
    if _has_driver():
        pytest.skip("a CUDA driver is installed here")
    lib, fn = glue_real
    assert lib.vkc_cute_driver_status() == 3
    assert lib.vkc_cute_load(0) == 3
    assert counter(lib, "init_calls") == 0
    assert fn(*GOOD) == 3                          # valid, but nothing loaded
    bad = list(GOOD)
    bad[4] = 0x3002
    assert fn(*bad) == 1
    assert counter(lib, "launch_calls") == 0
    dev = ctypes.c_int(-7)
    assert lib._cudaGetDevice(ctypes.byref(dev)) == 3 and dev.value == -7


# ---------------------------------------------------------------- the gemm_fp8 launcher (fake driver)
FP8_STUB = r"""
#include <stdint.h>
typedef struct { void *data; int32_t shape[2]; int64_t stride[1]; } desc;
typedef struct { void *data; int32_t shape[1]; int64_t stride[1]; } vdesc;
int launch_calls;
int32_t last_nargs, last_shapes[8], last_ctas;
int64_t last_strides[5];
void *last_ptrs[5], *last_stream;
void _mlir_P_cuda_init(void **a) { **(void ***)a[0] = (void *)0x1; **(int32_t **)((char *)a + 8) = 0; }
void _mlir_P_cuda_load_to_device(void **a) { **(int32_t **)((char *)a + 16) = 0; }
void _mlir_P__mlir_ciface_fn(void **args, int32_t n) {
    launch_calls++; last_nargs = n;
    for (int i = 0; i < 3; i++) {
        desc *d = (desc *)args[i];
        last_ptrs[i] = d->data; last_shapes[2 * i] = d->shape[0]; last_shapes[2 * i + 1] = d->shape[1];
        last_strides[i] = d->stride[0];
    }
    for (int i = 3; i < 5; i++) {
        vdesc *d = (vdesc *)args[i];
        last_ptrs[i] = d->data; last_shapes[3 + i] = d->shape[0]; last_strides[i] = d->stride[0];
    }
    last_ctas = *(int32_t *)args[5];
    last_stream = *(void **)args[6];
    *(int32_t *)args[7] = 0;
}
"""


def build_scaled_glue(d, spec, stub):
    """The glue of one scaled-FP8 launcher (gemm_fp8 / gemm_fp8_block) linked with ``stub`` and the fake driver."""
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    job = spec.job_json()
    h = {"init": "_mlir_P_cuda_init", "load_to_device": "_mlir_P_cuda_load_to_device",
         "ciface": "_mlir_P__mlir_ciface_fn"}
    (d / "glue.c").write_text(cute_glue.generate([job], {job["base"]: spec.symbol}, {job["base"]: h}))
    (d / "stub.c").write_text(stub)
    (d / "fake.c").write_text(FAKE_DRIVER)
    (d / "exports.map").write_text(cute_glue.version_script([spec.symbol]).replace(
        "local: *;", "launch_calls; last_nargs; last_shapes; last_strides; last_ptrs; last_stream; last_ctas; "
        + FAKE_STATE + " local: *;"))
    flags = [f for f in cute_lane.CFLAGS if f != "-fvisibility=hidden"]
    subprocess.run(["gcc", *flags, "-shared", f"-I{REPO / cute_lane.SHIM_DIR}", "-Wl,--no-undefined",
                    "-Wl,--version-script=exports.map", "-o", "t.so", "glue.c", "fake.c", "stub.c"], cwd=d, check=True)
    lib = ctypes.CDLL(str(d / "t.so"))
    fn = getattr(lib, spec.symbol)
    P, I = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [P, I] * 5 + [I] * 3 + [P]
    fn.restype = ctypes.c_int32
    assert lib.vkc_cute_load(0) == 0
    return lib, fn


@pytest.fixture(scope="module")
def glue_fp8(tmp_path_factory):
    return build_scaled_glue(tmp_path_factory.mktemp("glue_fp8"), FP8, FP8_STUB)


FP8_GOOD = (0x1000, 4096, 0x2000, 4096, 0x3000, 2048, 0x4000, 1, 0x5004, 0, 300, 2048, 4096, 0x77)


@pytest.mark.parametrize("i, value", [
    (0, 0x1008), (2, 0x2004), (4, 0x3008),                    # fp8 / bf16 rows: 16-byte aligned
    (6, 0), (6, 0x4002), (8, 0), (8, 0x5001),                 # scale pointers: non-null, 4-byte aligned
    (7, -1), (9, -2), (7, 2**31), (7, 2**23),                 # steps: >= 0, last index (m - 1) * step < 2^31
    (12, 4104), (1, 4104), (3, 4104),                         # k, lda, ldw: multiples of 16 (fp8 TMA rows)
    (11, 2044), (5, 2044), (10, -1), (12, 0),                 # the bf16 rules still hold
])
def test_fp8_glue_refuses_bad_arguments(glue_fp8, i, value):
    lib, fn = glue_fp8
    before = counter(lib, "launch_calls")
    args = list(FP8_GOOD)
    args[i] = value
    assert fn(*args) == 1, (i, value)
    assert counter(lib, "launch_calls") == before


def test_fp8_glue_packs_descriptors(glue_fp8):
    lib, fn = glue_fp8
    assert fn(*FP8_GOOD) == 0
    assert counter(lib, "last_nargs") == 8 and counter(lib, "last_ctas") == 132
    shapes = list((ctypes.c_int32 * 8).in_dll(lib, "last_shapes"))
    strides = list((ctypes.c_int64 * 5).in_dll(lib, "last_strides"))
    ptrs = list((ctypes.c_void_p * 5).in_dll(lib, "last_ptrs"))
    assert shapes == [300, 4096, 2048, 4096, 300, 2048, 300, 2048]   # a, w, c, then sa [m] and sw [n]
    assert strides == [4096, 4096, 2048, 1, 0] and ptrs == [0x1000, 0x2000, 0x3000, 0x4000, 0x5004]
    assert ctypes.c_void_p.in_dll(lib, "last_stream").value == 0x77
    n = counter(lib, "launch_calls")
    big_step = list(FP8_GOOD)
    big_step[7] = (2**31 - 1) // 299                             # the largest step whose last index fits
    assert fn(*big_step) == 0 and counter(lib, "launch_calls") == n + 1
    assert fn(*([0] * 13 + [None])) == 0 and counter(lib, "launch_calls") == n + 1  # m == 0: nothing


# ---------------------------------------------------------------- the gemm_fp8_block launcher (fake driver)
# five row descriptors: a, w, c, sa [m, kb], sw [nb, kb]
BLOCK_STUB = FP8_STUB.replace("for (int i = 0; i < 3; i++)", "for (int i = 0; i < 5; i++)").replace(
    "last_shapes[8]", "last_shapes[10]").replace("""    for (int i = 3; i < 5; i++) {
        vdesc *d = (vdesc *)args[i];
        last_ptrs[i] = d->data; last_shapes[3 + i] = d->shape[0]; last_strides[i] = d->stride[0];
    }
""", "")


@pytest.fixture(scope="module")
def glue_block(tmp_path_factory):
    return build_scaled_glue(tmp_path_factory.mktemp("glue_block"), BLOCK, BLOCK_STUB)


# m = 300, n = 2048, k = 4000 (kb = 32, nb = 16): sa rows padded to 40, sw rows to 32
BLOCK_GOOD = (0x1000, 4096, 0x2000, 4096, 0x3000, 2048, 0x4000, 40, 0x5004, 32, 300, 2048, 4000, 0x77)


@pytest.mark.parametrize("i, value", [
    (0, 0x1008), (2, 0x2004), (4, 0x3008),                    # fp8 / bf16 rows: 16-byte aligned
    (6, 0), (6, 0x4002), (8, 0), (8, 0x5001),                 # scale pointers: non-null, 4-byte aligned
    (7, 31), (9, 31), (7, -1), (9, -40),                      # scale row strides: >= kb
    (7, 2**31), (7, 2**23), (9, 2**28),                       # (rows - 1) * ld + kb < 2^31
    (12, 4008), (1, 4104), (3, 4104),                         # k, lda, ldw: multiples of 16 (fp8 TMA rows)
    (11, 2044), (5, 2044), (10, -1), (12, 0),                 # the bf16 rules still hold
])
def test_block_glue_refuses_bad_arguments(glue_block, i, value):
    lib, fn = glue_block
    before = counter(lib, "launch_calls")
    args = list(BLOCK_GOOD)
    args[i] = value
    assert fn(*args) == 1, (i, value)
    assert counter(lib, "launch_calls") == before


def test_block_glue_packs_descriptors(glue_block):
    lib, fn = glue_block
    assert fn(*BLOCK_GOOD) == 0
    assert counter(lib, "last_nargs") == 8 and counter(lib, "last_ctas") == 132
    shapes = list((ctypes.c_int32 * 10).in_dll(lib, "last_shapes"))
    strides = list((ctypes.c_int64 * 5).in_dll(lib, "last_strides"))
    ptrs = list((ctypes.c_void_p * 5).in_dll(lib, "last_ptrs"))
    assert shapes == [300, 4000, 2048, 4000, 300, 2048, 300, 32, 16, 32]   # a, w, c, sa [m, kb], sw [nb, kb]
    assert strides == [4096, 4096, 2048, 40, 32] and ptrs == [0x1000, 0x2000, 0x3000, 0x4000, 0x5004]
    assert ctypes.c_void_p.in_dll(lib, "last_stream").value == 0x77
    n = counter(lib, "launch_calls")
    one_row = list(BLOCK_GOOD)
    one_row[10], one_row[7] = 1, 0                              # one activation row: its stride is never used
    assert fn(*one_row) == 0 and counter(lib, "launch_calls") == n + 1
    assert fn(*([0] * 13 + [None])) == 0 and counter(lib, "launch_calls") == n + 1  # m == 0: nothing


# ---------------------------------------------------------------- embedded cubin scanner
def fake_elf(machine: int, payload: bytes) -> bytes:
    """A minimal ELF64 image: header, payload, one null section header at the end."""
    shoff = 64 + len(payload)
    hdr = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    hdr += struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, shoff, 0x5a0d5a, 64, 56, 0, 64, 1, 0)
    return hdr + payload + bytes(64)


def test_image_size_reads_the_header_tables():
    cub1, cub2 = fake_elf(190, b"kernel-one" * 7), fake_elf(190, b"two" * 33)
    blob = fake_elf(62, b"host") + b"\x7fELFnoise" + cub1 + b"\0" * 13 + cub2 + b"tail"
    assert hostelf.image_size(blob, blob.find(cub1)) == len(cub1)
    assert hostelf.image_size(blob, blob.find(cub2)) == len(cub2)
    assert hostelf.image_size(cub2[:-10], 0) is None  # headers past the end


# ---------------------------------------------------------------- the committed artifact
DOC = json.loads((REPO / f"manifests/{ARCH}.json").read_text())
CUTE = {b: k for b, k in DOC["kernels"].items() if "artifacts" in k}


def test_committed_entries_match_the_specs():
    assert sorted(CUTE) == sorted(s.base for s in SPECS)
    dsl = DOC["toolchain"]["cutlass_dsl"]
    assert (dsl["version"], dsl["flavor"]) == ("4.8.1", "cu12") and set(dsl["hosts"]) == {"x86_64", "aarch64"}
    assert dsl["shim_sha256"] == cute_lane.shim_hashes(REPO)
    for s in SPECS:
        k = CUTE[s.base]
        assert [a["host_platform"] for a in k["artifacts"]] == list(layout.HOST_PLATFORMS)
        assert k["launch"]["symbol"] == s.symbol and k["launch"]["abi"] == s.abi
        assert k["launch"]["local"] == 0 and k["launch"]["stack"] == 0, "spills"
        for art in k["artifacts"]:
            so = hostelf.parse((REPO / art["path"]).read_bytes())
            assert so.exported == {*cute_lane.FIXED_SYMBOLS, *(x.symbol for x in SPECS)}
            assert set(so.needed) <= hostelf.ALLOWED_NEEDED
            assert {c.sm for c in so.cubins} == {90} and len(so.cubins) == len(SPECS)


def test_committed_artifact_loads_without_driver(monkeypatch):
    """The real .so dlopens here through the runtime's loader (its sha256 checked first; its NEEDED and symbol
    versions resolve) and refuses cleanly without a driver."""
    if _has_driver() or HOST is None:
        pytest.skip("a CUDA driver is installed here" if HOST else "unknown host platform")
    from vkc_runtime.artifacts import ArtifactSet
    from vkc_runtime.errors import ArtifactError
    from vkc_runtime.loaders import cute_so

    aset = ArtifactSet(REPO, ARCH)
    k = cute_so.CuteKernel(SPECS[0].base, aset, ctx=0, device=0)
    assert k.art["host_platform"] == HOST and not k.loaded
    lib = cute_so.library(aset.path(SPECS[0].base), k.art)
    assert lib.lib.vkc_cute_driver_status() == 3
    with pytest.raises(ArtifactError, match="vkc_cute_load\\(0\\) failed: 3"):
        k.load()
    fn = lib.function(SPECS[0].symbol, "gemm_bf16")
    assert fn(*GOOD) == 3
    bad = list(GOOD)
    bad[7] = 12
    assert fn(*bad) == 1


def test_loader_checks_sha256_before_dlopen(tmp_path):
    from vkc_contract.hashing import IntegrityError
    from vkc_runtime.loaders import cute_so

    art = CUTE[SPECS[0].base]["artifacts"][0]
    bad = tmp_path / "gemm.so"
    data = bytearray((REPO / art["path"]).read_bytes())
    data[len(data) // 2] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="does not match its manifest"):
        cute_so.CuteLibrary(bad, art["sha256"], art["size"])


# ---------------------------------------------------------------- regen: loud without a DSL, reproducible with one
def test_regen_without_dsl_fails_loudly(monkeypatch, tmp_path):
    monkeypatch.setenv(cute_lane.ENV_PYTHON, str(tmp_path / "no-such-python"))
    with pytest.raises(cute_lane.CuteLaneError, match="make cute-env"):
        cute_lane.dsl_python(REPO)
    from vkc.regen import RegenError, regen

    root = make_tree(tmp_path / "tree")  # aot/, contract/, runtime/, the selftest family
    shutil.copytree(REPO / "kernels_src/gemm", root / "kernels_src/gemm", ignore=shutil.ignore_patterns("__pycache__"))
    with pytest.raises(RegenError, match="sm_90a: no CuTe DSL interpreter"):
        regen(root, ["sm_80", ARCH], jobs=1)
    assert not (root / "vendored").exists() and sorted(p.name for p in (root / "manifests").iterdir()) == [
        "schema.json"]


def _copy_inputs(dst: Path) -> Path:
    shutil.copytree(REPO / "kernels_src", dst / "kernels_src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / cute_lane.SHIM_DIR, dst / cute_lane.SHIM_DIR)
    return dst


@pytest.mark.skipif(_dsl() is None or not shutil.which("aarch64-linux-gnu-gcc"),
                    reason="needs the CuTe DSL (make cute-env or VKC_CUTE_PYTHON) and aarch64-linux-gnu-gcc")
def test_lane_is_byte_identical_from_two_directories(tmp_path):
    builds = []
    for where in (tmp_path / "a", tmp_path / "b" / "much" / "deeper"):
        root = _copy_inputs(where)
        specs = discover.cute_specs_for_arch(root, ARCH)
        deps = {s.base: discover.source_deps(root, s.family, s.source) for s in specs}
        builds.append(cute_lane.build_arch(root, ARCH, specs, deps, _dsl()))
    a, b = builds
    assert a.files == b.files and a.kernels == b.kernels and a.toolchain == b.toolchain
    for rel, data in a.files.items():
        assert data == (REPO / rel).read_bytes(), f"{rel} differs from the committed bytes"
        assert str(tmp_path).encode() not in data
    assert manifest.canonical(a.kernels) == manifest.canonical(CUTE)
    assert a.toolchain == DOC["toolchain"]["cutlass_dsl"]
