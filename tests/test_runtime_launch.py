"""Packing, Kernel loading and launching with the driver mocked at the boundary (CPU)."""
from __future__ import annotations

import ctypes
import math
import os
import random
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from vkc_contract import abi
from vkc_runtime import artifacts, bound, driver, kernels, loaders, native, pack, scratch
from vkc_runtime.loaders.triton_cubin import Kernel
from vkc_runtime.errors import ArtifactError, CudaError, LaunchError, MissingKernelError
from vkc_contract.hashing import IntegrityError

try:
    from .runtime_support import (no_real_driver, FakeCu, add_kernel, build_fake_libcuda, clean_env, fake_cu,  # noqa: F401
                                  make_root, native_module)
except ImportError:  # tests/ not a package
    from runtime_support import (no_real_driver, FakeCu, add_kernel, build_fake_libcuda, clean_env, fake_cu,  # noqa: F401
                                 make_root, native_module)

NATIVE = native_module()
needs_native = pytest.mark.skipif(NATIVE is None, reason=f"native module not built: {native.native_reason()}")


@pytest.fixture(autouse=True)
def _env(clean_env):
    yield clean_env


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ----------------------------------------------------------------------------------- Python packer
def test_widths_and_fp32_is_four_bytes():
    assert len(pack.pack_args("f", [0.1])) == 4
    assert struct.unpack("<f", pack.pack_args("f", [0.1]))[0] == float(np.float32(0.1))
    assert pack.pack_args("f", [0.1]) == np.float32(0.1).tobytes()
    assert len(pack.pack_args("?", [True])) == 1 and pack.pack_args("?", [True]) == b"\x01"
    assert pack.pack_args("?", [0]) == b"\x00" and pack.pack_args("?", [7]) == b"\x01"
    assert pack.pack_args("p", [0x1234]) == (0x1234).to_bytes(8, "little")
    assert pack.pack_args("p", [None]) == bytes(8)
    assert pack.pack_args("i", [-2]) == b"\xfe\xff\xff\xff"
    assert pack.pack_args("d", [0.1]) == struct.pack("<d", 0.1)
    assert pack.pack_args("e", [0.1]) == np.float16(0.1).tobytes()
    for code, size in abi.PACK_SIZES.items():
        val = 1.0 if code in "eEfd" else 1
        assert len(pack.pack_args(code, [val])) == size, code


def test_layout_aligns_each_param_to_its_size():
    assert pack.param_layout("?p") == ([0, 8], 16)
    assert pack.param_layout("pifpp") == ([0, 8, 12, 16, 24], 32)
    assert pack.param_layout("?E?f?q") == ([0, 2, 4, 8, 12, 16], 24)
    b = pack.pack_args("?p", [True, 0xABCDEF])
    assert b == b"\x01" + bytes(7) + (0xABCDEF).to_bytes(8, "little")


@pytest.mark.parametrize("x,bits", [
    (1.0, 0x3F80), (-2.0, 0xC000), (0.0, 0x0000), (-0.0, 0x8000),
    (1.00390625, 0x3F80),              # 1 + 2^-8: exactly halfway, ties to even (down)
    (1.01171875, 0x3F82),              # 1 + 3*2^-8: halfway, ties to even (up)
    (1.00390625 + 2**-20, 0x3F81),     # just above halfway: up
    (1.0078125, 0x3F81),               # exactly representable
    (math.inf, 0x7F80), (-math.inf, 0xFF80),
    (3.4e38, 0x7F80),                  # finite float32 that rounds to bf16 inf
    (1e-40, 0x0001),                   # float32 subnormal 0x000116C2 -> rounds to 0x0001
    (0.1, 0x3DCD),
])
def test_bf16_round_to_nearest_even(x, bits):
    assert pack.bf16_bits(x) == bits
    assert pack.pack_args("E", [x]) == bits.to_bytes(2, "little")


def test_bf16_nan_stays_quiet_nan():
    b = pack.bf16_bits(math.nan)
    assert (b & 0x7F80) == 0x7F80 and (b & 0x7F) != 0 and (b & 0x40)
    assert pack.bf16_bits(struct.unpack("<f", struct.pack("<I", 0x7F800001))[0]) & 0x7F  # signalling NaN stays NaN


@pytest.mark.parametrize("code,value,exc", [
    ("i", 2**31, ValueError), ("i", -2**31 - 1, ValueError), ("i", 1.5, TypeError), ("i", "3", TypeError),
    ("b", 128, ValueError), ("B", -1, ValueError), ("H", 65536, ValueError), ("I", 2**32, ValueError),
    ("q", 2**63, ValueError), ("Q", 2**64, ValueError), ("p", -1, ValueError), ("p", 2**64, ValueError),
    ("p", 1.0, TypeError), ("?", 0.5, TypeError), ("f", "1.0", TypeError), ("f", 1e39, ValueError),
    ("E", 1e39, ValueError), ("e", 70000.0, ValueError), ("d", None, TypeError), ("f", b"x", TypeError),
    ("f", 10**400, ValueError),
])
def test_packer_rejects(code, value, exc):
    with pytest.raises(exc, match=r"argument '#0'"):
        pack.pack_args(code, [value])


def test_packer_accepts_index_and_float_likes():
    assert pack.pack_args("i", [np.int64(7)]) == (7).to_bytes(4, "little")
    assert pack.pack_args("f", [np.float32(0.5)]) == struct.pack("<f", 0.5)
    assert pack.pack_args("f", [3]) == struct.pack("<f", 3.0)
    assert pack.pack_args("Q", [2**64 - 1]) == b"\xff" * 8
    assert pack.pack_args("f", [math.inf]) == struct.pack("<f", math.inf)


