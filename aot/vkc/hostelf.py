"""A small reader for host ELF shared objects (the ``cute-so`` artifacts): class, byte order, type and
machine from the header, the exported dynamic symbols from ``.dynsym``, the ``DT_NEEDED`` libraries from
``.dynamic``, and the cubins embedded in the file (found by their ELF header, their extent read from their own
header tables, parsed with :mod:`vkc.elf`). Standard library only.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from vkc import elf

ET_DYN = 3
SHT_DYNSYM = 11
SHT_DYNAMIC = 6
SHT_NOBITS = 8
DT_NULL, DT_NEEDED = 0, 1
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK = 1, 2
STV_DEFAULT, STV_PROTECTED = 0, 3
EM_CUDA = 190
MACHINES = {62: "x86_64", 183: "aarch64", 3: "i386", 40: "arm", 243: "riscv", 21: "ppc64", EM_CUDA: "cuda"}


# glibc only: libcuda is dlopened by the shim; glibc >= 2.34 holds dlopen/pthread in libc itself, older hosts
# name the split libraries
ALLOWED_NEEDED = frozenset({"libc.so.6", "libdl.so.2", "libpthread.so.0"})


class HostElfError(ValueError):
    pass


@dataclass
class EmbeddedCubin:
    """One CUDA ELF image inside a host shared object: its exact bytes and what :func:`vkc.elf.parse` read."""
    data: bytes
    cubin: elf.Cubin

    @property
    def sm(self) -> int:
        return self.cubin.sm

    @property
    def kernels(self) -> dict[str, elf.KernelInfo]:
        return self.cubin.kernels


@dataclass
class SharedObject:
    elf_class: int                # 1: 32-bit, 2: 64-bit
    little_endian: bool
    machine: int                  # e_machine
    exported: set[str] = field(default_factory=set)
    needed: list[str] = field(default_factory=list)
    cubins: list[EmbeddedCubin] = field(default_factory=list)

    @property
    def description(self) -> str:
        """``"64-bit little-endian x86_64"``: what the header says, for messages."""
        return (f"{32 * self.elf_class}-bit {'little' if self.little_endian else 'big'}-endian "
                f"{MACHINES.get(self.machine, f'machine {self.machine}')}")

    def is_platform(self, machine: int) -> bool:
        return self.elf_class == 2 and self.little_endian and self.machine == machine


def parse(data: bytes) -> SharedObject:
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise HostElfError("no ELF header")
    elf_class, data_enc = data[4], data[5]
    if elf_class not in (1, 2) or data_enc not in (1, 2):
        raise HostElfError(f"bad ELF ident (class {elf_class}, data {data_enc})")
    end = "<" if data_enc == 1 else ">"
    e_type, e_machine = struct.unpack_from(end + "HH", data, 0x10)
    so = SharedObject(elf_class=elf_class, little_endian=data_enc == 1, machine=e_machine)
    if e_type != ET_DYN:
        raise HostElfError(f"ELF type {e_type}, not a shared object (ET_DYN)")
    if elf_class == 2:
        so.exported = _dynsym64(data, end)
        so.needed = _needed64(data, end)
    so.cubins = embedded_cubins(data)
    return so


def _sections64(data: bytes, end: str) -> list[tuple]:
    (e_shoff,) = struct.unpack_from(end + "Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from(end + "HH", data, 0x3A)
    if e_shoff == 0 or e_shnum == 0:
        raise HostElfError("no section headers (stripped with sstrip?)")
    if e_shentsize < 64 or e_shoff + e_shnum * e_shentsize > len(data):
        raise HostElfError("section headers run past the end of the file")
    return [struct.unpack_from(end + "IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]


def _needed64(data: bytes, end: str) -> list[str]:
    """The DT_NEEDED names of the ``.dynamic`` section, in order."""
    secs = _sections64(data, end)
    out: list[str] = []
    for _name, typ, _flags, _addr, off, size, link, _info, _align, _entsize in secs:
        if typ != SHT_DYNAMIC:
            continue
        if link >= len(secs):
            raise HostElfError("bad .dynamic section header")
        strtab = data[secs[link][4]:secs[link][4] + secs[link][5]]
        for pos in range(off, min(off + size, len(data)) - 15, 16):
            tag, val = struct.unpack_from(end + "qQ", data, pos)
            if tag == DT_NULL:
                break
            if tag == DT_NEEDED:
                stop = strtab.find(b"\0", val)
                out.append(strtab[val:stop if stop >= 0 else len(strtab)].decode(errors="replace"))
    return out


def _dynsym64(data: bytes, end: str) -> set[str]:
    secs = _sections64(data, end)
    out: set[str] = set()
    for _name, typ, _flags, _addr, off, size, link, _info, _align, entsize in secs:
        if typ != SHT_DYNSYM:
            continue
        if link >= len(secs) or entsize < 24:
            raise HostElfError("bad .dynsym section header")
        str_off, str_size = secs[link][4], secs[link][5]
        strtab = data[str_off:str_off + str_size]
        for pos in range(off, min(off + size, len(data)) - 23, entsize):
            st_name, st_info, st_other, st_shndx = struct.unpack_from(end + "IBBH", data, pos)
            bind, vis = st_info >> 4, st_other & 3
            if st_shndx != SHN_UNDEF and bind in (STB_GLOBAL, STB_WEAK) and vis in (STV_DEFAULT, STV_PROTECTED):
                stop = strtab.find(b"\0", st_name)
                name = strtab[st_name:stop if stop >= 0 else len(strtab)].decode(errors="replace")
                if name:
                    out.add(name)
    return out


def image_size(data: bytes, pos: int) -> int | None:
    """Bytes of the little-endian ELF64 image at ``pos``: where its last header table or section ends (cubins put
    the program headers after the section headers), or None when its headers do not fit in ``data``."""
    if len(data) - pos < 64 or data[pos + 4] != 2 or data[pos + 5] != 1:
        return None
    phoff, shoff = struct.unpack_from("<QQ", data, pos + 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, pos + 0x36)
    size = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
    for i in range(shnum):
        at = pos + shoff + i * shentsize
        if shentsize < 64 or at + 64 > len(data):
            return None
        (sh_type,) = struct.unpack_from("<I", data, at + 4)
        sh_offset, sh_size = struct.unpack_from("<QQ", data, at + 24)
        if sh_type != SHT_NOBITS:
            size = max(size, sh_offset + sh_size)
    return size if pos + size <= len(data) else None


def embedded_cubins(data: bytes) -> list[EmbeddedCubin]:
    """Every CUDA ELF image (EM_CUDA) stored inside ``data`` past its own header."""
    found = []
    pos = data.find(b"\x7fELF", 1)
    while pos >= 0:
        if len(data) - pos >= 64 and struct.unpack_from("<H", data, pos + 0x12)[0] == EM_CUDA:
            size = image_size(data, pos)
            if size:
                try:
                    found.append(EmbeddedCubin(data[pos:pos + size], elf.parse(data[pos:pos + size])))
                    pos = data.find(b"\x7fELF", pos + size)
                    continue
                except (elf.CubinError, struct.error, ValueError, IndexError):
                    pass
        pos = data.find(b"\x7fELF", pos + 1)
    return found
