"""A small Python model of the PTX the NVFP4 decoders' inline assembly uses (kernels_src/gemv/gemv.py _UNPACK8,
kernels_src/gemv/nvfp4_mma.py _decode_asm): and/or/shl/shr, prmt in its default mode, fma.rn.bf16x2 (exact
products only), mov of a b32 into two b16. Triton's interpreter cannot run PTX; these models check the
sequences' logic on CPU, the GPU tests check the compiled kernels."""
from __future__ import annotations

import re

import numpy as np

M32 = 0xFFFFFFFF
OPS = {"mov.b32", "and.b32", "or.b32", "shr.b32", "shl.b32", "prmt.b32", "fma.rn.bf16x2"}


def f32_to_bf16_exact(v: float) -> int:
    b = int(np.array(v, np.float32).view(np.uint32))
    assert b & 0xFFFF == 0, f"{v} is not exact in bf16"
    return b >> 16


def bf16_val(bits: int) -> float:
    return float(np.array(bits << 16, np.uint32).view(np.float32))


def prmt(a: int, b: int, c: int) -> int:
    """prmt.b32 default mode: result byte i = byte c[4i+2:4i] of {b, a} (a = bytes 0..3); c[4i+3] set: the
    selected byte's sign replicated."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        s = (c >> (4 * i)) & 0xF
        byte = src[s & 7]
        if s & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def fma_bf16x2(a: int, b: int, c: int) -> int:
    out = 0
    for h in range(2):
        x = np.float32(bf16_val((a >> 16 * h) & 0xFFFF)) * np.float32(bf16_val((b >> 16 * h) & 0xFFFF)) \
            + np.float32(bf16_val((c >> 16 * h) & 0xFFFF))
        out |= f32_to_bf16_exact(float(x)) << 16 * h  # every product here is exact: no rounding to model
    return out


def run(asm: str, regs: dict[str, int]) -> dict[str, int]:
    """Execute ``asm`` (one instruction per line) on the registers ``regs`` ($n operands and named ones);
    returns the register file afterwards."""
    R = dict(regs)

    def val(tok):
        return int(tok, 0) if tok[0].isdigit() else R[tok]
    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        m = re.fullmatch(r"\{(\$\w+), (\$\w+)\}, (\w+)", rest)
        if op == "mov.b32" and m:
            v = R[m.group(3)]
            R[m.group(1)], R[m.group(2)] = v & 0xFFFF, v >> 16
            continue
        d, *xs = [a.strip() for a in rest.split(",")]
        xs = [val(x) for x in xs]
        R[d] = {"mov.b32": lambda a: a, "and.b32": lambda a, b: a & b, "or.b32": lambda a, b: a | b,
                "shr.b32": lambda a, b: a >> b, "shl.b32": lambda a, b: (a << b) & M32, "prmt.b32": prmt,
                "fma.rn.bf16x2": fma_bf16x2}[op](*xs)
    return R


def opcodes(asm: str) -> set[str]:
    return {ln.strip().split()[0] for ln in asm.splitlines() if ln.strip() and ln.strip()[0] not in "{}."}
