"""The plan cache's settings, read from the environment once per resolution (every bad value is a hard error).

======================  ===========================================================================================
``VKC_PLAN_CACHE_MODE``  ``readwrite`` (default): load the native file, tune missing declared keys in a warm-up,
                         publish after it; ``frozen``: load only, a missing declared key fails the warm-up before
                         anything is tuned or written, and a per-call miss raises; ``off``: no plan file is read
                         or written (a warm-up's tuning stays in this process; default plan and rule as usual)
``VKC_PLAN_CACHE``       the native plan file (overrides the default path below)
``VKC_PLAN_FLASHINFER``  a FlashInfer ``autotune_configs.json`` imported read-only before the native file
``VKC_PLAN_TUNE_DELAY_US`` the stream delay before the timed repeats of a miss, in microseconds (default 5000;
                         0 turns the delay off; an integer 0..10000000, anything else is an error)
``VKC_PLAN_DEFAULTS``    ``1`` (default) or ``0``: use the committed per-arch default plan
======================  ===========================================================================================

Default path: ``${XDG_CACHE_HOME:-$HOME/.cache}/vkc/gemm_plans/<format>/<arch>/<fingerprint>/plans.json``, the
fingerprint a hash of every compatibility input (:func:`vkc_runtime.plans.store.fingerprint`). A relative
``XDG_CACHE_HOME`` is ignored (XDG base-directory rules); with no usable root the cache stays process-local
(one warning; nothing else changes).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PlanConfigError", "PlanConfig", "MODES", "from_env", "cache_root", "DEFAULT_DELAY_US",
           "WARMUPS", "REPEATS"]

MODES = ("off", "readwrite", "frozen")
DEFAULT_DELAY_US = 5000
MAX_DELAY_US = 10_000_000
WARMUPS = 3
REPEATS = 10


class PlanConfigError(ValueError):
    """A VKC_PLAN_* variable has a value the plan cache cannot use."""


@dataclass(frozen=True)
class PlanConfig:
    mode: str = "readwrite"
    path: Path | None = None          # explicit native file (VKC_PLAN_CACHE)
    flashinfer: Path | None = None
    delay_us: int = DEFAULT_DELAY_US
    defaults: bool = True

    def __post_init__(self):
        if self.mode not in MODES:
            raise PlanConfigError(f"plan cache mode {self.mode!r} is not one of {', '.join(MODES)}")
        if type(self.delay_us) is not int or not 0 <= self.delay_us <= MAX_DELAY_US:
            raise PlanConfigError(f"tune delay {self.delay_us!r} us must be an integer in 0..{MAX_DELAY_US}")


def _int_env(name: str, value: str, lo: int, hi: int) -> int:
    v = value.strip()
    if not v or not (v.isdigit() and v.isascii()):
        raise PlanConfigError(f"{name}={value!r}: expected a decimal integer in {lo}..{hi}")
    n = int(v)
    if not lo <= n <= hi:
        raise PlanConfigError(f"{name}={value!r}: out of range {lo}..{hi}")
    return n


def _path_env(env, name: str) -> Path | None:
    v = env.get(name)
    if v is None or v == "":
        return None
    p = Path(v).expanduser()
    if not p.is_absolute():
        p = Path.cwd() / p
    return p


def from_env(env=None) -> PlanConfig:
    env = os.environ if env is None else env
    mode = env.get("VKC_PLAN_CACHE_MODE", "readwrite").strip().lower() or "readwrite"
    if mode not in MODES:
        raise PlanConfigError(f"VKC_PLAN_CACHE_MODE={env.get('VKC_PLAN_CACHE_MODE')!r}: expected one of "
                              f"{', '.join(MODES)}")
    delay = DEFAULT_DELAY_US
    if env.get("VKC_PLAN_TUNE_DELAY_US") is not None:
        delay = _int_env("VKC_PLAN_TUNE_DELAY_US", env["VKC_PLAN_TUNE_DELAY_US"], 0, MAX_DELAY_US)
    d = env.get("VKC_PLAN_DEFAULTS", "1").strip()
    if d not in ("0", "1"):
        raise PlanConfigError(f"VKC_PLAN_DEFAULTS={env.get('VKC_PLAN_DEFAULTS')!r}: expected 0 or 1")
    return PlanConfig(mode=mode, path=_path_env(env, "VKC_PLAN_CACHE"),
                      flashinfer=_path_env(env, "VKC_PLAN_FLASHINFER"), delay_us=delay, defaults=d == "1")


def cache_root(env=None) -> Path | None:
    """``$XDG_CACHE_HOME`` (absolute only), else ``$HOME/.cache``; None when neither is usable."""
    env = os.environ if env is None else env
    x = env.get("XDG_CACHE_HOME", "")
    if x and os.path.isabs(x):
        return Path(x)
    h = env.get("HOME", "")
    if h and os.path.isabs(h):
        return Path(h) / ".cache"
    return None
