"""Exploration (JIT, H200): the 35B-A3B decode step's bandwidth kernels at M = 1 -- which tile, warps, stages
and split reach the HBM floor for 8-50 MB weights, where the vendored choices (made without a device) sit at
38-70% (bf16 gemv) and 48-78% (MoE decode gate_up / down).

Parts (argv[1], default all):
  gemv   the MMA kernel (kernels_src/gemv/gemv.py gemv_bf16_kernel, BLOCK_M 16) over tiles x warps x stages,
         and the CUDA-core M = 1 kernel (gemv_bf16_m1_kernel: a [BN, BK] fp32 product accumulated over K, one
         reduction at the end; first written here, vendored after this sweep) over the same grid, on the
         35B-A3B projections (GDN in 12352 x 2048, GDN out 2048 x 4096, attention qkv 9216 x 2048,
         attention out 2048 x 4096) and cuBLAS (torch.matmul) as the reference point;
  w8     block-wise FP8 weights (W8A16, 128 x 128 fp32 scales) at M = 1: the MMA kernel (gemv_w8a16_kernel,
         BLOCK_M 16) and the CUDA-core kernel (gemv_w8a16_m1_kernel, vendored after this sweep: the e4m3 bytes
         decoded with integer ops, or NATIVE with the hardware's fp8 conversion (sm_89+), times x * scale
         computed once per column) on the 27B and 35B-A3B projections, cuBLAS bf16 on the dequantized weights
         and cuBLAS FP8 (torch._scaled_mm, per-tensor, x already fp8 and padded to 16 rows) as reference points;
  moe    kernels_src/moe/decode.py's gate_up / down kernels over BLOCK_N x BLOCK_K (x SB) x warps x stages at
         M = 1 with 8 routed experts + the shared one (E' = 257, I = 512, H = 2048).
Split-K is not swept here: its reduce kernel cannot run under Triton's JIT at M = 1 (M == 1 is specialized to
a constant; the AOT build does not do that), so bench_gemv.py times the splits through the op. Every row: the
graph-replayed median per call (10 calls per graph, so back-to-back launches as in a decode
step's graph), weights rotated over copies that together exceed 2.5x L2, the % of the floor (compulsory bytes
at 4.26 TB/s: the weights, x, y), and the relative error vs float64. One JSON line per case.
Run on the device: ``python3 benchmarks/explore_decode.py [gemv|w8|moe]`` (PYTHONPATH with the repository).
"""
import itertools
import json
import os
import sys

import torch
import triton

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_src.gemv.gemv import (gemv_bf16_kernel, gemv_bf16_m1_kernel, gemv_w8a16_kernel,  # noqa: E402
                                   gemv_w8a16_m1_kernel)
from timing import graph_ms  # noqa: E402
from kernels_src.moe.decode import moe_decode_down_kernel, moe_decode_gate_up_kernel  # noqa: E402

TBS = 4.26e12


def time_graph(fn):
    """Median us per call of ``fn()`` (no arguments: it rotates its own inputs), 10 calls per captured graph."""
    return graph_ms(lambda i, st: fn(), vkc=False, inner=10, reps=30) * 1e3


def emit(**kw):
    print(json.dumps(kw), flush=True)


def sweep_row(part, run, it, out, want, floor, **key):
    """One row of a GEMV sweep: the rotation counter reset and ``out`` poisoned, one call checked against the
    float64 ``want``, then the graph timing; an exception becomes the row's error."""
    try:
        it[0] = 0
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        err = rel(out[:1], want)
        us = time_graph(run)
    except Exception as e:  # noqa: BLE001
        emit(part=part, **key, error=str(e)[:200])
        return
    emit(part=part, **key, us=round(us, 2), pct_floor=round(100 * floor / us, 1), rel_err=err)


def rel(a, b):
    return ((a.double() - b).abs().max() / b.abs().max()).item()


