"""The MoE grouped GEMM op refuses bad input before any launch, picks block_m / tiles by the documented rules
(pure functions of host ints), passes exactly the argument list each compiled kernel declares (checked against
the committed sm_90a manifest by tests/ops_fakes.Recorder) with the documented grid, and binds its calls
(torch-like inputs: a replay launches what validation launches)."""
from __future__ import annotations

import pytest

from tests.ops_fakes import Dev, Recorder, TorchLike as T, declared_bases
from vkc_runtime import bound
from vkc_runtime.ops._check import OpError
from vkc_runtime.ops.moe import grouped_ops as G

I32, F32 = "<i4", "<f4"
E, H, I, KP = 257, 2048, 512, 9


_FAR = [1 << 44]


def W(shape, typestr="<V2", strides=None):
    """A weight stand-in (the expert stacks are GBs: placed apart from Dev's 256 MB-spaced allocations)."""
    _FAR[0] += 1 << 34
    return Dev(shape, typestr, strides=strides, device_ptr=_FAR[0])


@pytest.fixture()
def rec(monkeypatch):
    r = Recorder(occupancy=2, declared=declared_bases(G))
    monkeypatch.setattr(G, "get_kernel", r)
    monkeypatch.setattr(G, "_sm_count", lambda dev: 132)
    G._calls.clear()
    return r


