"""Pinned regen toolchain (one place). `vkc verify` compares every manifest against these pins without
importing Triton; `vkc regen` refuses to run with a toolchain that differs from them.

Why Triton 3.9.0: it is the newest release on PyPI (2026-11), compiles all seven targets on a CPU-only
machine, bundles ptxas 12.9 (sm_8x) and ptxas 13.4 (sm_90a and newer, incl. sm_120a/sm_121a which older
bundles mishandle), and its cubins loaded and ran on the H200's CUDA 13.0 driver.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from vkc_contract.hashing import sha256_file

TRITON_VERSION = "3.9.0"
# cubins do not depend on the Python version, but Triton's frontend might; the manifest records it and
# regen runs on the project's machines' Python.
PYTHON_VERSION = "3.11"
LINE_INFO = False  # TRITON_DISABLE_LINE_INFO=1: cubins carry no source paths (path-independent)

# Identity of the ptxas binaries bundled with the pinned Triton wheel (manylinux x86_64).
PTXAS = {
    "ptxas": {"version": "12.9.86", "sha256": "983b0e9283855979f42cebfd80d43f9b6e786eb84f03f7570bf941c4d3a3c461"},
    "ptxas-blackwell": {"version": "13.4.59",
                        "sha256": "9c2c084df7eb9be48f0502b6938ce2571679b2a78cad1c564b583bd7d9ea3c50"},
}


# The CuTe DSL lane's compiler (aot/vkc/cute_lane.py), in its own environment (`make cute-env`): one flavor only,
# cu12 (cubins ELF ABI 7 that the H200's CUDA 12.8+/13 drivers load; with cu13 also installed and no driver the DSL
# would pick cu13).
CUTLASS_DSL = {"package": "nvidia-cutlass-dsl", "version": "4.8.1", "flavor": "cu12"}


def ptxas_name_for(triton_cc: int) -> str:
    """Which bundled ptxas Triton 3.9 uses for a target (``get_ptxas``: < 90 → ptxas)."""
    return "ptxas" if triton_cc < 90 else "ptxas-blackwell"


def triton_bin_dir() -> Path:
    import triton  # noqa: PLC0415 - regen only

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def tool_version(path: Path) -> str:
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    if not m:
        raise RuntimeError(f"cannot read the version of {path}: {out!r}")
    return m.group(1)


def probe_ptxas(name: str) -> dict[str, str]:
    path = triton_bin_dir() / name
    return {"version": tool_version(path), "sha256": sha256_file(path)}


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def check_installed() -> list[str]:
    """Problems with the installed regen toolchain versus the pins (empty list = OK)."""
    problems = []
    try:
        import triton  # noqa: PLC0415
    except ImportError:
        return [f"triton is not installed: pip install 'vkc[regen]' (triton=={TRITON_VERSION})"]
    if triton.__version__ != TRITON_VERSION:
        problems.append(f"triton {triton.__version__} installed, pinned {TRITON_VERSION}: "
                        f"pip install triton=={TRITON_VERSION}")
    if python_version() != PYTHON_VERSION:
        problems.append(f"python {python_version()} in use, regen is pinned to {PYTHON_VERSION}")
    for name, pin in PTXAS.items():
        got = probe_ptxas(name)
        if got != pin:
            problems.append(f"bundled {name} is {got}, pinned {pin}")
    return problems
