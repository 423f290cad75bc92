"""GPU (H200) checks of the MoE block's decode path (ops/moe/decode_ops.py, kernels_src/moe/decode.py) on
Qwen3.6-35B-A3B's shapes (E = 256 routed experts + the shared one folded in as expert 256, k = 8, H = 2048,
I = 512):

- sparse_moe_block at M = 1, 2, 4 (the rule's decode path) and 8, 16 (the decode path forced) vs the float64
  block, vs its grouped path on the same inputs (path="grouped"), two runs into a poisoned workspace bitwise
  equal;
- (capture + replay == eager for the decode path: tests/gpu/test_gpu_moe.py test_block_graph_replay_equals_eager
  at M = 1 and 4, which take it);
- each decode kernel vs float64 with every compiled tile, on views inside sentinel arenas (tests/bounds_cases):
  out-of-range ids (negative, == E', 2^31 - 1, -2^31) give zero h rows and contribute nothing (their h rows and
  routing weights NaN), and no byte around any tensor is written."""
from __future__ import annotations

import pytest

from tests import bounds_cases as B
from tests.gpu.test_gpu_moe import (E, H, I, K, _poison_ws, close_rows, expert_weights, near_ties, ref_block,
                                    ref_route, router_inputs)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

DECODE_MS = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def moe():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import moe
    return moe


def block(moe, x, gw, w1, w2, sg, ws, path):
    out = torch.full(x.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    moe.sparse_moe_block(x, gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out, path=path)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("M", DECODE_MS + (16,))
def test_decode_block_vs_float64_and_grouped(moe, M):
    x, gw, sg = router_inputs(M, 500 + M)
    w1, w2 = expert_weights(600 + M)
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    path = None if M <= moe.DECODE_MAX_M else "decode"
    if M <= moe.DECODE_MAX_M:
        assert moe.choose_path(M) == "decode"
    _poison_ws(ws)
    out = block(moe, x, gw, w1, w2, sg, ws, path)
    ref, _ = ref_block(x, gw, w1, w2, K, True, sg)
    _, _, p = ref_route(x, gw, K, True, sg)
    close_rows(out, ref, ~near_ties(p, K), f"decode block M={M}")
    _poison_ws(ws)
    again = block(moe, x, gw, w1, w2, sg, ws, "decode")
    assert torch.equal(out.view(torch.uint16), again.view(torch.uint16)), "decode path not deterministic"
    _poison_ws(ws)
    grouped = block(moe, x, gw, w1, w2, sg, ws, "grouped")
    # the same routing (one router launch per path, deterministic): every row compared
    close_rows(out, grouped.double(), torch.ones(M, dtype=torch.bool, device="cuda"), f"decode vs grouped M={M}")
    rel = ((out.double() - grouped.double()).norm() / grouped.double().norm()).item()
    print(f"M={M}: decode vs grouped relative error {rel:.3e}")
    assert rel < 1e-2



def _ids(g, M, k, Ep):
    """Router-like ids (distinct per row, the last column the shared expert Ep - 1) with adversarial entries."""
    ids = torch.rand(M, Ep - 1, generator=g, device="cuda").argsort(1)[:, :k - 1]
    ids = torch.cat([ids, torch.full((M, 1), Ep - 1, device="cuda", dtype=torch.long)], 1)
    bad = [-1, Ep, 2**31 - 1, -2**31]
    for i, v in enumerate(bad):
        ids[i % M, (3 * i) % k] = v
    return ids.to(torch.int32)


def check_pairs_h(h, x, W1, ids, k, Ep, I, flat_bad):
    """The decode gate_up output h [M k, I] vs float64 (W1 [E', 2I, H] float64 on the device): pair f through
    expert ids[f] of token f // k, silu(gate) * up; relative error < 1e-2 over the valid pairs."""
    xd = x.double()
    ref = torch.zeros(h.shape[0], I, dtype=torch.float64, device="cuda")
    for f in range(h.shape[0]):
        e = int(ids.view(-1)[f])
        if 0 <= e < Ep:
            gu = W1[e] @ xd[f // k]
            ref[f] = torch.nn.functional.silu(gu[:I]) * gu[I:]
    ok = ~flat_bad
    err = ((h.double() - ref)[ok].norm() / ref[ok].norm()).item()
    assert err < 1e-2, err


def check_pairs_down(out, h, W2, ids, wts, k, Ep):
    """The decode down output out [M, H] vs float64 (W2 [E', H, I] float64 on the device): each token's valid
    picks' routing-weighted W2[e] @ h rows summed; finite, relative error < 1e-2."""
    ref = torch.zeros(out.shape, dtype=torch.float64, device="cuda")
    hd = h.double()
    for f in range(h.shape[0]):
        e = int(ids.view(-1)[f])
        if 0 <= e < Ep:
            ref[f // k] += wts.view(-1)[f].double() * (W2[e] @ hd[f])
    assert torch.isfinite(out.float()).all()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err


@pytest.mark.parametrize("tiles", [0, 1, 2, 3, 4])
def test_decode_kernels_bad_ids_and_guard_bytes(moe, tiles):
    """The real H and I with E' = 17 experts (the weights in sentinel arenas stay small), M = 4, k' = 9."""
    from vkc_runtime.ops.moe import decode_ops as D
    M, k, Ep = 4, K + 1, 17
    g = torch.Generator(device="cuda").manual_seed(900 + tiles)
    ar = B.Arena(900 + tiles, "cuda")
    ids = _ids(g, M, k, Ep)
    bad = ~((ids >= 0) & (ids < Ep))
    assert int(bad.sum()) == 4
    x = ar.put((torch.randn(M, H, generator=g, device="cuda")).to(torch.bfloat16))
    w1 = ar.put((torch.randn(Ep, 2 * I, H, generator=g, device="cuda") * 0.02).to(torch.bfloat16))
    w2 = ar.put((torch.randn(Ep, H, I, generator=g, device="cuda") * 0.02).to(torch.bfloat16))
    it = ar.put(ids)
    h = ar.poison((M * k, I), torch.bfloat16)
    D.decode_gate_up(x, w1, it, out=h, _tile=D.TILES["gate_up"][tiles % len(D.TILES["gate_up"])])
    torch.cuda.synchronize()
    ar.check()
    flat_bad = bad.view(-1)
    assert torch.equal(h[flat_bad].float(), torch.zeros_like(h[flat_bad].float())), "a bad id's h row is not 0"
    check_pairs_h(h, x, w1.double(), ids, k, Ep, I, flat_bad)
    # down: the bad pairs' h rows and weights NaN (must not be read), poisoned out
    hn = ar.put(torch.where(flat_bad[:, None], float("nan"), h.float()).to(torch.bfloat16))
    wts = torch.rand(M, k, generator=g, device="cuda") + 0.1
    wts[bad] = float("nan")
    wt = ar.put(wts)
    out = ar.poison((M, H), torch.bfloat16)
    D.decode_down(hn, w2, it, wt, out=out, _tile=D.TILES["down"][tiles])
    torch.cuda.synchronize()
    ar.check()
    check_pairs_down(out, h, w2.double(), ids, wts, k, Ep)
