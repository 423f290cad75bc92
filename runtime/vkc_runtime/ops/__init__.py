"""Typed ops over vkc's kernels (one module per family, e.g. ``norm.py``).

Each ops module declares the kernel bases it may launch as data (``BASES``, and ``OPTIONAL_BASES`` for
arch-specific fast paths), built from the naming functions it picks kernels with; it does not import the
registry. :mod:`vkc_runtime.registry` reads that data for the import-time completeness check (it imports
the modules listed in :data:`MODULES`). Ops use the runtime API: ``memory.as_tensor``,
``stream.resolve_stream``, ``kernels.get_kernel(base)`` and ``bound.CallCache``, which runs ``bound.Launch``
records and keeps them as bound calls.
Invalid inputs raise :class:`OpError` before any launch.
"""
from ._check import OpError

# the ops modules the registry reads, one per kernel family (kernels_src/<name>/, bases "<name>.*")
MODULES = ("norm", "rope", "act", "embedding", "attn", "conv", "gdn", "gdn_decode", "gemm", "gemm_fp8", "gemm_fp4",
           "gemv", "sample", "moe")

from . import act, attn, conv, embedding, gdn, gdn_decode, gemm, gemm_fp4, gemm_fp8, gemv, moe, norm, rope, sample  # noqa: E402,F401,E501

__all__ = ["OpError", "MODULES", *MODULES]
