"""A small reader for CUDA cubin ELF files (no cuobjdump needed): SASS arch, kernel symbols and the
per-kernel ``.nv.info`` attributes ptxas records (parameter layout, required thread count).

Used by ``vkc verify`` to cross-check a manifest against the bytes it describes without Triton.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 0x01, 0x02, 0x03, 0x04
EIATTR_PARAM_CBANK = 0x0A
EIATTR_REQNTID = 0x10
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19


class CubinError(ValueError):
    pass


@dataclass
class KernelInfo:
    name: str
    params: list[tuple[int, int, int]] = field(default_factory=list)  # (ordinal, offset, size) by ordinal
    param_bytes: int | None = None
    reqntid: tuple[int, int, int] | None = None


@dataclass
class Cubin:
    abi_version: int
    sm: int  # e.g. 80, 90, 121
    kernels: dict[str, KernelInfo]


def parse(data: bytes) -> Cubin:
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:
        raise CubinError("not a 64-bit ELF file")
    if data[5] != 1:
        raise CubinError("not little-endian")
    abi_version = data[8]
    (e_shoff,) = struct.unpack_from("<Q", data, 0x28)
    (e_flags,) = struct.unpack_from("<I", data, 0x30)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if struct.unpack_from("<H", data, 0x12)[0] != 190:  # EM_CUDA
        raise CubinError("ELF machine is not EM_CUDA")
    # ABI v7 (ptxas 12.x) keeps the SM number in the low byte; v8 (ptxas 13.x) in bits 8..15.
    sm = (e_flags >> 8) & 0xFF if abi_version >= 8 else e_flags & 0xFF
    sections = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        name, _typ, _flags, _addr, s_off, s_size = struct.unpack_from("<IIQQQQ", data, off)
        sections.append((name, s_off, s_size))
    if e_shstrndx >= len(sections):
        raise CubinError("bad section string table index")
    _, str_off, str_size = sections[e_shstrndx]
    strtab = data[str_off:str_off + str_size]

    def sec_name(idx: int) -> str:
        end = strtab.index(b"\0", idx)
        return strtab[idx:end].decode()

    kernels: dict[str, KernelInfo] = {}
    infos: dict[str, bytes] = {}
    for name_idx, s_off, s_size in sections:
        nm = sec_name(name_idx)
        if nm.startswith(".text."):
            k = nm[len(".text."):]
            kernels.setdefault(k, KernelInfo(k))
        elif nm.startswith(".nv.info."):
            infos[nm[len(".nv.info."):]] = data[s_off:s_off + s_size]
    for k, blob in infos.items():
        info = kernels.setdefault(k, KernelInfo(k))
        _parse_info(blob, info)
        info.params.sort()
    return Cubin(abi_version=abi_version, sm=sm, kernels=kernels)


def _parse_info(blob: bytes, info: KernelInfo) -> None:
    pos = 0
    while pos + 4 <= len(blob):
        fmt, attr, val = struct.unpack_from("<BBH", blob, pos)
        pos += 4
        if fmt == EIFMT_SVAL:
            payload = blob[pos:pos + val]
            pos += val
            if attr == EIATTR_KPARAM_INFO and len(payload) >= 12:
                _index, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
                size = (flags >> 18) & 0x3FFF
                info.params.append((ordinal, offset, size))
            elif attr == EIATTR_REQNTID and len(payload) >= 12:
                info.reqntid = struct.unpack_from("<III", payload)
        elif fmt == EIFMT_HVAL:
            if attr == EIATTR_CBANK_PARAM_SIZE:
                info.param_bytes = val
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL):
            pass
        else:
            raise CubinError(f"unknown .nv.info record format {fmt:#x}")
