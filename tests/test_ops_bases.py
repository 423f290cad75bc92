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
FAMILY = {"norm": "norm", "attention": "attn", "conv": "conv", "gdn": "gdn", "gdn_decode": "gdn_decode",
          "sample": "sample"}


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
    for b in opt:  # the TMA prefill: sm_90a and sm_100a
        assert [a for a, ks in have.items() if b in ks] == ["sm_100a", "sm_90a"], b


@pytest.mark.parametrize("name", MODULES)
def test_family_names_match_kernels_src(name):
    """Each ops module's bases live in one family, named like its kernels_src/ directory."""
    mod = importlib.import_module(f"vkc_runtime.ops.{name}")
    fams = {b.split(".", 1)[0] for b in (*mod.BASES, *getattr(mod, "OPTIONAL_BASES", ()))}
    assert fams == {FAMILY[name]}
    assert (REPO / "kernels_src" / FAMILY[name] / "spec.py").is_file()


def test_naming_functions_produce_only_declared_names():
    """The ops pick kernels through their naming functions; every value those can be called with gives a
    declared base (the recorders of the ops tests additionally refuse any undeclared lookup)."""
    from vkc_runtime.ops import attention as A, conv as C, gdn as G, gdn_decode as GD, norm as N
    names = set()
    for v in ("a16", "any"):
        names |= {N._rms_base(k, b, v) for k in ("rmsnorm", "add_rmsnorm") for b in N.ROW_BLOCKS}
        names |= {N._gated_base(v), N._silu_base(v), N._embedding_base(v)}
        names |= {N._qk_base(d, v) for d in (256, 128)} | {N._sigmoid_base(d, v) for d in N._SIGMOID_DIMS}
        names |= {C._base(k, v) for k in ("prefill", "update")}
    assert names <= set(N.BASES) | set(C.BASES) and set(N.BASES) <= names
    assert {GD._base(t) for t in GD._SPECS} == set(GD.BASES)
    assert [G._base(k) for k in G._KERNELS] == list(G.BASES)
    attn = {A._cache_write_base(a) for a in (True, False)}
    for d in A.HEAD_DIMS:
        attn.add(A._decode_base("split", d))
        for g in (True, False):
            attn |= {A._prefill_base(d, g), A._prefill_base(d, g, tma=True)}
            attn |= {A._decode_base(k, d, g) for k in ("direct", "fused", "combine")}
    assert attn == set(A.BASES) | set(A.OPTIONAL_BASES)


def test_every_kernel_with_global_scratch_gets_it_from_a_workspace():
    """Kernels with ``global_scratch_size > 0`` (on any arch) are the ones whose ops take the scratch from a
    workspace allocated before capture (gdn.workspace_for, attention.prefill_workspace) -- and which
    tests/gpu/test_gpu_capture.py captures on any stream. A new one must join that list (and those tests)."""
    from vkc_runtime.ops import attention as A
    covered = {"gdn.delta_h", *A.OPTIONAL_BASES}
    seen = set()
    for m in MANIFESTS:
        for base, e in json.loads(m.read_text())["kernels"].items():
            if e["launch"].get("global_scratch_size", 0) > 0:
                seen.add(base)
                assert base in covered, (m.name, base)
            assert e["launch"].get("profile_scratch_size", 0) == 0, (m.name, base)
    assert seen == covered