def test_divisibility_promises_are_checked():
    params = [{"name": "x", "code": "p", "divisibility": 16}, {"name": "n", "code": "i", "divisibility": 16},
              {"name": "m", "code": "q", "divisibility": 16}]
    assert len(pack.pack_args(params, [0x1000, 32, -16], kernel="k")) == 24
    with pytest.raises(ValueError, match=r"k: argument 'x' = 0x1008 is not 16-byte aligned"):
        pack.pack_args(params, [0x1008, 32, 0], kernel="k")
    with pytest.raises(ValueError, match=r"k: argument 'n' = 17 is not a multiple of 16"):
        pack.pack_args(params, [0x1000, 17, 0], kernel="k")
    with pytest.raises(ValueError, match=r"argument 'm' = -8 is not a multiple of 16"):
        pack.pack_args(params, [0x1000, 16, -8], kernel="k")
    with pytest.raises(TypeError, match="expected 3 values, got 2"):
        pack.pack_args(params, [0x1000, 16], kernel="k")


def test_param_buffer_pointer_array():
    pb = pack.ParamBuffer("?pf")
    conv = [1, 0xDEAD0, 0.25]
    pb.fill(conv)
    assert pb.raw() == pack.pack_args("?pf", [True, 0xDEAD0, 0.25])
    base = ctypes.cast(pb._buf, ctypes.c_void_p).value
    assert pb.pointers() == [base + 0, base + 8, base + 16]
    arr = (ctypes.c_void_p * 3).from_address(pb.address)
    assert [arr[i] for i in range(3)] == pb.pointers()


# ----------------------------------------------------------------------------------- native == Python
def _random_value(rng: random.Random, code: str):
    if code == "p":
        return rng.choice([None, 0, rng.randrange(0, 2**64), rng.randrange(0, 2**48) * 16])
    if code == "?":
        return rng.choice([True, False, 0, 1, 5])
    if code in "bBhHiIqQ":
        lo, hi = pack._INT_RANGE[code]
        return rng.choice([lo, hi, 0, rng.randint(lo, hi)])
    if code == "e":
        return rng.choice([0.0, -0.0, 65504.0, 1e-8, math.inf, rng.uniform(-60000, 60000)])
    if code in "Ef":
        return rng.choice([0.1, -0.0, math.inf, -math.inf, 3.4e38, 1e-45, rng.uniform(-1e6, 1e6),
                           rng.uniform(-1, 1), float(rng.randint(-5, 5)), np.float32(2.5)])
    return rng.choice([rng.uniform(-1e300, 1e300), 0.1, -0.0, math.inf, 5])


@needs_native
def test_native_pack_matches_python_byte_for_byte():
    rng = random.Random(1234)
    codes_all = sorted(abi.PACK_CODES)
    for _ in range(500):
        codes = "".join(rng.choice(codes_all) for _ in range(rng.randint(0, 24)))
        vals = tuple(_random_value(rng, c) for c in codes)
        py = pack.pack_args(codes, vals)
        nat = NATIVE.pack(codes, vals)
        assert nat == py, (codes, vals)
        assert NATIVE.layout(codes) == tuple(pack.param_layout(codes))
    # NaN bits are compared too (quiet NaN for bf16, PyFloat_Pack semantics for fp16)
    for code in "eEfd":
        assert NATIVE.pack(code, (math.nan,)) == pack.pack_args(code, [math.nan])


@needs_native
@pytest.mark.parametrize("code,value", [
    ("i", 2**31), ("i", 1.5), ("i", "3"), ("b", 128), ("B", -1), ("Q", 2**64), ("q", -2**63 - 1), ("p", -1),
    ("p", 1.0), ("?", 0.5), ("f", "1.0"), ("f", 1e39), ("E", -1e39), ("e", 70000.0), ("d", None),
    ("f", 10**400), ("p", "0x10"),
])
def test_native_pack_raises_like_python(code, value):
    with pytest.raises(Exception) as py_e:
        pack.pack_args(code, [value])
    with pytest.raises(Exception) as nat_e:
        NATIVE.pack(code, (value,))
    assert type(nat_e.value) is type(py_e.value), (nat_e.value, py_e.value)
    assert "argument '#0'" in str(nat_e.value)


# ----------------------------------------------------------------------------------- Kernel with a fake driver
def _kernel(root: Path, base="norm.k", arch="sm_90a", ctx=0xC0C0) -> Kernel:
    aset = artifacts.ArtifactSet(root, arch)
    return Kernel(base, aset.launch_spec(base), aset, ctx, 0)


def test_sha_mismatch_refused_before_module_load(tmp_path, fake_cu):
    root = make_root(tmp_path, bases=("norm.k",), data=b"C" * 100)
    k = _kernel(root)
    k.artifacts.path("norm.k").write_bytes(b"D" * 100)
    with pytest.raises(IntegrityError, match="expected sha256"):
        k.launch(1, (0x1000, 1, 1.0))
    assert "cuModuleLoadData" not in fake_cu.names()
    assert fake_cu.loaded == []


def test_load_uses_manifest_bytes_and_entry_name(tmp_path, fake_cu):
    root = make_root(tmp_path, bases=("norm.k",), data=b"cubin-bytes", entry="my_entry")
    fake_cu.current = 0xC0C0
    k = _kernel(root)
    k.load()
    assert fake_cu.loaded == [b"cubin-bytes"]
    assert fake_cu.calls("cuModuleGetFunction")[0][1] == b"my_entry"
    assert "cuCtxPushCurrent" not in fake_cu.names()


def test_load_pushes_the_kernel_context_when_another_is_current(tmp_path, fake_cu):
    root = make_root(tmp_path, bases=("norm.k",))
    fake_cu.current = 0x9999
    _kernel(root, ctx=0xC0C0).load()
    assert fake_cu.calls("cuCtxPushCurrent") == [(0xC0C0,)]
    assert fake_cu.current == 0x9999


@pytest.mark.parametrize("shared,expect_set", [(0, False), (49152, False), (49153, True), (200 * 1024, True)])
def test_smem_attribute_only_above_48k(tmp_path, fake_cu, shared, expect_set):
    root = make_root(tmp_path, bases=("norm.k",), shared=shared)
    fake_cu.current = 0xC0C0
    _kernel(root).load()
    sets = [c for c in fake_cu.calls("cuFuncSetAttribute")
            if c[1] == int(driver.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)]
    assert sets == ([(sets[0][0], sets[0][1], shared)] if expect_set else [])


