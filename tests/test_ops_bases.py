"""Kernel names, declared once per ops module as data (``BASES`` / ``OPTIONAL_BASES``), against the committed
manifests: the completeness contract of the import check, on every arch, without a GPU."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from vkc_runtime import registry
from vkc_runtime.ops import MODULES

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((REPO / "manifests").glob("sm_*.json"))


def _kernels(path: Path) -> set[str]:
    return set(json.loads(path.read_text())["kernels"])


def test_every_arch_manifest_has_every_required_base():
    assert len(MANIFESTS) == 7
    req = registry.required()
    assert len(req) > 50
    for m in MANIFESTS:
        missing = req - _kernels(m)
        assert not missing, (m.name, sorted(missing))


def test_required_is_the_union_of_the_ops_data():
    per_module = registry.ops_bases()
    assert set(per_module) == set(MODULES)
    union = set().union(*per_module.values())
    assert registry.required() >= union
    for name, bases in per_module.items():
        assert len(bases) == len(set(bases)), name  # no base declared twice


def test_optional_bases_exist_where_the_fast_path_is_built():
    opt = registry.optional()
    assert opt and not (opt & registry.required())
    have = {m.stem: _kernels(m) for m in MANIFESTS}
    # the CuTe GEMM (sm_90a so far); the FP8 GEMMs and the MoE's W8A8 experts where FP8 tensor cores exist (the
    # 128x256 tile: the 228 KB shared-memory archs); the rest: the TMA prefill, sm_90a and sm_100a
    fp8 = ["sm_100a", "sm_120a", "sm_121a", "sm_89", "sm_90a"]
    # the NVFP4 W4A4 GEMM: the FP4 tensor-core archs, and sm_90a (its bf16 emulation, for verification)
    where = {"gemm": ["sm_90a"], "gemm_fp8": fp8, "gemm_fp8.scaled.t128x256": ["sm_100a", "sm_90a"],
             "gemm_fp4": ["sm_100a", "sm_120a", "sm_121a", "sm_90a"],
             "gemm_fp4.w4a4.t64x128": ["sm_120a", "sm_121a", "sm_90a"],
             "gemm_fp8.block.t128x128": [a for a in fp8 if a != "sm_100a"], "moe.w8a8": fp8}
    for b in opt:
        parts = b.split(".")
        want = where.get(b, where.get(".".join(parts[:2]), where.get(parts[0], ["sm_100a", "sm_90a"])))
        assert sorted(a for a, ks in have.items() if b in ks) == want, b


@pytest.mark.parametrize("name", MODULES)
def test_family_names_match_kernels_src(name):
    """Each ops module's bases live in one family, named like the module and like its kernels_src/ directory."""
    mod = importlib.import_module(f"vkc_runtime.ops.{name}")
    fams = {b.split(".", 1)[0] for b in (*mod.BASES, *getattr(mod, "OPTIONAL_BASES", ()))}
    assert fams == {name}
    assert (REPO / "kernels_src" / name / "spec.py").is_file()


def test_every_kernel_family_has_its_ops_module():
    """The other direction: every family of kernels_src/ with Triton specs (selftest aside: the ABI probe, used by
    the runtime tests) is one ops module of the same name."""
    fams = {p.parent.name for p in (REPO / "kernels_src").glob("*/spec.py")} - {"selftest"}
    assert fams <= set(MODULES), sorted(fams - set(MODULES))


def test_naming_functions_produce_only_declared_names():
    """The ops pick kernels through their naming functions; every value those can be called with gives a
    declared base (the recorders of the ops tests additionally refuse any undeclared lookup)."""
    from vkc_runtime.ops import act as AC, conv as C, embedding as EM, gdn as G, gdn_decode as GD, norm as N
    from vkc_runtime.ops import rope as RO
    from vkc_runtime.ops.attn import BASES as A_BASES, OPTIONAL_BASES as A_OPTIONAL, common as A
    names = set()
    for v in ("a16", "any"):
        names |= {N._rms_base(k, b, v) for k in ("rmsnorm", "add_rmsnorm") for b in N.ROW_BLOCKS}
        names |= {N._gated_base(v), AC._silu_base(v), EM._embedding_base(v)}
        names |= {RO._qk_base(d, v) for d in (256, 128)} | {AC._sigmoid_base(d, v) for d in AC._SIGMOID_DIMS}
        names |= {C._base(k, v) for k in ("prefill", "update")}
    rows = set(N.BASES) | set(RO.BASES) | set(AC.BASES) | set(EM.BASES)
    assert names <= rows | set(C.BASES) and rows <= names
    assert {GD._base(t, ba) for t in GD._SPECS for ba in (False, True)} == set(GD.BASES)
    assert [G._base(k) for k in G._KERNELS] == list(G.BASES)
    attn = {A.cache_write_base(a) for a in (True, False)}
    for d in A.HEAD_DIMS:
        assert set(A.decode_bases(d)) == {A.decode_base("split", d)} | {
            A.decode_base(k, d, g) for k in ("direct", "fused", "combine") for g in (True, False)}
        assert set(A.decode_bases(d, tma=True)) == {A.decode_base("split", d, tma=True)} | {
            A.decode_base(k, d, g, tma=True) for k in ("direct", "fused") for g in (True, False)}
        attn |= set(A.decode_bases(d)) | set(A.decode_bases(d, tma=True))
        for g in (True, False):
            attn |= {A.prefill_base(d, g), A.prefill_base(d, g, tma=True)}
    assert attn == set(A_BASES) | set(A_OPTIONAL)
    from vkc_runtime.ops import gemv as GV
    gv = {GV._reduce_base()} | {GV._base(k, bm, bn, bk, d) for k in GV.TILES for bm in GV.BUCKETS[k]
                                for bn, bk in GV.tiles(k, bm) for d in GV.DECODERS}
    assert gv == set(GV.BASES)


def test_every_kernel_with_global_scratch_gets_it_from_a_workspace():
    """Kernels with ``global_scratch_size > 0`` (on any arch) are the ones whose ops take the scratch from a
    workspace allocated before capture (gdn.workspace_for, attn.prefill_workspace, attn.decode_workspace) -- and which
    tests/gpu/test_gpu_capture.py captures on any stream. A new one must join that list (and those tests)."""
    from vkc_runtime.ops import attn as A
    covered = {"gdn.delta_h", *A.OPTIONAL_BASES}
    seen = set()
    for m in MANIFESTS:
        for base, e in json.loads(m.read_text())["kernels"].items():
            if e["launch"].get("global_scratch_size", 0) > 0:
                seen.add(base)
                assert base in covered, (m.name, base)
            assert e["launch"].get("profile_scratch_size", 0) == 0, (m.name, base)
    assert seen == covered
