"""Per-kind artifact checks of `vkc verify`: a registry ``CHECKERS`` (artifact kind -> checker).

Each checker gets one manifest kernel entry and returns :class:`~vkc.checks.Problem` s; all of them need
only the artifact root (manifest + files), never the kernel sources or Triton, so they run in a source
checkout and in an installed wheel alike. Kinds and their loaders: :data:`vkc_contract.layout.ARTIFACT_KINDS`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from vkc_contract import abi
from vkc_contract.arch import Arch
from vkc_contract.arch import get as get_arch
from vkc_contract.hashing import sha256_bytes
from vkc_contract.layout import ARTIFACT_KINDS, CUTE_SO, HOST_ELF_MACHINE, TRITON_CUBIN, kind_relpath

from vkc import elf, hostelf
from vkc.checks import Problem, problem


@dataclass
class Ctx:
    root: Path
    arch: str
    a: Arch = field(init=False)
    fix: str = field(init=False)
    seen: set[str] = field(default_factory=set)  # artifact paths whose file checks already ran

    def __post_init__(self) -> None:
        self.a = get_arch(self.arch)
        self.fix = f"run `vkc regen --arch {self.arch}`"

    def p(self, check: str, **fields: Any) -> Problem:
        return problem(check, self.arch, fix=self.fix, **fields)


def artifacts_of(k: dict[str, Any]) -> list[dict[str, Any]]:
    """The artifact entries of one kernel entry: ``artifact`` (device code) or ``artifacts`` (host code)."""
    return list(k["artifacts"]) if "artifacts" in k else [k["artifact"]]


def kind_of(k: dict[str, Any]) -> str:
    return artifacts_of(k)[0]["kind"]


def _file(ctx: Ctx, name: str, art: dict[str, Any], host: str | None) -> tuple[list[Problem], bytes | None]:
    """Checks every kind shares: loader, canonical path, presence, size and sha256. Returns the bytes if intact."""
    P: list[Problem] = []
    kind, rel = art["kind"], art["path"]
    want_loader = ARTIFACT_KINDS[kind].loader
    if art["loader"] != want_loader:
        P.append(ctx.p("kind-loader", name=name, rel=rel, kind=kind, want=want_loader, got=art["loader"]))
    want = kind_relpath(kind, ctx.arch, name, host)
    if rel != want:
        P.append(ctx.p("artifact-path", name=name, rel=rel, want=want))
    f = ctx.root / rel
    if not f.is_file():
        return P + [ctx.p("artifact-missing", name=name, rel=rel)], None
    data = f.read_bytes()
    if len(data) != art["size"] or sha256_bytes(data) != art["sha256"]:
        return P + [ctx.p("artifact-modified", name=name, rel=rel)], None
    return P, data


def check_triton_cubin(ctx: Ctx, name: str, k: dict[str, Any]) -> list[Problem]:
    """One cubin per kernel: SASS arch from the ELF header, launch metadata vs ``.nv.info``, resources."""
    a, art = ctx.a, k["artifact"]
    rel = art["path"]
    P, data = _file(ctx, name, art, None)
    if data is None:
        return P
    try:
        cub = elf.parse(data)
    except elf.CubinError as e:
        return P + [ctx.p("not-cubin", name=name, rel=rel, err=e)]
    want_sm = a.cc[0] * 10 + a.cc[1]
    if cub.sm != want_sm:
        P.append(ctx.p("cubin-sass", name=name, rel=rel, sm=cub.sm))
    R, L, inp = k["resources"], k["launch"], k["inputs"]
    if R["sass_arch"] != a.sass_name:
        P.append(ctx.p("resources-sass", name=name, got=R["sass_arch"]))
    if L["name"] != inp["entry"]:
        P.append(ctx.p("launch-name", name=name, got=L["name"], want=inp["entry"]))
    if L["num_warps"] != inp["num_warps"] or L["num_ctas"] != inp["num_ctas"]:
        P.append(ctx.p("launch-warps-ctas", name=name))
    info = cub.kernels.get(L["name"])
    if info is None:
        return P + [ctx.p("entry-symbol", name=name, rel=rel, entry=L["name"])]
    if info.reqntid is not None and info.reqntid[0] != 32 * L["num_warps"]:
        P.append(ctx.p("reqntid", name=name, got=info.reqntid[0], want=32 * L["num_warps"]))
    sizes = [s for _, _, s in info.params]
    want = [p["size"] for p in k["params"]]
    if info.params and sizes != want:
        P.append(ctx.p("param-sizes", name=name, got=sizes, want=want))
    if any(p["code"] != abi.pack_code(p["type"]) for p in k["params"]):
        P.append(ctx.p("pack-codes", name=name))
    if R["spills"] and not inp["allow_spills"]:
        P.append(ctx.p("spills", name=name))
    smem = L["shared"] + R["shared_static"]
    if smem > a.max_smem_optin:
        P.append(ctx.p("shared-memory", name=name, got=smem, limit=a.max_smem_optin))
    return P


def check_cute_so(ctx: Ctx, name: str, k: dict[str, Any]) -> list[Problem]:
    """Host shared objects, one per (arch, family, host platform), shared by the family's kernels: ELF
    class and machine of the recorded host platform, the launchers this kernel needs exported, no NEEDED library
    beyond glibc, the kernel's recorded cubin (``launch.cubin_sha256``) embedded, and the SASS arch of the
    embedded cubins where the manifest records it."""
    P: list[Problem] = []
    for art in k["artifacts"]:
        rel, host = art["path"], art["host_platform"]
        first = rel not in ctx.seen
        ctx.seen.add(rel)
        F, data = _file(ctx, name, art, host)
        if first:  # file-level problems once per file, not once per kernel sharing it
            P.extend(F)
        if data is None:
            continue
        try:
            so = hostelf.parse(data)
        except hostelf.HostElfError as e:
            if first:
                P.append(ctx.p("not-shared-object", name=name, rel=rel, err=e))
            continue
        if not so.is_platform(HOST_ELF_MACHINE[host]):
            if first:
                P.append(ctx.p("host-machine", name=name, rel=rel, got=so.description, host=host))
            continue
        missing = [s for s in art["symbols"] if s not in so.exported]
        if missing:
            P.append(ctx.p("missing-symbol", name=name, rel=rel, symbols=", ".join(missing)))
        extra = [n for n in so.needed if n not in hostelf.ALLOWED_NEEDED]
        if extra and first:
            P.append(ctx.p("host-needed", name=name, rel=rel, libs=", ".join(extra)))
        want_cubin = (k.get("launch") or {}).get("cubin_sha256")
        if want_cubin and want_cubin not in {sha256_bytes(c.data) for c in so.cubins}:
            P.append(ctx.p("embedded-cubin-missing", name=name, rel=rel, sha=want_cubin[:12]))
        want = art.get("sass_arch")
        if want is None or not first:
            continue
        if want != ctx.a.sass_name:
            P.append(ctx.p("host-sass-recorded", name=name, rel=rel, got=want))
            continue
        if not so.cubins:
            P.append(ctx.p("no-embedded-cubin", name=name, rel=rel, want=want))
        want_sm = ctx.a.cc[0] * 10 + ctx.a.cc[1]
        for sm in sorted({c.sm for c in so.cubins if c.sm != want_sm}):
            P.append(ctx.p("embedded-sass", name=name, rel=rel, sm=sm, want=want))
    return P


CHECKERS: dict[str, Callable[[Ctx, str, dict[str, Any]], list[Problem]]] = {
    TRITON_CUBIN: check_triton_cubin,
    CUTE_SO: check_cute_so,
}


def check_kernel(ctx: Ctx, name: str, k: dict[str, Any]) -> list[Problem]:
    """Run the checker of the kernel's artifact kind (the schema admits only kinds listed here)."""
    return CHECKERS[kind_of(k)](ctx, name, k)
