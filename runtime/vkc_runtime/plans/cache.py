"""The plan cache of one device: lookup priority, single-flight miss tuning, warm-up lifecycle, start report.

Lookup (:meth:`PlanCache.lookup`), first hit wins: an imported FlashInfer entry with exactly this key, then the
native map (entries loaded from the native file and entries tuned in this process share it), then the bundled
default plan of the arch. A hit never tunes or times anything.

Lifecycle: :meth:`start` resolves and loads everything once, before any warm-up (never inside a graph
capture: :func:`capturing`); :meth:`warmup` takes the declared keys, fails in ``frozen`` mode before tuning
anything when one is missing, tunes each missing key once (single-flight: concurrent callers of one key
wait for the first), installs it into the native map that later calls (and graph capture) read, and only
after every key succeeded publishes the merged file (``readwrite`` mode with a path). A failed warm-up
publishes nothing. :meth:`choose` is the per-call lookup: a miss there is counted (``lazy_misses``) and, in
``frozen`` mode, an error.
"""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from . import store, tactics as T
from .config import PlanConfig
from .keys import PlanKey
from .tuning import Timer, measure, select

__all__ = ["PlanError", "PlanMissError", "PlanCache", "capturing", "in_capture"]


class PlanError(RuntimeError):
    """The plan cache cannot do what was asked (the message says why)."""


class PlanMissError(PlanError):
    """Frozen mode: a key has no plan."""


_capture = threading.local()


@contextlib.contextmanager
def capturing():
    """Mark a graph capture on this thread: the plan cache neither parses, tunes nor writes inside it."""
    _capture.depth = getattr(_capture, "depth", 0) + 1
    try:
        yield
    finally:
        _capture.depth -= 1


def in_capture() -> bool:
    return getattr(_capture, "depth", 0) > 0


def _no_capture(what: str) -> None:
    if in_capture():
        raise PlanError(f"plan cache: {what} inside a graph capture (resolve plans before capturing)")


