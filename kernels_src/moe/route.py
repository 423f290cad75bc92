"""The MoE router: fp32 logits ``x @ gate_w^T``, softmax over the E experts, top-k, optional renormalisation
and the optional shared-expert fold (Qwen3.5/3.6 MoE, HF ``Qwen3_5MoeTopKRouter``).

Two launches (the logits are split over M tiles, E tiles and K ranges so that a decode step with M = 1
still spreads the 1 MB router weight over ~128 programs):

  router_logits_kernel  grid (cdiv(M, BM), cdiv(E, BE), n_split): program (i, j, s) writes the partial
                        logits of rows [i*BM, ...) and experts [j*BE, ...) over K range
                        [s*k_split, min((s+1)*k_split, H)) to ``part[s, m, e]`` (fp32, row length E + 1);
                        the programs with j == 0 also write column E: the partial of ``x . shared_gate_w``
                        (has_shared != 0), in a second K loop over the same range after the dot's loop.
                        bf16 operands, fp32 accumulation (tl.dot), exact products.
  router_topk_kernel    grid (M,): one row per program; the logits are the sum of the n_split <= NS partials
                        (all loaded at once as one [NS, EB] tile, reduced in a fixed order: deterministic);
                        p = softmax(logits) over [0, E) in fp32; the top_k picks are iterative argmaxes of p
                        (ties: the lower expert id, like a stable descending sort); their weights p_j, divided
                        by their sum when renorm != 0 (one 64-bit max-reduction per pick: the probability's
                        bits above the inverted id); with has_shared the pick ``k_out - 1 == top_k`` is expert
                        id E with weight sigmoid(x . shared_gate_w). Writes ids int32 / weights fp32 [M, k_out]
                        (row-major, contiguous). (It took BR = 2048 // EB rows and summed the partials in a
                        loop of dependent loads: 16 us at M = 1 on the H200 under ncu, 3.5x the logits launch.)

Pipelining: a tile loaded for the tl.dot has no other use inside the dot's loop. Triton 3.9's software
pipeliner gives a load used both by an asynchronous wgmma (sm_90a, the 128 x 128 tiles) and in registers one
buffer too few, so the prefetch of tile i + 2 overwrote the x tile the wgmma of tile i was still reading (wrong,
run-to-run different logits; upstream triton-lang/triton issue 6691, PR 7110); the shared-expert gate re-reads
x in a loop of its own. tests/test_moe_route_pipeline.py checks the sm_90a TTGIR for it.

Before the grid-dependency wait the programs of the first M tile ask L2 for their [BE, k_split] slice of the
router weight (weights only; the kernel before the router in a decode step, a norm, leaves HBM idle).

Bounds: x rows past M, experts past E and K past H are masked; the partials buffer holds
n_split * M * (E + 1) floats (the op checks it). A picked id is clamped to [0, E - 1] (NaN logits give an
unspecified id in that range).
"""
import triton
import triton.language as tl

from kernels_src.common import l2_prefetch_rows, pdl_enter, sigmoid_f32

