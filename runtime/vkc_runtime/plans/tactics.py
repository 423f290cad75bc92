"""GEMM tactics as data: every compiled GEMM variant of an arch has a stable id and a descriptor.

A *tactic* is one compiled kernel of a GEMM family (``kernels_src/gemm/spec.py``: one CuTe spec per tile
configuration). Its descriptor states everything that changes the result bits or the speed: the tile
(M x N x K), the cluster shape, the pipeline stages, the epilogue stages, the tile-group swizzle, whether the
kernel is persistent, the split-K factor, the operand/accumulator/output dtypes and the operand layout. Ids
follow ``vkc_contract.tactics``: the position among the arch's GEMM kernels sorted by base name.

:func:`descriptor_digest` (``vkc_contract.tactics``) is the deterministic sha256 of an arch's descriptor list;
``vkc regen`` records the same digest, computed from the compiled kernels' specs, in the manifest's
``tactics`` block (``vkc verify`` re-derives it), and :func:`check_manifest` compares this table with the
manifest (block and compiled configs), so the table cannot silently describe other kernels than the vendored
ones. A changed, added or reordered kernel changes the digest, which rejects every plan made for the old set.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from vkc_contract.tactics import TACTIC_SET_VERSION, descriptor_digest

__all__ = ["Tactic", "TACTIC_SET_VERSION", "RUNNER_BF16", "RUNNER_NVFP4", "LAYOUT_TN", "TACTICS", "tactics_for",
           "descriptor_digest", "tactic_set", "by_id", "id_of_base", "check_manifest"]

RUNNER_BF16 = "vkc.cute.gemm_bf16"   # the runner: the CuTe bf16 GEMM launcher ABI ("gemm_bf16")
RUNNER_NVFP4 = "vkc.gemm_nvfp4"      # reserved: ops.gemm_fp4 has no tactics yet (flashinfer.py)
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
    # tile_k 64 (one 128-byte swizzle row of bf16), no cluster, persistent (one CTA per SM walks its output
    # tiles), no split-K: kernels_src/gemm/sm90_wgmma.py
    return Tactic(id=i, base=f"gemm.bf16.t128x{tile_n}", runner=RUNNER_BF16, tile_m=128, tile_n=tile_n, tile_k=64,
                  cluster_m=1, cluster_n=1, stages=stages, epi_stages=2, group_m=8, persistent=True, split_k=1,
                  dtype="bf16", acc_dtype="fp32", out_dtype="bf16", layout=LAYOUT_TN)


# Per arch, in id order. Archs without a compiled GEMM have an empty set (the op raises MissingKernelError).
TACTICS: dict[str, tuple[Tactic, ...]] = {
    "sm_80": (), "sm_86": (), "sm_89": (),
    "sm_90a": (_sm90_bf16(0, 128, 6), _sm90_bf16(1, 256, 4), _sm90_bf16(2, 64, 8)),  # base-name order
    "sm_100a": (), "sm_120a": (), "sm_121a": (),
}


def tactics_for(arch: str) -> tuple[Tactic, ...]:
    try:
        return TACTICS[arch]
    except KeyError:
        raise KeyError(f"no tactic table for arch {arch!r} (known: {', '.join(TACTICS)})") from None


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


def check_manifest(arch: str, kernels: Mapping[str, Any], block: Mapping[str, Any] | None = None) -> list[str]:
    """Problems between this arch's table and a manifest: its ``tactics`` block (when given) and its ``kernels``
    (the compiled configs)."""
    P = []
    if block is not None:
        mine = tactic_set(arch)
        got = {k: block.get(k) for k in mine}
        if got != mine:
            P.append(f"{arch}: the manifest records tactic set {got}, this runtime's table is {mine}")
        if list(block.get("bases") or []) != [t.base for t in tactics_for(arch)]:
            P.append(f"{arch}: the manifest's tactic bases {block.get('bases')} are not this table's ids")
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
