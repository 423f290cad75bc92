"""The MoE block's small-M (decode) expert kernels: no grouping by expert, no MMA tiles padded to 16 rows.
Each (token, pick) pair f = t * k' + j reads its expert id from ``topk_ids`` on the device and streams that
expert's weight rows once; the products are CUDA-core dot products (tl.sum of x * W tiles, fp32), which is
all a handful of tokens needs: the time is the weight bytes, read with 16-byte loads along K.

  moe_decode_gate_up_kernel  grid (P, cdiv(N, BLOCK_N)), P = M * k', N = I:
        h[f, n] = bf16(silu(g) * u),  g = x[t] . w1[e, n, :],  u = x[t] . w1[e, N + n, :]   (fp32 sums)
        silu(g) = g / (1 + exp(-g)) in fp32, then * u, then one bf16 rounding: the grouped GEMM's epilogue
        (grouped.py) on the same fp32 values, so both paths give h within fp32 summation-order noise.
        Axis 0 is the pair, so the programs of one n-block of all pairs run side by side: at M > 1 pairs on
        the same expert (the shared expert: every token) read that block's rows from L2 rather than HBM.
        Small BLOCK_N (8 or 16 rows of gate and as many of up) keeps many programs even at M = 1 (9 pairs x
        I / 8 = 576 at I = 512); the next K step's BLOCK_N x BLOCK_K tile of each half is loaded before the
        current step's products are reduced, so two steps are in flight per program.
  moe_decode_down_kernel     grid (M, cdiv(H, BLOCK_N)):
        out[t, n] = bf16( sum_{j < k'} w[t, j] * (h[t k' + j] . w2[e_j, n, :]) )
        All k' <= SB (+ SBX) slots are one [SB, BLOCK_N, BLOCK_K] tile (or two: slots [SB, SB + SBX) apart,
        so that 9 picks, 8 routed + the shared expert, take 8 + 1 lanes instead of 9 of 16): one round of id
        loads, then every expert's rows of a K step in flight at once, the next step's tile loaded before the
        current one is reduced (at M = 1 the grid is only cdiv(H, BLOCK_N) programs, and per-program memory
        parallelism is what keeps HBM busy; taking the slots a group at a time made each group a dependent id
        -> weight round). Small BLOCK_N (2 to 8 rows, the spec's tiles) gives 1024 to 256 programs at
        H = 2048, so even M = 1 fills a 132-SM GPU; splitting over slots with fp32 partials and a second reduce
        launch would add a launch and a buffer for the same bytes. Per slot the dot products are summed over K
        (fp32), weighted, then summed over the slots. No atomics: the same inputs give the same bits (a fixed
        reduction tree per compiled kernel), eager or replayed in a graph.

Device-side ids (nothing read from device memory moves an access outside the given tensors):
  - gate_up: a pair whose id e is outside [0, E) runs no K iteration (reads no weight and no x) and writes
    zeros to its h row; e is replaced by 0 before any address is formed;
  - down: a slot whose id is outside [0, E) contributes nothing: its weight rows, its h row and its routing
    weight are not read (masked loads), and its term is 0 even if the weight would be NaN;
  - ids / weights are read only at f < P = M * k' (the grid and the slot masks), h rows only at f < P.
Tails: N (gate_up: rows n < N of the gate and up halves) and H (down) are masked, K against K; the host
promises K % 16 == 0, 16-byte aligned pointers and row strides % 16 elements (div=16 hints), which keeps the
masked loads vectorized. Offsets into x, w1, w2, h and out are computed in int64.
"""
import triton
import triton.language as tl

from kernels_src.common import pdl_enter


