"""Patch for variant CB: the attention decode merge reads every split's lse first (one vector load), then only the
splits up to the last live one, each partial's load independent of its lse (NaN-safe select)."""
import pathlib, sys

OLD_FUSED = '''        m_run = tl.full([QB], float("-inf"), tl.float32)
        l_run = tl.zeros([QB], tl.float32)
        acc = tl.zeros([QB, D], tl.float32)
        for s in range(0, num_splits):
            # .cg: read at L2, where the other programs' partials are (never cached in this SM's L1 before)
            lse = tl.load(part_lse_ptr + prow0 + s, mask=rmask, other=float("-inf"), cache_modifier=".cg")
            live = lse > float("-inf")
            m_new = tl.maximum(m_run, lse)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_run - m_use)
            w = tl.where(live, tl.exp2(lse - m_use), 0.0)
            po = tl.load(part_o_ptr + (prow0 + s)[:, None] * D + d[None, :], mask=live[:, None], other=0.0,
                         cache_modifier=".cg")
            acc = acc * alpha[:, None] + w[:, None] * po
            l_run = l_run * alpha + w
            m_run = m_new
        res = acc / tl.where(l_run > 0.0, l_run, 1.0)[:, None]
'''
NEW_FUSED = '''        # .cg: read at L2, where the other programs' partials are (never cached in this SM's L1 before)
        m_use, last = _lse_max_last(part_lse_ptr, prow0, rmask, num_splits, LSE_BLOCK, True)
        l_run = tl.zeros([QB], tl.float32)
        acc = tl.zeros([QB, D], tl.float32)
        for s in range(0, last + 1):  # splits past the last live one hold nothing; their scratch is not read
            lse = tl.load(part_lse_ptr + prow0 + s, mask=rmask, other=float("-inf"), cache_modifier=".cg")
            po = tl.load(part_o_ptr + (prow0 + s)[:, None] * D + d[None, :], mask=rmask[:, None], other=0.0,
                         cache_modifier=".cg")  # issued with the lse load: a dead split's stale values are dropped
            live = lse > float("-inf")
            w = tl.where(live, tl.exp2(lse - m_use), 0.0)
            acc += tl.where(live[:, None], w[:, None] * po, 0.0)
            l_run += w
        res = acc / tl.where(l_run > 0.0, l_run, 1.0)[:, None]
'''
OLD_COMB = '''    m_run = tl.full([], float("-inf"), tl.float32)
    l_run = tl.zeros([], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for s0 in range(0, num_splits, SPLIT_BLOCK):
        sp = s0 + tl.arange(0, SPLIT_BLOCK)
        lse = tl.load(part_lse_ptr + base + sp, mask=sp < num_splits, other=float("-inf"))
        live = lse > float("-inf")
        m_new = tl.maximum(m_run, tl.max(lse, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_run - m_use)
        w = tl.where(live, tl.exp2(lse - m_use), 0.0)
        po = tl.load(part_o_ptr + (base + sp)[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
        acc = acc * alpha + tl.sum(w[:, None] * po, 0)
        l_run = l_run * alpha + tl.sum(w, 0)
        m_run = m_new
    out = acc / tl.where(l_run > 0.0, l_run, 1.0)
'''
NEW_COMB = '''    one = tl.full([1], 1, tl.int1)
    m_use, last = _lse_max_last(part_lse_ptr, tl.full([1], 0, tl.int64) + base, one, num_splits, LSE_BLOCK, False)
    m_use = tl.max(m_use, 0)
    l_run = tl.zeros([], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for s0 in range(0, last + 1, SPLIT_BLOCK):  # splits past the last live one hold nothing; not read
        sp = s0 + tl.arange(0, SPLIT_BLOCK)
        inb = sp <= last
        lse = tl.load(part_lse_ptr + base + sp, mask=inb, other=float("-inf"))
        po = tl.load(part_o_ptr + (base + sp)[:, None] * D + d[None, :], mask=inb[:, None], other=0.0)
        live = lse > float("-inf")  # a dead split's stale partial (any bits, NaN included) is dropped by the select
        w = tl.where(live, tl.exp2(lse - m_use), 0.0)
        acc += tl.sum(tl.where(live[:, None], w[:, None] * po, 0.0), 0)
        l_run += tl.sum(w, 0)
    out = acc / tl.where(l_run > 0.0, l_run, 1.0)
'''
HELPER = '''

LSE_BLOCK = tl.constexpr(64)  # splits whose lse one load of the merge reads (the default most splits: one load)


@triton.jit
def _lse_max_last(part_lse_ptr, row0, rmask, num_splits, LB: tl.constexpr, CG: tl.constexpr):
    """Over the splits of rows row0 [R] (partial lse at row0 + s): each row's max lse (0 where none is finite:
    the exp2 offset) and the index of the last split with a finite lse in any row (-1: none). One [R, LB]
    load per LB splits, so the merge that follows issues its partials' loads without waiting on each lse."""
    m = tl.full(row0.shape, float("-inf"), tl.float32)
    last = tl.full([], -1, tl.int32)
    for s0 in range(0, num_splits, LB):
        sp = s0 + tl.arange(0, LB)
        msk = rmask[:, None] & (sp < num_splits)[None, :]
        if CG:
            lse = tl.load(part_lse_ptr + row0[:, None] + sp[None, :], mask=msk, other=float("-inf"),
                          cache_modifier=".cg")
        else:
            lse = tl.load(part_lse_ptr + row0[:, None] + sp[None, :], mask=msk, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, 1))
        last = tl.maximum(last, tl.max(tl.max(tl.where(lse > float("-inf"), sp[None, :], -1), 1), 0))
    return tl.where(m == float("-inf"), 0.0, m), last
'''


def patch(tree):
    f = pathlib.Path(tree) / "kernels_src/attn/decode.py"
    s = f.read_text()
    for old, new in ((OLD_FUSED, NEW_FUSED), (OLD_COMB, NEW_COMB)):
        assert s.count(old) == 1, old[:80]
        s = s.replace(old, new)
    anchor = '''

@triton.jit
def _split_range('''
    assert s.count(anchor) == 1
    s = s.replace(anchor, HELPER + anchor)
    f.write_text(s)


if __name__ == "__main__":
    patch(sys.argv[1])
