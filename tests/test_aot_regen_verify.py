"""AOT pipeline: regen determinism across directories, manifest schema, and the verify mutation suite.

A small tree (the real aot/ + runtime/ generator and the selftest kernel family) is regenerated for two
archs into temp directories; each mutation test copies it, breaks one thing and checks verify names it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vkc import manifest, verify
from vkc.regen import regen

REPO = Path(__file__).resolve().parents[1]
ARCHS = ["sm_80", "sm_90a"]

pytest.importorskip("triton", reason="regen needs the pinned Triton (pip install -e '.[test]')")


def make_tree(dst: Path) -> Path:
    for rel in ("aot", "contract", "runtime"):
        shutil.copytree(REPO / rel, dst / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (dst / "kernels_src").mkdir(parents=True)
    shutil.copy2(REPO / "kernels_src/__init__.py", dst / "kernels_src/__init__.py")
    shutil.copytree(REPO / "kernels_src/selftest", dst / "kernels_src/selftest",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "manifests").mkdir()
    shutil.copy2(REPO / "manifests/schema.json", dst / "manifests/schema.json")
    return dst


def git_commit_all(root: Path) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "commit", "-qm", "x"], check=True, env=env)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = make_tree(tmp_path_factory.mktemp("a") / "tree")
    regen(root, ARCHS, jobs=2)
    git_commit_all(root)
    return root


@pytest.fixture()
def tree(built, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(built, dst)
    return dst


def problems(root: Path) -> list[str]:
    return verify.verify(root, ARCHS)


def assert_caught(root: Path, needle: str) -> None:
    P = problems(root)
    assert P, f"verify missed the mutation (expected {needle!r})"
    assert any(needle in p for p in P), f"expected {needle!r} in:\n" + "\n".join(P)
    assert all("vkc regen --arch" in p or "git add" in p or "delete it" in p for p in P), P


def edit_manifest(root: Path, arch: str, fn, reseal: bool = True) -> None:
    p = manifest.manifest_path(root, arch)
    doc = json.loads(p.read_text())
    fn(doc)
    if reseal:
        doc = manifest.seal(doc)
    p.write_bytes(manifest.canonical(doc))


# ------------------------------------------------------------------ determinism and schema

def test_clean_tree_verifies(built):
    assert problems(built) == []


def test_regen_is_byte_identical_from_another_directory(built, tmp_path):
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


def test_verify_does_not_import_triton(built):
    code = ("import sys; from pathlib import Path; from vkc import verify; "
            f"assert verify.verify(Path({str(built)!r}), {ARCHS!r}) == []; "
            "assert 'triton' not in sys.modules, 'verify imported triton'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# ------------------------------------------------------------------ mutation suite

def test_changed_kernel_source(tree):
    with open(tree / "kernels_src/selftest/abi.py", "a") as f:
        f.write("\n# edited\n")
    assert_caught(tree, "source kernels_src/selftest/abi.py changed since regen")


def test_changed_helper_module(tree):
    with open(tree / "kernels_src/selftest/common.py", "a") as f:
        f.write("\n# edited\n")
    assert_caught(tree, "source kernels_src/selftest/common.py changed since regen")


def test_new_helper_import(tree):
    (tree / "kernels_src/selftest/extra.py").write_text("X = 1\n")
    src = tree / "kernels_src/selftest/abi.py"
    src.write_text("from kernels_src.selftest import extra  # noqa\n" + src.read_text())
    assert_caught(tree, "kernels_src/selftest/extra.py is imported by a kernel but not recorded")


def test_changed_spec_pin(tree):
    s = tree / "kernels_src/selftest/spec.py"
    s.write_text(s.read_text().replace('constexprs={"BLOCK": 1024}, num_warps=4',
                                       'constexprs={"BLOCK": 1024}, num_warps=8'))
    assert_caught(tree, "spec input 'num_warps' changed")


def test_changed_constexpr(tree):
    s = tree / "kernels_src/selftest/spec.py"
    s.write_text(s.read_text().replace('constexprs={"BLOCK": 1024}', 'constexprs={"BLOCK": 2048}'))
    assert_caught(tree, "spec input 'constexprs' changed")


def test_changed_signature_hint(tree):
    s = tree / "kernels_src/selftest/spec.py"
    s.write_text(s.read_text().replace('Arg("x_ptr", "*fp32", div=16)', 'Arg("x_ptr", "*fp32")'))
    assert_caught(tree, "spec input 'signature' changed")


def test_added_spec(tree):
    s = tree / "kernels_src/selftest/spec.py"
    s.write_text(s.read_text() + '\nSPECS.append(KernelSpec(name="empty2", source="abi.py", entry="empty_kernel",'
                 ' args=[Arg("x_ptr", "*i8"), Arg("n", "i32")], num_warps=1))\n')
    assert_caught(tree, "spec selftest.empty2 has no artifact")


def test_removed_spec(tree):
    s = tree / "kernels_src/selftest/spec.py"
    s.write_text(s.read_text() + "\nSPECS.pop()\n")
    assert_caught(tree, "manifest has selftest.empty but no spec defines it")


def test_per_arch_override(tree):
    s = tree / "kernels_src/selftest/spec.py"
    s.write_text(s.read_text().replace('constexprs={"BLOCK": 1024}, num_warps=4',
                                       'constexprs={"BLOCK": 1024}, num_warps=4, overrides={"sm_80": {"num_warps": 2}}'))
    P = problems(tree)
    assert any(p.startswith("sm_80:") and "'num_warps' changed" in p for p in P), P
    assert not any(p.startswith("sm_90a:") for p in P), P  # only the overridden arch drifts


def test_modified_artifact(tree):
    f = tree / "vendored/sm_90a/selftest/empty.cubin"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    assert_caught(tree, "artifact vendored/sm_90a/selftest/empty.cubin was modified")


def test_missing_artifact(tree):
    (tree / "vendored/sm_80/selftest/abi_probe.cubin").unlink()
    assert_caught(tree, "artifact vendored/sm_80/selftest/abi_probe.cubin is missing")


def test_extra_artifact(tree):
    (tree / "vendored/sm_80/selftest/stray.cubin").write_bytes(b"\x7fELF")
    assert_caught(tree, "extra file vendored/sm_80/selftest/stray.cubin")


def test_untracked_artifact(tree):
    subprocess.run(["git", "-C", str(tree), "rm", "-q", "--cached", "vendored/sm_90a/selftest/empty.cubin"],
                   check=True)
    assert_caught(tree, "1 file(s) not tracked by git (vendored/sm_90a/selftest/empty.cubin)")


def test_wrong_arch_cubin(tree):
    src = (tree / "vendored/sm_80/selftest/empty.cubin").read_bytes()
    (tree / "vendored/sm_90a/selftest/empty.cubin").write_bytes(src)

    def fix(doc):  # a careful forger updates hash and size too
        from vkc_contract.hashing import sha256_bytes
        art = doc["kernels"]["selftest.empty"]["artifact"]
        art["sha256"], art["size"] = sha256_bytes(src), len(src)
    edit_manifest(tree, "sm_90a", fix)
    assert_caught(tree, "holds SASS for sm_80, not sm_90a")


def test_manifest_hand_edit_is_caught_by_digest(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["kernels"]["selftest.empty"]["launch"].update(shared=4096),
                  reseal=False)
    assert_caught(tree, "digest mismatch")


def test_manifest_artifact_hash_edit(tree):
    edit_manifest(tree, "sm_80", lambda d: d["kernels"]["selftest.empty"]["artifact"].update(sha256="0" * 64))
    assert_caught(tree, "was modified (sha256/size mismatch)")


def test_launch_metadata_edit_resealed(tree):
    def fix(doc):
        doc["kernels"]["selftest.scale_add.b1024"]["launch"]["num_warps"] = 8
    edit_manifest(tree, "sm_90a", fix)
    assert_caught(tree, "launch num_warps/num_ctas differ")


def test_launch_name_edit_resealed(tree):
    def fix(doc):
        k = doc["kernels"]["selftest.empty"]
        k["launch"]["name"] = k["inputs"]["entry"] = "other_kernel"
    edit_manifest(tree, "sm_90a", fix)
    assert_caught(tree, "spec input 'entry' changed")


def test_param_list_edit_resealed(tree):
    def fix(doc):
        k = doc["kernels"]["selftest.scale_add.b1024"]
        k["params"][4].update(type="fp64", code="d", size=8)  # the C-double mistake
    edit_manifest(tree, "sm_80", fix)
    P = problems(tree)
    assert any("parameter list does not follow its signature" in p for p in P), P
    assert any("cubin parameter sizes" in p for p in P), P


def test_toolchain_pin_change_in_manifest(tree):
    edit_manifest(tree, "sm_80", lambda d: d["toolchain"].update(triton="3.6.0"))
    assert_caught(tree, "built with triton 3.6.0, pinned 3.9.0")


def test_toolchain_pin_change_in_project(tree, monkeypatch):
    from vkc import toolchain
    monkeypatch.setitem(toolchain.PTXAS, "ptxas", {"version": "12.8.93", "sha256": "1" * 64})
    P = problems(tree)
    assert any(p.startswith("sm_80:") and "ptxas" in p for p in P), P
    assert not any(p.startswith("sm_90a:") for p in P), P  # sm_90a uses ptxas-blackwell


def test_generator_change(tree):
    with open(tree / "aot/vkc/compile.py", "a") as f:
        f.write("\n# edited\n")
    assert_caught(tree, "generator (aot/ sources) changed since regen")


def test_schema_violation(tree):
    edit_manifest(tree, "sm_90a", lambda d: d["kernels"]["selftest.empty"].update(extra_field=1))
    assert_caught(tree, "violates manifests/schema.json")


def test_missing_manifest(tree):
    manifest.manifest_path(tree, "sm_80").unlink()
    assert_caught(tree, "manifest manifests/sm_80.json is missing")


def test_noncanonical_manifest(tree):
    p = manifest.manifest_path(tree, "sm_90a")
    p.write_text(json.dumps(json.loads(p.read_text()), indent=4))
    assert_caught(tree, "not in canonical form")


def test_cli_verify_exit_code(tree):
    (tree / "vendored/sm_80/selftest/empty.cubin").unlink()
    env = {**os.environ}
    out = subprocess.run([sys.executable, "-m", "vkc_cli", "verify", "--root", str(tree), "--arch", "sm_80"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert "DRIFT sm_80: selftest.empty: artifact vendored/sm_80/selftest/empty.cubin is missing" in out.stderr


def test_tuning_data_change(tree):
    tdir = tree / "kernels_src/selftest/tuning"
    tdir.mkdir()
    (tdir / "sm_80.json").write_text('{"scale_add.b1024": {"num_warps": 8}}\n')
    P = problems(tree)
    assert any(p.startswith("sm_80:") and "selftest.scale_add.b1024: spec input 'num_warps' changed" in p
               for p in P), P
    assert not any(p.startswith("sm_90a:") for p in P), P


def test_tuning_data_for_unknown_spec(tree):
    tdir = tree / "kernels_src/selftest/tuning"
    tdir.mkdir()
    (tdir / "sm_90a.json").write_text('{"nope": {"num_warps": 8}}\n')
    P = problems(tree)
    assert any("cannot read the specs" in p and "tunes unknown specs ['nope']" in p for p in P), P


def test_committed_tree_rebuilds_byte_identical():
    """`vkc verify --rebuild` on the real tree for two archs: every committed cubin and manifest is exactly what
    the pinned toolchain produces from kernels_src/ in another directory (and every kernel's PTX .param list
    matches the packer's, which regen checks)."""
    assert verify.verify(REPO, ["sm_80", "sm_90a"]) == []
    assert verify.rebuild_compare(REPO, ["sm_80", "sm_90a"], jobs=2) == []
