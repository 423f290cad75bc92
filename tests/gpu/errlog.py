"""Relative errors of the GPU tests, one record per case: printed (pytest -s) and collected in
$VKC_ERR_DIR/<family>_errors.json (tools/gpu/run.sh sets VKC_ERR_DIR; the files land in its results.json)."""
from __future__ import annotations

import json
import os

_ERRS: dict[str, list[dict]] = {}


def record(family: str, **fields) -> None:
    rows = _ERRS.setdefault(family, [])
    rows.append(fields)
    print(json.dumps({"family": family, **fields}))
    d = os.environ.get("VKC_ERR_DIR")
    if d:
        with open(os.path.join(d, f"{family}_errors.json"), "w") as f:
            json.dump(rows, f, indent=1)
