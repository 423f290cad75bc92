"""The moe float64 references (tests/refs_moe.py) against HF transformers' ``Qwen3_5MoeSparseMoeBlock`` on the
CPU in float64, with the shared expert stacked as expert E the way the engine stacks it (w1[E] = [gate; up],
w2[E] = down, shared_gate_w = shared_expert_gate.weight): the GPU tests compare vkc against these references,
so the weight mapping is checked here. Also the grouped-GEMM stand-in against a direct loop."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests import refs_moe as R  # noqa: E402


def hf_block(E=8, k=2, H=32, I=16, seed=0):
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as HM
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    cfg = Qwen3_5MoeTextConfig(hidden_size=H, num_experts=E, num_experts_per_tok=k, moe_intermediate_size=I,
                               shared_expert_intermediate_size=I, norm_topk_prob=True, hidden_act="silu")
    torch.manual_seed(seed)
    blk = HM.Qwen3_5MoeSparseMoeBlock(cfg).double()
    with torch.no_grad():
        for p in blk.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return blk


def stacked(blk):
    """(gate_w, w1 [E+1, 2I, H], w2 [E+1, H, I], shared_gate_w) as numpy float64."""
    se = blk.shared_expert
    w1 = torch.cat([blk.experts.gate_up_proj, torch.cat([se.gate_proj.weight, se.up_proj.weight])[None]])
    w2 = torch.cat([blk.experts.down_proj, se.down_proj.weight[None]])
    return (blk.gate.weight.detach().numpy(), w1.detach().numpy(), w2.detach().numpy(),
            blk.shared_expert_gate.weight.detach().numpy())


def test_block_reference_equals_hf():
    blk = hf_block()
    x = torch.randn(1, 11, 32, dtype=torch.float64)
    with torch.no_grad():
        hf = blk(x)[0].numpy()
        _, hf_w, hf_ids = blk.gate(x[0])
    gw, w1, w2, sg = stacked(blk)
    ids, w, _ = R.route(x[0].numpy(), gw, 2, True, sg)
    assert np.array_equal(ids[:, :2], hf_ids.numpy()) and (ids[:, 2] == 8).all()
    np.testing.assert_allclose(w[:, :2], hf_w.numpy(), rtol=1e-6)  # HF's softmax runs in fp32
    np.testing.assert_allclose(R.block(x[0].numpy(), gw, w1, w2, 2, True, sg), hf, rtol=1e-5,
                               atol=1e-6 * np.abs(hf).max())


def test_grouped_standin_follows_the_contract():
    rng = np.random.default_rng(0)
    P, E, H, N, bm = 10, 3, 8, 4, 4
    a = rng.standard_normal((5, H))
    w = rng.standard_normal((E, 2 * N, H))
    ids = rng.integers(0, E, P)
    sid = np.full(28, P)
    bex = np.full(7, -1)
    pos = 0
    for e in range(E):
        grp = np.nonzero(ids == e)[0]
        sid[pos:pos + grp.size] = grp
        bex[pos // bm:(pos + -(-grp.size // bm) * bm) // bm] = e
        pos += -(-grp.size // bm) * bm
    out = np.full((P, N), np.nan)
    R.grouped_gemm_standin(a, w, sid, bex, np.array([pos]), a_row_div=2, out=out, block_m=bm, act="silu_mul")
    for f in range(P):
        r = w[ids[f]] @ a[f // 2]
        np.testing.assert_allclose(out[f], R.silu(r[:N]) * r[N:], rtol=1e-5)  # the stand-in sums in float32
