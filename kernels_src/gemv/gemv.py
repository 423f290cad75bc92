"""Small-M GEMM ("GEMV") kernels for decode: y[M, N] = x[M, K] @ W[N, K]^T, bf16 in/out, fp32 accumulate.

Each program owns BLOCK_N rows of W and ALL M (<= BLOCK_M) rows of x, so every weight byte is read from HBM
exactly once; x (a few KB) is re-read from L2 by every program. The product is computed "swapped":
acc[BLOCK_N, BLOCK_M] = W_tile[BLOCK_N, BLOCK_K] @ x_tile^T[BLOCK_K, BLOCK_M], so the large weight tile is the
MMA's A operand and the small M is its N dimension (tl.dot needs every dimension >= 16; rows m >= M are masked to
zero and never stored).

Split-K (grid axis 1 = n_split programs per N block): program (i, s) covers K range [s * k_split,
min(K, (s + 1) * k_split)) with k_split a multiple of BLOCK_K chosen by the host. With n_split == 1 the program
stores bf16 y directly; otherwise it stores its fp32 partial to ws[s, m, n] (a [n_split, M, N] contiguous fp32
workspace) and gemv_reduce_kernel sums the partials in the fixed order s = 0, 1, ... (deterministic: no
atomics) and stores bf16 y. Both paths are compiled into one kernel (n_split is a runtime value).

M = 1 (gemv_bf16_m1_kernel) runs on CUDA cores: an fp32 [BLOCK_N, BLOCK_K] product per K step, reduced once.

Tails: N and M are masked; K is masked against K (a split boundary is a multiple of BLOCK_K, so only the
last tile of the last split can be partial). The runtime promises (div=16 hints) K % 16 == 0 (bf16), row
strides % 16 elements and 16-byte aligned pointers, which keeps the masked loads vectorized.

Block-wise FP8 weights (gemv_w8a16_kernel): e4m3 bytes [N, K] with one fp32 scale per 128 x 128 block,
dequantized in the kernel (bf16 activations: W8A16; its docstring has the decoding).

NVFP4 weights (gemv_w4a16_kernel; the layout the op documents):
  w_packed [N, K/2] uint8: byte j of row n holds k = 2j in its LOW nibble and k = 2j + 1 in its high nibble;
           a nibble is e2m1 (bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa): 0, .5, 1, 1.5, 2, 3, 4, 6.
  scales   [N, K/16] uint8 bytes of float8 e4m3fn (bias 7, no inf): scales[n, g] scales k in [16g, 16g + 16).
           Linear, row-major, not swizzled.
  alpha    fp32: the one effective global multiplier.  W[n, k] = e2m1(nibble) * e4m3(scales[n, k // 16]) * alpha.
Decoding without tables or branches: the e4m3 scale's 7 low bits shifted into an fp16 (<< 7) are its value
times 2^-8 (subnormals included); an e2m1 magnitude shifted into an fp16 (<< 9) is its value times 2^-14 (the
one subnormal included). A weight times its scale has at most 6 significant bits, so the bf16 weight fed to
the MMA is exact; alpha multiplies the fp32 accumulator after the dot. Two decoders give identical bits:
  .int   elementwise integer math on bytes (one register per byte; ALU-bound well below the HBM floor of the
         4-bit weights); the only one Triton's interpreter can run, so the CPU tests check its semantics.
  .prmt  packed int32 words through _UNPACK8 (inline PTX, 8 weights per word: the 3-bit magnitudes index two
         8-entry byte tables with prmt, the sign is ORed in, an exact bf16x2 fma applies the scale); about half
         the instructions per byte of .int. Checked on the GPU against .int and float64 (tests/gpu).
M = 1 (gemv_w4a16_m1_kernel) runs on CUDA cores instead: no MMA padding M to 16, one int64 word per (row, scale
group of 16 k) so each scale byte is loaded once beside its word, and no shuffle of the decoded weights back into
k order (each of the 16 codes of a word meets x at its own k). The MMA kernel's k-order interleave and per-group
scale broadcast cost it little at M >= 16 but made an M = 1 kernel L1-bound (benchmarks/explore_w4a16.py).
"""
import triton
import triton.language as tl

from kernels_src.common import pdl_enter


