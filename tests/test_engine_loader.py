"""vkc_engine's config and checkpoint reading on CPU: both name layouts, shards, dtypes from the header, and a
clear error (naming the file, tensor or field) for each bad input."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from vkc_engine.config import ConfigError, parse_config
from vkc_engine.loader import Checkpoint, CheckpointError, SafetensorsFile, to_bf16_bits, to_float32

BASE = {"model_type": "qwen3_5_text", "vocab_size": 300, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 256,
        "linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                                          "partial_rotary_factor": 0.25}}


def _bf16_file(path, tensors: dict[str, np.ndarray]):
    """A safetensors file with BF16 entries written by hand (numpy has no bf16): header + raw bits."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        bits = to_bf16_bits(type("T", (), {"dtype": "F32", "data": a.astype(np.float32), "name": name,
                                             "file": ""})())  # duck-typed RawTensor
        b = np.ascontiguousarray(bits).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_config_defaults_and_layouts():
    c = parse_config({**BASE, "model_type": "qwen3_5"})
    assert c.layer_types == ("linear_attention",) * 3 + ("full_attention",)  # every 4th layer by default
    assert (c.rotary_dim, c.rope_theta, c.gdn_qkv_dim, c.tie_word_embeddings) == (64, 1e7, (2 * 2 + 6) * 128, False)
    w = parse_config({"model_type": "qwen3_5", "text_config": BASE, "tie_word_embeddings": True,
                      "vision_config": {}}, {"eos_token_id": [5, 7]})
    assert w.vlm_wrapped and w.tie_word_embeddings and w.eos_token_ids == (5, 7)


@pytest.mark.parametrize("change,field", [
    ({"model_type": "qwen3_5_moe"}, "num_experts is missing"),  # MoE: its fields are required
    ({"model_type": "llama"}, "model_type"),
    ({"hidden_size": None}, "hidden_size is missing"),
    ({"num_hidden_layers": "4"}, "num_hidden_layers must be an integer"),
    ({"layer_types": ["linear_attention"] * 3}, "layer_types must list 4"),
    ({"layer_types": ["linear_attention"] * 3 + ["sliding"]}, "layer_types[3]"),
    ({"num_key_value_heads": 4}, "num_key_value_heads"),
    ({"linear_num_value_heads": 5}, "linear_num_value_heads"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e7}}, "rope_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
])
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ConfigError) as e:
        parse_config({**BASE, "model_type": "qwen3_5", **change})
    assert field in str(e.value)


def test_both_layouts_shards_and_dtypes(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    alog = rng.standard_normal(6).astype(np.float32)
    for layout, prefix in (("text", "model."), ("vlm", "model.language_model.")):
        d = tmp_path / layout
        d.mkdir()
        _bf16_file(d / "a.safetensors", {prefix + "layers.0.mlp.up_proj.weight": a})
        save_file({prefix + "layers.0.linear_attn.A_log": alog, "mtp.fc.weight": alog,
                   "model.visual.patch.weight": alog}, str(d / "b.safetensors"))
        ck = Checkpoint(d)
        assert ck.names() == ["model.layers.0.linear_attn.A_log", "model.layers.0.mlp.up_proj.weight"]
        up = ck.get("model.layers.0.mlp.up_proj.weight", (8, 16))
        assert up.dtype == "BF16" and up.data.dtype == np.uint16
        np.testing.assert_array_equal(to_float32(up), np.asarray(to_float32(up), np.float32))
        assert np.abs(to_float32(up) - a).max() <= np.abs(a).max() * 2**-8  # bf16 rounding of the written values
        al = ck.get("model.layers.0.linear_attn.A_log", (6,))
        assert al.dtype == "F32"
        np.testing.assert_array_equal(to_float32(al), alog)  # fp32 stored -> fp32 exactly
        assert "1 mtp.* tensors" in ck.ignored_summary() and "model.visual" in ck.ignored_summary()


def test_index_json(tmp_path):
    save_file({"model.norm.weight": np.ones(4, np.float32)}, str(tmp_path / "s1.safetensors"))
    save_file({"model.embed_tokens.weight": np.ones((2, 4), np.float32)}, str(tmp_path / "s2.safetensors"))
    idx = {"weight_map": {"model.norm.weight": "s1.safetensors", "model.embed_tokens.weight": "s2.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    assert Checkpoint(tmp_path).names() == ["model.embed_tokens.weight", "model.norm.weight"]
    idx["weight_map"]["lm_head.weight"] = "s3.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match="s3.safetensors, which does not exist"):
        Checkpoint(tmp_path)
    idx["weight_map"]["lm_head.weight"] = "s1.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match="lm_head.weight is listed in shard s1.safetensors but not stored"):
        Checkpoint(tmp_path)


def test_bad_files(tmp_path):
    p = tmp_path / "m.safetensors"
    save_file({"x": np.arange(64, dtype=np.float32).reshape(8, 8)}, str(p))
    full = p.read_bytes()
    p.write_bytes(full[:-10])
    with pytest.raises(CheckpointError, match="truncated: tensor x"):
        SafetensorsFile(p)
    p.write_bytes(full[:20])
    with pytest.raises(CheckpointError, match="header length"):
        SafetensorsFile(p)
    p.write_bytes(b"\x01")
    with pytest.raises(CheckpointError, match="truncated"):
        SafetensorsFile(p)
    h = json.dumps({"x": {"dtype": "F32", "shape": [8, 8], "data_offsets": [0, 200]}}).encode()
    p.write_bytes(struct.pack("<Q", len(h)) + h + bytes(256))
    with pytest.raises(CheckpointError, match=r"byte range \[0, 200\), expected 256"):
        SafetensorsFile(p)
    p.write_bytes(full)
    ck = Checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"tensor x has shape \[8, 8\], expected \[8, 4\]"):
        ck.get("x", (8, 4))
    with pytest.raises(CheckpointError, match="tensor y is missing"):
        ck.get("y")
    save_file({"q": np.zeros(4, np.int32)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(CheckpointError, match="tensor q has dtype I32"):
        Checkpoint(tmp_path).get("q")
    (tmp_path / "m.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        Checkpoint(tmp_path)


def test_model_refuses_unused_and_misshapen_tensors(tmp_path):
    from tests.engine_fixtures import make_checkpoint
    from tests.engine_numpy_backend import NumpyBackend
    from vkc_engine import LLM
    pytest.importorskip("transformers")
    make_checkpoint(tmp_path, layer_types=["linear_attention", "full_attention"], hidden=128, intermediate=256)
    save_file({"model.layers.0.mlp.experts.0.up_proj.weight": np.zeros((4, 4), np.float32)},
              str(tmp_path / "extra.safetensors"))
    kw = dict(backend=NumpyBackend(), max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64, num_blocks=8,
              block_size=16)
    with pytest.raises(CheckpointError, match="does not use: model.layers.0.mlp.experts.0.up_proj.weight"):
        LLM(tmp_path, **kw)
    save_file({"model.norm.weight": np.zeros(7, np.float32)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(CheckpointError, match="stored twice"):
        LLM(tmp_path, **kw)
