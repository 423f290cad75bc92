"""vkc_engine on block-wise FP8 checkpoints (Qwen's *-FP8 layout), on CPU: tiny checkpoints quantized by
tests/engine_fixtures.py (F8_E4M3 weights + weight_scale_inv, some modules left bf16, MoE experts included), the
engine on the numpy backend (tests/engine_numpy_backend.py: ops.gemm_fp8's math) against HF transformers on the
dequantized weights; the config, loader and backend errors; the real VkcBackend's FP8 calls through ops.gemm_fp8's
host validation (driver-free fakes).

Two comparisons, because FP8 activation quantization is discontinuous: (1) weights and wiring, exactly: the numpy
backend with the activation quantization off vs the fp32 HF model on the dequantized weights (TOL, as the bf16
tests); (2) the activation quantization: on vs the HF model in float64 with the same per-token-group e4m3
quantization hooked in front of the FP8 linears (tests/engine_fixtures.py fp8_act_quant). In (2) the two sides'
activations differ by float32 rounding only, so almost every e4m3 rounding agrees; but one that flips (an input
within float32 rounding of a rounding boundary, ~1e-6 of the elements) moves that row by ~1e-2 and grows through
the attention and recurrent state into every later row. So (2) is asserted exactly (TOL_Q) where no
state carries a flip: eight one-token sequences in one step (eight rows, each with its own scales: a per-tensor
quantization fails), each against its own reference; multi-token sequences are covered by (1).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.engine_fixtures import (FP8_NOT_CONVERT, HEADS_27B, HEADS_35B, MOE_SMALL, fp8_act_quant, hf_logits,
                                   make_checkpoint, numpy_llm)
from tests.engine_fixtures import random_prompt as _prompt, rel_err as _rel
from tests.engine_numpy_backend import NumpyBackend

pytest.importorskip("transformers")

from vkc_engine.config import ConfigError, parse_config  # noqa: E402
from vkc_engine.loader import CheckpointError  # noqa: E402

TOL = 2e-5    # weights / wiring: fp32 HF vs the fp64-accumulated numpy backend (as tests/test_engine_model_cpu.py)
TOL_Q = 1e-5  # activation quantization on: float64 HF + the same quantization (module docstring)
# the dense fixture leaves these bf16 besides the defaults: a k_proj between FP8 q and v (three segments of one
# fused projection) and one down_proj; in_proj_b is FP8 with N = 6 (dequantized at load, beside bf16 in_proj_a)
DENSE_SKIP = FP8_NOT_CONVERT + ("layers.1.self_attn.k_proj", "layers.0.mlp.down_proj")
LAYERS3 = ["linear_attention", "full_attention", "linear_attention"]


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp8_dense")
    # HEADS_35B: GDN in_proj is 1544 wide (a multiple of 8), so its FP8 | bf16 segments are kept (model.py's rule)
    model, _ = make_checkpoint(d, heads=HEADS_35B, seed=31, fp8=dict(not_convert=DENSE_SKIP, scale_dtype="BF16"))
    return d, model


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """VLM-wrapped, per-expert FP8 experts (the released 35B-A3B-FP8 layout), F32 scales, two shards."""
    d = tmp_path_factory.mktemp("fp8_moe")
    model, _ = make_checkpoint(d, heads=HEADS_35B, layer_types=LAYERS3, moe=MOE_SMALL, expert_layout="per_expert",
                               vlm=True, shards=2, seed=32, fp8={})
    return d, model


def _llm(d, **kw):
    """The engine on the numpy backend (engine_fixtures.numpy_llm) with a 40-block cache."""
    return numpy_llm(d, **{"num_blocks": 40, **kw})


def _weights_exact(d, model, n, seed):
    logs = []
    llm = _llm(d, backend=NumpyBackend(fp8_act_quant=False), log=logs.append)
    fp8_act_quant(model, on=False)
    ids = _prompt(n, llm.cfg.vocab_size, seed)
    rel = _rel(llm.prompt_logits(ids), hf_logits(model.float(), ids))
    assert rel < TOL, rel
    assert "linear_fp8" in llm.backend.calls
    return llm, logs


def _refs(llm, model, ids):
    """(float64 HF logits without, with the FP8 activation quantization)."""
    m64 = model.double()
    if llm.cfg.is_moe:  # torch's grouped_mm (HF's default experts path) has no float64
        m64.set_experts_implementation("eager")
    try:
        return hf_logits(m64, ids), hf_logits(fp8_act_quant(m64), ids)
    finally:
        fp8_act_quant(model.float(), on=False)


def _act_quant_matches(d, model, seed):
    """Eight one-token sequences in one step (M = 8 rows, each its own quantization scales) vs the quantized
    float64 reference of each token alone, exactly."""
    llm = _llm(d, max_num_seqs=8)
    sched = llm.scheduler
    toks = [int(t) for t in np.random.default_rng(seed).choice(llm.cfg.vocab_size, 8, replace=False)]
    chunks = []
    for t in toks:
        table, slot = [], sched.slots.take()
        sched.blocks.grow(table, 1)
        llm.cache.reset_slots([slot])
        chunks.append(([t], 0, table, slot, "last"))
    got = llm.backend.logits_to_host(llm._run(chunks))
    assert "linear_fp8" in llm.backend.calls
    for i, t in enumerate(toks):
        plain, ref = _refs(llm, model, [t])
        assert _rel(got[i:i + 1], ref) < TOL_Q, (t, _rel(got[i:i + 1], ref))
        assert _rel(plain, ref) > 100 * TOL_Q, _rel(plain, ref)  # the quantization matters: the test can fail


def test_dense_fp8_weights_and_fusion_segments(dense):
    d, model = dense
    llm, logs = _weights_exact(d, model, 33, 1)
    from vkc_engine.model import _Segments
    from tests.engine_numpy_backend import Fp8NumpyWeight
    m = llm.model
    attn, gdn = m.layers[1].mixer, m.layers[0].mixer
    kinds = lambda w: [type(s[0]).__name__ for s in w.segs]  # noqa: E731
    assert isinstance(attn.qkv, _Segments) and kinds(attn.qkv) == ["Fp8NumpyWeight", "ndarray", "Fp8NumpyWeight"]
    assert isinstance(gdn.in_proj, _Segments) and kinds(gdn.in_proj) == ["Fp8NumpyWeight", "ndarray"]
    assert [s[1:] for s in gdn.in_proj.segs] == [(0, 1536), (1536, 8)]  # qkv | z FP8, b (dequantized) | a bf16
    assert isinstance(m.layers[0].mlp.gate_up, Fp8NumpyWeight) and isinstance(m.layers[0].mlp.down, np.ndarray)
    assert isinstance(m.layers[1].mlp.down, Fp8NumpyWeight) and isinstance(m.lm_head, np.ndarray)
    assert any("FP8 checkpoint: " in x and "linear weights run the FP8 block GEMM" in x and
               "2 quantized linear parts dequantized" in x for x in logs), logs


def test_dense_fp8_activation_quantization(dense):
    _act_quant_matches(*dense, 2)


def test_moe_fp8_experts_kept_fp8(moe):
    """Per-expert FP8 experts and the shared expert stay FP8 (backend.experts_fp8; the numpy backend's exact
    e4m3 * block-scale values, bf16 activations: W8A16); the logits match HF's on the dequantized weights."""
    from tests.engine_numpy_backend import Fp8NumpyExperts
    d, model = moe
    llm, logs = _weights_exact(d, model, 20, 4)
    assert llm.cfg.vlm_wrapped and llm.cfg.quant is not None
    E = llm.cfg.num_experts
    for layer in llm.model.layers:
        assert isinstance(layer.mlp.w1, Fp8NumpyExperts) and isinstance(layer.mlp.w2, Fp8NumpyExperts)
        assert layer.mlp.w1.shape[0] == E + 1 and layer.mlp.shared is None
    n = len(llm.model.layers) * 3 * (E + 1)
    assert any(f"{n} MoE expert weights kept FP8" in x for x in logs), logs
    _act_quant_matches(d, model, 5)


