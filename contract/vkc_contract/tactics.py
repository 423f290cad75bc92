"""GEMM tactic descriptors, the contract between the generator (the manifest's ``tactics`` block) and the runtime
(``vkc_runtime.plans.tactics``, whose table must produce the same digest).

A tactic is one compiled GEMM kernel of an arch: a manifest kernel whose ``inputs.abi`` is a GEMM launcher ABI
(:data:`ABI_FACTS`). Its id is its position among the arch's GEMM kernels sorted by base name; its descriptor
is the launcher ABI's facts (runner, dtypes, layout), the kernel class's fixed facts (:data:`CLASS_FACTS`:
k tile, cluster, persistence, split-K) and the tile configuration of the spec (:data:`CONFIG_KEYS`). The digest
is sha256 over the canonical JSON list of descriptors in id order, so a changed, added, removed or reordered
kernel changes it.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping

__all__ = ["TACTIC_SET_VERSION", "ABI_FACTS", "CLASS_FACTS", "CONFIG_KEYS", "descriptor", "descriptor_digest",
           "manifest_block"]

TACTIC_SET_VERSION = 1
ABI_FACTS: dict[str, dict[str, Any]] = {
    "gemm_bf16": {"runner": "vkc.cute.gemm_bf16", "dtype": "bf16", "acc_dtype": "fp32", "out_dtype": "bf16",
                  "layout": "x_mk.w_nk"},
}
CLASS_FACTS: dict[str, dict[str, Any]] = {
    # kernels_src/gemm/sm90_wgmma.py: k tile 64, no cluster, persistent (one CTA per SM walks its tiles), no split-K
    "Sm90BF16Gemm": {"tile_k": 64, "cluster_m": 1, "cluster_n": 1, "persistent": True, "split_k": 1},
}
CONFIG_KEYS = ("tile_m", "tile_n", "stages", "epi_stages", "group_m")


def descriptor(tactic_id: int, base: str, kernel_class: str, abi: str, config: Mapping[str, Any]) -> dict[str, Any]:
    if abi not in ABI_FACTS or kernel_class not in CLASS_FACTS:
        raise KeyError(f"{base}: no tactic facts for ABI {abi!r} / kernel class {kernel_class!r} "
                       f"(add them to vkc_contract/tactics.py)")
    return {"id": tactic_id, "base": base, **ABI_FACTS[abi], **CLASS_FACTS[kernel_class],
            **{k: config[k] for k in CONFIG_KEYS}}


def descriptor_digest(descriptors: Iterable[Mapping[str, Any]]) -> str:
    body = json.dumps([dict(d) for d in descriptors], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(body.encode()).hexdigest()


def manifest_block(kernels: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The manifest's ``tactics`` record of an arch from its ``kernels``: version, count, digest, bases in id order."""
    bases = sorted(b for b, k in kernels.items() if (k.get("inputs") or {}).get("abi") in ABI_FACTS)
    ds = [descriptor(i, b, kernels[b]["inputs"]["kernel_class"], kernels[b]["inputs"]["abi"],
                     kernels[b]["inputs"]["config"]) for i, b in enumerate(bases)]
    return {"version": TACTIC_SET_VERSION, "count": len(ds), "digest": descriptor_digest(ds), "bases": bases}
