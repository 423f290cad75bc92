"""Tiny random Qwen3.5 checkpoints made with HF transformers (CPU tests and tests/gpu/test_gpu_engine.py).

:func:`make_checkpoint` builds ``Qwen3_5ForCausalLM`` (or ``Qwen3_5MoeForCausalLM`` with ``moe=``) with
scaled-down real head configurations, gives every
parameter random values whose constants matter (norm weights away from zero so 1 + w is exercised, A_log and
dt_bias spread), rounds them to bf16 values (``A_log`` and ``linear_attn.norm.weight`` stay fp32, as Qwen3.5
stores them) and writes a safetensors directory: text-only names (``model.layers.N``), optionally VLM-wrapped
(``model.language_model.layers.N`` + ``mtp.*`` / ``model.visual.*`` tensors and a ``text_config``), optionally
sharded with an index. MoE experts are written as transformers 5 holds them (``expert_layout="fused"``:
``mlp.experts.gate_up_proj`` [E, 2I, H], ``mlp.experts.down_proj`` [E, H, I]) or as the released checkpoints
and transformers' own ``save_pretrained`` store them (``"per_expert"``: ``mlp.experts.N.{gate,up,down}_proj.weight``).
A tiny byte-level BPE tokenizer.json goes with it. Returns the fp32 HF model holding
exactly the saved values (the reference). The model's vocabulary is the tokenizer's rounded up to a multiple of
64 (as the real 248320 is; ids past the tokenizer decode to nothing).

The engine CPU tests' common set-up: :func:`checkpoint` (a module fixture's directory + model),
:func:`numpy_llm` (the engine on tests/engine_numpy_backend.py), :func:`rel_err`, :func:`random_prompt`.

Block-wise FP8 (``fp8=`` options, the layout of Qwen's ``*-FP8`` releases): the projections (``*proj*.weight``,
experts included) not matched by ``fp8["not_convert"]`` (canonical names, suffix or substring match) are stored as
F8_E4M3 [N, K] with ``weight_scale_inv`` [cdiv(N, 128), cdiv(K, 128)] (F32, or BF16 with ``fp8["scale_dtype"]``):
scale = amax of the 128 x 128 block / 448, q = e4m3(w / scale); config.json gets the ``quantization_config``. The
returned HF model then holds what the engine computes with: the dequantized weight (q * scale, float32) where the
engine runs the FP8 GEMM (mirroring vkc_engine.model's rule: a mixer or dense-MLP projection with N % 128 == 0),
its bf16 rounding where the engine dequantizes at load (MoE experts, the folded shared expert, small parts like
``in_proj_b``); ``model.vkc_fp8_linears`` names the FP8-GEMM modules, whose inputs :func:`fp8_act_quant`
quantizes as the engine does.

NVFP4 (``nvfp4=`` options: ``layout`` "compressed-tensors" or "modelopt", ``ignore`` as FP8's ``not_convert``):
the same projections quantized with tests/refs_nvfp4.quantize (e4m3 scale per 16 = amax / 6 in units of the
global scale, nearest e2m1 code), one global scale per tensor except where llm-compressor fuses them (q / k / v,
gate / up, GDN in_proj_qkv / in_proj_z share one), stored in the layout's names (compressed-tensors:
``weight_packed`` U8, ``weight_scale`` F8_E4M3, ``weight_global_scale`` = 1 / the multiplier, an
``input_global_scale``; ModelOpt: ``weight`` U8, ``weight_scale``, ``weight_scale_2`` = the multiplier, an
``input_scale``) with the layout's config. The HF model holds the exact dequantized weights.
"""
from __future__ import annotations

import json
from pathlib import Path