def test_smem_beyond_device_optin_is_a_clear_error(tmp_path, fake_cu):
    fake_cu.optin = 99 * 1024
    fake_cu.static_smem = 1024
    root = make_root(tmp_path, bases=("norm.k",), shared=99 * 1024)
    fake_cu.current = 0xC0C0
    with pytest.raises(LaunchError, match=r"needs 101376 bytes of dynamic shared memory \(\+1024 static\).*"
                                          r"at most 101376"):
        _kernel(root).load()


def test_too_many_threads_for_function(tmp_path, fake_cu):
    fake_cu.max_threads = 128
    root = make_root(tmp_path, bases=("norm.k",), num_warps=8)
    fake_cu.current = 0xC0C0
    with pytest.raises(LaunchError, match="needs 256 threads per block"):
        _kernel(root).load()


def test_profile_scratch_and_non_cubin_refused(tmp_path, fake_cu):
    root = make_root(tmp_path, bases=("norm.k",))
    aset = artifacts.ArtifactSet(root, "sm_90a")
    aset.kernels["norm.k"]["launch"]["profile_scratch_size"] = 64
    k = Kernel("norm.k", aset.launch_spec("norm.k"), aset, 0xC0C0)
    with pytest.raises(ArtifactError, match="profile_scratch_size"):
        k.load()
    add_kernel(root, "sm_90a", "cute.gemm", suffix=".so")
    k = _kernel(root, "cute.gemm")
    with pytest.raises(ArtifactError, match="not a .cubin"):
        k.load()


@pytest.fixture(params=["python", "native"])
def launcher_kind(request, clean_env):
    if request.param == "native":
        if NATIVE is None:
            pytest.skip(f"native module not built: {native.native_reason()}")
    else:
        clean_env.setenv("VKC_NATIVE", "0")
    return request.param


def test_arg_count_and_grid_errors(tmp_path, fake_cu, launcher_kind):
    root = make_root(tmp_path, bases=("norm.k",), num_ctas=2)
    fake_cu.current = 0xC0C0
    k = _kernel(root)
    with pytest.raises(TypeError, match=r"norm.k takes 3 arguments \(x, n_cols, eps\), got 2"):
        k.launch(1, (0x1000, 1))
    with pytest.raises(LaunchError, match="exceeds the CUDA limits"):
        k.launch((2**30, 1, 1), (0x1000, 1, 1.0))  # 2^30 * num_ctas 2 = 2^31
    with pytest.raises(LaunchError, match="exceeds the CUDA limits"):
        k.launch((1, 65536, 1), (0x1000, 1, 1.0))
    with pytest.raises(LaunchError, match="exceeds the CUDA limits"):
        k.launch((1, 1, 65536), (0x1000, 1, 1.0))
    with pytest.raises(LaunchError, match="negative grid"):
        k.launch((-1, 1, 1), (0x1000, 1, 1.0))
    with pytest.raises(ValueError, match=r"norm.k: argument 'x' = 0x1004 is not 16-byte aligned"):
        k.launch(1, (0x1004, 1, 1.0))
    assert isinstance(LaunchError("x"), ValueError)
    k.launch((0, 4, 4), (0x1000, 1, 1.0))  # empty grid: a no-op
    assert "cuLaunchKernel" not in fake_cu.names() and "cuLaunchKernelEx" not in fake_cu.names()
    assert k.native == (launcher_kind == "native")


def test_python_fallback_launch_packs_and_passes_void_pp(tmp_path, fake_cu, clean_env):
    clean_env.setenv("VKC_NATIVE", "0")
    root = make_root(tmp_path, bases=("norm.k",), shared=1024, num_warps=8)
    fake_cu.current = 0xC0C0
    fake_cu.param_sizes = [8, 4, 4, 8, 8]
    k = _kernel(root)
    k.launch((3, 2), (0x7000, 1234, 0.1), stream=0x55)
    (l,) = fake_cu.launches
    assert l["kind"] == "plain" and l["grid"] == (3, 2, 1) and l["block"] == (256, 1, 1)
    assert (l["shared"], l["stream"]) == (1024, 0x55)
    assert l["params"] == [(0x7000).to_bytes(8, "little"), (1234).to_bytes(4, "little"),
                           np.float32(0.1).tobytes(), bytes(8), bytes(8)]
    assert not k.native


def test_python_fallback_cluster_pdl_coop_attributes(tmp_path, fake_cu, clean_env):
    clean_env.setenv("VKC_NATIVE", "0")
    root = make_root(tmp_path, bases=("norm.k",), num_ctas=2, pdl=True, coop=True)
    fake_cu.current = 0xC0C0
    k = _kernel(root)
    k.launch((5, 1, 1), (0x7000, 1, 1.0), stream=7)
    (l,) = fake_cu.launches
    ids = driver.cu.CUlaunchAttributeID
    assert l["kind"] == "ex" and l["grid"] == (10, 1, 1) and l["stream"] == 7
    got = [i for i, _ in l["attrs"]]
    assert got == [int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION),
                   int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE),
                   int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION),
                   int(ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE)]
    cd = l["attrs"][0][1].value.clusterDim
    assert (cd.x, cd.y, cd.z) == (2, 1, 1)
    assert struct.unpack_from("<7I", l["raw"]) == (10, 1, 1, 128, 1, 1, 0)


@pytest.mark.parametrize("env", ["1", "0"])
def test_pdl_attribute_and_its_switch(tmp_path, fake_cu, clean_env, env):
    """A launch_pdl kernel gets the programmatic-serialization attribute; VKC_PDL=0 drops it (plain launch)."""
    clean_env.setenv("VKC_NATIVE", "0")
    clean_env.setenv("VKC_PDL", env)
    root = make_root(tmp_path, bases=("norm.k",), pdl=True)
    fake_cu.current = 0xC0C0
    _kernel(root).launch(3, (0x7000, 1, 1.0), stream=7)
    (l,) = fake_cu.launches
    ids = driver.cu.CUlaunchAttributeID
    if env == "1":
        assert l["kind"] == "ex" and [i for i, _ in l["attrs"]] == [
            int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)]
        assert l["attrs"][0][1].value.programmaticStreamSerializationAllowed == 1
    else:
        assert l["kind"] == "plain" and l["grid"] == (3, 1, 1)


