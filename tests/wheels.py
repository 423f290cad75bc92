"""Build a vkc wheel of one arch's artifacts for the wheel-install tests (no network: --no-build-isolation)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_wheel(out: Path, arches: str) -> Path:
    env = {**os.environ, "VKC_ARCHES": arches}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                        "-C", f"build-dir={out / 'build'}", "-w", str(out), str(REPO)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = out.glob("vkc-*.whl")
    return whl
