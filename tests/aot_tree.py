"""A small regenerated vkc tree for the AOT tests (the real aot/ + contract/ + runtime/ and the selftest
family, compiled for sm_80 and sm_90a), built once per test session, plus helpers to mutate copies of it
and to assert that `vkc verify` names the mutation with the right check (:mod:`vkc.checks`)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from vkc import manifest, verify

REPO = Path(__file__).resolve().parents[1]
ARCHS = ["sm_80", "sm_90a"]
_BUILT: dict[str, Path] = {}


def make_tree(dst: Path) -> Path:
    for rel in ("aot", "contract", "runtime"):
        shutil.copytree(REPO / rel, dst / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (dst / "kernels_src").mkdir(parents=True)
    shutil.copy2(REPO / "kernels_src/__init__.py", dst / "kernels_src/__init__.py")
    shutil.copytree(REPO / "kernels_src/selftest", dst / "kernels_src/selftest",
                    ignore=shutil.ignore_patterns("__pycache__", "tuning"))
    (dst / "manifests").mkdir()
    shutil.copy2(REPO / "manifests/schema.json", dst / "manifests/schema.json")
    return dst


def git_commit_all(root: Path) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "commit", "-qm", "x"], check=True, env=env)


def built_tree(tmp_path_factory) -> Path:
    """The regenerated, git-committed small tree (one per session; never mutate it: copy it)."""
    if "tree" not in _BUILT:
        from vkc.regen import regen  # noqa: PLC0415 - needs triton

        root = make_tree(tmp_path_factory.mktemp("aot") / "tree")
        regen(root, ARCHS, jobs=2)
        git_commit_all(root)
        _BUILT["tree"] = root
    return _BUILT["tree"]


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def artifact_root(tree: Path, dst: Path) -> Path:
    """What a wheel installs: manifests/ + vendored/ only (no sources, no git)."""
    for rel in ("manifests", "vendored"):
        shutil.copytree(tree / rel, dst / rel)
    return dst


def problems(root: Path, mode: str = verify.CHECKOUT) -> list[verify.Problem]:
    archs = ARCHS if mode == verify.CHECKOUT else None
    return verify.verify(root, archs, mode=mode)


def assert_found(P: list, check: str, needle: str) -> None:
    """Some problem in ``P`` comes from check ``check`` and its message contains ``needle``."""
    assert P, f"verify missed the mutation (expected {check}: {needle!r})"
    assert check in verify.CHECKS, f"unknown check id {check!r}"
    assert any(p.check == check and needle in p for p in P), \
        f"expected [{check}] {needle!r} in:\n" + "\n".join(f"[{p.check}] {p}" for p in P)
    assert all("vkc regen --arch" in p or "git add" in p or "delete it" in p or "restore it" in p
               or "reinstall" in p for p in P), P  # every line says how to repair


def assert_caught(root: Path, check: str, needle: str, mode: str = verify.CHECKOUT) -> list:
    P = problems(root, mode)
    assert_found(P, check, needle)
    return P


def edit_manifest(root: Path, arch: str, fn: Callable[[dict], None], reseal: bool = True) -> None:
    p = manifest.manifest_path(root, arch)
    doc = json.loads(p.read_text())
    fn(doc)
    if reseal:
        doc = manifest.seal(doc)
    p.write_bytes(manifest.canonical(doc))
