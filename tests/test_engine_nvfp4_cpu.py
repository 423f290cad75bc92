"""vkc_engine on NVFP4 checkpoints (compressed-tensors and ModelOpt layouts), on CPU: the config's NVFP4 rules, the
loader's NVFP4 tensors (both layouts, the global scale as divisor / multiplier, bad tensors), and the engine on the
numpy backend (tests/engine_numpy_backend.py: W4A16, the exact e2m1 x e4m3 weights with the multiplier after the
product) against HF transformers holding the dequantized weights: which linears stay NVFP4 and how fused
projections split into runs, teacher-forced logits, the summary line.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.engine_fixtures import HEADS_35B, MOE_SMALL, NVFP4_IGNORE, hf_logits, make_checkpoint, numpy_llm
from tests.engine_fixtures import random_prompt as _prompt, rel_err as _rel
from tests.engine_numpy_backend import NumpyBackend, Nvfp4NumpyExperts, Nvfp4NumpyWeight

pytest.importorskip("transformers")
pytest.importorskip("ml_dtypes")

from vkc_engine.config import ConfigError, load_config, parse_config  # noqa: E402
from vkc_engine.loader import Checkpoint, CheckpointError, dequantize_nvfp4, nvfp4_tensor  # noqa: E402

# fp32 HF vs the float64-accumulated numpy backend on the same weights; the weights the engine dequantizes to
# bf16 at load (MoE experts, the bf16 fallback of a fused projection) differ from HF's exact ones by bf16
# rounding, ~2^-9 relative
TOL = 2e-5
TOL_BF16 = 3e-2
LAYERS3 = ["linear_attention", "full_attention", "linear_attention"]
CT = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
      "config_groups": {"g": {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
                              "weights": {"num_bits": 4, "type": "float", "group_size": 16,
                                          "strategy": "tensor_group", "symmetric": True}}}}
MO = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}


def test_config_both_layouts():
    from tests.test_engine_loader import BASE
    q = parse_config({**BASE, "quantization_config": CT}).quant
    assert (q.method, q.layout, q.modules_to_not_convert) == ("nvfp4", "compressed-tensors", ("lm_head",))
    q = parse_config({**BASE, "quantization_config": MO}).quant
    assert (q.method, q.layout) == ("nvfp4", "modelopt")


@pytest.mark.parametrize("q,msg", [
    ({**MO, "group_size": 32}, "group_size 32 is not supported"),
    ({**MO, "kv_cache_quant_algo": "FP8"}, "kv_cache_quant_algo 'FP8' is not supported"),
    ({**MO, "exclude_modules": "lm_head"}, "exclude_modules must be a list"),
    ({**CT, "kv_cache_scheme": {"num_bits": 8}}, "kv_cache_scheme"),
    ({**CT, "config_groups": {}}, "config_groups is missing"),
    ({**CT, "config_groups": {"g": {"format": "nvfp4-pack-quantized", "weights": {"num_bits": 8}}}},
     "weights.num_bits 8 is not supported"),
    ({**CT, "config_groups": {"g": {"format": "nvfp4-pack-quantized", "weights": {"strategy": "tensor"}}}},
     "weights.strategy 'tensor'"),
    ({**CT, "config_groups": {"g": {"format": "float-quantized", "weights": {}}}}, ".format 'float-quantized'"),
    ({**CT, "quant_method": "awq"}, "quant_method 'awq' with format"),
])
def test_config_nvfp4_errors(q, msg):
    from tests.test_engine_loader import BASE
    with pytest.raises(ConfigError) as e:
        parse_config({**BASE, "quantization_config": q})
    assert msg in str(e.value), str(e.value)


def test_modelopt_hf_quant_config_beside_config(tmp_path):
    from tests.test_engine_loader import BASE
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                            "exclude_modules": ["lm_head", "*mlp.gate"]}}))
    q = load_config(tmp_path).quant
    assert (q.method, q.layout, q.modules_to_not_convert) == ("nvfp4", "modelopt", ("lm_head", "*mlp.gate"))


@pytest.fixture(scope="module", params=["compressed-tensors", "modelopt"])
def dense(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"nvfp4_dense_{request.param}")
    model, _ = make_checkpoint(d, heads=HEADS_35B, seed=41, nvfp4={"layout": request.param})
    return request.param, d, model


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """VLM-wrapped, per-expert NVFP4 experts (kept NVFP4), compressed-tensors, two shards."""
    d = tmp_path_factory.mktemp("nvfp4_moe")
    model, _ = make_checkpoint(d, heads=HEADS_35B, layer_types=LAYERS3, moe=MOE_SMALL, expert_layout="per_expert",
                               vlm=True, shards=2, seed=42, nvfp4={})
    return d, model


def _llm(d, **kw):
    """The engine on the numpy backend (engine_fixtures.numpy_llm) with a 40-block cache."""
    return numpy_llm(d, **{"num_blocks": 40, **kw})


def test_loader_reads_both_layouts(dense):
    from tests import refs_nvfp4 as F
    layout, d, model = dense
    ck = Checkpoint(d)
    mod = "model.layers.1.self_attn.o_proj"
    w = model.get_parameter(mod + ".weight").detach().numpy()
    t = nvfp4_tensor(ck, layout, mod, w.shape)
    assert t.shape == w.shape and t.packed.dtype == "U8" and t.scale.dtype == "F8_E4M3"
    # the loader's dequantization is the fixture's (exact), and the multiplier is what the file's scale means
    np.testing.assert_array_equal(dequantize_nvfp4(t), w)
    np.testing.assert_allclose(dequantize_nvfp4(t), F.dequant(t.packed.data, t.scale.data, t.alpha), rtol=1e-6)
    g = ck.get(mod + (".weight_global_scale" if layout == "compressed-tensors" else ".weight_scale_2"), None)
    gv = float(np.asarray(g.data).reshape(-1)[0])
    assert t.alpha == pytest.approx(1.0 / gv if layout == "compressed-tensors" else gv, rel=1e-12)
    assert len(t.names) == 4  # packed, scale, global scale, input scale
    with pytest.raises(CheckpointError, match="has shape"):
        nvfp4_tensor(ck, layout, mod, (w.shape[0], w.shape[1] + 16))


def test_loader_refuses_bad_global_scale(tmp_path):
    import torch
    from safetensors.torch import save_file
    pk = torch.zeros(8, 16, dtype=torch.uint8)
    sc = torch.ones(8, 2).to(torch.float8_e4m3fn)
    for bad in (torch.tensor([1.0, 2.0]), torch.tensor([0.0]), torch.tensor([float("nan")])):
        save_file({"m.weight_packed": pk, "m.weight_scale": sc, "m.weight_global_scale": bad},
                  str(tmp_path / "model.safetensors"))
        with pytest.raises(CheckpointError, match="must hold one finite positive value"):
            nvfp4_tensor(Checkpoint(tmp_path), "compressed-tensors", "m", (8, 32))


def test_dense_nvfp4_weights_runs_and_logits(dense):
    from vkc_engine.model import _Segments
    layout, d, model = dense
    logs = []
    llm = _llm(d, log=logs.append)
    m = llm.model
    attn, gdn = m.layers[1].mixer, m.layers[0].mixer
    # q | k | v share one global scale (one NVFP4 run); GDN in_proj: qkv | z NVFP4 (shared scale), b | a bf16
    assert isinstance(attn.qkv, Nvfp4NumpyWeight) and isinstance(attn.o, Nvfp4NumpyWeight)
    assert isinstance(gdn.in_proj, _Segments)
    assert [type(s[0]).__name__ for s in gdn.in_proj.segs] == ["Nvfp4NumpyWeight", "ndarray"]
    assert [s[1:] for s in gdn.in_proj.segs] == [(0, 1536), (1536, 8)]
    assert isinstance(m.layers[0].mlp.gate_up, Nvfp4NumpyWeight) and isinstance(m.lm_head, np.ndarray)
    assert any(f"NVFP4 checkpoint ({layout})" in x and "run as W4A16" in x for x in logs), logs
    ids = _prompt(29, llm.cfg.vocab_size, 5)
    rel = _rel(llm.prompt_logits(ids), hf_logits(model.float(), ids))
    assert rel < TOL, rel
    assert "linear_nvfp4" in llm.backend.calls


def test_moe_nvfp4_experts_kept_nvfp4(moe):
    """Per-expert NVFP4 experts and shared expert stay 4-bit (backend.experts_nvfp4: the numpy backend's exact
    values times each module's multiplier); the logits match HF's on the dequantized weights."""
    d, model = moe
    logs = []
    llm = _llm(d, log=logs.append)
    assert llm.cfg.vlm_wrapped and llm.cfg.quant.method == "nvfp4"
    E = llm.cfg.num_experts
    for layer in llm.model.layers:
        assert isinstance(layer.mlp.w1, Nvfp4NumpyExperts) and isinstance(layer.mlp.w2, Nvfp4NumpyExperts)
        assert layer.mlp.w1.shape[0] == E + 1 and layer.mlp.shared is None
    n = len(llm.model.layers) * 3 * (E + 1)
    assert any(f"{n} MoE expert weights kept NVFP4" in x for x in logs), logs
    ids = _prompt(21, llm.cfg.vocab_size, 6)
    rel = _rel(llm.prompt_logits(ids), hf_logits(model.float(), ids))
    assert rel < TOL_BF16, rel
    assert "linear_nvfp4" in llm.backend.calls


def test_moe_nvfp4_experts_dequantized_on_request(moe):
    """LLM(quantized_experts=False): the same checkpoint's experts dequantized to bf16 at load (said in the load
    line); the logits still match HF's within the bf16 tolerance."""
    d, model = moe
    logs = []
    llm = _llm(d, log=logs.append, quantized_experts=False)
    assert not isinstance(llm.model.layers[0].mlp.w1, Nvfp4NumpyExperts)
    assert any("tensors outside the quantized linears (MoE experts" in x for x in logs), logs
    ids = _prompt(15, llm.cfg.vocab_size, 5)
    rel = _rel(llm.prompt_logits(ids), hf_logits(model.float(), ids))
    assert rel < TOL_BF16, rel


