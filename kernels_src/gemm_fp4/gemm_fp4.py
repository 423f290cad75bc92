"""NVFP4 W4A4 GEMM and the bf16 -> NVFP4 activation quantizer (Triton).

Operands, both K-major in the linear NVFP4 layout (ops.gemv's W4A16 layout, tests/refs_nvfp4.py):
  a   [M, K/2] uint8: e2m1 codes, k = 2j in the LOW nibble of byte j, k = 2j + 1 in the high one;
  sa  [M, K/16] float8 e4m3: sa[m, g] scales k in [16 g, 16 g + 16);
  w, sw  [N, K/2] / [N, K/16] likewise (HF's [N, K] weight rows: compressed-tensors' weight_packed /
      weight_scale, ModelOpt's weight / weight_scale);
  alpha  one float32 on the device: the product of the two global multipliers (e.g. 1 / (input_global_scale *
      weight_global_scale) for compressed-tensors), so a graph replays with whatever it holds then.

  gemm_w4a4_kernel   out[m, n] = bf16(alpha * sum_k e2m1(a[m, k]) sa[m, k // 16] e2m1(w[n, k]) sw[n, k // 16])

Each BLOCK_K slice is one ``tl.dot_scaled`` of e2m1 operands with e4m3 scales per 16 (fp32 accumulation). Triton
lowers it to the NVFP4 block-scaled tensor-core MMA where the hardware has one -- ``tcgen05.mma
kind::mxf4nvf4.block_scale.block16`` on sm_100a, ``mma.sync m16n8k64 kind::mxf4nvf4.block_scale.scale_vec::4X``
on sm_120a / sm_121a -- and emulates it elsewhere: operands times their scales upcast to bf16 (exact: an e2m1
value times an e4m3 scale has at most 5 significant bits and stays in bf16's range), then the bf16 MMA. The
sm_90a build is that emulation: the same source runs on Hopper so that its indexing, masks and scale handling are
checked on a GPU (vkc has no Blackwell device; the native lowerings are build-verified).

Grid: one program per output tile, grouped rasterization (GROUP_M tile rows). Rows of a past M and of w past N are
read from row ``m % M`` (``n % N``): in bounds, never stored; K is masked per slice (the host promises K % 32 ==
0, so every packed row is a whole number of 16-byte pieces), masked codes and scales read as 0. Stores are masked
to [M, N]. Offsets are int64.

Quantizer (bf16 x [M, K] -> a, sa), per group of 16 along K, with the activation's global scale gs (a divisor:
x ~ e2m1 * sa / gs, compressed-tensors' input_global_scale, 1 / input_scale for ModelOpt) read from the device:

  quant_nvfp4_kernel   sa = e4m3(satfinite(rn(rn(amax(|x_g|) / 6) * gs)));  r = rn(gs / sa) (0 where sa == 0);
                       code = e2m1 nearest-even of x * r, saturated at +-6
                       grid (cdiv(M, ROWS), cdiv(K / 16, GROUPS)): ROWS rows x GROUPS groups a program

The e2m1 rounding is spelled as comparisons with the midpoints of the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} (ties to
the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), what ``cvt.rn.satfinite
.e2m1x2.f32`` computes; NaN inputs give unspecified codes (still in bounds).
"""
import triton
import triton.language as tl

from kernels_src.gemm_fp8.gemm_fp8 import _tile  # grouped rasterization, shared with the FP8 GEMMs


