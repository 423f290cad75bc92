"""as_tensor (CAI, DLPack, torch duck typing), TensorRef checks and DeviceArray on a fake driver (CPU)."""
from __future__ import annotations

import gc
import math
import sys

import numpy as np
import pytest

from vkc_runtime import interop, memory, native, pack
from vkc_runtime.memory import DeviceArray, TensorRef, as_tensor

try:
    from .runtime_support import clean_env, fake_cu, native_module  # noqa: F401
except ImportError:  # tests/ not a package
    from runtime_support import clean_env, fake_cu, native_module  # noqa: F401

NATIVE = native_module()
needs_native = pytest.mark.skipif(NATIVE is None, reason=f"native module not built: {native.native_reason()}")


class CAI:
    def __init__(self, **d):
        self.__cuda_array_interface__ = d


# ----------------------------------------------------------------------------------- CUDA array interface
def test_cai_contiguous_and_strided():
    t = as_tensor(CAI(shape=(4, 6), typestr="<f4", data=(0x10000, False), version=3), "x")
    assert (t.ptr, t.shape, t.strides, t.dtype, t.device) == (0x10000, (4, 6), (6, 1), "float32", -1)
    assert t.is_contiguous() and t.numel == 24 and t.itemsize == 4
    t = as_tensor(CAI(shape=(4, 6), typestr="<i2", data=(0x20000, False), strides=(2, 8), version=3), "x")
    assert t.strides == (1, 4) and t.dtype == "int16" and not t.is_contiguous()
    assert as_tensor(CAI(shape=(3,), typestr="|b1", data=(16, False)), "m").dtype == "bool"
    assert as_tensor(CAI(shape=(3,), typestr="|u1", data=(16, False)), "m").dtype == "uint8"


def test_cai_rejections():
    assert as_tensor(CAI(shape=(2,), typestr="<V2", data=(16, False)), "x").dtype == "bfloat16"  # torch/ml_dtypes
    with pytest.raises(TypeError, match="x: unsupported __cuda_array_interface__ typestr '|V1'.*fp8"):
        as_tensor(CAI(shape=(2,), typestr="|V1", data=(16, False)), "x")
    with pytest.raises(TypeError, match="unsupported __cuda_array_interface__ typestr '<c8'"):
        as_tensor(CAI(shape=(2,), typestr="<c8", data=(16, False)), "x")
    with pytest.raises(TypeError, match="big-endian"):
        as_tensor(CAI(shape=(2,), typestr=">f4", data=(16, False)), "x")
    with pytest.raises(ValueError, match="not multiples"):
        as_tensor(CAI(shape=(2,), typestr="<f4", data=(16, False), strides=(6,)), "x")
    with pytest.raises(TypeError, match="masked"):
        as_tensor(CAI(shape=(2,), typestr="<f4", data=(16, False), mask=object()), "x")
    with pytest.raises(TypeError, match="malformed"):
        as_tensor(CAI(typestr="<f4", data=(16, False)), "x")


# ----------------------------------------------------------------------------------- DLPack
def test_parse_numpy_capsule_legacy_and_versioned():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    for cap in (a.__dlpack__(), a.__dlpack__(max_version=(1, 0))):
        with pytest.raises(ValueError, match="host \\(CPU\\) memory"):
            memory.parse_dlpack_capsule(cap, "x")
    # the parser itself, with the device check bypassed through a CUDA-typed wrapper below
    v = a[:, 1:5].T  # shape (4, 4), strides (1, 6) elements, offset 4 bytes
    cap = v.__dlpack__()
    t = _parse_any(cap)
    assert t.shape == (4, 4) and t.strides == (1, 6) and t.dtype == "float32"
    assert t.ptr == v.__array_interface__["data"][0]