@triton.jit
def _store_out(acc, n, m, N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split):
    """acc [BLOCK_N, BLOCK_M] fp32 -> bf16 y[m, n] (n_split == 1) or fp32 ws[pid_k, m, n]."""
    mask = (n < N)[:, None] & (m < M)[None, :]
    if n_split == 1:
        tl.store(out_ptr + m.to(tl.int64)[None, :] * stride_om + n[:, None], acc.to(tl.bfloat16), mask=mask)
    else:
        row = (pid_k * M + m).to(tl.int64) * N
        tl.store(ws_ptr + row[None, :] + n[:, None], acc, mask=mask)


@triton.jit
def _program_tile(N, K, k_split, BLOCK_N: tl.constexpr):
    """Program (pid_n, pid_k) of a gemv grid (cdiv(N, BLOCK_N), n_split): its BLOCK_N output rows n (and n < N)
    and the K range [k_lo, k_hi) of its split. Returns (pid_n, pid_k, n_split, n, n_ok, k_lo, k_hi)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = pid_k * k_split
    return pid_n, pid_k, tl.num_programs(1), n, n < N, k_lo, tl.minimum(K, k_lo + k_split)


@triton.jit
def gemv_bf16_kernel(x_ptr, w_ptr, out_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_om, k_split,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     PDL: tl.constexpr):
    """x [M, K] bf16 (row stride stride_xm), W [N, K] bf16 (row stride stride_wn) -> y [M, N] bf16 (row stride
    stride_om), or fp32 partials in ws (see the module doc). Grid (cdiv(N, BLOCK_N), n_split); M <= BLOCK_M;
    k_split a positive multiple of BLOCK_K with n_split * k_split >= K."""
    pdl_enter(PDL)
    pid_n, pid_k, n_split, n, n_ok, k_lo, k_hi = _program_tile(N, K, k_split, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + m.to(tl.int64)[None, :] * stride_xm
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        xt = tl.load(x_rows + k[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)
        acc = tl.dot(w, xt, acc)
    _store_out(acc, n, m, N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split)


@triton.jit
def gemv_bf16_m1_kernel(x_ptr, w_ptr, out_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_om, k_split,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PDL: tl.constexpr):
    """gemv_bf16_kernel for M = 1 (BLOCK_M == 1) on CUDA cores: no MMA padding the one row of x to 16, and
    tiles narrow enough (4 or 16 weight rows) that even N = 2048 gives hundreds of programs without split-K.
    Each K step multiplies the [BLOCK_N, BLOCK_K] weight tile by x's BLOCK_K values into an fp32 accumulator of
    the same shape; one reduction over its columns at the end. Same ABI, grid and outputs as gemv_bf16_kernel."""
    pid_n, pid_k, n_split, n, n_ok, k_lo, k_hi = _program_tile(N, K, k_split, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn + rk[None, :]
    # the weight tile of step k0 is loaded one step ahead (registers), the first one before pdl_enter: weights
    # only; past k_hi the load is fully masked (no access)
    w = tl.load(w_rows + k_lo, mask=n_ok[:, None] & ((k_lo + rk) < k_hi)[None, :], other=0.0)
    pdl_enter(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        xk = tl.load(x_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0)
        acc += w.to(tl.float32) * xk.to(tl.float32)[None, :]
        w = tl.load(w_rows + (k0 + BLOCK_K), mask=n_ok[:, None] & ((k0 + BLOCK_K + rk) < k_hi)[None, :], other=0.0)
    y = tl.sum(acc, axis=1)
    m = tl.arange(0, 1)
    _store_out(y[:, None], n, m, N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split)


@triton.jit
def _e2m1_bits(code):
    """int32 holding an e2m1 code in bits 3..0 -> its value as fp32 (exact: fp16 bits << 9 are value * 2^-14)."""
    bits = ((code & 0x7) << 9) | ((code & 0x8) << 12)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 16384.0


@triton.jit
def _dequant(b, sf):
    """Packed bytes b [BN, G, 8] uint8 and their group scales sf [BN, G] fp32 (exact e4m3 values) -> the bf16
    weights of the low and the high nibbles (k = 16 g + 2 j and 16 g + 2 j + 1), exact."""
    b32 = b.to(tl.int32)
    lo = (_e2m1_bits(b32) * sf[:, :, None]).to(tl.bfloat16)
    hi = (_e2m1_bits(b32 >> 4) * sf[:, :, None]).to(tl.bfloat16)
    return lo, hi


# One packed word (4 bytes = 8 e2m1 codes, k = 8 i .. 8 i + 7, low nibble first) and its group scale as a
# bf16 pair ($9 = {s, s}) -> the 8 bf16 weights $0..$7 in k order (exact: <= 6 significant bits).
_UNPACK8 = tl.constexpr("""
{
.reg .b32 x, y, sl, sh, t, ta, tb, la, lb, ha, hb, L, H, p0, p1, q0, q1, neg0;
mov.b32 la, 0xC0800000;
mov.b32 lb, 0xC0804000;
mov.b32 ha, 0x3F3F3F00;
mov.b32 hb, 0x40404040;
mov.b32 neg0, 0x80008000;
and.b32 x, $8, 0x07070707;
shr.b32 t, x, 12;
or.b32 sl, x, t;
shr.b32 y, $8, 4;
and.b32 y, y, 0x07070707;
shr.b32 t, y, 12;
or.b32 sh, y, t;
prmt.b32 ta, $8, 0, 0x4140;
prmt.b32 tb, $8, 0, 0x4342;
prmt.b32 L, la, lb, sl;
prmt.b32 H, ha, hb, sl;
prmt.b32 p0, L, H, 0x6240;
prmt.b32 p1, L, H, 0x7351;
prmt.b32 L, la, lb, sh;
prmt.b32 H, ha, hb, sh;
prmt.b32 q0, L, H, 0x6240;
prmt.b32 q1, L, H, 0x7351;
shl.b32 t, ta, 12;
and.b32 t, t, 0x80008000;
or.b32 p0, p0, t;
shl.b32 t, tb, 12;
and.b32 t, t, 0x80008000;
or.b32 p1, p1, t;
shl.b32 t, ta, 8;
and.b32 t, t, 0x80008000;
or.b32 q0, q0, t;
shl.b32 t, tb, 8;
and.b32 t, t, 0x80008000;
or.b32 q1, q1, t;
fma.rn.bf16x2 p0, p0, $9, neg0;
fma.rn.bf16x2 p1, p1, $9, neg0;
fma.rn.bf16x2 q0, q0, $9, neg0;
fma.rn.bf16x2 q1, q1, $9, neg0;
mov.b32 {$0, $2}, p0;
mov.b32 {$4, $6}, p1;
mov.b32 {$1, $3}, q0;
mov.b32 {$5, $7}, q1;
}
""")


# The same decoder with fp32 outputs: each bf16 of the pairs p0, p1, q0, q1 widened in place (a bf16 is the high
# half of its fp32), $0..$7 = the fp32 bits of the 8 weights in k order (the CUDA-core M = 1 kernel's operands).
_UNPACK8_F32 = tl.constexpr(_UNPACK8.value.replace("""mov.b32 {$0, $2}, p0;
mov.b32 {$4, $6}, p1;
mov.b32 {$1, $3}, q0;
mov.b32 {$5, $7}, q1;""", """shl.b32 $0, p0, 16;
and.b32 $2, p0, 0xFFFF0000;
shl.b32 $4, p1, 16;
and.b32 $6, p1, 0xFFFF0000;
shl.b32 $1, q0, 16;
and.b32 $3, q0, 0xFFFF0000;
shl.b32 $5, q1, 16;
and.b32 $7, q1, 0xFFFF0000;"""))
assert "shl.b32 $0, p0, 16;" in _UNPACK8_F32.value

@triton.jit
def _dequant_words(w_rows32, g_abs, g_ok, n_ok, sf, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The PRMT decoder: the tile's packed words [BN, G, 2] int32 (w_rows32: int32 row pointers) and group
    scales sf [BN, G] -> W [BN, BK] bf16 (_UNPACK8 per word, the 8 results interleaved back into k order)."""
    t = tl.arange(0, 2)
    wd = tl.load(w_rows32 + (g_abs * 2)[None, :, None] + t[None, None, :],
                 mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
    s16 = sf.to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.int32)
    s2 = tl.broadcast_to((s16 | (s16 << 16))[:, :, None], wd.shape)
    e0, e1, e2, e3, e4, e5, e6, e7 = tl.inline_asm_elementwise(
        _UNPACK8, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [wd, s2], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    # join(A, B) appends a last dim of 2: the flattened index of w8[a, b, c] is 4 a + 2 b + c = k % 8
    w8 = tl.join(tl.join(tl.join(e0, e4), tl.join(e2, e6)), tl.join(tl.join(e1, e5), tl.join(e3, e7)))
    return tl.reshape(w8, (BLOCK_N, BLOCK_K))


@triton.jit
def e4m3_f16_scaled(b):
    """e4m3 bytes (any integer type) -> fp16 holding the value times 2^-8, exact (the 7 low bits shifted into an
    fp16, subnormals included; the NaN codes 0x7F / 0xFF give +-480 * 2^-8): the integer decoding for archs
    without the hardware's e4m3 conversion (the MoE FP8 expert kernels, kernels_src/moe/fp8.py)."""
    bi = b.to(tl.int32)
    bits = ((bi & 0x7F) << 7) | ((bi & 0x80) << 8)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def e4m3_scale(sc):
    """int32 holding e4m3 scale bytes -> their exact fp32 values (the 7 low bits shifted into an fp16 are the
    value times 2^-8, subnormals included)."""
    sbits = ((sc & 0x7F) << 7) | ((sc & 0x80) << 8)
    return sbits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0


@triton.jit
def nvfp4_tile(w_rows, w_rows32, s_rows, k0, K, n_ok, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               PRMT: tl.constexpr):
    """The exact bf16 weights W[n, k0 .. k0 + BLOCK_K) [BLOCK_N, BLOCK_K] of an NVFP4 tile (before the global
    multiplier): w_rows [BN, 1, 1] byte row pointers (w_rows32 the same rows as int32 pointers, used with PRMT),
    s_rows [BN, 1] scale row pointers, n_ok [BN] the rows to read; scale groups past K // 16 read as zero."""
    G: tl.constexpr = BLOCK_K // 16  # scale groups per tile
    g_abs = k0 // 16 + tl.arange(0, G)  # scale group of each [g] slice; its 8 bytes are k = 16 g_abs .. + 15
    g_ok = g_abs < K // 16
    sc = tl.load(s_rows + g_abs[None, :], mask=n_ok[:, None] & g_ok[None, :], other=0).to(tl.int32)
    sf = e4m3_scale(sc)
    if PRMT:
        w = _dequant_words(w_rows32, g_abs, g_ok, n_ok, sf, BLOCK_N, BLOCK_K)
    else:
        byte = (g_abs * 8)[None, :, None] + tl.arange(0, 8)[None, None, :]
        b = tl.load(w_rows + byte, mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
        lo, hi = _dequant(b, sf)
        w = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
    return w


@triton.jit
def gemv_w4a16_kernel(x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, alpha, M, N, K, stride_xm, stride_wn, stride_sn,
                      stride_om, k_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PRMT: tl.constexpr, PDL: tl.constexpr):
    """y = x @ dequant(W)^T with NVFP4 weights (layout in the module doc): x [M, K] bf16, w_packed [N, K/2] uint8
    (row stride stride_wn bytes), scales [N, K/16] uint8 (row stride stride_sn bytes), alpha fp32 -> y [M, N]
    bf16, or fp32 partials (already times alpha) in ws. Grid (cdiv(N, BLOCK_N), n_split); M <= BLOCK_M; K % 16
    == 0; k_split a positive multiple of BLOCK_K with n_split * k_split >= K. PRMT: decode packed words with
    _UNPACK8 (inline PTX; compiled kernels only), else bytes elementwise (_dequant; the interpreter's path)."""
    pid_n, pid_k, n_split, n, n_ok, k_lo, k_hi = _program_tile(N, K, k_split, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    w_rows = w_ptr + n.to(tl.int64)[:, None, None] * stride_wn
    if PRMT:
        w_rows32 = w_ptr.to(tl.pointer_type(tl.int32)) + n.to(tl.int64)[:, None, None] * (stride_wn // 4)
    else:
        w_rows32 = w_rows  # unused
    s_rows = s_ptr + n.to(tl.int64)[:, None] * stride_sn
    x_rows = x_ptr + m.to(tl.int64)[None, :] * stride_xm
    pdl_enter(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        w = nvfp4_tile(w_rows, w_rows32, s_rows, k0, K, n_ok, BLOCK_N, BLOCK_K, PRMT)
        k = k0 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_rows + k[:, None], mask=(k < K)[:, None] & m_ok[None, :], other=0.0)
        acc = tl.dot(w, xt, acc)
    acc = acc * alpha
    _store_out(acc, n, m, N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split)


@triton.jit
def nvfp4_words_fma(acc, w64, sf, xg, x_ok, PRMT: tl.constexpr):
    """acc + the 16 weights of each int64 word of ``w64`` (code i of a word is its k = 16 g + i, low nibble first)
    times the word's group scale ``sf`` (fp32, exact e4m3 values) times x[16 g + i], read at ``xg + i`` (``xg``:
    pointers to each word's 16 x values, broadcastable against w64; ``x_ok`` their mask), in fp32. PRMT: two
    _UNPACK8_F32 per word (inline PTX), else nibble by nibble (_e2m1_bits; the interpreter's path). Any shape:
    the M = 1 GEMV's [BLOCK_N, G] words and the MoE decode kernels' [slots, BLOCK_N, G] (kernels_src/moe)."""
    if PRMT:
        s16 = sf.to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.int32)
        s2 = s16 | (s16 << 16)
        lo = tl.inline_asm_elementwise(_UNPACK8_F32, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [w64.to(tl.int32), s2],
                                       dtype=(tl.int32,) * 8, is_pure=True, pack=1)
        hi = tl.inline_asm_elementwise(_UNPACK8_F32, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [(w64 >> 32).to(tl.int32), s2],
                                       dtype=(tl.int32,) * 8, is_pure=True, pack=1)
        for i in tl.static_range(8):
            xi = tl.load(xg + i, mask=x_ok, other=0.0).to(tl.float32)
            acc += lo[i].to(tl.float32, bitcast=True) * xi
        for i in tl.static_range(8):
            xi = tl.load(xg + 8 + i, mask=x_ok, other=0.0).to(tl.float32)
            acc += hi[i].to(tl.float32, bitcast=True) * xi
    else:
        for i in tl.static_range(16):
            xi = tl.load(xg + i, mask=x_ok, other=0.0).to(tl.float32)
            acc += _e2m1_bits(((w64 >> (4 * i)) & 0xF).to(tl.int32)) * sf * xi
    return acc


@triton.jit
def gemv_w4a16_m1_kernel(x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, alpha, M, N, K, stride_xm, stride_wn, stride_sn,
                         stride_om, k_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         PRMT: tl.constexpr, PDL: tl.constexpr):
    """gemv_w4a16_kernel for M = 1 (BLOCK_M == 1) on CUDA cores (module doc): the tile is read as [BLOCK_N, G]
    int64 words, one per scale group, decoded into 16 weights per word (code i is k = 16 g + i) that are widened
    to fp32 and multiplied with x[16 g + i] into an fp32 [BLOCK_N, G] accumulator, summed over G at the end.
    PRMT: _UNPACK8_F32 on each 32-bit half (inline PTX), else nibble by nibble. Same ABI, grid and outputs as
    gemv_w4a16_kernel."""
    G: tl.constexpr = BLOCK_K // 16
    pid_n, pid_k, n_split, n, n_ok, k_lo, k_hi = _program_tile(N, K, k_split, BLOCK_N)
    g = tl.arange(0, G)
    w_rows = w_ptr.to(tl.pointer_type(tl.int64)) + n.to(tl.int64)[:, None] * (stride_wn // 8)
    s_rows = s_ptr + n.to(tl.int64)[:, None] * stride_sn
    Kg = K // 16
    pdl_enter(PDL)
    acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ga = k0 // 16 + g
        g_ok = ga < Kg
        ok = n_ok[:, None] & g_ok[None, :]
        w64 = tl.load(w_rows + ga[None, :], mask=ok, other=0)
        sc = tl.load(s_rows + ga[None, :], mask=ok, other=0).to(tl.int32)
        sf = e4m3_scale(sc)
        acc = nvfp4_words_fma(acc, w64, sf, (x_ptr + 16 * ga)[None, :], g_ok[None, :], PRMT)
    y = tl.sum(acc, axis=1) * alpha
    _store_out(y[:, None], n, tl.arange(0, 1), N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split)


@triton.jit
def gemv_w8a16_kernel(x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om,
                      k_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PDL: tl.constexpr):
    """y = x @ dequant(W)^T with block-wise FP8 weights (Qwen's *-FP8 checkpoints): w [N, K] uint8 bytes of
    float8 e4m3fn (row stride stride_wn bytes), s [cdiv(N, 128), cdiv(K, 128)] fp32 (``weight_scale_inv``, the
    multiplier of each 128 x 128 block; row stride stride_sn elements), W[n, k] = e4m3(w[n, k]) * s[n // 128,
    k // 128]; x [M, K] bf16 -> y [M, N] bf16, or fp32 partials in ws. BLOCK_K == 128 and BLOCK_N divides 128, so
    a tile meets one scale per K step: the e4m3 bytes become exact bf16 values times 2^-8 (fp16 bits of the 7 low
    bits << 7, the sign << 8, subnormals included; the NaN codes 0x7F / 0xFF decode as +-480), the MMA sums one
    K step of them into fp32, and the step's scale (times 2^8) multiplies that before it joins the accumulator.
    Grid (cdiv(N, BLOCK_N), n_split); M <= BLOCK_M; K % 16 == 0; k_split a positive multiple of 128."""
    tl.static_assert(BLOCK_K == 128, "one weight scale per K step: BLOCK_K must be the 128 of the scale blocks")
    tl.static_assert(128 % BLOCK_N == 0, "one weight scale per K step: BLOCK_N must divide 128")
    pid_n, pid_k, n_split, n, n_ok, k_lo, k_hi = _program_tile(N, K, k_split, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + m.to(tl.int64)[None, :] * stride_xm
    s_row = s_ptr + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    pdl_enter(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        b = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0).to(tl.int32)
        bits = ((b & 0x7F) << 7) | ((b & 0x80) << 8)  # fp16 bits of the e4m3 value * 2^-8
        w = bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.bfloat16)
        xt = tl.load(x_rows + k[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)
        sc = tl.load(s_row + k0 // 128) * 256.0
        acc += tl.dot(w, xt) * sc
    _store_out(acc, n, m, N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split)


@triton.jit
def gemv_w8a16_m1_kernel(x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om,
                         k_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         NATIVE: tl.constexpr, PDL: tl.constexpr):
    """gemv_w8a16_kernel for M = 1 (BLOCK_M == 1) on CUDA cores: the [BLOCK_N, BLOCK_K] e4m3 tile decoded to fp32
    (NATIVE: the hardware's fp8 conversion, sm_89+; else the integer decoding of gemv_w8a16_kernel, times 2^8
    once at the end), multiplied by x * scale, formed once per column (x[k] * s[n // 128, k // 128]: BLOCK_N
    divides 128, so a program's rows share one scale row), and summed over each step's K into a [BLOCK_N] fp32
    accumulator. Same ABI, grid and outputs as gemv_w8a16_kernel; BLOCK_K and k_split multiples of 128.
    Per-step sums, not a [BLOCK_N, BLOCK_K] accumulator reduced once: 47 / 48 registers instead of 77 / 78
    (sm_90a); with the op rule's tiles, 3-19% less time on 12 of the 13 FP8 shapes of bench_gemv, 21% more on
    one (27B gdn_z, 6144 x 5120; H100, BENCHMARKS.md session 35)."""
    tl.static_assert(BLOCK_K % 128 == 0, "BLOCK_K must be a multiple of the 128 of the scale blocks")
    tl.static_assert(128 % BLOCK_N == 0, "one scale row per program: BLOCK_N must divide 128")
    pid_n, pid_k, n_split, n, n_ok, k_lo, k_hi = _program_tile(N, K, k_split, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn + rk[None, :]
    s_row = s_ptr + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    # no weight tile before pdl_enter here: holding one across the loop took 94-100 registers (sm_90a, with the
    # earlier full-tile accumulator: 77-78 without it), one program fewer per SM
    pdl_enter(PDL)
    y = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        b = tl.load(w_rows + k0, mask=n_ok[:, None] & k_ok[None, :], other=0)
        if NATIVE:
            w = b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            bi = b.to(tl.int32)
            bits = ((bi & 0x7F) << 7) | ((bi & 0x80) << 8)  # fp16 bits of the e4m3 value * 2^-8
            w = bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        xs = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32) * tl.load(s_row + k // 128, mask=k_ok, other=0.0)
        y += tl.sum(w * xs[None, :], axis=1)
    if not NATIVE:
        y = y * 256.0
    _store_out(y[:, None], n, tl.arange(0, 1), N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split)


@triton.jit
def gemv_reduce_kernel(ws_ptr, out_ptr, M, N, stride_om, n_split, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """y[m, n] = bf16(sum_{s = 0 .. n_split-1} ws[s, m, n]) in that order. ws [n_split, M, N] fp32 contiguous.
    Grid (cdiv(N, BLOCK), M)."""
    m = tl.program_id(1)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = n < N
    plane = M.to(tl.int64) * N
    p = ws_ptr + m.to(tl.int64) * N + n
    pdl_enter(PDL)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(n_split):
        acc += tl.load(p + s * plane, mask=ok, other=0.0)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + n, acc.to(tl.bfloat16), mask=ok)
