"""Exploration (Triton JIT on the GPU, not the vendored kernels): the 35B-A3B decode step's per-layer kernels at
tiles the specs do not compile, to choose the next ones. Cases at M = 1 and 4 tokens (graph-replayed, ids /
inputs rotated over sets so the active experts' weights are not in L2; medians, µs per call):

  down     kernels_src.moe.decode.moe_decode_down_kernel at (BLOCK_N, BLOCK_K, SB, warps, maxnreg)
  gate_up  moe_decode_gate_up_kernel at (BLOCK_N, BLOCK_K, warps)
  split    down_split_kernel (below): the down projection split over the picks -- program (pair, row block)
           streams its expert's rows once, stores the weighted fp32 partial, and the token's last pick to take
           a ticket (atomic counter per (token, block)) sums the k' partials in order (tried, not shipped: no
           faster than the vendored kernel, BENCHMARKS.md session 15)
  m1       kernels_src.gemv.gemv.gemv_bf16_m1_kernel at (BLOCK_N, BLOCK_K, warps) on the 35B-A3B M = 1 linears
           (GDN out / o_proj 2048 x 4096, attention qkv 9216 x 2048, GDN in 12352 x 2048), weights rotated

Each row: {"case", "M", "tile", "us", "floor_us" (distinct bytes / 4.26 TB/s)}. Usage:
python benchmarks/explore_decode_tiles.py OUT.json [case,case]   (cases: down, split, gate_up, m1)
"""
from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_src.gemv.gemv import gemv_bf16_m1_kernel  # noqa: E402
from kernels_src.common import pdl_enter  # noqa: E402
from kernels_src.moe.decode import moe_decode_down_kernel, moe_decode_gate_up_kernel  # noqa: E402
import triton.language as tl  # noqa: E402
from timing import graph_ms  # noqa: E402

