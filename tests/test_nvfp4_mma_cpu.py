"""CPU tests of the NVFP4 MMA layout (kernels_src/gemv/nvfp4_mma.py, vkc_runtime.ops.nvfp4): the numpy packer read
back through the layout's formula, the device packer and the dequantizer through Triton's interpreter (bit for bit
against the numpy packer / the float64 reference), the tensor-core kernel's inline-PTX decoder run instruction by
instruction by tests/ptx_model.py, and the dispatch rule. The Gluon kernel itself runs on the GPU only
(tests/gpu/test_gpu_nvfp4_mma.py).

Scales cover zero (its codes must read as zero whatever they hold), negative (the codes are negated), every e4m3
subnormal and the largest value; shapes have row (N % 16) and k-block (K % 128) tails."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
pytest.importorskip("ml_dtypes")

from kernels_src.gemv import nvfp4_mma as KM  # noqa: E402
from tests import ptx_model as P  # noqa: E402
from tests import refs_nvfp4 as F  # noqa: E402
from tests.kernel_testing import device, launch_spec, rng, specs  # noqa: E402
from vkc_runtime.ops import nvfp4 as N4  # noqa: E402

DEV = device()
SPECS = specs("gemv")


def weights(g, N, K):
    """Random codes and scales with every special scale class present."""
    codes = g.integers(0, 16, (N, K), dtype=np.uint8)
    sb = g.integers(1, 0x7F, (N, K // 16)).astype(np.uint8)          # positive finite, subnormals included
    flat = sb.reshape(-1)
    specials = [0x00, 0x80, 0x7E, 0xFE, 0x81, 0x01, 0x07, 0x08, 0xB8]  # +-0, +-448, -subnormal, ...
    idx = g.choice(flat.size, size=min(flat.size, 4 * len(specials)), replace=False)
    flat[idx] = np.resize(np.array(specials, np.uint8), idx.size)
    neg = g.random(flat.size) < 0.1
    flat[neg & (flat != 0)] |= 0x80
    return F.pack(codes), sb


def read_back(words, scales, N, K):
    """float64 W [N, K] from the MMA layout, by the module doc's formula (independent of the packer's code)."""
    W = np.zeros((N, K))
    E5 = scales.view(np.uint32)
    Wd = words.view(np.uint32)
    N16, KB = Wd.shape[:2]
    for rb in range(N16):
        for kb in range(KB):
            for L in range(32):
                g_, t = divmod(L, 4)
                sword = int(E5[rb, kb, L])
                for j in range(8):
                    q, h, c = j >> 2, (j >> 1) & 1, j & 1
                    n = 16 * rb + g_ + 8 * h
                    byte = (sword >> (8 * (2 * q + h))) & 0xFF
                    s = 2.0 ** ((byte >> 3) - N4.E5M3_BIAS) * (1 + (byte & 7) / 8)
                    word = int(Wd[rb, kb, L, j])
                    for e in range(8):
                        k = 128 * kb + 64 * q + 16 * t + 8 * c + e
                        code = (word >> (4 * N4.SLOT[e])) & 0xF
                        if n < N and k < K:
                            W[n, k] = F.E2M1[code] * s
                        else:
                            assert code == 0, (n, k)
    return W


@pytest.mark.parametrize("N,K", [(16, 128), (37, 400), (48, 256)])
def test_pack_host_reads_back_exactly(N, K):
    g = rng()
    packed, sb = weights(g, N, K)
    words, scales = N4.pack_host(packed, sb)
    assert words.shape, scales.shape == N4.mma_shapes(N, K)
    want = F.dequant(packed, sb, 1.0)
    np.testing.assert_array_equal(read_back(words, scales, N, K), want)


def test_pack_host_refuses_nan_scales():
    packed, sb = weights(np.random.default_rng(0), 16, 128)
    sb[3, 2] = 0x7F
    with pytest.raises(ValueError, match="NaN"):
        N4.pack_host(packed, sb)


def padded(a: np.ndarray, pad: int) -> torch.Tensor:
    buf = torch.full((a.shape[0], a.shape[1] + pad), 0xA5, dtype=torch.uint8, device=DEV)
    buf[:, :a.shape[1]] = torch.from_numpy(a)
    return buf[:, :a.shape[1]]


@pytest.mark.parametrize("N,K", [(37, 400), (16, 256)])
def test_pack_kernel_matches_pack_host(N, K):
    """The device packer (interpreter) on strided inputs writes the numpy packer's words and scales bit for bit
    (NaN-free scales; the kernel zeroes NaN groups instead of refusing)."""
    g = rng()
    packed, sb = weights(g, N, K)
    want_w, want_s = N4.pack_host(packed, sb)
    pt, st = padded(packed, 24), padded(sb, 8)
    ws, ss = N4.mma_shapes(N, K)
    w_out = torch.full(ws, -1, dtype=torch.int32, device=DEV)
    s_out = torch.full(ss, -1, dtype=torch.int32, device=DEV)
    launch_spec(SPECS["nvfp4_mma_pack"], (ws[0], ws[1]), pt, st, w_out, s_out, N, K, pt.stride(0), st.stride(0),
                PDL=False)
    np.testing.assert_array_equal(w_out.cpu().numpy(), want_w)
    np.testing.assert_array_equal(s_out.cpu().numpy(), want_s)


@pytest.mark.parametrize("N,K", [(37, 400), (32, 128)])
def test_dequant_kernel(N, K):
    """nvfp4_mma_dequant (interpreter): bf16(W * alpha) inside a poisoned, padded buffer; nothing else written."""
    g = rng()
    packed, sb = weights(g, N, K)
    words, scales = N4.pack_host(packed, sb)
    alpha = float(g.uniform(0.5, 2.0)) * 2.0 ** -7
    buf = torch.full((N + 3, K + 16), float("nan"), dtype=torch.bfloat16, device=DEV)
    out = buf[:N, :K]
    launch_spec(SPECS["nvfp4_mma_dequant"], (words.shape[0], words.shape[1]), torch.from_numpy(words).to(DEV),
                torch.from_numpy(scales).to(DEV), out, alpha, N, K, out.stride(0), PDL=False)
    # W is exact in fp32 (<= 6 significant bits); the kernel multiplies by fp32(alpha) in fp32, then rounds to bf16:
    # the same two roundings here (rounding the float64 product straight to bf16 differs where the fp32 product
    # lands on a bf16 tie)
    w32 = F.dequant(packed, sb, 1.0).astype(np.float32)
    assert np.array_equal(w32.astype(np.float64), F.dequant(packed, sb, 1.0))
    want = torch.from_numpy(w32 * np.float32(alpha)).to(torch.bfloat16)
    assert torch.equal(out.cpu().float(), want.float())
    assert torch.isnan(buf[N:]).all() and torch.isnan(buf[:, K:]).all()


# ---------------------------------------------------------------------------------------- the PTX decoder
OUTS = tuple(f"$o{i}" for i in range(64))
ASM = KM._decode_asm.fn((OUTS,), (tuple(f"$w{j}" for j in range(8)), ("$s",)))


def decode(words: list[int], sword: int, asm: str = ASM) -> list[int]:
    R = P.run(asm, {**{f"$w{j}": w for j, w in enumerate(words)}, "$s": sword})
    return [R[o] for o in OUTS]


def expected(words: list[int], sword: int) -> list[int]:
    out = []
    for j, w in enumerate(words):
        byte = (sword >> (8 * (2 * (j >> 2) + ((j >> 1) & 1)))) & 0xFF
        s = 2.0 ** ((byte >> 3) - N4.E5M3_BIAS) * (1 + (byte & 7) / 8)
        for e in range(8):
            v = F.E2M1[(w >> (4 * N4.SLOT[e])) & 0xF] * s / KM.ACC_SCALE
            out.append(P.f32_to_bf16_exact(v) | (0x8000 if np.signbit(v) else 0))
    return out


def test_decode_asm_matches_the_layout():
    """Every code in every slot, every e5m3 byte the packer writes (all e4m3 magnitudes), random words: the 64
    bf16 outputs bit for bit (signed zeros included) in the A operand's register order."""
    assert P.opcodes(ASM) <= P.OPS
    e5, _, _ = N4._e5m3_table()
    valid = sorted({int(b) for b in e5[1:0x7F]})
    g = rng()
    for i in range(120):
        words = [int(x) for x in g.integers(0, 2**32, 8, dtype=np.uint64)]
        if i < 16:  # code i in every nibble of every word
            words = [int("".join([f"{i:x}"] * 8), 16)] * 8
        sb = [valid[(4 * i + b) % len(valid)] for b in range(4)]
        sword = sum(b << (8 * k) for k, b in enumerate(sb))
        assert decode(words, sword) == expected(words, sword), i