def test_python_fallback_cuda_error(tmp_path, fake_cu, clean_env):
    clean_env.setenv("VKC_NATIVE", "0")
    root = make_root(tmp_path, bases=("norm.k",))
    fake_cu.current = 0xC0C0
    fake_cu.launch_result = driver.cu.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError) as ei:
        _kernel(root).launch(1, (0x7000, 1, 1.0))
    e = ei.value
    assert (e.name, e.code, e.call) == ("CUDA_ERROR_INVALID_VALUE", 1, "cuLaunchKernel")
    assert str(e).startswith("cuLaunchKernel: CUDA_ERROR_INVALID_VALUE (1): kernel norm.k grid=(1, 1, 1)")


def test_get_kernel_caches_per_context_and_arch(tmp_path, fake_cu, clean_env):
    root = make_root(tmp_path, bases=("norm.k", "norm.j"), constexprs={"BLOCK": 2048})
    clean_env.setenv("VKC_ARTIFACT_ROOT", str(root))
    k1 = kernels.get_kernel("norm.k")
    assert fake_cu.calls("cuDevicePrimaryCtxRetain") == [(0,)] and fake_cu.current == fake_cu.primary
    assert kernels.get_kernel("norm.k") is k1
    assert kernels.get_kernel("norm.j") is not k1
    assert (k1.ctx, k1.arch, k1.loaded) == (fake_cu.primary, "sm_90a", False)  # lazy
    assert k1.param_names == ["x", "n_cols", "eps"] and k1.n_args == 3
    assert k1.constexprs == {"BLOCK": 2048} and k1.inputs["entry"] == "rmsnorm_kernel"
    fake_cu.current = 0xD0D0  # e.g. torch made another context current
    k2 = kernels.get_kernel("norm.k")
    assert k2 is not k1 and k2.ctx == 0xD0D0
    with pytest.raises(ImportError, match="unknown kernel 'norm.nope': no manifest under"):
        kernels.get_kernel("norm.nope")


@no_real_driver
def test_get_kernel_without_driver_is_a_clear_error(tmp_path, clean_env):
    """A known kernel without a driver: DriverUnavailable; an unknown name: MissingKernelError naming it (the
    name is checked against the manifests before the driver is touched)."""
    driver.reset_caches()
    kernels.clear_cache()
    try:
        with pytest.raises(driver.DriverUnavailable, match="CUDA driver unavailable"):
            kernels.get_kernel("selftest.empty")
        with pytest.raises(MissingKernelError, match="unknown kernel 'norm.nope'"):
            kernels.get_kernel("norm.nope")
    finally:
        driver.reset_caches()
        kernels.clear_cache()


def test_unknown_artifact_kind_is_refused(tmp_path, fake_cu, clean_env):
    """The loader is picked from the manifest entry's artifact kind / loader: no kind = triton-cubin; a kind
    this runtime has no loader for is an ArtifactError naming it, before anything is loaded."""
    root = make_root(tmp_path, bases=("norm.k", "cute.gemm"))
    clean_env.setenv("VKC_ARTIFACT_ROOT", str(root))
    aset = artifacts.ArtifactSet(root, "sm_90a")
    assert loaders.loader_of("norm.k", aset.entry("norm.k")) == "triton-cubin"
    art = dict(aset.entry("norm.k")["artifact"], kind="triton-cubin", loader="triton-cubin")
    assert loaders.loader_of("norm.k", {"artifact": art}) == "triton-cubin"
    assert loaders.loader_of("cute.gemm", {"artifact": dict(art, kind="cute-so", loader=None)}) == "cute-so"
    with pytest.raises(ArtifactError, match="artifact kind 'mystery-so' has no loader"):
        loaders.loader_of("cute.gemm", {"artifact": dict(art, kind="mystery-so", loader=None)})
    with pytest.raises(ArtifactError, match="needs loader 'tvm-so', which this vkc_runtime does not have"):
        loaders.loader_of("cute.gemm", {"artifact": dict(art, kind="cute-so", loader="tvm-so")})
    aset.kernels["cute.gemm"]["artifact"].update(kind="cute-so", loader="tvm-so")
    fake_cu.current = 0xC0C0
    kernels.context_info(0xC0C0).aset.kernels["cute.gemm"]["artifact"].update(kind="cute-so", loader="tvm-so")
    with pytest.raises(ArtifactError, match="needs loader 'tvm-so'"):
        kernels.get_kernel("cute.gemm")
    assert fake_cu.loaded == []


# ----------------------------------------------------------------------------------- scratch
def test_scratch_nbytes_rule():
    assert scratch.scratch_nbytes(3, 2, 4, 2, 256) == 3 * 2 * 4 * 2 * 256


def test_scratch_arena_sizing_growth_and_capture():
    """The default scratch of a context: one buffer for every stream, grown geometrically outside capture,
    old buffers retired (kept alive), growth during capture refused with the workspace / eager-first hint."""
    allocs, ptrs, queries = [], [], []
    capturing = {"on": False}
    nxt = [0x10000]

    def alloc(n):
        allocs.append(n)
        nxt[0] += 0x100000
        ptrs.append(nxt[0] + 0x100)  # 256-aligned, not 512-aligned
        return ptrs[-1]

    def is_capturing(s):
        queries.append(s)
        return capturing["on"]

    ar = scratch.ScratchArena(1, alloc=alloc, is_capturing=is_capturing)
    p = ar.get(1000, 128, stream=5)
    assert allocs == [1000] and p % 128 == 0
    n_q = len(queries)
    assert ar.get(800, 128, stream=5) == p and allocs == [1000]  # fits: reused ...
    assert len(queries) == n_q  # ... without a driver query on the launch path
    assert ar.get(900, 128, stream=9) == p and allocs == [1000]  # another stream: the same buffer
    ar.get(3000, 128, stream=5)  # grows to max(need, 2*old); the old buffer is retired, not freed
    assert allocs == [1000, 3000] and ar.retired == [(ptrs[0], 1000)]
    ar.get(3100, 128, stream=9)
    assert allocs[-1] == 6000 and [n for _, n in ar.retired] == [1000, 3000]  # doubling
    assert sum(n for _, n in ar.retired) < ar.size()  # geometric: the retired stay below the live one
    q = ar.get(4096, 1024, stream=11)  # alignment above cuMemAlloc's 256 B: room to round up
    assert q % 1024 == 0 and q - ptrs[-1] + 4096 <= ar.size()
    # capture on any stream (also one never seen eagerly): reuse is fine, growth is refused
    capturing["on"] = True
    assert ar.get(10, 128, stream=77) % 128 == 0
    with pytest.raises(LaunchError, match="cannot grow during stream capture.*workspace allocated before capture"):
        ar.get(10**6, 128, stream=77)
    assert ar.size() == 6000  # nothing changed by the refused growth


