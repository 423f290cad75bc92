"""`vkc tune` choose/apply logic (the GPU timing step is exercised on the H200 by tools/gpu/run.sh tune)."""
from __future__ import annotations

import json

from vkc import tune


def results():
    def cand(value, times):
        return {"candidate": {"arch": "sm_90a", "family": "norm", "knob": "num_warps", "value": value,
                              "specs": ["rmsnorm.b8192.a16", "add_rmsnorm.b8192.a16"]},
                "rows": [{"spec": "rmsnorm.b8192.a16", "case": c, "us": t} for c, t in times.items()]
                + [{"spec": "add_rmsnorm.b8192.a16", "case": c, "us": 2 * t * (1 if value == 8 else 1.5)}
                   for c, t in times.items()]}
    return {"num_warps4": cand(4, {"a": 10.0, "b": 100.0}),
            "num_warps8": cand(8, {"a": 12.0, "b": 90.0}),   # geomean 32.9 vs 31.6 for 4
            "num_warps16": {"candidate": {"arch": "sm_90a", "family": "norm", "knob": "num_warps", "value": 16,
                                          "specs": []}, "error": "boom"}}


def test_choose_geomean_per_spec():
    ch = tune.choose(results())
    assert ch["rmsnorm.b8192.a16"]["value"] == 4      # sqrt(10*100)=31.6 < sqrt(12*90)=32.9
    assert ch["add_rmsnorm.b8192.a16"]["value"] == 8  # 1.5x penalty on the others
    assert set(ch["rmsnorm.b8192.a16"]["geomean_us"]) == {"num_warps4", "num_warps8"}


def test_choose_only_the_candidates_own_specs():
    r = results()
    for c in r.values():
        c["candidate"]["specs"] = ["rmsnorm.b8192.a16"]   # add_rmsnorm rows: timed, but the knob is not in them
    ch = tune.choose(r)
    assert set(ch) == {"rmsnorm.b8192.a16"}


def test_choose_ignores_candidates_missing_cases():
    r = results()
    r["num_warps8"]["rows"] = [x for x in r["num_warps8"]["rows"] if x["case"] == "a"]  # only the fast case
    assert tune.choose(r)["rmsnorm.b8192.a16"]["value"] == 4


def test_apply_merges_and_mirrors(tmp_path):
    (tmp_path / "kernels_src/norm/tuning").mkdir(parents=True)
    f = tmp_path / "kernels_src/norm/tuning/sm_90a.json"
    f.write_text(json.dumps({"other.a16": {"num_stages": 2}, "rmsnorm.b8192.a16": {"num_stages": 3}}))
    tune.apply(tmp_path, tune.choose(results()), mirror=[(".a16", ".any")])
    data = json.loads(f.read_text())
    assert data["other.a16"] == {"num_stages": 2}
    assert data["rmsnorm.b8192.a16"] == {"num_stages": 3, "num_warps": 4}
    assert data["rmsnorm.b8192.any"] == {"num_warps": 4}
    assert data["add_rmsnorm.b8192.any"] == {"num_warps": 8}


def test_apply_with_fixed_knobs(tmp_path):
    r = results()
    for c in r.values():
        c["candidate"]["fixed"] = {"num_stages": 2}
    tune.apply(tmp_path, tune.choose(r))
    data = json.loads((tmp_path / "kernels_src/norm/tuning/sm_90a.json").read_text())
    assert data["rmsnorm.b8192.a16"] == {"num_stages": 2, "num_warps": 4}
