"""VkcBackend's stream and graph path without a driver (the fake memory and kernel recorders of
tests/test_engine_vkc_backend_fake.py): every kernel launch of every step -- eager prefill and mixed steps, the
graph runner's warm-up, capture and replays -- goes to the backend's own stream (never None / the legacy
default stream), the captured decode steps take ops.gemv for M <= GEMV_MAX_M through the real gemv validation,
and the gemv workspace never grows during a capture."""
from __future__ import annotations

import pytest

from tests.engine_fixtures import HEADS_27B, make_checkpoint
from tests.ops_fakes import declared_bases, patch_ops
from tests.test_engine_vkc_backend_fake import FakeDeviceBackend, _Rec, fake_vkc  # noqa: F401  (fixture)

pytest.importorskip("transformers")

from vkc_engine import LLM, SamplingParams  # noqa: E402
from vkc_engine.backend import GEMV_MAX_M  # noqa: E402

STREAM = 0x5A5A_0000


class StreamBackend(FakeDeviceBackend):
    """The fake device backend with a stream handle and the graph methods: "capture" runs the calls once (so
    the recorders see what a capture would launch), "replay" runs them again."""
    supports_graphs = True

    def __init__(self):
        super().__init__()
        self._s = STREAM
        self._gemv_need = {}
        self._events = []
        self.captures = self.replays = 0
        self.ws_sizes_in_capture = []
        self.gemm.streams = []
        lin = self.gemm.linear

        def linear(x, weight, out=None, *, stream=None):
            self.gemm.streams.append(stream)
            return lin(x, weight, out, stream=stream)
        self.gemm.linear = linear

    def synchronize(self):
        pass

    def capture(self, fn):
        self.captures += 1
        ws = self._gemv_ws
        self._capturing = True
        try:
            fn()
        finally:
            self._capturing = False
        assert self._gemv_ws is ws, "the gemv workspace was replaced during a capture"
        return fn

    def replay(self, g):
        self.replays += 1
        g()

    def release_graph(self, g):
        pass


def _record_streams(rec, seen):
    make = rec._make

    def _make(base):
        k = make(base)
        launch = k.launch

        def recorded(grid, args, stream=0, scratch=None):
            seen.append((base, stream))
            return launch(grid, args, stream, scratch)
        k.launch = recorded
        return k
    rec._make = _make


@pytest.fixture()
def launches(fake_vkc, monkeypatch):  # noqa: F811
    from vkc_runtime.ops import gemv
    r = _Rec(declared=declared_bases(gemv))
    patch_ops(monkeypatch, gemv, "get_kernel", r)
    patch_ops(monkeypatch, gemv, "_sm_count", lambda dev: 132)
    fake_vkc["gemv"] = r
    seen = []
    for rec in fake_vkc.values():
        _record_streams(rec, seen)
    return seen


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("fakegraphs")
    make_checkpoint(d, heads=HEADS_27B, seed=4)
    return d


def test_every_launch_is_on_the_backend_stream(launches, ckpt):
    be = StreamBackend()
    llm = LLM(ckpt, backend=be, max_num_seqs=5, max_num_batched_tokens=40, max_model_len=256, num_blocks=32,
              block_size=64)
    assert llm.graphs is not None and llm.graphs.buckets == (1, 2, 4, 5)
    assert be.captures == 4
    n_setup = len(launches)
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outs = llm.generate([[5] * 70, [7] * 3, [9], [11] * 30], sp)  # chunked, mixed, then decode of 4 -> 1 rows
    assert all(len(o.token_ids) == 4 for o in outs)
    assert be.replays > 0 and len(launches) > n_setup
    bad = [(b, s) for b, s in launches if s != STREAM]
    assert not bad, bad[:5]
    assert be.gemm.streams and set(be.gemm.streams) == {STREAM}
    gemv = [b for b, _ in launches if b.startswith("gemv.")]
    assert gemv, "captured decode steps take ops.gemv"
    # M <= GEMV_MAX_M = 16: the m16 kernels, the CUDA-core m1 ones in the one-sequence bucket
    assert {b.split(".")[2] for b in gemv if not b.endswith("splitk_reduce")} == {"m1", "m16"}
    assert GEMV_MAX_M == 16
    assert be._small_m == 0  # graph_ops() is over: eager steps keep the GEMM
    assert max(be._gemv_need.values()) <= (0 if be._gemv_ws is None else be._gemv_ws.size)


