"""A stranger's first run: one-line CLI errors with non-zero exit codes, `vkc doctor`'s exit status, regen
progress lines in a log, the stale-arch repair hint, and the Makefile's install sets / `make wheel` guard."""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from vkc_cli.main import main
from vkc_contract.arch import ALL_ARCHS

try:
    from .runtime_support import clean_env, fake_cu, make_root, no_real_driver  # noqa: F401
except ImportError:  # tests/ not a package
    from runtime_support import clean_env, fake_cu, make_root, no_real_driver  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def vkc(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """The real command in a fresh process (no VKC_* variables unless given)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("VKC_")}
    e.update(env)
    return subprocess.run([sys.executable, "-m", "vkc_cli", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=120)


def assert_one_line_error(r: subprocess.CompletedProcess, code: int, needle: str) -> None:
    out = r.stdout + r.stderr
    assert r.returncode == code, out
    assert "Traceback" not in out and not r.stdout, out
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and needle in errors[0], out
    # click's usage errors add "Usage:" / "Try ..." lines; anything else is the error line alone
    assert all(line.startswith(("Error:", "Usage:", "Try ")) for line in out.splitlines() if line.strip()), out


# ----------------------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("cmd", [["regen", "--arch", "sm_75"], ["regen", "--arch", "sm_80,sm_75"],
                                 ["verify", "--arch", "sm_75"], ["inspect", "--arch", "sm_75"]])
def test_unknown_arch_is_one_usage_line_listing_the_known(cmd, tmp_path):
    r = vkc(*cmd, cwd=tmp_path)
    assert_one_line_error(r, 2, "unknown arch 'sm_75' (known: " + ", ".join(ALL_ARCHS) + ")")


def test_regen_without_arch_and_bad_jobs(tmp_path):
    assert_one_line_error(vkc("regen", cwd=tmp_path), 2, "name --arch ARCH or --all")
    assert_one_line_error(vkc("regen", "--all", "-j", "0", cwd=tmp_path), 2, "0 is not in the range")


# ----------------------------------------------------------------------------------- outside a checkout

# regen needs a checkout; verify and inspect also take an installed artifact root (a wheel's), so their message
# names both
_NO_ROOT = {"regen": "not inside a vkc checkout", "verify": "is neither a vkc checkout", "inspect": "is neither a vkc checkout"}
_NO_ENV_ROOT = {"regen": "not a vkc checkout", "verify": "is neither a vkc checkout", "inspect": "is neither a vkc checkout"}


@pytest.mark.parametrize("cmd", [["regen", "--arch", "sm_80"], ["verify"], ["inspect"]])
def test_explicit_root_that_is_no_checkout(cmd, tmp_path):
    (tmp_path / "empty").mkdir()
    r = vkc(*cmd, "--root", str(tmp_path / "empty"), cwd=tmp_path)
    assert_one_line_error(r, 1, f"--root {tmp_path / 'empty'}: ")
    assert _NO_ROOT[cmd[0]] in r.stderr, r.stderr
    assert not (tmp_path / "empty" / "vendored").exists()


@pytest.mark.parametrize("cmd", [["regen", "--arch", "sm_80"], ["verify"], ["inspect"]])
def test_vkc_root_that_is_no_checkout(cmd, tmp_path):
    r = vkc(*cmd, cwd=tmp_path, VKC_ROOT=str(tmp_path))
    assert_one_line_error(r, 1, f"VKC_ROOT={tmp_path}: ")
    assert _NO_ENV_ROOT[cmd[0]] in r.stderr, r.stderr


def test_regen_with_no_checkout_anywhere(monkeypatch, tmp_path):
    """A wheel-only install: no checkout above the cwd and none the package lives in."""
    from vkc import discover

    monkeypatch.delenv("VKC_ROOT", raising=False)
    monkeypatch.setattr(discover, "KERNELS_DIR", "no-such-kernels-dir")  # the walk and the fallback both miss
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["regen", "--arch", "sm_80"])
    assert r.exit_code == 1 and r.output.strip().splitlines() == [
        "Error: no vkc repository (kernels_src/ + manifests/) found; run inside a checkout or set VKC_ROOT"], r.output
    assert not (tmp_path / "vendored").exists()


def test_unexpected_exception_is_one_line(monkeypatch):
    from vkc import verify as V

    def boom(*a, **k):
        raise RuntimeError("manifest reader broke\n  on line two")
    monkeypatch.setattr(V, "verify", boom)
    monkeypatch.delenv("VKC_DEBUG", raising=False)
    r = CliRunner().invoke(main, ["verify", "--root", str(REPO)])
    assert r.exit_code == 1, r.output
    assert r.output.strip().splitlines() == [
        "Error: RuntimeError: manifest reader broke on line two (VKC_DEBUG=1 shows the traceback)"]
    monkeypatch.setenv("VKC_DEBUG", "1")
    r = CliRunner().invoke(main, ["verify", "--root", str(REPO)])
    assert isinstance(r.exception, RuntimeError)


# ----------------------------------------------------------------------------------- doctor exit codes

@pytest.fixture
def only_required(monkeypatch):
    """The registry holds exactly the bases a test names: the ops' own BASES are hidden for the test."""
    from vkc_runtime import registry

    saved = set(registry.required(include_ops=False))
    registry.clear()
    monkeypatch.setattr(registry, "ops_bases", lambda optional=False: {})
    yield registry
    registry.clear()
    if saved:
        registry.require(*saved)


def doctor(*args: str):
    return CliRunner().invoke(main, ["doctor", *args])


@no_real_driver
def test_doctor_no_driver_complete_tree_exits_3(clean_env):
    from vkc_runtime import driver

    driver.reset_caches()
    clean_env.setenv("VKC_ARTIFACT_ROOT", str(REPO))
    r = doctor()
    assert r.exit_code == 3, r.output
    assert r.output.strip().splitlines()[-1].startswith(
        "vkc doctor: artifacts complete, but cannot run here: no CUDA driver ("), r.output
    r = doctor("--json")
    assert r.exit_code == 3
    v = json.loads(r.output)["verdict"]
    assert v["exit"] == 3 and v["reasons"][0].startswith("no CUDA driver")


@no_real_driver
@pytest.mark.parametrize("case", ["missing-dir", "no-manifests", "empty-manifests", "incomplete"])
def test_doctor_broken_artifact_root_exits_1(case, clean_env, tmp_path, only_required):
    from vkc_runtime import driver

    driver.reset_caches()
    root = tmp_path / "nothing-here"
    needle = "no artifact root (VKC_ARTIFACT_ROOT="
    if case == "no-manifests":
        root.mkdir()
    elif case == "empty-manifests":
        (root / "manifests").mkdir(parents=True)
        needle = "no arch has a manifest under"
    elif case == "incomplete":
        only_required.require("norm.a")
        root = make_root(tmp_path, bases=("norm.a", "norm.b"))
        (root / "vendored" / "sm_90a" / "norm" / "b.cubin").unlink()
        needle = "sm_90a: 1 artifact problem(s), e.g. norm.b: file missing"
    clean_env.setenv("VKC_ARTIFACT_ROOT", str(root))
    r = doctor()
    assert r.exit_code == 1, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("vkc doctor: cannot run here: ") and needle in last, r.output
    assert json.loads(doctor("--json").output)["verdict"]["exit"] == 1


def test_doctor_fake_device(fake_cu, clean_env, tmp_path, only_required):
    """cc 9.0 device: 0 with a complete sm_90a set; 1 when a required kernel is missing or no arch fits."""
    only_required.require("norm.a")
    clean_env.setenv("VKC_ARTIFACT_ROOT", str(make_root(tmp_path / "ok", bases=("norm.a",))))
    r = doctor()
    assert r.exit_code == 0 and r.output.strip().splitlines()[-1] == \
        "vkc doctor: OK, can run on this machine (sm_90a)", r.output
    only_required.require("norm.zz")
    r = doctor()
    assert r.exit_code == 1 and "sm_90a: 1 required kernel(s) missing, e.g. norm.zz" in r.output, r.output
    clean_env.setenv("VKC_ARTIFACT_ROOT", str(make_root(tmp_path / "other", arches=("sm_80",), bases=("norm.a",))))
    r = doctor()
    assert r.exit_code == 1 and "device 0 (cc 9.0): no usable arch" in r.output, r.output


def test_doctor_help_documents_the_exit_status():
    out = CliRunner().invoke(main, ["doctor", "--help"]).output
    assert "Exit status:" in out and re.search(r"^\s+0\s+this installation can run", out, re.M)
    assert re.search(r"^\s+1\s+it cannot", out, re.M) and re.search(r"^\s+3\s+the artifacts are complete", out, re.M)


# ----------------------------------------------------------------------------------- regen progress

def test_regen_progress_lines_when_not_a_tty(monkeypatch):
    """One line per arch x family as its last kernel finishes, then one per arch; no per-kernel lines."""
    from vkc import discover
    from vkc import regen as R

    archs = ["sm_80", "sm_90a"]
    plan = [(a, b) for a in archs for b in discover.bases_for_arch(REPO, a)]
    calls = []

    def fake_regen(root, archs_, jobs=None, progress=None):
        assert root == REPO and archs_ == archs
        order = plan[:]
        random.Random(0).shuffle(order)
        for i, (a, b) in enumerate(order, 1):
            progress(f"{a} {b.spec.base}", i, len(order))
            calls.append((a, b.spec.family))
        return {a: {"kernels": {}} for a in archs}
    monkeypatch.setattr(R, "regen", fake_regen)
    r = CliRunner().invoke(main, ["regen", "--arch", ",".join(archs), "--root", str(REPO)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    progress = [x for x in lines if x.startswith("[")]
    fams = {(a, b.spec.family) for a, b in plan}
    assert len(progress) == len(fams) + len(archs), r.output
    for (a, f) in fams:
        n = sum(1 for x, b in plan if (x, b.spec.family) == (a, f))
        last = max(i for i, c in enumerate(calls, 1) if c == (a, f))
        assert f"[{last}/{len(plan)}] {a} {f}: {n} kernels compiled (" in r.output, r.output
    for a in archs:
        n = sum(1 for x, _ in plan if x == a)
        i = next(k for k, x in enumerate(progress) if x.split("] ", 1)[1].startswith(f"{a}: all {n} kernels"))
        assert all(not x.split("] ", 1)[1].startswith(f"{a} ") for x in progress[i + 1:]), r.output
    assert lines[-1].startswith("regen done in ")


@pytest.mark.slow
def test_regen_progress_real_compile(tmp_path):
    """The same lines from a real regen of the selftest family (a small tree, one arch), output to a pipe."""
    pytest.importorskip("triton")
    try:
        from .test_aot_regen_verify import make_tree
    except ImportError:
        from test_aot_regen_verify import make_tree
    root = make_tree(tmp_path / "tree")
    r = vkc("regen", "--arch", "sm_80", "-j", "2", "--root", str(root), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    prog = [x for x in r.stdout.splitlines() if x.startswith("[")]
    assert [re.sub(r"\(\d+ s\)", "(T)", x) for x in prog] == [
        "[3/3] sm_80 selftest: 3 kernels compiled (T)", "[3/3] sm_80: all 3 kernels compiled (T)"], r.stdout
    assert (root / "manifests" / "sm_80.json").is_file()


# ----------------------------------------------------------------------------------- verify repair hint

def _fake_verify(monkeypatch, problems):
    from vkc import verify as V

    monkeypatch.setattr(V, "verify", lambda root, archs, mode=None: list(problems))
    return CliRunner().invoke(main, ["verify", "--root", str(REPO)])


def test_verify_one_stale_arch_keeps_its_repair(monkeypatch):
    P = ["sm_80: kernels_src/norm/rms.py changed; run `vkc regen --arch sm_80`", "manifests/x.json is not a known "
         "arch manifest; delete it"]
    r = _fake_verify(monkeypatch, P)
    assert r.exit_code == 1
    assert r.output.splitlines() == [f"DRIFT {p}" for p in P] + ["vkc verify: 2 problem(s)"]


def test_verify_several_stale_archs_suggest_regen_all_once(monkeypatch):
    P = [f"{a}: kernels_src/norm/rms.py changed; run `vkc regen --arch {a}`" for a in ALL_ARCHS]
    r = _fake_verify(monkeypatch, P + ["vendored/sm_75 is not a known arch; delete it"])
    assert r.exit_code == 1
    assert r.output.splitlines() == [f"DRIFT {a}: kernels_src/norm/rms.py changed" for a in ALL_ARCHS] + [
        "DRIFT vendored/sm_75 is not a known arch; delete it",
        "repair: run `vkc regen --all` (every arch is stale)", f"vkc verify: {len(P) + 1} problem(s)"]
    r = _fake_verify(monkeypatch, P[:2])
    assert r.output.splitlines()[2] == (f"repair: run `vkc regen --arch {ALL_ARCHS[0]},{ALL_ARCHS[1]}` "
                                        f"(2 archs are stale; or `vkc regen --all`)")


# ----------------------------------------------------------------------------------- Makefile install sets

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _pip_extras(target: str, venv: Path) -> list[str]:
    """The extras `make TARGET` installs into a fresh venv (from make's own dry run)."""
    out = subprocess.run(["make", "-n", "-C", str(REPO), target, f"VENV={venv}", f"CUTE_VENV={venv}-cute"],
                         capture_output=True, text=True, check=True).stdout
    pips = [line for line in out.splitlines() if re.search(r"\bpip install\b", line)]
    assert pips, out
    extras = []
    for line in pips:
        if "--upgrade pip" in line or line.startswith(f"{venv}-cute/"):  # the CuTe DSL's own venv (make cute-env)
            continue
        m = re.fullmatch(r".*pip install -q -e '\.\[([a-z,]+)\]'", line)
        assert m, f"unexpected install line in `make {target}`: {line}"
        extras += m.group(1).split(",")
    return extras


def _requirements(extras: list[str]) -> list[str]:
    """Base dependencies + the extras, expanded recursively (`vkc[regen]` inside `test`)."""
    proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    opt = proj["optional-dependencies"]
    reqs, todo, seen = list(proj["dependencies"]), list(extras), set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for req in opt[e]:
            m = re.fullmatch(r"vkc\[([a-z,]+)\]", req.replace(" ", ""))
            if m:
                todo += m.group(1).split(",")
            else:
                reqs.append(req)
    return reqs


def _name(req: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")


@needs_make
def test_make_regen_installs_no_torch(tmp_path):
    from vkc import toolchain

    regen = _requirements(_pip_extras("regen", tmp_path / "venv"))
    assert "torch" not in {_name(r) for r in regen}, regen
    # the CuTe lane's DSL goes into its own venv, pinned to toolchain.CUTLASS_DSL (regen refuses any other)
    cute = tmp_path / "venv-cute"
    out = subprocess.run(["make", "-n", "-C", str(REPO), "regen", f"VENV={tmp_path / 'venv'}", f"CUTE_VENV={cute}"],
                         capture_output=True, text=True, check=True).stdout
    dsl = [line for line in out.splitlines() if line.startswith(f"{cute}/bin/python -m pip install")]
    v = toolchain.CUTLASS_DSL["version"]
    assert len(dsl) == 1 and f"nvidia-cutlass-dsl=={v}" in dsl[0], out
    assert f"nvidia-cutlass-dsl-libs-{toolchain.CUTLASS_DSL['flavor']}=={v}" in dsl[0], dsl
    assert f"triton=={toolchain.TRITON_VERSION}" in [r.replace(" ", "") for r in regen], regen
    test = _requirements(_pip_extras("test", tmp_path / "venv"))
    assert {"torch", "transformers", "pytest"} <= {_name(r) for r in test}, test
    # the test set keeps regen's exact Triton pin and never pins torch (the resolver must fit it to that Triton)
    assert f"triton=={toolchain.TRITON_VERSION}" in [r.replace(" ", "") for r in test], test
    assert not any(_name(r) == "triton" and "==" not in r for r in test), test
    assert not any(_name(r) == "torch" and "==" in r for r in test), test


@needs_make
@pytest.mark.parametrize("arch", [None, ""])
def test_make_wheel_without_arch_refuses(arch, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ARCH"}
    cmd = ["make", "-C", str(REPO), "wheel", f"VENV={tmp_path / 'venv'}"] + ([] if arch is None else [f"ARCH={arch}"])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0
    assert "make wheel needs ARCH: e.g. make wheel ARCH=sm_90a (comma-separated archs of " + ",".join(ALL_ARCHS) \
        in r.stderr, r.stderr
    assert not (tmp_path / "venv").exists()  # refused before any work
    out = subprocess.run(["make", "-n", "-C", str(REPO), "wheel", "ARCH=sm_90a", f"VENV={tmp_path / 'venv'}"],
                         capture_output=True, text=True, check=True).stdout
    assert "VKC_ARCHES=sm_90a " in out and "pip wheel --no-deps" in out


def test_cli_module_has_no_import_time_side_imports():
    """`vkc --help` loads neither side (each subcommand imports its own)."""
    code = "import sys, vkc_cli.main; print(sorted(m for m in sys.modules if m.split('.')[0] in ('vkc', 'vkc_runtime', 'triton', 'torch')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