def test_moe_fp8_experts_not_whole_blocks_are_dequantized(tmp_path):
    """moe_intermediate_size 64 (the gate / up halves not whole 128-row blocks): the FP8 expert kernels cannot take
    the experts, so they are dequantized to bf16 at load -- checked before anything is uploaded (no FP8 expert
    weight counted) -- and the logits still match HF's."""
    from tests.engine_numpy_backend import Fp8NumpyExperts
    moe = dict(MOE_SMALL, moe_intermediate_size=64, shared_expert_intermediate_size=64)
    model, _ = make_checkpoint(tmp_path, heads=HEADS_35B, layer_types=LAYERS3, moe=moe, expert_layout="per_expert",
                               seed=34, fp8={})
    llm, logs = _weights_exact(tmp_path, model, 11, 6)
    assert not isinstance(llm.model.layers[0].mlp.w1, Fp8NumpyExperts)
    assert not any("MoE expert weights kept FP8" in x for x in logs)
    assert any("tensors outside the quantized linears (MoE experts" in x for x in logs), logs


def test_e4m3_rounding_and_table_match_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from tests.engine_numpy_backend import round_e4m3
    from vkc_engine.loader import E4M3_VALUES
    e4m3 = ml_dtypes.float8_e4m3fn
    assert np.array_equal(np.arange(256, dtype=np.uint8).view(e4m3).astype(np.float32), E4M3_VALUES, equal_nan=True)
    finite = np.sort(np.unique(E4M3_VALUES[np.isfinite(E4M3_VALUES)]))
    mids = (finite[1:] + finite[:-1]) / 2  # every tie, and values just around each
    v = np.concatenate([finite, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                        np.random.default_rng(0).uniform(-448, 448, 20000).astype(np.float32)]).astype(np.float32)
    np.testing.assert_array_equal(round_e4m3(v), v.astype(e4m3).astype(np.float64))


