"""The CuTe DSL lane of `vkc regen`: one arch's ``CUTE_SPECS`` -> ``vendored/<arch>/<family>/<family>.<host>.so``.

Per (arch, family, host platform): (1) a fresh process of the DSL's interpreter (:func:`dsl_python`) with
CUTE_DSL_ARCH=<arch> compiles and exports every spec (:mod:`vkc.cute_dsl`); (2) the exported headers are checked
and the launcher glue generated (:mod:`vkc.cute_glue`); (3) glue + vkc's driver-API shim (``csrc/cute_shim/``) +
the exported objects are compiled and linked into one shared object that needs only glibc (libcuda is dlopened
by the shim; no DSL runtime, no cudart: tools/cute/NOTES.md, "Licence findings"); (4) the facts `vkc verify` can
re-read without a compiler (exported symbols, ELF machine, NEEDED, the embedded cubins and their SASS arch) are
checked here and recorded in the manifest. Every input is copied into a private directory and compiled under
relative names, so the bytes do not depend on the checkout's path.

The DSL is not a dependency of vkc: it lives in its own environment (``make cute-env`` creates
``.venv-cute`` with the pinned ``nvidia-cutlass-dsl``; env ``VKC_CUTE_PYTHON`` names another interpreter). An arch
with CuTe specs and no usable DSL fails the regen (:class:`CuteLaneError`); nothing is dropped silently.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vkc_contract.arch import get as get_arch
from vkc_contract.hashing import sha256_bytes, sha256_file
from vkc_contract.layout import ARTIFACT_KINDS, CUTE_SO, HOST_PLATFORMS, kind_relpath

from vkc import cute_glue, hostelf, toolchain
from vkc.cute_spec import FIXED_SYMBOLS, CuteKernelSpec

SHIM_DIR = "csrc/cute_shim"
SHIM_SOURCES = ("vkc_cute_shim.c", "vkc_cute_shim.h")
CC = {"x86_64": "gcc", "aarch64": "aarch64-linux-gnu-gcc"}  # Debian's native and cross compilers
CFLAGS = ["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]
# --hash-style/--build-id pinned so two linkers' defaults cannot differ; -s drops .symtab (the DSL's internal
# names and the local file symbols), .dynsym keeps only the version script's exports
LDFLAGS = ["-shared", "-Wl,--no-undefined", "-Wl,-s", "-Wl,--hash-style=gnu", "-Wl,--build-id=sha1",
           "-Wl,-z,noexecstack", "-Wl,-z,relro", "-Wl,-z,now"]
# after the objects: on glibc < 2.34 dlopen/pthread_once live in these (the shim binds their old symbol versions)
LDLIBS = ["-Wl,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0"]
ENV_PYTHON = "VKC_CUTE_PYTHON"
DEFAULT_VENV = ".venv-cute"


class CuteLaneError(RuntimeError):
    pass


@dataclass
class CuteBuild:
    """One arch's CuTe artifacts: file bytes by path, manifest entries by base, the toolchain record."""
    files: dict[str, bytes] = field(default_factory=dict)
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)
    toolchain: dict[str, Any] | None = None
    compile_s: dict[str, float] = field(default_factory=dict)  # printed, never recorded (varies run to run)


def dsl_python(root: Path) -> str:
    """The DSL's interpreter: env VKC_CUTE_PYTHON, else the checkout's .venv-cute (``make cute-env``)."""
    env = os.environ.get(ENV_PYTHON, "").strip()
    exe = Path(env) if env else root / DEFAULT_VENV / "bin" / "python"
    if not exe.is_file():
        raise CuteLaneError(
            f"no CuTe DSL interpreter ({ENV_PYTHON}={env!r}; {root / DEFAULT_VENV} missing): the CuTe specs of this "
            f"arch cannot be built. Run `make cute-env` (nvidia-cutlass-dsl=={toolchain.CUTLASS_DSL['version']}, "
            f"{toolchain.CUTLASS_DSL['flavor']} flavor) or set {ENV_PYTHON}")
    return str(exe)


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise CuteLaneError(f"cannot run {argv[0]}: {e} (the CuTe lane needs gcc and aarch64-linux-gnu-gcc)") from None
    return out.splitlines()[0].strip()


def tool_identity(host: str) -> dict[str, str]:
    cc = CC[host]
    ld = subprocess.run([cc, "-print-prog-name=ld"], capture_output=True, text=True).stdout.strip() or "ld"
    return {"cc": _first_line([cc, "--version"]), "ld": _first_line([ld, "--version"])}


