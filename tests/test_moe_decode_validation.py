"""The moe decode ops (ops/moe/decode_ops.py) and the block's path choice, driver-free: bad input refused before any
launch, grids and argument lists as each compiled kernel declares them (the committed sm_90a manifest,
tests/ops_fakes.Recorder), the M rule and ``path=``, bound calls, no kernel loaded inside a (fake) capture."""
from __future__ import annotations

import pytest

from tests.ops_fakes import Dev, Recorder, TorchLike as T, patch_ops
from vkc_runtime.ops import moe
from vkc_runtime.ops.moe import decode_ops as D

F32, I32, BF16 = "<f4", "<i4", "<V2"


@pytest.fixture()
def rec(monkeypatch):
    r = Recorder(declared=moe.BASES)
    patch_ops(monkeypatch, moe, "get_kernel", r)
    return r


def ptr(d):
    return d.__cuda_array_interface__["data"][0]


_far = [1 << 44]


def far(shape, typestr=BF16, strides=None):
    """A Dev stand-in at an address of its own (the 35B-A3B expert weights span more than Dev's 256 MB step)."""
    _far[0] += 1 << 36
    return Dev(shape, typestr, strides=strides, device_ptr=_far[0])


def far_t(shape):
    """The same for a TorchLike tensor."""
    t = T(shape)
    _far[0] += 1 << 36
    t._ptr = _far[0]
    return t


def gate_up_args(M=1, k=9, Ep=257, H=2048, I=512, **over):
    a = dict(x=Dev((M, H)), w1=far((Ep, 2 * I, H)), topk_ids=Dev((M, k), I32), out=Dev((M * k, I)))
    a.update(over)
    return a


def down_args(M=1, k=9, Ep=257, H=2048, I=512, **over):
    a = dict(h=Dev((M * k, I)), w2=far((Ep, H, I)), topk_ids=Dev((M, k), I32), topk_weights=Dev((M, k), F32),
             out=Dev((M, H)))
    a.update(over)
    return a


def call_gate_up(a):
    a = dict(a)
    return D.decode_gate_up(a.pop("x"), a.pop("w1"), a.pop("topk_ids"), **a)


def call_down(a):
    a = dict(a)
    return D.decode_down(a.pop("h"), a.pop("w2"), a.pop("topk_ids"), a.pop("topk_weights"), **a)


def test_grids_and_arguments(rec):
    call_gate_up(gate_up_args())
    call_down(down_args())
    (b1, g1, a1), (b2, g2, a2) = rec.calls
    assert (b1, g1) == ("moe.decode.gate_up.n8.k256", (9, 64, 1))                     # pairs x I / 8
    assert a1[4:] == (9, 257, 512, 2048, 9, 2048, 1024 * 2048, 2048, 512)            # P E N K k' strides
    assert (b2, g2) == ("moe.decode.down.n8.k128.s9", (1, 256, 1))                   # tokens x H / 8
    assert a2[5:] == (257, 2048, 512, 9, 512, 2048 * 512, 512, 2048)                 # E N K k' strides
    rec.calls.clear()
    call_down(down_args(k=10))  # more picks than the 8 + 1 tile holds: the next tile, every slot in one
    assert rec.calls[0][0] == "moe.decode.down.n4.k64.s16"
    with pytest.raises(moe.OpError, match="holds 9 slots, fewer than k' = 10"):
        call_down(down_args(k=10, _tile=(8, 128, 9)))
    rec.calls.clear()
    call_gate_up(gate_up_args(M=8, x=Dev((8, 2048), strides=(4096, 1)), _tile=(16, 512)))
    call_down(down_args(M=8, _tile=(2, 128, 16)))
    (b1, g1, a1), (b2, g2, _) = rec.calls
    assert (b1, g1) == ("moe.decode.gate_up.n16.k512", (72, 32, 1)) and a1[9] == 4096
    assert (b2, g2) == ("moe.decode.down.n2.k128.s16", (8, 1024, 1))
    from vkc_runtime.ops.moe import experts as X
    assert D.DECODE_BASES == tuple(D._base(k, t) for k, ts in D.TILES.items() for t in ts) + \
        tuple(X.module(w).base(k, t) for w in X.KINDS for k in D.TILES for t in X.module(w).TILES[k])
    assert set(D.DECODE_BASES) <= set(moe.BASES)