def idx(M, bm, cap=None):
    P = M * KP
    cap = cap if cap is not None else -(-(P + E * (bm - 1)) // bm) * bm
    return Dev((cap,), I32), Dev((cap // bm,), I32), Dev((1,), I32)


def gemm1(M, bm, **kw):
    st, be, npad = kw.pop("index", None) or idx(M, bm)
    args = dict(a=Dev((M, H)), w=W((E, 2 * I, H)), out=Dev((M * KP, I)))
    args.update({k: v for k, v in kw.items() if k in args})
    opts = {k: v for k, v in kw.items() if k not in args}
    opts.setdefault("a_row_div", KP)
    opts.setdefault("act", "silu_mul")
    return G.grouped_gemm(args["a"], args["w"], st, be, npad, out=args["out"], block_m=bm, **opts)


def test_gemm1_m1_launch_args_and_grid(rec):
    """M = 1: 9 pairs -> a grid of 9 blocks (not the capacity's 242), the narrow tile (72 wide programs < 2 per
    SM), the argument list of the manifest."""
    gemm1(1, 16)
    (base, grid, args), = rec.calls
    assert base == "moe.grouped.m16.n16.k256.silu"
    assert grid == (I // 16, 9, 1)
    P = KP
    assert args[7:] == (P, E, I, H, 1, KP, H, 2 * I * H, H, I, 0)


def test_gemm2_and_row_scale(rec):
    M, bm = 16, 16
    st, be, npad = idx(M, bm)
    P = M * KP
    rs = Dev((P,), F32)
    G.grouped_gemm(Dev((P, I)), W((E, H, I)), st, be, npad, a_row_div=1, out=Dev((P, H)), block_m=bm,
                   row_scale=rs)
    (base, grid, args), = rec.calls
    nb = G.max_blocks(P, E, bm, st.__cuda_array_interface__["shape"][0])
    assert nb == (P + P * 15) // 16 == P  # every pair may be its own expert's block
    assert base == "moe.grouped.m16.n64.k64" and grid == (H // 64, nb, 1)
    assert args[6] == rs.__cuda_array_interface__["data"][0] and args[-1] == 1


def test_prefill_tiles(rec):
    M = 2048
    bm = G.choose_block_m(M, KP, E)
    assert bm == 64
    gemm1(M, bm)
    P = M * KP
    G.grouped_gemm(Dev((P, I)), W((E, H, I)), *idx(M, bm), a_row_div=1, out=Dev((P, H)), block_m=bm)
    (b1, g1, _), (b2, g2, _) = rec.calls
    nb = (P + E * 63) // 64
    assert (b1, g1) == ("moe.grouped.m64.n64.k64.silu", (I // 64, nb, 1))
    assert (b2, g2) == ("moe.grouped.m64.n128.k64", (H // 128, nb, 1))


def test_choose_block_m_rule():
    Ms = (1, 16, 256, 456, 457, 2048, 7310, 7311, 8192)
    assert [G.choose_block_m(M, KP, E) for M in Ms] == [16] * 4 + [64] * 3 + [128] * 2
    assert G.choose_block_m(0, KP, E) == 16
    for bad in ((-1, 9, 257), (1, 0, 257), (1, 9, 0)):
        with pytest.raises(OpError):
            G.choose_block_m(*bad)


def test_plan_rule():
    assert G.plan(16, "silu_mul", 9, I, 132) == (16, 256)      # 72 wide programs < 264
    assert G.plan(16, None, 9, H, 132) == (64, 64)             # 288 >= 264
    assert G.plan(16, "silu_mul", 33, I, 132) == (64, 64)      # 264
    assert G.plan(16, "silu_mul", 32, I, 132) == (16, 256)
    assert G.plan(64, None, 1, 16, 132) == (128, 64)
    with pytest.raises(OpError, match="block_m"):
        G.plan(32, None, 1, 16, 132)


def test_max_blocks():
    assert G.max_blocks(9, 257, 16, 3872) == 9
    assert G.max_blocks(18432, 257, 64, 18432 + 257 * 64) == (18432 + 257 * 63) // 64
    assert G.max_blocks(5, 3, 16, 16) == 1  # the cap bounds it
    assert G.max_blocks(0, 3, 16, 64) == 0


def test_long_prefill_tiles(rec):
    M = 8192
    bm = G.choose_block_m(M, KP, E)
    assert bm == 128
    gemm1(M, bm)
    (b1, g1, _), = rec.calls
    assert (b1, g1) == ("moe.grouped.m128.n64.k64.silu", (I // 64, (M * KP + E * 127) // 128, 1))


def test_forced_tile(rec):
    gemm1(1, 16, _tile=(64, 64))
    assert rec.calls[-1][0] == "moe.grouped.m16.n64.k64.silu"
    with pytest.raises(OpError, match="_tile"):
        gemm1(1, 16, _tile=(128, 64))


def test_empty_launches_nothing(rec):
    G.grouped_gemm(Dev((0, H)), W((E, 2 * I, H)), *idx(0, 16), a_row_div=KP, out=Dev((0, I)), block_m=16,
                   act="silu_mul")
    G.grouped_gemm(Dev((1, H)), W((E, 2 * I, H)), Dev((0,), I32), Dev((0,), I32), Dev((1,), I32), a_row_div=KP,
                   out=Dev((KP, I)), block_m=16, act="silu_mul")
    assert rec.calls == []


BAD = {
    "act": (dict(act="gelu"), "act must be"),
    "block_m": (dict(block_m_=32), "block_m must be"),
    "a_row_div_zero": (dict(a_row_div=0), "a_row_div must be"),
    "a_row_div_float": (dict(a_row_div=9.0), "a_row_div must be"),
    "out_none": (dict(out=None), "out= is required"),
    "a_dtype": (dict(a=Dev((1, H), "<f4")), "a must be bfloat16"),
    "w_ndim": (dict(w=Dev((2 * I, H))), "w must have 3 dims"),
    "k_mismatch": (dict(w=W((E, 2 * I, H + 16))), "K="),
    "k_not_16": (dict(a=Dev((1, 40)), w=W((E, 2 * I, 40))), "multiple of 16"),
    "experts": (dict(w=W((513, 2 * I, 64)), a=Dev((1, 64))), "experts"),
    "odd_rows": (dict(w=W((E, 2 * I + 1, H)), out=Dev((KP, I))), "even number"),
    "out_cols": (dict(out=Dev((KP, 2 * I))), "columns"),
    "n_not_16": (dict(w=W((E, 2 * 40, H)), out=Dev((KP, 40))), "multiple of 16"),
    "a_rows": (dict(out=Dev((KP + 1, I))), "a_row_div"),
    "a_stride": (dict(a=Dev((2, H), strides=(H + 8, 1))), "strides"),
    "a_misaligned": (dict(a=Dev((1, H), offset=1)), "16-byte aligned"),
    "a_inner": (dict(a=Dev((1, H), strides=(2 * H, 2))), "contiguous in its last dim"),
    "out_stride": (dict(out=Dev((KP, I), strides=(I + 8, 1))), "strides"),
    "out_rows_overlap": (dict(out=Dev((KP, I), strides=(0, 1))), "row stride"),
    "w_stride": (dict(w=W((E, 2 * I, H), strides=(2 * I * H, H + 8, 1))), "strides"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inputs_refused_before_launch(rec, case):
    kw, msg = BAD[case]
    kw = dict(kw)
    bm = kw.pop("block_m_", 16)
    with pytest.raises(OpError, match=msg):
        gemm1(1, bm, **kw)
    assert rec.calls == []


@pytest.mark.parametrize("which,msg", [("sorted_len", "multiple of block_m"), ("sorted_dtype", "int32"),
                                       ("bexp_short", "block_expert has"), ("npad_len", "1 elements"),
                                       ("sorted_strided", "contiguous"), ("scale_len", "row_scale must have"),
                                       ("scale_dtype", "float32"), ("overlap_index", "overlap"),
                                       ("overlap_a", "overlap")])
def test_bad_index_arrays_refused(rec, which, msg):
    M, bm = 1, 16
    st, be, npad = idx(M, bm)
    out = Dev((KP, I))
    kw = {}
    if which == "sorted_len":
        st = Dev((40,), I32)
    elif which == "sorted_dtype":
        st = Dev((256,), "<i8")
    elif which == "bexp_short":
        be = Dev((3,), I32)
    elif which == "npad_len":
        npad = Dev((2,), I32)
    elif which == "sorted_strided":
        st = Dev((256,), I32, strides=(2,))
    elif which == "scale_len":
        kw["row_scale"] = Dev((KP + 1,), F32)
    elif which == "scale_dtype":
        kw["row_scale"] = Dev((KP,), "<i4")
    elif which == "overlap_index":
        base = st.__cuda_array_interface__["data"][0]
        out = Dev((KP, I), device_ptr=base)
    elif which == "overlap_a":
        a = Dev((1, H))
        out = Dev((KP, I), device_ptr=a.__cuda_array_interface__["data"][0])
        with pytest.raises(OpError, match=msg):
            G.grouped_gemm(a, W((E, 2 * I, H)), st, be, npad, a_row_div=KP, out=out, block_m=bm, act="silu_mul")
        assert rec.calls == []
        return
    with pytest.raises(OpError, match=msg):
        G.grouped_gemm(Dev((M, H)), W((E, 2 * I, H)), st, be, npad, a_row_div=KP, out=out, block_m=bm,
                       act="silu_mul", **kw)
    assert rec.calls == []


def test_bound_calls_replay_what_validation_launches(monkeypatch):
    """Torch-like inputs: the first call validates, the next ones (new pointers, same layout) replay; the launches
    equal those of validated calls; a changed a_row_div or a shape validates again."""
    rec = Recorder(occupancy=2, declared=declared_bases(G))
    monkeypatch.setattr(G, "get_kernel", rec)
    monkeypatch.setattr(G, "_sm_count", lambda dev: 132)
    M, bm, e = 3, 16, 17  # 17 experts: TorchLike allocations are 256 MB apart
    P = M * KP
    cap = -(-(P + e * 15) // 16) * 16

    def call(row_div=KP, rows=M):
        G.grouped_gemm(T((rows, H)), T((e, 2 * I, H)), T((cap,), "torch.int32"), T((cap // 16,), "torch.int32"),
                       T((1,), "torch.int32"), a_row_div=row_div, out=T((P, I)), block_m=bm, act="silu_mul",
                       row_scale=T((P,), "torch.float32"))
    launches = {}
    for fast in ("0", "1"):
        monkeypatch.setenv("VKC_FASTPATH", fast)
        bound.clear_bound_calls()
        rec.calls.clear()
        for _ in range(3):
            call()
        assert G._calls.hits == (2 if fast == "1" else 0)
        launches[fast] = [(b, g, len(a)) for b, g, a in rec.calls]
    assert launches["0"] == launches["1"] and len(launches["1"]) == 3
    hits = G._calls.hits
    call(row_div=KP + 1, rows=M)  # another scalar: validated (and still valid: cdiv(27, 10) <= 3)
    with pytest.raises(OpError, match="a_row_div"):
        call(rows=2)  # another shape: validated again, and refused
    assert G._calls.hits == hits