# the scaled-down head configurations: (GDN key/value heads, attention q/kv heads) with the real ratios
HEADS_27B = dict(linear_num_key_heads=2, linear_num_value_heads=6, num_attention_heads=6, num_key_value_heads=1)
HEADS_35B = dict(linear_num_key_heads=2, linear_num_value_heads=4, num_attention_heads=8, num_key_value_heads=1)
LAYERS = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
ROUTER_SCALE = 4.0  # router logits ~ N(0, 4^2)
# scaled-down MoE fields (the real 35B-A3B: 256 experts, top-8, 512 / 512)
MOE_SMALL = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                 shared_expert_intermediate_size=128)
CORPUS = ["the quick brown fox jumps over the lazy dog", "héllo wörld, naïve café — ünïcode ✓ 日本語 テキスト",
          "def f(x):\n    return x * 2\n", "vkc compiles kernels ahead of time for seven archs"] * 20
EOS = "<|endoftext|>"


def make_tokenizer(path: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path))
    return tok


def _randomize(model, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 8 + 0.5))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "norm" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if name.endswith("linear_attn.norm.weight")
                                                                    else 0.0))
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("mlp.gate.weight"):  # a peaked router, as trained ones are: the experts near the
                # top-k cut carry little weight, so bf16 noise that swaps them moves the output little
                p.copy_(torch.randn(p.shape, generator=g) * ROUTER_SCALE * p.shape[-1] ** -0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)


def _keep_fp32(name: str) -> bool:
    return name.endswith("A_log") or name.endswith("linear_attn.norm.weight")


def _split_experts(sd: dict) -> dict:
    """Fused expert tensors -> per-expert ones under the released names (gate rows first in gate_up_proj)."""
    out = {}
    for name, t in sd.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base, I = name[:-len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :I].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, I:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[:-len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    return out


FP8_NOT_CONVERT = ("lm_head", "embed_tokens", "mlp.gate.weight", "shared_expert_gate", "in_proj_a")


def _block_quantize(w, scale_dtype: str):
    """(q float8_e4m3fn [N, K], scale [cdiv(N, 128), cdiv(K, 128)], dequantized float32) of a float32 weight."""
    import torch
    N, K = w.shape
    nb, kb = -(-N // 128), -(-K // 128)
    pad = torch.zeros(nb * 128, kb * 128)
    pad[:N, :K] = w
    blocks = pad.reshape(nb, 128, kb, 128)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
    if scale_dtype == "BF16":
        scale = scale.to(torch.bfloat16).float()
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[:, None, :, None]).reshape(nb * 128, kb * 128)[:N, :K]
    q = q.reshape(nb * 128, kb * 128)[:N, :K].contiguous()
    return q, (scale.to(torch.bfloat16) if scale_dtype == "BF16" else scale), deq


def _engine_runs_fp8(name: str, shape, sd: dict) -> bool:
    """vkc_engine.model's rule: mixer / dense-MLP projections whose N fills whole 128-row blocks stay FP8, unless
    their fused projection mixes FP8 and bf16 parts at a width that is not a multiple of 8 (GDN in_proj with an
    odd 2 Hv: all bf16)."""
    if ".experts." in name or "shared_expert." in name or shape[0] % 128 or shape[1] % 16:
        return False
    if ".linear_attn.in_proj_" in name:
        base = name.split(".linear_attn.")[0] + ".linear_attn.in_proj_"
        width = sum(sd[base + p + ".weight"].shape[0] for p in ("qkv", "z", "b", "a"))
        return width % 8 == 0
    return True


def _expert_kept_fp8(name: str, sd: dict, skip: tuple) -> bool:
    """vkc_engine.model's rule for MoE experts: per-expert F8_E4M3 experts and shared expert stay FP8 (W8A16: bf16
    activations, exact weights) when I and H are multiples of 128 and every one of them is quantized."""
    if ".mlp.experts." not in name and ".mlp.shared_expert." not in name:
        return False
    pre = name.split(".mlp.")[0] + ".mlp."
    first, shared = pre + "experts.0.gate_proj.weight", pre + "shared_expert.gate_proj.weight"
    if first not in sd or shared not in sd or any(k in n for n in (first, shared) for k in skip):
        return False
    I, H = sd[first].shape
    return I % 128 == 0 and H % 128 == 0 and sd[shared].shape[0] == I


def _quantize_fp8(model, sd: dict, opts: dict) -> None:
    """Quantize sd's projections in place (module docstring) and set the model's parameters to what the engine
    computes with."""
    import torch
    skip = tuple(opts.get("not_convert", FP8_NOT_CONVERT))
    params = dict(model.named_parameters())
    model.vkc_fp8_linears = []
    for name in sorted(sd):
        t = sd[name]
        if not name.endswith(".weight") or "proj" not in name.split(".")[-2] or t.ndim != 2 or \
                any(k in name for k in skip):
            continue
        q, scale, deq = _block_quantize(t.float(), opts.get("scale_dtype", "F32"))
        sd[name], sd[name + "_scale_inv"] = q, scale.contiguous()
        fp8 = _engine_runs_fp8(name, t.shape, sd)
        _set_param(params, name, deq if fp8 or _expert_kept_fp8(name, sd, skip) else deq.to(torch.bfloat16).float())
        if fp8:
            model.vkc_fp8_linears.append(name[:-len(".weight")])


NVFP4_IGNORE = ("lm_head", "embed_tokens", "mlp.gate.weight", "shared_expert_gate", "in_proj_a", "in_proj_b")
# parts that share one global scale (llm-compressor's fused-layer global scales)
_NVFP4_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("in_proj_qkv", "in_proj_z"))


