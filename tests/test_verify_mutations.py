"""`vkc verify` mutation suite: every check registered in aot/vkc/checks.py has a test here (or in
tests/test_verify_kinds.py / tests/test_aot_regen_verify.py) that breaks one thing in a copy of the small
regenerated tree and asserts that check's own message; :func:`test_every_check_has_a_mutation_test` fails
when a check is added without one."""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from vkc import checks, manifest, verify
from vkc_contract.hashing import sha256_bytes
from tests.aot_tree import (REPO, artifact_root, assert_caught, built_tree, copy_tree, edit_manifest,
                            problems)

pytest.importorskip("triton", reason="regen needs the pinned Triton (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return built_tree(tmp_path_factory)


@pytest.fixture()
def tree(built, tmp_path) -> Path:
    return copy_tree(built, tmp_path / "copy")


@pytest.fixture()
def installed(built, tmp_path) -> Path:
    return artifact_root(built, tmp_path / "artifacts")


def replace_artifact(tree: Path, arch: str, base: str, data: bytes) -> None:
    """Swap an artifact's bytes and reseal its manifest entry to match (a careful forger)."""
    name = base.split(".", 1)[1]
    (tree / f"vendored/{arch}/selftest/{name}.cubin").write_bytes(data)

    def fix(doc):
        doc["kernels"][base]["artifact"].update(sha256=sha256_bytes(data), size=len(data))
    edit_manifest(tree, arch, fix)


def spec_edit(tree: Path, old: str, new: str) -> None:
    s = tree / "kernels_src/selftest/spec.py"
    text = s.read_text()
    assert old in text, old
    s.write_text(text.replace(old, new))


SCALE_ADD = 'constexprs={"BLOCK": 1024}, num_warps=4'


# ------------------------------------------------------------------ coverage of the check registry

TEST_FILES = ("test_verify_mutations.py", "test_verify_kinds.py", "test_aot_regen_verify.py", "test_wheel_verify.py")


def _asserted_checks() -> set[str]:
    found = set()
    for name in TEST_FILES:
        tree = ast.parse((REPO / "tests" / name).read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("assert_caught", "assert_found") and len(node.args) >= 3
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[2], ast.Constant)):
                found.add(node.args[1].value)
    return found


def _used_checks() -> set[str]:
    used = set()
    for f in (REPO / "aot/vkc").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                fn = node.func
                if (isinstance(fn, ast.Name) and fn.id == "problem") or (isinstance(fn, ast.Attribute) and fn.attr == "p"):
                    used.add(node.args[0].value)
    return used


def test_every_check_has_a_mutation_test():
    missing = sorted(set(checks.CHECKS) - _asserted_checks())
    assert not missing, f"checks without a mutation test asserting their message: {missing}"


def test_every_registered_check_is_used_and_every_used_check_registered():
    used = _used_checks()
    assert used - set(checks.CHECKS) == set(), "problem() called with unregistered ids"
    assert set(checks.CHECKS) - used == set(), "registered checks that no code reports (dead templates)"


# ------------------------------------------------------------------ tree level

def test_schema_missing(tree):
    (tree / "manifests/schema.json").unlink()
    assert_caught(tree, "schema-missing", "manifests/schema.json is missing; restore it from git")


def test_stray_manifest(tree):
    shutil.copy2(tree / "manifests/sm_80.json", tree / "manifests/sm_99.json")
    assert_caught(tree, "stray-manifest", "manifests/sm_99.json is not a known arch manifest")


def test_stray_arch_dir(tree):
    shutil.copytree(tree / "vendored/sm_80", tree / "vendored/sm_99")
    assert_caught(tree, "stray-arch-dir", "vendored/sm_99 is not a known arch")


# ------------------------------------------------------------------ manifest document

def test_missing_manifest(tree):
    manifest.manifest_path(tree, "sm_80").unlink()
    assert_caught(tree, "manifest-missing", "manifest manifests/sm_80.json is missing")


def test_manifest_not_json(tree):
    manifest.manifest_path(tree, "sm_80").write_text('{"schema_version": 1,')
    assert_caught(tree, "manifest-json", "manifests/sm_80.json is not valid JSON")


def test_schema_violation(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["kernels"]["selftest.empty"].update(extra_field=1))
    assert_caught(tree, "schema-violation", "violates manifests/schema.json at kernels/selftest.empty")


def test_host_platform_is_forbidden_on_a_cubin(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["kernels"]["selftest.empty"]["artifact"].update(host_platform="x86_64"))
    assert_caught(tree, "schema-violation", "'host_platform' was unexpected")


