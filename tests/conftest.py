"""Test-suite wiring: tests marked ``gpu`` run only where a CUDA device answers through the driver API; tests
marked ``mutation`` (the kernel mutation suite) only when ``-m`` names them."""
from __future__ import annotations

import functools
import os

import pytest

# Kernel semantics run through Triton's interpreter on CPU; it must be chosen before triton is imported.
# (A GPU run of the same tests sets VKC_NORM_TEST_DEVICE=cuda instead.)
if not os.environ.get("VKC_NORM_TEST_DEVICE"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from tests import interp_fixes
    except ImportError:  # triton not installed: the interpreter tests skip themselves
        pass
    else:
        try:
            interp_fixes.apply()
        except ImportError:
            pass


@functools.lru_cache(maxsize=1)
def gpu_available() -> tuple[bool, str]:
    try:
        from cuda.bindings import driver as cu
    except Exception as e:  # pragma: no cover - cuda-bindings is a dependency
        return False, f"cuda-bindings unavailable: {e}"
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return False, f"cuInit: {err}"
        err, n = cu.cuDeviceGetCount()
        if err != cu.CUresult.CUDA_SUCCESS or n == 0:
            return False, "no CUDA device"
    except Exception as e:  # no libcuda on CPU machines (DynamicLibNotFoundError / SystemError)
        return False, f"no CUDA driver ({type(e).__name__})"
    return True, ""


def pytest_collection_modifyitems(config, items):
    # the kernel mutation suite (tests/mutation, marked `mutation`) runs only when -m names it
    if "mutation" not in (config.getoption("markexpr") or ""):
        dropped = [it for it in items if it.get_closest_marker("mutation")]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [it for it in items if not it.get_closest_marker("mutation")]
    ok, why = gpu_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item):
    if "peer" in item.keywords and os.environ.get("TRITON_INTERPRET") == "1" and gpu_available()[0]:
        # the peer (FLA) would run in Triton's interpreter: hours, and not the peer users run
        pytest.fail("TRITON_INTERPRET=1 would run the peer library in Triton's interpreter; "
                    "run GPU peer tests with TRITON_INTERPRET=0 (tools/gpu/run.sh does)", pytrace=False)