def _quantize_nvfp4(model, sd: dict, opts: dict) -> None:
    """Quantize sd's projections in place to NVFP4 (module docstring); the model's parameters get the exact
    dequantized values."""
    import numpy as np
    import torch

    from tests import refs_nvfp4 as F
    layout = opts.get("layout", "compressed-tensors")
    skip = tuple(opts.get("ignore", NVFP4_IGNORE))
    params = dict(model.named_parameters())
    names = [n for n in sorted(sd) if n.endswith(".weight") and "proj" in n.split(".")[-2] and sd[n].ndim == 2
             and not any(k in n for k in skip)]
    amax = {n: float(sd[n].float().abs().max()) for n in names}

    def group_of(n):
        mod = n.split(".")[-2]
        for g in _NVFP4_FUSED:
            if mod in g:
                return tuple(n.replace(mod, m) for m in g)
        return (n,)
    for name in names:
        peers = [p for p in group_of(name) if p in amax]
        alpha = max(max(amax[p] for p in peers) / (6.0 * 448.0), 1e-30)
        w = sd[name].float().numpy().astype(np.float64)
        packed, sbytes, alpha = F.quantize(w, alpha)
        if layout == "compressed-tensors":  # the multiplier the file means: 1 / its float32 divisor
            alpha = float(1.0 / np.float64(np.float32(1.0 / alpha)))
        # as vkc_engine.loader.dequantize_nvfp4 computes it: e2m1 * e4m3 (exact in float32) * float32(alpha)
        deq = torch.from_numpy(F.dequant(packed, sbytes, 1.0).astype(np.float32) * np.float32(alpha))
        base = name[:-len(".weight")]
        del sd[name]
        s8 = torch.from_numpy(sbytes).view(torch.float8_e4m3fn)
        if layout == "compressed-tensors":
            sd[base + ".weight_packed"] = torch.from_numpy(packed)
            sd[base + ".weight_scale"] = s8
            sd[base + ".weight_global_scale"] = torch.tensor([1.0 / alpha], dtype=torch.float32)
            sd[base + ".input_global_scale"] = torch.tensor([448.0 * 6.0 / 3.0], dtype=torch.float32)
        else:
            sd[base + ".weight"] = torch.from_numpy(packed)
            sd[base + ".weight_scale"] = s8
            sd[base + ".weight_scale_2"] = torch.tensor(alpha, dtype=torch.float32)
            sd[base + ".input_scale"] = torch.tensor(3.0 / (448.0 * 6.0), dtype=torch.float32)
        _set_param(params, name, deq)


