"""vkc_engine on Qwen3.5/3.6 MoE checkpoints, on CPU: the engine on the float32 numpy backend
(tests/engine_numpy_backend.py, whose moe_block is the reference of HF's Qwen3_5MoeSparseMoeBlock) against HF
transformers' fp32 Qwen3_5MoeForCausalLM on tiny random checkpoints (tests/engine_fixtures.py), in both expert
layouts (fused as transformers holds them, per-expert as released), text-only and VLM-wrapped, with the shared
expert folded in as expert E and kept apart (another width); the MoE config fields and the loader's errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.engine_fixtures import HEADS_35B, MOE_SMALL, checkpoint, hf_greedy, hf_logits, make_checkpoint, numpy_llm
from tests.engine_fixtures import random_prompt as _prompt, rel_err as _rel
from tests.engine_numpy_backend import NumpyBackend
from tests.test_engine_loader import BASE

pytest.importorskip("transformers")

from vkc_engine import SamplingParams  # noqa: E402
from vkc_engine.config import ConfigError, parse_config  # noqa: E402
from vkc_engine.loader import CheckpointError  # noqa: E402

TOL = 2e-5  # as tests/test_engine_model_cpu.py: fp32 HF vs the fp64-accumulated numpy backend
LAYERS3 = ["linear_attention", "full_attention", "linear_attention"]
MOE_CFG = {**{k: v for k, v in BASE.items() if k != "intermediate_size"}, "model_type": "qwen3_5_moe_text",
           "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
           "shared_expert_intermediate_size": 128}


@pytest.fixture(scope="module")
def ck_fused(tmp_path_factory):
    """Text-only, fused expert tensors, E 8 / k 2, shared expert folded (equal widths)."""
    d, model, _ = checkpoint(tmp_path_factory, "moe_fused", heads=HEADS_35B, layer_types=LAYERS3, moe=MOE_SMALL,
                             expert_layout="fused", seed=21)
    return d, model


@pytest.fixture(scope="module")
def ck_released(tmp_path_factory):
    """VLM-wrapped, per-expert tensors, sharded, E 16 / k 4, shared expert folded: the released layout."""
    moe = dict(MOE_SMALL, num_experts=16, num_experts_per_tok=4)
    d, model, _ = checkpoint(tmp_path_factory, "moe_released", heads=HEADS_35B, layer_types=LAYERS3, moe=moe,
                             expert_layout="per_expert", vlm=True, shards=2, seed=22)
    return d, model


def _llm(d, **kw):
    return numpy_llm(d, **{"num_blocks": 40, **kw})


# ------------------------------------------------------------------------------------------------ config
def test_config_moe_fields_both_layouts():
    c = parse_config(MOE_CFG)
    assert c.is_moe and (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size,
                         c.shared_expert_intermediate_size, c.intermediate_size) == (16, 4, 128, 128, 0)
    w = parse_config({"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                      "text_config": {**MOE_CFG, "norm_topk_prob": True, "mlp_only_layers": [],
                                      "decoder_sparse_step": 1}})
    assert w.vlm_wrapped and w.is_moe and w.num_experts == 16
    assert not parse_config({**BASE, "model_type": "qwen3_5"}).is_moe


@pytest.mark.parametrize("change,field", [
    ({"num_experts": None}, "num_experts is missing"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size is missing"),
    ({"shared_expert_intermediate_size": None}, "shared_expert_intermediate_size is missing"),
    ({"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size 0"),
    ({"num_experts_per_tok": 17}, "num_experts_per_tok (17) exceeds num_experts (16)"),
    ({"norm_topk_prob": False}, "norm_topk_prob"),
    ({"mlp_only_layers": [1]}, "mlp_only_layers"),
    ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
])
def test_config_moe_errors_name_the_field(change, field):
    with pytest.raises(ConfigError) as e:
        parse_config({**MOE_CFG, **change})
    assert field in str(e.value)


# ------------------------------------------------------------------------------------------------ vs HF
@pytest.mark.parametrize("n", [1, 17, 60])
def test_teacher_forced_logits_match_hf_fused(ck_fused, n):
    d, model = ck_fused
    llm = _llm(d)
    assert llm.cfg.is_moe and llm.model.layers[0].mlp.folded
    assert llm.model.layers[0].mlp.w1.shape == (9, 256, 256) and llm.model.layers[0].mlp.w2.shape == (9, 256, 128)
    ids = _prompt(n, llm.cfg.vocab_size, 40 + n)
    ref = hf_logits(model, ids)
    got = llm.prompt_logits(ids)
    assert got.shape == ref.shape
    assert _rel(got, ref) < TOL, _rel(got, ref)
    assert llm.backend.calls.count("moe_block") == 3 * -(-n // 48) and "silu_mul" not in llm.backend.calls


def test_released_layout_vlm_sharded_matches_hf_and_chunks(ck_released):
    d, model = ck_released
    logs = []
    llm = _llm(d, log=logs.append)
    assert llm.cfg.vlm_wrapped and llm.cfg.num_experts == 16
    assert any("mtp.* tensors" in m for m in logs)
    ids = _prompt(45, llm.cfg.vocab_size, 9)
    ref = hf_logits(model, ids)
    whole = llm.prompt_logits(ids)
    assert _rel(whole, ref) < TOL, _rel(whole, ref)
    got = llm.prompt_logits(ids, chunk=16)
    assert _rel(got, whole) < 1e-5 and _rel(got, ref) < TOL


def test_released_layout_stacks_like_the_fused_one(ck_released, tmp_path):
    """The per-expert tensors land in w1 / w2 exactly where transformers' conversion puts them."""
    d, model = ck_released
    llm = _llm(d)
    sd = model.state_dict()
    for i in (0, 2):
        m = llm.model.layers[i].mlp
        gu = sd[f"model.layers.{i}.mlp.experts.gate_up_proj"].numpy()
        dn = sd[f"model.layers.{i}.mlp.experts.down_proj"].numpy()
        sh = f"model.layers.{i}.mlp.shared_expert."
        np.testing.assert_array_equal(m.w1[:16], gu)
        np.testing.assert_array_equal(m.w2[:16], dn)
        np.testing.assert_array_equal(m.w1[16], np.concatenate([sd[sh + "gate_proj.weight"].numpy(),
                                                                sd[sh + "up_proj.weight"].numpy()]))
        np.testing.assert_array_equal(m.w2[16], sd[sh + "down_proj.weight"].numpy())