def _gate_up_bad():
    x = Dev((1, 2048))
    return [
        (dict(x=Dev((1, 2048), F32)), "x must be bfloat16"),
        (dict(w1=far((257, 1023, 2048))), "2I rows"),
        (dict(w1=Dev((257, 48, 2048)), out=Dev((9, 24))), "I=24"),
        (dict(w1=far((257, 1024, 1024))), "w1 has shape"),
        (dict(x=Dev((1, 40)), w1=Dev((257, 1024, 40))), "H=40"),
        (dict(topk_ids=Dev((2, 9), I32)), "topk_ids has 2 rows"),
        (dict(topk_ids=Dev((1, 17), I32)), "1..16 columns"),
        (dict(topk_ids=Dev((1, 9), F32)), "topk_ids must be int32"),
        (dict(out=Dev((9, 256))), "out has shape"),
        (dict(out=Dev((9, 512), F32)), "out must be bfloat16"),
        (dict(x=Dev((1, 2048), offset=1)), "x must be 16-byte aligned"),
        (dict(x=Dev((3, 2048), strides=(2056, 1)), topk_ids=Dev((3, 9), I32), out=Dev((27, 512))), "x strides"),
        (dict(w1=far((257, 1024, 2048), strides=(1024 * 2056, 2056, 1))), "w1 strides"),
        (dict(x=x, out=Dev((9, 512), device_ptr=ptr(x))), "out must not overlap x"),
        (dict(_tile=(32, 512)), "not a compiled gate_up tile"),
    ]


@pytest.mark.parametrize("over,msg", _gate_up_bad())
def test_gate_up_refuses(rec, over, msg):
    with pytest.raises(moe.OpError, match=msg):
        call_gate_up(gate_up_args(**over))
    assert rec.calls == []


def _down_bad():
    h = Dev((9, 512))
    return [
        (dict(h=Dev((8, 512))), "h has shape"),
        (dict(h=Dev((9, 24)), w2=Dev((257, 2048, 24))), "I=24"),
        (dict(w2=far((257, 2048, 256))), "w2 has shape"),
        (dict(topk_weights=None), "topk_weights is required"),
        (dict(topk_weights=Dev((1, 9), I32)), "topk_weights must be float32"),
        (dict(topk_weights=Dev((1, 8), F32)), "topk_weights has shape"),
        (dict(out=Dev((1, 1024))), "out has shape"),
        (dict(out=Dev((2, 2048), strides=(2050, 1)), h=Dev((18, 512)), topk_ids=Dev((2, 9), I32),
              topk_weights=Dev((2, 9), F32)), "out strides"),
        (dict(h=h, out=Dev((1, 2048), device_ptr=ptr(h))), "out must not overlap h"),
        (dict(_tile=(4, 512, 2)), "not a compiled down tile"),
    ]


@pytest.mark.parametrize("over,msg", _down_bad())
def test_down_refuses(rec, over, msg):
    with pytest.raises(moe.OpError, match=msg):
        call_down(down_args(**over))
    assert rec.calls == []


