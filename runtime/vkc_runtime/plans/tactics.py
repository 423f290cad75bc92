"""GEMM tactics as data: every compiled GEMM variant of an arch has a stable id and a descriptor.

A *tactic* is one compiled kernel of a GEMM family (``kernels_src/gemm/spec.py``: one CuTe spec per tile
configuration). Its descriptor states everything that changes the result bits or the speed: the tile
(M x N x K), the cluster shape, the pipeline stages, the epilogue stages, the tile-group swizzle, whether the
kernel is persistent, the split-K factor, the operand/accumulator/output dtypes and the operand layout. The
ids are the positions in :data:`TACTICS` of the arch (stable: a new kernel gets the next id; a changed or
reordered kernel changes the digest, which rejects every plan written for the old set as a unit).

:func:`descriptor_digest` is the deterministic sha256 of an arch's descriptor list (canonical JSON, ids
included); the manifest of the arch records the same digest (``tactics`` in ``manifests/<arch>.json``), and
:func:`check_manifest` compares this table with the manifest's compiled kernel configs, so the table cannot
silently describe other kernels than the ones vendored.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

__all__ = ["Tactic", "TACTIC_SET_VERSION", "RUNNER_BF16", "RUNNER_NVFP4", "LAYOUT_TN", "TACTICS", "tactics_for",
           "descriptor_digest", "tactic_set", "by_id", "id_of_base", "check_manifest"]

TACTIC_SET_VERSION = 1          # bump when the descriptor fields themselves change meaning
RUNNER_BF16 = "vkc.cute.gemm_bf16"   # the runner: the CuTe bf16 GEMM launcher ABI ("gemm_bf16")
RUNNER_NVFP4 = "vkc.gemm_nvfp4"      # reserved: no NVFP4 W4A4 GEMM is built yet (flashinfer.py)
LAYOUT_TN = "x_mk.w_nk"         # x [M, K] row-major, weight [N, K] row-major (HF Linear): out = x @ w^T


@dataclass(frozen=True)
class Tactic:
    id: int
    base: str               # the kernel base it launches (kernels_src/gemm/spec.py)
    runner: str
    tile_m: int
    tile_n: int
    tile_k: int
    cluster_m: int
    cluster_n: int
    stages: int
    epi_stages: int
    group_m: int
    persistent: bool
    split_k: int
    dtype: str              # operand dtype
    acc_dtype: str
    out_dtype: str
    layout: str

    def descriptor(self) -> dict[str, Any]:
        return asdict(self)


def _sm90_bf16(i: int, tile_n: int, stages: int) -> Tactic:
    # tile_k 64 (one 128-byte swizzle row of bf16), no cluster, one output tile per CTA (not persistent),
    # no split-K: kernels_src/gemm/sm90_wgmma.py
    return Tactic(id=i, base=f"gemm.bf16.t128x{tile_n}", runner=RUNNER_BF16, tile_m=128, tile_n=tile_n, tile_k=64,
                  cluster_m=1, cluster_n=1, stages=stages, epi_stages=2, group_m=8, persistent=False, split_k=1,
                  dtype="bf16", acc_dtype="fp32", out_dtype="bf16", layout=LAYOUT_TN)


# Per arch, in id order. Archs without a compiled GEMM have an empty set (the op raises MissingKernelError).
TACTICS: dict[str, tuple[Tactic, ...]] = {
    "sm_80": (), "sm_86": (), "sm_89": (),
    "sm_90a": (_sm90_bf16(0, 256, 4), _sm90_bf16(1, 128, 6), _sm90_bf16(2, 64, 8)),
    "sm_100a": (), "sm_120a": (), "sm_121a": (),
}


def tactics_for(arch: str) -> tuple[Tactic, ...]:
    try:
        return TACTICS[arch]
    except KeyError:
        raise KeyError(f"no tactic table for arch {arch!r} (known: {', '.join(TACTICS)})") from None


def descriptor_digest(descriptors: Iterable[Mapping[str, Any]]) -> str:
    """sha256 of the canonical JSON list of descriptors (sorted keys, in id order)."""
    body = json.dumps([dict(d) for d in descriptors], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(body.encode()).hexdigest()


def tactic_set(arch: str) -> dict[str, Any]:
    """What plan metadata records of the tactic set: version, count and descriptor digest."""
    ts = tactics_for(arch)
    return {"version": TACTIC_SET_VERSION, "count": len(ts), "digest": descriptor_digest(t.descriptor() for t in ts)}


def by_id(arch: str, tactic_id: int) -> Tactic:
    ts = tactics_for(arch)
    if type(tactic_id) is not int or not 0 <= tactic_id < len(ts):
        raise KeyError(f"{arch}: no GEMM tactic id {tactic_id!r} (ids 0..{len(ts) - 1})")
    return ts[tactic_id]


def id_of_base(arch: str, base: str) -> int:
    for t in tactics_for(arch):
        if t.base == base:
            return t.id
    raise KeyError(f"{arch}: no GEMM tactic launches {base!r}")


def check_manifest(arch: str, kernels: Mapping[str, Any]) -> list[str]:
    """Problems between this arch's table and a manifest's ``kernels`` (the compiled configs)."""
    P = []
    for t in tactics_for(arch):
        k = kernels.get(t.base)
        if k is None:
            P.append(f"{arch}: tactic {t.id} launches {t.base}, which the manifest does not list")
            continue
        cfg = (k.get("inputs") or {}).get("config") or {}
        want = {"tile_m": t.tile_m, "tile_n": t.tile_n, "stages": t.stages, "epi_stages": t.epi_stages,
                "group_m": t.group_m}
        got = {key: cfg.get(key) for key in want}
        if got != want:
            P.append(f"{arch}: tactic {t.id} ({t.base}) says {want}, the compiled kernel has {got}")
    return P
