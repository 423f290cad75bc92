"""NVFP4 W4A16 on tensor cores from weights re-laid out once at load (the "MMA layout").

    y[M, N] = x[M, K] @ W[N, K]^T,  W[n, k] = e2m1 * e4m3 scale * alpha   (bf16 x and y, fp32 accumulation)

The linear NVFP4 kernels (gemv.py) decode weights into k order and spend 4-5 integer instructions per weight
doing it: at M = 1 they run at about a third of the 4-bit HBM floor (BENCHMARKS.md, session 15). Here the
packing is done once, when the weights load (``vkc_runtime.ops.nvfp4.pack_nvfp4_mma``), so that

* each thread's two 16-byte loads per 128-wide k block are exactly the mma.sync A fragments it needs (the
  layout ``DotOperandLayout(0, mma v2, k_width=16)`` gives a lane rows g and g + 8 and k in 16 t .. 16 t + 15
  and 64 + 16 t .. 64 + 16 t + 15, lane = 4 g + t), so nothing passes through shared memory;
* a code pair becomes a bf16 pair in three integer instructions (two masks and a shifted add) and one packed
  multiply that also applies its scale (``_decode_asm``), and the tensor cores do every product;
* the 4 scales a lane needs per k block sit in one 32-bit word.

MMA layout (``N16 = cdiv(N, 16)`` row blocks, ``KB = cdiv(K, 128)`` k blocks; rows and k past N / K are zero):

  words  int32 [N16, KB, 32, 8]  lane L = 4 g + t, word j = 4 q + 2 h + c holds the 8 codes of row
         n = 16 rb + g + 8 h at k = 128 kb + 64 q + 16 t + 8 c + e (e = 0..7), code e in nibble SLOT[e]
         (bits 4 SLOT[e] .. 4 SLOT[e] + 3), SLOT = (3, 7, 2, 6, 1, 5, 0, 4): pair r = (e = 2r, 2r + 1) sits in
         the top nibbles of the two half-words after a left shift by 4 r.
  scales int32 [N16, KB, 32]     byte 2 q + h of lane L's word: the scale of row 16 rb + g + 8 h for the 16 k
         starting at 128 kb + 64 q + 16 t, re-encoded as "e5m3": s = 2^(E - 13) * (1 + m / 8), byte = E << 3 | m.
         Every e4m3 value, subnormals included, is such a value with E in 4..21; a zero scale is stored as byte 0
         with its 16 codes zeroed, a negative one as its magnitude with its codes negated (exact either way).

Decoding (exact): a code's 3 magnitude bits shifted to bits 6..8 of a bf16 (the sign to bit 15) are the e2m1
value v times 2^-126 (bit 6 alone is the one subnormal, 0.5 * 2^-126); the scale byte shifted left by 4 and
ORed with 0x7000 is the bf16 2^(97 + E) * (1 + m / 8) = s * 2^110. Their product, one ``mul`` of bf16 pairs,
is v * s * 2^-16 exactly (at most 6 significant bits, inside bf16's normal range for every code and scale; it
relies on bf16 arithmetic keeping the subnormal input, as PTX's bf16 fma does). The accumulator is multiplied
by alpha * 2^16 once at the end.

``gemv_w4a16_mma_kernel``: a program owns R row blocks (16 R rows of W) and BLOCK_M rows of x; per row block WK
warps take the 128-wide k blocks of its K range in turn (warp (wk, r): blocks lo + wk, lo + wk + WK, ...), each a
[16, 128] x [128, BLOCK_M] mma_v2 per block, and the WK partial tiles are summed at the end (shared memory,
once). The next block's words, scales and x are loaded before the current one is decoded. Grid
(cdiv(N, 16 R) * cdiv(M, BLOCK_M), n_split): the M chunk varies fastest, so the programs of one row block run
together and read its weights from L2 after the first. Split-K as in gemv.py (``k_split`` a multiple of 128 WK;
fp32 partials ws[s, m, n], gemv_reduce_kernel).

``nvfp4_mma_dequant_kernel`` (Triton, so the interpreter runs it on CPU): the bf16 weights W * alpha [N, K] read
back from the MMA layout -- the large-M path's operand for the bf16 GEMM, and the CPU tests' reading of the
layout. Grid (N16, cdiv(K, 128)).
"""
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from kernels_src.common import pdl_enter
from kernels_src.gemv.gemv import _e2m1_bits