def test_unknown_artifact_kind_is_a_schema_violation(tree):
    edit_manifest(tree, "sm_80", lambda d: d["kernels"]["selftest.empty"]["artifact"].update(kind="ptx"))
    assert_caught(tree, "schema-violation", "kernels/selftest.empty/artifact/kind: 'triton-cubin' was expected")


def test_noncanonical_manifest(tree):
    p = manifest.manifest_path(tree, "sm_90a")
    p.write_text(json.dumps(json.loads(p.read_text()), indent=4))
    assert_caught(tree, "noncanonical", "manifests/sm_90a.json is not in canonical form")


def test_manifest_hand_edit_is_caught_by_digest(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["kernels"]["selftest.empty"]["launch"].update(shared=4096),
                  reseal=False)
    assert_caught(tree, "digest", "manifests/sm_90a.json digest mismatch")


def test_manifest_arch(tree):
    edit_manifest(tree, "sm_80", lambda d: d.update(arch="sm_86"))
    assert_caught(tree, "manifest-arch", "sm_80: manifests/sm_80.json says arch sm_86")


def test_manifest_target(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["target"].update(cc=100))
    assert_caught(tree, "target-cc", "sm_90a: target cc 100 != 90")


# ------------------------------------------------------------------ toolchain pins and generator

def test_triton_pin_in_manifest(tree):
    edit_manifest(tree, "sm_80", lambda d: d["toolchain"].update(triton="3.6.0"))
    assert_caught(tree, "triton-pin", "built with triton 3.6.0, pinned 3.9.0")


def test_python_pin_in_manifest(tree):
    edit_manifest(tree, "sm_80", lambda d: d["toolchain"].update(python="3.12"))
    assert_caught(tree, "python-pin", "built with python 3.12, pinned 3.11")


def test_python_pin_in_project(tree, monkeypatch):
    from vkc import toolchain
    monkeypatch.setattr(toolchain, "PYTHON_VERSION", "3.13")
    assert_caught(tree, "python-pin", "sm_90a: built with python 3.11, pinned 3.13")


def test_ptxas_pin_in_manifest(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["toolchain"]["ptxas"].update(version="13.0.1"))
    assert_caught(tree, "ptxas-pin", "'version': '13.0.1'")


def test_ptxas_pin_in_project(tree, monkeypatch):
    from vkc import toolchain
    monkeypatch.setitem(toolchain.PTXAS, "ptxas", {"version": "12.8.93", "sha256": "1" * 64})
    P = assert_caught(tree, "ptxas-pin", "!= pinned ptxas {'version': '12.8.93'")
    assert not any(p.startswith("sm_90a:") for p in P), P  # sm_90a uses ptxas-blackwell


def test_line_info_policy(tree, monkeypatch):
    from vkc import toolchain
    monkeypatch.setattr(toolchain, "LINE_INFO", True)  # the schema pins false in manifests themselves
    assert_caught(tree, "line-info", "line info policy differs (manifest False, pinned True)")


def test_generator_change(tree):
    with open(tree / "aot/vkc/compile.py", "a") as f:
        f.write("\n# edited\n")
    assert_caught(tree, "generator", "generator (aot/ sources) changed since regen")


def test_tactic_set_drift(tree):
    edit_manifest(tree, "sm_80", lambda d: d["tactics"].update(count=1, digest="0" * 64))
    assert_caught(tree, "tactics", "GEMM tactic set recorded as v1 count 1 digest 000000000000 bases [], the "
                                   "manifest's kernels give v1 count 0 digest 4f53cda18c2b")


def test_contract_change_is_a_generator_change(tree):
    with open(tree / "contract/vkc_contract/layout.py", "a") as f:
        f.write("\n# edited\n")
    assert_caught(tree, "generator", "generator (aot/ sources) changed since regen")


# ------------------------------------------------------------------ sources and specs

def test_changed_kernel_source(tree):
    with open(tree / "kernels_src/selftest/abi.py", "a") as f:
        f.write("\n# edited\n")
    assert_caught(tree, "source-changed", "source kernels_src/selftest/abi.py changed since regen")


def test_changed_helper_module(tree):
    with open(tree / "kernels_src/selftest/common.py", "a") as f:
        f.write("\n# edited\n")
    assert_caught(tree, "source-changed", "source kernels_src/selftest/common.py changed since regen")


def test_recorded_source_disappeared(tree):
    (tree / "kernels_src/selftest/common.py").unlink()
    assert_caught(tree, "source-missing", "source kernels_src/selftest/common.py recorded in the manifest is missing")