def test_gemv_workspace_grows_eagerly_never_in_capture(launches):
    from vkc_runtime import memory
    from vkc_runtime.ops import gemv
    be = StreamBackend()
    M, N, K = 2, 1024, 5120  # 16 output programs of the wide tile on 264 slots (recorder occupancy 2): K split
    need = gemv.split_workspace_elems(M, N, K)
    assert need > 0 and need % (M * N) == 0
    assert gemv.split_workspace_elems(16, 248320, 5120) == 0  # the LM head: enough programs, no split
    be._capturing = True
    assert be._gemv_plan(M, N, K) == (False, None) and be._gemv_ws is None  # unseen in a capture: the GEMM
    be._capturing = False
    ok, ws = be._gemv_plan(M, N, K)
    assert ok and ws is be._gemv_ws and ws.size == need
    assert be._gemv_plan(M, N, K) == (True, ws)
    assert be._gemv_plan(M, N, 5112) == (False, None)  # K % 16 != 0: the GEMM
    # a call that does not split gets no workspace, whatever its M * N against the workspace's size
    assert gemv.split_workspace_elems(16, 248320, 256) == 0 and 16 * 248320 > ws.size
    assert be._gemv_plan(16, 248320, 256) == (True, None)
    x, w, out = (memory.DeviceArray((16, 256), "bfloat16", ptr=1 << 40, device=0),
                 memory.DeviceArray((248320, 256), "bfloat16", ptr=1 << 41, device=0),
                 memory.DeviceArray((16, 248320), "bfloat16", ptr=1 << 42, device=0))
    be._small_m = GEMV_MAX_M
    be.linear(x, w, out)  # the real gemv validation: a small workspace passed with a non-split call once raised
    assert [b for b, _ in launches if b.startswith("gemv.")] and not be.gemm.calls


def test_eager_steps_keep_the_gemm(launches, ckpt):
    be = StreamBackend()
    llm = LLM(ckpt, backend=be, max_num_seqs=4, max_num_batched_tokens=40, max_model_len=256, num_blocks=32,
              block_size=64, enforce_eager=True)
    assert llm.graphs is None and be.captures == 0
    llm.generate([[7] * 3, [9]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert not [b for b, _ in launches if b.startswith("gemv.")]
    assert launches and {s for _, s in launches} == {STREAM} and set(be.gemm.streams) == {STREAM}


class _StubDriver:
    """The four driver calls of the upload path, on real host memory: pinned allocations are ctypes buffers, a
    copy reads its source bytes when it is queued and completes at the next stream synchronisation."""

    class cu:
        cuMemHostAlloc, cuMemFreeHost, cuStreamSynchronize, cuMemcpyHtoDAsync = "alloc", "free", "sync", "copy"

    def __init__(self):
        self.bufs, self.log, self.pending = {}, [], []

    def call(self, fn, *args, detail=""):
        import ctypes
        self.log.append((fn,) + args)
        if fn == "alloc":
            b = ctypes.create_string_buffer(args[0])
            self.bufs[ctypes.addressof(b)] = b
            return ctypes.addressof(b)
        if fn == "free":
            assert not self.pending, "pinned memory freed under a queued copy"
            del self.bufs[args[0]]
        elif fn == "copy":
            dst, src, n, stream = args
            assert stream == STREAM
            assert any(a <= src and src + n <= a + len(b) for a, b in self.bufs.items()), "source not pinned"
            self.pending.append((src, n, ctypes.string_at(src, n)))
        elif fn == "sync":
            assert args == (STREAM,)
            for src, n, data in self.pending:  # the copies run now: their sources must still hold their bytes
                assert ctypes.string_at(src, n) == data, "a staging region was rewritten before its copy ran"
            self.pending.clear()


def test_uploads_use_a_pinned_ring_on_the_stream(monkeypatch):
    import numpy as np

    import vkc_engine.backend as B
    from vkc_runtime.memory import DeviceArray
    monkeypatch.setattr(B, "STAGING_BYTES", 4096)
    be = B.VkcBackend.__new__(B.VkcBackend)
    from vkc_runtime import memory
    from vkc_runtime.tensor import TensorRef
    be._drv, be._mem, be._Ref, be._s = _StubDriver(), memory, TensorRef, STREAM
    dst = DeviceArray((4096,), "int32", ptr=1 << 40, device=0)
    rng = np.random.default_rng(0)
    for i in range(40):  # 40 uploads of ~1 KiB through a 4 KiB ring: it wraps, synchronising first
        host = rng.integers(-9, 9, int(rng.integers(1, 300))).astype(np.int32)
        view = be.upload_into(dst, host)
        assert view.ptr == dst.ptr and view.shape == host.shape
    log = be._drv.log
    assert [c[0] for c in log].count("alloc") == 1 and log[0][1] == 4096
    assert 5 <= [c[0] for c in log].count("sync") < 40  # once per wrap, not per upload
    big = np.arange(3000, dtype=np.int32)  # 12 KB: more than half the ring, which grows (the old one freed safely)
    be.upload_into(dst, big)
    allocs = [c for c in log if c[0] == "alloc"]
    assert len(allocs) == 2 and allocs[1][1] >= 4 * big.nbytes and [c[0] for c in log].count("free") == 1
    be.upload_into(dst, np.ones(7, np.int64))
    be.synchronize()
    assert not be._drv.pending
