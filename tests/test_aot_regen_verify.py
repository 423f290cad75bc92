"""AOT pipeline: regen determinism across directories, manifest schema and artifact kinds, the build side's
import discipline, `vkc verify --rebuild`, and the CLI. The mutation suite is tests/test_verify_mutations.py.

A small tree (the real aot/ + contract/ + runtime/ generator and the selftest kernel family) is regenerated
for two archs once per session (tests/aot_tree.py).
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vkc import manifest, verify
from vkc_contract import layout
from vkc_contract.arch import ALL_ARCHS
from tests.aot_tree import ARCHS, REPO, assert_found, built_tree, copy_tree, edit_manifest, make_tree, problems

pytest.importorskip("triton", reason="regen needs the pinned Triton (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return built_tree(tmp_path_factory)


@pytest.fixture()
def tree(built, tmp_path) -> Path:
    return copy_tree(built, tmp_path / "copy")


# ------------------------------------------------------------------ determinism and schema

def test_clean_tree_verifies(built):
    assert problems(built) == []


def test_regen_is_byte_identical_from_another_directory(built, tmp_path):
    from vkc.regen import regen

    other = make_tree(tmp_path / "elsewhere" / "deeper" / "tree")
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a different working directory too
    try:
        regen(other, ARCHS, jobs=1)
    finally:
        os.chdir(cwd)
    for arch in ARCHS:
        assert manifest.manifest_path(other, arch).read_bytes() == manifest.manifest_path(built, arch).read_bytes()
        a = sorted(p.relative_to(other).as_posix() for p in (other / "vendored" / arch).rglob("*.cubin"))
        b = sorted(p.relative_to(built).as_posix() for p in (built / "vendored" / arch).rglob("*.cubin"))
        assert a == b and len(a) == 3
        for rel in a:
            assert (other / rel).read_bytes() == (built / rel).read_bytes(), rel
            assert b"/tmp" not in (other / rel).read_bytes()  # no source paths (line info off)


def test_manifests_validate_against_schema(built):
    for arch in ARCHS:
        doc = manifest.load(manifest.manifest_path(built, arch))
        assert manifest.schema_errors(built, doc) == []
        assert doc["arch"] == arch and doc["digest"] == manifest.digest(doc)
        k = doc["kernels"]["selftest.scale_add.b1024"]
        assert [p["name"] for p in k["params"]][-2:] == ["global_scratch", "profile_scratch"]
        assert [p["size"] for p in k["params"]] == [8, 8, 8, 4, 4, 8, 8]  # fp32 alpha is 4 bytes
        assert k["resources"]["sass_arch"] == arch and not k["resources"]["spills"]
        for base, k in doc["kernels"].items():  # every Triton artifact records its kind and loader
            art = k["artifact"]
            assert art["kind"] == art["loader"] == "triton-cubin" and "host_platform" not in art
            assert art["path"] == layout.kind_relpath("triton-cubin", arch, base) == layout.artifact_relpath(arch, base)


def test_committed_manifests_record_kinds():
    """All seven committed manifests: every artifact is a triton-cubin or (CuTe lane) a cute-so per host platform, at
    the path layout.py gives."""
    for arch in ALL_ARCHS:
        doc = manifest.load(manifest.manifest_path(REPO, arch))
        assert manifest.schema_errors(REPO, doc) == []
        for base, k in doc["kernels"].items():
            if "artifacts" in k:
                assert [a["host_platform"] for a in k["artifacts"]] == list(layout.HOST_PLATFORMS), base
                for a in k["artifacts"]:
                    assert a["kind"] == "cute-so" and a["loader"] == "cute-so"
                    assert a["path"] == layout.kind_relpath("cute-so", arch, base, a["host_platform"])
                continue
            assert k["artifact"]["kind"] == "triton-cubin" and k["artifact"]["loader"] == "triton-cubin"
            assert k["artifact"]["path"] == layout.kind_relpath("triton-cubin", arch, base)
        assert (doc["toolchain"]["cutlass_dsl"] is None) == all("artifacts" not in k for k in doc["kernels"].values())


def test_schema_kinds_match_the_contract():
    """The schema's artifact definitions, layout.ARTIFACT_KINDS and verify's checker registry name the same kinds."""
    from vkc import kinds

    s = json.loads((REPO / "manifests/schema.json").read_text())["$defs"]
    in_schema = {s[d]["properties"]["kind"]["const"] for d in ("cubin_artifact", "so_artifact")}
    assert in_schema == set(layout.ARTIFACT_KINDS) == set(kinds.CHECKERS)
    assert set(s["so_artifact"]["properties"]["host_platform"]["enum"]) == set(layout.HOST_PLATFORMS)
    assert "host_platform" not in s["cubin_artifact"]["properties"]  # forbidden for device code
    assert "host_platform" in s["so_artifact"]["required"]  # required for host code
    for name, k in layout.ARTIFACT_KINDS.items():
        assert k.name == name and k.suffix.startswith(".") and k.host == (name == "cute-so")


def test_layout_paths_per_kind():
    assert layout.kind_relpath("triton-cubin", "sm_90a", "norm.rmsnorm.b2048") == "vendored/sm_90a/norm/rmsnorm.b2048.cubin"
    assert layout.kind_relpath("cute-so", "sm_100a", "gemm.bf16_nt", "aarch64") == "vendored/sm_100a/gemm/gemm.aarch64.so"
    with pytest.raises(ValueError, match="host platform"):
        layout.kind_relpath("cute-so", "sm_90a", "gemm.x")
    with pytest.raises(ValueError, match="no host platform"):
        layout.kind_relpath("triton-cubin", "sm_90a", "gemm.x", "x86_64")
    with pytest.raises(ValueError, match="unknown artifact kind"):
        layout.kind_relpath("ptx", "sm_90a", "gemm.x")
    assert layout.current_host_platform() in (*layout.HOST_PLATFORMS, None)


def test_verify_does_not_import_triton(built):
    code = ("import sys; from pathlib import Path; from vkc import verify; "
            f"assert verify.verify(Path({str(built)!r}), {ARCHS!r}) == []; "
            "assert 'triton' not in sys.modules, 'verify imported triton'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_build_side_never_imports_vkc_runtime(built):
    """Statically: no module of aot/vkc imports vkc_runtime; dynamically: importing every one of them and
    running verify, regen's manifest code and the root finders leaves vkc_runtime out of sys.modules."""
    mods = sorted(p.stem for p in (REPO / "aot/vkc").glob("*.py") if p.stem != "__init__")
    for m in mods:
        tree = ast.parse((REPO / "aot/vkc" / f"{m}.py").read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "vkc_runtime" for n in names), f"aot/vkc/{m}.py imports {names}"
    code = ("import sys, importlib; from pathlib import Path; "
            f"[importlib.import_module('vkc.' + m) for m in {mods!r}]; "
            "from vkc import verify, discover; "
            f"assert verify.verify(Path({str(built)!r}), {ARCHS!r}) == []; "
            "discover.find_artifact_root(); discover.installed_artifact_root(); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'vkc_runtime'); "
            "assert not bad, bad; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


# ------------------------------------------------------------------ CLI

def test_cli_verify_exit_code(tree):
    (tree / "vendored/sm_80/selftest/empty.cubin").unlink()
    out = subprocess.run([sys.executable, "-m", "vkc_cli", "verify", "--root", str(tree), "--arch", "sm_80"],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "DRIFT sm_80: selftest.empty: artifact vendored/sm_80/selftest/empty.cubin is missing" in out.stderr


def test_cli_verify_and_inspect_outside_any_root(tmp_path):
    """No checkout and no installed artifacts: one clear line, non-zero exit, no traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ("VKC_ROOT", "VKC_ARTIFACT_ROOT")}
    for cmd in ("verify", "inspect"):
        out = subprocess.run([sys.executable, "-m", "vkc_cli", cmd, "--root", str(tmp_path)],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
        assert out.returncode == 1, out.stdout + out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"Error: --root {tmp_path}: ") and "neither a vkc checkout" in lines[0], lines


def test_no_checkout_and_no_install(monkeypatch, tmp_path):
    """Neither found from the cwd nor around the package, no VKC_ARTIFACT_ROOT, no installed artifacts."""
    from click.testing import CliRunner

    from vkc import discover
    from vkc_cli.main import main

    def no_checkout(start=None):
        raise FileNotFoundError("no checkout")
    monkeypatch.delenv("VKC_ROOT", raising=False)
    monkeypatch.delenv("VKC_ARTIFACT_ROOT", raising=False)
    monkeypatch.setattr(discover, "find_root", no_checkout)
    monkeypatch.setattr(discover, "installed_artifact_root", lambda: None)
    with pytest.raises(FileNotFoundError, match="no vkc checkout .* and no installed vkc artifacts found"):
        discover.find_artifact_root()
    for cmd in ("verify", "inspect"):
        r = CliRunner().invoke(main, [cmd])
        assert r.exit_code == 1 and r.output.startswith("Error: no vkc checkout"), r.output
        assert len(r.output.strip().splitlines()) == 1, r.output
    monkeypatch.setenv("VKC_ARTIFACT_ROOT", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="is not an artifact root"):
        discover.find_artifact_root()
    (tmp_path / "manifests").mkdir()
    assert discover.find_artifact_root() == (tmp_path.resolve(), "installed")


def test_cli_inspect_json(built):
    out = subprocess.run([sys.executable, "-m", "vkc_cli", "inspect", "--root", str(built), "--arch", "sm_90a",
                          "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert sorted(r["base"] for r in rows) == ["selftest.abi_probe", "selftest.empty", "selftest.scale_add.b1024"]
    assert all(r["kind"] == "triton-cubin" and r["arch"] == "sm_90a" for r in rows)


# ------------------------------------------------------------------ rebuild

def test_rebuild_catches_forged_bytes(tree):
    """A cubin replaced (and its manifest entry resealed to match) passes the fast checks' hash test but not
    `--rebuild`, which compiles the tree again elsewhere and compares every byte."""
    f = tree / "vendored/sm_80/selftest/empty.cubin"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF  # past the section data the ELF reader looks at
    f.write_bytes(bytes(data))

    def forge(doc):
        from vkc_contract.hashing import sha256_bytes
        doc["kernels"]["selftest.empty"]["artifact"]["sha256"] = sha256_bytes(bytes(data))
    edit_manifest(tree, "sm_80", forge)
    P = verify.rebuild_compare(tree, ["sm_80"], jobs=2)
    assert_found(P, "rebuilt-manifest", "rebuilt manifest differs from manifests/sm_80.json")
    assert_found(P, "rebuilt-artifact", "rebuilt vendored/sm_80/selftest/empty.cubin differs from the committed bytes")


def test_committed_tree_rebuilds_byte_identical():
    """`vkc verify --rebuild` on the real tree for two archs: every committed cubin and manifest is exactly what
    the pinned toolchain produces from kernels_src/ in another directory (and every kernel's PTX .param list
    matches the packer's, which regen checks)."""
    assert verify.verify(REPO, ["sm_80", "sm_90a"]) == []
    from vkc import cute_lane
    try:  # sm_90a holds CuTe kernels: rebuilding it needs the DSL (make cute-env / VKC_CUTE_PYTHON)
        cute_lane.dsl_python(REPO)
        archs = ["sm_80", "sm_90a"]
    except cute_lane.CuteLaneError as e:
        archs = ["sm_80"]
        print(f"sm_90a not rebuilt: {e}")  # tests/test_cute_lane.py names the skip of the CuTe rebuild too
    assert verify.rebuild_compare(REPO, archs, jobs=2) == []
