"""Exploration (JIT, H200): the NVFP4 W4A16 M = 1 GEMV decoded through a 16-entry table instead of integer
logic. The vendored CUDA-core kernel (gemv.w4a16.m1.*.prmt) spends about 4.4 integer/logic instructions per
weight on the PRMT decoder, and Hopper's ALU pipe issues 64 lanes per clock per SM (half the FP32 pipe): that
bounds it near 7 ms for the 27B's 27e9 weights, where the 4-bit floor is 3.6 ms. Here each code is extracted
(shift + and: 2 ALU) and looked up in a 64-byte fp32 table (one L1 line: a warp's 32 lookups are one
wavefront), multiplied with x on the FMA pipe; the 16 products of a scale group are summed before its scale
multiplies them. Variants: ``lut`` (table in global memory, L1-resident), ``lut_s`` (the group sum kept apart
per group, then one FMA with the scale -- as lut, but the scale applied per k-step tile), against the vendored
kernel's structure (``prmt``). Prints one JSON line per (variant, shape): graph-replayed median µs, % of the
4-bit floor, error vs float64. Usage: python3 benchmarks/explore_w4a16_lut.py
Status: checked in Triton's interpreter against the float64 reference (bf16 rounding only); not yet run on the
H200 (session 15 got no device for it): no figure of it exists yet.
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from explore_w4a16 import ref, time_graph  # noqa: E402
from kernels_src.gemv.gemv import e4m3_scale, gemv_w4a16_m1_kernel  # noqa: E402

LUT = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


@triton.jit
def w4_lut(x_ptr, w_ptr, s_ptr, lut_ptr, out_ptr, alpha, N, K, stride_wn, stride_sn,
           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PF: tl.constexpr):
    G: tl.constexpr = BLOCK_K // 16
    pid_n = tl.program_id(0)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    g = tl.arange(0, G)
    w_rows = w_ptr.to(tl.pointer_type(tl.int64)) + n.to(tl.int64)[:, None] * (stride_wn // 8)
    s_rows = s_ptr + n.to(tl.int64)[:, None] * stride_sn
    Kg = K // 16
    acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    ga = g
    ok = n_ok[:, None] & (ga < Kg)[None, :]
    w64 = tl.load(w_rows + ga[None, :], mask=ok, other=0)
    sc = tl.load(s_rows + ga[None, :], mask=ok, other=0).to(tl.int32)
    for k0 in range(0, K, BLOCK_K):
        if PF:
            ga2 = (k0 + BLOCK_K) // 16 + g
            ok2 = n_ok[:, None] & (ga2 < Kg)[None, :]
            w64n = tl.load(w_rows + ga2[None, :], mask=ok2, other=0)
            scn = tl.load(s_rows + ga2[None, :], mask=ok2, other=0).to(tl.int32)
        sf = e4m3_scale(sc)
        lo = w64.to(tl.int32)
        hi = (w64 >> 32).to(tl.int32)
        xg = x_ptr + 16 * ga
        gm = ga < Kg
        t = tl.zeros((BLOCK_N, G), dtype=tl.float32)
        for i in tl.static_range(8):
            v = tl.load(lut_ptr + ((lo >> (4 * i)) & 0xF))
            xi = tl.load(xg + i, mask=gm, other=0.0).to(tl.float32)
            t += v * xi[None, :]
        for i in tl.static_range(8):
            v = tl.load(lut_ptr + ((hi >> (4 * i)) & 0xF))
            xi = tl.load(xg + 8 + i, mask=gm, other=0.0).to(tl.float32)
            t += v * xi[None, :]
        acc += t * sf
        if PF:
            w64 = w64n
            sc = scn
            ga = ga2
        else:
            ga = (k0 + BLOCK_K) // 16 + g
            ok = n_ok[:, None] & (ga < Kg)[None, :]
            w64 = tl.load(w_rows + ga[None, :], mask=ok, other=0)
            sc = tl.load(s_rows + ga[None, :], mask=ok, other=0).to(tl.int32)
    y = tl.sum(acc, axis=1) * alpha
    tl.store(out_ptr + n, y.to(tl.bfloat16), mask=n_ok)


def main():
    torch.manual_seed(0)
    shapes = [(16480, 5120), (6144, 5120), (5120, 17408), (34816, 5120), (2048, 4096), (5120, 6144)]
    lut = torch.tensor(LUT, device="cuda", dtype=torch.float32)
    for N, K in shapes:
        nrot = max(2, int(200e6 // (N * K // 2)) + 1)
        wps = [torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda") for _ in range(nrot)]
        scs = [(torch.rand(N, K // 16, device="cuda") * 2 + 0.1).to(torch.float8_e4m3fn).view(torch.uint8)
               for _ in range(nrot)]
        floor = (N * K // 2 + N * K // 16) / 4.26e12 * 1e6
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        want = ref(x, wps[0], scs[0], 0.5)
        out = torch.zeros(1, N, device="cuda", dtype=torch.bfloat16)
        cases = [("prmt", 64, 256, 8, 0), ("prmt", 16, 256, 4, 0)]
        cases += [("lut", bn, bk, w, pf) for bn, bk, w, pf in
                  [(64, 256, 8, 1), (64, 256, 4, 1), (32, 256, 4, 1), (16, 256, 4, 1), (32, 512, 4, 1),
                   (64, 512, 8, 1), (32, 256, 4, 0), (64, 256, 8, 0), (16, 512, 4, 1), (128, 256, 8, 1)]]
        for name, BN, BK, warps, pf in cases:
            it = [0]

            def run(name=name, BN=BN, BK=BK, warps=warps, pf=pf):
                i = it[0] % nrot
                it[0] += 1
                if name == "prmt":
                    gemv_w4a16_m1_kernel[(triton.cdiv(N, BN), 1)](
                        x, wps[i], scs[i], out, out, 0.5, 1, N, K, K, wps[i].stride(0), scs[i].stride(0), N,
                        triton.cdiv(K, BK) * BK, BLOCK_M=1, BLOCK_N=BN, BLOCK_K=BK, PRMT=True, PDL=False,
                        num_warps=warps, num_stages=1)
                else:
                    w4_lut[(triton.cdiv(N, BN),)](x, wps[i], scs[i], lut, out, 0.5, N, K, wps[i].stride(0),
                                                  scs[i].stride(0), BLOCK_N=BN, BLOCK_K=BK, PF=pf,
                                                  num_warps=warps, num_stages=1)
            try:
                it[0] = 0
                run()
                torch.cuda.synchronize()
                err = ((out.float() - want).abs().max() / want.abs().max()).item()
                us = time_graph(run)
            except Exception as e:  # noqa: BLE001
                print(json.dumps({"variant": name, "N": N, "K": K, "error": str(e)[:300]}), flush=True)
                continue
            print(json.dumps({"variant": name, "BN": BN, "BK": BK, "warps": warps, "pf": pf, "N": N, "K": K,
                              "us": round(us, 2), "floor_us": round(floor, 2), "pct_floor": round(100 * floor / us, 1),
                              "rel_err": err}), flush=True)


if __name__ == "__main__":
    main()
