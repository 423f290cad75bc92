"""The one architecture table of vkc (build side and run side both read it).

Binary compatibility rules (CUDA): a cubin built for ``sm_XY`` runs on devices of the same major
version with minor >= Y; an ``a``-suffixed cubin (``sm_90a``, ``sm_100a``, ...) runs only on exactly
that compute capability. Triton names every target with cc >= 90 with the ``a`` suffix.

Runtime selection: the exact arch for the device first, then the documented fallbacks in
``FALLBACKS`` (only plain, non-``a`` archs of the same major version with a lower minor).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str            # "sm_90a"
    cc: tuple[int, int]  # compute capability (9, 0)
    triton_cc: int       # GPUTarget("cuda", triton_cc, 32)
    max_smem_optin: int  # bytes of dynamic shared memory a block may opt into
    example: str
    mma: str
    fp8_mma: bool
    fp4_mma: bool

    @property
    def arch_specific(self) -> bool:
        return self.name.endswith("a")

    @property
    def sass_name(self) -> str:
        """What ``cuobjdump --list-elf`` prints for a cubin of this arch."""
        return self.name


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("sm_80", (8, 0), 80, 163 * 1024, "A100", "HMMA (mma.sync)", False, False),
    Arch("sm_86", (8, 6), 86, 99 * 1024, "A10, RTX 30", "HMMA", False, False),
    Arch("sm_89", (8, 9), 89, 99 * 1024, "L4, L40S, RTX 40", "HMMA", True, False),
    Arch("sm_90a", (9, 0), 90, 227 * 1024, "H100, H200", "wgmma (HGMMA), TMA", True, False),
    Arch("sm_100a", (10, 0), 100, 227 * 1024, "B200, GB200", "tcgen05 (UTCHMMA), TMEM", True, True),
    Arch("sm_120a", (12, 0), 120, 99 * 1024, "RTX 50, RTX PRO 6000", "HMMA", True, True),
    Arch("sm_121a", (12, 1), 121, 99 * 1024, "GB10 (DGX Spark)", "HMMA", True, True),
)}

ALL_ARCHS: tuple[str, ...] = tuple(ARCHS)

# Arch the H200 behind the device tool runs: the only runtime-verified one.
RUNTIME_VERIFIED: frozenset[str] = frozenset({"sm_90a"})

# Documented fallbacks for a device cc that has no exact artifact set. Only plain archs can serve
# other devices; an sm_80 cubin runs on any 8.x device (correctness there is build-verified only).
FALLBACKS: dict[tuple[int, int], tuple[str, ...]] = {
    (8, 7): ("sm_86", "sm_80"),  # Jetson Orin
    (8, 6): ("sm_80",),
    (8, 9): ("sm_86", "sm_80"),
}


def get(name: str) -> Arch:
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"unknown arch {name!r}; known: {', '.join(ALL_ARCHS)}") from None


def candidates_for_cc(cc: tuple[int, int]) -> list[str]:
    """Arch names whose cubins can run on a device of compute capability ``cc``, best first."""
    out = [a.name for a in ARCHS.values() if a.cc == cc]
    for name in FALLBACKS.get(tuple(cc), ()):
        a = ARCHS[name]
        assert not a.arch_specific and a.cc[0] == cc[0] and a.cc[1] <= cc[1]
        out.append(name)
    return out
