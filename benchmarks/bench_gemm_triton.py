"""The GEMM family's Triton lane on the H200, one process: ``ops.gemm.linear(_lane="triton")`` (the portable BF16
GEMM; on sm_90a Triton lowers it to wgmma) and ``ops.gemm.linear_w4a16`` (NVFP4 weights dequantized in the kernel)
next to cuBLAS bf16 (torch.matmul) and the CuTe lane on the same shapes.

Graph-replayed on both sides (timing.graph_ms, median of CUDA-event-timed replays); weights rotate over enough
copies to exceed 2.5 x the L2. Every vkc row carries its relative error against cuBLAS's output on the same
operands (NVFP4: against cuBLAS on the dequantized bf16 weights), so a fast wrong kernel cannot pass.
pct_limit: % of the bf16 dense peak (989 TFLOPS) for M >= 256, % of the HBM floor (weights + activations at
the card's nominal HBM bandwidth; NVFP4 weights at 0.5625 bytes per element; the dequantizing path also writes and reads
the bf16 weights once) below. ``dequant_w4a16``: linear_w4a16 with a workspace (M >= DEQUANT_MIN_M: dequantize, then the
bf16 GEMM).
Usage: python benchmarks/bench_gemm_triton.py OUT.json [M,M,...]
"""
from __future__ import annotations

import os
import sys

import torch

from vkc_runtime.ops import gemm as G

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as C  # noqa: E402
import timing  # noqa: E402

NKS = [(10240, 5120), (5120, 6144), (34816, 5120), (5120, 17408), (12352, 2048), (2048, 4096)]
MS = [64, 255, 2048, 8192]
SMALL_M = 256
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def nvfp4(n, k):
    packed = torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8)
    scale = torch.randint(0x30, 0x40, (n, k // 16), device="cuda", dtype=torch.uint8)  # e4m3 0.5 .. 1.9
    return packed, scale


def dequant_bf16(packed, scale, alpha):
    lut = torch.tensor(E2M1, device="cuda", dtype=torch.float32)
    p = packed.long()
    codes = torch.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1)
    s = scale.view(torch.float8_e4m3fn).float().repeat_interleave(16, 1)
    return (lut[codes] * s * alpha).to(torch.bfloat16)


def main(argv: list[str]) -> int:
    out_path = argv[1]
    ms = [int(x) for x in argv[2].split(",")] if len(argv) > 2 else MS
    torch.manual_seed(0)
    rows, cmp = [], C.Comparisons()
    alpha = 0.02
    for n, k in NKS:
        n_sets = C.n_sets_for(n * k * 2)
        ws = [(torch.randn(n, k, device="cuda") * k ** -0.5).to(torch.bfloat16) for _ in range(n_sets)]
        qs = [nvfp4(n, k) for _ in range(C.n_sets_for(n * k // 2))]
        wq0 = dequant_bf16(*qs[0], alpha)
        wsp = torch.empty(n * k, device="cuda", dtype=torch.bfloat16)
        for m in ms:
            xs = [torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in range(n_sets)]
            ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(ref)
            torch_ms = timing.graph_ms(lambda i, st: torch.matmul(xs[i], ws[i].T, out=ref), vkc=False, n_sets=n_sets)
            flop = 2.0 * m * n * k
            case = f"M={m} N={n} K={k}"
            row = {"m": m, "n": n, "k": k, "torch_ms": torch_ms, "torch_tflops": flop / torch_ms / 1e9, "lanes": {}}

            def add(name, fn, want, t_sets, wbytes):
                out.fill_(float("nan"))
                fn(0, torch.cuda.current_stream())
                torch.cuda.synchronize()
                err = C.rel_err(out, want)
                t = timing.graph_ms(fn, vkc=True, n_sets=t_sets)
                floor = C.floor_ms(wbytes + 2 * (m * k + m * n), C.HBM_NOMINAL_TBS)
                pct = (100.0 * flop / t / 1e9 / C.BF16_DENSE_TFLOPS) if m >= SMALL_M else C.pct(floor, t)
                row["lanes"][name] = {"ms": t, "tflops": flop / t / 1e9, "ratio_vs_cublas_bf16": torch_ms / t,
                                      "rel_err_vs_cublas": err, "pct_limit": pct}
                cmp.add("gemm_triton", case, "device", name, t, "cublas_bf16", torch_ms, pct_limit=pct,
                        limit="bf16 peak" if m >= SMALL_M else "HBM floor")

            torch.matmul(xs[0], ws[0].T, out=ref)
            if G.has_cute():
                add("cute_bf16", lambda i, st: G.linear(xs[i], ws[i], out, stream=st, _lane="cute"), ref.clone(),
                    n_sets, 2 * n * k)
            add("triton_bf16", lambda i, st: G.linear(xs[i], ws[i], out, stream=st, _lane="triton"), ref.clone(),
                n_sets, 2 * n * k)
            wref = torch.matmul(xs[0], wq0.T)
            nq = len(qs)
            add("triton_w4a16", lambda i, st: G.linear_w4a16(xs[i % n_sets], qs[i % nq][0], qs[i % nq][1], alpha,
                                                              out, stream=st), wref, max(nq, n_sets), n * k * 9 // 16)
            if m >= G.DEQUANT_MIN_M:  # dequantize into the workspace + the bf16 GEMM (the op's large-M path)
                add("dequant_w4a16", lambda i, st: G.linear_w4a16(xs[i % n_sets], qs[i % nq][0], qs[i % nq][1],
                                                                   alpha, out, stream=st, workspace=wsp),
                    wref, max(nq, n_sets), n * k * 9 // 16 + 4 * n * k)
            rows.append(row)
            print(f"{case:<24} cuBLAS {row['torch_tflops']:7.1f} TF  " + "  ".join(
                f"{nm} {r['tflops']:7.1f} TF {r['ratio_vs_cublas_bf16']:.2f}x err {r['rel_err_vs_cublas']:.1e}"
                for nm, r in row["lanes"].items()), flush=True)
            write(out_path, rows, cmp)
            del xs, ref, out
        del ws, qs, wq0, wsp
        torch.cuda.empty_cache()
    return 0


def write(out_path, rows, cmp):
    meth = timing.method(graph_used={"inner": 5, "reps": 20},
                         inputs="bf16 torch.randn; bf16 weights scaled by K^-0.5; NVFP4 random codes, e4m3 scales "
                                "0.5-1.9, global multiplier 0.02; copies rotated past 2.5 x the L2",
                         peer="torch.matmul(x, w.T, out=...) (cuBLAS bf16), captured in a torch.cuda.CUDAGraph")
    C.write(out_path, C.result("gemm_triton", method=meth, limits=C.hbm_limits(None), rows=rows, comparisons=cmp))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
