"""Compile one base (spec × arch) with Triton's Python API — the only module that imports Triton.

Runs inside regen worker processes whose environment was scrubbed by :func:`worker_env` (line info
off, no TRITON_* overrides, no interpreter), so the result depends only on recorded inputs.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vkc_contract import abi
from vkc_contract.arch import get as get_arch

from vkc.spec import ResolvedSpec, SpecError

LAUNCH_KEYS = ("name", "num_warps", "num_ctas", "shared", "global_scratch_size", "global_scratch_align",
               "profile_scratch_size", "profile_scratch_align", "launch_pdl", "launch_cooperative_grid",
               "tmem_size")


def worker_env(base_env: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in (base_env or os.environ).items() if not k.startswith("TRITON_")}
    env["TRITON_DISABLE_LINE_INFO"] = "1"
    env.pop("PTXAS_OPTIONS", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@dataclass
class Compiled:
    cubin: bytes
    ptx: str
    launch: dict[str, Any]
    params: list[dict[str, Any]]


def _kernel_fn(root: Path, family: str, source: str, entry: str):
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    mod = importlib.import_module(f"kernels_src.{family}.{source[:-3]}")
    fn = getattr(mod, entry, None)
    if fn is None:
        raise SpecError(f"kernels_src/{family}/{source} has no {entry!r}")
    return fn


def params_of(rs: ResolvedSpec) -> list[dict[str, Any]]:
    """The launch parameter list: runtime args in declaration order, then Triton's hidden pointers."""
    out = []
    for a in rs.spec.args:
        p = {"name": a.name, "type": a.type, "code": abi.pack_code(a.type), "size": abi.param_size(a.type)}
        if a.div:
            p["divisibility"] = a.div
        out.append(p)
    for h in abi.HIDDEN_PARAMS:
        out.append({"name": h, "type": abi.HIDDEN_TYPE, "code": abi.POINTER_CODE, "size": abi.POINTER_SIZE,
                    "hidden": True})
    return out


_PTX_PARAM_RE = re.compile(r"\.param\s+(\.\w+(?:\s+\.ptr\s+\.global\s+\.align\s+\d+)?)(?:\s+\.align\s+\d+)?\s+"
                           r"(?:\.b8\s+)?(\w+?)(\[\d+\])?\s*[,)\n]")


def ptx_params(ptx: str, entry: str) -> list[str]:
    """The `.param` kinds of ``entry`` as written in the PTX (``.u64``, ``.u32``, ``.f32``, ``.b8[2]``, ...)."""
    m = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)", ptx, re.S)
    if not m:
        raise SpecError(f"entry {entry} not found in PTX")
    kinds = []
    for line in m.group(1).split(","):
        line = line.strip()
        if not line:
            continue
        toks = line.split()
        # ".param .u64 .ptr .global .align 1 name" | ".param .f32 name" | ".param .align 2 .b8 name[2]"
        if ".b8" in toks:
            n = re.search(r"\[(\d+)\]", toks[-1])
            kinds.append(f".b8[{n.group(1) if n else 1}]")
        else:
            kinds.append(toks[1])
    return kinds


def check_ptx_abi(ptx: str, entry: str, params: list[dict[str, Any]]) -> None:
    got = ptx_params(ptx, entry)
    want = [abi.ptx_param_kind(p["type"]) for p in params]
    if got != want:
        raise SpecError(f"{entry}: PTX .param list {got} does not match the packer's {want}")


def compile_base(root: Path, rs: ResolvedSpec) -> Compiled:
    import triton  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction  # noqa: PLC0415

    spec = rs.spec
    fn = _kernel_fn(root, spec.family, spec.source, spec.entry)
    arg_names = list(fn.arg_names)
    runtime_names = [a.name for a in spec.args]
    declared = [n for n in arg_names if n not in rs.constexprs]
    if declared != runtime_names:
        raise SpecError(f"spec {spec.base}: kernel runtime arguments {declared} != spec args {runtime_names} "
                        f"(constexprs pinned: {sorted(rs.constexprs)})")
    missing = set(rs.constexprs) - set(arg_names)
    if missing:
        raise SpecError(f"spec {spec.base}: constexprs {sorted(missing)} are not parameters of {spec.entry}")
    types = {a.name: a.type for a in spec.args}
    signature = {n: (types[n] if n in types else "constexpr") for n in arg_names}
    attrs = {(arg_names.index(a.name),): [["tt.divisibility", a.div]] for a in spec.args if a.div}
    # a Gluon kernel (explicit layouts, kernels_src/gemv/nvfp4_mma.py) compiles through its own AST source
    source_cls = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    src = source_cls(fn, signature=signature, constexprs=dict(rs.constexprs), attrs=attrs)
    arch = get_arch(rs.arch)
    options = {"num_warps": rs.num_warps, "num_stages": rs.num_stages, "num_ctas": rs.num_ctas, **rs.options}
    k = triton.compile(src, target=GPUTarget("cuda", arch.triton_cc, 32), options=options)
    md = k.metadata._asdict()
    launch = {key: md[key] for key in LAUNCH_KEYS}
    params = params_of(rs)
    check_ptx_abi(k.asm["ptx"], md["name"], params)
    if launch["launch_pdl"] != ("griddepcontrol.wait" in k.asm["ptx"]):
        # launched early without a wait it would read the previous kernel's outputs before they exist
        raise SpecError(f"spec {spec.base} on {rs.arch}: launch_pdl={launch['launch_pdl']} but the PTX "
                        f"{'lacks' if launch['launch_pdl'] else 'has'} griddepcontrol.wait (kernels_src/common.py "
                        f"pdl_enter)")
    return Compiled(cubin=bytes(k.asm["cubin"]), ptx=k.asm["ptx"], launch=launch, params=params)