def test_global_scratch_workspace_buffer(fake_cu):
    """A caller-owned GlobalScratch hands out its aligned pointer and refuses a launch that needs more."""
    fake_cu.current = 0xC0C0
    g = scratch.GlobalScratch(4096)
    assert g.nbytes == 4096 and g.get(4096, 128, 5) == g.ptr and g.ptr % 128 == 0
    assert g.get(0, 128) == 0
    with pytest.raises(LaunchError, match="needs 4097 bytes of global scratch, the workspace's scratch holds 4096"):
        g.get(4097, 128)


def test_kernel_with_global_scratch_uses_arena_or_workspace(tmp_path, fake_cu, clean_env):
    clean_env.setenv("VKC_NATIVE", "0")
    root = make_root(tmp_path, bases=("norm.k",), gss=256, gsa=128, num_ctas=2)
    fake_cu.current = 0xC0C0
    fake_cu.param_sizes = [8, 4, 4, 8, 8]
    k = _kernel(root)
    assert k.scratch_size == 256 and k.scratch_bytes((4, 3)) == 4 * 3 * 2 * 256
    k.launch((4, 3, 1), (0x7000, 1, 1.0), stream=0x60)
    assert fake_cu.calls("cuMemAlloc") == [(4 * 3 * 1 * 2 * 256,)]
    arena_ptr = int.from_bytes(fake_cu.launches[0]["params"][3], "little")
    assert arena_ptr != 0 and arena_ptr % 128 == 0 and fake_cu.launches[0]["params"][4] == bytes(8)
    k.launch((4, 3, 1), (0x7000, 1, 1.0), stream=0x61)  # another stream: the same default scratch
    assert int.from_bytes(fake_cu.launches[1]["params"][3], "little") == arena_ptr
    fake_cu.capturing[0x62] = True  # capture on a fresh stream after eager use elsewhere: no growth needed
    k.launch((4, 3, 1), (0x7000, 1, 1.0), stream=0x62)
    with pytest.raises(LaunchError, match="cannot grow during stream capture"):
        k.launch((8, 3, 1), (0x7000, 1, 1.0), stream=0x62)
    ws = scratch.GlobalScratch(k.scratch_bytes((8, 3)))  # a workspace: capture needs no warm-up at all
    n_alloc = len(fake_cu.calls("cuMemAlloc"))
    k.launch((8, 3, 1), (0x7000, 1, 1.0), stream=0x62, scratch=ws)
    assert int.from_bytes(fake_cu.launches[-1]["params"][3], "little") == ws.ptr
    assert len(fake_cu.calls("cuMemAlloc")) == n_alloc
    with pytest.raises(LaunchError, match="the workspace's scratch holds"):
        k.launch((9, 3, 1), (0x7000, 1, 1.0), stream=0x62, scratch=ws)


# ----------------------------------------------------------------------------------- native launcher
@pytest.fixture
def fake_libcuda(tmp_path, monkeypatch):
    if NATIVE is None:
        pytest.skip(f"native module not built: {native.native_reason()}")
    lib = build_fake_libcuda(tmp_path)
    if lib is None:
        pytest.skip("no C compiler to build the fake libcuda")
    monkeypatch.setenv("VKC_LIBCUDA", str(lib))
    NATIVE._reset_driver()
    h = ctypes.CDLL(str(lib))
    h.fake_params.restype = ctypes.POINTER(ctypes.c_ubyte)
    h.fake_config.restype = ctypes.POINTER(ctypes.c_ubyte)
    h.fake_attrs.restype = ctypes.POINTER(ctypes.c_ubyte)
    h.fake_grid.restype = ctypes.POINTER(ctypes.c_uint)
    h.fake_block.restype = ctypes.POINTER(ctypes.c_uint)
    h.fake_stream.restype = ctypes.c_size_t
    h.fake_fn.restype = ctypes.c_size_t

    def set_sizes(codes):
        sizes = [abi.PACK_SIZES[c] for c in codes]
        h.fake_set_sizes(len(sizes), (ctypes.c_int * max(len(sizes), 1))(*sizes))

    h.set_sizes = set_sizes
    h.params = lambda: bytes(h.fake_params()[: h.fake_params_len()])
    yield h
    NATIVE._reset_driver()


def _params_concat(codes, vals):
    return b"".join(pack.pack_value(c, v) for c, v in zip(codes, vals))


def test_native_launch_plain(fake_libcuda):
    L = NATIVE.Launcher(0xF00D, "p?Efpp", ["x", "flag", "w", "eps", "global_scratch", "profile_scratch"],
                        [16, 0, 0, 0, 0, 0], 2, 128, 4096, 1, False, False, "fam.k")
    fake_libcuda.set_sizes("p?Efpp")
    L.launch(7, 2, 3, 0xABC, (0x1000, True, 1.00390625, 0.1), 0x9000)
    h = fake_libcuda
    assert NATIVE.driver_status().startswith("loaded ")
    assert (h.fake_plain_calls(), h.fake_ex_calls()) == (1, 0)
    assert list(h.fake_grid()[:3]) == [7, 2, 3] and list(h.fake_block()[:3]) == [128, 1, 1]
    assert (h.fake_shared(), h.fake_stream(), h.fake_fn()) == (4096, 0xABC, 0xF00D)
    assert h.params() == _params_concat("p?Efpp", (0x1000, True, 1.00390625, 0.1, 0x9000, 0))
    assert L.uses_ex is False and L.n_visible == 4 and L.param_bytes == 32


