"""CPU tests of the row kernels (kernels_src/norm, rope, act, embedding) through Triton's interpreter (TRITON_INTERPRET=1), plus spec/ABI checks.

Triton picks interpreter mode when a function is decorated with @triton.jit, and that includes its own
standard library (tl.sum, tl.max, ...) at ``import triton`` time, so TRITON_INTERPRET=1 must be set before
triton is imported: tests/conftest.py does that for the whole CPU test session (regen compiles in worker
processes whose environment it scrubs, so it is unaffected).

With ``VKC_NORM_TEST_DEVICE=cuda`` (and no TRITON_INTERPRET) the same tests run the kernels on a GPU
through Triton's JIT instead, with spec num_warps, and check the add_rmsnorm residual bit for bit.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tests.kernel_testing import device, interpreter_active, launch_spec, np64, specs  # noqa: E402
from tests import refs  # noqa: E402

FAMILIES = ("norm", "rope", "act", "embedding")  # family -> kernels_src/<family>/<family>.py
EPS = 1e-6




INTERP = interpreter_active()
DEV = device()




@pytest.fixture(scope="module")
def K():
    """Kernel modules keyed by source file name (interpreted when INTERP), plus the specs of the four families by
    name (the names do not collide across them)."""
    mods = {f"{fam}.py": importlib.import_module(f"kernels_src.{fam}.{fam}") for fam in FAMILIES}
    if INTERP:
        from triton.runtime.interpreter import InterpretedFunction
        assert isinstance(mods["norm.py"].rmsnorm_kernel, InterpretedFunction), \
            "kernels_src.norm was imported before TRITON_INTERPRET=1 took effect"
    by_name = {}
    for fam in FAMILIES:
        s = specs(fam)
        assert not set(s) & set(by_name), sorted(set(s) & set(by_name))
        by_name.update(s)
    return SimpleNamespace(mods=mods, specs=by_name)


def launch(K, name, grid, *args, **override):
    """Launch spec `name` exactly as the runtime would (the interpreter ignores num_warps/num_stages; the GPU JIT
    path uses the spec's values); ``override`` constexprs on top (another arch's tuned tile)."""
    launch_spec(K.specs[name], grid, *args, **override)


# ----------------------------------------------------------------------------------------------- helpers

def _gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def rnd(g, *shape, scale=1.0, shift=0.0):
    return (torch.randn(*shape, generator=g, dtype=torch.float32) * scale + shift).to(torch.bfloat16).to(DEV)


def strided(g, rows, cols, stride, scale=1.0):
    """A [rows, cols] bf16 view of a [rows, stride] random buffer (padding holds random data too)."""
    buf = rnd(g, rows, stride, scale=scale)
    return buf, buf[:, :cols]


def poisoned(rows, cols, stride):
    buf = torch.full((rows, stride), float("nan"), dtype=torch.bfloat16, device=DEV)
    return buf, buf[:, :cols]




def check(out, ref, tol=1e-2, what="out"):
    o = np64(out)
    assert np.isfinite(o).all(), f"{what}: {np.count_nonzero(~np.isfinite(o))} non-finite elements (unwritten?)"
    err = refs.rel_err(o, ref)
    assert err < tol, f"{what}: relative error {err:.3e} >= {tol}"
    scale = max(float(np.max(np.abs(ref))), 1e-6)
    mx = float(np.max(np.abs(o - ref)))
    assert mx <= 2e-2 * scale, f"{what}: max abs error {mx:.3e} vs max |ref| {scale:.3e}"
    return err


def untouched_padding(buf, cols, before):
    """Columns >= cols of a padded buffer must be bit-identical to their state before the launch."""
    assert torch.equal(buf[:, cols:].view(torch.int16), before[:, cols:].view(torch.int16)), "wrote past the row"


# ------------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("M,N,stride_x,stride_y,block,variant", [
    (1, 1000, 1000, 1000, 1024, "any"),     # one row, N % 16 != 0
    (3, 1000, 1040, 1008, 1024, "a16"),     # strided rows, odd N
    (2, 5120, 5200, 5136, 8192, "a16"),     # Qwen 27B hidden, padded block, N % 16 == 0
    (3, 4100, 4100, 4100, 8192, "any"),     # a block that is mostly masked
    (2, 2048, 2048, 2064, 2048, "any"),     # exact block
    (1, 16384, 16400, 16384, 16384, "a16"),  # largest block
])
def test_rmsnorm(K, M, N, stride_x, stride_y, block, variant):
    g = _gen(1000 + N + M)
    xb, x = strided(g, M, N, stride_x, scale=3.0)
    w = rnd(g, N, scale=0.2)
    yb, y = poisoned(M, N, stride_y)
    before = yb.clone()
    launch(K, f"rmsnorm.b{block}.{variant}", (M,), x, w, y, stride_x, stride_y, N, EPS)
    check(y, refs.rmsnorm(np64(x), np64(w), EPS))
    untouched_padding(yb, N, before)


@pytest.mark.parametrize("M,N,sx,sr,sy,block", [
    (1, 1000, 1000, 1000, 1000, 1024),
    (3, 5120, 5136, 5200, 5120, 8192),
    (1, 4097, 4112, 4112, 4112, 8192),
    (2, 4000, 4000, 4016, 4032, 4096),
])
def test_add_rmsnorm(K, M, N, sx, sr, sy, block):
    g = _gen(2000 + N + M)
    xb, x = strided(g, M, N, sx, scale=2.0)
    rb, r = strided(g, M, N, sr, scale=4.0)
    r0 = r.clone()
    rb_before = rb.clone()
    w = rnd(g, N, scale=0.2)
    yb, y = poisoned(M, N, sy)
    yb_before = yb.clone()
    launch(K, f"add_rmsnorm.b{block}.a16", (M,), x, r, w, y, sx, sr, sy, N, EPS)
    y_ref, r_ref = refs.add_rmsnorm(np64(x), np64(r0), np64(w), EPS)
    # The residual is the bf16-rounded sum. On a GPU the cast rounds to nearest even and must match torch's
    # bf16 add bit for bit; Triton 3.9's interpreter truncates fp32 -> bf16, so there allow one bf16 ulp.
    r_k = np64(r)
    if not INTERP:
        assert torch.equal(r.view(torch.int16), (x + r0).view(torch.int16)), "residual != torch bf16 add"
        assert np.array_equal(r_k, r_ref)
    assert np.isfinite(r_k).all()
    assert np.all(np.abs(r_k - r_ref) <= np.abs(r_ref) * 2.0 ** -7), "residual is not bf16(x + residual)"
    assert refs.rel_err(r_k, np64(x) + np64(r0)) < 1e-2
    check(y, y_ref)
    # y is the norm of exactly what was written back (the rounded sum), as HF computes it
    check(y, refs.rmsnorm(r_k, np64(w), EPS), tol=5e-3, what="y vs norm(written residual)")
    untouched_padding(rb, N, rb_before)
    untouched_padding(yb, N, yb_before)


@pytest.mark.parametrize("M,H,pad", [(1, 4, 0), (3, 6, 64)])
def test_gated_rmsnorm(K, M, H, pad):
    g = _gen(3000 + M * H)
    C = H * 128
    sx, sz, sy = C + pad, C + 2 * pad, C + 3 * pad
    xb, x = strided(g, M, C, sx, scale=2.0)
    zb, z = strided(g, M, C, sz, scale=2.0)
    w = rnd(g, 128, scale=0.3, shift=1.0)
    yb, y = poisoned(M, C, sy)
    before = yb.clone()
    hpp = K.specs["gated_rmsnorm.h128.a16"].constexprs["HEADS_PER_PROG"]
    launch(K, "gated_rmsnorm.h128.a16", (M, triton.cdiv(H, hpp)), x, z, w, y, sx, sz, sy, H, EPS)
    check(y, refs.gated_rmsnorm(np64(x), np64(z), np64(w), EPS))
    untouched_padding(yb, C, before)


@pytest.mark.parametrize("D,ROT,Hq,Hkv,theta,positions,qpad,tok", [
    (256, 64, 6, 2, 1e7, [0, 7, 4097], 32, None),
    (256, 64, 6, 2, 1e7, [0, 7, 4097, 3, 9, 70000], 32, 4),  # sm_90a's tile: 4 tokens a program, the last block partial
    (128, 32, 3, 1, 1e4, [5, 0, 1, 123456], 0, None),
    (128, 32, 3, 1, 1e4, [5, 0, 1, 123456, 8], 0, 2),
])
def test_qk_norm_rope(K, D, ROT, Hq, Hkv, theta, positions, qpad, tok):
    g = _gen(4000 + D + Hq)
    T = len(positions)
    sqg, sk = Hq * 2 * D + qpad, Hkv * D + qpad // 2
    qgb, qg = strided(g, T, Hq * 2 * D, sqg, scale=2.0)
    kb, k = strided(g, T, Hkv * D, sk, scale=2.0)
    qg_before, k_before = qgb.clone(), kb.clone()
    pos = torch.tensor(positions, dtype=torch.int32, device=DEV)
    wq, wk = rnd(g, D, scale=0.2), rnd(g, D, scale=0.2)
    q_out = torch.full((T, Hq, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    k_out = torch.full((T, Hkv, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    name = f"qk_norm_rope.d{D}.r{ROT}.a16"
    hpp = K.specs[name].constexprs["HEADS_PER_PROG"]
    tok = tok or K.specs[name].constexprs["TOK"]
    launch(K, name, (triton.cdiv(T, tok), triton.cdiv(Hq, hpp) + triton.cdiv(Hkv, hpp)),
           qg, k, pos, wq, wk, q_out, k_out, sqg, sk, T, Hq, Hkv, EPS, theta, TOK=tok)
    q_ref, k_ref = refs.qk_norm_rope(np64(qg), np64(k), positions, np64(wq), np64(wk), EPS, theta,
                                     Hq, Hkv, D, ROT)
    check(q_out, q_ref, what="q")
    check(k_out, k_ref, what="k")
    # pass-through dims are the plain norm; the inputs (incl. the gate halves) are untouched
    check(q_out[..., ROT:], refs.rmsnorm(np64(qg).reshape(T, Hq, 2 * D)[..., :D], np64(wq), EPS)[..., ROT:],
          what="q pass-through")
    assert torch.equal(qgb.view(torch.int16), qg_before.view(torch.int16))
    assert torch.equal(kb.view(torch.int16), k_before.view(torch.int16))


@pytest.mark.parametrize("M,I,pad", [(1, 1000, 0), (3, 2064, 48)])
def test_silu_mul(K, M, I, pad):
    g = _gen(5000 + I)
    sx, sy = 2 * I + pad, I + pad
    xb, x = strided(g, M, 2 * I, sx, scale=3.0)
    yb, y = poisoned(M, I, sy)
    before = yb.clone()
    block = K.specs["silu_mul.a16"].constexprs["BLOCK"]
    launch(K, "silu_mul.a16", (M, triton.cdiv(I, block)), x, y, sx, sy, I)
    check(y, refs.silu_mul(np64(x)))
    untouched_padding(yb, I, before)


@pytest.mark.parametrize("D,H,T", [(256, 6, 3), (128, 3, 2)])
def test_sigmoid_mul_reads_gate_in_place(K, D, H, T):
    """Gate read through strides from the gate halves of a qg buffer; out separate, then out aliasing x."""
    g = _gen(6000 + D + H)
    sqg = H * 2 * D + 16
    qgb, qg = strided(g, T, H * 2 * D, sqg, scale=3.0)
    gate_view = qg.view(T, H, 2 * D)[..., D:]           # [T, H, D] with strides (sqg, 2D, 1)
    gate_ptr = qg[:, D:]                                 # base pointer of head 0's gate
    sx, so = H * D + 32, H * D + 16
    xb, x = strided(g, T, H * D, sx, scale=2.0)
    ob, out = poisoned(T, H * D, so)
    before = ob.clone()
    name = f"sigmoid_mul.d{D}.a16"
    hpp = K.specs[name].constexprs["HEADS_PER_PROG"]
    grid = (T, triton.cdiv(H, hpp))
    ref = refs.sigmoid_mul(np64(x), np64(gate_view))
    launch(K, name, grid, x, gate_ptr, out, sx, sqg, 2 * D, so, H)
    check(out, ref)
    untouched_padding(ob, H * D, before)
    # in place: out is x
    xb_before = xb.clone()
    launch(K, f"sigmoid_mul.d{D}.any", grid, x, gate_ptr, x, sx, sqg, 2 * D, sx, H)
    assert torch.equal(x.view(torch.int16), out.view(torch.int16))
    untouched_padding(xb, H * D, xb_before)


@pytest.mark.parametrize("N,stride_t,block_variant", [(1000, 1000, "any"), (2064, 2080, "a16")])
def test_embedding(K, N, stride_t, block_variant):
    g = _gen(7000 + N)
    V = 37
    tb, table = strided(g, V, N, stride_t)
    ids_list = [3, -1, 36, 37, 0, 100000, -2147483648]
    ids = torch.tensor(ids_list, dtype=torch.int32, device=DEV)
    T = len(ids_list)
    so = N + 16
    ob, out = poisoned(T, N, so)
    before = ob.clone()
    block = K.specs[f"embedding.{block_variant}"].constexprs["BLOCK"]
    launch(K, f"embedding.{block_variant}", (T, triton.cdiv(N, block)), ids, table, out, stride_t, so, V, N)
    ref = refs.embedding(ids_list, np64(table))
    o = np64(out)
    assert np.array_equal(o, ref)  # a gather is exact
    for i, t in enumerate(ids_list):
        if not 0 <= t < V:
            assert not o[i].any(), f"id {t} should give a zero row"
    untouched_padding(ob, N, before)


# ------------------------------------------------------------------ small-magnitude rows: eps must matter

# Row scales: mean(x^2) = 1e-6, 1e-5, 1e-4, 1 (bf16 holds these exactly enough). With eps 1e-6 the first rows
# are normalized by sqrt(mean + eps) with eps a large part of it: a kernel adding 10x eps, no eps, or a
# hard-coded 1e-6 while the caller passes 1e-5 moves those rows by far more than the tolerance.
SMALL_SCALES = (1e-3, 3.16e-3, 1e-2, 1.0)
EPS_CASES = (1e-6, 1e-5)


def scaled(g, rows, cols, stride, group=None):
    """A [rows, cols] bf16 view of a padded random buffer; row r (or, with ``group``, each ``group``-wide
    slice j of every row) is scaled by SMALL_SCALES[(r or j) % 4]."""
    x = torch.randn(rows, stride, generator=g, dtype=torch.float32)
    if group is None:
        f = torch.tensor([SMALL_SCALES[r % 4] for r in range(rows)])[:, None]
    else:
        f = torch.tensor([SMALL_SCALES[(c // group) % 4] for c in range(stride)])[None, :]
    buf = (x * f).to(torch.bfloat16).to(DEV)
    return buf, buf[:, :cols]


def check_rows(out, ref, group, tol=1e-2, what="out"):
    """Relative error of every ``group``-wide slice of the last axis on its own (a small row cannot hide
    behind large ones)."""
    o = np64(out).reshape(-1, group)
    r = np.asarray(ref, dtype=np.float64).reshape(-1, group)
    assert np.isfinite(o).all(), f"{what}: non-finite elements (unwritten?)"
    err = np.linalg.norm(o - r, axis=1) / np.maximum(np.linalg.norm(r, axis=1), 1e-30)
    assert err.max() < tol, f"{what}: slice {int(err.argmax())} relative error {err.max():.3e} >= {tol}"
    return float(err.max())


def sensitive(ref_fn, ref, group, tol=1e-2):
    """The inputs must make eps visible: the reference with 10x eps, and with no eps, differs from ``ref``
    by more than 5x the tolerance in some slice."""
    for other in ref_fn(10.0), ref_fn(0.0):
        a = np.asarray(other).reshape(-1, group)
        b = np.asarray(ref).reshape(-1, group)
        d = np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
        assert d.max() > 5 * tol, "test inputs do not make eps matter"


@pytest.mark.parametrize("eps", EPS_CASES)
@pytest.mark.parametrize("N,block,variant", [(1000, 1024, "any"), (2048, 2048, "a16")])
def test_rmsnorm_small_rows_eps(K, eps, N, block, variant):
    g = _gen(8000 + N)
    M, stride = 4, N + 16
    xb, x = scaled(g, M, N, stride)
    w = rnd(g, N, scale=0.2)
    yb, y = poisoned(M, N, stride)
    launch(K, f"rmsnorm.b{block}.{variant}", (M,), x, w, y, stride, stride, N, eps)
    ref = refs.rmsnorm(np64(x), np64(w), eps)
    sensitive(lambda f: refs.rmsnorm(np64(x), np64(w), f * eps), ref, N)
    check_rows(y, ref, N)


@pytest.mark.parametrize("eps", EPS_CASES)
def test_add_rmsnorm_small_rows_eps(K, eps):
    g = _gen(8100)
    M, N, stride = 4, 1000, 1008
    xb, x = scaled(g, M, N, stride)
    rb, r = scaled(g, M, N, stride)
    r0 = r.clone()
    w = rnd(g, N, scale=0.2)
    yb, y = poisoned(M, N, stride)
    launch(K, "add_rmsnorm.b1024.any", (M,), x, r, w, y, stride, stride, stride, N, eps)
    y_ref, r_ref = refs.add_rmsnorm(np64(x), np64(r0), np64(w), eps)
    sensitive(lambda f: refs.add_rmsnorm(np64(x), np64(r0), np64(w), f * eps)[0], y_ref, N)
    check_rows(y, y_ref, N)
    check_rows(r, r_ref, N, tol=5e-3, what="residual")


@pytest.mark.parametrize("eps", EPS_CASES)
def test_gated_rmsnorm_small_heads_eps(K, eps):
    g = _gen(8200)
    M, H = 2, 5
    C = H * 128
    xb, x = scaled(g, M, C, C + 32, group=128)
    zb, z = strided(g, M, C, C, scale=2.0)
    w = rnd(g, 128, scale=0.3, shift=1.0)
    yb, y = poisoned(M, C, C)
    hpp = K.specs["gated_rmsnorm.h128.any"].constexprs["HEADS_PER_PROG"]
    launch(K, "gated_rmsnorm.h128.any", (M, triton.cdiv(H, hpp)), x, z, w, y, C + 32, C, C, H, eps)
    ref = refs.gated_rmsnorm(np64(x), np64(z), np64(w), eps)
    sensitive(lambda f: refs.gated_rmsnorm(np64(x), np64(z), np64(w), f * eps), ref, 128)
    check_rows(y, ref, 128)


@pytest.mark.parametrize("eps", EPS_CASES)
def test_qk_norm_rope_small_heads_eps(K, eps):
    """Query / key heads of every magnitude; the q heads' gate halves are large (they must not leak in)."""
    g = _gen(8300)
    D, ROT, Hq, Hkv, theta = 128, 32, 4, 4, 1e7
    positions = [3, 100, 2049]
    T = len(positions)
    qgb, qg = scaled(g, T, Hq * 2 * D, Hq * 2 * D, group=2 * D)
    qg.view(T, Hq, 2 * D)[..., D:] *= 1000.0
    kb, k = scaled(g, T, Hkv * D, Hkv * D, group=D)
    pos = torch.tensor(positions, dtype=torch.int32, device=DEV)
    wq, wk = rnd(g, D, scale=0.2), rnd(g, D, scale=0.2)
    q_out = torch.full((T, Hq, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    k_out = torch.full((T, Hkv, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    name = f"qk_norm_rope.d{D}.r{ROT}.any"
    hpp = K.specs[name].constexprs["HEADS_PER_PROG"]
    launch(K, name, (T, triton.cdiv(Hq, hpp) + triton.cdiv(Hkv, hpp)),
           qg, k, pos, wq, wk, q_out, k_out, Hq * 2 * D, Hkv * D, T, Hq, Hkv, eps, theta, TOK=1)

    def ref_fn(f):
        return refs.qk_norm_rope(np64(qg), np64(k), positions, np64(wq), np64(wk), f * eps, theta, Hq, Hkv, D, ROT)
    q_ref, k_ref = ref_fn(1.0)
    sensitive(lambda f: ref_fn(f)[0], q_ref, D)
    sensitive(lambda f: ref_fn(f)[1], k_ref, D)
    check_rows(q_out, q_ref, D, what="q")
    check_rows(k_out, k_ref, D, what="k")


def test_nan_fails_check():
    """The comparison helper itself rejects NaN / unwritten outputs."""
    ref = np.ones((2, 4))
    bad = torch.ones(2, 4, dtype=torch.bfloat16)
    bad[1, 2] = float("nan")
    with pytest.raises(AssertionError):
        check(bad, ref)


# ---------------------------------------------------------------------------------------- spec checks

def test_specs_match_kernel_signatures(K):
    specs = list(K.specs.values())
    assert 30 <= len(specs) <= 45
    names = [s.name for s in specs]
    assert len(set(names)) == len(names)
    for s in specs:
        s.validate()
        assert s.source == f"{s.family}.py", (s.family, s.source)
        fn = getattr(K.mods[s.source], s.entry, None)
        assert fn is not None, f"{s.name}: no entry {s.entry} in {s.source}"
        params = list(inspect.signature(fn.fn).parameters.values())
        assert [p.name for p in params] == [a.name for a in s.args] + list(s.constexprs), s.name
        for p in params:
            is_cx = p.name in s.constexprs
            assert (p.annotation is triton.language.constexpr or "constexpr" in str(p.annotation)) == is_cx, \
                f"{s.name}: {p.name} constexpr annotation mismatch"
        assert s.num_stages == 1
        for a in s.args:
            is_size_or_scalar = not a.type.startswith("*") and not a.name.startswith(("stride", "gate_stride"))
            if s.name.endswith(".a16"):
                assert (a.div == 16) == (not is_size_or_scalar), f"{s.name}: hint on {a.name}"
            else:
                assert s.name.endswith(".any") and a.div is None, f"{s.name}: {a.name}"
        assert s.num_warps in (1, 2, 4, 8, 16, 32)
        if "BLOCK" in s.constexprs:
            b = s.constexprs["BLOCK"]
            assert b & (b - 1) == 0
    # a16 / any come in pairs that differ only in hints
    by = {n: s for n, s in zip(names, specs)}
    for n, s in by.items():
        if n.endswith(".a16"):
            o = by[n[:-4] + ".any"]
            assert (o.entry, o.constexprs, o.num_warps, [a.name for a in o.args], [a.type for a in o.args]) == \
                (s.entry, s.constexprs, s.num_warps, [a.name for a in s.args], [a.type for a in s.args])
    blocks = sorted(by[n].constexprs["BLOCK"] for n in names if n.startswith("rmsnorm.") and n.endswith(".a16"))
    assert blocks[-1] >= 16384


def test_sources_import_only_triton():
    import ast
    for fam in FAMILIES:
        src = f"{fam}/{fam}.py"
        tree = ast.parse(open(os.path.join(ROOT, "kernels_src", src)).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert all(a.name in ("triton", "triton.language") for a in node.names), (src, ast.dump(node))
            elif isinstance(node, ast.ImportFrom):
                assert node.module == "kernels_src.common", (src, node.module)