def _parse_any(cap):
    """Parse a CPU capsule by flipping its device type in place to kDLCUDA (tests the layout reading)."""
    import ctypes
    get_name, get_ptr, _ = interop._capsule_api()
    name = get_name(cap)
    addr = get_ptr(cap, name)
    if name == b"dltensor":
        t = interop._DLManagedTensor.from_address(addr).dl_tensor
    else:
        t = interop._DLManagedTensorVersioned.from_address(addr).dl_tensor
    saved = t.device.device_type
    t.device.device_type = 2
    try:
        return memory.parse_dlpack_capsule(cap, "x")
    finally:
        t.device.device_type = saved
        del ctypes


def test_parse_versioned_capsule_reads_dtypes():
    for dt, name in [(np.int8, "int8"), (np.uint8, "uint8"), (np.int64, "int64"), (np.float16, "float16"),
                     (np.bool_, "bool"), (np.float64, "float64"), (np.uint32, "uint32")]:
        a = np.zeros((2, 3), dtype=dt)
        t = _parse_any(a.__dlpack__(max_version=(1, 0)))
        assert (t.dtype, t.shape, t.strides, t.ptr) == (name, (2, 3), (3, 1), a.ctypes.data)


def test_as_tensor_rejects_host_arrays():
    with pytest.raises(ValueError, match="x: tensor lives in host \\(CPU\\) memory"):
        as_tensor(np.zeros(4, np.float32), "x")


def test_as_tensor_rejects_host_torch_tensor():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="w: tensor is on cpu, not a CUDA device"):
        as_tensor(torch.zeros(3, dtype=torch.bfloat16), "w")


class DLProducer:
    def __init__(self, cap, dev=(2, 0), accept_stream=True):
        self.cap, self.dev, self.accept_stream = cap, dev, accept_stream
        self.kwargs = []

    def __dlpack_device__(self):
        return self.dev

    def __dlpack__(self, **kw):
        if kw and not self.accept_stream:
            raise TypeError("no stream kwarg")
        self.kwargs.append(kw)
        return self.cap


@needs_native
def test_dlpack_producer_cuda_bf16_and_stream_minus_one():
    owner = bytearray(64)
    refs = sys.getrefcount(owner)
    cap = NATIVE.make_dlpack(0x7F0000001000, (4, 8), (8, 1), 4, 16, 2, 3, owner)
    assert sys.getrefcount(owner) == refs + 1
    p = DLProducer(cap, dev=(2, 3))
    t = as_tensor(p, "q")
    assert (t.ptr, t.shape, t.strides, t.dtype, t.device) == (0x7F0000001000, (4, 8), (8, 1), "bfloat16", 3)
    assert p.kwargs == [{"stream": -1}]
    p2 = DLProducer(cap, dev=(2, 3), accept_stream=False)
    assert as_tensor(p2, "q").dtype == "bfloat16" and p2.kwargs == [{}]
    # the TensorRef keeps the capsule (and through its deleter the owner) alive; dropping all releases it
    del p, p2, cap
    gc.collect()
    assert sys.getrefcount(owner) == refs + 1
    del t
    gc.collect()
    assert sys.getrefcount(owner) == refs


def test_dlpack_device_rejection_before_export():
    p = DLProducer(cap=None, dev=(1, 0))
    with pytest.raises(ValueError, match="host \\(CPU\\) memory"):
        as_tensor(p, "x")
    assert p.kwargs == []  # never asked to export
    p = DLProducer(cap=None, dev=(10, 0))
    with pytest.raises(ValueError, match="ROCm"):
        as_tensor(p, "x")


@needs_native
def test_numpy_consumes_native_dlpack_capsule_and_releases_owner():
    host = np.arange(12, dtype=np.int32)
    owner = object()
    refs = sys.getrefcount(owner)

    class Wrap:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            return NATIVE.make_dlpack(host.ctypes.data, (3, 4), (4, 1), 0, 32, 1, 0, owner)

    view = np.from_dlpack(Wrap())
    assert view.shape == (3, 4) and view.dtype == np.int32 and view[2, 3] == 11
    host[0] = 99
    assert view[0, 0] == 99  # zero-copy
    assert sys.getrefcount(owner) == refs + 1
    del view
    gc.collect()
    assert sys.getrefcount(owner) == refs


