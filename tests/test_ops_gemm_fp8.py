"""``vkc_runtime.ops.gemm_fp8`` without a driver: the tile rule, the exact kernel arguments (checked against the
committed sm_90a manifest by tests/ops_fakes.Recorder: count, kinds, divisibility promises) for the GEMMs and the
quantizers, the scale-vector steps (per tensor, per token, per channel, strided, [N, 1]), and every
host-checkable problem refused before any launch."""
from __future__ import annotations

import pytest

from tests.ops_fakes import Dev, install_recorder
from vkc_runtime.errors import MissingKernelError
from vkc_runtime.ops import gemm_fp8 as G
from vkc_runtime.ops._check import OpError

U8, F32, BF = "|u1", "<f4", "<V2"


@pytest.fixture()
def rec(monkeypatch):
    monkeypatch.setattr(G, "_cute_available", lambda: False)  # the Triton lane (the CuTe one: test_cute_lane_*)
    monkeypatch.setattr(G, "_cute_block_available", lambda: False)
    return install_recorder(monkeypatch, G)


@pytest.fixture()
def cute(monkeypatch, rec):
    """The CuTe lane available; its launches recorded (arguments as passed to the C launcher)."""
    got = []
    monkeypatch.setattr(G, "_cute_available", lambda: True)
    monkeypatch.setattr(G, "_cute_block_available", lambda: True)
    monkeypatch.setattr(G._cute, "launch_fp8", lambda *a: got.append(("scaled",) + a))
    monkeypatch.setattr(G._cute, "launch_fp8_block", lambda *a: got.append(("block",) + a))
    return got


def ptr(d: Dev) -> int:
    return d.__cuda_array_interface__["data"][0]


def test_tile_rule():
    T = G.TILES["scaled"]
    assert G.pick_tile(8192, 34816, 132, T) == (128, 256)       # many full waves: the widest tile
    assert G.pick_tile(2048, 5120, 132, T) == (128, 128)        # 320 wide tiles: 3 waves at 81%
    assert G.pick_tile(16, 5120, 132, T) == (64, 128)           # few rows: less padding, more CTAs
    assert G.pick_tile(8192, 5120, 132, G.TILES["block"]) == (128, 128)
    assert G.pick_tile(2048, 5120, 132, ((128, 256),)) == (128, 256)
    assert set(G.OPTIONAL_BASES) == ({G.gemm_base(k, *t) for k in G.KINDS for t in G.TILES[k]}
                                     | {G.quant_base(q) for q in G.QUANTS}) and G.BASES == ()


