"""The engine end to end at a real model shape with random weights (``load_format="dummy"``, no checkpoint on
disk): load time, prefill of one long prompt, and decode ms/step at several batch sizes (pure-decode steps
replay CUDA graphs unless ``--graphs off``). Shapes: the dense 27B and the MoE 35B-A3B (needs vkc_runtime.ops.moe).

    python benchmarks/bench_engine.py [--shape {27b,35b-a3b}] [--batches 1,16,64] [--prefill 2048]
                                      [--long-prefill 8192] [--steps 16] [--graphs on|off] [--gemv-max-m 16]
                                      [--quant {none,fp8,nvfp4}] [--experts quantized|bf16] [--fp8-gemv on|off]
                                      [--breakdown] [--timeline]
                                      [--out F]

Prints one JSON object (and writes it to --out): {"shape", "graphs", "load_s", "prefill": {tokens, ms, tok_s},
"prefill_long": {tokens, ms, tok_s} (one prompt of --long-prefill tokens in one step; 0: skipped), "decode":
[{batch, ms_per_step, tok_s, async_scheduling, ms_per_step_sync?, breakdown?}], "gemv_max_m"}: with the engine's
overlapped steps (LLM ``async_scheduling``, on where the backend can) ``ms_per_step_sync`` is the same number of
steps run one by one. ``--gemv-max-m``: the captured steps' small-M linear
rule (vkc_engine.backend.GEMV_MAX_M: ops.gemv for M <= this, 0 = the CuTe GEMM always). ``--breakdown`` adds per
decode batch (and for the long prefill, as ``prefill_long.breakdown``, eager) where a step's time goes, per kernel family (backend.FAMILIES): ``eager`` -- ms per step between the
CUDA events recorded before each op of eager steps (graphs off for them), so host gaps are charged to the op they
delay; ``graph`` -- the step's graph captured with an event node before each op and replayed once: device time
only (the events add a little). Each lists {family: [ms, calls]} and ``total``. ``--timeline`` adds per decode
batch ``timeline``: the undisturbed graph-replayed steps kernel by kernel (exclusive µs, idle; step_timeline.py). ``run(model_dir, ...,
backend=...)`` is the same measurement on any backend (the CPU test drives it on the numpy backend at a tiny
shape). ``--quant fp8``: the config gets Qwen's block-wise FP8 ``quantization_config`` and the dummy weights of the
projections an *-FP8 release quantizes are random e4m3 bytes with float32 block scales (vkc_engine.dummy), so those
linears run ops.gemm_fp8 (quantize_fp8_per_token_group + linear_fp8_block) at every M, and a MoE model's experts
stay FP8 (ops.moe's W8A16 expert kernels, W8A8 on the grouped prefill path; ``--moe-fp8 w8a16``: W8A16
everywhere); ``--quant nvfp4``: an llm-compressor NVFP4 config and NVFP4 dummy weights
for the same projections (W4A16 from the MMA layout: ops.nvfp4.linear_nvfp4 at every M, dequantize + bf16 GEMM above
its MMA_MAX_M; MoE experts stay NVFP4: ops.moe's W4A16 expert kernels); the JSON gets "quant".
``--fp8-gemv on`` turns vkc_engine.backend.FP8_GEMV on: the captured steps' FP8 linears at M <= GEMV_MAX_M take
ops.gemv.gemv_w8a16 (the JSON gets "fp8_gemv").
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
FP8_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
             "modules_to_not_convert": ["lm_head", "embed_tokens", "mlp.gate", "shared_expert_gate", "in_proj_a",
                                        "in_proj_b"]}
NVFP4_QUANT = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
               "ignore": ["lm_head", "embed_tokens", "mlp.gate", "shared_expert_gate", "in_proj_a", "in_proj_b"],
               "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
                                             "weights": {"num_bits": 4, "type": "float", "group_size": 16,
                                                         "strategy": "tensor_group", "symmetric": True}}}}
SHAPES = {  # HF config.json field names
    # the dense Qwen3.6 27B text model
    "27b": {"model_type": "qwen3_5", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
            "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
            "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "max_position_embeddings": 262144,
            "rope_parameters": _ROPE},
    # the Qwen3.5/3.6 35B-A3B MoE text model: transformers' Qwen3_5MoeTextConfig defaults (documented there as
    # Qwen/Qwen3.5-35B-A3B's configuration; Qwen3.6-35B-A3B keeps the architecture): 40 layers, full attention
    # every 4th, GDN 16/32 x 128, attention 16/2 x 256, 256 experts, top-8, expert and shared widths 512; RoPE
    # theta 1e7 and 262144 positions as the released config.json states (HF's defaults there: 1e4, 32768)
    "35b-a3b": {"model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048,
                "num_hidden_layers": 40, "full_attention_interval": 4, "num_attention_heads": 16,
                "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                "shared_expert_intermediate_size": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                "max_position_embeddings": 262144, "rope_parameters": _ROPE},
}


def _sync(llm):
    """Wait for the device (a host copy of one logit row is a full sync on the default stream)."""
    llm.backend.to_host(llm.backend.rows(llm.model.bufs["logits"], 1))


def _decode_chunks(llm):
    """The next pure-decode step's chunks of the running sequences (their blocks grown to hold the token)."""
    out = []
    for s in llm.scheduler.running:
        llm.scheduler.blocks.grow(s.block_table, s.num_computed + 1)
        out.append((s.tokens[s.num_computed:s.num_computed + 1], s.num_computed, s.block_table, s.slot, "last"))
    return out


