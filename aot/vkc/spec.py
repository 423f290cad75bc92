"""Declarative AOT specifications (importable without Triton).

A kernel family lives in ``kernels_src/<family>/``: Triton sources plus one ``spec.py`` that imports
only this module and defines ``SPECS``: a list of :class:`KernelSpec`. ``vkc verify`` reads the specs by
importing ``spec.py`` alone, so it never needs Triton.

Example::

    from vkc.spec import KernelSpec, Arg

    SPECS = [
        KernelSpec(
            name="rmsnorm.b2048", source="norm.py", entry="rmsnorm_kernel",
            args=[Arg("x", "*bf16", div=16), Arg("n_cols", "i32"), Arg("eps", "fp32")],
            constexprs={"BLOCK": 2048}, num_warps=4,
            overrides={"sm_80": {"num_warps": 8}},
        ),
    ]

Identity of a compiled specialization (a *base*): family, name, source, entry, args (types + hints),
constexpr pins, num_warps/stages/ctas, options and the arch. ``overrides`` replace any of
``num_warps``, ``num_stages``, ``num_ctas``, ``constexprs`` (merged), ``options`` (merged) per arch;
``archs`` restricts a spec to some archs (default: all seven).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from vkc_contract import abi
from vkc_contract.arch import ALL_ARCHS, ARCHS

_NAME_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Options that change generated code; each is pinned explicitly in every base (Triton 3.10 changes the enable_fp_fusion default).
DEFAULT_OPTIONS: dict[str, Any] = {"enable_fp_fusion": True}
ALLOWED_OPTIONS = frozenset({"enable_fp_fusion", "maxnreg", "launch_pdl", "launch_cooperative_grid"})
OVERRIDABLE = frozenset({"num_warps", "num_stages", "num_ctas", "constexprs", "options", "allow_spills"})


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class Arg:
    """One runtime (non-constexpr) kernel argument, in declaration order."""
    name: str
    type: str
    div: int | None = None  # tt.divisibility hint (16) the runtime checks before launch

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.div:
            d["divisibility"] = self.div
        return d


@dataclass(frozen=True)
class ScratchContract:
    """A promise the runtime must keep for a buffer argument, e.g. ``zero_filled``."""
    arg: str
    requirement: str  # "zero_filled" | "poison_ok"
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"arg": self.arg, "requirement": self.requirement, "note": self.note}


@dataclass(frozen=True)
class KernelSpec:
    name: str
    source: str
    entry: str
    args: list[Arg]
    constexprs: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 1
    num_ctas: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    archs: tuple[str, ...] = ALL_ARCHS
    allow_spills: bool = False
    scratch: tuple[ScratchContract, ...] = ()
    family: str = ""  # filled in by discovery from the folder name

    def validate(self) -> None:
        where = f"spec {self.family}.{self.name}"
        if not _NAME_RE.match(self.name):
            raise SpecError(f"{where}: name must match {_NAME_RE.pattern}")
        if not _IDENT_RE.match(self.entry):
            raise SpecError(f"{where}: entry {self.entry!r} is not an identifier")
        if not self.source.endswith(".py") or "/" in self.source or "\\" in self.source:
            raise SpecError(f"{where}: source must be a .py file in the family folder, got {self.source!r}")
        seen = set()
        for a in self.args:
            if a.name in seen or a.name in self.constexprs:
                raise SpecError(f"{where}: argument {a.name!r} declared twice")
            seen.add(a.name)
            try:
                abi.pack_code(a.type)
            except ValueError as e:
                raise SpecError(f"{where}: argument {a.name!r}: {e}") from None
            if a.div not in (None, abi.DIVISIBILITY):
                raise SpecError(f"{where}: argument {a.name!r}: divisibility must be 16 or None")
            if a.div and a.type not in ("i32", "i64") and not abi.is_pointer(a.type):
                raise SpecError(f"{where}: argument {a.name!r}: divisibility applies to pointers and ints only")
        for k, v in self.constexprs.items():
            if not isinstance(v, (bool, int, float, str)):
                raise SpecError(f"{where}: constexpr {k}={v!r} must be bool/int/float/str")
        for opt in self.options:
            if opt not in ALLOWED_OPTIONS:
                raise SpecError(f"{where}: option {opt!r} not in {sorted(ALLOWED_OPTIONS)}")
        for arch in self.archs:
            if arch not in ALL_ARCHS:
                raise SpecError(f"{where}: unknown arch {arch!r}")
        for arch, ov in self.overrides.items():
            if arch not in ALL_ARCHS:
                raise SpecError(f"{where}: override for unknown arch {arch!r}")
            bad = set(ov) - OVERRIDABLE
            if bad:
                raise SpecError(f"{where}: override keys {sorted(bad)} not in {sorted(OVERRIDABLE)}")
        for c in self.scratch:
            if c.arg not in seen:
                raise SpecError(f"{where}: scratch contract names unknown argument {c.arg!r}")
            if c.requirement not in ("zero_filled", "poison_ok"):
                raise SpecError(f"{where}: scratch requirement {c.requirement!r} unknown")
        if self.num_ctas > 1 and any(a in ("sm_80", "sm_86", "sm_89") for a in self.archs):
            raise SpecError(f"{where}: num_ctas > 1 needs sm_90+; restrict archs")
        for arch in self.archs:
            rs = self.for_arch(arch)
            pdl, attr = rs.constexprs.get("PDL", False), rs.options.get("launch_pdl", False)
            if bool(pdl) != bool(attr):
                # launched with the attribute but no wait: it would read the previous kernel's outputs early
                raise SpecError(f"{where} on {arch}: constexpr PDL={pdl} and option launch_pdl={attr} must "
                                f"agree (use with_pdl)")
            if attr and arch not in PDL_ARCHS:
                raise SpecError(f"{where}: launch_pdl on {arch}: griddepcontrol needs sm_90+")

    @property
    def base(self) -> str:
        return f"{self.family}.{self.name}"

    def for_arch(self, arch: str, tuned: dict[str, Any] | None = None) -> "ResolvedSpec":
        """The spec with per-arch overrides (and then tuning data) applied."""
        if arch not in self.archs:
            raise SpecError(f"spec {self.base} is not built for {arch}")
        cfg: dict[str, Any] = {
            "num_warps": self.num_warps, "num_stages": self.num_stages, "num_ctas": self.num_ctas,
            "constexprs": dict(self.constexprs), "options": {**DEFAULT_OPTIONS, **self.options},
            "allow_spills": self.allow_spills,
        }
        applied: dict[str, Any] = {}
        for layer in (self.overrides.get(arch), tuned):
            if not layer:
                continue
            for k, v in layer.items():
                if k in ("constexprs", "options"):
                    cfg[k] = {**cfg[k], **v}
                else:
                    cfg[k] = v
                applied[k] = v
        return ResolvedSpec(spec=self, arch=arch, applied=applied, **cfg)


@dataclass(frozen=True)
class ResolvedSpec:
    spec: KernelSpec
    arch: str
    num_warps: int
    num_stages: int
    num_ctas: int
    constexprs: dict[str, Any]
    options: dict[str, Any]
    allow_spills: bool
    applied: dict[str, Any]

    def inputs_json(self) -> dict[str, Any]:
        """The manifest's record of this base's inputs (everything that defines the compile)."""
        s = self.spec
        return {
            "family": s.family,
            "source": f"kernels_src/{s.family}/{s.source}",
            "entry": s.entry,
            "signature": [a.to_json() for a in s.args],
            "constexprs": dict(sorted(self.constexprs.items())),
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "num_ctas": self.num_ctas,
            "options": dict(sorted(self.options.items())),
            "overrides": _jsonable(self.applied),
            "allow_spills": self.allow_spills,
            "scratch": [c.to_json() for c in s.scratch],
        }


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (dict(sorted(v.items())) if isinstance(v, dict) else v) for k, v in sorted(d.items())}


PDL_ARCHS: tuple[str, ...] = tuple(a for a in ALL_ARCHS if ARCHS[a].cc >= (9, 0))  # griddepcontrol


def pow2_split(n: int) -> dict[str, int]:
    """``n`` (>= 1) as the largest power of two not above it plus the rest, as the constexprs ``SB`` / ``SBX`` of
    kernels that hold n slots in a power-of-two tile and a remainder tile (the MoE decode down kernels: 9 picks
    as 8 + 1)."""
    if n < 1:
        raise SpecError(f"pow2_split needs n >= 1, got {n}")
    sb = 1 << (n.bit_length() - 1)
    return {"SB": sb, "SBX": n - sb}


def with_pdl(spec: KernelSpec) -> KernelSpec:
    """``spec`` launched with programmatic dependent launch where the arch has it (PDL_ARCHS): the constexpr
    PDL=True (the kernel calls kernels_src.common.pdl_enter) and the option launch_pdl=True (the runtime's
    launch attribute) together; PDL=False without the attribute on the older archs. validate() refuses the two
    apart: a kernel launched early must wait before it reads what the previous kernel writes."""
    overrides = {a: dict(ov) for a, ov in spec.overrides.items()}
    for arch in spec.archs:
        if arch in PDL_ARCHS:
            continue
        ov = overrides.setdefault(arch, {})
        ov["constexprs"] = {**ov.get("constexprs", {}), "PDL": False}
        ov["options"] = {**ov.get("options", {}), "launch_pdl": False}
    return replace(spec, constexprs={**spec.constexprs, "PDL": True},
                   options={**spec.options, "launch_pdl": True}, overrides=overrides)


def with_family(spec: KernelSpec, family: str) -> KernelSpec:
    return replace(spec, family=family)
