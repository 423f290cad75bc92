"""Spec-time helpers of vkc.spec that kernel families share (no Triton, no GPU)."""
from __future__ import annotations

import re

import pytest

from vkc.spec import SpecError, pow2_split
from tests.aot_tree import REPO


@pytest.mark.parametrize("n, sb, sbx", [(1, 1, 0), (2, 2, 0), (3, 2, 1), (8, 8, 0), (9, 8, 1), (15, 8, 7),
                                        (16, 16, 0), (17, 16, 1)])
def test_pow2_split(n, sb, sbx):
    assert pow2_split(n) == {"SB": sb, "SBX": sbx}


def test_pow2_split_refuses_zero():
    with pytest.raises(SpecError):
        pow2_split(0)


def test_moe_down_slot_tiles_hold_their_named_slots():
    """Every MoE decode down kernel named ``...s<k>`` holds k slots as SB + SBX (SB a power of two)."""
    from vkc import discover
    seen = 0
    for s in discover.load_specs(REPO, "moe"):
        m = re.search(r"decode\.down\..*\.s(\d+)$", s.name)
        if not m:
            continue
        c = s.constexprs
        assert c["SB"] + c["SBX"] == int(m.group(1)) and c["SB"] & (c["SB"] - 1) == 0, s.name
        seen += 1
    assert seen == 14  # bf16 5, FP8 5, NVFP4 linear-layout 4 (the MMA-layout kernels take k' at run time)