def test_new_helper_import(tree):
    (tree / "kernels_src/selftest/extra.py").write_text("X = 1\n")
    src = tree / "kernels_src/selftest/abi.py"
    src.write_text("from kernels_src.selftest import extra  # noqa\n" + src.read_text())
    assert_caught(tree, "source-unrecorded", "kernels_src/selftest/extra.py is imported by a kernel but not recorded")


def test_unparsable_kernel_source(tree):
    src = tree / "kernels_src/selftest/abi.py"
    src.write_text(src.read_text() + "\ndef broken(:\n")
    assert_caught(tree, "source-unscannable", "selftest.empty: cannot scan its source")


def test_unreadable_specs(tree):
    tdir = tree / "kernels_src/selftest/tuning"
    tdir.mkdir()
    (tdir / "sm_90a.json").write_text('{"nope": {"num_warps": 8}}\n')
    P = assert_caught(tree, "specs-unreadable", "cannot read the specs: kernels_src/selftest/tuning/sm_90a.json "
                      "tunes unknown specs ['nope']")
    assert not any(p.startswith("sm_80:") for p in P), P


def test_added_spec(tree):
    s = tree / "kernels_src/selftest/spec.py"
    s.write_text(s.read_text() + '\nSPECS.append(KernelSpec(name="empty2", source="abi.py", entry="empty_kernel",'
                 ' args=[Arg("x_ptr", "*i8"), Arg("n", "i32")], num_warps=1))\n')
    assert_caught(tree, "spec-added", "spec selftest.empty2 has no artifact")


def test_removed_spec(tree):
    s = tree / "kernels_src/selftest/spec.py"
    s.write_text(s.read_text() + "\nSPECS.pop()\n")
    assert_caught(tree, "spec-removed", "manifest has selftest.empty but no spec defines it")


def test_changed_num_warps(tree):
    spec_edit(tree, SCALE_ADD, 'constexprs={"BLOCK": 1024}, num_warps=8')
    assert_caught(tree, "spec-input", "selftest.scale_add.b1024: spec input 'num_warps' changed (4 -> 8)")


def test_changed_num_stages(tree):
    spec_edit(tree, SCALE_ADD, SCALE_ADD + ", num_stages=3")
    assert_caught(tree, "spec-input", "selftest.scale_add.b1024: spec input 'num_stages' changed (1 -> 3)")


def test_changed_num_ctas(tree):
    spec_edit(tree, SCALE_ADD, SCALE_ADD + ', overrides={"sm_90a": {"num_ctas": 2}}')
    P = assert_caught(tree, "spec-input", "sm_90a: selftest.scale_add.b1024: spec input 'num_ctas' changed (1 -> 2)")
    assert not any(p.startswith("sm_80:") and "'num_ctas'" in p for p in P), P


def test_changed_options(tree):
    spec_edit(tree, SCALE_ADD, SCALE_ADD + ', options={"enable_fp_fusion": False}')
    assert_caught(tree, "spec-input", "spec input 'options' changed ({'enable_fp_fusion': True} -> "
                  "{'enable_fp_fusion': False})")


def test_changed_constexpr(tree):
    spec_edit(tree, 'constexprs={"BLOCK": 1024}', 'constexprs={"BLOCK": 2048}')
    assert_caught(tree, "spec-input", "spec input 'constexprs' changed")


def test_changed_signature_hint(tree):
    spec_edit(tree, 'Arg("x_ptr", "*fp32", div=16)', 'Arg("x_ptr", "*fp32")')
    assert_caught(tree, "spec-input", "spec input 'signature' changed")


def test_per_arch_override(tree):
    spec_edit(tree, SCALE_ADD, SCALE_ADD + ', overrides={"sm_80": {"num_warps": 2}}')
    P = assert_caught(tree, "spec-input", "sm_80: selftest.scale_add.b1024: spec input 'num_warps' changed (4 -> 2)")
    assert not any(p.startswith("sm_90a:") for p in P), P  # only the overridden arch drifts


def test_tuning_data_change(tree):
    tdir = tree / "kernels_src/selftest/tuning"
    tdir.mkdir()
    (tdir / "sm_80.json").write_text('{"scale_add.b1024": {"num_warps": 8}}\n')
    P = assert_caught(tree, "spec-input", "sm_80: selftest.scale_add.b1024: spec input 'num_warps' changed")
    assert not any(p.startswith("sm_90a:") for p in P), P