# ----------------------------------------------------------------------------------- torch duck typing
class FakeDevice:
    def __init__(self, type_, index):
        self.type, self.index = type_, index

    def __str__(self):
        return f"{self.type}:{self.index}"


class FakeTorchTensor:
    def __init__(self, ptr, shape, stride, dtype="torch.bfloat16", cuda=True, index=0):
        self._ptr, self.shape, self._stride, self.dtype = ptr, shape, stride, dtype
        self.is_cuda, self.device = cuda, FakeDevice("cuda" if cuda else "cpu", index if cuda else None)

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._stride

    @property
    def __cuda_array_interface__(self):  # as torch: bf16 is not expressible
        raise TypeError("Can't convert bfloat16 to a CUDA array interface")


def test_torch_duck_path_bf16():
    t = FakeTorchTensor(0xAB00, (2, 5), (5, 1), index=1)
    r = as_tensor(t, "x")
    assert (r.ptr, r.shape, r.strides, r.dtype, r.device) == (0xAB00, (2, 5), (5, 1), "bfloat16", 1)
    assert r.keepalive is t
    assert as_tensor(FakeTorchTensor(16, (3,), (1,), dtype="torch.float8_e4m3fn"), "x").dtype == "float8_e4m3fn"
    with pytest.raises(TypeError, match="unsupported tensor dtype torch.complex64"):
        as_tensor(FakeTorchTensor(16, (3,), (1,), dtype="torch.complex64"), "x")
    with pytest.raises(ValueError, match="not a CUDA device"):
        as_tensor(FakeTorchTensor(16, (3,), (1,), cuda=False), "x")


def test_as_tensor_unknown_type():
    with pytest.raises(TypeError, match="x: cannot use builtins.list as a device tensor"):
        as_tensor([1, 2], "x")


def test_as_tensor_is_fast():
    import time
    t = FakeTorchTensor(0xAB00, (2, 5), (5, 1))
    c = CAI(shape=(4, 6), typestr="<f4", data=(0x10000, False), version=3)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        as_tensor(t, "x")
    dt_torch = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        as_tensor(c, "x")
    dt_cai = (time.perf_counter() - t0) / n
    assert dt_torch < 20e-6 and dt_cai < 20e-6, (dt_torch, dt_cai)  # generous bound for slow CI boxes


# ----------------------------------------------------------------------------------- TensorRef.check
def test_tensor_ref_check_messages():
    t = TensorRef(0x1008, (4, 8), (8, 1), "bfloat16", 0)
    assert t.check("rmsnorm", "x", dtype=("bfloat16", "float16"), shape=(None, 8), contiguous=True, align=8) is t
    with pytest.raises(TypeError, match="rmsnorm: x has dtype bfloat16, expected float32"):
        t.check("rmsnorm", "x", dtype="float32")
    with pytest.raises(ValueError, match=r"rmsnorm: x has shape \(4, 8\), expected \(\*, 16\)"):
        t.check("rmsnorm", "x", shape=(None, 16))
    with pytest.raises(ValueError, match="expected 3"):
        t.check("rmsnorm", "x", ndim=3)
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        t.check("rmsnorm", "x", align=16)
    with pytest.raises(ValueError, match="must be contiguous"):
        TensorRef(0, (4, 8), (1, 4), "float32").check("op", "y", contiguous=True)
    with pytest.raises(ValueError, match="on CUDA device 0, expected device 1"):
        t.check("op", "x", device=1)
    assert TensorRef(0, (4, 1, 8), (8, 99, 1), "float32").is_contiguous()  # size-1 dims: any stride


# ----------------------------------------------------------------------------------- bf16 helpers
def test_vectorised_bf16_matches_scalar_rule():
    rng = np.random.default_rng(0)
    vals = np.concatenate([rng.standard_normal(2000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 2000),
                           np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-40, 1.00390625, 1.01171875],
                                    np.float32)])
    bits = memory.to_bf16_bits(vals)
    assert bits.dtype == np.uint16
    assert [int(b) for b in bits] == [pack.bf16_bits(float(v)) for v in vals]
    nan_bits = memory.to_bf16_bits(np.array([np.nan], np.float32))
    assert np.isnan(memory.from_bf16_bits(nan_bits))[0]
    back = memory.from_bf16_bits(bits)
    assert back.dtype == np.float32 and back[-2] == 1.0 and back[-1] == np.float32(1.015625)


