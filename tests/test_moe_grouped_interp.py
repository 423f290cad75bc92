"""CPU tests of the MoE grouped GEMMs (kernels_src/moe/grouped.py) called through vkc_runtime.ops.moe.grouped_gemm
(validation, grid and arguments as on the GPU) with the kernels run by Triton's interpreter (tests/conftest.py)
on the sm_90a specs, every load and store checked against the test's tensors (tests/test_bounds_interp.py's
checker), every tensor a view into a sentinel-filled buffer (tests/bounds_cases.Arena).

Against float64 numpy on fresh random data, with the grouping built by a tiny numpy align (the contract of
MOE_CONTRACT/ops.moe: pairs grouped by expert, each group padded to block_m with the sentinel P, block_expert
-1 past the end): every compiled tile, silu_mul on and off, row_scale, poisoned outputs whose unselected rows
(invalid expert ids) must keep their bytes, the two GEMMs of the block chained, and adversarial index arrays
(sentinels, negative / huge ids, bad experts, num_padded past the end or not a block multiple), whose result
is the kernel's documented skip rule, modelled here in numpy.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from tests import bounds_cases as B  # noqa: E402
from tests.kernel_testing import specs  # noqa: E402
from tests.ops_fakes import patch_ops  # noqa: E402
from tests.test_bounds_interp import Cai, InterpKernel  # noqa: E402
from vkc_runtime.ops.moe import grouped_ops as GO  # noqa: E402

SPECS = specs("moe")


def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


class Registry:
    def __init__(self):
        self.launched = []

    def __call__(self, base, device=None):
        fam, name = base.split(".", 1)
        assert fam == "moe", base
        self.launched.append(base)
        return InterpKernel(base, SPECS[name])


@pytest.fixture()
def G(monkeypatch):
    G = GO
    reg = Registry()
    patch_ops(monkeypatch, G, "get_kernel", reg)
    patch_ops(monkeypatch, G, "_sm_count", lambda dev: 132)
    G._calls.clear()
    B.ACTIVE.clear()
    G.reg = reg
    yield G
    B.ACTIVE.clear()


# ------------------------------------------------------------------------------------------ numpy pieces

def align_np(ids: np.ndarray, E: int, bm: int, rng, cap=None):
    """The contract's align in numpy: (sorted_ids [cap], block_expert [cap // bm], num_padded). ids [M, k']; an
    id outside [0, E) is dropped; pairs of an expert in shuffled order (the order is unspecified)."""
    flat = ids.reshape(-1)
    P = flat.size
    if cap is None:
        cap = -(-(P + E * (bm - 1)) // bm) * bm
    sorted_ids = np.full(cap, P, dtype=np.int32)
    bexp = np.full(cap // bm, -1, dtype=np.int32)
    pos = 0
    for e in range(E):
        fs = np.flatnonzero(flat == e)
        if fs.size == 0:
            continue
        fs = rng.permutation(fs)
        sorted_ids[pos:pos + fs.size] = fs
        nb = -(-fs.size // bm)
        bexp[pos // bm:pos // bm + nb] = e
        pos += nb * bm
    return sorted_ids, bexp, pos


def silu(g):
    return g / (1.0 + np.exp(-g))


def ref_rows(A, W, f_list, e_list, div, act, scale):
    """{f: float64 row} for the selected (f, e) pairs."""
    out = {}
    for f, e in zip(f_list, e_list):
        y = W[e] @ A[f // div]
        if act == "silu_mul":
            n = W.shape[1] // 2
            y = silu(y[:n]) * y[n:]
        if scale is not None:
            y = y * scale[f]
        out[f] = y
    return out


def np64(t):
    with np.errstate(invalid="ignore", over="ignore"):  # poisoned rows hold arbitrary bit patterns
        return t.detach().float().cpu().numpy().astype(np.float64)


def random_ids(rng, M, k, E, invalid=0):
    ids = np.stack([rng.choice(E, size=k, replace=False) if k <= E else rng.integers(0, E, size=k)
                    for _ in range(M)]).astype(np.int64)
    if invalid:
        m = rng.integers(0, M, size=invalid)
        j = rng.integers(0, k, size=invalid)
        ids[m, j] = rng.choice([-1, E, E + 7, -2**31], size=invalid)
    return ids


def run(G, ar, a, w, st, be, npad, *, div, bm, act, scale=None, P=None, tile=None, out=None):
    """Call the op on arena views; returns the out view (poisoned before the call unless given)."""
    N = w.shape[1] // 2 if act == "silu_mul" else w.shape[1]
    if out is None:
        out = ar.poison((P, N), torch.bfloat16)
    wrap = Cai
    G.grouped_gemm(wrap(a), wrap(w), wrap(st), wrap(be), wrap(npad), a_row_div=div, out=wrap(out), block_m=bm,
                   act=act, row_scale=None if scale is None else wrap(scale), _tile=tile)
    return out


def check_rows(out, before, rows, tol=1e-2):
    """Rows in ``rows`` match their float64 reference; every other row keeps its bytes."""
    o = np64(out)
    for f, y in rows.items():
        assert np.isfinite(o[f]).all(), f"row {f}: non-finite values"
        err = np.linalg.norm(o[f] - y) / max(np.linalg.norm(y), 1e-30)
        assert err < tol, f"row {f}: relative error {err:.3e}"
    untouched = [f for f in range(out.shape[0]) if f not in rows]
    if untouched:
        assert B.same_bytes(out[untouched], before[untouched]), "an unselected row was written"


ALL_TILES = [(bm, act, tile) for bm, per in GO.TILES.items() for act, tiles in per.items() for tile in tiles]


@pytest.mark.parametrize("bm,act,tile", ALL_TILES)
def test_every_tile_vs_float64(G, bm, act, tile):
    """Random routing (some ids invalid: their rows stay poisoned), N tails against the tile, K tails against
    BLOCK_K, strided a, row_scale on every other case."""
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    E, M, k = 5, 7, 3
    K = 48 if tile[1] == 256 else 80  # K % BLOCK_K != 0
    N = tile[0] + 16 if tile[0] < 64 else 80  # a partial N tile
    R = 2 * N if act == "silu_mul" else N
    ar = B.Arena(_seed(), "cpu")
    ids = random_ids(rng, M, k, E, invalid=3)
    st, be, npad = align_np(ids, E, bm, rng)
    P = M * k
    ab = torch.randn(M, K + 32, generator=g).to(torch.bfloat16)
    a = ar.put(ab)[:, 16:16 + K]
    w = ar.put((torch.randn(E, R, K, generator=g) * 0.3).to(torch.bfloat16))
    with_scale = (tile[0] + bm) % 32 == 0 or act is None
    scale = ar.put(torch.rand(P, generator=g) + 0.5) if with_scale else None
    out = ar.poison((P, N), torch.bfloat16)
    before = out.clone()
    run(G, ar, a, w, ar.put(torch.from_numpy(st)), ar.put(torch.from_numpy(be)),
        ar.put(torch.tensor([npad], dtype=torch.int32)), div=k, bm=bm, act=act, scale=scale, tile=tile, out=out)
    ar.check()
    flat = ids.reshape(-1)
    valid = [f for f in range(P) if 0 <= flat[f] < E]
    rows = ref_rows(np64(a), np64(w), valid, [int(flat[f]) for f in valid], k, act,
                    None if scale is None else np64(scale))
    check_rows(out, before, rows)
    want = G._base(bm, tile[0], tile[1], act)
    assert G.reg.launched == [want]


@pytest.mark.parametrize("M", [1, 6])
def test_block_two_gemms_vs_moe_reference(G, M):
    """GEMM1 (x -> h, silu_mul, a_row_div = k') then GEMM2 (h -> y, row_scale = the routing weights), combined
    in numpy: the MoE block's expert part against float64; the rule picks block_m and the tiles."""
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    E, k, H, I = 9, 4, 64, 32
    bm = G.choose_block_m(M, k, E)
    ar = B.Arena(_seed(), "cpu")
    ids = random_ids(rng, M, k, E)
    st, be, npad = align_np(ids, E, bm, rng)
    P = M * k
    x = ar.put(torch.randn(M, H, generator=g).to(torch.bfloat16))
    w1 = ar.put((torch.randn(E, 2 * I, H, generator=g) * 0.2).to(torch.bfloat16))
    w2 = ar.put((torch.randn(E, H, I, generator=g) * 0.2).to(torch.bfloat16))
    tw = torch.rand(M, k, generator=g)
    tw = tw / tw.sum(1, keepdim=True)
    scale = ar.put(tw.reshape(-1).float())
    idx = [ar.put(torch.from_numpy(st)), ar.put(torch.from_numpy(be)), ar.put(torch.tensor([npad], dtype=torch.int32))]
    h = run(G, ar, x, w1, *idx, div=k, bm=bm, act="silu_mul", P=P)
    y = run(G, ar, h, w2, *idx, div=1, bm=bm, act=None, scale=scale, P=P)
    ar.check()
    X, W1, W2 = np64(x), np64(w1), np64(w2)
    ref = np.zeros((M, H))
    for m in range(M):
        for j in range(k):
            e = ids[m, j]
            gu = W1[e] @ X[m]
            ref[m] += tw[m, j].item() * (W2[e] @ (silu(gu[:I]) * gu[I:]))
    got = np64(y).reshape(M, k, H).sum(1)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 2e-2, err
    assert len(G.reg.launched) == 2


def test_all_pairs_to_one_expert_and_empty_experts(G):
    """Every pair on expert 3 of 6 (several blocks of one expert, the others empty) at block_m 16."""
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    E, M, k, K, N = 6, 12, 3, 32, 32
    ids = np.full((M, k), 3)
    st, be, npad = align_np(ids, E, 16, rng)
    assert npad == 48 and list(be[:3]) == [3, 3, 3]
    ar = B.Arena(_seed(), "cpu")
    a = ar.put(torch.randn(M, K, generator=g).to(torch.bfloat16))
    w = ar.put((torch.randn(E, N, K, generator=g) * 0.3).to(torch.bfloat16))
    out = ar.poison((M * k, N), torch.bfloat16)
    before = out.clone()
    run(G, ar, a, w, ar.put(torch.from_numpy(st)), ar.put(torch.from_numpy(be)),
        ar.put(torch.tensor([npad], dtype=torch.int32)), div=k, bm=16, act=None, out=out)
    ar.check()
    check_rows(out, before, ref_rows(np64(a), np64(w), range(M * k), [3] * (M * k), k, None, None))


# ------------------------------------------------------------------------------------- adversarial indices

def skip_rule(st, be, npad, P, E, a_rows, div, bm, grid_blocks):
    """kernels_src/moe/grouped.py's rule: the (f, e) pairs a launch over ``grid_blocks`` blocks computes."""
    fs, es = [], []
    for b in range(grid_blocks):
        e = int(be[b])
        if not (b * bm < npad and 0 <= e < E):
            continue
        for p in range(b * bm, (b + 1) * bm):
            f = int(st[p])
            if p < npad and 0 <= f < P and f // div < a_rows:
                fs.append(f)
                es.append(e)
    return fs, es


@pytest.mark.parametrize("case", ["sentinels_and_garbage", "npad_huge", "npad_negative", "npad_mid_block",
                                  "bad_experts"])
def test_adversarial_indices(G, case):
    """Index arrays no align would produce: only the rows the skip rule selects are written, every access stays
    inside the op's tensors (checked by the interpreter harness), sentinels intact."""
    rng = np.random.default_rng(_seed())
    g = torch.Generator().manual_seed(_seed())
    E, M, k, K, N, bm = 4, 5, 2, 32, 16, 16
    P = M * k
    cap = 4 * bm
    st = np.full(cap, P, dtype=np.int64)
    perm = rng.permutation(P)  # each valid f at most once (duplicates: one writer wins, unspecified)
    st[:P] = perm
    st[P:P + 6] = [-1, P + 1, 2**31 - 1, -2**31, P, -7]
    st = rng.permutation(st[:cap]).astype(np.int64)
    be = np.array([1, 3, 0, 2], dtype=np.int64)
    npad = cap
    if case == "npad_huge":
        npad = 2**31 - 1
    elif case == "npad_negative":
        npad = -2**31
    elif case == "npad_mid_block":
        npad = bm + 5
    elif case == "bad_experts":
        be = np.array([-1, E, 2**31 - 1, 2], dtype=np.int64)
    ar = B.Arena(_seed(), "cpu")
    a = ar.put(torch.randn(M, K, generator=g).to(torch.bfloat16))
    w = ar.put((torch.randn(E, 2 * N, K, generator=g) * 0.3).to(torch.bfloat16))
    out = ar.poison((P, N), torch.bfloat16)
    before = out.clone()
    run(G, ar, a, w, ar.put(B.i32(st.tolist())), ar.put(B.i32(be.tolist())), ar.put(B.i32([npad])), div=k, bm=bm,
        act="silu_mul", out=out)
    ar.check()
    nb = G.max_blocks(P, E, bm, cap)
    fs, es = skip_rule(st, be, npad, P, E, M, k, bm, nb)
    if case == "sentinels_and_garbage":
        assert len(fs) > 0
    if case in ("npad_negative",):
        assert fs == []
    check_rows(out, before, ref_rows(np64(a), np64(w), fs, es, k, "silu_mul", None))


def test_grid_covers_align_blocks_only(G):
    """max_blocks: at M = 1 with k' = 9 over 257 experts the grid is 9 blocks (not the capacity's 242), and any
    align output fits in it (a brute-force check over random routings)."""
    assert G.max_blocks(9, 257, 16, -(-(9 + 257 * 15) // 16) * 16) == 9
    rng = np.random.default_rng(_seed())
    for _ in range(200):
        E, bm = int(rng.integers(1, 20)), int(rng.choice([16, 64]))
        M, k = int(rng.integers(1, 40)), int(rng.integers(1, 6))
        ids = rng.integers(-1, E + 1, size=(M, k))
        st, be, npad = align_np(ids, E, bm, rng)
        used = npad // bm
        assert used <= G.max_blocks(M * k, E, bm, st.size)
