"""The .prmt NVFP4 decoder's inline PTX (kernels_src/gemv/gemv.py, _UNPACK8) run instruction by instruction by a
small Python model of the PTX it uses (and/or/shl/shr, prmt in its default mode, fma.rn.bf16x2, mov of a b32 into
two b16), against tests/refs_nvfp4 for random words, every byte value and every e4m3 scale: all 8 outputs bit
for bit (signed zeros included). Triton's interpreter cannot run PTX; this checks the sequence's logic on CPU,
the GPU tests check the compiled kernels."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ml_dtypes")
from tests import refs_nvfp4 as F  # noqa: E402

SRC = (Path(__file__).resolve().parents[1] / "kernels_src/gemv/gemv.py").read_text()
_START = '_UNPACK8 = tl.constexpr("""'
ASM = SRC[SRC.index(_START) + len(_START):]
ASM = ASM[:ASM.index('""")')]
M32 = 0xFFFFFFFF


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


def run(word: int, scale_pair: int, asm: str = ASM) -> list[int]:
    R = {"$8": word, "$9": scale_pair}

    def val(tok):
        return int(tok, 0) if tok[0].isdigit() else R[tok]
    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        m = re.fullmatch(r"\{(\$\d+), (\$\d+)\}, (\w+)", rest)
        if op == "mov.b32" and m:
            v = R[m.group(3)]
            R[m.group(1)], R[m.group(2)] = v & 0xFFFF, v >> 16
            continue
        d, *xs = [a.strip() for a in rest.split(",")]
        xs = [val(x) for x in xs]
        R[d] = {"mov.b32": lambda a: a, "and.b32": lambda a, b: a & b, "or.b32": lambda a, b: a | b,
                "shr.b32": lambda a, b: a >> b, "shl.b32": lambda a, b: (a << b) & M32, "prmt.b32": prmt,
                "fma.rn.bf16x2": fma_bf16x2}[op](*xs)
    return [R[f"${i}"] for i in range(8)]


def expected_bits(word: int, scale_byte: int) -> list[int]:
    codes = F.unpack(np.array([[(word >> 8 * i) & 0xFF for i in range(4)]], np.uint8))[0]
    s = F.e4m3_decode(np.array([scale_byte], np.uint8))[0]
    return [f32_to_bf16_exact(float(v)) for v in F.E2M1[codes] * s]


def test_unpack8_matches_the_reference():
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**32))
    words = [int(w) for w in rng.integers(0, 2**32, size=800, dtype=np.uint64)]
    base = [0x03020100 + 0x04040404 * i for i in range(64)]  # every byte value (0..255), at every position:
    words += [((b << 8 * r) | (b >> (32 - 8 * r))) & M32 for b in base for r in range(4)]
    words += [0x76543210, 0xFEDCBA98, 0x88888888, 0]
    for i, w in enumerate(words):
        sb = 1 + i % 0x7E  # every finite positive e4m3 scale, subnormals included
        sbits = f32_to_bf16_exact(float(F.e4m3_decode(np.array([sb], np.uint8))[0]))
        got = run(w, sbits | (sbits << 16))
        assert got == expected_bits(w, sb), (hex(w), sb, [hex(g) for g in got])


def test_the_model_knows_every_instruction_and_a_wrong_table_fails():
    ops = {ln.strip().split()[0] for ln in ASM.splitlines() if ln.strip() and ln.strip()[0] not in "{}."}
    assert ops == {"mov.b32", "and.b32", "or.b32", "shr.b32", "shl.b32", "prmt.b32", "fma.rn.bf16x2"}
    assert run(0x76543210, 0x3F803F80) == expected_bits(0x76543210, 0x38)
    bad = ASM.replace("0x6240", "0x6204")  # the bytes of one pair swapped: must not pass
    assert bad != ASM and run(0x76543210, 0x3F803F80, bad) != expected_bits(0x76543210, 0x38)
