"""GPU (H200) checks of the CuTe DSL sm_90a BF16 GEMM artifact built by tools/cute/build.py.

The artifact is found through env VKC_CUTE_SO (path of gemm.x86_64.so; its JSON lies next to it); without it,
or without a GPU, every test here skips. C[M, N] = A[M, K] @ W[N, K]^T is compared with a float64 reference on
fresh random data, per row (a wrong tail row cannot hide in a global norm), into a NaN-poisoned output that sits
between poisoned guard rows (nothing outside C may be written).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.gpu.errlog import record

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

SO = os.environ.get("VKC_CUTE_SO", "")
if not SO or not Path(SO).is_file():
    pytest.skip("VKC_CUTE_SO does not name a built CuTe GEMM artifact", allow_module_level=True)

from tools.cute.gemm_lib import CuteGemmError, CuteGemmLib  # noqa: E402

TOL = 1e-2          # global relative error (bf16 output rounding alone gives ~3e-3)
ROW_TOL = 2e-2      # worst row
MS = [1, 7, 16, 64, 255, 2048, 8192]
NKS = [(10240, 5120), (5120, 6144), (34816, 5120), (2048, 4096)]


@pytest.fixture(scope="module")
def lib():
    lb = CuteGemmLib(SO)
    assert lb.info["arch"] == "sm_90a"
    return lb


def rnd(*shape, scale=1.0, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * scale).to(torch.bfloat16)


def guarded_out(m, n):
    """A NaN-poisoned [m, n] view with one poisoned guard row before and after it (16-byte aligned: n % 8 == 0)."""
    buf = torch.full(((m + 2) * n,), float("nan"), device="cuda", dtype=torch.bfloat16)
    return buf, buf[n:(m + 1) * n].view(m, n)


def check(out, a, w, buf, what):
    m, n = out.shape
    ref = a.double() @ w.double().T
    o = out.double()
    assert not torch.isnan(o).any(), f"{what}: NaN in output (unwritten or bad math)"
    err = float(torch.linalg.norm(o - ref) / torch.linalg.norm(ref))
    row_err = float((torch.linalg.norm(o - ref, dim=1) / torch.linalg.norm(ref, dim=1).clamp_min(1e-30)).max())
    guards = torch.cat([buf[:n], buf[(m + 1) * n:]])
    assert torch.isnan(guards.float()).all(), f"{what}: wrote outside C"
    record("cute_gemm", what=what, rel_err=err, worst_row=row_err)
    assert err < TOL, f"{what}: rel err {err:.3e}"
    assert row_err < ROW_TOL, f"{what}: worst row rel err {row_err:.3e}"


def test_artifact_facts(lib):
    info = lib.info
    assert info["needed"] and set(info["needed"]) <= {"libc.so.6", "libdl.so.2", "libpthread.so.0"}
    assert {c["sass_arch"] for c in info["cubins"]} == {"sm_90a"}
    assert lib.lib.vkc_cute_driver_status() == 0
    assert {(v["n"], v["k"]) for v in info["variants"]} >= set(NKS)


def variant(lib, n, k, tile_n):
    vs = [v for v in lib.variants[(n, k)] if v.tile_n == tile_n]
    assert len(vs) == 1, lib.variants[(n, k)]
    return vs[0].symbol


@pytest.mark.parametrize("tile_n", [256, 128])
@pytest.mark.parametrize("n,k", NKS)
@pytest.mark.parametrize("m", MS)
def test_gemm_matches_float64(lib, m, n, k, tile_n):
    seed = m * 7919 + n * 31 + k + tile_n
    a = rnd(m, k, seed=seed)
    w = rnd(n, k, scale=k ** -0.5, seed=seed + 1)
    buf, out = guarded_out(m, n)
    lib.gemm(a, w, out=out, symbol=variant(lib, n, k, tile_n))
    torch.cuda.synchronize()
    check(out, a, w, buf, f"M={m} N={n} K={k} tile 128x{tile_n}")


def test_default_pick_matches_float64(lib):
    m, n, k = 2048, 5120, 6144
    a = rnd(m, k, seed=21)
    w = rnd(n, k, scale=k ** -0.5, seed=22)
    buf, out = guarded_out(m, n)
    lib.gemm(a, w, out=out)
    torch.cuda.synchronize()
    check(out, a, w, buf, "picked variant M=2048 N=5120 K=6144")


def test_side_stream_and_graph_replay(lib):
    m, n, k = 300, 2048, 4096
    a = rnd(m, k, seed=1)
    w = rnd(n, k, scale=k ** -0.5, seed=2)
    buf, out = guarded_out(m, n)
    lib.gemm(a, w, out=out)  # warm-up outside capture (first launch loads the kernel into the context)
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        lib.gemm(a, w, out=out)
    assert torch.isnan(out.float()).all(), "capture ran the kernel"
    g.replay()
    torch.cuda.synchronize()
    check(out, a, w, buf, "graph replay M=300 N=2048 K=4096")
    # new inputs, same buffers: the replay reads them
    a.copy_(rnd(m, k, seed=3))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check(out, a, w, buf, "graph replay, new A")


def test_m_zero_is_a_no_op(lib):
    a = torch.empty((0, 4096), device="cuda", dtype=torch.bfloat16)
    w = rnd(2048, 4096, seed=5)
    out = torch.empty((0, 2048), device="cuda", dtype=torch.bfloat16)
    lib.gemm(a, w, out=out)
    torch.cuda.synchronize()


def test_host_checks_refuse_before_launch(lib):
    a = rnd(16, 4096, seed=6)
    w = rnd(2048, 4096, seed=7)
    big = rnd(16 * 4096 + 8, seed=8)
    with pytest.raises(ValueError, match="aligned"):
        lib.gemm(big[1:16 * 4096 + 1].view(16, 4096), w)
    with pytest.raises(ValueError, match="no kernel"):
        lib.gemm(rnd(16, 4104, seed=9), rnd(2048, 4104, seed=10))
    with pytest.raises(ValueError, match="contiguous"):
        lib.gemm(rnd(4096, 16, seed=11).T, w)
    with pytest.raises(ValueError, match="bfloat16"):
        lib.gemm(a.float(), w)


def test_c_launcher_refuses_bad_pointers(lib):
    """The C entry point checks on its own too (alignment, null, M range), returning CUDA_ERROR_INVALID_VALUE."""
    a = rnd(16, 4096, seed=12)
    w = rnd(2048, 4096, seed=13)
    out = torch.empty((16, 2048), device="cuda", dtype=torch.bfloat16)
    lib.load(torch.cuda.current_device())
    fn = lib.fns[variant(lib, 2048, 4096, 256)]
    st = torch.cuda.current_stream().cuda_stream
    assert fn(a.data_ptr() + 2, w.data_ptr(), out.data_ptr(), 16, st) == 1
    assert fn(a.data_ptr(), 0, out.data_ptr(), 16, st) == 1
    assert fn(a.data_ptr(), w.data_ptr(), out.data_ptr(), -1, st) == 1
    assert fn(a.data_ptr(), w.data_ptr(), out.data_ptr(), 2**31, st) == 1
    with pytest.raises(CuteGemmError):
        lib._check(fn(a.data_ptr(), w.data_ptr(), out.data_ptr() + 8, 16, st), "misaligned out")


def test_repeated_load_is_idempotent(lib):
    assert lib.lib.vkc_cute_load(torch.cuda.current_device()) == 0
    assert lib.lib.vkc_cute_load(torch.cuda.current_device()) == 0
    assert lib.lib.vkc_cute_load(-1) == 1


def test_rows_are_independent(lib):
    """Each output row depends only on its own A row: change one row of A, only that row of C changes."""
    m, n, k = 255, 5120, 6144
    a = rnd(m, k, seed=14)
    w = rnd(n, k, scale=k ** -0.5, seed=15)
    c1 = lib.gemm(a, w)
    a[200] = rnd(k, seed=16)
    c2 = lib.gemm(a, w)
    torch.cuda.synchronize()
    changed = (c1 != c2).any(dim=1).cpu().numpy()
    assert changed[200] and changed.sum() == 1, np.nonzero(changed)
