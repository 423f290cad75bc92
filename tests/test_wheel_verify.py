"""Wheel-only install: `vkc verify` and `vkc inspect` work from the wheel's own artifact root
(``vkc_runtime/artifacts/``) in a fresh virtualenv that has the base dependencies only (numpy,
cuda-bindings, click, jsonschema: linked from this environment, no network) and no Triton, torch,
kernels_src or git checkout."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.wheels import build_wheel

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("scikit_build_core", reason="wheel build needs scikit-build-core (the test extra has it)")
pytestmark = pytest.mark.slow  # one wheel build (CMake + the native launcher): about a minute

# the base dependencies (pyproject.toml [project] dependencies) and what they import
BASE_DEPS = ("numpy", "numpy.libs", "cuda", "cuda_bindings", "cuda_pathfinder", "click", "jsonschema",
             "jsonschema_specifications", "referencing", "rpds", "rpds_py", "attr", "attrs", "typing_extensions")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"), "sm_80")


def _site_of(module: str) -> Path:
    import importlib.util
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    return Path(spec.origin).resolve().parents[1]


@pytest.fixture(scope="module")
def venv_py(wheel, tmp_path_factory) -> Path:
    """A fresh venv (no pip, no system site-packages) with the wheel installed and the base deps linked in."""
    d = tmp_path_factory.mktemp("venv")
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(d / "env")], check=True)
    py = d / "env/bin/python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                        str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    deps = d / "deps"
    deps.mkdir()
    site = _site_of("numpy")
    for entry in sorted(site.iterdir()):
        stem = re.split(r"-\d", entry.name, maxsplit=1)[0].removesuffix(".py")
        if stem in BASE_DEPS:
            (deps / entry.name).symlink_to(entry)
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "base_deps.pth").write_text(str(deps) + "\n")
    assert sysconfig.get_paths()["purelib"] != purelib
    return py


def run(py: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VKC_ROOT", "VKC_ARTIFACT_ROOT", "PYTHONPATH", "VIRTUAL_ENV", "TRITON_INTERPRET")}
    return subprocess.run([str(py), *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_the_venv_is_wheel_only(venv_py, tmp_path):
    for mod in ("triton", "torch", "kernels_src", "rich"):
        r = run(venv_py, "-c", f"import {mod}", cwd=tmp_path)
        assert r.returncode != 0, f"{mod} is importable in the wheel-only venv"
    r = run(venv_py, "-c", "import vkc, vkc_runtime, jsonschema, click, numpy; print(vkc.__file__); "
            "print(vkc_runtime.__file__)", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert all(str(venv_py.parents[1]) in line and str(REPO) not in line for line in r.stdout.split()), r.stdout


def test_wheel_verify_clean(venv_py, tmp_path):
    r = run(venv_py.parent / "vkc", "verify", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vkc verify: clean (sm_80) [installed artifacts:" in r.stdout, r.stdout
    assert "need a source checkout" in r.stdout and "vkc_runtime/artifacts" in r.stdout, r.stdout
    r = run(venv_py, "-c", "import sys, vkc_cli; sys.argv = ['vkc', 'verify']; vkc_cli.main()", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(venv_py, "-c", "import sys; import vkc.verify; assert 'triton' not in sys.modules; print('ok')", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_wheel_inspect(venv_py, tmp_path):
    r = run(venv_py.parent / "vkc", "inspect", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^sm_80 \(A100; build-verified\): \d+ kernels", r.stdout, re.M), r.stdout
    assert "selftest.empty" in r.stdout and "sm_90a" not in r.stdout, r.stdout
    r = run(venv_py.parent / "vkc", "inspect", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows and {x["arch"] for x in rows} == {"sm_80"} and {x["kind"] for x in rows} == {"triton-cubin"}


def test_wheel_verify_catches_a_modified_artifact(venv_py, wheel, tmp_path):
    """The same wheel's artifacts copied out and one cubin edited: verify --root names it, exit 1."""
    root = tmp_path / "artifacts"
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if n.startswith("vkc_runtime/artifacts/"):
                z.extract(n, tmp_path / "x")
    (tmp_path / "x/vkc_runtime/artifacts").rename(root)
    victim = root / "vendored/sm_80/selftest/empty.cubin"
    victim.write_bytes(victim.read_bytes() + b"\0")
    (root / "vendored/sm_80/selftest/extra.cubin").write_bytes(b"x")
    r = run(venv_py.parent / "vkc", "verify", "--root", str(root), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("DRIFT sm_80: selftest.empty: artifact vendored/sm_80/selftest/empty.cubin was modified (sha256/size "
            "mismatch)") in r.stderr, r.stderr
    assert "DRIFT sm_80: extra file vendored/sm_80/selftest/extra.cubin is not in the manifest" in r.stderr, r.stderr
    drift = [line for line in r.stderr.splitlines() if line.startswith("DRIFT")]
    assert len(drift) == 2, r.stderr  # exactly these two: no source or spec checks without sources
    assert "need a source checkout" in r.stderr, r.stderr


def test_wheel_outside_any_root(venv_py, tmp_path):
    """An explicit --root that is neither a checkout nor an artifact root: one Error: line, exit 1."""
    for cmd in ("verify", "inspect"):
        r = run(venv_py.parent / "vkc", cmd, "--root", str(tmp_path), cwd=tmp_path)
        assert r.returncode == 1, r.stdout + r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "neither a vkc checkout" in r.stderr, r.stderr
