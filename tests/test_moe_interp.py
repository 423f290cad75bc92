"""CPU tests of the moe family's routing kernels through vkc_runtime.ops.moe (validation, grids and argument
lists as on the GPU) with the kernels run by Triton's interpreter on the sm_90a specs, every access checked
against the tensors the test handed the op (tests/test_bounds_interp.py's checker; the tensors are views into
sentinel-filled buffers, outputs and scratch poisoned), against the float64 references of refs_moe.py.

route: ids and weights vs numpy (near-ties reported, exact ties -> the lower id), renormalise on/off, the
shared-expert fold, the small (split-K) and large logits kernels; align: every invariant (each valid pair
exactly once, groups padded, block_expert, tails), invalid ids dropped, all pairs to one expert, empty
experts, the one- and two-launch paths; combine vs float64 (rows of invalid ids never read); the block with a
float32 stand-in of the grouped GEMM (test-only)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests import bounds_cases as B, refs_moe as R  # noqa: E402
from tests.kernel_testing import interpreter_active, specs  # noqa: E402
from tests.test_bounds_interp import Cai, InterpKernel  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="Triton's interpreter (TRITON_INTERPRET=1)")


class Registry:
    """get_kernel for the moe ops: the spec's kernel in the interpreter; ``constexprs`` replace the spec's values
    where a kernel has them (the quantized-expert kernels' decoder choices, tests/test_moe_nvfp4_interp.py)."""

    def __init__(self, constexprs: dict | None = None):
        self.specs = specs("moe")
        self._families = {"moe": self.specs}  # gemm_fp8 too: the W8A8 path's activation quantizer
        self.launched = []
        self.constexprs = dict(constexprs or {})

    def _spec(self, base):
        fam, name = base.split(".", 1)
        assert fam in ("moe", "gemm_fp8"), base
        if fam not in self._families:
            self._families[fam] = specs(fam)
        return self._families[fam].get(name)

    def __call__(self, base, device=None):
        spec = self._spec(base)
        assert spec is not None, base
        self.launched.append(base)
        k = InterpKernel(base, spec)
        k.constexprs.update({c: v for c, v in self.constexprs.items() if c in k.constexprs})
        return k

    def has(self, base, device=None):
        return self._spec(base) is not None


@pytest.fixture()
def M_():
    from tests.ops_fakes import patch_ops
    from vkc_runtime.ops import moe
    mp = pytest.MonkeyPatch()
    reg = Registry()
    patch_ops(mp, moe, "get_kernel", reg)
    B.ACTIVE.clear()
    ar = B.Arena(0, "cpu")
    yield moe, reg, ar
    ar.check()
    B.ACTIVE.clear()
    mp.undo()


def bf16(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def np64(t):
    return t.float().numpy().astype(np.float64)


def workspace(moe, ar, M, E, k, H, I, shared, part=None, keep=None, w8a8=False):
    """A MoeWorkspace whose buffers are poisoned arena views (Cai-wrapped), sized like moe_workspace's
    (``keep``: a dict that gets the views themselves, by field name; ``w8a8``: W8A8's buffers too)."""
    kout = k + int(shared)
    Ep = E + int(shared)
    Pk = M * kout
    cap = max(moe.align_capacity(Pk, Ep, bm) for bm in moe.BLOCK_MS)
    nblk = max(moe.align_capacity(Pk, Ep, bm) // bm for bm in moe.BLOCK_MS)
    from vkc_runtime.ops.moe.common import HIST_BINS, hist_chunks
    part = part or 16 * max(M, 128) * (E + 1)

    def buf(n, dt, name=None):
        t = ar.poison((max(n, 1),), dt)
        if keep is not None and name:
            keep[name], keep[name + ".before"] = t, t.clone()
        return Cai(t)
    q8 = {}
    if w8a8:
        q8 = dict(xq=buf(M * H, torch.uint8, "xq"), xs=buf(M * -(-H // 128), torch.float32, "xs"),
                  hq=buf(Pk * I, torch.uint8, "hq"), hs=buf(Pk * -(-I // 128), torch.float32, "hs"))
    return moe.MoeWorkspace(max_tokens=M, num_experts=E, top_k=k, hidden=H, intermediate=I, shared=shared,
                            topk_ids=buf(Pk, torch.int32), topk_weights=buf(Pk, torch.float32),
                            part=buf(part, torch.float32, "part"), hist=buf(hist_chunks(Pk) * HIST_BINS, torch.int32),
                            sorted_ids=buf(cap, torch.int32), block_expert=buf(nblk, torch.int32),
                            num_padded=buf(1, torch.int32), h=buf(Pk * I, torch.bfloat16),
                            y=buf(Pk * H, torch.bfloat16), **q8)


def run_route(moe, ar, x, gw, k, renorm, sg=None, keep=None):
    M, H = x.shape
    E = gw.shape[0]
    kout = k + int(sg is not None)
    ids = ar.poison((M, kout), torch.int32)
    wts = ar.poison((M, kout), torch.float32)
    ws = workspace(moe, ar, M, E, k, H, 16, sg is not None, keep=keep)
    moe.route(Cai(ar.put(x)), Cai(ar.put(gw)), k, renormalize=renorm,
              shared_gate_w=None if sg is None else Cai(ar.put(sg)), topk_ids=Cai(ids), topk_weights=Cai(wts),
              workspace=ws)
    return ids.numpy().astype(np.int64), wts.numpy().astype(np.float64)


def compare_route(ids, wts, x, gw, k, renorm, sg=None, tol=2e-5):
    rid, rw, p = R.route(np64(x), np64(gw), k, renorm, None if sg is None else np64(sg))
    ties = set(R.near_tie_rows(p, k).tolist())
    if ties:
        print(f"near-ties (rounding may reorder): rows {sorted(ties)}")
    for m in range(x.shape[0]):
        if m in ties:
            assert set(ids[m, :k]) <= set(np.argsort(-p[m], kind="stable")[:k + 2]), m
            continue
        assert np.array_equal(ids[m], rid[m]), (m, ids[m], rid[m])
        np.testing.assert_allclose(wts[m], rw[m], rtol=tol, atol=tol)
    assert len(ties) <= max(1, x.shape[0] // 4), "too many near-ties: the test data does not separate the picks"


@pytest.mark.parametrize("M,E,k,H,renorm,shared", [(1, 16, 4, 128, True, False), (3, 8, 2, 64, False, True),
                                                    (20, 16, 8, 256, True, True), (100, 16, 4, 64, True, False),
                                                    (2, 16, 4, 2048, True, False), (1, 300, 8, 2048, True, True)])
def test_route_vs_float64(M_, M, E, k, H, renorm, shared):
    """(2, 16, 4, 2048): 16 K splits, every row of the top-k kernel's [NS, EB] partial tile; (1, 300, ...): the
    e512 top-k kernel with 8 splits."""
    moe, reg, ar = M_
    g = torch.Generator().manual_seed(M * 100 + E)
    x, gw = bf16(g, M, H), bf16(g, E, H, scale=0.3)
    sg = bf16(g, 1, H, scale=0.1) if shared else None
    ids, wts = run_route(moe, ar, x, gw, k, renorm, sg)
    compare_route(ids, wts, x, gw, k, renorm, sg)
    if renorm:
        np.testing.assert_allclose(wts[:, :k].sum(1), 1.0, atol=1e-6)
    assert reg.launched[-2] == "moe.route.logits.small"  # M <= ops/moe/common.py SMALL_M
    from vkc_runtime.ops.moe import common as C
    assert reg.launched[-1] == C.topk_base(C.topk_eb(E))
    if H == 2048:
        assert C.route_split(M, E, H, 16, 32, 128)[0] == (16 if E <= 32 else 8)


def test_route_exact_ties_lower_id_first(M_):
    """Small-integer data: every logit is exact in fp32 whatever the summation order, so equal logits are
    bitwise equal and distinct ones differ by >= 1/8; the picks must be the stable descending order of the
    float64 reference (ties: the lower id), with many ties among the picks."""
    moe, _, ar = M_
    g = torch.Generator().manual_seed(7)
    M, E, H, k = 6, 16, 64, 6
    x = torch.randint(-2, 3, (M, H), generator=g).to(torch.bfloat16)
    gw = (torch.randint(-2, 3, (E, H), generator=g) / 8).to(torch.bfloat16)
    gw[5] = gw[3]
    gw[9] = gw[3]
    gw[12] = gw[3]
    x[:3] = (gw[3].float() * 16).clamp(-2, 2).to(torch.bfloat16)  # rows where 3, 5, 9, 12 lead
    ids, wts = run_route(moe, ar, x, gw, k, False)
    rid, rw, p = R.route(np64(x), np64(gw), k, False)
    assert np.array_equal(ids, rid), (ids, rid)
    np.testing.assert_allclose(wts, rw, rtol=1e-5)
    for m in range(3):
        assert list(ids[m, :4]) == [3, 5, 9, 12], ids[m]
    s = -np.sort(-p, axis=1)[:, :k + 1]
    assert (s[:, :-1] == s[:, 1:]).sum() >= M, "few ties among the picks"


def test_route_split_rule():
    """The K split of both tile sizes at the 35B-A3B router shape (E = 256, H = 2048): about SPLIT_TARGET
    programs, at most MAX_SPLIT splits, every split a multiple of BK and none empty; the op's tile choice."""
    from vkc_runtime.ops.moe import common as C
    assert C.route_split(1, 256, 2048, 16, 32, 128) == (16, 128)
    assert C.route_split(100, 256, 2048, 128, 128, 64) == (16, 128)
    assert C.route_split(2048, 256, 2048, 128, 128, 64) == (4, 512)
    assert C.route_split(8192, 256, 2048, 128, 128, 64) == (1, 2048)
    for M in (1, 64, 100, 128, 129, 257, 1000, 2048, 8192):
        for BM, BE, BK in ((16, 32, 128), (128, 128, 64)):
            n, ks = C.route_split(M, 256, 2048, BM, BE, BK)
            assert ks % BK == 0 and (n - 1) * ks < 2048 <= n * ks and 1 <= n <= C.MAX_SPLIT, (M, BM, n, ks)
    assert C.logits_size(C.SMALL_M) == "small" and C.logits_size(C.SMALL_M + 1) == "large"
    assert 64 <= C.RULE_SMALL_M <= 1024 and C.SMALL_M == C.RULE_SMALL_M


def test_route_small_tiles_sum_every_split(M_):
    """The logits of every split are summed: H = 2048 at M = 2 uses 16 K splits (small tiles)."""
    moe, reg, ar = M_
    g = torch.Generator().manual_seed(3)
    x, gw = bf16(g, 2, 2048), bf16(g, 16, 2048, scale=0.05)
    ids, wts = run_route(moe, ar, x, gw, 4, True)
    compare_route(ids, wts, x, gw, 4, True)
    assert reg.launched[-2] == "moe.route.logits.small"


def check_partials(part, before, x, gw, sg, size):
    """The partial logits the logits kernel left in the workspace: n_split slices of [M, E + 1], each its K
    range's x @ gate_w^T (and x . sg in column E) within fp32 accumulation error of float64, summing to the
    full logits; nothing past n_split * M * (E + 1) written."""
    from vkc_runtime.ops.moe.common import route_split
    M, H = x.shape
    E = gw.shape[0]
    c = specs("moe")[f"route.logits.{size}"].constexprs
    n, ks = route_split(M, E, H, c["BM"], c["BE"], c["BK"])
    got = part[:n * M * (E + 1)].double().numpy().reshape(n, M, E + 1)
    xx, ww = np64(x), np64(gw)
    for s in range(n):
        sl = slice(s * ks, min((s + 1) * ks, H))
        want = xx[:, sl] @ ww[:, sl].T
        np.testing.assert_allclose(got[s, :, :E], want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()),
                                   err_msg=f"split {s}")
        if sg is not None:
            np.testing.assert_allclose(got[s, :, E], xx[:, sl] @ np64(sg)[0, sl], rtol=0, atol=1e-4,
                                       err_msg=f"shared gate, split {s}")
    assert torch.equal(part[n * M * (E + 1):].view(torch.int32), before[n * M * (E + 1):].view(torch.int32)), \
        "the workspace was written past n_split * M * (E + 1)"
    return n


# The 35B-A3B router (E = 256 + the shared gate, top-8) with H cut to 256 / 512 for the interpreter, at the M
# where the op takes route.logits.large (M > SMALL_M: 129, 257, odd tails of one / two rows past a 128 tile)
# and forced at M = 100 (one partial tile): the M tail, the two BE tiles, column E only from the j == 0
# programs, 4..8 K splits. The sm_90a pipelining race that made this kernel wrong on the H200 is invisible
# here (the interpreter runs tl.dot synchronously): tests/test_moe_route_pipeline.py checks for it.
@pytest.mark.parametrize("M,H,shared,force", [(129, 512, True, False), (257, 256, False, False),
                                              (257, 512, True, False), (100, 512, True, True),
                                              (100, 256, False, True)])
def test_route_large_tiles_vs_float64(M_, M, H, shared, force):
    moe, reg, ar = M_
    from vkc_runtime.ops.moe import common as C
    mp = pytest.MonkeyPatch()
    mp.setattr(C, "SMALL_M", M - 1 if force else C.RULE_SMALL_M)  # forced to the large tile, or the rule's
    try:
        g = torch.Generator().manual_seed(M * 7 + H)
        E, k = 256, 8
        x, gw = bf16(g, M, H), bf16(g, E, H, scale=0.3)
        sg = bf16(g, 1, H, scale=0.1) if shared else None
        keep = {}
        ids, wts = run_route(moe, ar, x, gw, k, True, sg, keep=keep)
        assert reg.launched[-2:] == ["moe.route.logits.large", "moe.route.topk.e256"], reg.launched[-2:]
    finally:
        mp.undo()
    n = check_partials(keep["part"], keep["part.before"], x, gw, sg, "large")
    assert n >= 4, n  # several K splits summed by the top-k kernel
    compare_route(ids, wts, x, gw, k, True, sg)


def run_align(moe, ar, ids, E, bm, extra=0):
    M, k = ids.shape
    P = M * k
    cap = moe.align_capacity(P, E, bm) + extra * bm
    st, bt, nt = ar.poison((cap,), torch.int32), ar.poison((cap // bm,), torch.int32), ar.poison((1,), torch.int32)
    from vkc_runtime.ops.moe.common import HIST_BINS, hist_chunks
    ws = moe.MoeWorkspace(max_tokens=M, num_experts=E, top_k=k, hidden=16, intermediate=16, shared=False,
                          topk_ids=None, topk_weights=None, part=None,
                          hist=Cai(ar.poison((max(hist_chunks(P) * HIST_BINS, 1),), torch.int32)),
                          sorted_ids=None, block_expert=None, num_padded=None, h=None, y=None)
    iv = ar.put(ids) if P else ar.put(torch.zeros(1, k, dtype=torch.int32))[:0]  # an empty view with an address
    moe.align(Cai(iv), E, bm, sorted_ids=Cai(st), block_expert=Cai(bt), num_padded=Cai(nt), workspace=ws)
    return R.check_align(ids.numpy(), E, bm, st.numpy(), bt.numpy(), nt.numpy(), cap)


@pytest.mark.parametrize("case", ["random", "invalid", "one_expert", "empty_experts", "extra_capacity", "no_tokens"])
def test_align_invariants(M_, case):
    moe, reg, ar = M_
    g = torch.Generator().manual_seed(11)
    M, k, E, bm = 13, 3, 9, 4
    ids = torch.randint(0, E, (M, k), generator=g, dtype=torch.int32)
    if case == "invalid":
        flat = ids.view(-1)
        bad = torch.tensor([-1, E, 2**31 - 1, -2**31, 100], dtype=torch.int32)
        flat[::4] = bad.repeat(flat.numel())[:flat[::4].numel()]
    elif case == "one_expert":
        ids[:] = E - 1
    elif case == "empty_experts":
        ids = torch.where(ids % 3 == 0, 0, 5).to(torch.int32)
    elif case == "no_tokens":  # P = 0: every entry is the sentinel 0, every block -1, num_padded 0
        ids = ids[:0]
    npad = run_align(moe, ar, ids, E, bm, extra=3 if case == "extra_capacity" else 0)
    assert reg.launched[-1] == "moe.align.scatter" and "moe.align.hist" not in reg.launched
    if case == "one_expert":
        assert npad == -(-M * k // bm) * bm


def test_align_two_launch_path(M_):
    """P > 2048: align.hist's per-chunk histograms, then the scatter (one expert takes most pairs)."""
    moe, reg, ar = M_
    g = torch.Generator().manual_seed(12)
    M, k, E, bm = 300, 9, 17, 16
    ids = torch.randint(0, E, (M, k), generator=g, dtype=torch.int32)
    ids[:200, :5] = 4
    ids.view(-1)[::97] = -3
    run_align(moe, ar, ids, E, bm)
    assert sorted(reg.launched) == ["moe.align.hist", "moe.align.scatter"]


@pytest.mark.parametrize("weighted", [True, False])
def test_combine_vs_float64(M_, weighted):
    moe, reg, ar = M_
    g = torch.Generator().manual_seed(5)
    M, k, E, H = 7, 5, 9, 48
    ids = torch.randint(0, E, (M, k), generator=g, dtype=torch.int32)
    ids[1, 2], ids[4, 0], ids[6, 4] = -1, E, 2**31 - 1
    y = bf16(g, M * k, H)
    bad = ~((ids >= 0) & (ids < E)).view(-1)
    y[bad] = float("nan")  # rows of dropped pairs were never written: combine must not read them
    w = torch.rand(M, k, generator=g)
    out = ar.poison((M, H), torch.bfloat16)
    moe.combine(Cai(ar.put(y)), Cai(ar.put(ids)), Cai(ar.put(w)) if weighted else None, E, out=Cai(out))
    ref = R.combine(np64(y.masked_fill(bad[:, None], 0)), ids.numpy(), w.double().numpy() if weighted else None, E)
    np.testing.assert_allclose(np64(out), ref, rtol=8e-3, atol=1e-2)
    assert reg.launched == ["moe.combine"]


def standin(ar):
    """The test-only grouped GEMM: resolves the refs' pointers to the arena's tensors and runs refs_moe's
    float32 stand-in, rounding the output to bf16."""
    from vkc_runtime import memory

    def view(obj, dtype, shape):
        t = memory.as_tensor(obj)
        n = int(np.prod(shape))
        return ar.view_at(t.ptr, dtype)[:n].view(shape)

    def gg(a, w, sorted_ids, block_expert, num_padded, *, a_row_div, out, block_m, act=None, row_scale=None,
           stream=None):
        at, wt, ot = memory.as_tensor(a), memory.as_tensor(w), memory.as_tensor(out)
        av = view(a, torch.bfloat16, at.shape).float().numpy()
        wv = view(w, torch.bfloat16, wt.shape).float().numpy()
        ov = view(out, torch.bfloat16, ot.shape)
        res = ov.float().numpy().copy()
        sid = view(sorted_ids, torch.int32, memory.as_tensor(sorted_ids).shape).numpy()
        bex = view(block_expert, torch.int32, memory.as_tensor(block_expert).shape).numpy()
        npd = view(num_padded, torch.int32, (1,)).numpy()
        R.grouped_gemm_standin(av, wv, sid, bex, npd, a_row_div=a_row_div, out=res, block_m=block_m, act=act)
        ov.copy_(torch.from_numpy(res).to(torch.bfloat16))
    return gg


@pytest.mark.parametrize("M,shared", [(3, True), (40, False)])
def test_block_with_standin_gemm(M_, M, shared):
    """route -> align -> (stand-in) grouped GEMMs -> combine vs the float64 block."""
    moe, reg, ar = M_
    from types import SimpleNamespace
    blk = importlib.import_module("vkc_runtime.ops.moe.block")
    mp = pytest.MonkeyPatch()
    from vkc_runtime.ops.moe.grouped_ops import choose_block_m
    mp.setattr(blk, "_grouped", SimpleNamespace(grouped_gemm=standin(ar), choose_block_m=choose_block_m))
    g = torch.Generator().manual_seed(M)
    E, k, H, I = 8, 2, 64, 32
    Ep = E + int(shared)
    x, gw = bf16(g, M, H), bf16(g, E, H, scale=0.3)
    w1, w2 = bf16(g, Ep, 2 * I, H, scale=0.2), bf16(g, Ep, H, I, scale=0.2)
    sg = bf16(g, 1, H, scale=0.2) if shared else None
    ws = workspace(moe, ar, M, E, k, H, I, shared)
    out = ar.poison((M, H), torch.bfloat16)
    try:
        moe.sparse_moe_block(Cai(ar.put(x)), Cai(ar.put(gw)), Cai(ar.put(w1)), Cai(ar.put(w2)), k, renormalize=True,
                             shared_gate_w=None if sg is None else Cai(ar.put(sg)), workspace=ws, out=Cai(out),
                             path="grouped")  # M = 3 would take the decode path (tests/test_moe_decode_interp.py)
    finally:
        mp.undo()
    ref = R.block(np64(x), np64(gw), np64(w1), np64(w2), k, True, None if sg is None else np64(sg))
    np.testing.assert_allclose(np64(out), ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    bm = moe.block_m_for(M, k + int(shared), Ep)
    assert bm == 16 and reg.launched[-1] == "moe.combine"