SLOT = (3, 7, 2, 6, 1, 5, 0, 4)  # nibble of code e in its word (the decoder's round r reads e = 2r, 2r + 1)
E5M3_BIAS = 13                   # s = 2^(E - 13) * (1 + m / 8)
ACC_SCALE = 65536.0              # the decoded weights are W * 2^-16 (before alpha)


@gluon.constexpr_function
def _decode_asm(outputs, inputs):
    """PTX for one lane: 8 words + 1 scale word -> the 64 bf16 A elements of a [16, 128] block, in the register
    order of DotOperandLayout(0, mma v2, 16): element i = kk + 16 h + 32 q (row g + 8 h, k 64 q + 16 t + kk), so
    word j = 4 q + 2 h + c gives elements 8 j .. 8 j + 7, pair r of it elements 8 j + 2 r, 8 j + 2 r + 1."""
    (out,) = outputs
    words, sc = inputs
    lines = ["{", ".reg .b32 q, t, o, s0, s1, s2, s3, c7, nz;", "mov.b32 c7, 0x07070707;", "mov.b32 nz, 0x80008000;"]
    for b in range(4):  # s_b = {bf16 0x7000 | byte_b << 4} x 2: PRMT [byte b, 0x07, byte b, 0x07], then << 4
        lines += [f"prmt.b32 s{b}, {sc[0]}, c7, 0x4{b}4{b};", f"shl.b32 s{b}, s{b}, 4;"]
    for j in range(8):
        sreg = f"s{2 * (j >> 2) + ((j >> 1) & 1)}"  # byte 2 q + h
        for r in range(4):
            src = words[j]
            if r:
                lines.append(f"shl.b32 q, {words[j]}, {4 * r};")
                src = "q"
            lines += [f"and.b32 t, {src}, 0x70007000;", "shr.b32 t, t, 6;", f"and.b32 o, {src}, 0x80008000;",
                      "or.b32 o, o, t;", f"fma.rn.bf16x2 o, o, {sreg}, nz;"]
            p = 4 * j + r
            lines.append(f"mov.b32 {{{out[2 * p]}, {out[2 * p + 1]}}}, o;")
    lines.append("}")
    return "\n".join(lines)


@gluon.constexpr_function
def _layouts_ok(a_ll, w_ll, s_ll, wk, r):
    """The A operand layout is the one _decode_asm is written for, and the words / scales tensors give every warp
    the same (k slice, row block) as the A operand (guards against a Triton that changes either)."""
    rb = [1 << i for i in range(r.bit_length() - 1)]
    kb = [1 << i for i in range(wk.bit_length() - 1)]
    rows = [[0, 16 * b, 0] for b in rb]
    ks = [[b, 0, 0] for b in kb]
    return (a_ll.reg_bases == [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 8, 0], [0, 0, 64]]
            and a_ll.lane_bases == [[0, 0, 16], [0, 0, 32], [0, 1, 0], [0, 2, 0], [0, 4, 0]]
            and a_ll.warp_bases == rows + ks
            and w_ll.warp_bases == [[0, b, 0, 0] for b in rb] + [[b, 0, 0, 0] for b in kb]
            and s_ll.warp_bases == [[0, b, 0] for b in rb] + [[b, 0, 0] for b in kb])