def _per_step(fams: dict, steps: int) -> dict:
    out = {f: [ms / steps, n // steps] for f, (ms, n) in sorted(fams.items(), key=lambda kv: -kv[1][0])}
    out["total"] = sum(v[0] for v in out.values())
    return out


def _breakdown(llm, steps: int) -> dict:
    """Where a decode step's time goes, per kernel family (module docstring)."""
    be = llm.backend
    res = {}
    llm.drain()
    graphs, llm.graphs = llm.graphs, None  # eager steps
    try:
        be.profile_start()
        for _ in range(steps):
            llm.step()
        llm.drain()
        res["eager"] = _per_step(be.profile_stop(), steps)
    finally:
        llm.graphs = graphs
    if graphs is not None:
        try:
            res["graph"] = _per_step(graphs.profile(_decode_chunks(llm)), 1)
        except Exception as e:  # noqa: BLE001 - report it next to the figures that worked
            res["graph_error"] = f"{type(e).__name__}: {e}"
    return res


def _steps_ms(llm, steps: int) -> float:
    """ms per step of ``steps`` calls of llm.step() from an idle device to an idle device."""
    _sync(llm)
    t = time.perf_counter()
    for _ in range(steps):
        llm.step()
    _sync(llm)
    return (time.perf_counter() - t) * 1e3 / steps


def _prefill(llm, n, sp, breakdown=False):
    V = llm.cfg.vocab_size
    ids = [int(i) % V for i in range(1, n + 1)]
    _sync(llm)
    t = time.perf_counter()
    llm.generate(ids, sp)  # one prefill step (the whole prompt fits the token budget) + sampling
    _sync(llm)
    ms = (time.perf_counter() - t) * 1e3
    res = {"tokens": n, "ms": ms, "tok_s": n / ms * 1e3}
    if breakdown:  # the same prompt once more with an event before every op (device-bound: host gaps are nil)
        llm.backend.profile_start()
        llm.generate(ids, sp)
        res["breakdown"] = _per_step(llm.backend.profile_stop(), 1)
    return res


def run(model_dir, *, batches=(1, 16), prefill=2048, steps=16, backend=None, load_format="dummy",
        long_prefill=0, graphs=True, breakdown=False, timeline=False, quantized_experts=True,
        max_model_len=None, decode_prompt=16) -> dict:
    from vkc_engine import LLM, SamplingParams
    Bm = max(batches)
    t0 = time.perf_counter()
    longest = max(prefill, long_prefill)
    # the budget holds the B decode prompts (16 tokens by default) in one step: a smaller one would chunk their
    # prefill into the timed steps (mixed, eager: the 27B B = 16 row read 18.6-20.8 ms/step at --prefill 64 that way)
    llm = LLM(model_dir, backend=backend, load_format=load_format, max_num_seqs=Bm,
              max_num_batched_tokens=max(longest, decode_prompt * Bm),
              max_model_len=max_model_len or max(longest, decode_prompt) + 4 * steps + 48,
              memory_fraction=0.5, enforce_eager=not graphs, quantized_experts=quantized_experts)
    res = {"load_s": time.perf_counter() - t0, "cache": llm.plan.describe(), "decode": [],
           "graphs": llm.graphs is not None}
    V = llm.cfg.vocab_size
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate([int(i) % V for i in range(1, min(prefill, 64) + 1)], sp)  # warm-up: kernel loads
    res["prefill"] = _prefill(llm, prefill, sp)
    if long_prefill:
        res["prefill_long"] = _prefill(llm, long_prefill, sp, breakdown)
    for B in batches:
        tl_steps = min(steps, 8) if timeline else 0
        ab = llm.async_scheduling
        dp = SamplingParams(temperature=0, max_tokens=2 * steps + 2 + (min(steps, 4) + 1 if breakdown else 0)
                            + tl_steps + (steps + 1 if ab else 0), ignore_eos=True)
        for b in range(B):
            llm.add_request([(7 * b + j) % V for j in range(decode_prompt)], dp)
        llm.step()  # the prefill of all B prompts
        for _ in range(steps):  # warm decode steps, untimed (the first ones after a prefill ran slower at B >= 16)
            llm.step()
        ms = _steps_ms(llm, steps)
        res["decode"].append({"batch": B, "ms_per_step": ms, "tok_s": B / ms * 1e3, "async_scheduling": ab})
        if ab:  # the same steps with each one run to its end before the next (LLM async_scheduling=False)
            llm.drain()
            llm.async_scheduling = False
            res["decode"][-1]["ms_per_step_sync"] = _steps_ms(llm, steps)
            llm.async_scheduling = True
        if breakdown:
            res["decode"][-1]["breakdown"] = _breakdown(llm, max(1, min(steps, 4)))
        if tl_steps:
            llm.drain()
            from step_timeline import timeline as _timeline  # noqa: PLC0415 - torch + CUPTI, the GPU run only
            res["decode"][-1]["timeline"] = _timeline(llm.step, tl_steps)
        while llm.has_unfinished():
            llm.step()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", "--model-shape", dest="shape", choices=sorted(SHAPES), default="27b")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--long-prefill", type=int, default=8192, help="one prompt of this many tokens (0: skip)")
    ap.add_argument("--graphs", choices=("on", "off"), default="on", help="CUDA graphs for decode steps")
    ap.add_argument("--breakdown", action="store_true",
                    help="per-kernel-family time of a decode step and of the long prefill")
    ap.add_argument("--gemv-max-m", type=int, default=None, choices=range(0, 65), metavar="0..64",
                    help="ops.gemv for M <= this in captured steps (default: the backend's rule)")
    ap.add_argument("--timeline", action="store_true",
                    help="per-kernel exclusive device time of graph-replayed decode steps (step_timeline.py; torch)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--quant", choices=("none", "fp8", "nvfp4"), default="none",
                    help="fp8: block-wise FP8 dummy weights for the projections (ops.gemm_fp8); nvfp4: NVFP4 "
                         "(compressed-tensors) dummy weights, run as W4A16")
    ap.add_argument("--experts", choices=("quantized", "bf16"), default="quantized",
                    help="with --quant on a MoE shape: keep the experts quantized (ops.moe W8A16 / W4A16) or "
                         "dequantize them to bf16 at load (LLM quantized_experts)")
    ap.add_argument("--fp8-gemv", choices=("on", "off"), default=None,
                    help="the small-M rule for FP8 linears (gemv_w8a16; default: the backend's FP8_GEMV)")
    ap.add_argument("--fp8-block-lane", choices=("default", "triton"), default="default",
                    help="triton: the block-scaled FP8 GEMMs on the Triton kernels even where the CuTe ones exist "
                         "(the A/B of the CuTe lane in one process)")
    ap.add_argument("--moe-fp8", choices=("default", "w8a16"), default="default",
                    help="w8a16: FP8 experts on the W8A16 kernels at every M (ops.moe.W8A8_GROUPED off; the A/B "
                         "of the W8A8 grouped path in one process)")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="the block table's width in tokens (default: just what the run needs; an engine's default "
                         "is 32768, which sets attention decode's split count in the captured graphs)")
    ap.add_argument("--decode-prompt", type=int, default=16, help="prompt tokens of each decoding sequence")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.moe_fp8 == "w8a16":
        from vkc_runtime.ops.moe import block as _block
        _block.W8A8_GROUPED = False
    if a.fp8_block_lane == "triton":
        from vkc_runtime.ops import gemm as _gemm
        _gemm.has_fp8_block = lambda: False
    if a.fp8_gemv is not None:
        import vkc_engine.backend as B
        B.FP8_GEMV = a.fp8_gemv == "on"
    if a.gemv_max_m is not None:
        import vkc_engine.backend as B
        B.GEMV_MAX_M = a.gemv_max_m
    with tempfile.TemporaryDirectory() as d:
        quant = {"fp8": FP8_QUANT, "nvfp4": NVFP4_QUANT}.get(a.quant)
        conf = dict(SHAPES[a.shape], **({"quantization_config": quant} if quant else {}))
        (Path(d) / "config.json").write_text(json.dumps(conf))
        res = run(d, batches=tuple(int(b) for b in a.batches.split(",")), prefill=a.prefill, steps=a.steps,
                  long_prefill=a.long_prefill, graphs=a.graphs == "on", breakdown=a.breakdown,
                  timeline=a.timeline, quantized_experts=a.experts == "quantized", max_model_len=a.max_model_len,
                  decode_prompt=a.decode_prompt)
    res["shape"] = a.shape
    res["quant"] = a.quant
    res["experts"] = a.experts
    import vkc_engine.backend as B
    res["gemv_max_m"] = B.GEMV_MAX_M
    res["fp8_gemv"] = B.FP8_GEMV
    res["fp8_block_lane"] = a.fp8_block_lane
    res["moe_fp8"] = a.moe_fp8
    res["max_model_len"] = a.max_model_len
    res["decode_prompt"] = a.decode_prompt
    txt = json.dumps(res, indent=1)
    print(txt)
    if a.out:
        Path(a.out).write_text(txt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