# ----------------------------------------------------------------------------------- DeviceArray (fake driver)
def test_device_array_roundtrip_and_free(fake_cu):
    a = DeviceArray.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert fake_cu.current == fake_cu.primary  # ensure_context retained + set the primary context
    assert (a.shape, a.dtype, a.nbytes, a.strides) == ((3, 4), np.dtype("float32"), 48, (4, 1))
    assert fake_cu.calls("cuMemAlloc") == [(48,)] and fake_cu.calls("cuMemcpyHtoD") == [(a.ptr, 48)]
    np.testing.assert_array_equal(a.to_numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    r = as_tensor(a, "a")
    assert (r.ptr, r.shape, r.strides, r.dtype, r.keepalive) == (a.ptr, (3, 4), (4, 1), "float32", a)
    ptr = a.ptr
    v = a.reshape(-1)
    del a, r
    gc.collect()
    assert ptr not in fake_cu.freed  # the view keeps the base alive
    assert v.shape == (12,) and v.ptr == ptr
    del v
    gc.collect()
    assert fake_cu.freed == [ptr]


def test_device_array_bf16(fake_cu):
    x = np.array([[1.0, 1.00390625, -2.5, 0.1]], dtype=np.float32)
    a = DeviceArray.from_numpy(x, dtype="bfloat16")
    assert a.dtype == "bfloat16" and a.itemsize == 2 and a.nbytes == 8
    raw = a.to_numpy(raw=True)
    assert raw.dtype == np.uint16 and [int(b) for b in raw[0]] == [0x3F80, 0x3F80, 0xC020, 0x3DCD]
    np.testing.assert_array_equal(a.to_numpy(), memory.from_bf16_bits(raw))
    cai = a.__cuda_array_interface__
    assert cai == {"shape": (1, 4), "typestr": "<V2", "data": (a.ptr, False), "version": 3, "strides": None}
    assert as_tensor(a, "a").dtype == "bfloat16"
    b = DeviceArray.full((2, 2), 1.01171875, "bfloat16")
    assert [int(v) for v in b.to_numpy(raw=True).ravel()] == [0x3F82] * 4


def test_device_array_zeros_fill_and_stream(fake_cu):
    z = DeviceArray.zeros((5,), "int32", stream=0x33)
    assert fake_cu.calls("cuMemsetD8Async") == [(z.ptr, 0, 20, 0x33)]
    np.testing.assert_array_equal(z.to_numpy(), np.zeros(5, np.int32))
    z.fill_bytes(0xFF)
    np.testing.assert_array_equal(z.to_numpy(), np.full(5, -1, np.int32))
    with pytest.raises(ValueError):
        z.fill_bytes(256)
    f = DeviceArray.full(3, 7, "int64")
    np.testing.assert_array_equal(f.to_numpy(stream=0x9), np.full(3, 7, np.int64))
    assert fake_cu.calls("cuStreamSynchronize")[-1] == (0x9,)
    n_alloc = len(fake_cu.calls("cuMemAlloc"))
    e = DeviceArray.empty((0, 4), "float16")
    assert e.ptr == 0 and e.nbytes == 0 and e.to_numpy().shape == (0, 4)
    assert len(fake_cu.calls("cuMemAlloc")) == n_alloc


def test_device_array_view_and_copy(fake_cu):
    a = DeviceArray.from_numpy(np.arange(8, dtype=np.int32))
    v = a.view("int16")
    assert v.shape == (16,) and v.ptr == a.ptr
    b = DeviceArray.empty((8,), "int32")
    b.copy_from(a)
    assert fake_cu.calls("cuMemcpyDtoD") == [(b.ptr, a.ptr, 32)]
    np.testing.assert_array_equal(b.to_numpy(), np.arange(8, dtype=np.int32))
    with pytest.raises(ValueError, match="copy_from"):
        DeviceArray.empty((3,), "int32").copy_from(a)


@needs_native
def test_device_array_dlpack_roundtrip(fake_cu):
    a = DeviceArray.from_numpy(np.zeros((2, 3), np.float32), dtype="bfloat16")
    assert a.__dlpack_device__() == (2, 0)
    t = memory.parse_dlpack_capsule(a.__dlpack__(), "a")
    assert (t.ptr, t.shape, t.strides, t.dtype, t.device) == (a.ptr, (2, 3), (3, 1), "bfloat16", 0)
    with pytest.raises(BufferError):
        a.__dlpack__(copy=True)


def test_dtype_names():
    assert memory.dtype_name(np.float32) == "float32"
    assert memory.dtype_name("torch.bfloat16") == "bfloat16"
    assert memory.dtype_name("bf16") == "bfloat16"
    assert memory.dtype_name(np.dtype("bool")) == "bool"
    with pytest.raises(TypeError, match="unsupported dtype"):
        memory.dtype_name("complex64")
    assert all(memory.itemsize(n) == v[0] for n, v in memory.DTYPES.items())
    assert not math.isnan(memory.itemsize("bfloat16"))


def test_out_of_memory_releases_other_caches_then_retries_once(fake_cu, monkeypatch):
    """cuMemAlloc out of memory: the registered hooks (interop: torch's / CuPy's caches) run, the allocation is
    tried once more; a second failure, or no hook that released anything, raises the driver's error."""
    from vkc_runtime import driver
    from vkc_runtime.errors import CudaError
    oom = (fake_cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, 0)
    real_alloc, fails = fake_cu.cuMemAlloc, [1]

    def alloc(n):
        if fails[0]:
            fails[0] -= 1
            fake_cu._r("cuMemAlloc", n)
            return oom
        return real_alloc(n)
    monkeypatch.setattr(fake_cu, "cuMemAlloc", alloc, raising=False)
    released = []
    monkeypatch.setattr(driver, "_oom_hooks", [lambda: released.append(1) or True])
    before = driver.oom_retries()
    a = DeviceArray.empty((4,), "float32")
    assert a.ptr and released == [1] and len(fake_cu.calls("cuMemAlloc")) == 2 and driver.oom_retries() == before + 1
    fails[0] = 2  # the retry fails too: its error stands
    with pytest.raises(CudaError, match="OUT_OF_MEMORY"):
        DeviceArray.empty((4,), "float32")
    assert released == [1, 1]
    fails[0] = 1  # a hook that released nothing (or raised): no retry
    monkeypatch.setattr(driver, "_oom_hooks", [lambda: False, lambda: 1 / 0])
    with pytest.raises(CudaError, match="OUT_OF_MEMORY"):
        DeviceArray.empty((4,), "float32")
    assert fails[0] == 0 and driver.oom_retries() == before + 2


def test_interop_releases_torch_cache_only_outside_capture(monkeypatch):
    """The torch hook empties torch's cache when torch's CUDA is initialised and no capture runs (neither torch's
    current stream nor a vkc capture); never imports torch itself."""
    calls = []

    class Cuda:
        capturing = False

        def is_initialized(self):
            return True

        def is_current_stream_capturing(self):
            return self.capturing

        def empty_cache(self):
            calls.append("empty_cache")

    class Torch:
        cuda = Cuda()
    monkeypatch.setitem(sys.modules, "torch", Torch)
    assert interop._release_torch_cache() is True and calls == ["empty_cache"]
    from vkc_runtime import deferred
    with deferred.frees_deferred():  # a vkc graph capture runs: a free would invalidate it
        assert interop._release_torch_cache() is False and calls == ["empty_cache"]
    Torch.cuda.capturing = True
    assert interop._release_torch_cache() is False and calls == ["empty_cache"]
    monkeypatch.delitem(sys.modules, "torch")
    assert interop._release_torch_cache() is False
