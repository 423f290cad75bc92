"""One loader per artifact kind: a manifest entry names the loader its artifact needs, and
:func:`vkc_runtime.kernels.get_kernel` hands the entry to it.

* ``triton-cubin`` (:mod:`.triton_cubin`): a Triton cubin, loaded with ``cuModuleLoadData`` after its sha256
  check and launched with Triton's ABI. Entries without a ``kind``/``loader`` are Triton cubins.
* ``cute-so`` (:mod:`.cute_so`): a CuTe DSL shared object (host launchers + embedded cubins, one file per arch,
  family and host platform), dlopened after its sha256 check; launchers called with explicit streams.

Any other kind or loader is refused with an :class:`~vkc_runtime.errors.ArtifactError` naming it
(ARCHITECTURE.md, "Loaders and artifact kinds").
"""
from __future__ import annotations

from typing import Any

from ..errors import ArtifactError

__all__ = ["TRITON_CUBIN", "CUTE_SO", "LOADERS", "loader_of"]

TRITON_CUBIN = "triton-cubin"
CUTE_SO = "cute-so"
_KIND_TO_LOADER = {TRITON_CUBIN: TRITON_CUBIN, CUTE_SO: CUTE_SO}


def _triton_cubin(base, aset, ctx, device):
    from .triton_cubin import Kernel
    return Kernel(base, aset.launch_spec(base), aset, ctx, device)


def _cute_so(base, aset, ctx, device):
    from .cute_so import CuteKernel
    return CuteKernel(base, aset, ctx, device)


LOADERS = {TRITON_CUBIN: _triton_cubin, CUTE_SO: _cute_so}  # loader name -> factory(base, ArtifactSet, ctx, device)


def loader_of(base: str, entry: dict[str, Any], arch: str = "?") -> str:
    """The loader a manifest entry asks for (``artifact.loader``, else derived from ``artifact.kind``; neither:
    a Triton cubin). Unknown kinds and loaders raise ArtifactError."""
    art = entry.get("artifact") or (entry.get("artifacts") or [{}])[0]
    kind = art.get("kind", TRITON_CUBIN)
    loader = art.get("loader") or _KIND_TO_LOADER.get(kind)
    if loader is None:
        raise ArtifactError(f"{base} ({arch}): artifact kind {kind!r} has no loader in this vkc_runtime "
                            f"(known kinds: {', '.join(_KIND_TO_LOADER)})")
    if loader not in LOADERS:
        raise ArtifactError(f"{base} ({arch}): artifact kind {kind!r} needs loader {loader!r}, which this "
                            f"vkc_runtime does not have (loaders: {', '.join(LOADERS)})")
    return loader
