"""The .prmt NVFP4 decoder's inline PTX (kernels_src/gemv/gemv.py, _UNPACK8) run instruction by instruction by a
small Python model of the PTX it uses (tests/ptx_model.py), against tests/refs_nvfp4 for random words, every byte
value and every e4m3 scale: all 8 outputs bit for bit (signed zeros included)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ml_dtypes")
from tests import ptx_model as P  # noqa: E402
from tests import refs_nvfp4 as F  # noqa: E402
from tests.ptx_model import M32, f32_to_bf16_exact  # noqa: E402

SRC = (Path(__file__).resolve().parents[1] / "kernels_src/gemv/gemv.py").read_text()
_START = '_UNPACK8 = tl.constexpr("""'
ASM = SRC[SRC.index(_START) + len(_START):]
ASM = ASM[:ASM.index('""")')]


def run(word: int, scale_pair: int, asm: str = ASM) -> list[int]:
    R = P.run(asm, {"$8": word, "$9": scale_pair})
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
    assert P.opcodes(ASM) == P.OPS
    assert run(0x76543210, 0x3F803F80) == expected_bits(0x76543210, 0x38)
    bad = ASM.replace("0x6240", "0x6204")  # the bytes of one pair swapped: must not pass
    assert bad != ASM and run(0x76543210, 0x3F803F80, bad) != expected_bits(0x76543210, 0x38)