@triton.jit
def gemm_w4a4_kernel(a_ptr, sa_ptr, w_ptr, sw_ptr, alpha_ptr, out_ptr, M, N, K, stride_am, stride_sam,
                     stride_wn, stride_swn, stride_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """a [M, K/2] uint8 (row stride stride_am bytes), sa [M, K/16] e4m3 (stride_sam), w [N, K/2] (stride_wn), sw
    [N, K/16] (stride_swn), alpha fp32 [1] -> out [M, N] bf16 (stride_om). Grid (cdiv(M, BLOCK_M) * cdiv(N,
    BLOCK_N),)."""
    PK: tl.constexpr = BLOCK_K // 2    # packed bytes per row of a slice
    SK: tl.constexpr = BLOCK_K // 16   # scales per row of a slice
    pid_m, pid_n = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = (m % M).to(tl.int64)
    rn = (n % N).to(tl.int64)
    kp = tl.arange(0, PK)
    ks = tl.arange(0, SK)
    a_ptrs = a_ptr + rm[:, None] * stride_am + kp[None, :]
    w_ptrs = w_ptr + rn[:, None] * stride_wn + kp[None, :]
    sa_ptrs = sa_ptr + rm[:, None] * stride_sam + ks[None, :]
    sw_ptrs = sw_ptr + rn[:, None] * stride_swn + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        left = K - kt * BLOCK_K
        pmask = kp[None, :] < left // 2
        smask = ks[None, :] < left // 16
        a = tl.load(a_ptrs, mask=pmask, other=0)
        w = tl.load(w_ptrs, mask=pmask, other=0)
        sa = tl.load(sa_ptrs, mask=smask, other=0.0)
        sw = tl.load(sw_ptrs, mask=smask, other=0.0)
        acc = tl.dot_scaled(a, sa, "e2m1", tl.trans(w), sw, "e2m1", acc)
        a_ptrs += PK
        w_ptrs += PK
        sa_ptrs += SK
        sw_ptrs += SK
    acc = acc * tl.load(alpha_ptr)
    mask = (m < M)[:, None] & (n < N)[None, :]
    tl.store(out_ptr + m.to(tl.int64)[:, None] * stride_om + n[None, :], acc.to(tl.bfloat16), mask=mask)


@triton.jit
def e2m1_code(v):
    """fp32 -> e2m1 code 0..15 (bit 3 the sign), nearest even, saturated at +-6 (module docstring)."""
    a = tl.abs(v)
    c = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32) + \
        (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32)
    return tl.where((v < 0) & (c > 0), c + 8, c)


@triton.jit
def quant_nvfp4_kernel(x_ptr, gs_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_qm, stride_sm,
                       ROWS: tl.constexpr, GROUPS: tl.constexpr):
    """x [M, K] bf16 (row stride stride_xm), gs fp32 [1] -> q [M, K/2] uint8 (stride_qm bytes), s [M, K/16] e4m3
    (stride_sm). Grid (cdiv(M, ROWS), cdiv(K // 16, GROUPS))."""
    C: tl.constexpr = GROUPS * 16
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    c = tl.program_id(1) * C + tl.arange(0, C)
    rmask = r < M
    r64 = r.to(tl.int64)
    x = tl.load(x_ptr + r64[:, None] * stride_xm + c[None, :], mask=rmask[:, None] & (c < K)[None, :],
                other=0.0).to(tl.float32)
    gs = tl.load(gs_ptr)
    xg = tl.reshape(x, (ROWS, GROUPS, 16))
    amax = tl.max(tl.abs(xg), axis=2)
    sf = (tl.math.div_rn(amax, 6.0) * gs).to(tl.float8e4nv)  # rn, satfinite at 448
    sfd = sf.to(tl.float32)
    rcp = tl.where(sfd > 0, tl.math.div_rn(gs, tl.where(sfd > 0, sfd, 1.0)), 0.0)
    code = e2m1_code(xg * rcp[:, :, None])
    lo, hi = tl.split(tl.reshape(code, (ROWS, C // 2, 2)))
    byte = (lo | (hi << 4)).to(tl.uint8)
    p = tl.program_id(1) * (C // 2) + tl.arange(0, C // 2)
    tl.store(q_ptr + r64[:, None] * stride_qm + p[None, :], byte, mask=rmask[:, None] & (p < K // 2)[None, :])
    tl.store(s_ptr + r64[:, None] * stride_sm + g[None, :], sf, mask=rmask[:, None] & (g < K // 16)[None, :])
