"""The moe routing ops refuse bad input before any launch, pick their kernels and grids by the documented
rules, and pass exactly the argument list each compiled kernel declares (the committed sm_90a manifest,
tests/ops_fakes.Recorder); the workspace and block checks; no kernel is loaded inside a (fake) capture."""
from __future__ import annotations

import pytest

from tests.ops_fakes import Dev, Recorder, patch_ops
from vkc_runtime.ops import moe
from vkc_runtime.ops.moe import common as C

F32, I32, BF16 = "<f4", "<i4", "<V2"


@pytest.fixture()
def rec(monkeypatch):
    r = Recorder(declared=C.BASES)
    patch_ops(monkeypatch, moe, "get_kernel", r)
    return r


def ws(M, E, k, H, I=64, shared=False, part=None):
    kout, Ep = k + int(shared), E + int(shared)
    Pk = M * kout
    cap = max(moe.align_capacity(Pk, Ep, bm) for bm in moe.BLOCK_MS)
    return moe.MoeWorkspace(max_tokens=M, num_experts=E, top_k=k, hidden=H, intermediate=I, shared=shared,
                            topk_ids=Dev((Pk,), I32), topk_weights=Dev((Pk,), F32),
                            part=Dev((part or 16 * max(M, 64) * (E + 1),), F32),
                            hist=Dev((max(C.hist_chunks(Pk) * C.HIST_BINS, 1),), I32), sorted_ids=Dev((cap,), I32),
                            block_expert=Dev((cap // 16,), I32), num_padded=Dev((1,), I32),
                            h=Dev((Pk * I,), BF16), y=Dev((Pk * H,), BF16))


def route_args(M=1, E=256, H=2048, k=8, shared=False, **over):
    kout = k + int(shared)
    a = dict(x=Dev((M, H)), gate_w=Dev((E, H)), top_k=k, renormalize=True,
             shared_gate_w=Dev((1, H)) if shared else None, topk_ids=Dev((M, kout), I32),
             topk_weights=Dev((M, kout), F32), workspace=ws(M, E, k, H, shared=shared))
    a.update(over)
    return a


def call_route(a):
    a = dict(a)
    return moe.route(a.pop("x"), a.pop("gate_w"), a.pop("top_k"), **a)


def test_route_grids_and_arguments(rec):
    assert C.SMALL_M == 128  # the grids below are the rule's, on both sides of its crossover
    call_route(route_args(M=1, shared=True))
    (b1, g1, a1), (b2, g2, a2) = rec.calls
    assert (b1, g1) == ("moe.route.logits.small", (1, 8, 16))       # 8 E tiles x 16 K splits of 128
    assert a1[4:] == (1, 256, 2048, 2048, 128, 1)                     # M, E, H, stride_x, k_split, has_shared
    assert (b2, g2) == ("moe.route.topk.e256", (1, 1, 1))
    assert a2[3:] == (1, 256, 16, 8, 9, 1, 1)                         # M, E, n_split, top_k, k', renorm, shared
    rec.calls.clear()
    call_route(route_args(M=8192, E=16, H=64, k=4, renormalize=False, workspace=ws(8192, 16, 4, 64)))
    (b1, g1, a1), (b2, g2, a2) = rec.calls
    assert (b1, g1) == ("moe.route.logits.large", (64, 1, 1)) and a1[8] == 64  # M > SMALL_M: large tiles
    assert (b2, g2) == ("moe.route.topk.e32", (8192, 1, 1)) and a2[8] == 0  # one row per program
    for M, want in ((128, ("moe.route.logits.small", (8, 8, 2), 1024)),
                    (129, ("moe.route.logits.large", (2, 2, 16), 128))):
        rec.calls.clear()
        call_route(route_args(M=M, shared=True))  # the 35B-A3B router on both sides of SMALL_M = 128
        (b1, g1, a1), (b2, g2, a2) = rec.calls
        assert (b1, g1, a1[8]) == want and a2[5] == want[1][2] and rec.calls[1][1] == (M, 1, 1), (M, b1, g1, a1, a2)


@pytest.mark.parametrize("over,msg", [
    (dict(x=Dev((1, 2048), F32)), "x must be bfloat16"),
    (dict(gate_w=Dev((256, 1024))), "gate_w has shape"),
    (dict(gate_w=Dev((256, 2048), strides=(4096, 1))), "gate_w must be contiguous"),
    (dict(top_k=0), "top_k=0"),
    (dict(top_k=300), "top_k=300"),
    (dict(top_k=8.0), "top_k must be an int"),
    (dict(x=Dev((1, 24)), gate_w=Dev((256, 24))), "H=24 must be a multiple of 16"),
    (dict(x=Dev((3, 2048), strides=(2056, 1)), topk_ids=Dev((3, 8), I32), topk_weights=Dev((3, 8), F32)),
     "stride_x=2056"),
    (dict(x=Dev((1, 2048), offset=1)), "x_ptr"),
    (dict(topk_ids=Dev((1, 9), I32)), "topk_ids has shape"),
    (dict(topk_weights=Dev((1, 8), I32)), "topk_weights must be float32"),
    (dict(topk_ids=Dev((2, 8), I32, strides=(16, 1)), x=Dev((2, 2048)), topk_weights=Dev((2, 8), F32)),
     "topk_ids must be contiguous"),
    (dict(gate_w=Dev((600, 2048)), top_k=8), "gate_w has 600 experts"),
    (dict(workspace=ws(1, 256, 8, 2048, part=100)), "workspace.part holds 100"),
    (dict(shared_gate_w=Dev((2, 2048))), "shared_gate_w must be"),
    (dict(shared_gate_w=object()), "shared_gate_w"),
])
def test_route_refuses(rec, over, msg):
    with pytest.raises(moe.OpError, match=msg):
        call_route(route_args(**over))
    assert rec.calls == []


def test_route_limits_with_the_shared_expert(rec):
    with pytest.raises(moe.OpError, match="E \\+ 1 must be"):
        call_route(route_args(E=512, shared=True))
    with pytest.raises(moe.OpError, match="k' = 17"):
        call_route(route_args(E=64, k=16, shared=True))
    assert rec.calls == []


def align_args(M=1, k=9, E=257, bm=16, extra=0, **over):
    cap = moe.align_capacity(M * k, E, bm) + extra * bm
    a = dict(topk_ids=Dev((M, k), I32), num_experts=E, block_m=bm, sorted_ids=Dev((cap,), I32),
             block_expert=Dev((cap // bm,), I32), num_padded=Dev((1,), I32),
             workspace=ws(M, E - 1, k - 1, 64, shared=True))
    a.update(over)
    return a


def call_align(a):
    a = dict(a)
    return moe.align(a.pop("topk_ids"), a.pop("num_experts"), a.pop("block_m"), **a)


def test_align_launches(rec):
    assert moe.align_capacity(9, 257, 16) == 3872 and moe.align_capacity(0, 1, 1) == 0
    call_align(align_args())
    ((b, g, a),) = rec.calls
    assert (b, g) == ("moe.align.scatter", (257, 1, 1)) and a[5:] == (9, 257, 0, 3872, 16)
    rec.calls.clear()
    call_align(align_args(M=2048))
    (b1, g1, a1), (b2, g2, a2) = rec.calls
    assert (b1, g1) == ("moe.align.hist", (9, 1, 1)) and a1[2:] == (18432, 257)
    assert (b2, g2) == ("moe.align.scatter", (257, 1, 1)) and a2[7] == 9


@pytest.mark.parametrize("over,msg", [
    (dict(num_experts=0), "num_experts"), (dict(num_experts=513), "num_experts"),
    (dict(num_experts=True), "num_experts must be an int"), (dict(block_m=0), "block_m=0"),
    (dict(sorted_ids=Dev((3871,), I32)), "sorted_ids has 3871"), (dict(sorted_ids=Dev((3880,), I32)), "multiple"),
    (dict(block_expert=Dev((241,), I32)), "block_expert has shape"), (dict(num_padded=Dev((2,), I32)), "num_padded"),
    (dict(topk_ids=Dev((1, 17), I32)), "1..16 columns"), (dict(topk_ids=Dev((1, 9), F32)), "topk_ids must be int32"),
])
def test_align_refuses(rec, over, msg):
    with pytest.raises(moe.OpError, match=msg):
        call_align(align_args(**over))
    assert rec.calls == []


def test_align_needs_histogram_space(rec):
    with pytest.raises(moe.OpError, match="workspace.hist"):
        call_align(align_args(M=2048, workspace=ws(1, 256, 8, 64, shared=True)))
    assert rec.calls == []


def test_combine(rec):
    moe.combine(Dev((18, 2048)), Dev((2, 9), I32), Dev((2, 9), F32), 257, out=Dev((2, 2048)))
    moe.combine(Dev((18, 2048)), Dev((2, 9), I32), None, 257, out=Dev((2, 2048)))
    (b, g, a), (_, _, a2) = rec.calls
    assert (b, g) == ("moe.combine", (2, 4, 1)) and a[4:] == (2048, 9, 257, 2048, 2048, 1) and a2[-1] == 0
    for args, msg in [((Dev((17, 2048)), Dev((2, 9), I32), None, 257), "y has shape"),
                      ((Dev((18, 24)), Dev((2, 9), I32), None, 257), "H=24"),
                      ((Dev((18, 2048)), Dev((2, 9), I32), Dev((2, 8), F32), 257), "topk_weights has shape"),
                      ((Dev((18, 2048)), Dev((2, 9), I32), None, 0), "num_experts")]:
        with pytest.raises(moe.OpError, match=msg):
            moe.combine(*args, out=Dev((2, args[0].__cuda_array_interface__["shape"][1])))
    with pytest.raises(moe.OpError, match="out has shape"):
        moe.combine(Dev((18, 2048)), Dev((2, 9), I32), None, 257, out=Dev((3, 2048)))
    assert len(rec.calls) == 2


def test_block_rule_and_checks(rec, monkeypatch):
    assert moe.block_m_for(1, 9, 257) == 16 and moe.block_m_for(256, 9, 257) == 16
    assert moe.block_m_for(2048, 9, 257) == 64 and moe.block_m_for(8192, 9, 257) == 128
    assert set(moe.BLOCK_MS) == {16, 64, 128}
    from vkc_runtime.ops.moe import block
    w = ws(4, 8, 2, 64, 32, True)
    args = (Dev((4, 64)), Dev((8, 64)), Dev((9, 64, 64)), Dev((9, 64, 32)), 2)
    if block._grouped is None:
        with pytest.raises(moe.OpError, match="grouped GEMM ops"):
            moe.sparse_moe_block(*args, renormalize=True, shared_gate_w=Dev((1, 64)), workspace=w, out=Dev((4, 64)))
    monkeypatch.setattr(block, "_grouped", object())
    for kw, msg in [(dict(shared_gate_w=None), "made for shared=True"), (dict(workspace=None), "MoeWorkspace"),
                    (dict(out=Dev((4, 32))), "out has shape")]:
        with pytest.raises(moe.OpError, match=msg):
            moe.sparse_moe_block(*args, renormalize=True, **{"shared_gate_w": Dev((1, 64)), "workspace": w,
                                                             "out": Dev((4, 64)), **kw})
    with pytest.raises(moe.OpError, match="w1 has shape"):
        moe.sparse_moe_block(args[0], args[1], Dev((8, 64, 64)), args[3], 2, renormalize=True,
                             shared_gate_w=Dev((1, 64)), workspace=w, out=Dev((4, 64)))
    with pytest.raises(moe.OpError, match="<= 4 tokens"):
        moe.sparse_moe_block(Dev((5, 64)), *args[1:], renormalize=True, shared_gate_w=Dev((1, 64)), workspace=w,
                             out=Dev((5, 64)))
    assert rec.calls == []


def test_workspace_checks():
    with pytest.raises(moe.OpError, match="max_tokens must be a positive int"):
        moe.moe_workspace(0, 256, 8, 2048, 512, shared=True)
    with pytest.raises(moe.OpError, match="num_experts"):
        moe.moe_workspace(4, 512, 8, 2048, 512, shared=True)
    with pytest.raises(moe.OpError, match="top_k=17"):
        moe.moe_workspace(4, 256, 17, 2048, 512, shared=False)


# ------------------------------------------------------------------------------------------ bound calls, loads

def test_bound_calls_replay_what_validation_launches(rec, monkeypatch):
    """With torch-like tensors and a workspace, the second route / align / combine call of one layout replays
    the recorded launches with the new pointers (no validation); another shape validates (and is refused)."""
    from tests.ops_fakes import TorchLike as T
    from vkc_runtime import bound
    from vkc_runtime.ops.moe import route_ops
    monkeypatch.delenv("VKC_FASTPATH", raising=False)
    bound.clear_bound_calls()
    w = ws(16, 256, 8, 2048, shared=True)

    def calls(M):
        x, gw, sg = T((M, 2048)), T((256, 2048)), T((1, 2048))
        ids, wts = T((M, 9), "torch.int32"), T((M, 9), "torch.float32")
        cap = moe.align_capacity(M * 9, 257, 16)
        moe.route(x, gw, 8, renormalize=True, shared_gate_w=sg, topk_ids=ids, topk_weights=wts, workspace=w)
        moe.align(ids, 257, 16, sorted_ids=T((cap,), "torch.int32"), block_expert=T((cap // 16,), "torch.int32"),
                  num_padded=T((1,), "torch.int32"), workspace=w)
        moe.combine(T((M * 9, 2048)), ids, wts, 257, out=T((M, 2048)))
        return x, ids

    x1, _ = calls(4)
    first = list(rec.calls)
    rec.calls.clear()
    x2, ids2 = calls(4)
    assert sum(c.hits for c in (route_ops._route_calls, route_ops._align_calls, route_ops._combine_calls)) == 3
    assert [(b, g) for b, g, _ in rec.calls] == [(b, g) for b, g, _ in first]
    assert rec.calls[0][2][0] == x2.data_ptr() != x1.data_ptr()        # the new pointers patched in
    a, b = rec.calls[1][2], first[1][2]                                   # topk: part (the workspace's) and
    assert a[0] == b[0] and a[3:] == b[3:] and a[1] != b[1]               # scalars fixed, ids patched
    with pytest.raises(moe.OpError, match="topk_ids has shape"):
        moe.route(T((5, 2048)), T((256, 2048)), 8, renormalize=True, shared_gate_w=T((1, 2048)),
                  topk_ids=ids2, topk_weights=T((4, 9), "torch.float32"), workspace=w)
    bound.clear_bound_calls()


def test_workspace_loads_every_kernel_before_capture(monkeypatch, fake_cu):
    """moe_workspace loads the routing kernels, the decode path's and grouped_ops' (where built in); captured
    route / align / combine then load nothing."""
    from vkc_runtime import Graph, Stream
    from tests.ops_fakes import install_recorder
    monkeypatch.setenv("VKC_FASTPATH", "0")
    r = install_recorder(monkeypatch, moe)
    r.is_capturing = lambda: any(fake_cu.capturing.values())
    w = moe.moe_workspace(3000, 256, 8, 2048, 512, shared=True)
    assert set(r.loads) == set(C.BASES) | set(moe.GROUPED_BASES) | set(moe.DECODE_BASES)
    M = 3000
    P = M * 9
    cap = moe.align_capacity(P, 257, 64)
    s = Stream()
    with Graph().capture(s):
        ids, wts = Dev((M, 9), I32), Dev((M, 9), F32)
        moe.route(Dev((M, 2048)), Dev((256, 2048)), 8, renormalize=True, shared_gate_w=Dev((1, 2048)), topk_ids=ids,
                  topk_weights=wts, workspace=w, stream=s)
        moe.align(ids, 257, 64, sorted_ids=Dev((cap,), I32), block_expert=Dev((cap // 64,), I32),
                  num_padded=Dev((1,), I32), workspace=w, stream=s)
        moe.combine(Dev((P, 2048)), ids, wts, 257, out=Dev((M, 2048)), stream=s)
    assert [c[0] for c in r.calls] == [C.logits_base(C.logits_size(M)), "moe.route.topk.e256", "moe.align.hist",
                                       "moe.align.scatter", "moe.combine"]


try:
    from .runtime_support import clean_env, fake_cu  # noqa: F401,E402
except ImportError:
    from runtime_support import clean_env, fake_cu  # noqa: F401,E402
