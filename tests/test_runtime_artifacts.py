"""Artifact root discovery, manifests, arch selection and fallbacks, completeness and integrity (CPU)."""
from __future__ import annotations

import json

import pytest

from vkc_contract import arch as A
from vkc_runtime import artifacts
from vkc_runtime.errors import ArtifactError, MissingKernelError
from vkc_contract.hashing import IntegrityError, sha256_bytes

try:
    from .runtime_support import add_kernel, clean_env, make_root  # noqa: F401
except ImportError:  # tests/ not a package
    from runtime_support import add_kernel, clean_env, make_root  # noqa: F401


@pytest.fixture(autouse=True)
def _env(clean_env):
    yield clean_env


# ----------------------------------------------------------------------------------- arch selection
def test_candidates_never_use_arch_specific_fallbacks():
    for major in range(7, 13):
        for minor in range(0, 10):
            c = A.candidates_for_cc((major, minor))
            for i, name in enumerate(c):
                a = A.ARCHS[name]
                if a.arch_specific:
                    assert i == 0 and a.cc == (major, minor), (major, minor, c)
                else:
                    assert a.cc[0] == major and a.cc[1] <= minor


@pytest.mark.parametrize("cc,have,want,how", [
    ((9, 0), ["sm_90a", "sm_80"], "sm_90a", "exact"),
    ((8, 6), ["sm_86", "sm_80"], "sm_86", "exact"),
    ((8, 6), ["sm_80"], "sm_80", "fallback"),
    ((8, 9), ["sm_86", "sm_80"], "sm_86", "fallback"),
    ((8, 9), ["sm_80"], "sm_80", "fallback"),
    ((8, 7), ["sm_86", "sm_80"], "sm_86", "fallback"),
    ((12, 1), ["sm_121a", "sm_120a"], "sm_121a", "exact"),
    ((8, 0), ["sm_80", "sm_86"], "sm_80", "exact"),
])
def test_select_arch(tmp_path, cc, have, want, how):
    root = make_root(tmp_path, arches=have)
    assert artifacts.select_arch_info(cc, root) == (want, how)
    assert artifacts.select_arch(cc, root) == want


@pytest.mark.parametrize("cc,have", [
    ((12, 1), ["sm_120a"]),      # a-suffixed cubins never serve another cc
    ((9, 0), ["sm_80", "sm_86"]),  # different major
    ((10, 0), ["sm_90a"]),
    ((8, 0), ["sm_86", "sm_89"]),  # higher minor never runs on a lower one
])
def test_select_arch_refuses_incompatible(tmp_path, cc, have):
    root = make_root(tmp_path, arches=have)
    with pytest.raises(MissingKernelError) as ei:
        artifacts.select_arch(cc, root)
    assert isinstance(ei.value, ImportError)
    assert "vkc regen --arch" in str(ei.value)


def test_select_arch_unknown_cc(tmp_path):
    root = make_root(tmp_path, arches=["sm_80"])
    with pytest.raises(MissingKernelError, match="no arch for compute capability 7.5"):
        artifacts.select_arch((7, 5), root)


def test_vkc_arch_override(tmp_path, clean_env):
    root = make_root(tmp_path, arches=["sm_86", "sm_80"])
    clean_env.setenv("VKC_ARCH", "sm_80")
    assert artifacts.select_arch_info((8, 6), root) == ("sm_80", "env")
    assert artifacts.select_arch_info(None, root) == ("sm_80", "env")  # no device: trusted as is
    clean_env.setenv("VKC_ARCH", "sm_99")
    with pytest.raises(ValueError, match="unknown arch 'sm_99'"):
        artifacts.select_arch((8, 6), root)
    clean_env.setenv("VKC_ARCH", "sm_86")
    with pytest.raises(ValueError, match="cannot run on this device"):
        artifacts.select_arch((8, 0), root)  # sm_86 cubins need minor >= 6
    clean_env.setenv("VKC_ARCH", "sm_90a")
    with pytest.raises(ValueError, match="arch-specific"):
        artifacts.select_arch((10, 0), root)
    clean_env.setenv("VKC_ARCH", "sm_89")  # valid for the device, but no manifest
    with pytest.raises(MissingKernelError, match="no manifest sm_89.json"):
        artifacts.select_arch((8, 9), root)


def test_select_arch_without_cc_or_env(tmp_path):
    with pytest.raises(ValueError):
        artifacts.select_arch(None, make_root(tmp_path))


# ----------------------------------------------------------------------------------- root discovery
def test_find_root_env(tmp_path, clean_env):
    root = make_root(tmp_path)
    clean_env.setenv("VKC_ARTIFACT_ROOT", str(root))
    assert artifacts.find_root_info() == (root.resolve(), "env")
    clean_env.setenv("VKC_ARTIFACT_ROOT", str(tmp_path / "nope"))
    with pytest.raises(ArtifactError, match="VKC_ARTIFACT_ROOT"):
        artifacts.find_root()


def test_find_root_package_dir_wins_over_source_tree(tmp_path, monkeypatch):
    pkg_art = tmp_path / "site" / "vkc_runtime" / "artifacts"
    (pkg_art / "manifests").mkdir(parents=True)
    monkeypatch.setattr(artifacts, "_PKG_ARTIFACTS", pkg_art)
    assert artifacts.find_root_info() == (pkg_art, "package")


