"""Programmatic dependent launch (PDL): the spec rule (vkc.spec.with_pdl), the committed manifests, and the
kernels' sources. A kernel launched with the attribute may start while the previous one still runs; it must
wait (kernels_src/common.py pdl_enter) before it reads what that kernel writes. The build refuses a PDL launch
whose PTX has no griddepcontrol.wait (aot/vkc/compile.py); these tests hold the rest without a GPU."""
from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from vkc.spec import PDL_ARCHS, Arg, KernelSpec, SpecError, with_pdl
from vkc_contract.arch import ALL_ARCHS

ROOT = Path(__file__).resolve().parents[1]


def _spec(**kw):
    return KernelSpec(name="k", source="k.py", entry="k_kernel", args=[Arg("x_ptr", "*bf16")],
                      constexprs={"BLOCK": 128}, family="t", **kw)


def test_with_pdl_pairs_the_constexpr_and_the_attribute_per_arch():
    s = with_pdl(_spec(overrides={"sm_80": {"constexprs": {"BLOCK": 64}}, "sm_120a": {"num_warps": 8}}))
    s.validate()
    assert PDL_ARCHS == ("sm_90a", "sm_100a", "sm_120a", "sm_121a")
    for arch in ALL_ARCHS:
        rs = s.for_arch(arch)
        on = arch in PDL_ARCHS
        assert rs.constexprs["PDL"] is on and rs.options["launch_pdl"] is on, arch
    assert s.for_arch("sm_80").constexprs["BLOCK"] == 64  # existing overrides are merged, not replaced
    assert s.for_arch("sm_120a").num_warps == 8


@pytest.mark.parametrize("bad", ["constexpr_only", "attr_only", "old_arch"])
def test_validate_refuses_a_launch_without_its_wait(bad):
    s = with_pdl(_spec())
    if bad == "constexpr_only":
        s = replace(s, options={})
    elif bad == "attr_only":
        s = replace(s, constexprs={"BLOCK": 128, "PDL": False})
    else:
        s = replace(s, overrides={})  # sm_80 would get launch_pdl
    with pytest.raises(SpecError, match="PDL|griddepcontrol"):
        s.validate()


def _manifests():
    return {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "manifests").glob("sm_*.json"))}


def test_manifests_launch_pdl_only_with_the_wait_compiled_in():
    n_pdl = 0
    for arch, m in _manifests().items():
        for base, k in m["kernels"].items():
            launch = k.get("launch", {})
            attr = bool(launch.get("launch_pdl", False))
            pdl = k["inputs"].get("constexprs", {}).get("PDL", False)
            assert attr == bool(pdl), (arch, base)
            assert not attr or arch in PDL_ARCHS, (arch, base)
            n_pdl += attr
    assert n_pdl > 0  # the decode-step kernels of sm_90a+ are PDL kernels


def _jit_functions():
    for path in sorted((ROOT / "kernels_src").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                    (isinstance(d, ast.Attribute) and d.attr == "jit") for d in node.decorator_list):
                yield path, node


def test_every_pdl_parameter_reaches_pdl_enter():
    """A kernel with a PDL parameter passes it to a call (pdl_enter or a helper taking PDL) -- an unused PDL
    would compile a kernel that is launched early and never waits."""
    seen = 0
    for path, fn in _jit_functions():
        if "PDL" not in [a.arg for a in fn.args.args] or fn.name in ("pdl_enter", "gluon_pdl_enter"):
            continue  # the primitives (kernels_src/common.py; its Gluon twin in kernels_src/gemv/nvfp4_mma.py)
        seen += 1
        calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)]
        used = [c for c in calls if any(isinstance(a, ast.Name) and a.id == "PDL" for a in c.args)]
        assert used, f"{path.relative_to(ROOT)}:{fn.name} never passes PDL on"
        direct = [c for c in used if isinstance(c.func, ast.Name) and c.func.id in ("pdl_enter", "gluon_pdl_enter")]
        # every pdl_enter call is unconditional at the function's top level, so no path skips the wait
        for c in direct:
            assert any(isinstance(st, ast.Expr) and st.value is c for st in fn.body), \
                f"{path.relative_to(ROOT)}:{fn.name}: pdl_enter(PDL) inside a branch or loop"
    assert seen >= 20
