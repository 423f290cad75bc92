"""vkc_engine: the Qwen3.5/3.6 inference engine on vkc's vendored kernels (HF checkpoints in, tokens out).

    from vkc_engine import LLM, SamplingParams
    llm = LLM("/path/to/Qwen3.6-27B")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.7, top_p=0.9, max_tokens=256))

Modules: config (config.json), loader (safetensors), backend (the one adapter to vkc_runtime.ops), model
(the decoder), cache (KV blocks + GDN slots), scheduler (continuous batching), sampler, detok, llm (the API).
Imports vkc_runtime (lazily, in backend); vkc_runtime never imports it.
"""
from .llm import LLM, RequestOutput
from .sampler import Logprob, SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "Logprob"]
