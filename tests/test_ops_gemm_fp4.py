"""``vkc_runtime.ops.gemm_fp4`` without a driver: the tile rule, the exact kernel arguments (checked against the
committed sm_90a manifest by tests/ops_fakes.Recorder: count, kinds, divisibility promises) of the NVFP4 W4A4 GEMM
and the quantizer, strided scale rows, and every host-checkable problem refused before any launch."""
from __future__ import annotations

import pytest

from tests.ops_fakes import Dev, install_recorder
from vkc_runtime.errors import MissingKernelError
from vkc_runtime.ops import gemm_fp4 as G
from vkc_runtime.ops._check import OpError

U8, F32, BF = "|u1", "<f4", "<V2"


@pytest.fixture()
def rec(monkeypatch):
    return install_recorder(monkeypatch, G)


def ptr(d: Dev) -> int:
    return d.__cuda_array_interface__["data"][0]


def test_tile_rule_and_names():
    pick = lambda m, n: G._gemm.pick_mn_tile(m, n, 132, G.TILES, G.TILE_FACTOR)  # noqa: E731
    assert pick(8192, 34816) == (128, 128)
    assert pick(16, 5120) == (64, 128)
    assert set(G.OPTIONAL_BASES) == {G.gemm_base(*t) for t in G.TILES} | {G.QUANT_BASE} and G.BASES == ()


