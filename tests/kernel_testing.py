"""Shared plumbing of the kernel-semantics tests (tests/test_*_interp.py): interpreter detection, the device
the kernels run on, specs by name (through vkc.discover, the one spec loader), launching a spec the way the
runtime does, float64 views, and the GEMM tests' seeded generator, bf16 inputs and NaN-poisoned bf16 outputs."""
from __future__ import annotations

import importlib
import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def interpreter_active() -> bool:
    """Whether @triton.jit functions run in Triton's interpreter (TRITON_INTERPRET=1 before triton import;
    tests/conftest.py sets it)."""
    import triton.language.standard as std
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(std.sum, InterpretedFunction)


def device() -> str:
    """"cpu" under the interpreter; otherwise VKC_NORM_TEST_DEVICE (e.g. "cuda" to run the same tests through
    the JIT on a GPU). Raises when neither is set: these tests must never silently skip."""
    if interpreter_active():
        return "cpu"
    dev = os.environ.get("VKC_NORM_TEST_DEVICE")
    if not dev:
        raise RuntimeError("TRITON_INTERPRET=1 must be set before triton is imported (tests/conftest.py does it)")
    return dev


def specs(family: str) -> dict:
    from vkc import discover

    return {s.name: s for s in discover.load_specs(ROOT, family)}


def launch_spec(spec, grid, *args, arch: str | None = None, **override):
    """Launch ``spec``'s kernel as the runtime would: positional runtime args (their count checked against the
    spec), the spec's constexprs / num_warps / num_stages -- with ``arch``'s overrides applied when given --
    and ``override`` constexprs on top (e.g. a smaller tile to spread a small case over several programs).
    Returns the resolved spec (or the spec itself without ``arch``)."""
    assert len(args) == len(spec.args), f"{spec.name}: {len(args)} args given, spec has {len(spec.args)}"
    cfg = spec.for_arch(arch) if arch else spec
    fn = getattr(importlib.import_module(f"kernels_src.{spec.family}.{spec.source[:-3]}"), spec.entry)
    fn[grid](*args, **{**cfg.constexprs, **override}, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return cfg


def np64(t) -> np.ndarray:
    return t.float().cpu().numpy().astype(np.float64)


def rng() -> np.random.Generator:
    """A generator on a fresh seed, printed so that a failing run can be replayed."""
    seed = int(np.random.SeedSequence().entropy % 2**31)
    print("seed", seed)
    return np.random.default_rng(seed)


def bf16(a):
    """A float array as a bf16 torch tensor on the tests' device."""
    import torch

    return torch.from_numpy(np.asarray(a, np.float32)).to(torch.bfloat16).to(device())


def bf16_out(M: int, N: int, pad: int = 16):
    """(buffer [M, N + pad] of bf16 NaN, its [M, N] view): what a kernel must write, and padding it must not."""
    import torch

    buf = torch.full((M, N + pad), float("nan"), dtype=torch.bfloat16, device=device())
    return buf, buf[:, :N]
