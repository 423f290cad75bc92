"""The attention ops (driver-free, against the committed sm_90a manifest): which prefill kernel a cache gets
(TMA vs gather), the refusals of use_tma, grids and argument lists, and decode's split count taken from the
kernel's occupancy."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from tests.ops_fakes import MANIFEST, Dev, install_recorder, patch_ops
from vkc_runtime.ops import attn as A
from vkc_runtime.ops._check import OpError

I32 = "<i4"


@pytest.fixture()
def rec(monkeypatch):
    return install_recorder(monkeypatch, A)


def cache(nb, bs, hkv, d, interleaved=False):
    if interleaved:  # k and v blocks alternate in one allocation: block stride 2 * bs * hkv * d
        st = (2 * bs * hkv * d, hkv * d, d, 1)
        base = Dev((nb * 2 * bs * hkv * d,))
        ptr = base.__cuda_array_interface__["data"][0]
        return (Dev((nb, bs, hkv, d), strides=st, device_ptr=ptr),
                Dev((nb, bs, hkv, d), strides=st, device_ptr=ptr + bs * hkv * d * 2))
    return Dev((nb, bs, hkv, d)), Dev((nb, bs, hkv, d))


def prefill(T=300, Hq=24, Hkv=4, D=256, bs=64, nb=40, gate=False, **kw):
    kc, vc = cache(nb, bs, Hkv, D, kw.pop("interleaved", False))
    q = Dev((T, Hq, D))
    g = Dev((T, Hq, D), strides=(Hq * 2 * D, 2 * D, 1), offset=D) if gate else None
    A.prefill(q, kc, vc, Dev((2, 20), I32), Dev((3,), I32), Dev((2,), I32), D ** -0.5, gate=g,
              out=Dev((T, Hq, D)), **kw)


@pytest.mark.parametrize("D,bs,gate,interleaved,want", [
    (256, 64, False, False, "attn.prefill.d256.nogate.tma"),
    (256, 128, True, True, "attn.prefill.d256.gate.tma"),
    (256, 16, False, False, "attn.prefill.d256.nogate"),   # block 16 < the 64-key TMA tile
    (128, 64, False, False, "attn.prefill.d128.nogate"),   # D=128's TMA tile is 128 keys
    (128, 128, True, False, "attn.prefill.d128.gate.tma"),
])
def test_prefill_kernel_choice(rec, D, bs, gate, interleaved, want):
    prefill(D=D, bs=bs, gate=gate, interleaved=interleaved, max_seqlen_q=300)
    base, grid, args = rec.calls[0]
    assert base == want
    bm = MANIFEST["kernels"][want]["inputs"]["constexprs"]["BLOCK_M"]
    assert grid == (24 * min(-(-300 // bm) + 2, 2 * -(-300 // bm)), 1, 1)
    assert args[8] == 256 ** -0.5 if D == 256 else args[8] == 128 ** -0.5


def test_prefill_use_tma_false_forces_gather(rec):
    prefill(bs=64, use_tma=False)
    assert rec.calls[0][0] == "attn.prefill.d256.nogate"


@pytest.mark.parametrize("kw,msg", [
    (dict(bs=16, use_tma=True), "block_size 16 is not a multiple of 64"),
    (dict(D=128, bs=64, use_tma=True), "block_size 64 is not a multiple of 128"),
])
def test_prefill_use_tma_true_refuses(rec, kw, msg):
    with pytest.raises(OpError, match=msg):
        prefill(**kw)
    assert rec.calls == []


def test_prefill_without_tma_artifacts(rec, monkeypatch):
    """An arch without the .tma artifacts (everything but sm_90a/sm_100a) takes the gather kernel; asking for
    TMA there is an error."""
    patch_ops(monkeypatch, A, "has_kernel", lambda base, device=None: False)
    prefill(bs=64)
    assert rec.calls[0][0] == "attn.prefill.d256.nogate"
    with pytest.raises(OpError, match="no attn.prefill.d256.nogate.tma artifact"):
        prefill(bs=64, use_tma=True)


def test_prefill_workspace_scratch_reaches_the_launch(rec):
    """A PrefillWorkspace's global scratch is handed to the launch (the kernel uses it when it needs scratch, the
    TMA one does); without a workspace the launch gets none (the context's default); a call beyond the sizes the
    workspace was made for is refused before any launch."""
    sentinel = object()
    ws = A.PrefillWorkspace(sentinel, max_tokens=300, max_seqs=2, num_q_heads=24, head_dim=256)
    prefill(bs=64, workspace=ws)
    prefill(bs=16, workspace=ws)  # the gather kernel gets it too (and ignores it: it needs no scratch)
    prefill(bs=64)
    assert [c[0] for c in rec.calls] == ["attn.prefill.d256.nogate.tma", "attn.prefill.d256.nogate",
                                         "attn.prefill.d256.nogate.tma"]
    assert rec.scratch == [sentinel, sentinel, None]
    for bad, msg in ((dict(T=301), "workspace sized for 300 tokens"), (dict(Hq=8), "24 heads")):
        with pytest.raises(OpError, match=msg):
            prefill(bs=64, workspace=ws, **bad)
    with pytest.raises(OpError, match="must be a PrefillWorkspace"):
        prefill(bs=64, workspace="ws")
    with pytest.raises(OpError, match="must be a PrefillWorkspace"):
        A.PrefillPlan(Dev((3,), I32), Dev((2,), I32), Dev((2, 20), I32), num_q_heads=24, num_kv_heads=4,
                      head_dim=256, block_size=64, workspace=42)
    assert len(rec.calls) == 3


def test_prefill_uses_tma(rec):
    assert A.prefill_uses_tma(Dev((8, 64, 4, 256)))
    assert not A.prefill_uses_tma(Dev((8, 16, 4, 256)))
    assert A.prefill_uses_tma(Dev((8, 128, 2, 128)), gate=True)


def test_prefill_plan_launches_what_prefill_launches(rec):
    """A PrefillPlan (batch tensors checked once, kernel choice made once per cache geometry) launches exactly
    what prefill() launches for the same tensors, over layers with and without gate and both cache kinds
    (block 64 -> TMA kernel, block 16 -> gather); caches or q that do not fit the plan are refused before
    any launch."""
    T, Hq, Hkv, D = 300, 24, 4, 256
    cu, sl, bt = Dev((3,), I32), Dev((2,), I32), Dev((2, 20), I32)
    q, out = Dev((T, Hq, D)), Dev((T, Hq, D))
    gate = Dev((T, Hq, D), strides=(Hq * 2 * D, 2 * D, 1), offset=D)
    layers = [cache(40, 64, Hkv, D), cache(40, 64, Hkv, D, interleaved=True)]
    for g in (None, gate):
        for kc, vc in layers:
            A.prefill(q, kc, vc, bt, cu, sl, D ** -0.5, gate=g, out=out, max_seqlen_q=T)
    want = list(rec.calls)
    rec.calls.clear()
    plan = A.PrefillPlan(cu, sl, bt, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=64, max_seqlen_q=T)
    for g in (None, gate):
        for kc, vc in layers:
            plan.run(q, kc, vc, D ** -0.5, gate=g, out=out)
    assert rec.calls == want and {c[0] for c in want} == {"attn.prefill.d256.nogate.tma",
                                                          "attn.prefill.d256.gate.tma"}
    rec.calls.clear()
    plan16 = A.PrefillPlan(cu, sl, bt, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=16)
    plan16.run(q, *cache(160, 16, Hkv, D), D ** -0.5, out=out)
    assert rec.calls[0][0] == "attn.prefill.d256.nogate" and rec.calls[0][1] == (Hq * (-(-T // 64) + 2), 1, 1)
    rec.calls.clear()
    with pytest.raises(OpError, match="plan was made for"):
        plan.run(q, *cache(160, 16, Hkv, D), D ** -0.5, out=out)  # block size 16
    with pytest.raises(OpError, match="q has shape"):
        plan.run(Dev((T, Hq + 1, D)), *layers[0], D ** -0.5, out=out)
    with pytest.raises(OpError, match="out has shape"):
        plan.run(q, *layers[0], D ** -0.5, out=Dev((T + 1, Hq, D)))
    with pytest.raises(OpError, match="q heads are not a multiple"):
        A.PrefillPlan(cu, sl, bt, num_q_heads=Hq, num_kv_heads=5, head_dim=D, block_size=64)
    with pytest.raises(OpError, match="seq_lens has shape"):
        A.PrefillPlan(cu, Dev((3,), I32), bt, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=64)
    assert not rec.calls


def workspace(B, Hq, D, max_splits=64):
    ws = A.DecodeWorkspace(Dev((B * Hq * max_splits * D,), "<f4"), Dev((B * Hq * max_splits,), "<f4"),
                           Dev((B * Hq,), "<i4"), B, Hq, D, max_splits)
    for a in (ws.part_o, ws.part_lse, ws.counters):
        a.data_ptr = lambda a=a: a.__cuda_array_interface__["data"][0]
    return ws


def test_decode_split_count_from_occupancy(rec):
    """16 sequences x 4 kv heads at 32768 keys: 2 resident CTAs/SM x 132 SMs = 264 slots -> 4 splits (one full
    wave); with 1 resident CTA/SM -> 2 splits."""
    B, Hq, Hkv, D, bs = 16, 24, 4, 256, 16
    kc, vc = cache(B * 2048, bs, Hkv, D)
    ws = workspace(B, Hq, D)

    def run(**kw):
        A.decode(Dev((B, Hq, D)), kc, vc, Dev((B, 2048), I32), Dev((B,), I32), 0.0625, out=Dev((B, Hq, D)),
                 workspace=ws, max_seq_len=32768, **kw)
    run()
    ((b1, g1, a1),) = rec.calls  # one launch: the last split of each group combines
    assert b1 == "attn.decode_fused.d256.nogate" and g1 == (B * Hkv * 4, 1, 1) and a1[13] == 4  # num_splits
    assert a1[7] == ws.counters.data_ptr()
    rec.calls.clear()
    run(fused=False)  # split + combine launches
    (b1, g1, a1), (b2, g2, _) = rec.calls
    assert b1 == "attn.decode_split.d256" and g1 == (B * Hkv * 4, 1, 1) and a1[10] == 4  # num_splits
    assert b2 == "attn.decode_combine.d256.nogate" and g2 == (B * Hq, 1, 1)
    rec.calls.clear()
    rec.occupancy = 1
    run()
    assert rec.calls[0][1] == (B * Hkv * 2, 1, 1)


def test_decode_tma_kernels_never_fuse_by_default(rec):
    """With the TMA kernels (block 64, a workspace with their scratch) decode takes split + combine where the
    gather kernels' rule would fuse (16 x 4 items over a 32768-key table); fused=True still forces one launch."""
    B, Hq, Hkv, D, bs = 16, 24, 4, 256, 64
    kc, vc = cache(B * 512, bs, Hkv, D)
    ws = dataclasses.replace(workspace(B, Hq, D), scratch=SimpleNamespace(ptr=0x7000, nbytes=1 << 30),
                             max_kv_heads=Hkv)

    def run(**kw):
        A.decode(Dev((B, Hq, D)), kc, vc, Dev((B, 512), I32), Dev((B,), I32), 0.0625, out=Dev((B, Hq, D)),
                 workspace=ws, max_seq_len=32768, **kw)
        bases = [c[0] for c in rec.calls]
        rec.calls.clear()
        return bases
    splits = A.num_splits_for(B, Hkv, 32768, 132, ctas_per_sm=1)
    assert splits > 1 and A.use_fused_combine(splits, 32768)  # what the gather kernels would do here
    assert not A.use_fused_combine(splits, 32768, tma=True)
    assert run() == ["attn.decode_split.d256.tma", "attn.decode_combine.d256.nogate"]
    assert run(fused=True) == ["attn.decode_fused.d256.nogate.tma"]


def test_decode_one_split_is_one_launch(rec):
    """When the heuristic picks one split (64 x 4 items fill the 264 slots) the direct kernel writes the output:
    no partials, no combine launch."""
    B, Hq, Hkv, D, bs = 64, 24, 4, 256, 16
    kc, vc = cache(B * 256, bs, Hkv, D)
    ws = workspace(B, Hq, D)
    gate = Dev((B, Hq, D), strides=(Hq * 2 * D, 2 * D, 1), offset=D)
    A.decode(Dev((B, Hq, D)), kc, vc, Dev((B, 256), I32), Dev((B,), I32), 0.0625, gate=gate,
             out=Dev((B, Hq, D)), workspace=ws, max_seq_len=4096)
    assert len(rec.calls) == 1
    base, grid, args = rec.calls[0]
    assert base == "attn.decode_direct.d256.gate" and grid == (B * Hkv, 1, 1)
    assert args[14:16] == (Hq * 2 * D, 2 * D)  # gate strides


@pytest.mark.parametrize("forced,want", [(1, 1), (3, 3), (64, 64), (0, None), (65, None)])
def test_decode_forced_num_splits(rec, forced, want):
    """num_splits= overrides the heuristic within 1..workspace.max_splits (one split: the direct kernel)."""
    B, Hq, Hkv, D, bs = 1, 24, 4, 256, 16
    kc, vc = cache(64, bs, Hkv, D)

    def run():
        A.decode(Dev((B, Hq, D)), kc, vc, Dev((B, 32), I32), Dev((B,), I32), 0.0625, out=Dev((B, Hq, D)),
                 workspace=workspace(B, Hq, D), max_seq_len=512, num_splits=forced)
    if want is None:
        with pytest.raises(OpError, match="num_splits"):
            run()
        assert not rec.calls
        return
    run()
    if want == 1:
        assert [(c[0], c[1]) for c in rec.calls] == [("attn.decode_direct.d256.nogate", (B * Hkv, 1, 1))]
    else:  # 512 keys over 3 or 64 splits: too short for the fused merge's tail -> split + combine
        (b1, g1, a1), (b2, g2, a2) = rec.calls
        assert b1 == "attn.decode_split.d256" and g1 == (B * Hkv * want, 1, 1) and a1[10] == want
        assert b2 == "attn.decode_combine.d256.nogate" and g2 == (B * Hq, 1, 1) and a2[5] == want


@pytest.mark.parametrize("splits,L,fused", [(1, 32768, False), (2, 512, True), (2, 511, False), (4, 4096, True),
                                             (4, 512, False), (8, 4096, False), (8, 8192, True),
                                             (61, 32768, False), (64, 524288, True), (65, 10**7, False)])
def test_fused_combine_rule(splits, L, fused):
    """The fused merge's tail grows with the split count: fused iff L >= 128 * splits^2 (and 2..64 splits)."""
    assert A.use_fused_combine(splits, L) is fused


def test_decode_plan_launches_what_decode_launches(rec):
    """A plan checked once and run per layer launches exactly what decode() launches for the same tensors;
    a layer whose caches or q do not fit the plan is refused before any launch."""
    B, Hq, Hkv, D, bs = 3, 24, 4, 256, 16
    bt, sl = Dev((B, 32), I32), Dev((B,), I32)
    ws = workspace(B, Hq, D)
    layers = [cache(B * 32, bs, Hkv, D) for _ in range(2)]
    q, out = Dev((B, Hq, D)), Dev((B, Hq, D))
    gate = Dev((B, Hq, D), strides=(Hq * 2 * D, 2 * D, 1), offset=D)
    for g in (None, gate):
        for kc, vc in layers:
            A.decode(q, kc, vc, bt, sl, 0.0625, gate=g, out=out, workspace=ws, max_seq_len=512)
    want = list(rec.calls)
    rec.calls.clear()
    plan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=bs, workspace=ws,
                        max_seq_len=512)
    assert plan.num_splits == 8 and len(want) == 8  # 2 gates x 2 layers x (split + combine): 512 keys, 8 splits
    for g in (None, gate):
        for kc, vc in layers:
            plan.run(q, kc, vc, 0.0625, gate=g, out=out)
    assert rec.calls == want
    rec.calls.clear()
    with pytest.raises(OpError, match="plan was made for"):
        plan.run(q, *cache(B * 32, 64, Hkv, D), 0.0625, out=out)  # block size 64
    with pytest.raises(OpError, match="q has shape"):
        plan.run(Dev((B + 1, Hq, D)), *layers[0], 0.0625, out=out)
    with pytest.raises(OpError, match="kv heads"):
        A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=5, head_dim=D, block_size=bs, workspace=ws)
    assert not rec.calls


@pytest.mark.parametrize("q_kw,msg", [
    (dict(offset=4), r"q_ptr=0x[0-9a-f]+ must be 16-byte aligned"),  # 4 bf16 = 8 bytes off
    (dict(strides=(24 * 256 + 8, 256, 1)), r"stride_qb=0x1808 must be a multiple of 16 elements"),
])
def test_decode_refuses_misaligned_q(rec, q_kw, msg):
    """The hot-path alignment check (one OR of every pointer and stride) still names the offending value."""
    B, Hq, Hkv, D, bs = 2, 24, 4, 256, 16
    kc, vc = cache(8, bs, Hkv, D)
    with pytest.raises(OpError, match=msg):
        A.decode(Dev((B, Hq, D), offset=q_kw.get("offset", 0), strides=q_kw.get("strides")), kc, vc,
                 Dev((B, 4), I32), Dev((B,), I32), 0.0625, out=Dev((B, Hq, D)), workspace=workspace(B, Hq, D),
                 max_seq_len=64)
    assert not rec.calls