def gemv_part():
    shapes = {"gdn_in": (12352, 2048), "gdn_out": (2048, 4096), "attn_qkv": (9216, 2048), "attn_o": (2048, 4096)}
    for proj, (N, K) in shapes.items():
        nrot = max(2, int(2.5 * 60e6 // (N * K * 2)) + 1)
        ws_ = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 32 for _ in range(nrot)]
        x = torch.randn(16, K, device="cuda", dtype=torch.bfloat16)
        x1 = x[:1]
        want = x1.double() @ ws_[0].double().T
        floor = (N * K * 2 + K * 2 + N * 2) / TBS * 1e6
        y = torch.empty(16, N, device="cuda", dtype=torch.bfloat16)
        wsp = torch.empty(16 * 16 * N, device="cuda", dtype=torch.float32)
        it = [0]

        def cublas():
            it[0] += 1
            torch.matmul(x1, ws_[it[0] % nrot].T, out=y[:1])
        emit(part="gemv", proj=proj, N=N, K=K, kernel="cublas", us=round(time_graph(cublas), 2),
             floor_us=round(floor, 2))
        cands = [("mma", bn, bk, w, 3) for bn, bk, w in itertools.product((16, 32, 64, 128), (128, 256), (4, 8))
                 if not (bn == 128 and bk == 256)]
        cands += [("mma", bn, bk, 4, st) for bn, bk in ((32, 128), (64, 128), (16, 256), (32, 256)) for st in (2, 4)]
        cands += [("cc", bn, bk, w, st) for bn, bk, w, st in itertools.product(
            (2, 4, 8, 16), (256, 512, 1024), (4, 8), (1, 3)) if bn * bk <= 8192]
        for kind, bn, bk, w, st in cands:
            ctas = triton.cdiv(N, bn)
            for split in (1,):  # split-K: the module doc
                ks = triton.cdiv(triton.cdiv(K, split), bk) * bk
                if triton.cdiv(K, ks) != split:
                    continue

                def run():
                    i = it[0] % nrot
                    it[0] += 1
                    if kind == "mma":
                        gemv_bf16_kernel[(ctas, split)](x1, ws_[i], y, wsp, 1, N, K, x1.stride(0), K, y.stride(0),
                                                        ks, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, PDL=False, num_warps=w,
                                                        num_stages=st)
                    else:
                        gemv_bf16_m1_kernel[(ctas, split)](x1, ws_[i], y, wsp, 1, N, K, 0, K, y.stride(0), ks,
                                                           BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, PDL=False, num_warps=w,
                                                           num_stages=st)
                sweep_row("gemv", run, it, y, want, floor, proj=proj, N=N, K=K, kernel=kind, bn=bn, bk=bk, warps=w,
                          stages=st, split=split)
        del ws_
        torch.cuda.empty_cache()


def w8_part():
    shapes = {"27B.gdn_in": (16480, 5120), "27B.gdn_out": (5120, 6144), "27B.attn_qkv": (14336, 5120),
              "27B.mlp_gate_up": (34816, 5120), "27B.mlp_down": (5120, 17408), "35B.gdn_in": (12352, 2048),
              "35B.gdn_out": (2048, 4096)}
    for proj, (N, K) in shapes.items():
        nrot = max(2, int(2.5 * 60e6 // (N * K)) + 1)
        ws_ = [torch.randint(0, 256, (N, K), device="cuda", dtype=torch.uint8) for _ in range(nrot)]
        for w in ws_:  # no NaN codes (0x7F / 0xFF): the reference decodes them as NaN
            w[(w & 0x7F) == 0x7F] = 0x3F
        scs = [torch.rand(triton.cdiv(N, 128), triton.cdiv(K, 128), device="cuda") * 0.01 + 1e-3 for _ in ws_]
        x = torch.randn(16, K, device="cuda", dtype=torch.bfloat16)
        x1 = x[:1]
        wd = ws_[0].view(torch.float8_e4m3fn).double() * scs[0].double().repeat_interleave(128, 0)[:N]\
            .repeat_interleave(128, 1)[:, :K]
        want = x1.double() @ wd.T
        floor = (N * K + K * 2 + N * 2 + scs[0].numel() * 4) / TBS * 1e6
        y = torch.empty(16, N, device="cuda", dtype=torch.bfloat16)
        it = [0]
        wb = [wd.to(torch.bfloat16)]
        wb += [wb[0].clone() for _ in range(max(2, int(2.5 * 60e6 // (N * K * 2)) + 1) - 1)]
        del wd

        def cublas():
            it[0] += 1
            torch.matmul(x1, wb[it[0] % len(wb)].T, out=y[:1])
        emit(part="w8", proj=proj, N=N, K=K, kernel="cublas.bf16", us=round(time_graph(cublas), 2),
             floor_us=round(floor, 2))
        del wb
        one = torch.ones((), device="cuda")
        x8 = torch.zeros(16, K, device="cuda", dtype=torch.float8_e4m3fn)
        wf = [w.view(torch.float8_e4m3fn) for w in ws_]

        def scaled():
            it[0] += 1
            torch._scaled_mm(x8, wf[it[0] % nrot].T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        emit(part="w8", proj=proj, N=N, K=K, kernel="cublas.fp8", us=round(time_graph(scaled), 2),
             floor_us=round(floor, 2))
        cands = [("mma", 64, 128, 4, False), ("mma", 16, 128, 4, False)]
        cands += [("cc", bn, bk, w, nat) for bn, bk, w in ((8, 512, 4), (16, 512, 4), (4, 1024, 4), (8, 1024, 8),
                                                          (16, 1024, 8), (16, 256, 4), (32, 256, 4), (32, 512, 8))
                  for nat in (False, True)]
        for kind, bn, bk, w, nat in cands:
            def run():
                i = it[0] % nrot
                it[0] += 1
                if kind == "mma":
                    gemv_w8a16_kernel[(triton.cdiv(N, bn), 1)](
                        x1, ws_[i], scs[i], y, y, 1, N, K, x1.stride(0), K, scs[i].stride(0), y.stride(0),
                        triton.cdiv(K, 128) * 128, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, PDL=False, num_warps=w,
                        num_stages=3)
                else:
                    gemv_w8a16_m1_kernel[(triton.cdiv(N, bn), 1)](
                        x1, ws_[i], scs[i], y, y, 1, N, K, 0, K, scs[i].stride(0), y.stride(0),
                        triton.cdiv(K, bk) * bk, BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, NATIVE=nat, PDL=False,
                        num_warps=w, num_stages=1)
            sweep_row("w8", run, it, y, want, floor, proj=proj, N=N, K=K, kernel=kind, bn=bn, bk=bk, warps=w,
                      native=nat)
        del ws_, wf
        torch.cuda.empty_cache()


def moe_part():
    E, I, H, k = 256, 512, 2048, 8
    nrot = 3
    w1s = [torch.randn(E + 1, 2 * I, H, device="cuda", dtype=torch.bfloat16) / 32 for _ in range(nrot)]
    w2s = [torch.randn(E + 1, H, I, device="cuda", dtype=torch.bfloat16) / 16 for _ in range(nrot)]
    g = torch.Generator(device="cpu").manual_seed(0)
    idss = [torch.cat([torch.randperm(E, generator=g)[:k], torch.tensor([E])]).to(torch.int32).cuda()[None]
            for _ in range(7)]
    wts = torch.rand(1, k + 1, device="cuda", dtype=torch.float32)
    x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
    P = k + 1
    h = torch.randn(P, I, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1, H, device="cuda", dtype=torch.bfloat16)
    ids0 = idss[0][0].long()
    w1d = w1s[0][ids0].double()
    gu = torch.einsum("pnk,k->pn", w1d, x[0].double())
    want_h = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
    want_o = torch.einsum("p,pnk,pk->n", wts[0].double(), w2s[0][ids0].double(), h.double())
    gu_floor = (P * 2 * I * H * 2) / TBS * 1e6
    dn_floor = (P * H * I * 2) / TBS * 1e6
    it = [0]
    gate_up_tiles = ((4, 512), (4, 1024), (8, 256), (8, 512), (8, 1024), (16, 256), (16, 512), (32, 256))
    for (bn, bk), w, st in itertools.product(gate_up_tiles, (4, 8), (1, 3)):

        def run():
            i = it[0]
            it[0] += 1
            moe_decode_gate_up_kernel[(P, triton.cdiv(I, bn))](
                x, w1s[i % nrot], idss[i % len(idss)], h, P, E + 1, I, H, P, x.stride(0), w1s[0].stride(0),
                w1s[0].stride(1), h.stride(0), BLOCK_N=bn, BLOCK_K=bk, PDL=False, num_warps=w, num_stages=st)
        try:
            it[0] = 0
            hs = h.clone()
            run()
            torch.cuda.synchronize()
            err = rel(h, want_h)
            us = time_graph(run)
            h.copy_(hs)
        except Exception as e:  # noqa: BLE001
            emit(part="moe_gate_up", bn=bn, bk=bk, warps=w, stages=st, error=str(e)[:200])
            continue
        emit(part="moe_gate_up", bn=bn, bk=bk, warps=w, stages=st, us=round(us, 2),
             pct_floor=round(100 * gu_floor / us, 1), floor_us=round(gu_floor, 2), rel_err=err)
    down_tiles = ((1, 16), (2, 8), (2, 16), (4, 4), (4, 8), (4, 16), (8, 4), (8, 8))
    for (bn, sb), w, bk, st in itertools.product(down_tiles, (2, 4, 8), (512,), (1,)):

        def run():
            i = it[0]
            it[0] += 1
            moe_decode_down_kernel[(1, triton.cdiv(H, bn))](
                h, w2s[i % nrot], idss[i % len(idss)], wts, out, E + 1, H, I, P, h.stride(0), w2s[0].stride(0),
                w2s[0].stride(1), out.stride(0), BLOCK_N=bn, BLOCK_K=bk, SB=sb, PDL=False, num_warps=w,
                num_stages=st)
        try:
            it[0] = 0
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            err = rel(out[0], want_o)
            us = time_graph(run)
        except Exception as e:  # noqa: BLE001
            emit(part="moe_down", bn=bn, bk=bk, sb=sb, warps=w, stages=st, error=str(e)[:200])
            continue
        emit(part="moe_down", bn=bn, bk=bk, sb=sb, warps=w, stages=st, us=round(us, 2),
             pct_floor=round(100 * dn_floor / us, 1), floor_us=round(dn_floor, 2), rel_err=err)


def main():
    torch.manual_seed(0)
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("moe", "all"):
        moe_part()
    if what in ("gemv", "all"):
        gemv_part()
    if what in ("w8", "all"):
        w8_part()


if __name__ == "__main__":
    main()
