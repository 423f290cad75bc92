"""Our float64 references against HF transformers' own Qwen3.5/3.6 (qwen3_next) implementations on CPU: the
references every kernel is tested against must compute the model's math. HF works in float32 internally, so
agreement is ~1e-6 relative."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from tests import refs, refs_gdn  # noqa: E402

TOL = 2e-5


def rng(seed):
    return np.random.default_rng(seed)


def test_rmsnorm_one_plus_w():
    r = rng(1)
    x, w = r.standard_normal((7, 5120)) * 3, r.standard_normal(5120) * 0.2
    m = hf.Qwen3NextRMSNorm(5120, eps=1e-6)
    with torch.no_grad():
        m.weight.copy_(torch.tensor(w))
        y = m(torch.tensor(x, dtype=torch.float32)).double().numpy()
    assert refs.rel_err(y, refs.rmsnorm(x, w, 1e-6)) < TOL


def test_gated_rmsnorm_per_value_head():
    r = rng(2)
    M, H = 5, 48
    x, z, w = r.standard_normal((M, H * 128)), r.standard_normal((M, H * 128)), r.standard_normal(128) * 0.5
    m = hf.Qwen3NextRMSNormGated(128, eps=1e-6)
    with torch.no_grad():
        m.weight.copy_(torch.tensor(w))
        y = m(torch.tensor(x, dtype=torch.float32).view(M, H, 128),
              torch.tensor(z, dtype=torch.float32).view(M, H, 128)).double().numpy().reshape(M, H * 128)
    assert refs.rel_err(y, refs.gated_rmsnorm(x, z, w, 1e-6)) < TOL


def test_partial_rope_neox():
    r = rng(3)
    T, H, D, theta, rot = 9, 4, 256, 1e7, 64
    q = r.standard_normal((T, H, D))
    pos = r.integers(0, 4096, T)
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))  # HF's formula, float64
    freqs = torch.tensor(pos, dtype=torch.float64)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    qt = torch.tensor(q).unsqueeze(0)  # [1, T, H, D]
    q_hf, _ = hf.apply_rotary_pos_emb(qt, qt, emb.cos().unsqueeze(0), emb.sin().unsqueeze(0), unsqueeze_dim=2)
    assert refs.rel_err(q_hf[0].numpy(), refs.rope_neox(q, pos, theta, rot)) < 1e-12


@pytest.mark.parametrize("with_state", [False, True])
def test_gated_delta_rule_chunked_and_recurrent(with_state):
    r = rng(4 + with_state)
    T, hk, hv, D = 100, 2, 4, 128
    x = r.standard_normal((T, 2 * hk * D + hv * D))
    qkv = x / (1 + np.exp(-x))
    a, b = r.standard_normal((T, hv)) * 2, r.standard_normal((T, hv)) * 2
    A_log, dt = r.random(hv) * 2 - 1, r.standard_normal(hv) * 0.5
    cu = np.array([0, T])
    state = r.standard_normal((1, hv, D, D)) * 0.05 if with_state else None
    slot = np.array([0]) if with_state else None
    ref_c, st_c = refs_gdn.chunked(qkv, a, b, A_log, dt, cu, hk, hv, state, slot)
    ref_r, st_r = refs_gdn.recurrent(qkv, a, b, A_log, dt, cu, hk, hv, state, slot)

    q = torch.tensor(qkv[:, :hk * D]).view(1, T, hk, D)
    k = torch.tensor(qkv[:, hk * D:2 * hk * D]).view(1, T, hk, D)
    v = torch.tensor(qkv[:, 2 * hk * D:]).view(1, T, hv, D)
    g = (-torch.tensor(A_log).exp() * torch.nn.functional.softplus(torch.tensor(a) + torch.tensor(dt))).view(1, T, hv)
    beta = torch.tensor(b).sigmoid().view(1, T, hv)
    s0 = None if state is None else torch.tensor(state, dtype=torch.float32)
    # transformers >= 5 dispatches to FLA when it is installed: unwrap to the pure-torch reference
    chunk = inspect.unwrap(hf.torch_chunk_gated_delta_rule)
    rec = inspect.unwrap(hf.torch_recurrent_gated_delta_rule)
    o_c, s_c = chunk(q, k, v, g, beta, chunk_size=64, initial_state=s0, output_final_state=True,
                     use_qk_l2norm_in_kernel=True)
    o_r, s_r = rec(q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert refs_gdn.rel_err(ref_c, ref_r) < 1e-10
    assert refs_gdn.rel_err(o_c[0].double().numpy(), ref_c) < TOL
    assert refs_gdn.rel_err(o_r[0].double().numpy(), ref_r) < TOL
    if with_state:
        assert refs_gdn.rel_err(s_c[0].double().numpy(), st_c[0]) < TOL
        assert refs_gdn.rel_err(s_r[0].double().numpy(), st_r[0]) < TOL
