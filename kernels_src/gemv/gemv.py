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

Tails: N and M are masked; K is masked against K (a split boundary is a multiple of BLOCK_K, so only the
last tile of the last split can be partial). The runtime promises (div=16 hints) K % 16 == 0 (bf16), row
strides % 16 elements and 16-byte aligned pointers, which keeps the masked loads vectorized.

NVFP4 weights (gemv_w4a16_kernel; the layout the op documents):
  w_packed [N, K/2] uint8: byte j of row n holds k = 2j in its LOW nibble and k = 2j + 1 in its high nibble;
           a nibble is e2m1 (bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa): 0, .5, 1, 1.5, 2, 3, 4, 6.
  scales   [N, K/16] uint8 bytes of float8 e4m3fn (bias 7, no inf): scales[n, g] scales k in [16g, 16g + 16).
           Linear, row-major, not swizzled.
  alpha    fp32: the one effective global multiplier.  W[n, k] = e2m1(nibble) * e4m3(scales[n, k // 16]) * alpha.
Decoding without tables or branches: the e4m3 scale's 7 low bits shifted into an fp16 (<< 7) are its value
times 2^-8 (subnormals included); an e2m1 magnitude shifted into an fp16 (<< 9) is its value times 2^-14 (the
one subnormal included). A weight times its scale has at most 6 significant bits, so the bf16 weight fed to
the MMA is exact; alpha multiplies the fp32 accumulator after the dot. A tile is read as one int64 word per
(row, scale group of 16 k), so each scale byte is loaded once beside its word, and is accumulated as 16 dots
W_i @ x_i^T over the groups, W_i[n, g] = W[n, 16 g + i] and x_i[g, m] = x[m, 16 g + i]: the k sum in another
order, with no shuffle of the decoded weights back into k order. Two decoders give identical bits:
  .int   nibble by nibble with integer math (ALU-heavy); the only one Triton's interpreter can run, so the CPU
         tests check its semantics.
  .prmt  each 32-bit half of a word through _UNPACK8 (inline PTX, 8 weights per half: the 3-bit magnitudes index
         two 8-entry byte tables with prmt, the sign is ORed in, an exact bf16x2 fma applies the scale). Checked
         on the GPU against .int and float64 (tests/gpu).
"""
import triton
import triton.language as tl


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
def gemv_bf16_kernel(x_ptr, w_ptr, out_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_om, k_split,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [M, K] bf16 (row stride stride_xm), W [N, K] bf16 (row stride stride_wn) -> y [M, N] bf16 (row stride
    stride_om), or fp32 partials in ws (see the module doc). Grid (cdiv(N, BLOCK_N), n_split); M <= BLOCK_M;
    k_split a positive multiple of BLOCK_K with n_split * k_split >= K."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n_split = tl.num_programs(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + m.to(tl.int64)[None, :] * stride_xm
    k_lo = pid_k * k_split
    k_hi = tl.minimum(K, k_lo + k_split)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        xt = tl.load(x_rows + k[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)
        acc = tl.dot(w, xt, acc)
    _store_out(acc, n, m, N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split)


@triton.jit
def _e2m1_bits(code):
    """int32 holding an e2m1 code in bits 3..0 -> its value as fp32 (exact: fp16 bits << 9 are value * 2^-14)."""
    bits = ((code & 0x7) << 9) | ((code & 0x8) << 12)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 16384.0


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
def gemv_w4a16_kernel(x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, alpha, M, N, K, stride_xm, stride_wn, stride_sn,
                      stride_om, k_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PRMT: tl.constexpr):
    """y = x @ dequant(W)^T with NVFP4 weights (layout in the module doc): x [M, K] bf16, w_packed [N, K/2] uint8
    (row stride stride_wn bytes), scales [N, K/16] uint8 (row stride stride_sn bytes), alpha fp32 -> y [M, N]
    bf16, or fp32 partials (already times alpha) in ws. Grid (cdiv(N, BLOCK_N), n_split); M <= BLOCK_M; K % 16
    == 0; k_split a positive multiple of BLOCK_K with n_split * k_split >= K.

    The tile is read as [BLOCK_N, G] int64 words, one per scale group of 16 k (so each scale byte is loaded
    once, next to its word), decoded into 16 bf16 tiles W_i[n, g] = W[n, 16 g + i], and accumulated as 16 dots
    W_i @ x_i^T with x_i[g, m] = x[m, 16 g + i]: the sum over k in another order, with no interleave back into
    k order (the layout shuffles of that interleave, and per-byte scale gathers, made the kernel L1-bound).
    PRMT: decode with _UNPACK8 (inline PTX; compiled kernels only), else nibble by nibble (the interpreter's)."""
    G: tl.constexpr = BLOCK_K // 16  # scale groups per tile (>= 16: the dots' K)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n_split = tl.num_programs(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_ok = n < N
    m_ok = m < M
    g = tl.arange(0, G)
    w_rows = w_ptr.to(tl.pointer_type(tl.int64)) + n.to(tl.int64)[:, None] * (stride_wn // 8)
    s_rows = s_ptr + n.to(tl.int64)[:, None] * stride_sn
    x_rows = x_ptr + m.to(tl.int64)[None, :] * stride_xm
    k_lo = pid_k * k_split
    k_hi = tl.minimum(K, k_lo + k_split)
    Kg = K // 16
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ga = k0 // 16 + g
        g_ok = ga < Kg
        ok = n_ok[:, None] & g_ok[None, :]
        w64 = tl.load(w_rows + ga[None, :], mask=ok, other=0)
        sc = tl.load(s_rows + ga[None, :], mask=ok, other=0).to(tl.int32)
        sbits = ((sc & 0x7F) << 7) | ((sc & 0x80) << 8)  # fp16 bits of the e4m3 value * 2^-8
        sf = sbits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
        xg = x_rows + (16 * ga)[:, None]
        xm = g_ok[:, None] & m_ok[None, :]
        if PRMT:
            s16 = sf.to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.int32)
            s2 = s16 | (s16 << 16)
            lo = tl.inline_asm_elementwise(_UNPACK8, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [w64.to(tl.int32), s2],
                                           dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
            hi = tl.inline_asm_elementwise(_UNPACK8, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [(w64 >> 32).to(tl.int32), s2],
                                           dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
            for i in tl.static_range(8):
                acc = tl.dot(lo[i], tl.load(xg + i, mask=xm, other=0.0), acc)
            for i in tl.static_range(8):
                acc = tl.dot(hi[i], tl.load(xg + 8 + i, mask=xm, other=0.0), acc)
        else:
            for i in tl.static_range(16):
                wi = (_e2m1_bits(((w64 >> (4 * i)) & 0xF).to(tl.int32)) * sf).to(tl.bfloat16)
                acc = tl.dot(wi, tl.load(xg + i, mask=xm, other=0.0), acc)
    acc = acc * alpha
    _store_out(acc, n, m, N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split)


@triton.jit
def gemv_w4a16_m1_kernel(x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, alpha, M, N, K, stride_xm, stride_wn, stride_sn,
                         stride_om, k_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         PRMT: tl.constexpr):
    """gemv_w4a16_kernel for M = 1 (BLOCK_M == 1) on CUDA cores: the same words, scales and decoders, the weights
    widened to fp32 and multiplied into an fp32 [BLOCK_N, G] accumulator (no MMA, whose M >= 16 would waste
    15/16 of it), summed over G at the end. Same ABI, grid and outputs as gemv_w4a16_kernel."""
    G: tl.constexpr = BLOCK_K // 16
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n_split = tl.num_programs(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    g = tl.arange(0, G)
    w_rows = w_ptr.to(tl.pointer_type(tl.int64)) + n.to(tl.int64)[:, None] * (stride_wn // 8)
    s_rows = s_ptr + n.to(tl.int64)[:, None] * stride_sn
    k_lo = pid_k * k_split
    k_hi = tl.minimum(K, k_lo + k_split)
    Kg = K // 16
    acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ga = k0 // 16 + g
        g_ok = ga < Kg
        ok = n_ok[:, None] & g_ok[None, :]
        w64 = tl.load(w_rows + ga[None, :], mask=ok, other=0)
        sc = tl.load(s_rows + ga[None, :], mask=ok, other=0).to(tl.int32)
        sbits = ((sc & 0x7F) << 7) | ((sc & 0x80) << 8)
        sf = sbits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
        xg = x_ptr + 16 * ga
        if PRMT:
            s16 = sf.to(tl.bfloat16).to(tl.uint16, bitcast=True).to(tl.int32)
            s2 = s16 | (s16 << 16)
            lo = tl.inline_asm_elementwise(_UNPACK8_F32, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [w64.to(tl.int32), s2],
                                           dtype=(tl.int32,) * 8, is_pure=True, pack=1)
            hi = tl.inline_asm_elementwise(_UNPACK8_F32, "=r,=r,=r,=r,=r,=r,=r,=r,r,r",
                                           [(w64 >> 32).to(tl.int32), s2], dtype=(tl.int32,) * 8, is_pure=True,
                                           pack=1)
            for i in tl.static_range(8):
                xi = tl.load(xg + i, mask=g_ok, other=0.0).to(tl.float32)
                acc += lo[i].to(tl.float32, bitcast=True) * xi[None, :]
            for i in tl.static_range(8):
                xi = tl.load(xg + 8 + i, mask=g_ok, other=0.0).to(tl.float32)
                acc += hi[i].to(tl.float32, bitcast=True) * xi[None, :]
        else:
            for i in tl.static_range(16):
                xi = tl.load(xg + i, mask=g_ok, other=0.0).to(tl.float32)
                acc += _e2m1_bits(((w64 >> (4 * i)) & 0xF).to(tl.int32)) * sf * xi[None, :]
    y = tl.sum(acc, axis=1) * alpha
    _store_out(y[:, None], n, tl.arange(0, 1), N, M, out_ptr, ws_ptr, stride_om, pid_k, n_split)


@triton.jit
def gemv_reduce_kernel(ws_ptr, out_ptr, M, N, stride_om, n_split, BLOCK: tl.constexpr):
    """y[m, n] = bf16(sum_{s = 0 .. n_split-1} ws[s, m, n]) in that order. ws [n_split, M, N] fp32 contiguous.
    Grid (cdiv(N, BLOCK), M)."""
    m = tl.program_id(1)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = n < N
    plane = M.to(tl.int64) * N
    p = ws_ptr + m.to(tl.int64) * N + n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(n_split):
        acc += tl.load(p + s * plane, mask=ok, other=0.0)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + n, acc.to(tl.bfloat16), mask=ok)