# ------------------------------------------------------------------------------------------------ errors
FP8_Q = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
         "modules_to_not_convert": ["lm_head"]}


@pytest.mark.parametrize("change,msg", [
    ({"quant_method": "awq"}, "quantization_config.quant_method 'awq' is not supported"),
    ({"fmt": "e5m2"}, "quantization_config.fmt 'e5m2'"),
    ({"weight_block_size": [64, 128]}, "quantization_config.weight_block_size [64, 128]"),
    ({"weight_block_size": None}, "quantization_config.weight_block_size None"),
    ({"weight_block_size": 128}, "quantization_config.weight_block_size 128"),
    ({"activation_scheme": "static"}, "quantization_config.activation_scheme 'static'"),
    ({"scale_fmt": "ue8m0"}, "quantization_config.scale_fmt 'ue8m0'"),
    ({"modules_to_not_convert": "lm_head"}, "modules_to_not_convert must be a list"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "quant_method 'modelopt' is not supported"),
])
def test_config_quantization_errors(change, msg):
    from tests.test_engine_loader import BASE
    assert parse_config({**BASE, "quantization_config": FP8_Q}).quant.block == (128, 128)
    with pytest.raises(ConfigError) as e:
        parse_config({**BASE, "quantization_config": {**FP8_Q, **change}})
    assert msg in str(e.value)
    wrapped = {"model_type": "qwen3_5", "text_config": {**BASE, "quantization_config": {**FP8_Q, **change}}}
    with pytest.raises(ConfigError, match="text_config.quantization_config"):
        parse_config(wrapped)


def test_modelopt_hf_quant_config_other_than_nvfp4_refused(tmp_path):
    from tests.test_engine_loader import BASE
    from vkc_engine.config import load_config
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert load_config(tmp_path).quant is None
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    with pytest.raises(ConfigError, match=r"hf_quant_config.json: ModelOpt quantization \(quantization.quant_algo "
                                          r"'FP8'\) is not supported"):
        load_config(tmp_path)


