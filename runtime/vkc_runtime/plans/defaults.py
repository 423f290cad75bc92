"""The committed default plan of each arch (``defaults/<arch>.json``): a fresh install never tunes a covered key.

Format ``vkc_gemm_default_plan_v1``: ``_metadata`` (format, sm, tactic_set as in :func:`.tactics.tactic_set`,
bucket_version, the device and SM count it was made for, ``source``: how its choices were made, ``note``)
and ``plans`` (native plan entries, :mod:`.store`). A default plan applies on its arch when its tactic set and
bucket version are this runtime's and the device has the SM count it was made for (the tile rule it encodes
depends on it); otherwise it is not used and the start report says why. An arch without GEMM tactics has an
empty plan and a note saying so.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from . import tactics as T
from .keys import BUCKET_VERSION, PlanKey
from .store import PlanFileError, dumps, entry_key, fingerprint, strict_json

__all__ = ["DEFAULT_FORMAT", "COVERED_NK", "path_for", "read", "applicable", "tuned_document"]

DEFAULT_FORMAT = "vkc_gemm_default_plan_v1"
_DIR = Path(__file__).resolve().parent / "defaults"
# (N, K) of the Qwen3.6-27B bf16 GEMMs the sm_90a default covers at every M bucket (hidden 5120; GDN 16 key / 48
# value heads of 128; attention 24 q + 4 kv heads of 256; MLP 17408; vocabulary 248320), as vkc_engine fuses them:
# GDN in_proj q|k|v|z|b|a, packed attention q|gate|k|v, attention o_proj = GDN out_proj, MLP gate|up, MLP down, lm_head
COVERED_NK = ((16480, 5120), (14336, 5120), (5120, 6144), (34816, 5120), (5120, 17408), (248320, 5120))


def path_for(arch: str) -> Path:
    return _DIR / f"{arch}.json"


def read(arch: str, path: Path | None = None) -> tuple[dict[str, Any], dict[PlanKey, int]]:
    """``(metadata, key -> tactic id)`` of the arch's default plan; PlanFileError when it does not validate."""
    p = path or path_for(arch)
    doc = strict_json(p.read_text())
    meta = doc.get("_metadata") if type(doc) is dict else None
    if type(meta) is not dict or type(doc.get("plans")) is not list:
        raise PlanFileError(f"{p.name}: not a default plan document")
    want = {"format": DEFAULT_FORMAT, "sm": arch, "tactic_set": T.tactic_set(arch), "bucket_version": BUCKET_VERSION}
    for k, v in want.items():
        if meta.get(k) != v:
            raise PlanFileError(f"{p.name}: _metadata.{k} is {meta.get(k)!r}, this runtime has {v!r}")
    out: dict[PlanKey, int] = {}
    for i, e in enumerate(doc["plans"]):
        try:
            t = T.by_id(arch, e["tactic"])
            k = entry_key(e)
        except (KeyError, TypeError) as ex:
            raise PlanFileError(f"{p.name}: plans[{i}]: {ex}") from None
        if (e.get("base"), e["runner"], e["dtype"], e["layout"]) != (t.base, t.runner, t.dtype, t.layout):
            raise PlanFileError(f"{p.name}: plans[{i}] does not describe tactic {t.id} ({t.base})")
        if k in out:
            raise PlanFileError(f"{p.name}: plans[{i}]: key {k} appears twice")
        out[k] = t.id
    return meta, out


def tuned_document(meta: Mapping[str, Any], plans: Iterable[Mapping[str, Any]], how: str) -> bytes:
    """A default plan of this format made of native plan entries tuned by the miss method in a process whose plan
    metadata is ``meta`` (``how``: the command that timed them, recorded in ``source``)."""
    plans = list(plans)
    arch = meta["sm"]
    dmeta = {"format": DEFAULT_FORMAT, "sm": arch, "tactic_set": T.tactic_set(arch), "bucket_version": BUCKET_VERSION,
             "device_name": meta["device_name"], "sm_count": meta["sm_count"],
             "source": f"tuned: {how} on {meta['device_name']} (plan fingerprint {fingerprint(meta)}, "
                       f"delay {meta['timing']['delay_us']} us)",
             "note": f"{len(plans)} tuned keys"}
    return dumps(dmeta, plans)


def applicable(meta: Mapping[str, Any], sm_count: int) -> str | None:
    """None when the default plan applies to a device with ``sm_count`` SMs, else the reason it does not."""
    made = meta.get("sm_count")
    if made is not None and made != sm_count:
        return f"made for {made} SMs ({meta.get('device_name')}), this device has {sm_count}"
    return None