@triton.jit
def down_split_kernel(h_ptr, w_ptr, ids_ptr, wts_ptr, part_ptr, tick_ptr, out_ptr, E, N, K, k_out,
                                 stride_h, stride_we, stride_wn, stride_o, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """moe_decode_down_kernel split over the picks: program (f, nb) streams pair f's expert rows [nb * BLOCK_N,
    + BLOCK_N) (contiguous, BLOCK_N x K) once, stores w[f] * (h[f] . rows) to part[f, n] (fp32 [M * k_out,
    N]), then takes a ticket of (token, nb) (barrier, acq_rel atomic at GPU scope); the token's last pick to
    arrive sums part[t * k_out + j, n] over j = 0 .. k_out - 1 in that order (L2 reads, .cg), stores bf16 out
    and resets the counter (tick [M, cdiv(N, BLOCK_N)] int32, zeroed before the first launch). Grid (M *
    k_out, cdiv(N, BLOCK_N)). An id outside [0, E) reads no weight or h byte and stores a zero partial."""
    f = tl.program_id(0)
    nb = tl.program_id(1)
    pdl_enter(PDL)
    e = tl.load(ids_ptr + f)
    ok = (e >= 0) & (e < E)
    wt = tl.load(wts_ptr + f, mask=ok, other=0.0)
    e = tl.where(ok, e, 0).to(tl.int64)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    rk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + e * stride_we + n.to(tl.int64)[:, None] * stride_wn + rk[None, :]
    h_row = h_ptr + f.to(tl.int64) * stride_h + rk
    k_end = tl.where(ok, K, 0)
    w = tl.load(w_rows, mask=n_ok[:, None] & (rk < k_end)[None, :], other=0.0)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        hk = tl.load(h_row + k0, mask=(k0 + rk) < K, other=0.0).to(tl.float32)
        w_next = tl.load(w_rows + (k0 + BLOCK_K), mask=n_ok[:, None] & ((k0 + BLOCK_K + rk) < k_end)[None, :],
                         other=0.0)
        acc += tl.sum(w.to(tl.float32) * hk[None, :], axis=1)
        w = w_next
    part = tl.where(ok, wt * acc, 0.0)
    tl.store(part_ptr + f.to(tl.int64) * N + n, part, mask=n_ok)
    t = f // k_out
    tick = tick_ptr + t.to(tl.int64) * tl.num_programs(1) + nb
    tl.debug_barrier()  # every thread's partial is stored before the ticket is taken (release below)
    ticket = tl.atomic_add(tick, 1, sem="acq_rel", scope="gpu")
    if ticket == k_out - 1:  # the token's other picks have published their partials for this block
        base = part_ptr + (t * k_out).to(tl.int64) * N + n
        tot = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for j in range(0, k_out):
            tot += tl.load(base + j * N, mask=n_ok, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + t.to(tl.int64) * stride_o + n, tot.to(tl.bfloat16), mask=n_ok)
        tl.atomic_xchg(tick, 0, sem="relaxed", scope="gpu")  # ready for the next launch


E, EP, TOPK, H, I = 256, 257, 8, 2048, 512
KOUT = TOPK + 1
BW = 4.26e12
DOWN = [(4, 64, 16, 4, 128), (2, 128, 16, 4, 128), (4, 128, 16, 8, 128), (1, 512, 16, 4, 0), (2, 512, 16, 8, 0),
        (1, 512, 16, 8, 0), (2, 256, 16, 4, 0), (1, 256, 16, 4, 0), (4, 256, 16, 8, 0), (2, 512, 16, 4, 0),
        (8, 64, 16, 8, 0), (1, 128, 16, 2, 0), (1, 512, 16, 2, 0)]
SPLIT = [(8, 256, 4), (8, 512, 4), (4, 512, 4), (16, 256, 4), (16, 512, 8), (8, 128, 2), (32, 256, 8)]
GATE_UP = [(8, 256, 4), (8, 512, 4), (4, 512, 4), (4, 256, 4), (16, 256, 8), (4, 1024, 8), (2, 1024, 4),
           (8, 1024, 8), (2, 2048, 8), (4, 2048, 8)]
M1 = [(4, 1024, 8), (8, 512, 4), (8, 512, 8), (4, 512, 4), (2, 2048, 8), (8, 1024, 8), (16, 512, 8), (2, 1024, 4),
      (4, 2048, 8), (16, 256, 4)]
M1_SHAPES = [(2048, 4096), (9216, 2048), (12352, 2048)]


def _routes(M, n_sets, g):
    out = []
    for _ in range(n_sets):
        ids = torch.stack([torch.randperm(E, generator=g, device="cpu")[:TOPK] for _ in range(M)])
        ids = torch.cat([ids, torch.full((M, 1), E)], 1).to(torch.int32).cuda().contiguous()
        w = torch.rand(M, KOUT, generator=g).cuda().contiguous()
        out.append((ids, w))
    return out


def explore_moe(rows, M, which):
    g = torch.Generator().manual_seed(M)
    w1 = torch.randn(EP, 2 * I, H, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(EP, H, I, device="cuda", dtype=torch.bfloat16) * 0.02
    n_sets = 16
    routes = _routes(M, n_sets, g)
    xs = [torch.randn(M, H, device="cuda", dtype=torch.bfloat16) for _ in range(n_sets)]
    hs = [torch.randn(M * KOUT, I, device="cuda", dtype=torch.bfloat16) for _ in range(n_sets)]
    out = torch.empty(M, H, device="cuda", dtype=torch.bfloat16)
    h = torch.empty(M * KOUT, I, device="cuda", dtype=torch.bfloat16)
    distinct = sum(len(set(r[0].flatten().tolist())) for r in routes) / n_sets
    if "down" in which:
        ref = None
        for bn, bk, sb, warps, maxnreg in DOWN:
            def fn(i, s, bn=bn, bk=bk, sb=sb, warps=warps, maxnreg=maxnreg):
                ids, wt = routes[i]
                kw = {"maxnreg": maxnreg} if maxnreg else {}
                moe_decode_down_kernel[(M, triton.cdiv(H, bn))](
                    hs[i], w2, ids, wt, out, EP, H, I, KOUT, I, H * I, I, H, BLOCK_N=bn, BLOCK_K=bk, SB=sb,
                    PDL=False, num_warps=warps, num_stages=1, **kw)
            try:
                fn(0, None)
                torch.cuda.synchronize()
                if ref is None:
                    ref = out.clone()
                err = float((out.float() - ref.float()).abs().max())
                us = graph_ms(fn, vkc=False, n_sets=n_sets, inner=16, reps=15) * 1e3
                rows.append({"case": "down", "M": M, "tile": [bn, bk, sb, warps, maxnreg], "us": us,
                             "floor_us": distinct * H * I * 2 / BW * 1e6, "max_abs_vs_first": err})
            except Exception as e:  # noqa: BLE001 - a tile that does not compile is a result too
                rows.append({"case": "down", "M": M, "tile": [bn, bk, sb, warps, maxnreg], "error": str(e)[:300]})
            print(rows[-1], flush=True)
    if "split" in which:
        part = torch.empty(M * KOUT, H, device="cuda", dtype=torch.float32)
        for bn, bk, warps in SPLIT:
            tick = torch.zeros(M, triton.cdiv(H, bn), device="cuda", dtype=torch.int32)

            def fn(i, s, bn=bn, bk=bk, warps=warps, tick=tick):
                ids, wt = routes[i]
                down_split_kernel[(M * KOUT, triton.cdiv(H, bn))](
                    hs[i], w2, ids, wt, part, tick, out, EP, H, I, KOUT, I, H * I, I, H, BLOCK_N=bn, BLOCK_K=bk,
                    PDL=False, num_warps=warps, num_stages=1)
            try:
                moe_decode_down_kernel[(M, triton.cdiv(H, 4))](hs[0], w2, routes[0][0], routes[0][1], out, EP, H, I,
                                                               KOUT, I, H * I, I, H, BLOCK_N=4, BLOCK_K=64, SB=16,
                                                               PDL=False, num_warps=4, num_stages=1)
                ref = out.clone()
                fn(0, None)
                torch.cuda.synchronize()
                err = float((out.float() - ref.float()).abs().max())
                us = graph_ms(fn, vkc=False, n_sets=n_sets, inner=16, reps=15) * 1e3
                rows.append({"case": "down_split", "M": M, "tile": [bn, bk, warps], "us": us,
                             "floor_us": distinct * H * I * 2 / BW * 1e6, "max_abs_vs_down": err,
                             "ticks_zero": int(tick.abs().sum()) == 0})
            except Exception as e:  # noqa: BLE001
                rows.append({"case": "down_split", "M": M, "tile": [bn, bk, warps], "error": str(e)[:300]})
            print(rows[-1], flush=True)
    if "gate_up" in which:
        for bn, bk, warps in GATE_UP:
            def fn(i, s, bn=bn, bk=bk, warps=warps):
                ids, _ = routes[i]
                moe_decode_gate_up_kernel[(M * KOUT, triton.cdiv(I, bn))](
                    xs[i], w1, ids, h, M * KOUT, EP, I, H, KOUT, H, 2 * I * H, H, I, BLOCK_N=bn, BLOCK_K=bk,
                    PDL=False, num_warps=warps, num_stages=1)
            try:
                us = graph_ms(fn, vkc=False, n_sets=n_sets, inner=16, reps=15) * 1e3
                rows.append({"case": "gate_up", "M": M, "tile": [bn, bk, warps], "us": us,
                             "floor_us": distinct * 2 * I * H * 2 / BW * 1e6})
            except Exception as e:  # noqa: BLE001
                rows.append({"case": "gate_up", "M": M, "tile": [bn, bk, warps], "error": str(e)[:300]})
            print(rows[-1], flush=True)


def explore_m1(rows):
    for N, K in M1_SHAPES:
        n_sets = max(2, -(-60 * 2**20 * 3 // (N * K * 2)))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(n_sets)]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
        for bn, bk, warps in M1:
            def fn(i, s, bn=bn, bk=bk, warps=warps):
                gemv_bf16_m1_kernel[(triton.cdiv(N, bn), 1)](x, ws[i], y, y, 1, N, K, K, K, N, K, BLOCK_M=1,
                                                              BLOCK_N=bn, BLOCK_K=bk, PDL=False,
                                                              num_warps=warps, num_stages=1)
            try:
                us = graph_ms(fn, vkc=False, n_sets=n_sets, inner=16, reps=15) * 1e3
                rows.append({"case": "m1", "M": 1, "N": N, "K": K, "tile": [bn, bk, warps], "us": us,
                             "floor_us": N * K * 2 / BW * 1e6})
            except Exception as e:  # noqa: BLE001
                rows.append({"case": "m1", "N": N, "K": K, "tile": [bn, bk, warps], "error": str(e)[:300]})
            print(rows[-1], flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    which = argv[1].split(",") if len(argv) > 1 else ["down", "split", "gate_up", "m1"]
    rows = []
    try:
        for M in (1, 2, 4):
            explore_moe(rows, M, which)
        if "m1" in which:
            explore_m1(rows)
    finally:
        with open(argv[0], "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
