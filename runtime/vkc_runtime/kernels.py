"""The kernel cache: :func:`get_kernel` / :func:`has_kernel` by base name, per CUDA context and arch.

``get_kernel(base)`` first checks that some manifest under the artifact root knows ``base`` (an unknown name
is a :class:`~vkc_runtime.errors.MissingKernelError` even without a driver), then makes a context current,
selects the arch for its device (:func:`vkc_runtime.artifacts.select_arch_info`, once per context) and hands
the manifest entry to the loader its artifact kind needs (:mod:`vkc_runtime.loaders`). Kernels are cached
per ``(context, arch, base)`` and load lazily on their first launch.
"""
from __future__ import annotations

import threading
from pathlib import Path

from . import artifacts, driver, scratch
from .artifacts import ArtifactSet
from .errors import MissingKernelError
from .loaders import LOADERS, loader_of

__all__ = ["get_kernel", "has_kernel", "clear_cache", "context_info", "check_known"]


class _CtxInfo:
    __slots__ = ("device", "cc", "arch", "how", "aset")

    def __init__(self, device, cc, arch, how, aset):
        self.device, self.cc, self.arch, self.how, self.aset = device, cc, arch, how, aset


_cache_lock = threading.Lock()
_ctx_infos: dict[int, _CtxInfo] = {}
_kernels: dict[tuple[int, str, str], object] = {}
_known: set[str] = set()  # names check_known accepted
_names_by_root: dict[Path, tuple[frozenset[str], bool]] = {}  # root -> (every manifest's names, all readable)


def clear_cache() -> None:
    """Forget loaded kernels, per-context arch choices, default scratch arenas and bound calls (tests; modules
    are not unloaded)."""
    from .bound import clear_bound_calls
    with _cache_lock:
        _ctx_infos.clear()
        _kernels.clear()
        _known.clear()
        _names_by_root.clear()
    scratch.clear_arenas()
    clear_bound_calls()


def _all_names(root: Path) -> tuple[frozenset[str], bool]:
    got = _names_by_root.get(root)
    if got is None:
        found: set[str] = set()
        readable = True
        for p in sorted((root / "manifests").glob("*.json")):
            if p.name == "schema.json":
                continue
            try:
                found.update(artifacts.load_manifest(root, p.stem)["kernels"])
            except Exception:  # a broken manifest is reported when its arch is selected
                readable = False
        got = _names_by_root.setdefault(root, (frozenset(found), readable))
    return got


def check_known(base: str) -> None:
    """Refuse a base that no manifest under the artifact root has (no driver needed). Says nothing when there
    is no root or a manifest cannot be read: arch selection then reports the real problem."""
    if base in _known:
        return
    root = artifacts.find_root()
    if root is not None:
        names, readable = _all_names(root)
        if base in names:
            _known.add(base)
        elif readable:
            raise MissingKernelError(
                f"unknown kernel {base!r}: no manifest under {root} has it (a typo, or a kernel this vkc does not "
                f"build)", missing=[base])


def context_info(ctx: int) -> _CtxInfo:
    info = _ctx_infos.get(ctx)
    if info is None:
        dev = driver.context_device()
        cc = driver.device_cc(dev)
        root = artifacts.find_root()
        if root is None:
            raise MissingKernelError(
                "vkc_runtime: no artifact root found (no VKC_ARTIFACT_ROOT, no packaged artifacts, no source tree); "
                + artifacts.repair_hint(None))
        arch, how = artifacts.select_arch_info(cc, root)
        info = _CtxInfo(dev, cc, arch, how, ArtifactSet(root, arch))
        with _cache_lock:
            info = _ctx_infos.setdefault(ctx, info)
    return info


def get_kernel(base: str, *, device: int | None = None):
    """The kernel for ``base`` in the current context (made current if there is none): a
    :class:`~vkc_runtime.loaders.triton_cubin.Kernel` for Triton cubins.

    Raises :class:`MissingKernelError` for a name no manifest has (before touching the driver) and when the
    selected arch has no artifact for ``base``, :class:`DriverUnavailable` without a usable driver,
    :class:`ArtifactError` for an artifact kind this runtime has no loader for.
    """
    if base not in _known:
        check_known(base)
    ctx = driver.ensure_context(device)
    info = _ctx_infos.get(ctx) or context_info(ctx)
    key = (ctx, info.arch, base)
    k = _kernels.get(key)
    if k is None:
        loader = loader_of(base, info.aset.entry(base), info.arch)
        k = LOADERS[loader](base, info.aset, ctx, info.device)
        with _cache_lock:
            k = _kernels.setdefault(key, k)
    return k


def has_kernel(base: str, *, device: int | None = None) -> bool:
    """Whether the arch selected for the current context has an artifact for ``base`` (for arch-specific
    fast paths, e.g. TMA kernels built for sm_90a/sm_100a only; required bases go through the registry)."""
    ctx = driver.ensure_context(device)
    info = _ctx_infos.get(ctx) or context_info(ctx)
    return base in info.aset