def test_param_list_edit_resealed(tree):
    def fix(doc):
        k = doc["kernels"]["selftest.scale_add.b1024"]
        k["params"][4].update(type="fp64", code="d", size=8)  # the C-double mistake
    edit_manifest(tree, "sm_80", fix)
    P = assert_caught(tree, "params-signature", "selftest.scale_add.b1024: parameter list does not follow its signature")
    assert any(p.check == "param-sizes" for p in P), P


def test_untracked_artifact(tree):
    subprocess.run(["git", "-C", str(tree), "rm", "-q", "--cached", "vendored/sm_90a/selftest/empty.cubin"],
                   check=True)
    assert_caught(tree, "untracked", "1 file(s) not tracked by git (vendored/sm_90a/selftest/empty.cubin)")


def test_untracked_manifest(tree):
    subprocess.run(["git", "-C", str(tree), "rm", "-q", "--cached", "manifests/sm_80.json"], check=True)
    assert_caught(tree, "untracked", "1 file(s) not tracked by git (manifests/sm_80.json)")


def test_extra_artifact(tree):
    (tree / "vendored/sm_80/selftest/stray.cubin").write_bytes(b"\x7fELF")
    assert_caught(tree, "extra-file", "extra file vendored/sm_80/selftest/stray.cubin is not in the manifest")


# ------------------------------------------------------------------ triton-cubin artifacts

def test_loader_mismatch(tree):
    edit_manifest(tree, "sm_80", lambda d: d["kernels"]["selftest.empty"]["artifact"].update(loader="cute-so"))
    assert_caught(tree, "kind-loader", "vendored/sm_80/selftest/empty.cubin is a triton-cubin artifact, loaded by "
                  "triton-cubin, but the manifest names loader cute-so")


def test_artifact_path(tree):
    (tree / "vendored/sm_80/selftest/empty.cubin").rename(tree / "vendored/sm_80/selftest/empty2.cubin")
    edit_manifest(tree, "sm_80", lambda d: d["kernels"]["selftest.empty"]["artifact"].update(
        path="vendored/sm_80/selftest/empty2.cubin"))
    P = assert_caught(tree, "artifact-path",
                      "artifact path vendored/sm_80/selftest/empty2.cubin != vendored/sm_80/selftest/empty.cubin")
    assert not any(p.check == "extra-file" for p in P), P


def test_missing_artifact(tree):
    (tree / "vendored/sm_80/selftest/abi_probe.cubin").unlink()
    assert_caught(tree, "artifact-missing", "artifact vendored/sm_80/selftest/abi_probe.cubin is missing")


def test_modified_artifact(tree):
    f = tree / "vendored/sm_90a/selftest/empty.cubin"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    assert_caught(tree, "artifact-modified", "artifact vendored/sm_90a/selftest/empty.cubin was modified")


def test_manifest_artifact_hash_edit(tree):
    edit_manifest(tree, "sm_80", lambda d: d["kernels"]["selftest.empty"]["artifact"].update(sha256="0" * 64))
    assert_caught(tree, "artifact-modified", "was modified (sha256/size mismatch)")


def test_non_cubin_file(tree):
    replace_artifact(tree, "sm_80", "selftest.empty", b"not an ELF file at all, just text\n" * 4)
    assert_caught(tree, "not-cubin", "vendored/sm_80/selftest/empty.cubin is not a cubin (not a 64-bit ELF file)")


def test_host_elf_in_place_of_a_cubin(tree):
    replace_artifact(tree, "sm_80", "selftest.empty", Path("/bin/true").read_bytes()
                     if Path("/bin/true").is_file() else pytest.skip("no /bin/true"))
    assert_caught(tree, "not-cubin", "is not a cubin (ELF machine is not EM_CUDA)")


def test_wrong_arch_cubin(tree):
    replace_artifact(tree, "sm_90a", "selftest.empty", (tree / "vendored/sm_80/selftest/empty.cubin").read_bytes())
    assert_caught(tree, "cubin-sass", "vendored/sm_90a/selftest/empty.cubin holds SASS for sm_80, not sm_90a")


def test_resources_sass_fact(tree):
    edit_manifest(tree, "sm_80", lambda d: d["kernels"]["selftest.empty"]["resources"].update(sass_arch="sm_86"))
    assert_caught(tree, "resources-sass", "sm_80: selftest.empty: resources say SASS sm_86")


def test_launch_metadata_edit_resealed(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["kernels"]["selftest.scale_add.b1024"]["launch"].update(num_warps=8))
    assert_caught(tree, "launch-warps-ctas", "selftest.scale_add.b1024: launch num_warps/num_ctas differ")


