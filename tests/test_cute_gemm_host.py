"""CPU checks of the CuTe GEMM lane's host side: the ctypes call planner, the generated C glue + driver shim
(compiled here with gcc against stand-ins for the DSL's exported entry points, run without a driver), the
embedded-cubin scanner, and, when a built artifact is at hand (env VKC_CUTE_SO), its recorded facts."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from kernels_src.gemm import variants
from tools.cute import elfinfo, glue
from tools.cute.gemm_lib import Variant, pick_variant, plan_call

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
V = variants.GemmVariant("sm_90a", 2048, 4096)
V128 = variants.GemmVariant("sm_90a", 2048, 4096, tile_n=128, stages=6)
TABLE = {(V.n, V.k): [Variant(V.symbol, 128, 256), Variant(V128.symbol, 128, 128)]}


def aligned(*shape):
    """A CPU bf16 tensor whose data pointer is 16-byte aligned (offset into a larger buffer as needed)."""
    n = 1
    for s in shape:
        n *= s
    buf = torch.randn(n + 8).to(torch.bfloat16)
    off = (-buf.data_ptr() % 16) // 2
    return buf[off:off + n].view(*shape)


# ---------------------------------------------------------------- plan_call
def test_plan_accepts_dense_aligned_operands():
    a, w, c = aligned(5, 4096), aligned(2048, 4096), aligned(5, 2048)
    call = plan_call(a, w, c, TABLE, require_cuda=False)
    # M = 5: 8 wide tiles or 16 narrow ones on 132 SMs: the narrow tile
    assert (call.symbol, call.a, call.w, call.c, call.m) == (V128.symbol, a.data_ptr(), w.data_ptr(), c.data_ptr(), 5)
    forced = plan_call(a, w, c, TABLE, symbol=V.symbol, require_cuda=False)
    assert forced.symbol == V.symbol
    with pytest.raises(ValueError, match="not a kernel"):
        plan_call(a, w, c, TABLE, symbol="vkc_cute_other", require_cuda=False)


def test_pick_variant_by_wave_efficiency():
    wide, narrow = Variant("w", 128, 256), Variant("n", 128, 128)
    # M=2048, N=5120 on 132 SMs: 320 wide tiles (3 waves, 81%) vs 640 narrow (5 waves, 97%)
    assert pick_variant(2048, 5120, [wide, narrow], 132) is narrow
    # M=8192, N=34816: 8704 wide tiles, 66 waves at 99.9%: the wide tile
    assert pick_variant(8192, 34816, [wide, narrow], 132) is wide
    assert pick_variant(1, 2048, [narrow], 132) is narrow


@pytest.mark.parametrize("case,match", [
    ("dtype", "bfloat16"), ("ndim", "2-D"), ("strided", "contiguous"), ("misaligned", "aligned"),
    ("k", "K mismatch"), ("out_shape", "out: expected shape"), ("no_variant", "no kernel"), ("overlap", "overlaps"),
])
def test_plan_refuses(case, match):
    a, w, c = aligned(5, 4096), aligned(2048, 4096), aligned(5, 2048)
    if case == "dtype":
        a = a.float()
    elif case == "ndim":
        a = a.view(5, 64, 64)
    elif case == "strided":
        a = aligned(5, 8192)[:, ::2]
    elif case == "misaligned":
        big = aligned(5 * 4096 + 8)
        a = big[1:5 * 4096 + 1].view(5, 4096)
    elif case == "k":
        a = aligned(5, 4104)
    elif case == "out_shape":
        c = aligned(6, 2048)
    elif case == "no_variant":
        a, w, c = aligned(5, 4104), aligned(2048, 4104), aligned(5, 2048)
    elif case == "overlap":
        big = aligned(5 * 4096 + 5 * 2048)
        a, c = big[:5 * 4096].view(5, 4096), big[5 * 4096 - 8:5 * 4096 - 8 + 5 * 2048].view(5, 2048)
    with pytest.raises(ValueError, match=match):
        plan_call(a, w, c, TABLE, require_cuda=False)


def test_plan_requires_cuda_by_default():
    with pytest.raises(ValueError, match="CUDA"):
        plan_call(aligned(5, 4096), aligned(2048, 4096), aligned(5, 2048), TABLE)


# ---------------------------------------------------------------- header check
def good_facts(name):
    return {
        "tensor_structs": {f"{name}_Tensor_a_t": ["void *data", "int32_t dynamic_shapes[1]"],
                           f"{name}_Tensor_w_t": ["void *data"],
                           f"{name}_Tensor_c_t": ["void *data", "int32_t dynamic_shapes[1]"]},
        "ciface": f"_mlir_{name}__mlir_ciface_fn", "init": f"_mlir_{name}_cuda_init",
        "load_to_device": f"_mlir_{name}_cuda_load_to_device",
        "wrapper_args": "a, w, c, &stream, &ret", "wrapper_nargs": 5,
    }


def test_header_check_accepts_the_expected_layout():
    glue.check_header(V, good_facts(V.name))


@pytest.mark.parametrize("mutate", [
    lambda f: f["tensor_structs"].__setitem__(f"{V.name}_Tensor_a_t", ["void *data", "int64_t dynamic_shapes[1]"]),
    lambda f: f["tensor_structs"].__setitem__(f"{V.name}_Tensor_w_t", ["void *data", "int64_t dynamic_strides[1]"]),
    lambda f: f.__setitem__("wrapper_args", "a, w, c, stream, &ret"),
    lambda f: f.__setitem__("ciface", None),
])
def test_header_check_refuses_other_layouts(mutate):
    f = good_facts(V.name)
    mutate(f)
    with pytest.raises(SystemExit):
        glue.check_header(V, f)


# ---------------------------------------------------------------- glue + shim, compiled and run without a driver
STUB = r"""
#include <stdint.h>
/* stand-ins for one exported object: record what the glue passes */
int init_calls, load_calls, launch_calls;
int32_t last_m, last_nargs;
void _mlir_P_cuda_init(void **a) { init_calls++; **(int32_t **)((char *)a + 8) = 0; }
void _mlir_P_cuda_load_to_device(void **a) { load_calls++; **(int32_t **)((char *)a + 16) = 0; }
void _mlir_P__mlir_ciface_fn(void **args, int32_t n) {
    launch_calls++; last_nargs = n; last_m = ((int32_t *)((char *)args[0] + 8))[0]; *(int32_t *)args[4] = 0;
}
"""


@pytest.fixture(scope="module")
def glue_so(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    d = tmp_path_factory.mktemp("glue")
    v = variants.GemmVariant("sm_90a", 2048, 4096)
    h = {"init": "_mlir_P_cuda_init", "load_to_device": "_mlir_P_cuda_load_to_device",
         "ciface": "_mlir_P__mlir_ciface_fn"}
    (d / "glue.c").write_text(glue.generate([v], {v.name: h}))
    (d / "stub.c").write_text(STUB)
    (d / "exports.map").write_text(glue.version_script([v]).replace("local: *;", "init_calls; load_calls; "
                                                                   "launch_calls; last_m; _cudaGetDevice; local: *;"))
    shim = ROOT / "csrc" / "cute_shim"
    subprocess.run(["gcc", "-std=c11", "-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-shared", f"-I{shim}",
                    "-Wl,--no-undefined", "-Wl,--version-script=exports.map", "-o", "t.so", "glue.c",
                    str(shim / "vkc_cute_shim.c"), "stub.c"], cwd=d, check=True)
    lib = ctypes.CDLL(str(d / "t.so"))
    fn = getattr(lib, v.symbol)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_int32
    return lib, fn


def counter(lib, name):
    return ctypes.c_int.in_dll(lib, name).value


def test_glue_without_driver(glue_so):
    lib, fn = glue_so
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed here")
    except OSError:
        pass
    assert lib.vkc_cute_driver_status() == 3
    assert lib.vkc_cute_load(0) == 3
    assert counter(lib, "init_calls") == 0
    assert fn(16, 32, 48, 16, None) == 3           # aligned, valid: not loaded
    assert fn(16, 32, 50, 16, None) == 1           # misaligned out
    assert fn(0, 32, 48, 16, None) == 1            # null a
    assert fn(16, 32, 48, -1, None) == 1
    assert fn(16, 32, 48, 2**31, None) == 1
    assert fn(0, 0, 0, 0, None) == 0               # M = 0: nothing to do
    assert counter(lib, "launch_calls") == 0


def test_shim_entry_points_report_missing_driver(glue_so):
    lib, _ = glue_so
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed here")
    except OSError:
        pass
    dev = ctypes.c_int(-7)
    assert lib._cudaGetDevice(ctypes.byref(dev)) == 3 and dev.value == -7


# ---------------------------------------------------------------- embedded cubin scanner
def fake_elf(machine: int, payload: bytes) -> bytes:
    """A minimal ELF64 image: header, payload, one null section header at the end."""
    shoff = 64 + len(payload)
    hdr = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    hdr += struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, shoff, 0x5a0d5a, 64, 56, 0, 64, 1, 0)
    return hdr + payload + bytes(64)


def test_embedded_cubins_found_exactly():
    cub1, cub2 = fake_elf(190, b"kernel-one" * 7), fake_elf(190, b"two" * 33)
    host_like = fake_elf(62, b"host")
    blob = host_like + b"\x7fELFnoise" + cub1 + b"\0" * 13 + cub2 + b"tail"
    assert elfinfo.embedded_cubins(blob) == [cub1, cub2]


# ---------------------------------------------------------------- a built artifact, if one is named
ARTIFACT = os.environ.get("VKC_CUTE_SO", "")


@pytest.mark.skipif(not ARTIFACT or not Path(ARTIFACT).is_file(), reason="VKC_CUTE_SO names no built artifact")
def test_artifact_facts_reread(tmp_path):
    so = Path(ARTIFACT)
    info = json.loads(so.with_suffix(".json").read_text())
    assert elfinfo.check_artifact(so, info) == []
    cubins = elfinfo.embedded_cubins(so.read_bytes())
    assert all(k["local"] == 0 for c in elfinfo.so_facts(so, cubins)["cubins"] for k in c["kernels"]), "spills"
    # a flipped byte inside one embedded cubin, and a wrong recorded arch, are both caught
    data = bytearray(so.read_bytes())
    at = data.find(cubins[0]) + len(cubins[0]) // 2
    data[at] ^= 0xFF
    bad = tmp_path / so.name
    bad.write_bytes(bytes(data))
    problems = elfinfo.check_artifact(bad, info)
    assert any("sha256" in p for p in problems) and any("embedded cubins" in p for p in problems), problems
    assert any("SASS arch" in p for p in elfinfo.check_artifact(so, dict(info, arch="sm_100a")))


@pytest.mark.skipif(not ARTIFACT or not Path(ARTIFACT).is_file(), reason="VKC_CUTE_SO names no built artifact")
def test_artifact_loads_without_driver():
    """The real artifact dlopens here (its NEEDED and symbol versions resolve) and refuses cleanly."""
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed here")
    except OSError:
        pass
    from tools.cute.gemm_lib import CuteGemmError, CuteGemmLib
    machine = json.loads(Path(ARTIFACT).with_suffix(".json").read_text())["elf_machine"]
    if machine != os.uname().machine:
        pytest.skip(f"artifact for {machine}")
    lib = CuteGemmLib(ARTIFACT)
    assert lib.lib.vkc_cute_driver_status() == 3
    with pytest.raises(CuteGemmError, match="NOT_INITIALIZED"):
        lib.load(0)
    for v in lib.info["variants"]:
        fn = lib.fns[v["symbol"]]
        assert fn(16, 32, 48, 7, None) == 3
        assert fn(16, 33, 48, 7, None) == 1