@triton.jit
def router_logits_kernel(x_ptr, w_ptr, sg_ptr, part_ptr, M, E, H, stride_x, k_split, has_shared,
                         BM: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_e = tl.program_id(1)
    s = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    re = pid_e * BE + tl.arange(0, BE)
    rk = tl.arange(0, BK)
    mm = rm < M
    me = re < E
    k0 = s * k_split
    k1 = tl.minimum(k0 + k_split, H)
    xp = x_ptr + rm[:, None].to(tl.int64) * stride_x + rk[None, :]
    wp = w_ptr + re[:, None].to(tl.int64) * H + rk[None, :]
    if pid_m == 0:  # weights only before the wait: L2 gets this program's slice while the norm before it runs
        l2_prefetch_rows((w_ptr + re.to(tl.int64) * H + k0).to(tl.pointer_type(tl.uint8)), 2 * (k1 - k0), me, 2)
    pdl_enter(PDL)
    acc = tl.zeros((BM, BE), dtype=tl.float32)
    for k in range(k0, k1, BK):
        km = (k + rk) < k1
        xt = tl.load(xp + k, mask=mm[:, None] & km[None, :], other=0.0)
        wt = tl.load(wp + k, mask=me[:, None] & km[None, :], other=0.0)
        acc = tl.dot(xt, tl.trans(wt), acc)
    ld = E + 1
    base = part_ptr + s.to(tl.int64) * M * ld
    tl.store(base + rm[:, None].to(tl.int64) * ld + re[None, :], acc, mask=mm[:, None] & me[None, :])
    if (has_shared != 0) & (pid_e == 0):
        # a loop of its own: an x tile that feeds the dot must have no other use in the dot's loop (module
        # docstring, "Pipelining")
        sh = tl.zeros((BM,), dtype=tl.float32)
        for k in range(k0, k1, BK):
            km = (k + rk) < k1
            xs = tl.load(xp + k, mask=mm[:, None] & km[None, :], other=0.0).to(tl.float32)
            sg = tl.load(sg_ptr + k + rk, mask=km, other=0.0).to(tl.float32)
            sh += tl.sum(xs * sg[None, :], 1)
        tl.store(base + rm.to(tl.int64) * ld + E, sh, mask=mm)


@triton.jit
def router_topk_kernel(part_ptr, ids_ptr, wts_ptr, M, E, n_split, top_k, k_out, renorm, has_shared,
                       EB: tl.constexpr, KB: tl.constexpr, NS: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    ce = tl.arange(0, EB)
    emask = ce < E
    cs = tl.arange(0, NS)
    smask = cs < n_split
    ld = E + 1
    # every split's partial row in one [NS, EB] load (no chain of dependent loads), summed in a fixed order
    pp = part_ptr + row.to(tl.int64) * ld + cs[:, None].to(tl.int64) * (M.to(tl.int64) * ld)
    pdl_enter(PDL)
    logit = tl.sum(tl.load(pp + ce[None, :], mask=smask[:, None] & emask[None, :], other=0.0), 0)
    sh = tl.sum(tl.load(pp + E, mask=smask[:, None] & (has_shared != 0), other=0.0), 0)
    logit = tl.where(emask, logit, float("-inf"))
    p = tl.exp(logit - tl.max(logit, 0))
    p = p / tl.sum(p, 0)
    kk = tl.arange(0, KB)
    sel_w = tl.zeros((KB,), dtype=tl.float32)
    sel_i = tl.zeros((KB,), dtype=tl.int32)
    # one max-reduction per pick: key = bits(p) << 32 | (EB - 1 - e) orders by p (p >= 0: its bits order like
    # the value), then by the lower id; padding columns get -1 (below every real key)
    bits = p.to(tl.int32, bitcast=True).to(tl.int64)
    key = tl.where(emask, (bits << 32) | (EB - 1 - ce).to(tl.int64), -1)
    for j in range(0, top_k):
        best = tl.max(key, 0)
        idx = (EB - 1) - (best & 0xFFFFFFFF).to(tl.int32)
        idx = tl.minimum(tl.maximum(idx, 0), E - 1)
        pv = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        sel_w = tl.where(kk == j, pv, sel_w)
        sel_i = tl.where(kk == j, idx, sel_i)
        key = tl.where(key == best, -1, key)
    if renorm != 0:
        sel_w = sel_w / tl.sum(sel_w, 0)
    if has_shared != 0:
        sel_w = tl.where(kk == top_k, sigmoid_f32(sh), sel_w)
        sel_i = tl.where(kk == top_k, E, sel_i)
    om = (kk < k_out) & (row < M)
    optr = row.to(tl.int64) * k_out + kk
    tl.store(ids_ptr + optr, sel_i, mask=om)
    tl.store(wts_ptr + optr, sel_w, mask=om)