class PlanCache:
    def __init__(self, arch: str, meta: Mapping[str, Any], config: PlanConfig, *, path: Path | None,
                 defaults: Mapping[PlanKey, int] | None = None, default_note: str | None = None,
                 flashinfer: Callable[[], Mapping[PlanKey, int]] | None = None, log: Callable[[str], None] | None = None):
        self.arch, self.meta, self.config, self.path = arch, dict(meta), config, path
        self.fingerprint = store.fingerprint(self.meta)
        self._defaults = dict(defaults or {})
        self._default_note = default_note
        self._flashinfer_loader = flashinfer
        self._log = log
        self._imported: dict[PlanKey, int] = {}
        self._native: dict[PlanKey, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._inflight: dict[PlanKey, threading.Event] = {}
        self.started = self.ready = False
        self.file_state = "not read"   # start(): absent / valid, N plans / rejected: why / not read (mode off, no path)
        self.declared = 0              # keys of the last warm-up
        self.stats = {"loaded": 0, "imported": 0, "defaults": len(self._defaults), "tuned": 0, "rejected": 0,
                      "saved": 0, "lazy_misses": 0, "tune_calls": 0}
        self.rejections: list[str] = []

    # ------------------------------------------------------------------ start
    def start(self) -> dict[str, Any]:
        """Load the FlashInfer import and the native file (once). Returns the start report."""
        _no_capture("loading plan files")
        with self._lock:
            if self.started:
                return self.report()
            if self._flashinfer_loader is not None:
                try:
                    self._imported = dict(self._flashinfer_loader())
                    self.stats["imported"] = len(self._imported)
                except (ValueError, OSError) as e:  # FlashInfer import rejected as a unit
                    self.stats["rejected"] += 1
                    self.rejections.append(f"flashinfer import: {e}")
                    if self.config.mode == "frozen":
                        raise PlanError(f"frozen plan cache: FlashInfer import rejected: {e}") from None
            if self.config.mode != "off" and self.path is not None:
                try:
                    self._native = store.load(self.path, self.meta)
                    self.stats["loaded"] = len(self._native)
                    self.file_state = f"valid, {len(self._native)} plans"
                except FileNotFoundError:
                    self.file_state = "absent"
                except (store.PlanFileError, OSError) as e:
                    self.stats["rejected"] += 1
                    self.rejections.append(f"{self.path}: {e}")
                    self.file_state = f"rejected: {e}"
                    if self.config.mode == "frozen":
                        raise PlanError(f"frozen plan cache: {self.path} rejected: {e}") from None
            if self.config.mode == "frozen" and self.path is None:
                raise PlanError("frozen plan cache needs a plan file (VKC_PLAN_CACHE or a usable cache root)")
            self.started = True
        if self._log:
            self._log(self.start_line())
        return self.report()

    # ------------------------------------------------------------------ lookup
    def lookup(self, key: PlanKey) -> tuple[int, str] | None:
        t = self._imported.get(key)
        if t is not None:
            return t, "flashinfer"
        e = self._native.get(key)
        if e is not None:
            return e["tactic"], e.get("_source", "file")
        t = self._defaults.get(key)
        if t is not None:
            return t, "default"
        return None

    def choose(self, key: PlanKey) -> int | None:
        """The per-call choice (no parse, no tuning): the plan's tactic, else None (the op's documented rule)."""
        hit = self.lookup(key)
        if hit is not None:
            return hit[0]
        self.stats["lazy_misses"] += 1
        if self.config.mode == "frozen":
            raise PlanMissError(f"frozen plan cache ({self.path}): no plan for {key}; run a readwrite warm-up "
                                f"that declares it, or unfreeze (VKC_PLAN_CACHE_MODE)")
        return None

    def candidates(self, key: PlanKey) -> list[T.Tactic]:
        return [t for t in T.tactics_for(self.arch)
                if (t.runner, t.dtype, t.layout) == (key.runner, key.dtype, key.layout)]

    # ------------------------------------------------------------------ warm-up
    def warmup(self, keys: Iterable[PlanKey], make_run: Callable[[PlanKey, int], Callable[[], None]],
               timer: Timer) -> dict[str, Any]:
        """Resolve every declared key (module docstring); returns the report."""
        _no_capture("warm-up")
        if not self.started:
            self.start()
        keys = list(dict.fromkeys(keys))
        self.declared = len(keys)
        missing = [k for k in keys if self.lookup(k) is None]
        if missing and self.config.mode == "frozen":
            raise PlanMissError(f"frozen plan cache ({self.path}, file {self.file_state}): {len(missing)} of "
                                f"{len(keys)} declared keys have no plan, e.g. {missing[0]}; nothing was tuned or "
                                f"written")
        for k in missing:
            self._tune(k, make_run, timer)
        self.ready = True
        if self.config.mode == "readwrite" and self.path is not None and self.stats["tuned"]:
            self.save()
        return self.report()

    def _tune(self, key: PlanKey, make_run, timer: Timer) -> int:
        with self._lock:
            e = self._native.get(key)
            if e is not None:
                return e["tactic"]
            ev = self._inflight.get(key)
            owner = ev is None
            if owner:
                ev = self._inflight[key] = threading.Event()
        if not owner:
            ev.wait()
            e = self._native.get(key)
            if e is None:
                raise PlanError(f"tuning {key} failed in another thread")
            return e["tactic"]
        try:
            cands = self.candidates(key)
            if not cands:
                raise PlanError(f"no {self.arch} tactic runs {key}")
            times = []
            for t in cands:
                self.stats["tune_calls"] += 1
                times.append((t.id, measure(timer, make_run(key, t.id), self.config.delay_us)))
            best = select(times)
            ent = store.entry(self.arch, key, best, out_dtype=self.meta["out_dtype"],
                              scale_layout=self.meta["scale_layout"])
            ent["_source"] = "tuned"
            with self._lock:
                self._native[key] = ent
                self.stats["tuned"] += 1
            return best
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            ev.set()

    def save(self) -> int:
        """Publish the native map merged over the file on disk (atomic); the number of entries written."""
        _no_capture("writing the plan file")
        if self.path is None or self.config.mode != "readwrite":
            raise PlanError(f"plan cache mode {self.config.mode} with path {self.path}: nothing to save to")
        cur = {k: {f: v for f, v in e.items() if not f.startswith("_")} for k, e in self._native.items()}
        n, rejected = store.publish(self.path, self.meta, cur)
        if rejected:
            self.stats["rejected"] += 1
            self.rejections.append(f"{self.path}: replaced a rejected file at save")
        self.stats["saved"] = n
        return n

    # ------------------------------------------------------------------ report
    def native_entries(self) -> dict[PlanKey, dict[str, Any]]:
        """The native map (file + tuned entries) as plan-file entries, by key."""
        with self._lock:
            return {k: {f: v for f, v in e.items() if not f.startswith("_")} for k, e in self._native.items()}

    def selected(self) -> dict[str, int]:
        """Every key this cache can answer and its tactic, as sorted ``str(key) -> id`` (the selection map)."""
        keys = set(self._defaults) | set(self._native) | set(self._imported)
        return {str(k): self.lookup(k)[0] for k in sorted(keys)}

    def report(self) -> dict[str, Any]:
        return {"arch": self.arch, "path": str(self.path) if self.path else None, "mode": self.config.mode,
                "fingerprint": self.fingerprint, "delay_us": self.config.delay_us, "started": self.started,
                "ready": self.ready, "file": self.file_state, "declared": self.declared, **self.stats,
                "rejections": list(self.rejections),
                "default_plan": self._default_note}

    def start_line(self) -> str:
        s = self.stats
        return (f"vkc plans: {self.arch} mode={self.config.mode} path={self.path or '(process-local)'} "
                f"fingerprint={self.fingerprint} file={self.file_state} loaded={s['loaded']} imported={s['imported']} "
                f"defaults={s['defaults']} tuned={s['tuned']} rejected={s['rejected']} saved={s['saved']}")