def test_decode_asm_model_catches_a_wrong_slot_or_scale():
    words, sword = [0xF7E7D7C7 ^ (j << 8) for j in range(8)], 0x58504840
    bad_mask = ASM.replace("0x70007000", "0x70003000", 1)
    bad_scale = ASM.replace("0x4141", "0x4040")
    for bad in (bad_mask, bad_scale):
        assert bad != ASM and decode(words, sword, bad) != expected(words, sword)


def test_unpack_mma_matches_the_layout():
    """The grouped kernels' one-word decoder (nvfp4_mma_tile's _UNPACK_MMA): every code in every slot, every e5m3
    byte the packer writes, random words: the 8 bf16 outputs (W * 2^-16) bit for bit in e order; a wrong mask or
    shift is caught."""
    asm = KM._UNPACK_MMA.value
    assert P.opcodes(asm) <= P.OPS
    e5, _, _ = N4._e5m3_table()
    valid = sorted({int(b) for b in e5[1:0x7F]})
    g = rng()

    def run(a, word, byte):
        s16 = (byte << 4) | 0x7000
        R = P.run(a.replace("$9", "$s").replace("$8", "$w"), {"$w": word, "$s": s16 | (s16 << 16)})
        return [R[f"${i}"] for i in range(8)]

    def want(word, byte):
        s = 2.0 ** ((byte >> 3) - N4.E5M3_BIAS) * (1 + (byte & 7) / 8)
        vals = [F.E2M1[(word >> (4 * N4.SLOT[e])) & 0xF] * s / KM.ACC_SCALE for e in range(8)]
        return [P.f32_to_bf16_exact(v) | (0x8000 if np.signbit(v) else 0) for v in vals]

    for i in range(200):
        word = int(g.integers(0, 2**32, dtype=np.uint64)) if i >= 16 else int(f"{i:x}" * 8, 16)
        byte = valid[i % len(valid)]
        assert run(asm, word, byte) == want(word, byte), i
    word, byte = 0xF7E7D7C7, 0x48
    for bad in (asm.replace("0x70007000", "0x70003000", 1), asm.replace("shl.b32 q, $8, 8;", "shl.b32 q, $8, 12;")):
        assert bad != asm and run(bad, word, byte) != want(word, byte)