def test_native_launch_ex_attributes_layout(fake_libcuda):
    L = NATIVE.Launcher(0xBEEF, "pipp", ["x", "n", "global_scratch", "profile_scratch"], [0, 16, 0, 0], 2, 256,
                        65536, 2, True, True, "fam.cluster")
    fake_libcuda.set_sizes("pipp")
    L.launch(5, 1, 1, 0x77, (0x2000, 32), 0)
    h = fake_libcuda
    assert (h.fake_plain_calls(), h.fake_ex_calls()) == (0, 1)
    cfg = bytes(h.fake_config()[:56])
    assert struct.unpack_from("<7I", cfg) == (10, 1, 1, 256, 1, 1, 65536)  # gridDim.x = 5 * num_ctas
    assert struct.unpack_from("<Q", cfg, 32)[0] == 0x77 and struct.unpack_from("<I", cfg, 48)[0] == 4
    attrs = bytes(h.fake_attrs()[: 72 * 4])
    ids = driver.cu.CUlaunchAttributeID
    got = [(struct.unpack_from("<i", attrs, 72 * i)[0], struct.unpack_from("<3I", attrs, 72 * i + 8)) for i in range(4)]
    assert got == [
        (int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION), (2, 1, 1)),
        (int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE),
         (int(driver.cu.CUclusterSchedulingPolicy.CU_CLUSTER_SCHEDULING_POLICY_SPREAD), 0, 0)),
        (int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION), (1, 0, 0)),
        (int(ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE), (1, 0, 0)),
    ]
    assert h.params() == _params_concat("pipp", (0x2000, 32, 0, 0))


def test_native_launch_errors(fake_libcuda):
    L = NATIVE.Launcher(0xF00D, "pipp", ["x", "n", "global_scratch", "profile_scratch"], [16, 16, 0, 0], 2, 128, 0,
                        1, False, False, "fam.k")
    fake_libcuda.set_sizes("pipp")
    with pytest.raises(ValueError, match=r"fam.k: argument 'x' = 0x1001 is not 16-byte aligned"):
        L.launch(1, 1, 1, 0, (0x1001, 16), 0)
    with pytest.raises(ValueError, match=r"fam.k: argument 'n' = 17 is not a multiple of 16"):
        L.launch(1, 1, 1, 0, (0x1000, 17), 0)
    with pytest.raises(TypeError, match=r"fam.k takes 2 arguments \(x, n\), got 3"):
        L.launch(1, 1, 1, 0, (0x1000, 16, 1), 0)
    with pytest.raises(TypeError, match=r"argument 'n' \(i32\) expects an int, got float"):
        L.launch(1, 1, 1, 0, (0x1000, 16.0), 0)
    with pytest.raises(LaunchError, match="exceeds the CUDA limits"):
        L.launch(2**31, 1, 1, 0, (0x1000, 16), 0)
    with pytest.raises(LaunchError, match="exceeds the CUDA limits"):
        L.launch(1, 65536, 1, 0, (0x1000, 16), 0)
    L.launch(1, 0, 1, 0, (0x1000, 16), 0)  # empty grid
    assert fake_libcuda.fake_plain_calls() == 0
    fake_libcuda.fake_set_result(700)
    with pytest.raises(CudaError) as ei:
        L.launch(3, 1, 1, 0x5, (0x1000, 16), 0)
    e = ei.value
    assert (e.name, e.code, e.call) == ("CUDA_ERROR_ILLEGAL_ADDRESS", 700, "cuLaunchKernel")
    assert str(e).startswith("cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS (700): kernel fam.k grid=(3, 1, 1)")
    assert isinstance(e, RuntimeError)


def test_native_missing_libcuda_is_reported(tmp_path, monkeypatch):
    if NATIVE is None:
        pytest.skip(f"native module not built: {native.native_reason()}")
    monkeypatch.setenv("VKC_LIBCUDA", str(tmp_path / "nope.so"))
    NATIVE._reset_driver()
    try:
        L = NATIVE.Launcher(1, "pp", ["global_scratch", "profile_scratch"], [0, 0], 2, 32, 0, 1, False, False, "k")
        with pytest.raises(RuntimeError, match="cannot load .*nope.so"):
            L.launch(1, 1, 1, 0, (), 0)
        assert NATIVE.driver_status().startswith("failed: cannot load")
    finally:
        NATIVE._reset_driver()


def test_kernel_launch_through_native_with_fake_driver(tmp_path, fake_cu, fake_libcuda):
    root = make_root(tmp_path, bases=("norm.k",))
    fake_cu.current = 0xC0C0
    k = _kernel(root)
    fake_libcuda.set_sizes("pifpp")
    k.launch([2], [0x7000, 64, 0.5], stream=0x42)
    assert k.native and fake_libcuda.fake_plain_calls() == 1
    assert fake_libcuda.fake_fn() == 0xF001  # the handle cuModuleGetFunction returned
    assert fake_libcuda.params() == _params_concat("pifpp", (0x7000, 64, 0.5, 0, 0))