def test_linear_w4a4_args(rec):
    M, N, K = 300, 2048, 4096
    x, w, y = Dev((M, K // 2), U8), Dev((N, K // 2), U8), Dev((M, N), BF)
    sa = Dev((M, K // 16), U8, strides=(272, 1))      # strided scale rows (any stride)
    sw, alpha = Dev((N, K // 16), U8), Dev((1,), F32)
    assert G.linear_w4a4(x, sa, w, sw, alpha, y) is y
    (base, grid, args), = rec.calls
    bm, bn = G._gemm.pick_mn_tile(M, N, 132, G.TILES, G.TILE_FACTOR)
    assert base == G.gemm_base(bm, bn)
    assert grid == (-(-M // bm) * -(-N // bn), 1, 1)
    assert args == (ptr(x), ptr(sa), ptr(w), ptr(sw), ptr(alpha), ptr(y), M, N, K, K // 2, 272, K // 2, K // 16, N)


def test_quantizer_args(rec):
    M, K = 9, 2080
    x, q, s, gs = Dev((M, K), BF, strides=(2096, 1)), Dev((M, K // 2), U8), Dev((M, K // 16), U8), Dev((1,), F32)
    assert G.quantize_nvfp4(x, gs, q, s) == (q, s)
    (base, grid, args), = rec.calls
    assert base == G.QUANT_BASE
    assert grid == (3, 17, 1)                          # cdiv(9, 4) row blocks x cdiv(130, 8) group blocks
    assert args == (ptr(x), ptr(gs), ptr(q), ptr(s), M, K, 2096, K // 2, K // 16)


def test_composite_runs_both(rec):
    M, N, K = 4, 64, 128
    G.linear_nvfp4_w4a4(Dev((M, K), BF), Dev((1,), F32), Dev((N, K // 2), U8), Dev((N, K // 16), U8), Dev((1,), F32),
                        Dev((M, N), BF), x_q=Dev((M, K // 2), U8), x_scale=Dev((M, K // 16), U8))
    assert [c[0] for c in rec.calls] == [G.QUANT_BASE, G.gemm_base(64, 128)]


def test_empty_does_not_launch(rec):
    y = Dev((0, 64), BF)
    assert G.linear_w4a4(Dev((0, 64), U8), Dev((0, 8), U8), Dev((64, 64), U8), Dev((64, 8), U8), Dev((1,), F32),
                         y) is y
    G.quantize_nvfp4(Dev((0, 128), BF), Dev((1,), F32), Dev((0, 64), U8), Dev((0, 8), U8))
    assert rec.calls == []


def test_without_kernel(monkeypatch, rec):
    monkeypatch.setattr(G, "has_kernel", lambda base: False)
    with pytest.raises(MissingKernelError, match="sm_100a, sm_120a, sm_121a"):
        G.linear_w4a4(Dev((5, 64), U8), Dev((5, 8), U8), Dev((64, 64), U8), Dev((64, 8), U8), Dev((1,), F32),
                      Dev((5, 64), BF))
    with pytest.raises(MissingKernelError):
        G.quantize_nvfp4(Dev((4, 128), BF), Dev((1,), F32), Dev((4, 64), U8), Dev((4, 8), U8))
    assert rec.calls == []


def _lin(x=None, sa=None, w=None, sw=None, alpha=None, y=None):
    return (x or Dev((4, 64), U8), sa or Dev((4, 8), U8), w or Dev((32, 64), U8), sw or Dev((32, 8), U8),
            alpha or Dev((1,), F32), y or Dev((4, 32), BF))


@pytest.mark.parametrize("args, msg", [
    (lambda: _lin(x=Dev((4, 64), BF)), "x_q must be uint8, got bfloat16"),
    (lambda: _lin(sw=Dev((32, 8), F32)), "w_scale must be float8_e4m3fn (or its uint8 bytes)"),
    (lambda: _lin(y=Dev((4, 32), F32)), "out must be bfloat16"),
    (lambda: _lin(alpha=Dev((1,), BF)), "alpha must be float32"),
    (lambda: _lin(alpha=Dev((2,), F32)), "alpha has shape (2,)"),
    (lambda: _lin(w=Dev((32, 48), U8)), "expected dim 1 == K / 2 = 64"),
    (lambda: _lin(sa=Dev((4, 6), U8)), "x_scale has shape (4, 6), expected (4, 8)"),
    (lambda: _lin(sw=Dev((32, 8), U8, strides=(4, 1))), "w_scale rows overlap"),
    (lambda: _lin(y=Dev((4, 40), BF)), "out has shape (4, 40)"),
    (lambda: _lin(x=Dev((4, 40), U8), sa=Dev((4, 5), U8), w=Dev((32, 40), U8), sw=Dev((32, 5), U8)),
     "K = 80 must be a positive multiple of 32"),
    (lambda: _lin(x=Dev((4, 64), U8, strides=(72, 1))), "x_q row stride 72 must be a multiple of 16"),
    (lambda: _lin(x=Dev((4, 64), U8, offset=8)), "x_q data pointer"),
    (lambda: _lin(y=Dev((4, 32), BF, offset=2)), "out data pointer"),
    (lambda: _lin(alpha=Dev((1,), F32, device_ptr=(1 << 40) + 2)), "alpha data pointer"),
])
def test_linear_w4a4_refuses_before_launch(rec, args, msg):
    with pytest.raises(OpError) as e:
        G.linear_w4a4(*args())
    assert msg in str(e.value), str(e.value)
    assert rec.calls == []


def test_refuses_overlap(rec):
    x = Dev((4, 64), U8)
    with pytest.raises(OpError, match="out must not overlap x_q"):
        G.linear_w4a4(x, Dev((4, 8), U8), Dev((32, 64), U8), Dev((32, 8), U8), Dev((1,), F32),
                      Dev((4, 32), BF, device_ptr=ptr(x) + 16))
    xx = Dev((4, 128), BF)
    with pytest.raises(OpError, match="scale must not overlap x"):
        G.quantize_nvfp4(xx, Dev((1,), F32), Dev((4, 64), U8), Dev((4, 8), U8, device_ptr=ptr(xx) + 64))
    assert rec.calls == []


@pytest.mark.parametrize("call, msg", [
    (lambda: G.quantize_nvfp4(Dev((4, 64), F32), Dev((1,), F32), Dev((4, 32), U8), Dev((4, 4), U8)),
     "x must be bfloat16"),
    (lambda: G.quantize_nvfp4(Dev((4, 64), BF), Dev((1,), F32), Dev((4, 32), BF), Dev((4, 4), U8)),
     "out must be uint8"),
    (lambda: G.quantize_nvfp4(Dev((4, 64), BF), Dev((1,), F32), Dev((4, 16), U8), Dev((4, 4), U8)),
     "out has shape (4, 16), expected (4, 32)"),
    (lambda: G.quantize_nvfp4(Dev((4, 64), BF), Dev((1,), F32), Dev((4, 32), U8), Dev((4, 2), U8)),
     "scale has shape (4, 2), expected (4, 4)"),
    (lambda: G.quantize_nvfp4(Dev((4, 48), BF), Dev((1,), F32), Dev((4, 24), U8), Dev((4, 3), U8)), "K = 48"),
    (lambda: G.quantize_nvfp4(Dev((4, 64), BF), Dev((3,), F32), Dev((4, 32), U8), Dev((4, 4), U8)),
     "global_scale has shape (3,)"),
    (lambda: G.quantize_nvfp4(Dev((4, 64), BF, strides=(72, 1)), Dev((1,), F32), Dev((4, 32), U8), Dev((4, 4), U8)),
     "x row stride 72"),
])
def test_quantizer_refuses_before_launch(rec, call, msg):
    with pytest.raises(OpError) as e:
        call()
    assert msg in str(e.value), str(e.value)
    assert rec.calls == []
