"""``vkc_runtime.ops.gemm`` without a driver: the tile rules, the exact launcher arguments (pointers, row strides,
M, N, K, stream) of both lanes of ``linear`` (CuTe: the C launcher; Triton: checked against the committed sm_90a
manifest by tests/ops_fakes.Recorder) and of ``linear_w4a16``, for dense and strided operands, and every
host-checkable problem refused before any launch (the recorded launches stay empty)."""
from __future__ import annotations

import pytest

from tests.ops_fakes import Dev, install_recorder
from vkc_runtime.errors import MissingKernelError
from vkc_runtime.ops import gemm as G
from vkc_runtime.ops._check import OpError


class FakeKernel:
    device = 0

    def __init__(self, base, calls):
        self.base, self.calls = base, calls

    def launch(self, *args):
        assert len(args) == 10 and all(isinstance(a, int) for a in args), args
        self.calls.append((self.base, args))


@pytest.fixture()
def calls(monkeypatch):
    got: list = []
    monkeypatch.setattr(G, "get_kernel", lambda base: (base in G.OPTIONAL_BASES or pytest.fail(base))
                        and FakeKernel(base, got))
    monkeypatch.setattr(G, "has_kernel", lambda base: True)
    monkeypatch.setattr(G, "_sm_count", lambda dev: 132)
    return got


def ptr(d: Dev) -> int:
    return d.__cuda_array_interface__["data"][0]


def test_tile_rule():
    # M = 2048, N = 5120: 320 wide tiles fill 3 waves at 81%, 640 narrow ones 5 waves at 97%
    assert G.pick_tile(2048, 5120, 132) == 128
    assert G.pick_tile(8192, 34816, 132) == 256          # 66 full waves: the widest tile
    assert G.pick_tile(4096, 10240, 132) == 256
    assert G.pick_tile(2048, 64, 132) == 64              # N = 64: a 256-wide tile would be 3/4 padding
    assert G.pick_tile(16, 5120, 132) == 64              # few rows: more CTAs
    assert G.pick_tile(255, 10240, 132) == 256
    assert G.pick_tile(1, 10240, 132) == 128
    assert G.pick_tile(2048, 5120, 132, tiles=(256,)) == 256
    assert set(G.OPTIONAL_BASES) == ({G.gemm_base(t) for t in G.TILES} | {G.fp8_base(t) for t in G.TILES}
                                     | {G.fp8_block_base(*t) for t in G.FP8_BLOCK_TILES})
    assert G.pick_block_tile(8192, 10240, 132) == (192, 128)
    assert G.pick_block_tile(2048, 10240, 132) == (192, 128)
    assert G.pick_block_tile(255, 2048, 132) == (128, 64)   # 32 wide tiles on 132 SMs: the narrow ones
    assert G.pick_block_tile(2048, 5120, 132) == (128, 128)  # 440 tall tiles: 3.3 waves; 640: 4.85 waves
    assert G.BASES == tuple(G.mma_base(*t) for t in G.MMA_TILES) + tuple(G.w4a16_base(*t) for t in G.W4A16_TILES) + \
        (G.DEQUANT_BASE,)
    T = G.MMA_TILES
    assert G.pick_mn_tile(8192, 34816, 132, T, G.MMA_TILE_FACTOR) == (128, 256)
    assert G.pick_mn_tile(2048, 5120, 132, T, G.MMA_TILE_FACTOR) == (128, 128)   # 320 wide tiles: 3 waves at 81%
    assert G.pick_mn_tile(100, 5120, 132, T, G.MMA_TILE_FACTOR) == (64, 128)     # few rows: less M padding


def test_linear_launch_arguments(calls):
    x, w, y = Dev((300, 4096)), Dev((2048, 4096)), Dev((300, 2048))
    assert G.linear(x, w, y, stream=0) is y
    base, args = calls[0]
    assert base == G.gemm_base(G.pick_tile(300, 2048, 132))
    assert args == (ptr(x), 4096, ptr(w), 4096, ptr(y), 2048, 300, 2048, 4096, 0)


def test_linear_strided_views(calls):
    # x: the first 512 columns of a [7, 1024] buffer; out: columns 64.. of a [7, 192] buffer (row strides > cols)
    x = Dev((7, 512), strides=(1024, 1))
    y = Dev((7, 128), strides=(192, 1), offset=64)
    w = Dev((128, 512))
    G.linear(x, w, y)
    assert calls[0][1][:6] == (ptr(x), 1024, ptr(w), 512, ptr(y), 192)
    # one row: its row stride is never read (torch may report anything), the row length is passed
    x1 = Dev((1, 512), strides=(3, 1))
    G.linear(x1, w, Dev((1, 128)))
    assert calls[1][1][1] == 512 and calls[1][1][6:9] == (1, 128, 512)


def test_linear_empty_does_not_launch(calls):
    y = Dev((0, 64))
    assert G.linear(Dev((0, 128)), Dev((64, 128)), y) is y
    G.linear(Dev((5, 128)), Dev((0, 128)), Dev((5, 0)))
    assert calls == []


