"""The read-only FlashInfer autotune-cache import (vkc_runtime.plans.flashinfer): the bounded key parser, exact
M/N/K derivation, the 64-entry 27B fixture (every (M, N, K) -> tactic asserted), foreign entries ignored,
malformed FP4 entries and metadata mismatches rejected as a whole, tactic ids mapped only when the descriptor
order matches, and an exact imported hit ahead of native plans and tuning."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plans_support import ARCH, FakeTimer, cfg, meta
from vkc_runtime.plans import PlanCache, PlanKey, store
from vkc_runtime.plans import flashinfer as F

FIX = Path(__file__).parent / "fixtures" / "plans" / "flashinfer_27b_autotune_configs.json"
META = {"flashinfer_version": "0.6.13", "cuda_version": "13.0", "cublas_version": "13.1.0", "cudnn_version": "91900",
        "cudnn_frontend_version": "1.26.0", "gpu": "NVIDIA GB10"}
# tactic per M bucket 1, 2, 4, ..., 32768, per (N, K): the fixture's recorded values
EXPECTED = {
    (14336, 5120): [9, 15, 9, 14, 12, 10, 4, 5, 14, 8, 20, 2, 29, 11, 6, 19],
    (5120, 6144): [10, 21, 16, 25, 29, 6, 23, 28, 1, 17, 19, 11, 27, 2, 25, 21],
    (34816, 5120): [11, 19, 31, 7, 9, 24, 20, 25, 11, 13, 11, 17, 25, 26, 14, 8],
    (5120, 17408): [18, 29, 2, 14, 20, 7, 5, 20, 12, 21, 6, 20, 30, 7, 28, 15],
}
# A stand-in for an FP4 tactic descriptor table (vkc has none yet): 32 descriptors in the upstream order.
UPSTREAM = [{"id": i, "tile": [128, 64 << (i % 3), 256], "cluster": [1 + i // 16, 1], "persistent": bool(i & 8)}
            for i in range(32)]


def key(m, n, k, op="fp4_gemm", runner="CutlassFp4GemmRunner", extras="()"):
    ks = -(-(k // 16) // 4) * 4
    ma, na = -(-m // 128) * 128, -(-n // 128) * 128
    return (f"('{op}', '{runner}', (({m}, {k // 2}), ({n}, {k // 2}), ({ma}, {ks}), ({na}, {ks}), (1,), "
            f"({m}, {n})), {extras})")


def fixture_doc():
    return json.loads(FIX.read_text())


def test_fixture_exact_64_entries():
    imp = F.read(FIX, META)
    want = {(1 << i, n, k): t for (n, k), row in EXPECTED.items() for i, t in enumerate(row)}
    assert len(want) == 64 and imp.entries == want and imp.ignored == 0
    assert imp.mapped == {}                             # no tactic map given: nothing maps to a vkc tactic
    assert imp.metadata == META


def test_mapping_only_when_descriptor_order_matches():
    ids = F.tactic_map(UPSTREAM, UPSTREAM)
    assert ids == {i: i for i in range(32)}
    imp = F.read(FIX, META, ids)
    assert imp.mapped == imp.entries
    swapped = list(UPSTREAM)
    swapped[3], swapped[4] = swapped[4], swapped[3]
    assert F.tactic_map(UPSTREAM, swapped) == {} and F.tactic_map(UPSTREAM, UPSTREAM[:31]) == {}
    assert F.tactic_map(None, UPSTREAM) == {} and F.tactic_map(UPSTREAM, []) == {}
    assert F.read(FIX, META, F.tactic_map(UPSTREAM, swapped)).mapped == {}


def test_import_never_writes_the_file(tmp_path):
    p = tmp_path / "autotune_configs.json"
    p.write_bytes(FIX.read_bytes())
    p.chmod(0o444)
    before = (p.read_bytes(), p.stat().st_mtime_ns)
    F.read(p, META)
    assert (p.read_bytes(), p.stat().st_mtime_ns) == before


@pytest.mark.parametrize("expect,ok", [({}, True), ({"gpu": "NVIDIA GB10"}, True), ({"gpu": "*"}, True),
                                       ({"gpu": "NVIDIA H200"}, False), ({"cuda_version": "12.8"}, False),
                                       ({"flashinfer_version": "0.6.12"}, False)])
def test_metadata_expectations(expect, ok):
    if ok:
        assert len(F.read(FIX, expect).entries) == 64
    else:
        with pytest.raises(store.PlanFileError, match="_metadata"):
            F.read(FIX, expect)


def test_wildcard_in_file_metadata_matches(tmp_path):
    d = fixture_doc()
    d["_metadata"]["gpu"] = "*"
    assert len(F.parse_document(json.dumps(d), {"gpu": "NVIDIA H200"}).entries) == 64
    del d["_metadata"]["cublas_version"]
    with pytest.raises(store.PlanFileError, match="cublas_version"):
        F.parse_document(json.dumps(d), {})


def test_foreign_entries_ignored():
    d = fixture_doc()
    d["('bmm_fp8', 'CublasFp8GemmRunner', ((16, 64), (64, 64)), ())"] = ["CublasFp8GemmRunner", 3]
    d[key(16, 5120, 6144, runner="CudnnFp4GemmRunner")] = ["CudnnFp4GemmRunner", 1]
    d["trtllm::fused_moe(1, 2) some other format"] = [0, 0]
    imp = F.parse_document(json.dumps(d), META)
    assert imp.ignored == 3 and len(imp.entries) == 64


@pytest.mark.parametrize("k,v,msg", [
    (key(16, 5120, 6144, extras="(1,)"), ["CutlassFp4GemmRunner", 1], "extras"),
    (key(16, 5120, 6144).replace("(1,)", "(2,)"), ["CutlassFp4GemmRunner", 1], "not those of"),
    (key(16, 5120, 6144).replace("(16, 5120)", "(16, 5128)"), ["CutlassFp4GemmRunner", 1], "not those of"),
    (key(24, 5120, 6144), ["CutlassFp4GemmRunner", 1], "not an M bucket"),
    (key(16, 5120, 6152), ["CutlassFp4GemmRunner", 1], "multiple of 16"),
    (key(16, 4096, 4096), ["CutlassFp4GemmRunner", 32], "tactic 32"),
    (key(16, 4096, 4096), ["CutlassFp4GemmRunner", -1], "tactic -1"),
    (key(16, 4096, 4096), ["CudnnFp4GemmRunner", 1], "value runner"),
    (key(16, 4096, 4096), ["CutlassFp4GemmRunner", "1"], "not \\[runner, tactic\\]"),
    (key(16, 4096, 4096), ["CutlassFp4GemmRunner", 1, 0], "not \\[runner, tactic\\]"),
    (key(16, 4096, 4096), {"tactic": 1}, "not \\[runner, tactic\\]"),
    (key(16, 4096, 4096)[:-1], ["CutlassFp4GemmRunner", 1], "fp4_gemm key"),
    (key(16, 4096, 4096).replace("16, 2048", "16,, 2048"), ["CutlassFp4GemmRunner", 1], "fp4_gemm key"),
    ("('fp4_gemm', 'CutlassFp4GemmRunner', ((16,2048),), ())", ["CutlassFp4GemmRunner", 1], "6 shapes"),
    ("('fp4_gemm', 'CutlassFp4GemmRunner', __import__('os'))", ["CutlassFp4GemmRunner", 1], "fp4_gemm key"),
    ("('fp4_gemm', 3)", ["CutlassFp4GemmRunner", 1], "names no runner"),
    (key(1, 14336, 5120).replace("(1, 2560)", "(1 , 2560)"), ["CutlassFp4GemmRunner", 2], "two entries"),
])
def test_malformed_fp4_entry_rejects_the_import(k, v, msg):
    d = fixture_doc()
    d[k] = v
    with pytest.raises(store.PlanFileError, match=msg):
        F.parse_document(json.dumps(d), META)


def test_one_byte_mutation_and_json_faults_reject():
    text = FIX.read_text()
    i = text.index("(1, 2560)")
    with pytest.raises(store.PlanFileError):
        F.parse_document(text[:i] + "(1, 2561)" + text[i + 9:], META)      # K/2 of a now disagrees with b
    with pytest.raises(store.PlanFileError, match="duplicate JSON object key"):
        F.parse_document(text.replace('"gpu": "NVIDIA GB10"', '"gpu": "NVIDIA GB10", "gpu": "x"'), META)
    with pytest.raises(store.PlanFileError, match="malformed JSON"):
        F.parse_document(text[:-5], META)
    with pytest.raises(store.PlanFileError):
        F.parse_document("[]", META)


def test_bounded_parser():
    assert F.parse_key("('a', (1, 2), (3,), (), None)") == ("a", (1, 2), (3,), (), None)
    for bad in ["(" * 10 + ")" * 10, "(" + "1, " * 300 + ")", "(1" + "0" * 20 + ",)", "(01,)", "(1)", "('a\\'',)",
                "('" + "x" * 200 + "',)", "(1,) junk", "x" * 5000, "(-1,)", "(1.5,)", "(True,)", "[1, 2]"]:
        with pytest.raises(F.KeyParseError):
            F.parse_key(bad)


def test_exact_imported_hit_beats_native_and_tuning(tmp_path):
    ids = F.tactic_map(UPSTREAM, UPSTREAM)
    imp = F.read(FIX, META, ids)
    # as the runtime would install it for a runner with a matching table (the sm_90a bf16 table has 3 tactics,
    # so the test keys use the bf16 runner and a tactic id reduced into its range)
    bf16 = {PlanKey("vkc.cute.gemm_bf16", "bf16", "x_mk.w_nk", n, k, m): t % 3 for (m, n, k), t in imp.mapped.items()}
    kx = PlanKey("vkc.cute.gemm_bf16", "bf16", "x_mk.w_nk", 5120, 6144, 16)
    native = {kx: store.entry(ARCH, kx, (bf16[kx] + 1) % 3)}
    store.publish(tmp_path / "plans.json", meta(), native)
    c = PlanCache(ARCH, meta(), cfg(), path=tmp_path / "plans.json", flashinfer=lambda: bf16)
    t = FakeTimer()
    c.warmup(list(bf16), lambda key, tid: pytest.fail("an imported key was tuned"), t)
    assert c.lookup(kx) == (bf16[kx], "flashinfer") and t.log == [] and c.stats["tuned"] == 0
    assert c.stats["imported"] == 64 and c.stats["loaded"] == 1
