"""Facts a verifier can read back from a CuTe artifact without the DSL or a GPU.

Host-side facts come from binutils (``readelf``/``nm``, or the cross ``<triple>-readelf``); the embedded device
code is found by scanning the shared object for nested ELF images whose machine is EM_CUDA, and each is described
by the ``cuobjdump`` Triton bundles (``triton/backends/nvidia/bin``; env VKC_CUOBJDUMP overrides).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

EM_CUDA = 190
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
# glibc >= 2.34 holds dlopen/pthread in libc itself; older hosts name the split libraries
ALLOWED_NEEDED = {"libc.so.6", "libdl.so.2", "libpthread.so.0"}


def _elf_header(data: bytes, off: int = 0) -> dict | None:
    """The fields of a little-endian ELF64 header at ``off`` (None if there is none)."""
    if data[off:off + 4] != b"\x7fELF" or len(data) < off + 64 or data[off + 4] != 2 or data[off + 5] != 1:
        return None
    (_type, machine, _ver, _entry, phoff, shoff, flags, _ehsize, phentsize, phnum, shentsize, shnum,
     _shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", data, off + 16)
    # the image ends where its last header table or section ends (cubins put the program headers last)
    size = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
    for i in range(shnum):
        at = off + shoff + i * shentsize
        if at + 64 > len(data):
            return None
        sh_type, = struct.unpack_from("<I", data, at + 4)
        sh_offset, sh_size = struct.unpack_from("<QQ", data, at + 24)
        if sh_type != 8:  # SHT_NOBITS occupies no file bytes
            size = max(size, sh_offset + sh_size)
    return {"machine": machine, "flags": flags, "shnum": shnum, "size": size}


def elf_machine(path: Path) -> str:
    h = _elf_header(path.read_bytes())
    if h is None:
        raise ValueError(f"{path}: not an ELF64 little-endian file")
    return ELF_MACHINES.get(h["machine"], f"em{h['machine']}")


def require_machine(path: Path, host: str) -> None:
    got = elf_machine(path)
    if got != host:
        raise SystemExit(f"{path.name} is {got}, the artifact is for {host}")


def embedded_cubins(data: bytes) -> list[bytes]:
    """Every EM_CUDA ELF image inside ``data`` (its size: where its last header table ends)."""
    out, pos = [], 1
    while (pos := data.find(b"\x7fELF", pos)) != -1:
        h = _elf_header(data, pos)
        if h and h["machine"] == EM_CUDA and h["shnum"]:
            end = pos + h["size"]
            if end <= len(data):
                out.append(data[pos:end])
                pos = end
                continue
        pos += 4
    return out


def cuobjdump() -> str:
    env = os.environ.get("VKC_CUOBJDUMP")
    if env:
        return env
    import importlib.util
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        exe = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if exe.is_file():
            return str(exe)
    exe = shutil.which("cuobjdump")
    if not exe:
        raise SystemExit("no cuobjdump: install triton (it bundles one) or set VKC_CUOBJDUMP")
    return exe


def describe_cubin(cubin: bytes) -> dict:
    """SASS arch, ELF ABI, toolkit and per-kernel resource usage of one cubin, as cuobjdump reports them."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.cubin"
        p.write_bytes(cubin)
        exe = cuobjdump()
        head = subprocess.run([exe, "-elf", str(p)], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([exe, "-res-usage", str(p)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"64bit elf: type=\d+, abi=(\d+), sm=(\w+), toolkit=(\d+)", head)
    if not m:
        raise ValueError("cuobjdump -elf printed no ELF header line")
    kernels = []
    for name, usage in re.findall(r"Function (\S+):\s*\n\s*(REG:.*)", res):
        fields = dict(re.findall(r"(\w+(?:\[\d\])?):(\d+)", usage))
        kernels.append({"name": name, "registers": int(fields["REG"]), "stack": int(fields["STACK"]),
                        "local": int(fields["LOCAL"]), "static_shared": int(fields["SHARED"])})
    return {"sha256": hashlib.sha256(cubin).hexdigest(), "size": len(cubin), "elf_abi": int(m.group(1)),
            "sass_arch": "sm_" + m.group(2), "toolkit": int(m.group(3)), "kernels": kernels}


def _binutil(name: str, machine: str) -> str:
    cross = {"aarch64": "aarch64-linux-gnu-"}.get(machine, "")
    return shutil.which(cross + name) or name


def so_facts(so: Path, cubins: list[bytes]) -> dict:
    machine = elf_machine(so)
    readelf, nm = _binutil("readelf", machine), _binutil("nm", machine)
    dyn = subprocess.run([readelf, "-d", str(so)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    syms = subprocess.run([nm, "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True).stdout
    exported = sorted(line.split()[-1] for line in syms.splitlines() if line.split()[1:2] == ["T"])
    undef = subprocess.run([nm, "-D", "--undefined-only", str(so)], capture_output=True, text=True,
                           check=True).stdout
    glibc = re.findall(r"@GLIBC_(\d+(?:\.\d+)+)", undef)
    floor = max(glibc, key=lambda s: tuple(int(x) for x in s.split("."))) if glibc else None
    return {
        "elf_machine": machine,
        "needed": needed,
        "exported_symbols": exported,
        "imported_symbols": sorted({line.split()[-1] for line in undef.splitlines() if line.strip()}),
        "glibc_floor": floor,
        "cubins": [describe_cubin(c) for c in cubins],
    }


def check_artifact(so: Path, info: dict) -> list[str]:
    """Every recorded fact of ``info`` (the artifact's JSON) that the shared object itself contradicts (empty when
    all agree): what ``vkc verify`` needs, with no DSL and no GPU."""
    data = so.read_bytes()
    problems = []
    if hashlib.sha256(data).hexdigest() != info["sha256"]:
        problems.append("sha256 differs")
    cubins = embedded_cubins(data)
    if sorted(hashlib.sha256(c).hexdigest() for c in cubins) != sorted(v["cubin_sha256"] for v in info["variants"]):
        problems.append("embedded cubins differ from the recorded variants")
    facts = so_facts(so, cubins)
    for key in ("elf_machine", "needed", "exported_symbols", "imported_symbols", "glibc_floor", "cubins"):
        if facts[key] != info.get(key):
            problems.append(f"{key}: recorded {info.get(key)!r}, found {facts[key]!r}")
    if facts["elf_machine"] != info.get("host"):
        problems.append(f"ELF machine {facts['elf_machine']} is not the recorded host {info.get('host')}")
    if not set(facts["needed"]) <= ALLOWED_NEEDED:
        problems.append(f"NEEDED beyond glibc: {facts['needed']}")
    archs = {c["sass_arch"] for c in facts["cubins"]}
    if archs != {info.get("arch")}:
        problems.append(f"cubin SASS arch {sorted(archs)} != {info.get('arch')}")
    missing = [v["symbol"] for v in info["variants"] if v["symbol"] not in facts["exported_symbols"]]
    if missing:
        problems.append(f"launchers not exported: {missing}")
    return problems