def _nvfp4_config(opts: dict) -> dict:
    ignore = list(opts.get("ignore", NVFP4_IGNORE))
    if opts.get("layout", "compressed-tensors") == "modelopt":
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ignore,
                "kv_cache_quant_algo": None}
    spec = {"num_bits": 4, "type": "float", "group_size": 16, "strategy": "tensor_group", "symmetric": True,
            "dynamic": False, "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ignore,
            "kv_cache_scheme": None, "quantization_status": "compressed",
            "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "targets": ["Linear"], "weights": spec,
                                          "input_activations": dict(spec, dynamic="local")}}}


def _set_param(params: dict, name: str, val) -> None:
    """Copy ``val`` into the HF parameter a checkpoint tensor ``name`` maps to (per-expert names -> the fused
    expert parameters' rows)."""
    import torch
    if ".experts." in name:  # experts.E.{gate,up,down}_proj.weight -> the fused parameters' rows
        base, e, proj = name.rsplit(".", 3)[0], int(name.split(".experts.")[1].split(".")[0]), name.split(".")[-2]
        if proj == "down_proj":
            dst = params[base + ".down_proj"][e]
        else:
            gu = params[base + ".gate_up_proj"][e]
            half = gu.shape[0] // 2
            dst = gu[:half] if proj == "gate_proj" else gu[half:]
    else:
        dst = params[name]
    with torch.no_grad():
        dst.copy_(val)