def _ws(M, E=8, k=2, H=64, I=32, shared=True):
    kout, Ep = k + int(shared), E + int(shared)
    Pk = M * kout
    cap = max(moe.align_capacity(Pk, Ep, bm) for bm in moe.BLOCK_MS)
    from vkc_runtime.ops.moe import common as C
    return moe.MoeWorkspace(max_tokens=M, num_experts=E, top_k=k, hidden=H, intermediate=I, shared=shared,
                            topk_ids=Dev((Pk,), I32), topk_weights=Dev((Pk,), F32),
                            part=Dev((16 * max(M, 64) * (E + 1),), F32),
                            hist=Dev((max(C.hist_chunks(Pk) * C.HIST_BINS, 1),), I32), sorted_ids=Dev((cap,), I32),
                            block_expert=Dev((cap // 16,), I32), num_padded=Dev((1,), I32),
                            h=Dev((Pk * I,), BF16), y=Dev((Pk * H,), BF16))


def _block(M, ws, I=32, **kw):
    return moe.sparse_moe_block(Dev((M, 64)), Dev((8, 64)), Dev((9, 2 * I, 64)), Dev((9, 64, I)), 2,
                                renormalize=True, shared_gate_w=Dev((1, 64)), workspace=ws, out=Dev((M, 64)), **kw)


def test_block_path_rule(rec, monkeypatch):
    from vkc_runtime.ops.moe import grouped_ops
    monkeypatch.setattr(grouped_ops, "_sm_count", lambda dev: 132)
    assert moe.DECODE_MAX_M == D.DECODE_MAX_M == 4
    assert [moe.choose_path(m) for m in (1, 4, 5, 4096)] == ["decode", "decode", "grouped", "grouped"]
    ws = _ws(16)
    for M, path, want in [(1, None, "decode"), (4, None, "decode"), (5, None, "grouped"), (16, "decode", "decode"),
                          (2, "grouped", "grouped")]:
        rec.calls.clear()
        _block(M, ws, path=path)
        names = [b for b, _, _ in rec.calls]
        assert names[:2] == ["moe.route.logits.small", "moe.route.topk.e32"], names
        if want == "decode":
            assert names[2:] == ["moe.decode.gate_up.n8.k256", "moe.decode.down.n8.k128.s9"], names
            h_ptr = ptr(ws.h)
            assert rec.calls[2][2][3] == h_ptr == rec.calls[3][2][0]  # h: the workspace's buffer
            assert rec.calls[2][1] == (M * 3, 4, 1) and rec.calls[3][1] == (M, 8, 1)  # H = 64 / BLOCK_N 8
        else:
            assert names[2] == "moe.align.scatter" and names[-1] == "moe.combine", names
    rec.calls.clear()
    with pytest.raises(moe.OpError, match="path must be None or one of"):
        _block(1, ws, path="gemv")
    with pytest.raises(moe.OpError, match="I=24 must be a multiple of 16"):
        _block(1, _ws(4, I=24), I=24)
    with pytest.raises(moe.OpError, match="out must be 16-byte aligned"):
        moe.sparse_moe_block(Dev((1, 64)), Dev((8, 64)), Dev((9, 64, 64)), Dev((9, 64, 32)), 2, renormalize=True,
                             shared_gate_w=Dev((1, 64)), workspace=ws, out=Dev((1, 64), offset=1))
    assert rec.calls == []


def test_bound_calls_replay_what_validation_launches(rec, monkeypatch):
    from vkc_runtime import bound
    monkeypatch.delenv("VKC_FASTPATH", raising=False)
    bound.clear_bound_calls()

    def calls():
        x, w1, ids, h = T((2, 2048)), far_t((257, 1024, 2048)), T((2, 9), "torch.int32"), T((18, 512))
        D.decode_gate_up(x, w1, ids, out=h)
        D.decode_down(h, far_t((257, 2048, 512)), ids, T((2, 9), "torch.float32"), out=T((2, 2048)))
        return x

    x1 = calls()
    first = list(rec.calls)
    rec.calls.clear()
    x2 = calls()
    assert D._gate_up_calls.hits == 1 and D._down_calls.hits == 1
    assert [(b, g) for b, g, _ in rec.calls] == [(b, g) for b, g, _ in first]
    assert rec.calls[0][2][0] == x2.data_ptr() != x1.data_ptr()
    assert rec.calls[0][2][4:] == first[0][2][4:]
    w = far_t((257, 1024, 2048))
    with pytest.raises(moe.OpError, match="out must not overlap w1"):  # the replay re-checks the relation
        D.decode_gate_up(T((2, 2048)), w, T((2, 9), "torch.int32"), out=_alias(w, (18, 512)))
    bound.clear_bound_calls()


def _alias(t, shape):
    a = T(shape)
    a._ptr = t.data_ptr()
    return a


def test_workspace_loads_the_decode_kernels_before_capture(monkeypatch, fake_cu):
    from vkc_runtime import Graph, Stream
    from tests.ops_fakes import install_recorder
    monkeypatch.setenv("VKC_FASTPATH", "0")
    r = install_recorder(monkeypatch, moe)
    r.is_capturing = lambda: any(fake_cu.capturing.values())
    w = moe.moe_workspace(4, 256, 8, 2048, 512, shared=True)
    assert set(D.DECODE_BASES) <= set(r.loads)
    s = Stream()
    with Graph().capture(s):
        moe.sparse_moe_block(Dev((4, 2048)), Dev((256, 2048)), far((257, 1024, 2048)), far((257, 2048, 512)), 8,
                             renormalize=True, shared_gate_w=Dev((1, 2048)), workspace=w, out=Dev((4, 2048)), stream=s)
    assert [c[0] for c in r.calls] == ["moe.route.logits.small", "moe.route.topk.e256", "moe.decode.gate_up.n8.k256",
                                       "moe.decode.down.n8.k128.s9"]


try:
    from .runtime_support import clean_env, fake_cu  # noqa: F401,E402
except ImportError:
    from runtime_support import clean_env, fake_cu  # noqa: F401,E402
