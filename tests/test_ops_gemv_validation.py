"""The gemv ops refuse bad input before any launch, pick kernels by the documented rule, and pass exactly the
argument list each compiled kernel declares (checked against the committed sm_90a manifest); the dispatch rule
itself as a pure function."""
from __future__ import annotations

import pytest

from tests.ops_fakes import Dev, Recorder, declared_bases
from vkc_runtime.ops import gemv as G
from vkc_runtime.ops._check import OpError

U8, F32 = "|u1", "<f4"


@pytest.fixture()
def rec(monkeypatch):
    r = Recorder(occupancy=2, declared=declared_bases(G))
    monkeypatch.setattr(G, "get_kernel", r)
    monkeypatch.setattr(G, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(G, "is_capturing", lambda s: False)
    return r


def ws(n=1 << 22):
    return Dev((n,), F32)


def test_bf16_direct_launch_args(rec):
    M, N, K = 7, 16480, 5120
    G.gemv(Dev((M, K)), Dev((N, K)), out=Dev((M, N)), workspace=ws())
    p = G.plan("bf16", M, N, K, 132, (2, 2))
    assert p.split == 1
    (base, grid, args), = rec.calls
    assert base == G._base("bf16", 16, p.bn, p.bk)
    assert grid == (-(-N // p.bn), 1, 1)
    assert args[4:] == (M, N, K, K, K, N, p.k_split)


def test_bf16_split_k_launches_reduce(rec):
    M, N, K = 16, 2048, 4096
    p = G.plan("bf16", M, N, K, 132, (2, 2))
    assert p.split > 1
    w = ws()
    G.gemv(Dev((M, K)), Dev((N, K)), out=Dev((M, N)), workspace=w)
    (b0, g0, a0), (b1, g1, a1) = rec.calls
    assert b0 == G._base("bf16", 16, p.bn, p.bk) and g0 == (-(-N // p.bn), p.split, 1)
    ws_ptr = w.__cuda_array_interface__["data"][0]
    assert a0[3] == ws_ptr and a1[0] == ws_ptr  # partials go through the workspace
    assert b1 == "gemv.splitk_reduce" and g1 == (-(-N // 1024), M, 1) and a1[2:] == (M, N, N, p.split)


def test_m_bucket_and_x_stride_for_one_row(rec):
    # (fake allocations are 256 MB apart: weights kept below that)
    G.gemv(Dev((1, 2048)), Dev((4096, 2048)), out=Dev((1, 4096)), workspace=ws())
    G.gemv(Dev((1, 2048)), Dev((20480, 2048)), out=Dev((1, 20480)), workspace=ws())
    G.gemv(Dev((2, 2048)), Dev((20480, 2048)), out=Dev((2, 20480)), workspace=ws())
    G.gemv(Dev((33, 2048)), Dev((20480, 2048)), out=Dev((33, 20480)), workspace=ws(1 << 24))
    main = [c for c in rec.calls if c[0] != "gemv.splitk_reduce"]
    assert main[0][0].startswith("gemv.bf16.m1.") and main[0][2][7] == 0  # M = 1: the CUDA-core kernel
    assert main[1][0].startswith("gemv.bf16.m16.") and main[1][2][7] == 0  # M = 1, N > 8192: the MMA kernel
    assert main[2][0].startswith("gemv.bf16.m16.") and main[2][2][7] == 2048
    assert main[3][0].startswith("gemv.bf16.m64.")


def test_w4a16_args_alpha_and_fp8_scales(rec):
    M, N, K = 4, 5120, 6144
    G.gemv_w4a16(Dev((M, K)), Dev((N, K // 2), U8), Dev((N, K // 16), U8), 0.25, out=Dev((M, N)), workspace=ws())
    base, grid, args = rec.calls[0]
    assert base.startswith("gemv.w4a16.m16.")
    assert args[5] == 0.25 and args[6:13] == (M, N, K, K, K // 2, K // 16, N)


def test_w8a16_args_and_block_scales(rec):
    """Block-FP8 weights: e4m3 (or uint8) [N, K], fp32 scales [cdiv(N, 128), cdiv(K, 128)] whose row stride (40
    at K = 5120) needs no multiple of 16; split-K through the workspace and the reduce."""
    M, N, K = 3, 6144, 5120
    G.gemv_w8a16(Dev((M, K)), Dev((N, K), U8), Dev((48, 40), F32), out=Dev((M, N)), workspace=ws())
    p = G.plan("w8a16", M, N, K, 132, (2, 2))
    base, grid, args = rec.calls[0]
    assert base == G._base("w8a16", 16, p.bn, p.bk) and grid == (-(-N // p.bn), p.split, 1)
    assert args[5:] == (M, N, K, K, K, 40, N, p.k_split)
    rec.calls.clear()
    M, N, K = 16, 2048, 4096
    p = G.plan("w8a16", M, N, K, 132, (2, 2))
    assert p.split > 1 and p.bk == 128
    G.gemv_w8a16(Dev((M, K)), Dev((N, K), U8), Dev((16, 32), F32), out=Dev((M, N)), workspace=ws())
    assert [c[0] for c in rec.calls] == [G._base("w8a16", 16, p.bn, 128), "gemv.splitk_reduce"]


def test_forced_plan(rec):
    p = G.Plan(32, 16, 256, 4, 1280)
    G.gemv(Dev((5, 5120)), Dev((64, 5120)), out=Dev((5, 64)), workspace=ws(), _plan=p)
    assert rec.calls[0][0] == "gemv.bf16.m32.n16.k256" and rec.calls[0][1] == (4, 4, 1)
    with pytest.raises(OpError, match="split == cdiv"):
        G.gemv(Dev((5, 5120)), Dev((64, 5120)), out=Dev((5, 64)), workspace=ws(), _plan=G.Plan(32, 16, 256, 3, 1280))
    with pytest.raises(OpError, match="names no compiled kernel"):
        G.gemv(Dev((50, 5120)), Dev((64, 5120)), out=Dev((50, 64)), workspace=ws(), _plan=p)


@pytest.mark.parametrize("call, msg", [
    (lambda: G.gemv(Dev((4, 64), F32), Dev((8, 64)), out=Dev((4, 8))), "x must be bfloat16"),
    (lambda: G.gemv(Dev((4, 64)), Dev((8, 48)), out=Dev((4, 8))), "x has K=64, the weights have K=48"),
    (lambda: G.gemv(Dev((4, 40)), Dev((8, 40)), out=Dev((4, 8))), "K=40 must be a positive multiple of 16"),
    (lambda: G.gemv(Dev((65, 64)), Dev((8, 64)), out=Dev((65, 8))), "M=65 exceeds max_m"),
    (lambda: G.gemv(Dev((4, 64)), Dev((8, 64)), out=Dev((4, 9))), "out has shape"),
    (lambda: G.gemv(Dev((4, 64)), Dev((8, 64), offset=4), out=Dev((4, 8))), "weight must be 16-byte aligned"),
    (lambda: G.gemv(Dev((4, 64)), Dev((8, 64), strides=(72, 1)), out=Dev((4, 8))),
     "weight row stride \\(72\\) must be a multiple of 16"),
    (lambda: G.gemv(Dev((4, 64), strides=(72, 1)), Dev((8, 64)), out=Dev((4, 8))), "x row stride"),
    (lambda: G.gemv(Dev((4, 64)), Dev((8, 64)), out=Dev((4, 8), offset=1)), "out must be 16-byte aligned"),
    (lambda: G.gemv(Dev((4, 64), strides=(2, 1)), Dev((8, 64)), out=Dev((4, 8))), "x row stride"),
    (lambda: G.gemv(Dev((4, 64)), Dev((8, 64)), out=Dev((4, 8), strides=(8, 2))), "contiguous in its last dim"),
    (lambda: G.gemv(Dev((16, 4096)), Dev((64, 4096)), out=Dev((16, 64)), workspace=Dev((100,), F32)),
     "workspace has 100 float32 elements"),
    (lambda: G.gemv(Dev((16, 4096)), Dev((64, 4096)), out=Dev((16, 64)), workspace=Dev((1 << 20,))),
     "workspace must be float32"),
    (lambda: G.gemv_w4a16(Dev((4, 64)), Dev((8, 32), U8), Dev((8, 4), U8), float("nan"), out=Dev((4, 8))),
     "global_scale must be finite"),
    (lambda: G.gemv_w4a16(Dev((4, 64)), Dev((8, 32), U8), Dev((8, 4), U8), "x", out=Dev((4, 8))),
     "global_scale must be a float"),
    (lambda: G.gemv_w4a16(Dev((4, 64)), Dev((8, 32)), Dev((8, 4), U8), 1.0, out=Dev((4, 8))),
     "weight_packed must be uint8"),
    (lambda: G.gemv_w4a16(Dev((4, 64)), Dev((8, 32), U8), Dev((8, 2), U8), 1.0, out=Dev((4, 8))),
     "weight_scale has shape"),
    (lambda: G.gemv_w4a16(Dev((4, 64)), Dev((8, 32), U8), Dev((8, 4), F32), 1.0, out=Dev((4, 8))),
     "weight_scale must be uint8"),
    (lambda: G.gemv_w4a16(Dev((4, 64)), Dev((8, 32), U8), Dev((8, 4), U8), 1.0, out=Dev((4, 8))),
     "weight_scale row stride \\(4\\)"),
    (lambda: G.gemv_w4a16(Dev((4, 48)), Dev((8, 24), U8), Dev((8, 3), U8, strides=(16, 1)), 1.0, out=Dev((4, 8))),
     "weight_packed row stride \\(24\\)"),
    (lambda: G.gemv_w4a16(Dev((4, 40)), Dev((8, 20), U8), Dev((8, 2), U8), 1.0, out=Dev((4, 8))),
     "K = 2 \\* weight_packed.shape\\[1\\] = 40"),
    (lambda: G.gemv_w8a16(Dev((4, 64)), Dev((8, 64)), Dev((1, 1), F32), out=Dev((4, 8))),
     "weight must be uint8"),
    (lambda: G.gemv_w8a16(Dev((4, 64)), Dev((8, 64), U8), Dev((1, 2), F32), out=Dev((4, 8))),
     "weight_scale_inv has shape"),
    (lambda: G.gemv_w8a16(Dev((4, 64)), Dev((8, 64), U8), Dev((1, 1)), out=Dev((4, 8))),
     "weight_scale_inv must be float32"),
    (lambda: G.gemv_w8a16(Dev((4, 64)), Dev((8, 64), U8), Dev((1, 1), F32, offset=1), out=Dev((4, 8))),
     "weight_scale_inv must be 16-byte aligned"),
    (lambda: G.gemv_w8a16(Dev((4, 64)), Dev((8, 64), U8, strides=(72, 1)), Dev((1, 1), F32), out=Dev((4, 8))),
     "weight row stride \\(72\\)"),
    (lambda: G.gemv_w8a16(Dev((4, 40)), Dev((8, 40), U8), Dev((1, 1), F32), out=Dev((4, 8))),
     "K=40 must be a positive multiple of 16"),
    (lambda: G.gemv_w8a16(Dev((65, 64)), Dev((8, 64), U8), Dev((1, 1), F32), out=Dev((65, 8))),
     "M=65 exceeds max_m"),
])
def test_bad_inputs_refused_before_launch(rec, call, msg):
    with pytest.raises(OpError, match=msg):
        call()
    assert rec.calls == []


def test_out_overlapping_inputs_refused(rec):
    buf = 1 << 40
    x = Dev((4, 64), device_ptr=buf)
    with pytest.raises(OpError, match="out must not overlap x"):
        G.gemv(x, Dev((8, 64)), out=Dev((4, 8), device_ptr=buf + 64))
    w = Dev((8, 64), device_ptr=buf + (1 << 20))
    with pytest.raises(OpError, match="out must not overlap weight"):
        G.gemv(Dev((4, 64)), w, out=Dev((4, 8), device_ptr=buf + (1 << 20) + 256))
    assert rec.calls == []


def test_split_without_workspace_refused_inside_capture(rec, monkeypatch):
    monkeypatch.setattr(G, "is_capturing", lambda s: True)
    monkeypatch.setattr(G, "_default_ws", {})
    with pytest.raises(OpError, match="inside graph capture"):
        G.gemv(Dev((16, 4096)), Dev((2048, 4096)), out=Dev((16, 2048)))
    assert rec.calls == []


# ------------------------------------------------------------------------------------------ the rule

def test_plan_rule_properties():
    for kind in G.TILES:
        for N, K in [(16480, 5120), (5120, 17408), (248320, 2048), (2048, 4096), (48, 5120), (9216, 2048)]:
            for M in (1, 7, 16, 17, 33, 64):
                p = G.plan(kind, M, N, K, 132, (2, 4))
                # the smallest bucket that holds M (M = 1 outside M1_N_RANGE: the next one)
                lo, hi = G.M1_N_RANGE.get(kind, (0, N))
                skip1 = M == 1 and not lo <= N <= hi
                assert M <= p.bm and p.bm in G.BUCKETS[kind]
                assert all(b < M or (skip1 and b == 1) for b in G.BUCKETS[kind] if b < p.bm)
                assert (p.bn, p.bk) in G.tiles(kind, p.bm)
                assert p.k_split % p.bk == 0 and p.split == -(-K // p.k_split) <= G.MAX_SPLIT
                assert p.split * M * N <= G.workspace_elems(M, N)
    # few N blocks for the machine: split K; many: never
    assert G.plan("bf16", 16, 2048, 4096, 132, (2, 4)).split > 1
    assert G.plan("bf16", 1, 48, 5120, 132, (2, 4)).split > 1
    assert G.plan("bf16", 16, 248320, 5120, 132, (2, 4)).split == 1
    # BF16 at M = 1: the CUDA-core kernel for N in M1_N_RANGE; its 4-row tiles give N = 2048 enough programs
    # without split-K (H200: 6.5 us vs 9.0 for the MMA kernel split 4); other N: the MMA kernels (bucket 16)
    assert G.M1_N_RANGE["bf16"] == (1024, 8192)
    assert G.bucket("bf16", 1, 1023) == 16 and G.bucket("bf16", 1, 1024) == 1
    assert G.plan("bf16", 1, 2048, 4096, 132, (4,)) == G.Plan(1, 4, 1024, 1, 4096)
    assert G.plan("bf16", 1, 8192, 2048, 132, (4,)).bm == 1
    assert G.plan("bf16", 1, 8193, 2048, 132, (2, 4)).bm == 16 == G.bucket("bf16", 1, 8193)
    assert G.plan("bf16", 1, 248320, 2048, 132, (2, 4)).bm == 16
    assert G.plan("bf16", 2, 2048, 4096, 132, (2, 4)).bm == 16
    # FP8 at M = 1: no x re-read cost, the 4-row tile first (measured: BENCHMARKS.md session 35); at 10
    # programs per SM (sm_90a, 47/48 registers) it takes every 35B-A3B decode projection and the 27B ones at
    # N = 5120 and 34816, and the wave model still gives the lm_head the 8-row tile (its last wave is fuller)
    assert G.tiles("w8a16", 1)[0] == (4, 1024) and G.M1_L2_COST["w8a16"] == 0.0
    for N, K in [(12352, 2048), (2048, 4096), (9216, 2048), (5120, 6144), (5120, 17408), (34816, 5120)]:
        assert G.plan("w8a16", 1, N, K, 132, (10, 10)) == G.Plan(1, 4, 1024, 1, K), (N, K)
    assert G.plan("w8a16", 1, 248320, 2048, 132, (10, 10))[1:3] == (8, 512)
    # FP8 at M = 1: the CUDA-core kernel at every N
    assert G.plan("w8a16", 1, 248320, 5120, 132, (4, 4)).bm == 1 == G.bucket("w8a16", 1, 248320)
    with pytest.raises(OpError, match="outside 1..64"):
        G.plan("bf16", 65, 10, 16, 132)
    assert G.max_m() == 64


def test_wave_cost():
    assert G._wave_cost(264, 264) == 1.0
    assert G._wave_cost(528, 264) == 1.0
    assert G._wave_cost(10, 264) == pytest.approx(0.3 * 264 / 10)  # far too few programs: bandwidth-starved
    assert G._wave_cost(265, 264) > 1.0