@needs_native
def test_native_struct_layout_matches_cuda_h(tmp_path):
    lay = NATIVE.struct_layout()
    ids = driver.cu.CUlaunchAttributeID
    assert lay["ATTR_COOPERATIVE"] == int(ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
    assert lay["ATTR_CLUSTER_DIMENSION"] == int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    assert lay["ATTR_CLUSTER_SCHEDULING_POLICY_PREFERENCE"] == int(
        ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE)
    assert lay["ATTR_PROGRAMMATIC_STREAM_SERIALIZATION"] == int(
        ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    assert lay["CLUSTER_SCHEDULING_POLICY_SPREAD"] == int(
        driver.cu.CUclusterSchedulingPolicy.CU_CLUSTER_SCHEDULING_POLICY_SPREAD)
    # and the real header, where this machine has one
    inc = next((p for p in ("/usr/local/cuda/include", os.environ.get("CUDA_HOME", "") + "/include")
                if p and Path(p, "cuda.h").is_file()), None)
    cxx = shutil.which("g++") or shutil.which("c++")
    if inc is None or cxx is None:
        pytest.skip("no cuda.h / C++ compiler to compare the struct layout against")
    src = tmp_path / "lay.cpp"
    src.write_text("""
#include <cuda.h>
#include <cstddef>
#include <cstdio>
int main() {
  printf("%zu %zu %zu %zu %zu %zu %zu %zu\\n", sizeof(CUlaunchAttributeValue), sizeof(CUlaunchAttribute),
         offsetof(CUlaunchAttribute, value), sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, sharedMemBytes),
         offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs));
}
""")
    exe = tmp_path / "lay"
    subprocess.run([cxx, f"-I{inc}", str(src), "-o", str(exe)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got == [lay[k] for k in ("CUlaunchAttributeValue.size", "CUlaunchAttribute.size", "CUlaunchAttribute.value",
                                    "CUlaunchConfig.size", "CUlaunchConfig.sharedMemBytes", "CUlaunchConfig.hStream",
                                    "CUlaunchConfig.attrs", "CUlaunchConfig.numAttrs")]


def test_native_reason_and_env_switch(clean_env):
    if NATIVE is None:
        assert not native.native_available() and native.native_reason()
        return
    assert native.native_available()
    clean_env.setenv("VKC_NATIVE", "0")
    assert not native.native_available() and "VKC_NATIVE=0" in native.native_reason()


# ----------------------------------------------------------------------------------- bound calls
SIG2 = (("x", "*bf16", 16), ("y", "*fp32", None), ("n", "i32", None), ("eps", "fp32", None))


class _Raises:
    def __get__(self, obj, tp=None):
        raise RuntimeError("broken tensor")


@pytest.mark.parametrize("native", [True, False])
def test_bound_call_replays_and_guards_every_fact(tmp_path, fake_cu, clean_env, request, native):
    """bind_call packs two launches once; run() launches them with the slots' new pointers (byte-identical to a
    validated launch) and refuses -- launching nothing -- when any guarded fact differs. Native
    (_native.BoundCall through a fake libcuda) and Python (PyBoundCall through cuda-bindings) alike."""
    from tests.ops_fakes import TorchLike as T
    from vkc_runtime import memory
    if native:
        h = request.getfixturevalue("fake_libcuda")
        h.set_sizes("ppifpp")
        h.fake_hist_params.restype = ctypes.POINTER(ctypes.c_ubyte)
        h.fake_set_ctx(ctypes.c_size_t(0xC0C0))
        log = lambda: [bytes(h.fake_hist_params(i)[:40]) for i in range(h.fake_hist_count())]  # noqa: E731
    else:
        clean_env.setenv("VKC_NATIVE", "0")
        fake_cu.param_sizes = [8, 8, 4, 4, 8, 8]
        log = lambda: [b"".join(l["params"]) for l in fake_cu.launches]  # noqa: E731
    root = make_root(tmp_path, bases=("norm.k",), sig=SIG2)
    fake_cu.current = 0xC0C0
    k = _kernel(root)
    x, y = T((4, 64)), T((4, 64), "torch.float32")
    rx, ry = memory.as_tensor(x), memory.as_tensor(y)
    launches = [bound.Launch(k, (4, 1, 1), (rx, ry, 64, 0.5)), bound.Launch(k, 2, (ry, rx, 32, 0.25))]
    bound.run_launches(launches, 0x42)
    bc = bound.bind_call((rx, ry), (0.5,), launches, 0x42)
    assert type(bc).__name__ == ("BoundCall" if native else "PyBoundCall") and k.native is native
    n0 = len(log())
    x2, y2 = T((4, 64)), T((4, 64), "torch.float32", offset_bytes=48)  # y2 only 16-aligned: y was 2^36-aligned
    assert bc.run((x2, y2), (0.5,), 0x43)
    got = log()[n0:]
    assert got == [_params_concat("ppifpp", (x2.data_ptr(), y2.data_ptr(), 64, 0.5, 0, 0)),
                   _params_concat("ppifpp", (y2.data_ptr(), x2.data_ptr(), 32, 0.25, 0, 0))]
    assert bc.hits == 1

    class Sub(T):
        pass

    broken = T((4, 64))
    broken.__class__ = type("T2", (T,), {"data_ptr": _Raises()})
    refused = [
        ((T((4, 65)), y2), (0.5,)),                                  # shape
        ((T((4, 64), strides=(128, 1)), y2), (0.5,)),                # strides
        ((T((4, 64), "torch.float16"), y2), (0.5,)),                 # dtype
        ((T((4, 64), offset_bytes=8), y2), (0.5,)),                  # alignment below the recorded 16
        ((x2, T((4, 64), "torch.float32", offset_bytes=4)), (0.5,)),
        ((T((4, 64), is_cuda=False), y2), (0.5,)),                   # not CUDA
        ((T((4, 64), device=1), y2), (0.5,)),                        # device
        ((Sub((4, 64)), y2), (0.5,)),                                # exact type
        ((broken, y2), (0.5,)),                                      # a tensor attribute that raises
        ((x2,), (0.5,)),                                             # slot count
        ((x2, y2), (0.25,)), ((x2, y2), (1,)), ((x2, y2), ()),       # scalar value / type / count
    ]
    for tensors, scalars in refused:
        assert bc.run(tensors, scalars, 0x42) is False, (tensors, scalars)
    if native:
        h.fake_set_ctx(ctypes.c_size_t(0xBAD))
    else:
        fake_cu.current = 0xBAD
    assert bc.run((x2, y2), (0.5,), 0x42) is False                 # another CUDA context is current
    assert len(log()) == n0 + 2 and bc.hits == 1


def test_bound_call_with_global_scratch_replays_on_any_stream(tmp_path, fake_cu, fake_libcuda):
    """A kernel with global scratch gets its scratch pointer (the default arena's here) baked in at bind time;
    the scratch does not depend on the stream, so run() replays on any stream with that pointer."""
    from tests.ops_fakes import TorchLike as T
    from vkc_runtime import memory
    root = make_root(tmp_path, bases=("norm.k",), gss=256, gsa=128)
    fake_cu.current = 0xC0C0
    fake_libcuda.set_sizes("pifpp")
    fake_libcuda.fake_set_ctx(ctypes.c_size_t(0xC0C0))
    k = _kernel(root)
    x = T((4, 64))
    rx = memory.as_tensor(x)
    launches = [bound.Launch(k, 3, (rx, 64, 0.5))]
    bound.run_launches(launches, 0x60)
    sp = int.from_bytes(fake_libcuda.params()[16:24], "little")
    bc = bound.bind_call((rx,), (), launches, 0x60)
    x2 = T((4, 64))
    assert bc.run((x2,), (), 0x61)
    assert fake_libcuda.params() == _params_concat("pifpp", (x2.data_ptr(), 64, 0.5, sp, 0))
    assert sp != 0 and fake_libcuda.fake_stream() == 0x61


@pytest.mark.parametrize("native", [True, False])
def test_bound_call_with_workspace_scratch(tmp_path, fake_cu, clean_env, request, native):
    """A Launch record's scratch (a workspace's GlobalScratch) is what the bound call bakes in and replays with,
    native and Python alike; without one the launch takes the context's default arena."""
    from tests.ops_fakes import TorchLike as T
    from vkc_runtime import memory
    root = make_root(tmp_path, bases=("norm.k",), gss=256, gsa=128)
    fake_cu.current = 0xC0C0
    if native:
        h = request.getfixturevalue("fake_libcuda")
        h.set_sizes("pifpp")
        h.fake_set_ctx(ctypes.c_size_t(0xC0C0))
        last_scratch = lambda: int.from_bytes(h.params()[16:24], "little")  # noqa: E731
    else:
        clean_env.setenv("VKC_NATIVE", "0")
        fake_cu.param_sizes = [8, 4, 4, 8, 8]
        last_scratch = lambda: int.from_bytes(fake_cu.launches[-1]["params"][3], "little")  # noqa: E731
    k = _kernel(root)
    ws = scratch.GlobalScratch(k.scratch_bytes(3))
    rx = memory.as_tensor(T((4, 64)))
    launches = [bound.Launch(k, 3, (rx, 64, 0.5), ws)]
    bound.run_launches(launches, 0x60)
    assert last_scratch() == ws.ptr
    bc = bound.bind_call((rx,), (), launches, 0x60)
    assert type(bc).__name__ == ("BoundCall" if native else "PyBoundCall")
    assert bc.run((T((4, 64)),), (), 0x61) and last_scratch() == ws.ptr
    bound.run_launches([bound.Launch(k, 3, (rx, 64, 0.5))], 0x60)  # no workspace: the default arena
    assert last_scratch() not in (0, ws.ptr) and last_scratch() == scratch.arena(0xC0C0).ptr


def test_bind_call_declines_what_it_cannot_guard(tmp_path, fake_cu, clean_env):
    from tests.ops_fakes import Dev, TorchLike as T
    from vkc_runtime import memory
    root = make_root(tmp_path, bases=("norm.k",))
    k = _kernel(root)
    cai = memory.as_tensor(Dev((4, 64)))  # CUDA array interface (cupy): no cheap re-read -> never bound
    assert bound.bind_call((cai,), (), [bound.Launch(k, 1, (cai, 64, 0.5))], 0) is None
    rx = memory.as_tensor(T((4, 64)))
    assert bound.bind_call((rx, rx), (), [bound.Launch(k, 1, (rx, 64, 0.5))], 0) is None  # one TensorRef in two slots
    clean_env.setenv("VKC_FASTPATH", "0")
    assert bound.bind_call((rx,), (), [bound.Launch(k, 1, (rx, 64, 0.5))], 0) is None


@pytest.mark.parametrize("native", [True, False])
def test_bound_call_relations(tmp_path, fake_cu, clean_env, request, native):
    """Relations between two slots, re-checked on every run: "disjoint" refuses overlapping byte spans (one byte
    is enough), "same" refuses two different pointers."""
    from tests.ops_fakes import TorchLike as T
    from vkc_runtime import memory
    if native:
        h = request.getfixturevalue("fake_libcuda")
        h.set_sizes("ppifpp")
        h.fake_set_ctx(ctypes.c_size_t(0xC0C0))
    else:
        clean_env.setenv("VKC_NATIVE", "0")
        fake_cu.param_sizes = [8, 8, 4, 4, 8, 8]
    root = make_root(tmp_path, bases=("norm.k",), sig=SIG2)
    fake_cu.current = 0xC0C0
    k = _kernel(root)
    x, y = T((4, 64), "torch.float32"), T((4, 64), "torch.float32")  # 4 * 64 * 4 = 1024 bytes each
    rx, ry = memory.as_tensor(x), memory.as_tensor(y)
    launches = [bound.Launch(k, 1, (rx, ry, 64, 0.5))]
    bound.run_launches(launches, 0)
    disjoint = bound.bind_call((rx, ry), (), launches, 0, relations=[bound.disjoint(rx, ry)])
    same = bound.bind_call((rx, ry), (), launches, 0, relations=[bound.same(rx, ry)])
    assert type(disjoint).__name__ == ("BoundCall" if native else "PyBoundCall")

    def pair(gap):  # two [4, 64] fp32 tensors whose pointers are `gap` bytes apart (16-byte aligned)
        a, b = T((4, 64), "torch.float32"), T((4, 64), "torch.float32")
        b._ptr = a.data_ptr() + gap
        return a, b
    assert disjoint.run(pair(1024), (), 0)          # adjacent: fine
    assert not disjoint.run(pair(1008), (), 0)      # 16 bytes of overlap
    assert not disjoint.run(pair(0), (), 0)
    a, _ = pair(0)
    assert same.run((a, a), (), 0) and not same.run(pair(1024), (), 0)
    assert (disjoint.hits, same.hits) == (1, 1)