def fp8_act_quant(model, on: bool = True):
    """Quantize the inputs of ``model.vkc_fp8_linears`` per token per 128 columns (e4m3, dynamic scales
    max(amax / 448, 1 / (448 * 512)), as ops.gemm_fp8.quantize_fp8_per_token_group) in the HF forward (on=False:
    remove the hooks)."""
    import torch
    for h in getattr(model, "_vkc_fp8_hooks", []):
        h.remove()
    model._vkc_fp8_hooks = []
    if not on:
        return model

    def fake_quant(module, args):
        x = args[0]
        K = x.shape[-1]
        kb = -(-K // 128)
        g = torch.nn.functional.pad(x.float(), (0, kb * 128 - K)).reshape(*x.shape[:-1], kb, 128)
        scale = (g.abs().amax(-1, keepdim=True) / 448.0).clamp(min=1.0 / (448.0 * 512.0))
        q = (g / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float()
        return ((q * scale).reshape(*x.shape[:-1], kb * 128)[..., :K].to(x.dtype),) + tuple(args[1:])

    mods = dict(model.named_modules())
    for name in model.vkc_fp8_linears:
        model._vkc_fp8_hooks.append(mods[name].register_forward_pre_hook(fake_quant))
    return model


def make_checkpoint(out_dir, *, heads=HEADS_27B, layer_types=LAYERS, hidden=256, intermediate=512, tie=False,
                    vlm=False, shards: int = 1, seed: int = 0, all_bf16: bool = False, moe: dict | None = None,
                    expert_layout: str = "per_expert", fp8: dict | None = None, nvfp4: dict | None = None):
    """Write a tiny checkpoint into ``out_dir``; returns (fp32 HF model in eval mode, tokenizer). ``moe``: the
    MoE fields (num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size) for a
    Qwen3_5MoeForCausalLM; ``expert_layout``: "per_expert" (released) or "fused" (transformers' parameters);
    ``fp8``: block-wise FP8 options (module docstring: ``not_convert``, ``scale_dtype``), {} for the defaults;
    ``nvfp4``: NVFP4 options (``layout``, ``ignore``)."""
    import torch
    from safetensors.torch import save_file
    if moe:
        from transformers import Qwen3_5MoeForCausalLM as Model, Qwen3_5MoeTextConfig as Config
    else:
        from transformers import Qwen3_5ForCausalLM as Model, Qwen3_5TextConfig as Config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out / "tokenizer.json")
    if expert_layout not in ("per_expert", "fused"):
        raise ValueError(expert_layout)
    size = dict(**moe) if moe else dict(intermediate_size=intermediate)
    cfg = Config(
        vocab_size=-(-tok.get_vocab_size() // 64) * 64, hidden_size=hidden, **size,
        num_hidden_layers=len(layer_types), layer_types=list(layer_types), head_dim=256,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        tie_word_embeddings=tie, eos_token_id=tok.token_to_id(EOS), max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}, **heads)
    torch.manual_seed(seed)
    model = Model(cfg).float().eval()
    _randomize(model, seed)
    sd = {}
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if tie and name == "lm_head.weight":
                continue
            if _keep_fp32(name) and not all_bf16:
                sd[name] = p.detach().clone().contiguous()
            else:
                sd[name] = p.detach().to(torch.bfloat16).contiguous()
        model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        if tie:
            model.tie_weights()
    if moe and expert_layout == "per_expert":
        sd = _split_experts(sd)
    if fp8 is not None:
        _quantize_fp8(model, sd, fp8)
    if nvfp4 is not None:
        _quantize_nvfp4(model, sd, nvfp4)
    if vlm:
        sd = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in sd.items()}
        sd["mtp.fc.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
        sd["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    names = sorted(sd)
    if shards == 1:
        save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i in range(shards):
            fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: sd[n] for n in names[i::shards]}
            save_file(part, str(out / fn), metadata={"format": "pt"})
            weight_map.update({n: fn for n in part})
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    text = cfg.to_dict()
    kind = "qwen3_5_moe" if moe else "qwen3_5"
    arch = "Qwen3_5Moe" if moe else "Qwen3_5"
    if vlm:
        text["model_type"] = kind + "_text"
        conf = {"model_type": kind, "architectures": [arch + "ForConditionalGeneration"], "text_config": text,
                "vision_config": {"depth": 1}, "tie_word_embeddings": tie}
    elif moe:  # as Qwen3_5MoeForCausalLM.save_pretrained writes it
        conf = dict(text, model_type="qwen3_5_moe_text", architectures=["Qwen3_5MoeForCausalLM"])
    else:
        conf = dict(text, model_type="qwen3_5", architectures=["Qwen3_5ForCausalLM"])
    if fp8 is not None:
        conf["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                       "weight_block_size": [128, 128],
                                       "modules_to_not_convert": list(fp8.get("not_convert", FP8_NOT_CONVERT))}
    if nvfp4 is not None:
        conf["quantization_config"] = _nvfp4_config(nvfp4)
    (out / "config.json").write_text(json.dumps(conf, indent=1))
    return model, tok


def hf_logits(model, ids) -> "np.ndarray":  # noqa: F821
    """Teacher-forced fp32 logits [len(ids), V] of the HF model (no cache)."""
    import torch
    with torch.no_grad():
        out = model(torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    return out.logits[0].float().numpy()


def hf_greedy(model, ids, n: int):
    """HF's greedy continuation of n tokens (recomputing the whole prefix each step, no cache) and the top-1 /
    top-2 margin of each step's logits."""
    import numpy as np
    seq, margins = list(ids), []
    for _ in range(n):
        lg = hf_logits(model, seq)[-1]
        top2 = np.sort(lg)[-2:]
        margins.append(float(top2[1] - top2[0]))
        seq.append(int(np.argmax(lg)))
    return seq[len(ids):], margins


def checkpoint(tmp_path_factory, name: str, **kw):
    """(directory, HF model, tokenizer) of :func:`make_checkpoint` in a fresh temporary directory ``name``."""
    d = tmp_path_factory.mktemp(name)
    model, tok = make_checkpoint(d, **kw)
    return d, model, tok


def numpy_llm(d, **kw):
    """The engine on the float32 numpy backend (tests/engine_numpy_backend.py) with the CPU tests' small batch
    and cache; ``kw`` overrides any LLM argument."""
    from tests.engine_numpy_backend import NumpyBackend
    from vkc_engine import LLM
    args = dict(backend=NumpyBackend(), max_num_seqs=4, max_num_batched_tokens=48, max_model_len=256,
                num_blocks=80, block_size=16)
    args.update(kw)
    return LLM(d, **args)


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref|."""
    import numpy as np
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def random_prompt(n: int, vocab: int, seed: int) -> list[int]:
    import numpy as np
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]
