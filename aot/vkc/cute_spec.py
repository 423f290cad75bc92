"""Declarative specs of CuTe DSL kernels (importable without the DSL), the CuTe lane's twin of :mod:`vkc.spec`.

A family's ``kernels_src/<family>/spec.py`` may define ``CUTE_SPECS`` next to (or instead of) ``SPECS``: a list
of :class:`CuteKernelSpec`. Each is one kernel class of one DSL source compiled with one configuration (the
keyword arguments its constructor takes); ``vkc regen`` compiles every spec of an arch in one fresh DSL process
and links them, with vkc's driver-API shim, into one shared object per (arch, family, host platform)
(ARCHITECTURE.md, "Compiler lanes").

Example::

    from vkc.cute_spec import CuteKernelSpec

    CUTE_SPECS = [
        CuteKernelSpec(name="bf16.t128x256", source="sm90_wgmma.py", kernel_class="Sm90BF16Gemm",
                       abi="gemm_bf16", archs=("sm_90a",),
                       config={"tile_m": 128, "tile_n": 256, "stages": 4, "epi_stages": 2, "group_m": 8}),
    ]

The base name is ``<family>.<name>``; its C launcher is exported as ``vkc_cute_<family>_<name with dots as
underscores>``. ``abi`` names the launcher's C signature, one of :data:`ABIS`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from vkc_contract.arch import ALL_ARCHS

from vkc.spec import SpecError

_NAME_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# The C signatures a CuTe launcher can have (the glue generator packs each; the runtime's ops call them).
ABIS: dict[str, str] = {
    # C[m, n] (row stride ldc) = A[m, k] (lda) @ W[n, k]^T (ldw); bf16, row-major; returns a CUresult
    "gemm_bf16": ("int32_t {symbol}(const void *a, int64_t lda, const void *w, int64_t ldw, void *c, int64_t ldc, "
                  "int64_t m, int64_t n, int64_t k, void *stream)"),
    # the same with fp8 e4m3 A / W and fp32 scales: C = (A @ W^T) * sa[m * sa_step] * sw[n * sw_step]
    "gemm_fp8": ("int32_t {symbol}(const void *a, int64_t lda, const void *w, int64_t ldw, void *c, int64_t ldc, "
                 "const void *sa, int64_t sa_step, const void *sw, int64_t sw_step, "
                 "int64_t m, int64_t n, int64_t k, void *stream)"),
    # block-scaled fp8: C = sum_kt (A[:, kt] @ W[:, kt]^T) * sa[m * ldsa + kt] * sw[(n / 128) * ldsw + kt] over the
    # 128-wide k-slices kt; sa [m, ceil(k / 128)], sw [ceil(n / 128), ceil(k / 128)] fp32 with row strides
    "gemm_fp8_block": ("int32_t {symbol}(const void *a, int64_t lda, const void *w, int64_t ldw, void *c, "
                       "int64_t ldc, const void *sa, int64_t ldsa, const void *sw, int64_t ldsw, "
                       "int64_t m, int64_t n, int64_t k, void *stream)"),
}
LOAD_SYMBOL = "vkc_cute_load"            # int32_t vkc_cute_load(int32_t device)
STATUS_SYMBOL = "vkc_cute_driver_status"  # int vkc_cute_driver_status(void)
FIXED_SYMBOLS = (STATUS_SYMBOL, LOAD_SYMBOL)


@dataclass(frozen=True)
class CuteKernelSpec:
    name: str                    # within the family, e.g. "bf16.t128x256"
    source: str                  # DSL module file in kernels_src/<family>/
    kernel_class: str            # the callable class the source defines; constructed as cls(**config)
    abi: str                     # key of ABIS
    archs: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)
    family: str = ""             # filled in by discovery

    @property
    def base(self) -> str:
        return f"{self.family}.{self.name}"

    @property
    def symbol(self) -> str:
        return f"vkc_cute_{self.family}_{self.name.replace('.', '_')}"

    @property
    def c_signature(self) -> str:
        return ABIS[self.abi].format(symbol=self.symbol)

    @property
    def module(self) -> str:
        """Dotted module of the source (imported inside the DSL process)."""
        return f"kernels_src.{self.family}.{self.source[:-3]}"

    def validate(self) -> None:
        if not _NAME_RE.match(self.name):
            raise SpecError(f"CuTe spec name {self.name!r} must be dotted lower-case identifiers")
        if not self.source.endswith(".py") or "/" in self.source:
            raise SpecError(f"CuTe spec {self.name}: source {self.source!r} must be a .py file of the family")
        if not _IDENT_RE.match(self.kernel_class):
            raise SpecError(f"CuTe spec {self.name}: kernel_class {self.kernel_class!r} is not an identifier")
        if self.abi not in ABIS:
            raise SpecError(f"CuTe spec {self.name}: abi {self.abi!r} not one of {sorted(ABIS)}")
        if not self.archs or any(a not in ALL_ARCHS for a in self.archs):
            raise SpecError(f"CuTe spec {self.name}: archs {self.archs} must be a non-empty subset of {ALL_ARCHS}")
        for k, v in self.config.items():
            if not _IDENT_RE.match(k) or not isinstance(v, (int, str, bool)):
                raise SpecError(f"CuTe spec {self.name}: config {k}={v!r} must be an identifier = int/str/bool")

    def inputs_json(self, deps: list[str]) -> dict[str, Any]:
        """The compile inputs a manifest entry records (and `vkc verify` compares with the spec)."""
        return {"family": self.family, "source": f"kernels_src/{self.family}/{self.source}", "deps": deps,
                "kernel_class": self.kernel_class, "abi": self.abi, "config": dict(sorted(self.config.items()))}

    def job_json(self) -> dict[str, Any]:
        """What the DSL process needs to compile this spec."""
        return {"base": self.base, "export": self.base.replace(".", "_"), "module": self.module,
                "kernel_class": self.kernel_class, "abi": self.abi, "config": dict(self.config)}


def with_family(s: CuteKernelSpec, family: str) -> CuteKernelSpec:
    if s.family and s.family != family:
        raise SpecError(f"CuTe spec {s.name} says family {s.family!r} but lives in kernels_src/{family}/")
    return replace(s, family=family, archs=tuple(s.archs))