@gluon.jit
def gluon_pdl_enter(PDL: gl.constexpr):
    # kernels_src/common.py pdl_enter for Gluon: wait for the previous kernel, then let the next one start
    if PDL:
        gl.inline_asm("griddepcontrol.wait;", "", [], (), is_pure=False)
        gl.inline_asm("griddepcontrol.launch_dependents;", "", [], (), is_pure=False)


@gluon.jit
def gemv_w4a16_mma_kernel(x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, alpha, M, N, K, stride_xm, stride_om, k_split,
                          BLOCK_M: gl.constexpr, WK: gl.constexpr, R: gl.constexpr, PDL: gl.constexpr):
    """x [M, K] bf16 (row stride stride_xm), the MMA layout's words (w_ptr, int32) and scales (s_ptr, int32), alpha
    the fp32 global multiplier -> y [M, N] bf16 (row stride stride_om) or fp32 partials ws[s, m, n] (module doc).
    A program: R row blocks (16 R rows of W) x BLOCK_M rows of x; its WK x R warps, warp (wk, r) on row block r and
    the k blocks lo + wk, lo + wk + WK, ... of the program's K range. Grid (cdiv(N, 16 R) * cdiv(M, BLOCK_M),
    n_split); k_split a positive multiple of 128 * WK with n_split * k_split >= K; num_warps == WK * R."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WK, R, 1], instr_shape=[1, 16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=16)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=16)
    w_l: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 1, 32, 1], [WK, R, 1, 1], [3, 2, 1, 0])
    s_l: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 1, 32], [WK, R, 1], [2, 1, 0])
    gl.static_assert(_layouts_ok(gl.to_linear_layout(a_l, [WK, 16 * R, 128]),
                                 gl.to_linear_layout(w_l, [WK, R, 32, 8]), gl.to_linear_layout(s_l, [WK, R, 32]),
                                 WK, R))

    pid = gl.program_id(0)
    n_mc = gl.cdiv(M, BLOCK_M)
    rt = pid // n_mc
    m0 = (pid - rt * n_mc) * BLOCK_M
    pid_k = gl.program_id(1)
    n_split = gl.num_programs(1)
    KB = gl.cdiv(K, 128)
    N16 = gl.cdiv(N, 16)
    kb_lo = pid_k * (k_split // 128)
    kb_hi = gl.minimum(KB, kb_lo + k_split // 128)

    # words [WK, R, 32, 8] and scales [WK, R, 32]: warp (wk, r)'s block of row block rt * R + r
    wl3: gl.constexpr = gl.SliceLayout(3, w_l)
    wk = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, wl3)))[:, None, None, None]
    wr = rt * R + gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, wl3)))[None, :, None, None]
    w_off = (wr.to(gl.int64) * KB + wk) * 256 \
        + gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, wl3)))[None, None, :, None] * 8 \
        + gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, w_l))))[None, None, None, :]
    w_row_ok = wr < N16
    sk = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, s_l)))[:, None, None]
    sr = rt * R + gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, s_l)))[None, :, None]
    s_off = (sr.to(gl.int64) * KB + sk) * 32 + gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, s_l)))[None, None, :]
    s_row_ok = sr < N16
    # x [WK, 128, BLOCK_M] (x^T of warp wk's k block; the R row-block warps read the same)
    xw = gl.arange(0, WK, layout=gl.SliceLayout(1, gl.SliceLayout(2, b_l)))[:, None, None]
    x_k = xw * 128 + gl.arange(0, 128, layout=gl.SliceLayout(0, gl.SliceLayout(2, b_l)))[None, :, None]
    xm = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(1, b_l)))[None, None, :]
    x_rows = x_ptr + xm.to(gl.int64) * stride_xm
    m_ok = xm < M

    # the first block's weights before the PDL wait (model weights: never written by the previous kernel); the loop
    # loads the next block's words, scales and x before it decodes the current one (a second block of weights in
    # flight per warp measured no faster: BENCHMARKS.md, session 16)
    words = gl.load(w_ptr + kb_lo * 256 + w_off, mask=w_row_ok & (kb_lo + wk < kb_hi), other=0)
    sc = gl.load(s_ptr + kb_lo * 32 + s_off, mask=s_row_ok & (kb_lo + sk < kb_hi), other=0)
    gluon_pdl_enter(PDL)
    xk = kb_lo * 128 + x_k
    xt = gl.load(x_rows + xk, mask=m_ok & (xk < K) & (kb_lo + xw < kb_hi), other=0.0)
    acc = gl.zeros([WK, 16 * R, BLOCK_M], gl.float32, mma)
    for kb0 in range(kb_lo, kb_hi, WK):
        nb = kb0 + WK
        words_n = gl.load(w_ptr + nb * 256 + w_off, mask=w_row_ok & (nb + wk < kb_hi), other=0)
        sc_n = gl.load(s_ptr + nb * 32 + s_off, mask=s_row_ok & (nb + sk < kb_hi), other=0)
        xk = nb * 128 + x_k
        xt_n = gl.load(x_rows + xk, mask=m_ok & (xk < K) & (nb + xw < kb_hi), other=0.0)
        a = gl.inline_asm(_decode_asm, ("=h", "r", "r"), [words, sc],
                          gl.distributed_type(gl.bfloat16, [WK, 16 * R, 128], a_l), is_pure=True)
        acc = mma_v2(a, xt, acc)
        words = words_n
        sc = sc_n
        xt = xt_n

    y = gl.sum(acc, axis=0) * (alpha * 65536.0)  # ACC_SCALE
    y_l: gl.constexpr = gl.SliceLayout(0, mma)
    n = rt * 16 * R + gl.arange(0, 16 * R, layout=gl.SliceLayout(1, y_l))[:, None]
    m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, y_l))[None, :]
    ok = (n < N) & (m < M)
    if n_split == 1:
        gl.store(out_ptr + m.to(gl.int64) * stride_om + n, y.to(gl.bfloat16), mask=ok)
    else:
        gl.store(ws_ptr + (pid_k * M + m).to(gl.int64) * N + n, y, mask=ok)


@triton.jit
def nvfp4_mma_dequant_kernel(w_ptr, s_ptr, out_ptr, alpha, N, K, stride_on, PDL: tl.constexpr):
    """out[n, k] = bf16(W[n, k] * alpha) for the 16 rows x 128 k of block (program_id(0), program_id(1)) of the
    MMA layout (module doc); rows >= N and k >= K are not stored. out row stride stride_on elements. The loads
    (weights only) run before the PDL wait, the stores after it (out may be what the previous kernel reads)."""
    rb = tl.program_id(0)
    kb = tl.program_id(1)
    KB = tl.cdiv(K, 128)
    lane = tl.arange(0, 32)[:, None, None]
    j = tl.arange(0, 8)[None, :, None]
    e = tl.arange(0, 8)[None, None, :]
    blk = (rb.to(tl.int64) * KB + kb) * 32
    word = tl.load(w_ptr + (blk + lane) * 8 + j)                  # [32, 8, 1]
    slot = tl.where(e % 2 == 0, 3 - e // 2, 7 - e // 2)           # SLOT[e]
    code = (word >> (4 * slot)) & 0xF                             # [32, 8, 8]
    q = j // 4
    h = (j // 2) % 2
    sbyte = (tl.load(s_ptr + blk + lane) >> (8 * (2 * q + h))) & 0xFF  # [32, 8, 1]
    ex = (sbyte >> 3) - 13                                        # E5M3_BIAS
    s = tl.exp2(ex.to(tl.float32)) * (1.0 + (sbyte & 7).to(tl.float32) / 8.0)
    mag = code & 7
    v = tl.where(mag < 2, 0.5 * mag.to(tl.float32),
                 tl.exp2(((mag >> 1) - 1).to(tl.float32)) * (1.0 + (mag & 1).to(tl.float32) / 2.0))
    v = tl.where(code >= 8, -v, v)
    g = lane // 4
    t = lane % 4
    pdl_enter(PDL)
    n = rb * 16 + g + 8 * h
    k = kb * 128 + 64 * q + 16 * t + 8 * (j % 2) + e
    tl.store(out_ptr + n.to(tl.int64) * stride_on + k, (v * s * alpha).to(tl.bfloat16), mask=(n < N) & (k < K))


# One word of the MMA layout (8 codes, code e in nibble SLOT[e]) and its scale as a bf16 pair ($9 = {s, s}, s the
# e5m3 scale * 2^110) -> the 8 bf16 weights * 2^-16 $0..$7 in e order: _decode_asm's per-pair steps for one word.
_UNPACK_MMA = tl.constexpr("\n".join(
    ["{", ".reg .b32 q, t, o, nz;", "mov.b32 nz, 0x80008000;"]
    + [line for r in range(4) for line in (
        ([f"shl.b32 q, $8, {4 * r};"] if r else ["mov.b32 q, $8;"])
        + ["and.b32 t, q, 0x70007000;", "shr.b32 t, t, 6;", "and.b32 o, q, 0x80008000;", "or.b32 o, o, t;",
           "fma.rn.bf16x2 o, o, $9, nz;", f"mov.b32 {{${2 * r}, ${2 * r + 1}}}, o;"])]
    + ["}"]))


@triton.jit
def nvfp4_mma_tile(w_base, s_base, n, n_ok, k0, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRMT: tl.constexpr):
    """The exact bf16 weights W[n, k0 .. k0 + BLOCK_K) * 2^-16 [BLOCK_N, BLOCK_K] (before alpha, scaled like the
    decoder's: ACC_SCALE) of a weight in the MMA layout (module doc), in k order for tl.dot: w_base / s_base the
    weight's first word / scale word (int32 pointers), n [BN] its rows (n_ok the ones to read), k0 a multiple of
    16; k past K reads as zero. Each 16-k group's two words are gathered (adjacent), with its scale byte; PRMT: the
    PTX decoder (_UNPACK_MMA: five instructions a code pair), else integer arithmetic (Triton's interpreter): the
    code shifted out of nibble SLOT[e], the e5m3 scale rebuilt as fp32 bits, v * s * 2^-16 exact."""
    G: tl.constexpr = BLOCK_K // 16
    KB = tl.cdiv(K, 128)
    kg = k0 // 16 + tl.arange(0, G)                               # 16-k group
    ok = n_ok[:, None] & (kg < K // 16)[None, :]
    r16 = n % 16
    blk = (n // 16).to(tl.int64)[:, None] * KB + (kg // 8)[None, :]  # [BN, G] (row block, k block)
    lane = 4 * (r16 % 8)[:, None] + (kg % 4)[None, :]
    qh = 2 * ((kg % 8) // 4)[None, :] + (r16 // 8)[:, None]          # 2 q + h: word 2 qh + c, scale byte qh
    c = tl.arange(0, 2)[None, None, :]
    words = tl.load(w_base + ((blk * 32 + lane) * 8 + 2 * qh)[:, :, None] + c, mask=ok[:, :, None], other=0)
    sbyte = (tl.load(s_base + blk * 32 + lane, mask=ok, other=0) >> (8 * qh)) & 0xFF
    if PRMT:
        s16 = (sbyte << 4) | 0x7000                                  # bf16 bits of s * 2^110
        s2 = tl.broadcast_to((s16 | (s16 << 16))[:, :, None], words.shape)
        e0, e1, e2, e3, e4, e5, e6, e7 = tl.inline_asm_elementwise(
            _UNPACK_MMA, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, s2], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
        # join(A, B) appends a last dim of 2 (the outer join's pick is the last index): w[.., a, b, c] is
        # e_(4a + 2b + c), its flattened index
        w = tl.join(tl.join(tl.join(e0, e4), tl.join(e2, e6)), tl.join(tl.join(e1, e5), tl.join(e3, e7)))
    else:
        sval = ((((sbyte >> 3) + (127 - 13 - 16)) << 23) | ((sbyte & 7) << 20)).to(tl.float32, bitcast=True)
        e = tl.arange(0, 8)[None, None, None, :]
        code = (words[:, :, :, None] >> (4 * ((e % 2) * 4 + 3 - e // 2))) & 0xF  # nibble SLOT[e]
        w = (_e2m1_bits(code) * sval[:, :, None, None]).to(tl.bfloat16)  # E5M3_BIAS 13, * 2^-16
    return tl.reshape(w, (BLOCK_N, BLOCK_K))                         # [BN, G, 2, 8]: k = 16 g + 8 c + e


@triton.jit
def nvfp4_mma_pack_kernel(wp_ptr, sc_ptr, w_out, s_out, N, K, stride_wn, stride_sn, PDL: tl.constexpr):
    """Linear NVFP4 -> block (program_id(0), program_id(1)) of the MMA layout (module doc). weight_packed [N, K/2]
    uint8 (row stride stride_wn bytes, low nibble first), weight_scale [N, K/16] e4m3 bytes (row stride stride_sn);
    rows >= N and k >= K pack as zero. Scales become e5m3 bytes; a zero (or NaN: 0x7F / 0xFF, which no checkpoint
    holds and callers refuse) scale zeroes its 16 codes, a negative one negates them. K % 16 == 0."""
    rb = tl.program_id(0)
    kb = tl.program_id(1)
    KB = tl.cdiv(K, 128)
    lane = tl.arange(0, 32)[:, None]
    j = tl.arange(0, 8)[None, :]
    g = lane // 4
    t = lane % 4
    q = j // 4
    h = (j // 2) % 2
    n = rb * 16 + g + 8 * h                                       # [32, 8]
    kbyte = kb * 64 + 32 * q + 8 * t + 4 * (j % 2)                # first byte of the word's 8 codes
    ok = (n < N) & (kbyte < K // 2)                               # K % 16 == 0: a word is wholly in or out
    i4 = tl.arange(0, 4)[None, None, :]
    b = tl.load(wp_ptr + (n.to(tl.int64) * stride_wn + kbyte)[:, :, None] + i4, mask=ok[:, :, None], other=0)
    word = tl.sum(b.to(tl.uint32) << (8 * i4).to(tl.uint32), axis=2)  # code e in nibble e
    sc = tl.load(sc_ptr + n.to(tl.int64) * stride_sn + kb * 8 + 4 * q + t, mask=ok, other=0).to(tl.int32)
    mag = sc & 0x7F
    zero = (mag == 0) | (mag == 0x7F)
    # e4m3 -> e5m3: normals add 6 to the exponent (E = e + 6); the subnormals m / 8 * 2^-6 are normalised
    sub = tl.where(mag == 1, 32, tl.where(mag == 2, 40, tl.where(mag == 3, 44, 48 + 2 * (mag - 4))))
    e5 = tl.where(zero, 0, tl.where(mag >= 8, mag + 48, sub))
    word = tl.where(zero, 0, tl.where(sc >= 0x80, word ^ 0x88888888, word))
    out = tl.zeros_like(word)
    for e in tl.static_range(8):
        out |= ((word >> (4 * e)) & 0xF) << (4 * (4 * (e % 2) + 3 - e // 2))  # nibble SLOT[e]
    blk = (rb.to(tl.int64) * KB + kb) * 32
    pdl_enter(PDL)
    tl.store(w_out + (blk + lane) * 8 + j, out.to(tl.int32, bitcast=True))
    sword = tl.sum(tl.where(j % 2 == 0, e5 << (8 * (2 * q + h)), 0), axis=1)  # byte 2 q + h of the lane's word
    tl.store(s_out + blk + tl.arange(0, 32), sword)
