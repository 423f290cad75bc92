"""Exploration (Triton JIT on the GPU, not the vendored kernels): the split-KV decode kernel's K / V loads by TMA
(`kernels_src.attn.decode`, TMA=True: a tile is BLOCK_N slots of one cache block, one box, software-pipelined
STAGES deep) against its gather loads, at tiles and split counts the specs do not compile; the vendored op and
torch SDPA (native GQA, de-paged K / V) in the same run. 24/4 x 256 heads; caches rotated over sets so small
cases are not timed from L2; graph-replayed medians.

Each variant's partials are checked against a float32 reference (combined in torch) on one set before timing.
Rows: {"B", "L", "block_size", "variant", "splits", "us", "pct_floor", "max_err"} and per case {"vkc_op_us",
"sdpa_flash_us", "sdpa_cudnn_us", "floor_us"}. Usage: python benchmarks/explore_attn_decode.py OUT.json
"""
from __future__ import annotations

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as C  # noqa: E402
from bench_attn import paged, sdpa_ctx, sdpa_gqa  # noqa: E402
from kernels_src.attn.decode import decode_split_kernel  # noqa: E402
from timing import graph_ms  # noqa: E402

from vkc_runtime.ops import attn as A  # noqa: E402

HQ, HKV, D = 24, 4, 256
CASES = [(1, 4096, 64), (1, 32768, 64), (16, 4096, 64), (16, 32768, 64), (64, 4096, 64), (64, 32768, 64),
         (256, 4096, 64), (1, 32768, 16)]
# (name, TMA, BLOCK_N, warps, num_stages, STAGES)
VARIANTS = [("gather.n64.w4.s4", False, 64, 4, 4, 2), ("gather.n32.w4.s3", False, 32, 4, 3, 2),
            ("tma.n64.w4.S2", True, 64, 4, 2, 2), ("tma.n64.w4.S3", True, 64, 4, 3, 3),
            ("tma.n32.w4.S3", True, 32, 4, 3, 3), ("tma.n32.w4.S4", True, 32, 4, 4, 4),
            ("tma.n64.w8.S2", True, 64, 8, 2, 2), ("tma.n16.w4.S4", True, 16, 4, 4, 4),
            ("tma.n16.w4.S6", True, 16, 4, 6, 6)]
SPLITS = (4, 8, 16, 32, 64, 128)


def _alloc(size, align, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def launch(v, x, bt, sl, po, pl, s, bs):
    _, tma, bn, warps, ns, stages = v
    kc, q = x["kc"], x["q"]
    B = q.shape[0]
    decode_split_kernel[(B * HKV * s,)](
        q, kc, x["vc"], bt, sl, po, pl, D ** -0.5, HKV, HQ // HKV, s, q.stride(0), q.stride(1), kc.stride(0),
        kc.stride(1), kc.stride(2), bt.stride(0), bs, bt.shape[1], kc.shape[0],
        D=D, BLOCK_N=bn, QB=16, PDL=False, TMA=tma, STAGES=stages, num_warps=warps, num_stages=ns)


def combine(po, pl, B, s):
    po = po.view(B, HQ, s, D)
    pl = pl.view(B, HQ, s)
    m = pl.max(-1, keepdim=True).values
    w = torch.where(pl > float("-inf"), torch.exp2(pl - m), torch.zeros_like(pl))
    return (w.unsqueeze(-1) * po).sum(2) / w.sum(-1, keepdim=True)


def reference(x, bt, L, bs):
    n = torch.arange(L, device="cuda")
    blk = bt[:, n // bs].long()
    k = x["kc"][blk, n % bs].float()  # [B, L, Hkv, D]
    v = x["vc"][blk, n % bs].float()
    q = x["q"].float().view(-1, HKV, HQ // HKV, D)
    s = torch.einsum("bhgd,blhd->bhgl", q, k) * D ** -0.5
    return torch.einsum("bhgl,blhd->bhgd", s.softmax(-1), v).reshape(-1, HQ, D)


def main(out_path):
    triton.set_allocator(_alloc)
    rows = []
    for B, L, bs in CASES:
        nbytes = C.attn_decode_bytes(B, L, HQ, HKV, D)
        n = C.n_sets_for(nbytes, lo=1, hi=64)
        bt, sets = None, []
        for _ in range(n):
            kc, vc, bt, _, _ = paged(B, L, HKV, D, bs, dense=False, bt=bt)
            sets.append({"kc": kc, "vc": vc, "q": torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16)})
        sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
        floor_us = C.floor_ms(nbytes, C.HBM_NOMINAL_TBS) * 1e3
        case = {"B": B, "L": L, "block_size": bs, "floor_us": floor_us, "n_sets": n}
        ref = reference(sets[0], bt, L, bs) if B * L <= 64 * 4096 else None
        po = torch.empty(B * HQ * max(SPLITS) * D, device="cuda", dtype=torch.float32)
        pl = torch.empty(B * HQ * max(SPLITS), device="cuda", dtype=torch.float32)
        for v in VARIANTS:
            if v[1] and bs % v[2]:
                continue
            if bs == 16 and v[0] not in ("gather.n64.w4.s4", "tma.n16.w4.S4"):
                continue
            for s in SPLITS:
                if L // s < v[2] or B * HKV * s > 4 * 132 * 8 or (B * L >= 16 * 32768 and s < 8 and B < 64):
                    continue
                row = {**case, "variant": v[0], "splits": s}
                try:
                    if ref is not None and s in (SPLITS[0], 32):
                        po.fill_(float("nan"))
                        launch(v, sets[0], bt, sl, po, pl, s, bs)
                        got = combine(po[:B * HQ * s * D], pl[:B * HQ * s], B, s)
                        row["max_err"] = float((got - ref).abs().max())
                    row["us"] = 1e3 * graph_ms(lambda i, st: launch(v, sets[i], bt, sl, po, pl, s, bs), vkc=False,
                                               n_sets=n, inner=10)
                    row["pct_floor"] = 100 * floor_us / row["us"]
                except Exception as e:  # noqa: BLE001 - a variant that does not compile is a result
                    row["error"] = C.err(e)
                rows.append(row)
                print(json.dumps(row), flush=True)
        ws = A.decode_workspace(B, HQ, D, 64)
        out = torch.empty(B, HQ, D, device="cuda", dtype=torch.bfloat16)
        case["vkc_op_us"] = 1e3 * graph_ms(
            lambda i, st: A.decode(sets[i]["q"], sets[i]["kc"], sets[i]["vc"], bt, sl, D ** -0.5, out=out,
                                   workspace=ws, max_seq_len=L, stream=st), vkc=True, n_sets=n, inner=10)
        if B * L <= 64 * 32768:
            idx = torch.arange(L, device="cuda")
            dense = []
            for x in sets:
                blk = bt[:, idx // bs].long()
                dense.append((x["q"].unsqueeze(2), x["kc"][blk, idx % bs].permute(0, 2, 1, 3).contiguous(),
                              x["vc"][blk, idx % bs].permute(0, 2, 1, 3).contiguous()))
            for be in ("flash", "cudnn"):
                try:
                    with sdpa_ctx(be):
                        case[f"sdpa_{be}_us"] = 1e3 * graph_ms(lambda i, st: sdpa_gqa(*dense[i], False), vkc=False,
                                                               n_sets=n, inner=10)
                except Exception as e:  # noqa: BLE001
                    case[f"sdpa_{be}_error"] = C.err(e)
            del dense
        rows.append({"kind": "case", **case})
        print(json.dumps(rows[-1]), flush=True)
        sets = ws = po = pl = None
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
