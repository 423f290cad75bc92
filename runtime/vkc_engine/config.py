"""The model configuration the engine needs, read from an HF ``config.json`` (Qwen3.5/3.6 text models).

Accepted: ``model_type`` ``qwen3_5`` / ``qwen3_5_text`` (dense) and ``qwen3_5_moe`` / ``qwen3_5_moe_text``
(sparse MoE MLPs with a gated shared expert: HF's ``Qwen3_5MoeForCausalLM`` and the released
``Qwen3_5MoeForConditionalGeneration``), either flat (a text-only checkpoint) or VLM-wrapped (the text fields under
``text_config``; the vision fields are ignored). Every problem raises :class:`ConfigError` naming the field.

MoE fields: ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
``shared_expert_intermediate_size`` (all required: HF's class would fill defaults, a checkpoint's config states
them). HF's ``Qwen3_5MoeTopKRouter`` renormalises the top-k weights unconditionally, so does the engine; fields
of the Qwen3-MoE / Qwen3-Next lineage that HF's qwen3_5_moe code does not read are accepted only at the value
that means "what HF runs": ``norm_topk_prob`` true, ``mlp_only_layers`` empty, ``decoder_sparse_step`` 1.

Quantized checkpoints (``quantization_config``, top level or under ``text_config``): block-wise FP8 as Qwen's
``*-FP8`` releases store it (transformers' FineGrainedFP8 format: ``quant_method`` "fp8", ``fmt`` "e4m3",
``activation_scheme`` "dynamic", ``weight_block_size`` [128, 128], ``scale_fmt`` "float" when present) ->
:class:`QuantConfig`; which linears are quantized is read from the stored tensors' dtypes (vkc_engine.model), so
``modules_to_not_convert`` is only checked to be a list of names. NVFP4 -> ``QuantConfig("nvfp4", layout=...)``
in its two published layouts: compressed-tensors (``quant_method`` "compressed-tensors", ``format``
"nvfp4-pack-quantized"; every config group's weights 4-bit float, ``group_size`` 16, ``strategy``
"tensor_group", symmetric) and ModelOpt (``quant_method`` "modelopt" with ``quant_algo`` "NVFP4" in the config,
or ModelOpt's ``hf_quant_config.json`` beside a config without a quantization_config; ``group_size`` 16); no
quantized KV cache (``kv_cache_scheme`` / ``kv_cache_quant_algo`` null). The engine runs NVFP4 weights as W4A16
(dequantized in the GEMM / GEMV kernels, bf16 activations), so the checkpoints' activation quantization (the
``input_activations`` group, ``input_global_scale`` / ``input_scale``) is not applied: the result is the product
with the exact weights, as vLLM's W4A16 (Marlin) path computes it on GPUs without FP4 tensor cores. Anything
else -- another quant_method, fmt, block size, static activation scales, an NVFP4 group size other than 16 --
raises a ConfigError naming the field and value.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ConfigError", "ModelConfig", "QuantConfig", "load_config", "parse_config"]

DENSE_TYPES = ("qwen3_5", "qwen3_5_text")
MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
LAYER_KINDS = ("linear_attention", "full_attention")


class ConfigError(ValueError):
    """config.json is missing a field, has a bad value, or describes a model the engine does not run."""


@dataclass(frozen=True)
class QuantConfig:
    """Quantized weights. ``method`` "fp8": block-wise FP8, e4m3 weights with one float multiplier
    (``weight_scale_inv``) per ``block`` = (rows, cols) tile, activations quantized dynamically per token per
    ``block[1]`` columns. ``method`` "nvfp4": e2m1 weights two per byte with an e4m3 scale per 16 along K and one
    fp32 global scale per tensor, stored in ``layout`` "compressed-tensors" (``weight_packed``, ``weight_scale``,
    ``weight_global_scale`` a divisor) or "modelopt" (``weight``, ``weight_scale``, ``weight_scale_2`` a
    multiplier); run as W4A16 (module docstring)."""
    method: str = "fp8"
    block: tuple[int, int] = (128, 128)
    modules_to_not_convert: tuple[str, ...] = ()
    layout: str = ""


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    layer_types: tuple[str, ...]
    # full attention
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    # gated delta net
    gdn_k_heads: int
    gdn_v_heads: int
    gdn_head_dim: int
    conv_width: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    vlm_wrapped: bool
    max_position_embeddings: int
    # sparse MoE (model_type qwen3_5_moe): 0 for dense models
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    # quantized weights (None: bf16 checkpoint)
    quant: QuantConfig | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def gdn_qkv_dim(self) -> int:
        """Channels of the GDN conv input [q | k | v]."""
        return (2 * self.gdn_k_heads + self.gdn_v_heads) * self.gdn_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.gdn_v_heads * self.gdn_head_dim

    def layer_indices(self, kind: str) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == kind]


def _get(d: dict, name: str, typ, where: str, default=None, required: bool = True):
    if name not in d or d[name] is None:
        if default is not None or not required:
            return default
        raise ConfigError(f"config.json: {where}{name} is missing")
    v = d[name]
    if typ is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ConfigError(f"config.json: {where}{name} must be an integer, got {v!r}")
    if typ is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ConfigError(f"config.json: {where}{name} must be a number, got {v!r}")
    if typ is int and v <= 0:
        raise ConfigError(f"config.json: {where}{name} must be positive, got {v}")
    return typ(v)


def _eos(*sources) -> tuple[int, ...]:
    for v in sources:
        if v is None:
            continue
        ids = v if isinstance(v, list) else [v]
        if all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            return tuple(ids)
    return ()


def parse_config(raw: dict, generation_config: dict | None = None) -> ModelConfig:
    """A :class:`ModelConfig` from the parsed config.json (and generation_config.json, for EOS ids)."""
    if not isinstance(raw, dict):
        raise ConfigError("config.json: the top level must be a JSON object")
    top_type = raw.get("model_type")
    wrapped = isinstance(raw.get("text_config"), dict)
    text = raw["text_config"] if wrapped else raw
    where = "text_config." if wrapped else ""
    mtype = text.get("model_type", top_type) if wrapped else top_type
    moe = top_type in MOE_TYPES or mtype in MOE_TYPES
    if not moe and top_type not in DENSE_TYPES and mtype not in DENSE_TYPES:
        raise ConfigError(f"config.json: model_type {top_type!r} is not a Qwen3.5/3.6 model "
                          f"(expected one of {DENSE_TYPES + MOE_TYPES})")
    qwhere = "" if raw.get("quantization_config") else where
    quant = _quant(raw.get("quantization_config") or text.get("quantization_config"), qwhere)
    n_layers = _get(text, "num_hidden_layers", int, where)
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = _get(text, "full_attention_interval", int, where, default=4)
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    if not isinstance(layer_types, list) or len(layer_types) != n_layers:
        raise ConfigError(f"config.json: {where}layer_types must list {n_layers} entries (num_hidden_layers)")
    for i, t in enumerate(layer_types):
        if t not in LAYER_KINDS:
            raise ConfigError(f"config.json: {where}layer_types[{i}] is {t!r}; expected one of {LAYER_KINDS}")
    hidden = _get(text, "hidden_size", int, where)
    n_q = _get(text, "num_attention_heads", int, where)
    n_kv = _get(text, "num_key_value_heads", int, where)
    head_dim = _get(text, "head_dim", int, where, default=hidden // n_q)
    if n_q % n_kv:
        raise ConfigError(f"config.json: {where}num_attention_heads ({n_q}) is not a multiple of "
                          f"num_key_value_heads ({n_kv})")
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"config.json: {where}rope_parameters must be an object")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"config.json: {where}rope_parameters.rope_type {rope_type!r} is not supported "
                          "(default RoPE only)")
    theta = _get(rope, "rope_theta", float, where + "rope_parameters.", default=None, required=False)
    if theta is None:
        theta = _get(text, "rope_theta", float, where, default=10000.0)
    factor = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ConfigError(f"config.json: {where}partial_rotary_factor must be in (0, 1], got {factor!r}")
    rotary_dim = int(head_dim * factor)
    if rotary_dim % 2:
        raise ConfigError(f"config.json: head_dim * partial_rotary_factor = {rotary_dim} must be even")
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"config.json: {where}hidden_act {act!r} is not supported (silu only)")
    if text.get("attention_bias"):
        raise ConfigError(f"config.json: {where}attention_bias true is not supported (Qwen3.5 has none)")
    k_heads = _get(text, "linear_num_key_heads", int, where)
    v_heads = _get(text, "linear_num_value_heads", int, where)
    k_dim = _get(text, "linear_key_head_dim", int, where)
    v_dim = _get(text, "linear_value_head_dim", int, where)
    if k_dim != v_dim:
        raise ConfigError(f"config.json: {where}linear_key_head_dim ({k_dim}) != linear_value_head_dim ({v_dim}) "
                          "is not supported")
    if v_heads % k_heads:
        raise ConfigError(f"config.json: {where}linear_num_value_heads ({v_heads}) is not a multiple of "
                          f"linear_num_key_heads ({k_heads})")
    tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    gen = generation_config or {}
    moe_fields = _moe_fields(text, where) if moe else {}
    inter = _get(text, "intermediate_size", int, where, required=not moe)  # MoE configs have none
    return ModelConfig(
        model_type=str(mtype or top_type), vocab_size=_get(text, "vocab_size", int, where), hidden_size=hidden,
        intermediate_size=inter or 0, num_layers=n_layers,
        layer_types=tuple(layer_types), num_q_heads=n_q, num_kv_heads=n_kv, head_dim=head_dim,
        rotary_dim=rotary_dim, rope_theta=float(theta), gdn_k_heads=k_heads, gdn_v_heads=v_heads,
        gdn_head_dim=k_dim, conv_width=_get(text, "linear_conv_kernel_dim", int, where, default=4),
        rms_norm_eps=_get(text, "rms_norm_eps", float, where, default=1e-6), tie_word_embeddings=bool(tie),
        eos_token_ids=_eos(gen.get("eos_token_id"), text.get("eos_token_id"), raw.get("eos_token_id")),
        vlm_wrapped=wrapped, max_position_embeddings=_get(text, "max_position_embeddings", int, where,
                                                          default=262144), quant=quant, **moe_fields)


def _quant(q, where: str) -> QuantConfig | None:
    """The checked ``quantization_config`` (module docstring), or None when there is none."""
    if q is None:
        return None
    w = where + "quantization_config"
    if not isinstance(q, dict):
        raise ConfigError(f"config.json: {w} must be an object, got {q!r}")
    method = q.get("quant_method")
    nested = q.get("quantization") if isinstance(q.get("quantization"), dict) else {}
    algo = q.get("quant_algo", nested.get("quant_algo"))  # ModelOpt
    groups = q.get("config_groups") if isinstance(q.get("config_groups"), dict) else {}
    formats = [q.get("format")] + [g.get("format") for g in groups.values() if isinstance(g, dict)]
    if "NVFP4" in str(algo).upper():
        return _nvfp4_modelopt(dict(nested, **q), w)
    if "nvfp4-pack-quantized" in formats:
        return _nvfp4_compressed_tensors(q, groups, w)
    if method != "fp8":
        raise ConfigError(f"config.json: {w}.quant_method {method!r} is not supported (block-wise FP8 "
                          "'fp8' only)")
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ConfigError(f"config.json: {w}.fmt {fmt!r} is not supported (FP8 e4m3 only)")
    act = q.get("activation_scheme", "dynamic")
    if act != "dynamic":
        raise ConfigError(f"config.json: {w}.activation_scheme {act!r} is not supported (dynamic per-token-group "
                          "activation scales only)")
    block = q.get("weight_block_size")
    if not isinstance(block, (list, tuple)) or list(block) != [128, 128]:
        raise ConfigError(f"config.json: {w}.weight_block_size {block!r} is not supported: the FP8 GEMM "
                          "(ops.gemm_fp8.linear_fp8_block) takes [128, 128] blocks (per-tensor / per-channel FP8 "
                          "checkpoints are not supported either)")
    sfmt = q.get("scale_fmt", "float")
    if sfmt not in (None, "float"):
        raise ConfigError(f"config.json: {w}.scale_fmt {sfmt!r} is not supported (float scales only)")
    if q.get("dequantize"):
        raise ConfigError(f"config.json: {w}.dequantize true is not supported (the engine runs FP8 weights as "
                          "they are stored)")
    if q.get("modules_to_convert"):
        raise ConfigError(f"config.json: {w}.modules_to_convert {q['modules_to_convert']!r} is not supported "
                          "(quantized embeddings)")
    skip = _names(q.get("modules_to_not_convert", q.get("ignored_layers")), f"{w}.modules_to_not_convert")
    return QuantConfig("fp8", (128, 128), skip)


def _names(v, field: str) -> tuple[str, ...]:
    v = v or []
    if not isinstance(v, list) or not all(isinstance(m, str) for m in v):
        raise ConfigError(f"config.json: {field} must be a list of module names, got {v!r}")
    return tuple(v)


def _nvfp4_modelopt(q: dict, w: str) -> QuantConfig:
    """ModelOpt NVFP4 (``quant_algo`` NVFP4; the fields of ``quantization_config`` or of hf_quant_config.json's
    ``quantization``)."""
    if str(q.get("quant_algo")).upper() != "NVFP4":
        raise ConfigError(f"config.json: {w}.quant_algo {q.get('quant_algo')!r} is not supported (ModelOpt NVFP4 "
                          "only)")
    if q.get("group_size", 16) != 16:
        raise ConfigError(f"config.json: {w}.group_size {q['group_size']!r} is not supported (NVFP4 scales one "
                          "e4m3 per 16 weights)")
    if q.get("kv_cache_quant_algo") not in (None, "none", "None"):
        raise ConfigError(f"config.json: {w}.kv_cache_quant_algo {q['kv_cache_quant_algo']!r} is not supported "
                          "(the engine's KV cache is bf16)")
    return QuantConfig("nvfp4", (1, 16), _names(q.get("exclude_modules"), f"{w}.exclude_modules"), "modelopt")


def _nvfp4_compressed_tensors(q: dict, groups: dict, w: str) -> QuantConfig:
    """compressed-tensors ``nvfp4-pack-quantized`` (llm-compressor's NVFP4 export)."""
    if q.get("quant_method") not in (None, "compressed-tensors"):
        raise ConfigError(f"config.json: {w}.quant_method {q['quant_method']!r} with format "
                          "'nvfp4-pack-quantized' is not supported (compressed-tensors)")
    if not groups:
        raise ConfigError(f"config.json: {w}.config_groups is missing (compressed-tensors NVFP4 names its "
                          "quantized weights there)")
    for gname, g in groups.items():
        wts = g.get("weights") if isinstance(g, dict) else None
        where = f"{w}.config_groups.{gname}"
        if g.get("format", q.get("format")) != "nvfp4-pack-quantized":
            raise ConfigError(f"config.json: {where}.format {g.get('format')!r} is not supported (every group "
                              "'nvfp4-pack-quantized')")
        if not isinstance(wts, dict):
            raise ConfigError(f"config.json: {where}.weights is missing")
        want = {"num_bits": 4, "type": "float", "group_size": 16, "strategy": "tensor_group", "symmetric": True}
        for k, v in want.items():
            if wts.get(k, v) != v:
                raise ConfigError(f"config.json: {where}.weights.{k} {wts.get(k)!r} is not supported (NVFP4: {v!r})")
    if q.get("kv_cache_scheme") is not None:
        raise ConfigError(f"config.json: {w}.kv_cache_scheme {q['kv_cache_scheme']!r} is not supported (the "
                          "engine's KV cache is bf16)")
    return QuantConfig("nvfp4", (1, 16), _names(q.get("ignore"), f"{w}.ignore"), "compressed-tensors")


def _moe_fields(text: dict, where: str) -> dict:
    """The MoE fields of a qwen3_5_moe text config (every layer sparse, one gated shared expert)."""
    E = _get(text, "num_experts", int, where)
    k = _get(text, "num_experts_per_tok", int, where)
    if k > E:
        raise ConfigError(f"config.json: {where}num_experts_per_tok ({k}) exceeds num_experts ({E})")
    if text.get("norm_topk_prob", True) is not True:
        raise ConfigError(f"config.json: {where}norm_topk_prob {text['norm_topk_prob']!r} is not supported: HF's "
                          "qwen3_5_moe router renormalises the top-k weights always (norm_topk_prob true)")
    dense_layers = text.get("mlp_only_layers") or []
    if dense_layers:
        raise ConfigError(f"config.json: {where}mlp_only_layers {dense_layers!r} is not supported (every layer of a "
                          "qwen3_5_moe model is sparse)")
    step = text.get("decoder_sparse_step", 1)
    if step != 1:
        raise ConfigError(f"config.json: {where}decoder_sparse_step {step!r} is not supported (1: every layer "
                          "sparse)")
    if text.get("shared_expert_intermediate_size") == 0:
        raise ConfigError(f"config.json: {where}shared_expert_intermediate_size 0 (no shared expert) is not "
                          "supported: qwen3_5_moe layers have one")
    return dict(num_experts=E, num_experts_per_tok=k,
                moe_intermediate_size=_get(text, "moe_intermediate_size", int, where),
                shared_expert_intermediate_size=_get(text, "shared_expert_intermediate_size", int, where))


def load_config(model_dir) -> ModelConfig:
    """Read ``config.json`` (and ``generation_config.json`` when present) from an HF model directory."""
    d = Path(model_dir)
    p = d / "config.json"
    if not p.is_file():
        raise ConfigError(f"{d}: no config.json (is this an HF model directory?)")
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not valid JSON ({e})") from None
    hq = d / "hf_quant_config.json"  # ModelOpt's export: the quantization described beside config.json
    if hq.is_file() and not (raw.get("quantization_config") or (raw.get("text_config") or {}).get(
            "quantization_config")):
        try:
            q = json.loads(hq.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{hq}: not valid JSON ({e})") from None
        mq = q.get("quantization") if isinstance(q, dict) else None
        algo = mq.get("quant_algo") if isinstance(mq, dict) else None
        if "NVFP4" not in str(algo).upper():
            raise ConfigError(f"{hq}: ModelOpt quantization (quantization.quant_algo {algo!r}) is not supported "
                              "(NVFP4, or block-wise FP8 'fp8' in config.json)")
        raw = dict(raw, quantization_config=dict(mq, quant_method="modelopt"))  # as newer exports write it
    gen = None
    g = d / "generation_config.json"
    if g.is_file():
        try:
            gen = json.loads(g.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{g}: not valid JSON ({e})") from None
    return parse_config(raw, gen)
