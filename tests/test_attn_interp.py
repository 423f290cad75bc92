"""CPU tests of kernels_src/attn through Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py)
against the float64 references in tests/refs_attn.py, plus spec/ABI checks and the runtime's split
heuristic. Real D=128/256 specs with tiny token counts; the paged caches are shuffled, every slot the
kernels must not read holds NaN, outputs and decode scratch start as NaN."""
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

from tests.kernel_testing import device, launch_spec, np64, specs  # noqa: E402
from tests import refs_attn as R  # noqa: E402

FAMILY_DIR = os.path.join(ROOT, "kernels_src", "attn")
SOURCES = ("cache.py", "prefill.py", "decode.py")
TOL = 1e-2




DEV = device()




@pytest.fixture(scope="module")
def K():
    mods = {src: importlib.import_module(f"kernels_src.attn.{src[:-3]}") for src in SOURCES}
    return SimpleNamespace(mods=mods, specs=specs("attn"))


def cfg(K, name, arch=None):
    s = K.specs[name]
    return dict(s.for_arch(arch).constexprs) if arch else dict(s.constexprs)


def launch(K, name, grid, *args, arch=None):
    launch_spec(K.specs[name], grid, *args, arch=arch)


def cdiv(a, b):
    return -(-a // b)


def rnd(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def make_paged(g, lens, Hkv, D, bs, extra_cols=1):
    """Shuffled paged caches holding random rows 0..L-1 of each sequence; everything else NaN. The block
    table has extra columns past each sequence's blocks holding out-of-range ids (never to be used)."""
    nblk = [cdiv(L, bs) for L in lens]
    num_blocks = sum(nblk) + 3
    perm = torch.randperm(num_blocks, generator=g)
    width = max(max(nblk), 1) + extra_cols
    bt = torch.full((len(lens), width), 10**6, dtype=torch.int32)
    kc = torch.full((num_blocks, bs, Hkv, D), float("nan"), dtype=torch.bfloat16)
    vc = torch.full_like(kc, float("nan"))
    used = 0
    for i, L in enumerate(lens):
        ids = perm[used:used + nblk[i]]
        used += nblk[i]
        bt[i, :nblk[i]] = ids.to(torch.int32)
        for n in range(L):
            kc[ids[n // bs], n % bs] = rnd(g, Hkv, D)
            vc[ids[n // bs], n % bs] = rnd(g, Hkv, D)
    return kc, vc, bt


def check(out, ref, what):
    o = np64(out)
    assert np.isfinite(o).all(), f"{what}: {np.count_nonzero(~np.isfinite(o))} non-finite elements"
    err = R.rel_err(o, ref)
    assert err < TOL, f"{what}: relative error {err:.3e}"
    return err


# --------------------------------------------------------------------------------------------- specs

def test_spec_args_match_kernel_signatures(K):
    for s in K.specs.values():
        fn = getattr(K.mods[s.source], s.entry)
        params = list(inspect.signature(fn.fn).parameters)
        runtime = [p for p in params if p not in s.constexprs]
        assert runtime == [a.name for a in s.args], s.name
        for arch in s.archs:
            assert set(s.for_arch(arch).constexprs) == set(params) - set(runtime), (s.name, arch)


def test_spec_count_is_reasonable(K):
    # 2 cache + 8 prefill (4 TMA) + per D: split, 2 direct, 2 fused (each also .tma), 2 combine; drop
    # split/combine once decode_fused is measured to win at every split count
    assert len(K.specs) <= 34


# ------------------------------------------------------------------------------------ reshape_and_cache

@pytest.mark.parametrize("bs,variant", [(16, "a16"), (64, "any")])
def test_reshape_and_cache(K, bs, variant):
    g = torch.Generator().manual_seed(1)
    T, Hkv, D, nb = 7, 2, 128, 3
    k, v = rnd(g, T, Hkv, D), rnd(g, T, Hkv, D)
    kc, vc = rnd(g, nb, bs, Hkv, D), rnd(g, nb, bs, Hkv, D)
    slots = torch.tensor([5, -1, bs + 3, nb * bs - 1, nb * bs, 2 * bs, 0], dtype=torch.int32)
    rk, rv = R.reshape_and_cache(k.numpy() if False else np64(k), np64(v), np64(kc), np64(vc), slots.numpy())
    N = Hkv * D
    blk = cfg(K, f"reshape_and_cache.{variant}")["BLOCK"]
    launch(K, f"reshape_and_cache.{variant}", (T, cdiv(N, blk)), k, v, kc, vc, slots,
           Hkv * D, Hkv * D, bs * Hkv * D, Hkv * D, bs, N, nb * bs)
    assert np.array_equal(np64(kc), rk) and np.array_equal(np64(vc), rv)


# --------------------------------------------------------------------------------------------- prefill

def run_prefill(K, name, q, kc, vc, bt, cu, seq_lens, scale, gate=None, arch=None):
    T, Hq, D = q.shape
    Hkv, bs = kc.shape[2], kc.shape[1]
    N = len(seq_lens)
    BM = cfg(K, name, arch)["BLOCK_M"]
    n_mb = cdiv(T, BM) + N
    o = torch.full((T, Hq, D), float("nan"), dtype=torch.bfloat16)
    gp, sgt, sgh = (gate, gate.stride(0), gate.stride(1)) if gate is not None else (q, 0, 0)
    launch(K, name, (Hq * n_mb,), q, kc, vc, o, gp, bt, cu, seq_lens, scale, N, T, Hq, Hq // Hkv,
           q.stride(0), q.stride(1), o.stride(0), o.stride(1), sgt, sgh,
           kc.stride(0), kc.stride(1), kc.stride(2), bt.stride(0), bs, bt.shape[1], kc.shape[0], arch=arch)
    return o


# (q_lens, prefix lengths): lengths 1, 15, 16, 17 with and without a cached prefix
PREFILL_CASES = [
    ([1, 15, 16, 17], [0, 0, 0, 0]),
    ([3, 17, 1], [13, 16, 30]),
]


@pytest.mark.parametrize("D,Hq,Hkv,gate,arch", [
    (128, 4, 2, False, None),
    (256, 6, 1, True, None),
    (256, 4, 2, False, "sm_86"),
    (128, 6, 1, True, "sm_80"),
])
@pytest.mark.parametrize("case", range(len(PREFILL_CASES)))
def test_prefill(K, D, Hq, Hkv, gate, arch, case):
    q_lens, prefix = PREFILL_CASES[case]
    g = torch.Generator().manual_seed(10 * D + case + Hq)
    lens = [a + b for a, b in zip(q_lens, prefix)]
    kc, vc, bt = make_paged(g, lens, Hkv, D, 16)
    T = sum(q_lens)
    q = rnd(g, T, Hq, D)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    sl = torch.tensor(lens, dtype=torch.int32)
    gt = None
    if gate:
        qg = rnd(g, T, Hq, 2, D)  # interleaved [query | gate] per head, gate read in place
        gt = qg[:, :, 1]
    scale = D ** -0.5
    name = f"prefill.d{D}.{'gate' if gate else 'nogate'}"
    o = run_prefill(K, name, q, kc, vc, bt, cu, sl, scale, gt, arch)
    ref = R.prefill(np64(q), np64(kc), np64(vc), bt.numpy(), cu.numpy(), lens, scale,
                    None if gt is None else np64(gt))
    check(o, ref, f"{name} {arch} {q_lens}/{prefix}")


def test_prefill_empty_sequence_and_long_chunk(K):
    """An empty sequence in the batch and a chunk spanning several m-blocks and key tiles."""
    g = torch.Generator().manual_seed(7)
    D, Hq, Hkv = 128, 2, 1
    q_lens, prefix = [0, 40, 2], [5, 33, 0]
    lens = [a + b for a, b in zip(q_lens, prefix)]
    kc, vc, bt = make_paged(g, lens, Hkv, D, 16)
    T = sum(q_lens)
    q = rnd(g, T, Hq, D)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    # 64 x 64 tiles: two key tiles, one masked; scale 0.15, not the model's 128^-0.5: the kernel must use its argument
    o = run_prefill(K, "prefill.d128.nogate", q, kc, vc, bt, cu, torch.tensor(lens, dtype=torch.int32), 0.15,
                    arch="sm_86")
    ref = R.prefill(np64(q), np64(kc), np64(vc), bt.numpy(), cu.numpy(), lens, 0.15)
    check(o, ref, "prefill empty+long")


# TMA variants (sm_90a/sm_100a; block_size % BLOCK_N == 0): (q_lens, prefix lengths) that reach the
# unmasked loop (prefix >= BLOCK_N), the diagonal band, a partial last tile whose stale slots are NaN, and a
# last tile that ends exactly on L
TMA_CASES = [
    ([1, 70, 130], [0, 64, 5]),
    ([64, 3], [128, 61]),
]


@pytest.mark.parametrize("D,Hq,Hkv,gate,interleaved", [
    (256, 6, 1, True, False),
    (256, 4, 2, False, True),
    (128, 4, 2, True, True),
])
@pytest.mark.parametrize("case", range(len(TMA_CASES)))
def test_prefill_tma(K, D, Hq, Hkv, gate, interleaved, case):
    q_lens, prefix = TMA_CASES[case]
    name = f"prefill.d{D}.{'gate' if gate else 'nogate'}.tma"
    assert K.specs[name].archs == ("sm_90a", "sm_100a")
    bn = cfg(K, name)["BLOCK_N"]
    g = torch.Generator().manual_seed(100 + D + case)
    lens = [a + b for a, b in zip(q_lens, prefix)]
    kc, vc, bt = make_paged(g, lens, Hkv, D, bn)
    if interleaved:  # k and v blocks interleaved in one allocation: block stride 2 * block_size * Hkv * D
        kv = torch.stack([kc, vc], 1)
        kc, vc = kv[:, 0], kv[:, 1]
    T = sum(q_lens)
    q = rnd(g, T, Hq, D)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
    gt = rnd(g, T, Hq, 2, D)[:, :, 1] if gate else None
    o = run_prefill(K, name, q, kc, vc, bt, cu, torch.tensor(lens, dtype=torch.int32), D ** -0.5, gt)
    ref = R.prefill(np64(q), np64(kc), np64(vc), bt.numpy(), cu.numpy(), lens, D ** -0.5,
                    None if gt is None else np64(gt))
    check(o, ref, f"{name} {q_lens}/{prefix} interleaved={interleaved}")


# ---------------------------------------------------------------------------------------------- decode

def run_decode(K, D, q, kc, vc, bt, sl, scale, num_splits, gate=None, arch=None, fused=False):
    """split + combine launches, or (fused) the one-launch kernel whose last split per group combines: its
    tickets start at zero and must be zero again afterwards (the next launch relies on it)."""
    B, Hq, _ = q.shape
    Hkv, bs = kc.shape[2], kc.shape[1]
    part_o = torch.full((B, Hq, num_splits, D), float("nan"), dtype=torch.float32)
    part_lse = torch.full((B, Hq, num_splits), float("nan"), dtype=torch.float32)
    gp, sgb, sgh = (gate, gate.stride(0), gate.stride(1)) if gate is not None else (q, 0, 0)
    g = "gate" if gate is not None else "nogate"
    if fused:
        o = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16)
        counters = torch.zeros(B * Hq, dtype=torch.int32)
        launch(K, f"decode_fused.d{D}.{g}", (B * Hkv * num_splits,), q, kc, vc, bt, sl, part_o, part_lse, counters,
               o, gp, scale, Hkv, Hq // Hkv, num_splits, q.stride(0), q.stride(1), o.stride(0), o.stride(1), sgb, sgh,
               kc.stride(0), kc.stride(1), kc.stride(2), bt.stride(0), bs, bt.shape[1], kc.shape[0], arch=arch)
        assert torch.all(counters == 0), "decode_fused left a ticket counter non-zero"
        return o
    launch(K, f"decode_split.d{D}", (B * Hkv * num_splits,), q, kc, vc, bt, sl, part_o, part_lse,
           scale, Hkv, Hq // Hkv, num_splits, q.stride(0), q.stride(1),
           kc.stride(0), kc.stride(1), kc.stride(2), bt.stride(0), bs, bt.shape[1], kc.shape[0], arch=arch)
    o = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16)
    launch(K, f"decode_combine.d{D}.{g}", (B * Hq,), part_o, part_lse, o, gp, Hq, num_splits, o.stride(0), o.stride(1), sgb, sgh, arch=arch)
    return o


def decode_inputs(seed, D, Hq, Hkv, gate):
    """Six sequences (lengths 1, 15, 16, 17, 0, 130) in a shuffled block-16 cache, q and an optional strided
    gate: (lens, kc, vc, bt, q, seq_lens, gate)."""
    g = torch.Generator().manual_seed(seed)
    lens = [1, 15, 16, 17, 0, 130]
    kc, vc, bt = make_paged(g, lens, Hkv, D, 16)
    q = rnd(g, len(lens), Hq, D)
    gt = rnd(g, len(lens), Hq, 2, D)[:, :, 1] if gate else None
    return lens, kc, vc, bt, q, torch.tensor(lens, dtype=torch.int32), gt


@pytest.mark.parametrize("D,Hq,Hkv,splits,gate,arch", [
    (256, 6, 1, 1, False, None),
    (256, 6, 1, 3, True, None),
    (128, 4, 2, 5, False, None),
    (256, 4, 2, 2, True, "sm_86"),
    (128, 8, 1, 20, False, None),  # more splits than key tiles: empty splits
])
@pytest.mark.parametrize("fused", [False, True])
def test_decode(K, D, Hq, Hkv, splits, gate, arch, fused):
    lens, kc, vc, bt, q, sl, gt = decode_inputs(D + splits + Hq, D, Hq, Hkv, gate)
    o = run_decode(K, D, q, kc, vc, bt, sl, D ** -0.5, splits, gt, arch, fused)
    ref = R.decode(np64(q), np64(kc), np64(vc), bt.numpy(), lens, D ** -0.5, None if gt is None else np64(gt))
    check(o, ref, f"decode D={D} {Hq}/{Hkv} splits={splits} fused={fused}")
    assert torch.all(o[4] == 0), "an empty sequence decodes to zeros"


@pytest.mark.parametrize("fused", [False, True])
def test_decode_many_live_splits(K, fused):
    """More live splits than the combine kernel's SPLIT_BLOCK, with the later splits holding the largest
    scores: the max the combine subtracts must come from every split, not the first block (and the fused
    merge's running max grows between splits, so its rescaling is exercised)."""
    D, Hq, Hkv, bn = 128, 4, 2, cfg(K, "decode_split.d128")["BLOCK_N"]
    sb = cfg(K, "decode_combine.d128.nogate")["SPLIT_BLOCK"]
    splits = sb + 8
    lens = [splits * bn, (sb + 1) * bn + 5]
    g = torch.Generator().manual_seed(77)
    kc, vc, bt = make_paged(g, lens, Hkv, D, 16)
    q = rnd(g, len(lens), Hq, D)
    group = Hq // Hkv
    for b, L in enumerate(lens):
        for n in range(sb * bn, L):  # keys past the first SPLIT_BLOCK splits lean towards the group's queries
            blk, off = int(bt[b, n // 16]), n % 16
            for h in range(Hkv):
                lean = q[b, h * group:(h + 1) * group].float().mean(0) * 0.3
                kc[blk, off, h] = (kc[blk, off, h].float() + lean).to(torch.bfloat16)
    sl = torch.tensor(lens, dtype=torch.int32)
    o = run_decode(K, D, q, kc, vc, bt, sl, D ** -0.5, splits, fused=fused)
    ref = R.decode(np64(q), np64(kc), np64(vc), bt.numpy(), lens, D ** -0.5)
    check(o, ref, f"decode {splits} live splits fused={fused}")


@pytest.mark.parametrize("splits", [5, 40, 70])
def test_decode_combine_dead_splits(K, splits):
    """The combine on its own, against float64: live splits (finite lse) anywhere among dead ones (lse -inf,
    partials NaN: stale scratch), more splits than one SPLIT_BLOCK (40) and than one lse load (70), the largest
    lse in the last split, a row whose splits are all dead (zeros) and one whose only live split is the last."""
    g = torch.Generator().manual_seed(11 + splits)
    B, Hq, D = 2, 4, 128
    lse = (torch.rand(B, Hq, splits, generator=g) * 8.0 - 4.0).float()
    dead = torch.rand(B, Hq, splits, generator=g) < 0.5
    dead[0, 0, -1] = False
    lse[0, 0, -1] = 9.0  # the largest weight comes last
    dead[0, 1] = True    # nothing live: zeros
    dead[1, 2] = True
    dead[1, 2, -1] = False  # only the last split is live
    lse = torch.where(dead, torch.full_like(lse, float("-inf")), lse)
    po = torch.randn(B, Hq, splits, D, generator=g).float()
    po = torch.where(dead[..., None], torch.full_like(po, float("nan")), po)
    o = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16)
    launch(K, "decode_combine.d128.nogate", (B * Hq,), po, lse, o, o, Hq, splits, o.stride(0), o.stride(1), 0, 0)
    live = ~dead.numpy()
    lse64 = np.where(live, np64(lse), -np.inf)
    top = np.where(live.any(-1, keepdims=True), lse64.max(-1, keepdims=True), 0.0)
    w = np.where(live, np.exp2(lse64 - top), 0.0)  # the combine's weights, float64
    num = (w[..., None] * np.where(live[..., None], np64(po), 0.0)).sum(2)
    den = w.sum(2)[..., None]
    ref = num / np.where(den > 0, den, 1.0)
    check(o, ref, f"combine {splits} splits with dead ones")
    assert torch.all(o[0, 1] == 0), "a row with no live split combines to zeros"


@pytest.mark.parametrize("D,Hq,Hkv,gate,arch,scale_f", [
    (256, 6, 1, True, None, 1.0),
    (128, 8, 2, False, None, 1.6),   # a scale other than the model's D^-0.5: the kernel must use its argument
    (256, 4, 2, True, "sm_86", 0.6),
])
def test_decode_direct(K, D, Hq, Hkv, gate, arch, scale_f):
    """The one-split kernel: whole sequences, output normalized, gated and stored directly."""
    lens, kc, vc, bt, q, sl, gt = decode_inputs(50 + D + Hq, D, Hq, Hkv, gate)
    scale = scale_f * D ** -0.5
    B = len(lens)
    o = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16)
    gp, sgb, sgh = (gt, gt.stride(0), gt.stride(1)) if gate else (q, 0, 0)
    launch(K, f"decode_direct.d{D}.{'gate' if gate else 'nogate'}", (B * Hkv,), q, kc, vc, bt, sl, o, gp,
           scale, Hkv, Hq // Hkv, q.stride(0), q.stride(1), o.stride(0), o.stride(1), sgb, sgh,
           kc.stride(0), kc.stride(1), kc.stride(2), bt.stride(0), 16, bt.shape[1], kc.shape[0], arch=arch)
    ref = R.decode(np64(q), np64(kc), np64(vc), bt.numpy(), lens, scale, None if gt is None else np64(gt))
    check(o, ref, f"decode_direct D={D} {Hq}/{Hkv}")
    assert torch.all(o[4] == 0), "an empty sequence decodes to zeros"


def test_decode_bad_block_ids_stay_in_bounds(K):
    """Block ids past num_blocks and lengths past the table width never read outside the cache."""
    g = torch.Generator().manual_seed(3)
    D, Hq, Hkv = 128, 2, 1
    kc, vc, bt = make_paged(g, [20, 20], Hkv, D, 16, extra_cols=0)
    bt[1, 1] = 10**6  # second block of sequence 1 is garbage -> its keys are skipped
    q = rnd(g, 2, Hq, D)
    sl = torch.tensor([20 + 1000, 20], dtype=torch.int32)  # seq 0 claims more than its table holds
    o = run_decode(K, D, q, kc, vc, bt, sl, 0.1, 2)
    assert np.isfinite(np64(o)).all()
    ref0 = R.decode(np64(q[:1]), np64(kc), np64(vc), bt.numpy()[:1], [32], 0.1)  # clamped to 2 blocks
    # seq 0: first 20 keys are real rows, keys 20..31 are NaN slots in its last block -> the clamp reaches
    # unwritten slots; only check seq 1 exactly (16 valid keys), and that nothing became NaN.
    ref1 = R.decode(np64(q[1:]), np64(kc), np64(vc), bt.numpy()[1:], [16], 0.1)
    check(o[1:], ref1, "decode skipped bad block")
    del ref0


# TMA decode (sm_90a/sm_100a; block_size % BLOCK_N == 0): lengths with a partial last tile whose stale slots are
# NaN, a last tile ending exactly on a block, an empty sequence, splits past the last tile; bad block ids in the
# middle of a sequence (their keys do not count) and past the table width


def run_decode_tma(K, kind, D, q, kc, vc, bt, sl, scale, splits, gate):
    B, Hq, _ = q.shape
    Hkv, bs = kc.shape[2], kc.shape[1]
    g = "gate" if gate is not None else "nogate"
    gp, sgb, sgh = (gate, gate.stride(0), gate.stride(1)) if gate is not None else (q, 0, 0)
    o = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16)
    geo = (kc.stride(0), kc.stride(1), kc.stride(2), bt.stride(0), bs, bt.shape[1], kc.shape[0])
    if kind == "direct":
        launch(K, f"decode_direct.d{D}.{g}.tma", (B * Hkv,), q, kc, vc, bt, sl, o, gp, scale, Hkv, Hq // Hkv,
               q.stride(0), q.stride(1), o.stride(0), o.stride(1), sgb, sgh, *geo)
        return o
    part_o = torch.full((B, Hq, splits, D), float("nan"), dtype=torch.float32)
    part_lse = torch.full((B, Hq, splits), float("nan"), dtype=torch.float32)
    if kind == "fused":
        counters = torch.zeros(B * Hq, dtype=torch.int32)
        launch(K, f"decode_fused.d{D}.{g}.tma", (B * Hkv * splits,), q, kc, vc, bt, sl, part_o, part_lse, counters,
               o, gp, scale, Hkv, Hq // Hkv, splits, q.stride(0), q.stride(1), o.stride(0), o.stride(1), sgb, sgh,
               *geo)
        assert torch.all(counters == 0), "decode_fused .tma left a ticket counter non-zero"
        return o
    launch(K, f"decode_split.d{D}.tma", (B * Hkv * splits,), q, kc, vc, bt, sl, part_o, part_lse, scale, Hkv,
           Hq // Hkv, splits, q.stride(0), q.stride(1), *geo)
    launch(K, f"decode_combine.d{D}.{g}", (B * Hq,), part_o, part_lse, o, gp, Hq, splits, o.stride(0), o.stride(1),
           sgb, sgh)
    return o


@pytest.mark.parametrize("kind,D,Hq,Hkv,splits,gate,bs_mult", [
    ("split", 256, 6, 1, 3, False, 1),
    ("fused", 256, 4, 2, 2, True, 2),
    ("direct", 256, 6, 1, 1, True, 1),
    ("split", 128, 8, 2, 7, True, 2),
    ("fused", 128, 4, 1, 5, False, 1),
    ("direct", 128, 4, 2, 1, False, 2),
])
def test_decode_tma(K, kind, D, Hq, Hkv, splits, gate, bs_mult):
    name = f"decode_split.d{D}.tma"
    assert K.specs[name].archs == ("sm_90a", "sm_100a")
    bn = cfg(K, name)["BLOCK_N"]
    bs = bn * bs_mult
    g = torch.Generator().manual_seed(300 + D + splits + bs)
    lens = [1, bn - 1, bn, 2 * bn + 5, 0, 3 * bn]
    kc, vc, bt = make_paged(g, lens, Hkv, D, bs)
    q = rnd(g, len(lens), Hq, D)
    gt = rnd(g, len(lens), Hq, 2, D)[:, :, 1] if gate else None
    scale = 0.8 * D ** -0.5
    o = run_decode_tma(K, kind, D, q, kc, vc, bt, torch.tensor(lens, dtype=torch.int32), scale, splits, gt)
    ref = R.decode(np64(q), np64(kc), np64(vc), bt.numpy(), lens, scale, None if gt is None else np64(gt))
    check(o, ref, f"decode {kind} .tma D={D} {Hq}/{Hkv} splits={splits} block {bs}")
    assert torch.all(o[4] == 0), "an empty sequence decodes to zeros"


@pytest.mark.parametrize("kind", ["split", "fused", "direct"])
def test_decode_tma_bad_block_ids(K, kind):
    """A block id outside [0, num_blocks) in the middle of a sequence: its keys do not count (the tile reads block
    0 in bounds and discards it, NaN there included); lengths past the table width are clamped."""
    D, Hq, Hkv = 128, 2, 1
    bn = cfg(K, f"decode_split.d{D}.tma")["BLOCK_N"]
    g = torch.Generator().manual_seed(5)
    lens = [3 * bn, 2 * bn]
    kc, vc, bt = make_paged(g, lens, Hkv, D, bn, extra_cols=0)
    # a NaN block 0 in front (the block an invalid id's tile reads in its place); the real ids move up by one
    kc, vc = (torch.cat([torch.full_like(c[:1], float("nan")), c]) for c in (kc, vc))
    bt = bt + 1
    bad = bt.clone()
    bad[0, 1] = -7
    bad[1, 1] = 10**6
    q = rnd(g, 2, Hq, D)
    sl = torch.tensor([3 * bn, 2 * bn + 1000], dtype=torch.int32)  # seq 1 claims more than its table holds
    o = run_decode_tma(K, kind, D, q, kc, vc, bad, sl, D ** -0.5, 2 if kind != "direct" else 1, None)
    assert np.isfinite(np64(o)).all()
    # the reference drops the bad block's keys: sequence 0 = its blocks 0 and 2, sequence 1 = its block 0
    keep0 = torch.stack([bt[0, 0], bt[0, 2]]).view(1, 2)
    ref0 = R.decode(np64(q[:1]), np64(kc), np64(vc), keep0.numpy(), [2 * bn], D ** -0.5)
    ref1 = R.decode(np64(q[1:]), np64(kc), np64(vc), bt.numpy()[1:, :1], [bn], D ** -0.5)
    check(o[:1], ref0, f"decode {kind} .tma: a negative block id skipped")
    check(o[1:], ref1, f"decode {kind} .tma: a block id past num_blocks skipped")


# ------------------------------------------------------------------------------------ split heuristic

def test_split_heuristic():
    from vkc_runtime.ops import attn as A
    # big batch fills the GPU without splitting
    assert A.num_splits_for(256, 4, 32768, 132, max_splits=64) >= 1
    assert A.num_splits_for(256, 4, 512, 132, max_splits=64) == 1
    # single sequence, long context: split up to the cap, each split >= MIN_KEYS_PER_SPLIT keys
    s = A.num_splits_for(1, 4, 32768, 132, max_splits=64)
    assert 16 <= s <= 64 and 32768 / s >= A.MIN_KEYS_PER_SPLIT
    assert A.num_splits_for(1, 4, 100, 132, max_splits=64) == 1
    assert A.num_splits_for(4, 2, 10**6, 132, max_splits=8) == 8
    # full waves: 64 x 4 items already fill 2 x 132 slots once; 16 x 4 items fill them with 4 splits (5 would
    # leave a second wave 21% full)
    assert A.num_splits_for(64, 4, 4096, 132, max_splits=64) == 1
    assert A.num_splits_for(16, 4, 32768, 132, max_splits=64) == 4
    # small work: down to one 64-key tile per split (the H200 sweep's best: 8 splits at 1 x 512, the full
    # wave of 4 at 16 x 512)
    assert A.num_splits_for(1, 4, 512, 132, max_splits=64) == 8
    assert A.num_splits_for(16, 4, 512, 132, max_splits=64) == 4
    assert A.num_splits_for(1, 4, 4096, 132, max_splits=64) >= 32
    for B, L in [(1, 4096), (16, 32768), (3, 20000), (7, 9000)]:
        s = A.num_splits_for(B, 4, L, 132)
        waves = -(-(B * 4 * s) // 264)
        assert B * 4 * s / (waves * 264) > 0.75 or s == L // A.MIN_KEYS_PER_SPLIT, (B, L, s)
