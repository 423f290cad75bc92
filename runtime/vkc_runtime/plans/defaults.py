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
from typing import Any, Mapping

from . import tactics as T
from .keys import BUCKET_VERSION, PlanKey
from .store import PlanFileError, entry_key, strict_json

__all__ = ["DEFAULT_FORMAT", "path_for", "read", "applicable"]

DEFAULT_FORMAT = "vkc_gemm_default_plan_v1"
_DIR = Path(__file__).resolve().parent / "defaults"


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


def applicable(meta: Mapping[str, Any], sm_count: int) -> str | None:
    """None when the default plan applies to a device with ``sm_count`` SMs, else the reason it does not."""
    made = meta.get("sm_count")
    if made is not None and made != sm_count:
        return f"made for {made} SMs ({meta.get('device_name')}), this device has {sm_count}"
    return None