_RES_RE = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def cubin_resources(cubin: bytes) -> dict[str, int]:
    """Registers, stack, static shared memory and local memory of the cubin's one kernel (cuobjdump)."""
    exe = toolchain.triton_bin_dir() / "cuobjdump"
    with tempfile.TemporaryDirectory(prefix="vkc-cute-res-") as d:
        p = Path(d) / "k.cubin"
        p.write_bytes(cubin)
        out = subprocess.run([str(exe), "-res-usage", str(p)], capture_output=True, text=True, check=True).stdout
    rows = _RES_RE.findall(out)
    if len(rows) != 1:
        raise CuteLaneError(f"cuobjdump -res-usage: expected one kernel, got {out!r}")
    _, reg, stack, shared, local = rows[0]
    return {"registers": int(reg), "stack": int(stack), "shared_static": int(shared), "local": int(local)}


def _run_dsl(python: str, arch: str, host: str, specs: list[CuteKernelSpec], root: Path, tmp: Path) -> dict:
    src = tmp / "src"
    fams = sorted({s.family for s in specs})
    (src / "kernels_src").mkdir(parents=True)
    shutil.copyfile(root / "kernels_src" / "__init__.py", src / "kernels_src" / "__init__.py")
    for fam in fams:
        shutil.copytree(root / "kernels_src" / fam, src / "kernels_src" / fam,
                        ignore=shutil.ignore_patterns("__pycache__", "tuning"))
    shutil.copyfile(Path(__file__).with_name("cute_dsl.py"), tmp / "cute_dsl.py")
    job = {"arch": arch, "host": host, "root": "src", "kernels": [s.job_json() for s in specs]}
    (tmp / "job.json").write_text(json.dumps(job, indent=1))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUTE_DSL_", "PYTHON")) and k not in ("VIRTUAL_ENV",)}
    env.update(CUTE_DSL_ARCH=arch, CUTE_DSL_DISABLE_FILE_CACHING="1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONHASHSEED="0")
    r = subprocess.run([python, "cute_dsl.py", "job.json", "obj", "result.json"], env=env, cwd=tmp,
                       capture_output=True, text=True)
    if r.returncode:
        raise CuteLaneError(f"{arch} ({host}): the DSL process failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads((tmp / "result.json").read_text())


def _link(root: Path, host: str, specs: list[CuteKernelSpec], dsl: dict, tmp: Path) -> bytes:
    jobs = [s.job_json() for s in specs]
    by_base = {d["base"]: d for d in dsl["kernels"]}
    problems = [p for j in jobs for p in cute_glue.check_header(j, by_base[j["base"]]["header"])]
    if problems:
        raise CuteLaneError("\n".join(problems))
    for f in SHIM_SOURCES:
        shutil.copyfile(root / SHIM_DIR / f, tmp / f)
    symbols = {s.base: s.symbol for s in specs}
    (tmp / "glue.c").write_text(cute_glue.generate(jobs, symbols, {b: d["header"] for b, d in by_base.items()}))
    (tmp / "exports.map").write_text(cute_glue.version_script(list(symbols.values())))
    cc = CC[host]
    so_name = f"out.{host}.so"
    steps = [[cc, *CFLAGS, "-c", "vkc_cute_shim.c", "-o", "vkc_cute_shim.o"],
             [cc, *CFLAGS, "-c", "glue.c", "-o", "glue.o"],
             [cc, *LDFLAGS, "-Wl,--version-script=exports.map", "-o", so_name, "glue.o", "vkc_cute_shim.o",
              *[f"obj/{j['export']}.o" for j in jobs], *LDLIBS]]
    for argv in steps:
        r = subprocess.run(argv, cwd=tmp, capture_output=True, text=True)
        if r.returncode:
            raise CuteLaneError(f"{' '.join(argv[:3])}... failed:\n{r.stderr[-4000:]}")
    return (tmp / so_name).read_bytes()


def _check_so(arch: str, host: str, specs: list[CuteKernelSpec], dsl: dict, data: bytes) -> hostelf.SharedObject:
    so = hostelf.parse(data)
    want_machine = {"x86_64": 62, "aarch64": 183}[host]
    if not so.is_platform(want_machine):
        raise CuteLaneError(f"{arch}: linked {so.description}, not {host}")
    want_syms = set(FIXED_SYMBOLS) | {s.symbol for s in specs}
    if so.exported != want_syms:
        raise CuteLaneError(f"{arch} ({host}): exports {sorted(so.exported)} != {sorted(want_syms)}")
    bad = [n for n in so.needed if n not in hostelf.ALLOWED_NEEDED]
    if bad:
        raise CuteLaneError(f"{arch} ({host}): NEEDED beyond glibc: {bad}")
    found = sorted(sha256_bytes(c.data) for c in so.cubins)
    want = sorted(d["cubin_sha256"] for d in dsl["kernels"])
    if found != want:
        raise CuteLaneError(f"{arch} ({host}): embedded cubins {found} != the DSL's {want}")
    want_sm = get_arch(arch).cc[0] * 10 + get_arch(arch).cc[1]
    if any(c.sm != want_sm for c in so.cubins):
        raise CuteLaneError(f"{arch} ({host}): embedded cubins for sm {sorted({c.sm for c in so.cubins})}")
    return so


def build_arch(root: Path, arch: str, specs: list[CuteKernelSpec], deps: dict[str, list[str]],
               python: str | None = None) -> CuteBuild:
    """Compile, link and check every CuTe spec of ``arch`` for every host platform (``deps``: source deps by
    base, from :func:`vkc.discover.source_deps`; ``python``: the DSL interpreter, default :func:`dsl_python`)."""
    out = CuteBuild()
    if not specs:
        return out
    fams = sorted({s.family for s in specs})
    if len(fams) != 1:  # one shared object per family: group when a second family arrives
        raise CuteLaneError(f"{arch}: CuTe specs of several families {fams}; the lane links one family per arch")
    python = python or dsl_python(root)
    a = get_arch(arch)
    arts: dict[str, list[dict[str, Any]]] = {s.base: [] for s in specs}
    launch: dict[str, dict[str, Any]] = {}
    dsl_ids, tools = set(), {}
    for host in HOST_PLATFORMS:
        with tempfile.TemporaryDirectory(prefix="vkc-cute-") as t:
            tmp = Path(t)
            dsl = _run_dsl(python, arch, host, specs, root, tmp)
            ident = dsl["dsl"]
            if (ident["version"], ident["flavor"]) != (toolchain.CUTLASS_DSL["version"],
                                                       toolchain.CUTLASS_DSL["flavor"]):
                raise CuteLaneError(f"{python}: nvidia-cutlass-dsl {ident['version']} ({ident['flavor']}), pinned "
                                    f"{toolchain.CUTLASS_DSL['version']} ({toolchain.CUTLASS_DSL['flavor']}): "
                                    f"run `make cute-env` (install one flavor only)")
            dsl_ids.add(json.dumps(ident, sort_keys=True))
            data = _link(root, host, specs, dsl, tmp)
            _check_so(arch, host, specs, dsl, data)
            cubins = {d["base"]: (tmp / "obj" / f"{d['base'].replace('.', '_')}.cubin").read_bytes()
                      for d in dsl["kernels"]}
        tools[host] = tool_identity(host)
        rel = kind_relpath(CUTE_SO, arch, specs[0].base, host)
        out.files[rel] = data
        for s in specs:
            d = next(k for k in dsl["kernels"] if k["base"] == s.base)
            out.compile_s[f"{s.base} ({host})"] = d["compile_s"]
            arts[s.base].append({"kind": CUTE_SO, "loader": ARTIFACT_KINDS[CUTE_SO].loader, "host_platform": host,
                                 "path": rel, "sha256": sha256_bytes(data), "size": len(data),
                                 "symbols": sorted({*FIXED_SYMBOLS, s.symbol}), "sass_arch": a.sass_name})
            info = {"symbol": s.symbol, "abi": s.abi, "c_signature": s.c_signature,
                    "cubin_sha256": d["cubin_sha256"], **cubin_resources(cubins[s.base])}
            if launch.setdefault(s.base, info) != info:  # the device code must not depend on the host platform
                raise CuteLaneError(f"{s.base}: the {host} build embeds another cubin than the x86_64 one")
    if len(dsl_ids) != 1:
        raise CuteLaneError(f"{arch}: the DSL identity changed between host builds: {sorted(dsl_ids)}")
    for s in specs:
        out.kernels[s.base] = {"inputs": s.inputs_json(deps[s.base]), "artifacts": arts[s.base],
                               "launch": dict(launch[s.base], **{k: s.config[k] for k in sorted(s.config)})}
    out.toolchain = {**json.loads(dsl_ids.pop()), "hosts": tools, "cflags": CFLAGS, "ldflags": LDFLAGS + LDLIBS,
                     "shim_sha256": shim_hashes(root)}
    return out


def shim_hashes(root: Path) -> dict[str, str]:
    return {f"{SHIM_DIR}/{f}": sha256_file(root / SHIM_DIR / f) for f in SHIM_SOURCES}