def test_moe_nvfp4_experts_beside_a_bf16_shared_expert_are_dequantized(tmp_path):
    """A checkpoint whose shared expert is on the ignore list (bf16) with NVFP4 routed experts: the MoE kernels
    take one weight kind for the stacked experts, so the experts are dequantized to bf16 at load (said in the
    load line) and the logits still match HF's."""
    ignore = NVFP4_IGNORE + ("shared_expert.",)
    model, _ = make_checkpoint(tmp_path, heads=HEADS_35B, layer_types=LAYERS3, moe=MOE_SMALL,
                               expert_layout="per_expert", seed=43, nvfp4={"ignore": ignore})
    logs = []
    llm = _llm(tmp_path, log=logs.append)
    assert not isinstance(llm.model.layers[0].mlp.w1, Nvfp4NumpyExperts)
    assert any("tensors outside the quantized linears (MoE experts" in x for x in logs), logs
    ids = _prompt(13, llm.cfg.vocab_size, 8)
    rel = _rel(llm.prompt_logits(ids), hf_logits(model.float(), ids))
    assert rel < TOL_BF16, rel


def test_dummy_nvfp4_weights_and_bench_option(tmp_path):
    """benchmarks/bench_engine.py --quant nvfp4 at the 27B config scaled down: the dummy checkpoint serves the
    projections an NVFP4 release quantizes as packed codes + e4m3 group scales + a global scale (vkc_engine.dummy),
    everything else bf16."""
    from benchmarks.bench_engine import NVFP4_QUANT, SHAPES, run
    from vkc_engine.model import _Segments
    cfg = dict(SHAPES["27b"], num_hidden_layers=4, hidden_size=256, intermediate_size=512, vocab_size=512,
               linear_num_key_heads=2, linear_num_value_heads=4, num_attention_heads=4, num_key_value_heads=1,
               quantization_config=NVFP4_QUANT)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    llm = _llm(tmp_path, load_format="dummy", max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64,
               num_blocks=8)
    m = llm.model
    assert isinstance(m.layers[3].mixer.qkv, Nvfp4NumpyWeight) and isinstance(m.layers[0].mlp.down, Nvfp4NumpyWeight)
    assert isinstance(m.layers[0].mixer.in_proj, _Segments) and isinstance(m.lm_head, np.ndarray)
    assert m.layers[0].mlp.gate_up.alpha == pytest.approx(0.01)
    assert np.isfinite(llm.prompt_logits([1, 2, 3])).all()
    res = run(tmp_path, batches=(1,), prefill=8, steps=1, backend=NumpyBackend())
    assert res["prefill"]["tokens"] == 8 and res["decode"][0]["ms_per_step"] > 0
