"""``vkc_runtime.plans``: GEMM tactic choice as persisted, validated, freezable data (ARCHITECTURE.md, "GEMM plans").

* :mod:`.tactics`: every compiled GEMM variant of an arch as a stable id + descriptor, and the descriptor digest;
* :mod:`.keys`: the plan key (runner, dtype, layout, N, K, M bucket);
* :mod:`.store`: the native plan file (metadata, strict loading, sorted output, merge, atomic publish);
* :mod:`.cache`: lookup priority, single-flight miss tuning, warm-up lifecycle, start report;
* :mod:`.tuning`: the miss timing method behind a timer interface;
* :mod:`.flashinfer`: the read-only FlashInfer ``autotune_configs.json`` import;
* :mod:`.defaults`: the committed per-arch default plans; :mod:`.config`: the ``VKC_PLAN_*`` settings.

This module ties them to the running process: :func:`cache_for_context` builds (once per CUDA context) the
cache of the current device from the driver, the selected arch's manifest and the environment;
:func:`gemm_tactic` is the per-call hook of :func:`vkc_runtime.ops.gemm.linear`; :func:`warmup_gemm` resolves
a declared set of GEMM shapes before serving or graph capture; :func:`status` is what ``vkc doctor`` shows.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Iterable

from . import config as _config
from . import defaults as _defaults
from . import store, tactics
from .cache import PlanCache, PlanError, PlanMissError, capturing, in_capture
from .config import PlanConfigError
from .keys import PlanKey, m_bucket
from .store import PlanFileError

__all__ = ["PlanCache", "PlanError", "PlanMissError", "PlanConfigError", "PlanFileError", "PlanKey", "capturing",
           "in_capture", "cache_for_context", "gemm_key", "gemm_tactic", "warmup_gemm", "declared", "status", "inspect",
           "reset", "kernel_set"]

_lock = threading.Lock()
_caches: dict[int, PlanCache] = {}
_warned_no_root = False


def reset() -> None:
    """Forget every plan cache of this process (tests)."""
    with _lock:
        _caches.clear()


def gemm_key(m: int, n: int, k: int) -> PlanKey:
    return PlanKey(tactics.RUNNER_BF16, "bf16", tactics.LAYOUT_TN, n, k, m_bucket(m))


def declared(nks: Iterable[tuple[int, int]], max_m: int) -> list[tuple[int, int, int]]:
    """The warm-up shapes an engine declares: every M bucket up to ``max_m`` (its largest step) per (N, K)."""
    from .keys import M_BUCKETS  # noqa: PLC0415

    top = m_bucket(max_m)
    return [(b, n, k) for n, k in nks for b in M_BUCKETS if b <= top]


def kernel_set(arch: str, entry_of: Callable[[str], dict[str, Any]]) -> str:
    """sha256 over each tactic's compiled kernel (base, embedded cubin sha256, config) of the arch's manifest."""
    rows = []
    for t in tactics.tactics_for(arch):
        e = entry_of(t.base)
        rows.append({"base": t.base, "cubin_sha256": (e.get("launch") or {}).get("cubin_sha256"),
                     "config": (e.get("inputs") or {}).get("config")})
    return tactics.descriptor_digest(rows)


def _identity(ctx: int):
    """``(arch, SM count, metadata, config, native file path or None)`` of the context's device: everything a plan
    file is checked against, read from the driver, the selected arch's manifest and the environment (nothing
    is loaded, tuned or written)."""
    global _warned_no_root
    from .. import driver, kernels  # noqa: PLC0415

    info = kernels.context_info(ctx)
    arch, dev = info.arch, info.device
    cfg = _config.from_env()
    ents = {b: info.aset.entry(b) for b in info.aset.bases()}
    problems = tactics.check_manifest(arch, ents, info.aset.manifest.get("tactics") or {})
    if problems:
        raise PlanError("the GEMM tactic table does not describe the compiled kernels: " + "; ".join(problems))
    try:
        import cuda.bindings as _cb  # noqa: PLC0415
        runtime = f"cuda-bindings {getattr(_cb, '__version__', '?')}"
    except ImportError:  # pragma: no cover
        runtime = "cuda-bindings ?"
    sms = driver.sm_count(dev)
    meta = store.metadata(arch=arch, device_name=driver.device_name(dev), cc=driver.device_cc(dev), sm_count=sms,
                          cuda_driver=driver.driver_version(), cuda_runtime=runtime,
                          kernel_set=kernel_set(arch, ents.__getitem__), delay_us=cfg.delay_us)
    path = cfg.path
    if path is None and cfg.mode != "off":
        root = _config.cache_root()
        if root is None:
            if not _warned_no_root:
                warnings.warn("vkc plans: no usable cache root (XDG_CACHE_HOME / HOME): plans stay process-local",
                              RuntimeWarning, stacklevel=4)
                _warned_no_root = True
        else:
            path = store.default_path(root, meta)
    return arch, sms, meta, cfg, path


def _build(ctx: int, log: Callable[[str], None] | None) -> PlanCache:
    arch, sms, meta, cfg, path = _identity(ctx)
    defaults, note = {}, None
    if cfg.defaults:
        try:
            dmeta, dplans = _defaults.read(arch)
            why = _defaults.applicable(dmeta, sms)
            if why is None:
                defaults, note = dplans, f"{len(dplans)} plans ({dmeta.get('source')})"
            else:
                note = f"not used: {why}"
        except (PlanFileError, OSError) as e:
            note = f"rejected: {e}"
    fi = None
    if cfg.flashinfer is not None:
        def fi():
            from . import flashinfer  # noqa: PLC0415
            # vkc has no NVFP4 GEMM tactics yet (flashinfer.py): the file is validated, nothing maps
            imp = flashinfer.read(cfg.flashinfer, {"gpu": meta["device_name"]}, flashinfer.tactic_map(None, []))
            return {PlanKey(tactics.RUNNER_NVFP4, "nvfp4", tactics.LAYOUT_TN, n, k, m): t
                    for (m, n, k), t in imp.mapped.items()}
    c = PlanCache(arch, meta, cfg, path=path, defaults=defaults, default_note=note, flashinfer=fi, log=log)
    c.start()
    return c


def cache_for_context(ctx: int | None = None, log: Callable[[str], None] | None = None) -> PlanCache:
    """The started plan cache of the CUDA context ``ctx`` (default: the current one), built on first use."""
    from .. import driver  # noqa: PLC0415

    if ctx is None:
        ctx = driver.ensure_context()
    c = _caches.get(ctx)
    if c is None:
        _no_capture_build()
        with _lock:
            c = _caches.get(ctx)
            if c is None:
                c = _caches[ctx] = _build(ctx, log)
    return c


def _no_capture_build() -> None:
    if in_capture():
        raise PlanError("plan cache: first use inside a graph capture; call vkc_runtime.plans.warmup_gemm (or "
                        "cache_for_context) before capturing")


def gemm_tactic(m: int, n: int, k: int) -> tactics.Tactic | None:
    """The plan's tactic for an [m, k] x [n, k]^T bf16 GEMM in the current context, or None (the op's rule).

    Without a usable driver there is no device and no plan (None). Inside a graph capture a cache that was not
    built before is not built (None: never parse inside a capture)."""
    from .. import driver  # noqa: PLC0415

    if not driver.available():
        return None
    ctx = driver.current_context()
    if ctx == 0:
        return None  # no context: nothing was launched here yet (the op makes one before asking)
    c = _caches.get(ctx)
    if c is None:
        if in_capture():
            return None
        c = cache_for_context(ctx)
    t = c.choose(gemm_key(m, n, k))
    return None if t is None else tactics.by_id(c.arch, t)


def warmup_gemm(shapes: Iterable[tuple[int, int, int]], *, stream: int = 0, timer=None,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Resolve the plans of every ``(m, n, k)`` before serving / capture: loads, tunes the missing keys (readwrite),
    fails on a missing one (frozen), publishes after success. Returns the cache report."""
    from .. import driver  # noqa: PLC0415
    from . import gemm_profile  # noqa: PLC0415

    ctx = driver.ensure_context()
    c = cache_for_context(ctx, log=log)
    keys = [gemm_key(m, n, k) for m, n, k in shapes if m > 0 and n > 0]
    own = timer is None
    if own:
        from .tuning import CudaEventTimer  # noqa: PLC0415
        timer = CudaEventTimer(stream)
    prof = gemm_profile.Profiler(c.arch, stream)
    try:
        return c.warmup(keys, prof.make_run, timer)
    finally:
        if own:
            timer.close()  # first: opens a pending stream gate, so freeing the buffers cannot wait on it
        prof.close()