@triton.jit
def moe_decode_gate_up_kernel(x_ptr, w_ptr, ids_ptr, h_ptr, P, E, N, K, k_out, stride_x, stride_we, stride_wn,
                              stride_h, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """x [M, K] bf16 (row stride stride_x), w1 [E, 2N, K] bf16 (strides stride_we, stride_wn, 1), ids int32
    [P] (flat [M, k_out]), h [P, N] bf16 (row stride stride_h). Grid (P, cdiv(N, BLOCK_N))."""
    f = tl.program_id(0)
    pid_n = tl.program_id(1)
    pdl_enter(PDL)  # the ids are the router's output: nothing to prefetch before them
    e = tl.load(ids_ptr + f)
    ok = (e >= 0) & (e < E)
    e = tl.where(ok, e, 0).to(tl.int64)
    t = (f // k_out).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rk = tl.arange(0, BLOCK_K)
    w_e = w_ptr + e * stride_we
    wg_rows = w_e + n.to(tl.int64)[:, None] * stride_wn + rk[None, :]         # gate rows n
    wu_rows = w_e + (n + N).to(tl.int64)[:, None] * stride_wn + rk[None, :]   # up rows N + n
    x_row = x_ptr + t * stride_x + rk
    k_end = tl.where(ok, K, 0)  # an invalid id runs no iteration and reads no weight or x byte
    # the weight tiles of step k0 + BLOCK_K are loaded before step k0's products are reduced (registers; past
    # k_end fully masked, no access)
    wmask = n_ok[:, None] & (rk < k_end)[None, :]
    wg = tl.load(wg_rows, mask=wmask, other=0.0)
    wu = tl.load(wu_rows, mask=wmask, other=0.0)
    acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        xk = tl.load(x_row + k0, mask=(k0 + rk) < K, other=0.0).to(tl.float32)
        nmask = n_ok[:, None] & ((k0 + BLOCK_K + rk) < k_end)[None, :]
        wg_next = tl.load(wg_rows + (k0 + BLOCK_K), mask=nmask, other=0.0)
        wu_next = tl.load(wu_rows + (k0 + BLOCK_K), mask=nmask, other=0.0)
        acc_g += tl.sum(wg.to(tl.float32) * xk[None, :], axis=1)
        acc_u += tl.sum(wu.to(tl.float32) * xk[None, :], axis=1)
        wg = wg_next
        wu = wu_next
    hv = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u  # 0 for an invalid id (no iteration ran)
    tl.store(h_ptr + f.to(tl.int64) * stride_h + n, hv.to(tl.bfloat16), mask=n_ok)


@triton.jit
def _down_slots(ids_ptr, wts_ptr, w_ptr, h_ptr, t, s, k_out, E, n, n_ok, rk, stride_h, stride_we, stride_wn):
    """Slots s of token t's picks: (valid, routing weight, weight rows [S, BN, BK], h rows [S, BK], weight
    mask [S, BN, 1])."""
    f = t.to(tl.int64) * k_out + s                                           # [S] flat pair indices
    e = tl.load(ids_ptr + f, mask=s < k_out, other=-1)
    ok = (s < k_out) & (e >= 0) & (e < E)
    wt = tl.load(wts_ptr + f, mask=ok, other=0.0)
    e = tl.where(ok, e, 0).to(tl.int64)
    w_rows = w_ptr + e[:, None, None] * stride_we + n.to(tl.int64)[None, :, None] * stride_wn + rk[None, None, :]
    h_rows = h_ptr + tl.where(ok, f, 0)[:, None] * stride_h + rk[None, :]
    return ok, wt, w_rows, h_rows, ok[:, None, None] & n_ok[None, :, None]


@triton.jit
def _down_step(part, w, w_rows, h_rows, ok, wm, rk, k0, K, BLOCK_K: tl.constexpr):
    """One K step of a slot group: the next step's tile loaded (past K: fully masked, no access), then this
    step's products reduced into part [S, BN]."""
    hk = tl.load(h_rows + k0, mask=ok[:, None] & ((k0 + rk) < K)[None, :], other=0.0).to(tl.float32)
    w_next = tl.load(w_rows + (k0 + BLOCK_K), mask=wm & ((k0 + BLOCK_K + rk) < K)[None, None, :], other=0.0)
    part += tl.sum(w.to(tl.float32) * hk[:, None, :], axis=2)
    return part, w_next


@triton.jit
def moe_decode_down_kernel(h_ptr, w_ptr, ids_ptr, wts_ptr, out_ptr, E, N, K, k_out, stride_h, stride_we,
                           stride_wn, stride_o, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SB: tl.constexpr,
                           SBX: tl.constexpr, PDL: tl.constexpr):
    """h [P, K] bf16 (row stride stride_h), w2 [E, N, K] bf16 (strides stride_we, stride_wn, 1), ids int32 /
    weights fp32 [M, k_out] contiguous (k_out <= SB + SBX), out [M, N] bf16 (row stride stride_o). Slots [0, SB)
    are one tile, slots [SB, SB + SBX) a second one (SBX 0: none), loaded in the same K steps. Grid (M,
    cdiv(N, BLOCK_N))."""
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rk = tl.arange(0, BLOCK_K)
    pdl_enter(PDL)
    ok, wt, w_rows, h_rows, wm = _down_slots(ids_ptr, wts_ptr, w_ptr, h_ptr, t, tl.arange(0, SB), k_out, E, n,
                                             n_ok, rk, stride_h, stride_we, stride_wn)
    w = tl.load(w_rows, mask=wm & (rk < K)[None, None, :], other=0.0)
    part = tl.zeros((SB, BLOCK_N), dtype=tl.float32)
    if SBX > 0:
        ok2, wt2, w_rows2, h_rows2, wm2 = _down_slots(ids_ptr, wts_ptr, w_ptr, h_ptr, t, SB + tl.arange(0, SBX),
                                                      k_out, E, n, n_ok, rk, stride_h, stride_we, stride_wn)
        w2 = tl.load(w_rows2, mask=wm2 & (rk < K)[None, None, :], other=0.0)
        part2 = tl.zeros((SBX, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        part, w = _down_step(part, w, w_rows, h_rows, ok, wm, rk, k0, K, BLOCK_K)
        if SBX > 0:
            part2, w2 = _down_step(part2, w2, w_rows2, h_rows2, ok2, wm2, rk, k0, K, BLOCK_K)
    acc = tl.sum(tl.where(ok[:, None], wt[:, None] * part, 0.0), axis=0)
    if SBX > 0:
        acc += tl.sum(tl.where(ok2[:, None], wt2[:, None] * part2, 0.0), axis=0)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + n, acc.to(tl.bfloat16), mask=n_ok)
