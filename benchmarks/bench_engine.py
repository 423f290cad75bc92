"""The engine end to end at a real model shape with random weights (``load_format="dummy"``, no checkpoint on
disk): load time, prefill of one long prompt, and decode ms/step at several batch sizes (eager: no CUDA graphs
yet, so host time per op is included). Shapes: the dense 27B and the MoE 35B-A3B (needs vkc_runtime.ops.moe).

    python benchmarks/bench_engine.py [--shape {27b,35b-a3b}] [--batches 1,16,64] [--prefill 2048] [--steps 16]
                                      [--out F]

Prints one JSON object (and writes it to --out): {"shape", "load_s", "prefill": {tokens, ms, tok_s},
"decode": [{batch, ms_per_step, tok_s}]}. ``run(model_dir, ..., backend=...)`` is the same measurement on any
backend (the CPU test drives it on the numpy backend at a tiny shape).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
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


def run(model_dir, *, batches=(1, 16), prefill=2048, steps=16, backend=None, load_format="dummy") -> dict:
    from vkc_engine import LLM, SamplingParams
    Bm = max(batches)
    t0 = time.perf_counter()
    llm = LLM(model_dir, backend=backend, load_format=load_format, max_num_seqs=Bm,
              max_num_batched_tokens=max(prefill, Bm), max_model_len=prefill + steps + 8,
              memory_fraction=0.5)
    res = {"load_s": time.perf_counter() - t0, "cache": llm.plan.describe(), "decode": []}
    V = llm.cfg.vocab_size
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    ids = [int(i) % V for i in range(1, prefill + 1)]
    llm.generate(ids[:64], sp)  # warm-up: kernel loads
    _sync(llm)
    t = time.perf_counter()
    llm.generate(ids, sp)  # one prefill step (the whole prompt fits the token budget) + sampling
    _sync(llm)
    ms = (time.perf_counter() - t) * 1e3
    res["prefill"] = {"tokens": prefill, "ms": ms, "tok_s": prefill / ms * 1e3}
    for B in batches:
        dp = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
        for b in range(B):
            llm.add_request([(7 * b + j) % V for j in range(16)], dp)
        llm.step()  # the prefill of all B prompts
        llm.step()  # first decode step (warm)
        _sync(llm)
        t = time.perf_counter()
        for _ in range(steps):
            llm.step()
        _sync(llm)
        ms = (time.perf_counter() - t) * 1e3 / steps
        res["decode"].append({"batch": B, "ms_per_step": ms, "tok_s": B / ms * 1e3})
        while llm.has_unfinished():
            llm.step()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", "--model-shape", dest="shape", choices=sorted(SHAPES), default="27b")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(SHAPES[a.shape]))
        res = run(d, batches=tuple(int(b) for b in a.batches.split(",")), prefill=a.prefill, steps=a.steps)
    res["shape"] = a.shape
    txt = json.dumps(res, indent=1)
    print(txt)
    if a.out:
        Path(a.out).write_text(txt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