@pytest.fixture(scope="module")
def small_fp8(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp8_small")
    model, _ = make_checkpoint(d, layer_types=["linear_attention", "full_attention"], hidden=128, intermediate=256,
                               fp8={})
    return d, model


def test_unaligned_fused_width_falls_back_to_bf16(small_fp8):
    """HEADS_27B scaled down: GDN in_proj is 2060 wide (2 Hv = 12), so its FP8 qkv | z and bf16 b | a cannot be
    column segments for the GEMMs (model.py's rule): the whole projection is dequantized to bf16, exactly."""
    d, model = small_fp8
    llm, logs = _weights_exact(d, model, 12, 7)
    from tests.engine_numpy_backend import Fp8NumpyWeight
    assert isinstance(llm.model.layers[0].mixer.in_proj, np.ndarray)
    assert isinstance(llm.model.layers[1].mixer.qkv, Fp8NumpyWeight)
    assert any("3 quantized linear parts dequantized" in x for x in logs), logs  # in_proj_qkv, _z, _b; a is bf16


def _copy(src, dst, edit=None, config=None):
    dst.mkdir()
    for p in src.iterdir():
        if p.name == "model.safetensors":
            from safetensors.torch import load_file, save_file
            t = load_file(str(p))
            if edit:
                edit(t)
            save_file(t, str(dst / p.name))
        else:
            (dst / p.name).write_bytes(p.read_bytes())
    if config is not None:
        c = json.loads((dst / "config.json").read_text())
        config(c)
        (dst / "config.json").write_text(json.dumps(c))
    return dst


SCALE = "model.layers.1.self_attn.o_proj.weight_scale_inv"


@pytest.mark.parametrize("case,msg", [
    ("missing", "tensor model.layers.1.self_attn.o_proj.weight_scale_inv is missing: the F8_E4M3 weight "
                "model.layers.1.self_attn.o_proj.weight needs its block scales"),
    ("shape", r"tensor model.layers.1.self_attn.o_proj.weight_scale_inv has shape \[2, 1\], expected \[1, 12\]"),
    ("dtype", "tensor model.layers.1.self_attn.o_proj.weight_scale_inv has dtype I32"),
    ("no_config", "tensor model.layers.0.linear_attn.in_proj_qkv.weight has dtype F8_E4M3.*quantization_config"),
    ("norm_fp8", "FP8 tensor model.layers.0.input_layernorm.weight has shape \\[128\\]"),
    ("stray_scale", "does not use: model.layers.0.linear_attn.in_proj_a.weight_scale_inv"),
])
def test_bad_fp8_checkpoints(small_fp8, tmp_path, case, msg):
    import torch

    def edit(t):
        if case == "missing":
            del t[SCALE]
        elif case == "shape":
            t[SCALE] = torch.ones((2, 1))
        elif case == "dtype":
            t[SCALE] = torch.ones((1, 12), dtype=torch.int32)
        elif case == "norm_fp8":
            t["model.layers.0.input_layernorm.weight"] = torch.zeros(128).to(torch.float8_e4m3fn)
        elif case == "stray_scale":  # a bf16 weight with a scale beside it
            t["model.layers.0.linear_attn.in_proj_a.weight_scale_inv"] = torch.ones((1, 1))
    conf = (lambda c: c.pop("quantization_config")) if case == "no_config" else None
    d = _copy(small_fp8[0], tmp_path / "ck", edit, conf)
    with pytest.raises(CheckpointError, match=msg):
        _llm(d)


def test_dummy_fp8_weights_and_bench_option(tmp_path):
    """benchmarks/bench_engine.py --quant fp8 at the 27B config scaled down: the dummy checkpoint serves the
    projections a *-FP8 release quantizes as e4m3 + block scales (vkc_engine.dummy), the rest bf16."""
    from benchmarks.bench_engine import FP8_QUANT, SHAPES, run
    from tests.engine_numpy_backend import Fp8NumpyWeight
    from vkc_engine.model import _Segments
    cfg = dict(SHAPES["27b"], num_hidden_layers=4, hidden_size=256, intermediate_size=512, vocab_size=512,
               linear_num_key_heads=2, linear_num_value_heads=4, num_attention_heads=4, num_key_value_heads=1,
               quantization_config=FP8_QUANT)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    llm = _llm(tmp_path, load_format="dummy", max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64,
               num_blocks=8)
    m = llm.model
    assert isinstance(m.layers[3].mixer.qkv, Fp8NumpyWeight) and isinstance(m.layers[0].mlp.gate_up, Fp8NumpyWeight)
    assert isinstance(m.layers[0].mixer.in_proj, _Segments) and isinstance(m.lm_head, np.ndarray)
    assert np.isfinite(m.layers[0].mlp.down.dequantized()).all()
    assert np.isfinite(llm.prompt_logits([1, 2, 3])).all()
    res = run(tmp_path, batches=(1,), prefill=8, steps=1, backend=NumpyBackend())
    assert res["prefill"]["tokens"] == 8 and res["decode"][0]["ms_per_step"] > 0