def test_greedy_decode_matches_hf(ck_fused):
    d, model = ck_fused
    llm = _llm(d)
    ids = _prompt(11, llm.cfg.vocab_size, 6)
    want, margins = hf_greedy(model, ids, 12)
    assert min(margins) > 1e-3  # no near-tie in this fixture's continuation (else the comparison is noise)
    out = llm.generate(ids, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert out.token_ids == want
    assert {"attn_decode", "gdn_decode", "moe_block"} <= set(llm.backend.calls)


def test_batch_equals_alone(ck_released):
    d, _ = ck_released
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [_prompt(n, 300, 200 + n) for n in (5, 30, 1, 12)]
    alone = [_llm(d).generate(p, sp)[0].token_ids for p in prompts[:2]]
    outs = _llm(d, max_num_batched_tokens=20).generate(prompts, sp)
    assert [o.token_ids for o in outs[:2]] == alone


def test_shared_expert_of_another_width_runs_apart(tmp_path):
    """shared_expert_intermediate_size != moe_intermediate_size: the shared expert is a separate SwiGLU (the
    numpy backend runs it; VkcBackend refuses it, see tests/test_engine_vkc_backend_fake.py)."""
    moe = dict(MOE_SMALL, shared_expert_intermediate_size=192)
    model, _ = make_checkpoint(tmp_path, heads=HEADS_35B, layer_types=["full_attention", "linear_attention"],
                               moe=moe, expert_layout="fused", seed=23)
    llm = _llm(tmp_path)
    mlp = llm.model.layers[0].mlp
    assert not mlp.folded and mlp.w1.shape[0] == 8 and mlp.shared[0].shape == (384, 256)
    ids = _prompt(20, llm.cfg.vocab_size, 4)
    assert _rel(llm.prompt_logits(ids), hf_logits(model, ids)) < TOL


# ------------------------------------------------------------------------------------------------ errors
def _copy_without(src, dst, drop=None, reshape=None):
    """The checkpoint of ``src`` rewritten into ``dst`` with one tensor dropped or one replaced."""
    import torch
    from safetensors.torch import load_file, save_file
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            t = load_file(str(f))
            if drop in t:
                del t[drop]
            if reshape and reshape[0] in t:
                t[reshape[0]] = torch.zeros(reshape[1], dtype=torch.bfloat16)
            save_file(t, str(dst / f.name))
        elif f.name != "model.safetensors.index.json":
            (dst / f.name).write_bytes(f.read_bytes())


def test_loader_errors_name_the_expert_tensor(tmp_path):
    src = tmp_path / "src"
    make_checkpoint(src, heads=HEADS_35B, layer_types=["linear_attention"], hidden=128, moe=MOE_SMALL,
                    expert_layout="per_expert", seed=24)
    assert json.loads((src / "config.json").read_text())["model_type"] == "qwen3_5_moe_text"
    kw = dict(max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64, num_blocks=8)
    _copy_without(src, tmp_path / "a", drop="model.layers.0.mlp.experts.5.up_proj.weight")
    with pytest.raises(CheckpointError, match=r"tensor model\.layers\.0\.mlp\.experts\.5\.up_proj\.weight is missing"):
        _llm(tmp_path / "a", **kw)
    _copy_without(src, tmp_path / "b", reshape=("model.layers.0.mlp.experts.3.down_proj.weight", (128, 64)))
    with pytest.raises(CheckpointError, match=r"experts\.3\.down_proj\.weight has shape \[128, 64\], expected \[128, "
                                              r"128\]"):
        _llm(tmp_path / "b", **kw)
    _copy_without(src, tmp_path / "c", drop="model.layers.0.mlp.shared_expert_gate.weight")
    with pytest.raises(CheckpointError, match=r"shared_expert_gate\.weight is missing"):
        _llm(tmp_path / "c", **kw)
    _copy_without(src, tmp_path / "d", reshape=("model.layers.0.mlp.gate.weight", (7, 128)))
    with pytest.raises(CheckpointError, match=r"mlp\.gate\.weight has shape \[7, 128\], expected \[8, 128\]"):
        _llm(tmp_path / "d", **kw)


def test_fused_layout_errors_and_mixed_layouts(tmp_path, ck_fused):
    src, _ = ck_fused
    kw = dict(max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64, num_blocks=8)
    _copy_without(src, tmp_path / "a", reshape=("model.layers.1.mlp.experts.gate_up_proj", (8, 255, 256)))
    with pytest.raises(CheckpointError, match=r"experts\.gate_up_proj has shape \[8, 255, 256\], expected "
                                              r"\[8, 256, 256\]"):
        _llm(tmp_path / "a", **kw)
    _copy_without(src, tmp_path / "b", drop="model.layers.2.mlp.experts.down_proj")
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.mlp\.experts\.down_proj is missing"):
        _llm(tmp_path / "b", **kw)
    from safetensors.numpy import save_file
    _copy_without(src, tmp_path / "c")
    save_file({"model.layers.0.mlp.experts.0.up_proj.weight": np.zeros((128, 256), np.float32)},
              str(tmp_path / "c" / "extra.safetensors"))
    # a per-expert tensor of layer 0 next to the fused ones: read as the per-expert layout, the rest is missing
    with pytest.raises(CheckpointError, match=r"experts\.0\.gate_proj\.weight is missing"):
        _llm(tmp_path / "c", **kw)


def test_vkc_generate_runs_a_moe_checkpoint(ck_fused, monkeypatch):
    from click.testing import CliRunner

    import vkc_engine.backend as B
    from vkc_cli.main import main
    d, _ = ck_fused
    monkeypatch.setattr(B, "VkcBackend", NumpyBackend)
    r = CliRunner().invoke(main, ["generate", "--model", str(d), "--prompt", "the quick", "--max-tokens", "5",
                                  "--ignore-eos", "--max-model-len", "64", "--max-num-seqs", "2",
                                  "--max-num-batched-tokens", "32"])
    assert r.exit_code == 0, r.output
    want = _llm(d, max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32).generate(
        "the quick", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert want.text in r.output and "5 tokens in" in r.output and "finish: length" in r.output


def test_dummy_weights_of_the_35b_a3b_layout(tmp_path):
    """load_format="dummy" at the 35B-A3B config scaled down: per-expert parts stacked, shared expert folded."""
    from benchmarks.bench_engine import SHAPES
    cfg = dict(SHAPES["35b-a3b"], num_hidden_layers=4, hidden_size=256, num_experts=16, vocab_size=512,
               moe_intermediate_size=64, shared_expert_intermediate_size=64, linear_num_key_heads=2,
               linear_num_value_heads=4, num_attention_heads=4, num_key_value_heads=1)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    llm = _llm(tmp_path, load_format="dummy", max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64,
               num_blocks=8)
    mlp = llm.model.layers[3].mlp
    assert mlp.folded and mlp.w1.shape == (17, 128, 256) and mlp.w2.shape == (17, 256, 64)
    assert llm.cfg.layer_types[3] == "full_attention"
    assert np.isfinite(llm.prompt_logits([1, 2, 3])).all()