def test_linear_without_kernel(monkeypatch, calls):
    monkeypatch.setattr(G, "has_kernel", lambda base: False)
    with pytest.raises(MissingKernelError, match="no Triton bf16 GEMM"):
        G.linear(Dev((5, 128)), Dev((64, 128)), Dev((5, 64)))
    with pytest.raises(MissingKernelError, match="no CuTe bf16 GEMM"):
        G.linear(Dev((5, 128)), Dev((64, 128)), Dev((5, 64)), _lane="cute")
    with pytest.raises(OpError, match="_lane must be"):
        G.linear(Dev((5, 128)), Dev((64, 128)), Dev((5, 64)), _lane="wgmma")
    assert calls == []


@pytest.fixture()
def rec(monkeypatch):
    """The Triton lane (no CuTe kernel on the arch), launches recorded against the sm_90a manifest."""
    r = install_recorder(monkeypatch, G)
    monkeypatch.setattr(G, "has_cute", lambda: False)
    return r


def test_triton_lane_arguments(rec):
    M, N, K = 300, 2048, 4096
    x, w, y = Dev((M, K)), Dev((N, K)), Dev((M, N))
    assert G.linear(x, w, y, stream=0) is y
    (base, grid, args), = rec.calls
    bm, bn = G.pick_mn_tile(M, N, 132, G.MMA_TILES, G.MMA_TILE_FACTOR)
    assert base == G.mma_base(bm, bn) and grid == (-(-M // bm) * -(-N // bn), 1, 1)
    assert args == (ptr(x), ptr(w), ptr(y), M, N, K, K, K, N)
    # strided views: x the first 512 columns of a [7, 1024] buffer, out columns 64.. of a [7, 200] buffer
    x2, y2 = Dev((7, 512), strides=(1024, 1)), Dev((7, 128), strides=(200, 1), offset=64)
    G.linear(x2, Dev((128, 512)), y2)
    assert rec.calls[1][2][6:] == (1024, 512, 200)


@pytest.mark.parametrize("args, msg", [
    (lambda: (Dev((4, 24)), Dev((64, 24)), Dev((4, 64))), "the Triton lane needs K (24)"),
    (lambda: (Dev((4, 64), strides=(72, 1)), Dev((64, 64)), Dev((4, 64))), "row strides (72 / 64)"),
    (lambda: (Dev((4, 64)), Dev((64, 64), strides=(136, 1)), Dev((4, 64))), "row strides (64 / 136)"),
])
def test_triton_lane_refuses_before_launch(rec, args, msg):
    with pytest.raises(OpError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        G.linear(*args())
    assert rec.calls == []


U8 = "|u1"


def test_w4a16_arguments(rec):
    M, N, K = 300, 2048, 4096
    x, p, sc, y = Dev((M, K)), Dev((N, K // 2), U8), Dev((N, K // 16), U8), Dev((M, N))
    assert G.linear_w4a16(x, p, sc, 0.25, y) is y
    (base, grid, args), = rec.calls
    bm, bn = G.pick_mn_tile(M, N, 132, G.W4A16_TILES, G.MMA_TILE_FACTOR)
    assert base == G.w4a16_base(bm, bn) and grid == (-(-M // bm) * -(-N // bn), 1, 1)
    assert args == (ptr(x), ptr(p), ptr(sc), ptr(y), 0.25, M, N, K, K, K // 2, K // 16, N)


@pytest.mark.parametrize("args, msg", [
    (lambda: (Dev((4, 512)), Dev((64, 128), U8), Dev((64, 16), U8), 1.0), "x has K=512, the weights have K=256"),
    (lambda: (Dev((4, 256)), Dev((64, 128), U8), Dev((64, 8), U8), 1.0), "weight_scale has shape (64, 8)"),
    (lambda: (Dev((4, 256)), Dev((64, 128), "<f4"), Dev((64, 16), U8), 1.0), "weight_packed must be uint8"),
    (lambda: (Dev((4, 256)), Dev((64, 128), U8), Dev((64, 16), U8), float("inf")), "global_scale must be finite"),
    (lambda: (Dev((4, 256)), Dev((64, 128), U8, strides=(136, 1)), Dev((64, 16), U8), 1.0),
     "weight_packed row stride (136)"),
    (lambda: (Dev((4, 256), strides=(264, 1)), Dev((64, 128), U8), Dev((64, 16), U8), 1.0),
     "row stride that is a multiple of 16 (got 264)"),
])
def test_w4a16_refuses_before_launch(rec, args, msg):
    x, p, sc, a = args()
    with pytest.raises(OpError) as e:
        G.linear_w4a16(x, p, sc, a, Dev((4, 64)))
    assert msg in str(e.value), str(e.value)
    assert rec.calls == []


@pytest.mark.parametrize("args, msg", [
    (lambda: (Dev((4, 64), "<f4"), Dev((64, 64)), Dev((4, 64))), "x must be bfloat16, got float32"),
    (lambda: (Dev((4, 64)), Dev((64, 64), "<f2"), Dev((4, 64))), "weight must be bfloat16"),
    (lambda: (Dev((4, 64)), Dev((64, 64)), Dev((4, 64), "<f4")), "out must be bfloat16"),
    (lambda: (Dev((4, 4, 16)), Dev((64, 64)), Dev((4, 64))), "x must have 2 dims"),
    (lambda: (Dev((4, 64)), Dev((64, 72)), Dev((4, 64))), "expected dim 1 == K = 64"),
    (lambda: (Dev((4, 64)), Dev((64, 64)), Dev((4, 72))), "out has shape (4, 72)"),
    (lambda: (Dev((4, 60)), Dev((64, 60)), Dev((4, 64))), "K = 60 and N = 64 must be positive multiples of 8"),
    (lambda: (Dev((4, 64)), Dev((60, 64)), Dev((4, 60))), "K = 64 and N = 60"),
    (lambda: (Dev((4, 0)), Dev((64, 0)), Dev((4, 64))), "K = 0"),
    (lambda: (Dev((4, 64), strides=(128, 2)), Dev((64, 64)), Dev((4, 64))), "x must be contiguous in its last dim"),
    (lambda: (Dev((4, 64), strides=(68, 1)), Dev((64, 64)), Dev((4, 64))), "x row stride 68 must be a multiple of 8"),
    (lambda: (Dev((4, 64), strides=(32, 1)), Dev((64, 64)), Dev((4, 64))), "x rows overlap (row stride 32 < K = 64)"),
    (lambda: (Dev((4, 64)), Dev((64, 64), strides=(72, 1)), Dev((4, 64), strides=(2**36, 1))),
     "out row stride 68719476736 exceeds"),
    (lambda: (Dev((4, 64), offset=1), Dev((64, 64)), Dev((4, 64))), "x data pointer"),
    (lambda: (Dev((4, 64)), Dev((64, 64), offset=4), Dev((4, 64))), "weight data pointer"),
    (lambda: (Dev((4, 64)), Dev((64, 64)), Dev((4, 64), offset=4)), "out data pointer"),
])
def test_linear_refuses_before_launch(calls, args, msg):
    with pytest.raises(OpError) as e:
        G.linear(*args())
    assert msg in str(e.value), str(e.value)
    assert calls == []


def test_linear_refuses_overlap(calls):
    x = Dev((4, 64))
    base = ptr(x)
    with pytest.raises(OpError, match="out must not overlap x"):
        G.linear(x, Dev((64, 64)), Dev((4, 64), device_ptr=base + 128))
    w = Dev((64, 64))
    with pytest.raises(OpError, match="out must not overlap weight"):
        G.linear(Dev((4, 64)), w, Dev((4, 64), device_ptr=ptr(w) + 64 * 64 * 2 - 16))
    G.linear(x, Dev((64, 64)), Dev((4, 64), device_ptr=base + 4 * 64 * 2))  # adjacent, not overlapping
    assert len(calls) == 1


def test_w4a16_workspace_dequantizes_then_runs_the_bf16_gemm(rec):
    M, N, K = G.DEQUANT_MIN_M, 2048, 4096
    x, p, sc, y = Dev((M, K)), Dev((N, K // 2), U8), Dev((N, K // 16), U8), Dev((M, N))
    ws = Dev((N * K + 64,))
    G.linear_w4a16(x, p, sc, 0.25, y, workspace=ws)
    (b0, g0, a0), (b1, g1, a1) = rec.calls
    assert b0 == G.DEQUANT_BASE and g0 == (N // 16, K // 256, 1)
    assert a0 == (ptr(p), ptr(sc), ptr(ws), 0.25, N, K, K // 2, K // 16, K)
    bm, bn = G.pick_mn_tile(M, N, 132, G.MMA_TILES, G.MMA_TILE_FACTOR)
    assert b1 == G.mma_base(bm, bn) and a1 == (ptr(x), ptr(ws), ptr(y), M, N, K, K, K, N)
    # fewer rows: the fused kernel, the workspace untouched
    G.linear_w4a16(Dev((M - 1, K)), p, sc, 0.25, Dev((M - 1, N)), workspace=ws)
    assert rec.calls[2][0].startswith("gemm.w4a16.")
    with pytest.raises(OpError, match="the dequantized weights need"):
        G.linear_w4a16(x, p, sc, 0.25, y, workspace=Dev((N * K - 8,)))
    with pytest.raises(OpError, match="workspace must be bfloat16"):
        G.linear_w4a16(x, p, sc, 0.25, y, workspace=Dev((N * K,), "<f4"))
    assert len(rec.calls) == 3


def test_dequantize_nvfp4_arguments(rec):
    N, K = 300, 512
    p, sc, out = Dev((N, K // 2), U8), Dev((N, K // 16), U8), Dev((N, K))
    assert G.dequantize_nvfp4(p, sc, 2.0, out) is out
    (base, grid, args), = rec.calls
    assert base == G.DEQUANT_BASE and grid == (-(-N // 16), 2, 1) and args == (ptr(p), ptr(sc), ptr(out), 2.0, N, K,
                                                                             K // 2, K // 16, K)
    with pytest.raises(OpError, match="row stride that is a multiple of 16"):
        G.dequantize_nvfp4(p, sc, 2.0, Dev((N, K), strides=(K + 8, 1)))