def inspect() -> dict[str, Any]:
    """The native plan file this process would use, read-only (``vkc doctor``): path, mode, fingerprint and the
    file's state (``absent``, ``valid`` with its plan count, ``rejected`` with the reason). Needs a usable
    driver and device (the fingerprint covers both); nothing is tuned or written, no cache is started."""
    from .. import driver  # noqa: PLC0415

    if not driver.available():
        return {"unavailable": "no usable CUDA driver/device (the fingerprint needs one)"}
    arch, _, meta, cfg, path = _identity(driver.ensure_context())
    out: dict[str, Any] = {"arch": arch, "mode": cfg.mode, "path": str(path) if path else None,
                           "fingerprint": store.fingerprint(meta)}
    if cfg.mode == "off" or path is None:
        out["file"] = "not read (mode off)" if cfg.mode == "off" else "none (no cache root: process-local)"
        return out
    try:
        out["plans"] = len(store.load(path, meta))
        out["file"] = "valid"
    except FileNotFoundError:
        out["file"] = "absent"
    except (PlanFileError, OSError) as e:
        out["file"], out["reason"] = "rejected", str(e)
    return out


def status(resolve: bool = False) -> dict[str, Any]:
    """What ``vkc doctor`` shows: the settings, the default path namespace inputs, every started cache, and with
    ``resolve`` the native file this process would use (:func:`inspect`)."""
    out: dict[str, Any] = {}
    try:
        cfg = _config.from_env()
        out["config"] = {"mode": cfg.mode, "path": str(cfg.path) if cfg.path else None,
                         "flashinfer": str(cfg.flashinfer) if cfg.flashinfer else None, "delay_us": cfg.delay_us,
                         "defaults": cfg.defaults}
    except PlanConfigError as e:
        out["config_error"] = str(e)
    root = _config.cache_root()
    out["cache_root"] = str(root) if root else None
    out["tactics"] = {a: tactics.tactic_set(a) for a in tactics.TACTICS}
    dflt = {}
    for a in tactics.TACTICS:
        try:
            m, p = _defaults.read(a)
            dflt[a] = {"plans": len(p), "source": m.get("source"), "note": m.get("note")}
        except (PlanFileError, OSError) as e:
            dflt[a] = {"error": str(e)}
    out["defaults"] = dflt
    out["caches"] = [c.report() for c in list(_caches.values())]
    if resolve and "config_error" not in out:
        try:
            out["file"] = inspect()
        except Exception as e:  # reported (doctor), never fatal
            out["file"] = {"error": f"{type(e).__name__}: {e}"}
    return out
