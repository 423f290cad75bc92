"""Exploration (Triton JIT on the GPU, not the vendored kernels): an M = 1 bf16 GEMV whose weight tiles come in by
TMA (a device-built descriptor over W [N, K], one [BLOCK_N, BLOCK_K] box per step, software-pipelined STAGES deep
by tl.range; x from L2 in registers; CUDA-core FMAs), and the same loop with plain loads pipelined by tl.range,
against the vendored gemv op and cuBLAS (torch.matmul) on the decode projections of the 35B-A3B and 27B shapes.
Weights rotate over sets that together exceed 2.5 x the L2; graph-replayed medians; each variant checked against
torch in fp32 first. Rows: {"shape", "N", "K", "variant", "us", "pct_floor" (nominal HBM bandwidth), "err"}.
Usage: python benchmarks/explore_gemv_tma.py OUT.json
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
from timing import graph_ms  # noqa: E402

from vkc_runtime.ops import gemv as G  # noqa: E402

SHAPES = [("35B gdn_in_fused", 12352, 2048), ("35B attn_qkv", 9216, 2048), ("35B gdn_out", 2048, 4096),
          ("27B gdn_out", 5120, 6144), ("27B mlp_down", 5120, 17408)]
# (name, TMA, BLOCK_N, BLOCK_K, STAGES, warps)
VARIANTS = [("tma.n8.k256.S4", True, 8, 256, 4, 4), ("tma.n8.k256.S6", True, 8, 256, 6, 4),
            ("tma.n16.k256.S4", True, 16, 256, 4, 4), ("tma.n16.k256.S3", True, 16, 256, 3, 8),
            ("tma.n32.k256.S3", True, 32, 256, 3, 8), ("tma.n16.k128.S6", True, 16, 128, 6, 4),
            ("tma.n32.k128.S4", True, 32, 128, 4, 4), ("tma.n4.k256.S8", True, 4, 256, 8, 4),
            ("ld.n8.k256.S4", False, 8, 256, 4, 4), ("ld.n16.k256.S3", False, 16, 256, 3, 8)]


@triton.jit
def gemv_m1_pipelined(x_ptr, w_ptr, y_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      STAGES: tl.constexpr, TMA: tl.constexpr):
    pid = tl.program_id(0)
    rk = tl.arange(0, BLOCK_K)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    if TMA:
        desc = tl.make_tensor_descriptor(w_ptr, [N, K], [stride_wn, 1], [BLOCK_N, BLOCK_K])
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            w = desc.load([pid * BLOCK_N, k0])
            xk = tl.load(x_ptr + k0 + rk, mask=k0 + rk < K, other=0.0)
            acc += w.to(tl.float32) * xk.to(tl.float32)[None, :]
    else:
        rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn + rk[None, :]
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            w = tl.load(rows + k0, mask=(n < N)[:, None] & (k0 + rk < K)[None, :], other=0.0)
            xk = tl.load(x_ptr + k0 + rk, mask=k0 + rk < K, other=0.0)
            acc += w.to(tl.float32) * xk.to(tl.float32)[None, :]
    tl.store(y_ptr + n, tl.sum(acc, 1).to(tl.bfloat16), mask=n < N)


def _alloc(size, align, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def main(out_path):
    triton.set_allocator(_alloc)
    rows = []
    for name, N, K in SHAPES:
        nbytes = N * K * 2 + K * 2 + N * 2
        n = max(1, min(32, int(2.5 * 60e6 / nbytes) + 1))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
        xs = [torch.randn(1, K, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
        y = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
        ref = (xs[0].float() @ ws[0].float().T)
        floor_us = nbytes / 4.8e12 * 1e6
        base = {"shape": name, "N": N, "K": K, "n_sets": n, "floor_us": floor_us}

        def add(variant, fn, vkc=False):
            row = {**base, "variant": variant}
            try:
                y.fill_(float("nan"))
                torch.cuda.synchronize()
                fn(0, None)
                torch.cuda.synchronize()
                row["err"] = float(((y.float() - ref).norm() / ref.norm()))
                row["us"] = 1e3 * graph_ms(fn, vkc=vkc, n_sets=n, inner=max(20, n))
                row["pct_floor"] = 100 * floor_us / row["us"]
            except Exception as e:  # noqa: BLE001 - a variant that does not compile is a result
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)

        for v in VARIANTS:
            _, tma, bn, bk, st, warps = v
            add(v[0], lambda i, s, tma=tma, bn=bn, bk=bk, st=st, warps=warps: gemv_m1_pipelined[(triton.cdiv(N, bn),)](
                xs[i], ws[i], y, N, K, ws[i].stride(0), BLOCK_N=bn, BLOCK_K=bk, STAGES=st, TMA=tma,
                num_warps=warps, num_stages=1))
        gws = G.workspace(1, N)
        add("vkc.gemv", lambda i, s: G.gemv(xs[i], ws[i], out=y, workspace=gws, stream=s), vkc=True)
        add("cublas", lambda i, s: torch.matmul(xs[i], ws[i].T, out=y))
        del ws, xs
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
