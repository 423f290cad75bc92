"""Build one arch's CuTe DSL GEMM artifact: ``gemm.<host>.so`` + ``gemm.<host>.json``.

    python3 tools/cute/build.py --arch sm_90a --out build/cute/sm_90a [--host x86_64|aarch64]

Steps: (1) a fresh subprocess of the DSL's venv (``--dsl-python``, default .venv-cute/bin/python) with
CUTE_DSL_ARCH=<arch> compiles and exports every variant of kernels_src/gemm/variants.py (tools/cute/dsl_compile.py);
(2) the launcher glue is generated from the variants (tools/cute/glue.py) after checking the exported headers'
descriptor layout; (3) glue + csrc/cute_shim + the exported objects are compiled and linked into one shared object
that needs only glibc (libc, plus libdl/libpthread for hosts older than glibc 2.34; libcuda is dlopened by the
shim); (4) the facts a verifier can re-read from the artifact (sha256, ELF machine, exported symbols, NEEDED,
glibc floor, the embedded cubins' SASS arch) are written to the JSON next to it (tools/cute/elfinfo.py). Runs
with any Python 3.10+ that can import triton (for its bundled cuobjdump; or set VKC_CUOBJDUMP): the DSL lives only
in the subprocess. Every input is copied into a private directory and compiled under relative names, so the result
does not depend on the checkout's path.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from kernels_src.gemm import variants  # noqa: E402  (plain Python, no DSL)
from tools.cute import elfinfo, glue  # noqa: E402

SHIM_DIR = ROOT / "csrc" / "cute_shim"
SHIM_SOURCES = ("vkc_cute_shim.c", "vkc_cute_shim.h")
HOSTS = {"x86_64": "gcc", "aarch64": "aarch64-linux-gnu-gcc"}
CFLAGS = ["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]
# --hash-style/--build-id pinned so two linkers' defaults cannot differ; -s drops .symtab (the DSL's internal
# names and the local file symbols), .dynsym keeps only the version script's exports
LDFLAGS = ["-shared", "-Wl,--no-undefined", "-Wl,-s", "-Wl,--hash-style=gnu", "-Wl,--build-id=sha1",
           "-Wl,-z,noexecstack", "-Wl,-z,relro", "-Wl,-z,now"]
# after the objects: on glibc < 2.34 dlopen/pthread_once live in these (the shim binds their old symbol versions)
LDLIBS = ["-Wl,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0"]


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tool_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].strip()


def dsl_subprocess(dsl_python: str, arch: str, host: str, obj_dir: Path, result: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_DSL_")}
    env.update(CUTE_DSL_ARCH=arch, CUTE_DSL_DISABLE_FILE_CACHING="1", PYTHONDONTWRITEBYTECODE="1")
    subprocess.run([dsl_python, str(HERE / "dsl_compile.py"), arch, str(obj_dir), str(result), host],
                   env=env, cwd=str(obj_dir), check=True)
    return json.loads(result.read_text())


def build(arch: str, out: Path, host: str, dsl_python: str) -> dict:
    cc = HOSTS[host]
    vs = variants.variants_for(arch)
    out.mkdir(parents=True, exist_ok=True)
    so_name, json_name = f"gemm.{host}.so", f"gemm.{host}.json"
    with tempfile.TemporaryDirectory(prefix="vkc-cute-") as tmp_s:
        tmp = Path(tmp_s)
        objs = tmp / "obj"
        objs.mkdir()
        dsl = dsl_subprocess(dsl_python, arch, host, objs, tmp / "dsl.json")
        if dsl["dsl"]["flavor"] != "cu12":
            raise SystemExit(f"DSL flavor {dsl['dsl']['flavor']}: this build pins cu12 (install only that flavor)")
        by_name = {d["name"]: d for d in dsl["variants"]}
        for v in vs:
            glue.check_header(v, by_name[v.name]["header"])
            elfinfo.require_machine(objs / f"{v.name}.o", host)
        for f in SHIM_SOURCES:
            shutil.copyfile(SHIM_DIR / f, tmp / f)
        (tmp / "glue.c").write_text(glue.generate(vs, {v.name: by_name[v.name]["header"] for v in vs}))
        (tmp / "exports.map").write_text(glue.version_script(vs))
        run = lambda *a: subprocess.run(list(a), cwd=tmp, check=True)  # noqa: E731
        run(cc, *CFLAGS, "-c", "vkc_cute_shim.c", "-o", "vkc_cute_shim.o")
        run(cc, *CFLAGS, "-c", "glue.c", "-o", "glue.o")
        run(cc, *LDFLAGS, "-Wl,--version-script=exports.map", "-o", so_name, "glue.o", "vkc_cute_shim.o",
            *[f"obj/{v.name}.o" for v in vs], *LDLIBS)
        so = tmp / so_name
        cubins = elfinfo.embedded_cubins(so.read_bytes())
        expected = {by_name[v.name]["cubin_sha256"] for v in vs}
        found = {hashlib.sha256(c).hexdigest() for c in cubins}
        if found != expected:
            raise SystemExit(f"embedded cubins {sorted(found)} != the DSL's {sorted(expected)}")
        facts = elfinfo.so_facts(so, cubins)
        want = sorted([v.symbol for v in vs] + glue.FIXED_EXPORTS)
        if facts["exported_symbols"] != want:
            raise SystemExit(f"exports {facts['exported_symbols']} != {want}")
        if any(n not in elfinfo.ALLOWED_NEEDED for n in facts["needed"]):
            raise SystemExit(f"unexpected NEEDED entries: {facts['needed']}")
        bad_arch = [c for c in facts["cubins"] if c["sass_arch"] != arch]
        if bad_arch:
            raise SystemExit(f"cubins not for {arch}: {bad_arch}")
        shutil.copyfile(so, out / so_name)
        shim_sha = {f: sha256(SHIM_DIR / f) for f in SHIM_SOURCES}
    info = {
        "kind": "cute-gemm",
        "arch": arch,
        "host": host,
        "file": so_name,
        "sha256": sha256(out / so_name),
        "size": (out / so_name).stat().st_size,
        **facts,
        "dsl": dsl["dsl"],
        "cc": tool_version(cc),
        "cflags": CFLAGS,
        "ldflags": LDFLAGS + LDLIBS,
        "shim_sha256": shim_sha,
        "load": variants.LOAD_C_SIGNATURE,
        "driver_status": variants.STATUS_C_SIGNATURE,
        "variants": [dict(v.to_json(), name=v.name, symbol=v.symbol, c_signature=v.c_signature,
                          cubin_sha256=by_name[v.name]["cubin_sha256"])
                     for v in vs],
    }
    # compile times vary run to run: printed, never written into the (reproducible) JSON
    info["_compile_s"] = {v.name: by_name[v.name]["compile_s"] for v in vs}
    facts_json = {k: v for k, v in info.items() if not k.startswith("_")}
    (out / json_name).write_text(json.dumps(facts_json, indent=1, sort_keys=True) + "\n")
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True, choices=sorted(variants.VARIANTS))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--host", default="x86_64", choices=sorted(HOSTS))
    ap.add_argument("--dsl-python", default=str(ROOT / ".venv-cute" / "bin" / "python"))
    a = ap.parse_args(argv)
    info = build(a.arch, a.out.resolve(), a.host, a.dsl_python)
    print(f"{a.out / info['file']}: {info['size']} bytes sha256 {info['sha256']}")
    print(f"  needed {info['needed']}  glibc floor {info['glibc_floor']}  exports {len(info['exported_symbols'])}")
    print(f"  DSL compile seconds: {info['_compile_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