def test_linear_fp8_per_tensor_args(rec):
    M, N, K = 300, 2048, 4096
    x, w, y = Dev((M, K), U8), Dev((N, K), U8), Dev((M, N), BF)
    sa, sw = Dev((1,), F32), Dev((1,), F32)
    assert G.linear_fp8(x, sa, w, sw, y) is y
    (base, grid, args), = rec.calls
    bm, bn = G.pick_tile(M, N, 132, G.TILES["scaled"])
    assert base == G.gemm_base("scaled", bm, bn)
    assert grid == (-(-M // bm) * -(-N // bn), 1, 1)
    assert args == (ptr(x), ptr(w), ptr(y), ptr(sa), ptr(sw), M, N, K, K, K, N, 0, 0)


@pytest.mark.parametrize("sa_shape, sa_strides, sw_shape, sw_strides, steps", [
    ((37,), None, (64,), None, (1, 1)),             # per token x per channel
    ((37, 1), None, (64, 1), None, (1, 1)),         # [M, 1] / compressed-tensors' [N, 1]
    ((37,), (3,), (64,), (2,), (3, 2)),             # strided scale vectors
    ((1, 1), None, (64,), None, (0, 1)),            # per-tensor activation, per-channel weight
])
def test_linear_fp8_scale_steps(rec, sa_shape, sa_strides, sw_shape, sw_strides, steps):
    G.linear_fp8(Dev((37, 128), U8), Dev(sa_shape, F32, strides=sa_strides), Dev((64, 128), U8),
                 Dev(sw_shape, F32, strides=sw_strides), Dev((37, 64), BF))
    assert rec.calls[0][2][-2:] == steps


def test_linear_fp8_strided_operands_and_one_row(rec):
    x = Dev((7, 256), U8, strides=(512, 1))
    y = Dev((7, 64), BF, strides=(200, 1), offset=8)
    G.linear_fp8(x, Dev((7,), F32), Dev((64, 256), U8), Dev((1,), F32), y)
    assert rec.calls[0][2][5:11] == (7, 64, 256, 512, 256, 200)
    G.linear_fp8(Dev((1, 256), U8, strides=(3, 1)), Dev((1,), F32), Dev((64, 256), U8), Dev((1,), F32),
                 Dev((1, 64), BF))
    assert rec.calls[1][2][5:13] == (1, 64, 256, 256, 256, 64, 0, 0)


def test_cute_lane_args_and_rule(rec, cute):
    M, N, K = 300, 2048, 4096
    x, w, y = Dev((M, K), U8), Dev((N, K), U8), Dev((M, N), BF, strides=(N + 8, 1))
    sa, sw = Dev((M, 1), F32), Dev((1,), F32)
    G.linear_fp8(x, sa, w, sw, y, stream=5)
    assert cute == [("scaled", ptr(x), K, ptr(w), K, ptr(y), N + 8, ptr(sa), 1, ptr(sw), 0, M, N, K, 5)]
    assert rec.calls == []
    # N or the out row stride not a multiple of 8: the Triton kernel runs; forcing the CuTe lane is refused
    G.linear_fp8(Dev((M, K), U8), sa, Dev((100, K), U8), sw, Dev((M, 100), BF))
    assert len(cute) == 1 and rec.calls[0][0].startswith("gemm_fp8.scaled.")
    with pytest.raises(OpError, match="the CuTe lane needs N"):
        G.linear_fp8(Dev((M, K), U8), sa, Dev((100, K), U8), sw, Dev((M, 100), BF), _lane="cute")
    G.linear_fp8(x, sa, w, sw, y, _lane="triton")
    assert len(cute) == 1 and len(rec.calls) == 2
    with pytest.raises(OpError, match="_lane must be"):
        G.linear_fp8(x, sa, w, sw, y, _lane="cutlass")


def test_cute_block_lane_args(rec, cute):
    M, N, K = 300, 2048, 4000
    kb, nb = 32, 16
    x, w, y = Dev((M, K), U8), Dev((N, K), U8), Dev((M, N), BF, strides=(N + 8, 1))
    sa, sw = Dev((M, kb), F32, strides=(40, 1)), Dev((nb, kb), F32)
    G.linear_fp8_block(x, sa, w, sw, y, stream=7)
    assert cute == [("block", ptr(x), K, ptr(w), K, ptr(y), N + 8, ptr(sa), 40, ptr(sw), kb, M, N, K, 7)]
    assert rec.calls == []
    # one activation row: its scale row stride is passed as kb (never used)
    G.linear_fp8_block(Dev((1, K), U8), Dev((1, kb), F32), w, sw, Dev((1, N), BF))
    assert cute[-1][8] == kb
    # N not a multiple of 8: the Triton kernel runs; forcing the CuTe lane is refused
    G.linear_fp8_block(Dev((M, K), U8), sa, Dev((100, K), U8), Dev((1, kb), F32), Dev((M, 100), BF))
    assert len(cute) == 2 and rec.calls[0][0].startswith("gemm_fp8.block.")
    with pytest.raises(OpError, match="the CuTe lane needs N"):
        G.linear_fp8_block(Dev((M, K), U8), sa, Dev((100, K), U8), Dev((1, kb), F32), Dev((M, 100), BF),
                           _lane="cute")
    G.linear_fp8_block(x, sa, w, sw, y, _lane="triton")
    assert len(cute) == 2 and len(rec.calls) == 2
    with pytest.raises(OpError, match="_lane must be"):
        G.linear_fp8_block(x, sa, w, sw, y, _lane="cutlass")


def test_cute_lane_missing(rec):
    with pytest.raises(MissingKernelError, match="sm_90a"):
        G.linear_fp8(Dev((5, 128), U8), Dev((1,), F32), Dev((64, 128), U8), Dev((1,), F32), Dev((5, 64), BF),
                     _lane="cute")
    with pytest.raises(MissingKernelError, match="sm_90a"):
        G.linear_fp8_block(Dev((5, 128), U8), Dev((5, 1), F32), Dev((64, 128), U8), Dev((1, 1), F32),
                           Dev((5, 64), BF), _lane="cute")


def test_linear_fp8_block_args(rec):
    M, N, K = 50, 200, 400
    kb, nb = 4, 2
    x, w, y = Dev((M, K), U8), Dev((N, K), U8), Dev((M, N), BF)
    sa = Dev((M, kb), F32, strides=(8, 1))
    sw = Dev((nb, kb), F32)
    G.linear_fp8_block(x, sa, w, sw, y)
    (base, grid, args), = rec.calls
    bm, bn = G.pick_tile(M, N, 132, G.TILES["block"])
    assert base == G.gemm_base("block", bm, bn)
    assert args == (ptr(x), ptr(w), ptr(y), ptr(sa), ptr(sw), M, N, K, K, K, N, 8, kb)


def test_quantizer_args(rec):
    M, K = 9, 2064
    x, q = Dev((M, K), BF), Dev((M, K), U8)
    s = Dev((M,), F32)
    assert G.quantize_fp8_per_token(x, q, s) == (q, s)
    st = Dev((1,), F32)
    assert G.quantize_fp8_per_tensor(x, st, q) is q
    sg = Dev((M, 17), F32, strides=(20, 1))
    G.quantize_fp8_per_token_group(x, q, sg)
    (b0, g0, a0), (b1, g1, a1), (b2, g2, a2) = rec.calls
    assert (b0, g0, a0) == (G.quant_base("token"), (M, 1, 1), (ptr(x), ptr(q), ptr(s), K, K, K))
    assert (b1, g1, a1) == (G.quant_base("tensor"), (M, 3, 1), (ptr(x), ptr(q), ptr(st), K, K, K))
    assert (b2, g2, a2) == (G.quant_base("group"), (3, 5, 1), (ptr(x), ptr(q), ptr(sg), K, K, K, 20, M))


def test_empty_does_not_launch(rec):
    y = Dev((0, 64), BF)
    assert G.linear_fp8(Dev((0, 128), U8), Dev((1,), F32), Dev((64, 128), U8), Dev((1,), F32), y) is y
    G.linear_fp8_block(Dev((0, 128), U8), Dev((0, 1), F32), Dev((64, 128), U8), Dev((1, 1), F32), y)
    G.quantize_fp8_per_token(Dev((0, 128), BF), Dev((0, 128), U8), Dev((0,), F32))
    assert rec.calls == []


def test_without_kernel(monkeypatch, rec):
    monkeypatch.setattr(G, "has_kernel", lambda base: False)
    with pytest.raises(MissingKernelError, match="sm_89, sm_90a"):
        G.linear_fp8(Dev((5, 128), U8), Dev((1,), F32), Dev((64, 128), U8), Dev((1,), F32), Dev((5, 64), BF))
    assert rec.calls == []


def _lin(x=None, sa=None, w=None, sw=None, y=None):
    return (x or Dev((4, 64), U8), sa or Dev((1,), F32), w or Dev((32, 64), U8), sw or Dev((1,), F32),
            y or Dev((4, 32), BF))


@pytest.mark.parametrize("args, msg", [
    (lambda: _lin(x=Dev((4, 64), BF)), "x_q must be float8_e4m3fn (or its uint8 bytes), got bfloat16"),
    (lambda: _lin(w=Dev((32, 64), "<f4")), "w_q must be float8_e4m3fn"),
    (lambda: _lin(y=Dev((4, 32), F32)), "out must be bfloat16"),
    (lambda: _lin(sa=Dev((1,), BF)), "x_scale must be float32"),
    (lambda: _lin(w=Dev((32, 48), U8)), "expected dim 1 == K = 64"),
    (lambda: _lin(y=Dev((4, 40), BF)), "out has shape (4, 40)"),
    (lambda: _lin(x=Dev((4, 40), U8), w=Dev((32, 40), U8)), "K = 40 must be a positive multiple of 16"),
    (lambda: _lin(x=Dev((4, 64), U8, strides=(72, 1))), "x_q row stride 72 must be a multiple of 16"),
    (lambda: _lin(w=Dev((32, 64), U8, strides=(32, 1))), "w_q rows overlap"),
    (lambda: _lin(x=Dev((4, 64), U8, offset=8)), "x_q data pointer"),
    (lambda: _lin(y=Dev((4, 32), BF, offset=2)), "out data pointer"),
    (lambda: _lin(sa=Dev((3,), F32)), "x_scale has shape (3,): expected 1 element (per tensor) or 4"),
    (lambda: _lin(sw=Dev((32, 2), F32)), "w_scale has shape (32, 2)"),
    (lambda: _lin(x=Dev((4, 64), U8, strides=(128, 2))), "x_q must be contiguous in its last dim"),
    (lambda: _lin(sa=Dev((4,), F32, device_ptr=(1 << 40) + 2)), "x_scale data pointer 0x10000000002 is not 4-byte"),
])
def test_linear_fp8_refuses_before_launch(rec, args, msg):
    with pytest.raises(OpError) as e:
        G.linear_fp8(*args())
    assert msg in str(e.value), str(e.value)
    assert rec.calls == []


def test_refuses_overlap(rec):
    x = Dev((4, 64), U8)
    with pytest.raises(OpError, match="out must not overlap x_q"):
        G.linear_fp8(x, Dev((1,), F32), Dev((32, 64), U8), Dev((1,), F32), Dev((4, 32), BF, device_ptr=ptr(x) + 16))
    sw = Dev((32,), F32)
    with pytest.raises(OpError, match="out must not overlap w_scale"):
        G.linear_fp8(Dev((4, 64), U8), Dev((1,), F32), Dev((32, 64), U8), sw, Dev((4, 32), BF, device_ptr=ptr(sw)))
    q = Dev((4, 64), U8)
    with pytest.raises(OpError, match="scale must not overlap x"):
        xx = Dev((4, 64), BF)
        G.quantize_fp8_per_token(xx, q, Dev((4,), F32, device_ptr=ptr(xx) + 64))
    assert rec.calls == []


@pytest.mark.parametrize("sa, sw, msg", [
    (lambda: Dev((4, 3), F32), lambda: Dev((2, 1), F32), "x_scale has shape (4, 3), expected dim 1 == 1"),
    (lambda: Dev((4, 1), F32), lambda: Dev((1, 1), F32), "w_scale has shape (1, 1), expected dim 0 == 2"),
    (lambda: Dev((4, 1), F32), lambda: Dev((2, 1), BF), "convert weight_scale_inv to float32"),
    (lambda: Dev((4, 1), F32), lambda: Dev((2, 1), "<f2"), "convert weight_scale_inv to float32"),
    (lambda: Dev((4,), F32), lambda: Dev((2, 1), F32), "x_scale must have 2 dims"),
])
def test_linear_fp8_block_refuses_scales(rec, sa, sw, msg):
    with pytest.raises(OpError) as e:
        G.linear_fp8_block(Dev((4, 64), U8), sa(), Dev((200, 64), U8), sw(), Dev((4, 200), BF))
    assert msg in str(e.value), str(e.value)
    assert rec.calls == []


@pytest.mark.parametrize("call, msg", [
    (lambda: G.quantize_fp8_per_token(Dev((4, 64), F32), Dev((4, 64), U8), Dev((4,), F32)), "x must be bfloat16"),
    (lambda: G.quantize_fp8_per_token(Dev((4, 64), BF), Dev((4, 64), BF), Dev((4,), F32)), "out must be float8"),
    (lambda: G.quantize_fp8_per_token(Dev((4, 64), BF), Dev((4, 64), U8), Dev((4,), F32, strides=(2,))),
     "scale must be contiguous"),
    (lambda: G.quantize_fp8_per_token(Dev((4, 64), BF), Dev((4, 64), U8), Dev((5,), F32)), "scale has shape (5,)"),
    (lambda: G.quantize_fp8_per_token(Dev((4, 56), BF), Dev((4, 56), U8), Dev((4,), F32)), "K = 56"),
    (lambda: G.quantize_fp8_per_tensor(Dev((4, 64), BF), Dev((2,), F32), Dev((4, 64), U8)),
     "scale has shape (2,): expected 1 element"),
    (lambda: G.quantize_fp8_per_tensor(Dev((4, 64), BF, strides=(72, 1)), Dev((1,), F32), Dev((4, 64), U8)),
     "x row stride 72"),
    (lambda: G.quantize_fp8_per_token_group(Dev((4, 256), BF), Dev((4, 256), U8), Dev((4, 3), F32)),
     "scale has shape (4, 3), expected dim 1 == 2"),
    (lambda: G.quantize_fp8_per_token_group(Dev((4, 256), BF), Dev((4, 256), U8, offset=4), Dev((4, 2), F32)),
     "out data pointer"),
])
def test_quantizers_refuse_before_launch(rec, call, msg):
    with pytest.raises(OpError) as e:
        call()
    assert msg in str(e.value), str(e.value)
    assert rec.calls == []