# ---------------------------------------------------------------------------------------- dispatch rule
@pytest.mark.parametrize("M,N,K", [(1, 5120, 6144), (1, 2048, 4096), (7, 16480, 5120), (16, 34816, 5120),
                                   (33, 5120, 17408), (1, 48, 2048), (128, 248320, 5120)])
def test_plan_is_well_formed(M, N, K):
    p = N4.plan(M, N, K, 132, tuple((wk, r, 24 // (wk * r)) for _, wk, r in N4.MMA_TILES))
    kb = -(-K // 128)
    assert p.bm == (8 if M <= 8 else 16) and (p.bm, p.wk, p.r) in N4.MMA_TILES
    assert p.k_split % (128 * p.wk) == 0 and p.split == -(-K // p.k_split) and 1 <= p.split <= N4.MAX_SPLIT
    if p.split > 1:
        assert p.k_split // 128 >= N4.MIN_BLOCKS_PER_WARP * p.wk
    assert (p.split - 1) * p.k_split < kb * 128  # no empty split


# the fastest forced alternative per shape on the H200 at M = 1 (benchmarks/results/2026-12-03-h200-session16.tgz,
# nvfp4-mma-f65604f.json); H200 occupancy: 3 resident 8-warp programs per SM at BLOCK_M 8
MEASURED_BEST_M1 = {(16480, 5120): (4, 2, 1), (34816, 5120): (4, 2, 1), (10240, 5120): (8, 1, 1),
                    (5120, 6144): (8, 1, 1), (5120, 17408): (8, 1, 2), (2048, 4096): (8, 1, 1)}


@pytest.mark.parametrize("NK", sorted(MEASURED_BEST_M1))
def test_plan_picks_the_measured_best_at_m1(NK):
    p = N4.plan(1, *NK, 132, tuple((wk, r, 3) for b, wk, r in N4.MMA_TILES if b == 8))
    assert (p.wk, p.r, p.split) == MEASURED_BEST_M1[NK]