def test_launch_num_ctas_edit_resealed(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["kernels"]["selftest.scale_add.b1024"]["launch"].update(num_ctas=2))
    assert_caught(tree, "launch-warps-ctas", "selftest.scale_add.b1024: launch num_warps/num_ctas differ")


def test_launch_name_edit_resealed(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["kernels"]["selftest.empty"]["launch"].update(name="other_kernel"))
    assert_caught(tree, "launch-name", "selftest.empty: launch name other_kernel != entry empty_kernel")


def test_entry_symbol_absent_from_cubin(tree):
    def fix(doc):
        k = doc["kernels"]["selftest.empty"]
        k["launch"]["name"] = k["inputs"]["entry"] = "other_kernel"
    edit_manifest(tree, "sm_90a", fix)
    P = assert_caught(tree, "entry-symbol", "selftest.empty: vendored/sm_90a/selftest/empty.cubin has no kernel "
                      "other_kernel")
    assert any(p.check == "spec-input" and "'entry'" in p for p in P), P


def test_reqntid(tree):
    def fix(doc):  # launch metadata and inputs agree with each other, but not with the cubin
        k = doc["kernels"]["selftest.scale_add.b1024"]
        k["launch"]["num_warps"] = k["inputs"]["num_warps"] = 8
    edit_manifest(tree, "sm_80", fix)
    assert_caught(tree, "reqntid", "selftest.scale_add.b1024: cubin requires 128 threads, launch metadata says 256")


def test_param_sizes(tree):
    def fix(doc):
        doc["kernels"]["selftest.scale_add.b1024"]["params"][3].update(type="i64", code="q", size=8)
    edit_manifest(tree, "sm_90a", fix)
    assert_caught(tree, "param-sizes", "cubin parameter sizes [8, 8, 8, 4, 4, 8, 8] != manifest [8, 8, 8, 8, 4, 8, 8]")


def test_pack_codes(tree):
    edit_manifest(tree, "sm_80", lambda d: d["kernels"]["selftest.scale_add.b1024"]["params"][3].update(code="I"))
    assert_caught(tree, "pack-codes", "selftest.scale_add.b1024: parameter pack codes inconsistent with types")


def test_spills(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["kernels"]["selftest.empty"]["resources"].update(spills=True, local=8))
    assert_caught(tree, "spills", "selftest.empty: spills recorded but not allowed by the spec")


def test_shared_memory_limit(tree):
    edit_manifest(tree, "sm_80", lambda d: d["kernels"]["selftest.empty"]["launch"].update(shared=163 * 1024 + 1))
    assert_caught(tree, "shared-memory", "selftest.empty: shared memory over sm_80's limit (166913 B > 166912 B)")


# ------------------------------------------------------------------ installed artifact roots (no sources)

def test_installed_root_verifies(installed):
    assert problems(installed, verify.INSTALLED) == []


def test_installed_root_without_manifests(installed):
    for a in ("sm_80", "sm_90a"):
        manifest.manifest_path(installed, a).unlink()
        shutil.rmtree(installed / "vendored" / a)
    assert_caught(installed, "no-installed-manifest", "holds no arch manifest", mode=verify.INSTALLED)


def test_installed_root_modified_artifact(installed):
    f = installed / "vendored/sm_90a/selftest/abi_probe.cubin"
    f.write_bytes(f.read_bytes()[:-1])
    assert_caught(installed, "artifact-modified", "artifact vendored/sm_90a/selftest/abi_probe.cubin was modified",
                  mode=verify.INSTALLED)


def test_installed_root_generator_is_the_installed_one(installed, monkeypatch):
    """In an install the generator hash is computed over the running vkc / vkc_contract files."""
    from vkc import discover
    real = discover.running_generator_file
    fake = installed / "fake_compile.py"
    fake.write_text("# another generator\n")
    monkeypatch.setattr(discover, "running_generator_file",
                        lambda rel: fake if rel == "aot/vkc/compile.py" else real(rel))
    assert_caught(installed, "generator", "generator (aot/ sources) changed since regen", mode=verify.INSTALLED)


def test_installed_root_stray_files(installed):
    (installed / "vendored/sm_80/selftest/x.cubin").write_bytes(b"1")
    P = assert_caught(installed, "extra-file", "extra file vendored/sm_80/selftest/x.cubin", mode=verify.INSTALLED)
    assert not any(p.check.startswith(("source", "spec")) for p in P), P