def test_find_root_walks_up_to_source_tree(tmp_path, monkeypatch):
    tree = tmp_path / "src"
    (tree / "manifests").mkdir(parents=True)
    (tree / "manifests" / "schema.json").write_text("{}")
    fake_file = tree / "runtime" / "vkc_runtime" / "artifacts.py"
    fake_file.parent.mkdir(parents=True)
    fake_file.write_text("")
    monkeypatch.setattr(artifacts, "_PKG_ARTIFACTS", tmp_path / "no" / "artifacts")
    monkeypatch.setattr(artifacts, "__file__", str(fake_file))
    assert artifacts.find_root_info() == (tree.resolve(), "source-tree")
    (tree / "manifests" / "schema.json").unlink()
    assert artifacts.find_root_info()[0] != tree.resolve()


# ----------------------------------------------------------------------------------- manifests
def test_load_manifest_errors(tmp_path):
    root = make_root(tmp_path)
    mp = root / "manifests" / "sm_90a.json"
    doc = json.loads(mp.read_text())
    assert artifacts.load_manifest(root, "sm_90a")["arch"] == "sm_90a"
    mp.write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        artifacts.load_manifest(root, "sm_90a")
    mp.write_text(json.dumps({**doc, "schema_version": 2}))
    with pytest.raises(ArtifactError, match="schema_version 2"):
        artifacts.load_manifest(root, "sm_90a")
    mp.write_text(json.dumps({**doc, "arch": "sm_80", "x": 1}))
    with pytest.raises(ArtifactError, match="for arch 'sm_80'"):
        artifacts.load_manifest(root, "sm_90a")
    with pytest.raises(FileNotFoundError):
        artifacts.load_manifest(root, "sm_80")
    with pytest.raises(ValueError, match="unknown arch"):
        artifacts.load_manifest(root, "sm_75")


def test_check_complete_reports_each_problem(tmp_path):
    root = make_root(tmp_path, bases=("norm.a", "norm.b", "norm.c"))
    aset = artifacts.ArtifactSet(root, "sm_90a")
    assert aset.bases() == ["norm.a", "norm.b", "norm.c"]
    assert aset.check_complete({"norm.a", "norm.b", "norm.c"}) == []
    aset.path("norm.b").unlink()
    aset.path("norm.c").write_bytes(aset.path("norm.c").read_bytes() + b"x")
    probs = aset.check_complete({"norm.a", "norm.b", "norm.c", "norm.zzz"})
    assert len(probs) == 3
    assert probs[0].startswith("norm.b: file missing")
    assert probs[1].startswith("norm.c: size mismatch")
    assert probs[2] == "norm.zzz: not in manifest sm_90a.json"


def test_read_verified_refuses_modified_bytes(tmp_path):
    root = make_root(tmp_path, bases=("norm.a",), data=b"A" * 64)
    aset = artifacts.ArtifactSet(root, "sm_90a")
    assert aset.read_verified("norm.a") == b"A" * 64
    aset.path("norm.a").write_bytes(b"B" * 64)  # same size: only the hash can tell
    assert aset.check_complete({"norm.a"}) == []
    with pytest.raises(IntegrityError) as ei:
        aset.read_verified("norm.a")
    msg = str(ei.value)
    assert str(aset.path("norm.a")) in msg
    assert sha256_bytes(b"A" * 64) in msg and sha256_bytes(b"B" * 64) in msg
    assert aset.check_hashes() == [f"norm.a: sha256 mismatch: manifest {sha256_bytes(b'A' * 64)}, "
                                   f"file {sha256_bytes(b'B' * 64)}"]


def test_entry_missing_and_path_traversal(tmp_path):
    root = make_root(tmp_path, bases=("norm.a",))
    aset = artifacts.ArtifactSet(root, "sm_90a")
    with pytest.raises(MissingKernelError, match="'norm.nope' is not in manifest"):
        aset.entry("norm.nope")
    aset.kernels["norm.a"]["artifact"]["path"] = "../../etc/passwd"
    with pytest.raises(ArtifactError, match="must be relative"):
        aset.path("norm.a")


def test_launch_spec_parsing(tmp_path):
    root = make_root(tmp_path, bases=("norm.a",), shared=65536, num_warps=8, gss=256, gsa=128)
    spec = artifacts.ArtifactSet(root, "sm_90a").launch_spec("norm.a")
    assert spec.codes == "pifpp"
    assert spec.names == ["x", "n_cols", "eps", "global_scratch", "profile_scratch"]
    assert spec.divisibility == [16, 0, 0, 0, 0]
    assert (spec.block_x, spec.shared, spec.n_visible) == (256, 65536, 3)
    assert (spec.global_scratch_size, spec.global_scratch_align) == (256, 128)


def test_launch_spec_rejects_inconsistent_params(tmp_path):
    root = make_root(tmp_path, bases=("norm.a",))
    entry = artifacts.ArtifactSet(root, "sm_90a").entry("norm.a")
    bad = json.loads(json.dumps(entry))
    bad["params"][2]["code"] = "d"  # fp32 must be 'f' (4 bytes), never a double
    with pytest.raises(ArtifactError, match="param 'eps' type fp32 must have code 'f' size 4"):
        artifacts.LaunchSpec.from_entry("norm.a", bad)
    bad = json.loads(json.dumps(entry))
    bad["params"] = bad["params"][:-1]
    with pytest.raises(ArtifactError, match="hidden params"):
        artifacts.LaunchSpec.from_entry("norm.a", bad)
    bad = json.loads(json.dumps(entry))
    del bad["launch"]["num_warps"]
    with pytest.raises(ArtifactError, match="bad 'launch' record"):
        artifacts.LaunchSpec.from_entry("norm.a", bad)


def test_manifest_cache_rereads_changed_file(tmp_path):
    root = make_root(tmp_path, bases=("norm.a",))
    assert "norm.b" not in artifacts.ArtifactSet(root, "sm_90a")
    add_kernel(root, "sm_90a", "norm.b", data=b"different length data")
    assert "norm.b" in artifacts.ArtifactSet(root, "sm_90a")
