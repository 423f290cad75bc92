"""The GEMMs the engine launches through its backend's ``linear`` (``vkc_runtime.ops.gemm`` on the GPU), declared
to the backend's GEMM plan warm-up at start, before the first step and before any graph capture
(ARCHITECTURE.md section 13, "Lifecycle").

(N, K) per linear layer, with the fusions of vkc_engine.model (weights are [N, K], out = x @ w^T):

  Gated DeltaNet     in_proj qkv|z|b|a  [C + Vd + 2 Hv, H]     out_proj [H, Vd]
  full attention     q|gate|k|v         [2 Hq D + 2 Hkv D, H]  o_proj   [H, Hq D]
  dense MLP          gate|up            [2 I, H]               down     [H, I]
  LM head            [V, H]

MoE layers have no MLP linear: their experts run in ``ops.moe``'s grouped GEMMs, which have no plans.

M: a step packs 1 .. ``max_num_batched_tokens`` tokens, and prefill and mixed steps run eagerly at any of those
counts, so every layer linear can see every M up to that budget; the LM head sees a step's sampled rows (at most
``max_num_seqs``) or, in ``LLM.prompt_logits``, a whole chunk (at most the budget). So one range,
1 .. ``max_num_batched_tokens``, for every (N, K); the backend turns it into plan keys with the plan module's own
M buckets (one key per bucket). The decode steps replayed from CUDA graphs run M <= 16 on ``ops.gemv``, which
has no plans; those small M also occur in eager steps, so their buckets stay declared.
"""
from __future__ import annotations

from .config import ModelConfig

__all__ = ["linear_shapes", "plan_line"]


def linear_shapes(cfg: ModelConfig) -> list[tuple[int, int]]:
    """Every distinct (N, K) of the model's linear layers (module docstring), sorted."""
    H = cfg.hidden_size
    out = {(cfg.vocab_size, H)}
    if cfg.layer_indices("linear_attention"):
        Vd = cfg.gdn_value_dim
        out |= {(cfg.gdn_qkv_dim + Vd + 2 * cfg.gdn_v_heads, H), (H, Vd)}
    if cfg.layer_indices("full_attention"):
        Hq, Hkv, D = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        out |= {(2 * Hq * D + 2 * Hkv * D, H), (H, Hq * D)}
    if not cfg.is_moe:
        out |= {(2 * cfg.intermediate_size, H), (H, cfg.intermediate_size)}
    return sorted(out)


def plan_line(rep: dict) -> str:
    """The one start-up log line of the GEMM plan warm-up's report."""
    return (f"GEMM plans: mode {rep.get('mode')}, file {rep.get('path') or '(process-local)'} ({rep.get('file')}), "
            f"fingerprint {rep.get('fingerprint')}: {rep.get('declared', 0)} keys declared, loaded "
            f"{rep.get('loaded', 0)}, defaults {rep.get('defaults', 0)}, tuned {rep.get('tuned', 0)}, rejected "
            f"{rep.get('rejected', 0)}, saved {rep.get('saved', 0)}")
