"""Exploration (Triton JIT on the GPU, not the vendored kernels): the streaming kernels that sit below issue 18's
85% of HBM on the H200, at shapes and hints their specs do not compile, beside the vendored op in the same run.

  rope   qk_norm_rope_kernel (kernels_src) at (TOK, HEADS_PER_PROG, warps) other than the vendored one, 24/4 and
         16/2 x 256, each variant compared with the vendored op's output first.
  gdn    gdn_decode_kernel (kernels_src) at (BLOCK_V, warps) other than the specs' (32, 4) / (16, 2), B 64 and 256
         x 48 value heads (the state read and written once is the floor); checked against the vendored op.
  layout attention decode, the vendored op: 24/4 heads interleaved in a cache row ([blocks, 64, 4, 256], each
         (sequence, kv head) program reads 512 B of every 2 KB row) against the same bytes and programs as 4x the
         sequences with one kv head (each program reads whole 512 B rows: contiguous); and SDPA FLASH on
         contiguous [B, Hkv, L, D] K / V against the interleaved [B, L, Hkv, D] view. Tests whether the paged
         layout's head interleave is what keeps vkc 1-2% behind FLASH at large B x L.

Inputs rotate over sets larger than L2; graph-replayed medians (timing.graph_ms). Usage:
python benchmarks/explore_stream.py OUT.json [rope gdn layout]
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as C  # noqa: E402
from bench_norm import make_sets  # noqa: E402
from kernels_src.gdn_decode.decode import gdn_decode_kernel  # noqa: E402
from kernels_src.rope.rope import qk_norm_rope_kernel  # noqa: E402
from timing import graph_ms  # noqa: E402

from vkc_runtime.ops import attn as A  # noqa: E402
from vkc_runtime.ops import gdn_decode as GD  # noqa: E402
from vkc_runtime.ops import rope as RO  # noqa: E402

BF = dict(device="cuda", dtype=torch.bfloat16)


# (TOK, HPP, warps) of kernels_src's qk_norm_rope_kernel; (4, 4, 4) is the vendored sm_90a d256 configuration
# (session 29 also timed evict-first loads / .cs stores on a copy of it: 1-4% at TOK 4, not kept)
ROPE_VARIANTS = [(1, 4, 2), (2, 4, 4), (2, 4, 2), (4, 4, 4), (4, 4, 8), (2, 8, 4), (1, 8, 4), (8, 4, 8)]
ROPE_CASES = [(24, 4, 8192), (24, 4, 32768), (16, 2, 8192)]


def bench_rope(rows):
    D, rot = 256, 64
    for Hq, Hkv, T in ROPE_CASES:
        wq, wk = ((torch.randn(D, device="cuda") * 0.1).to(torch.bfloat16) for _ in range(2))
        pos = torch.arange(T, device="cuda", dtype=torch.int32)  # one prompt from position 0 (tune_rope's)
        qo, ko = torch.empty(T, Hq, D, **BF), torch.empty(T, Hkv, D, **BF)
        nb = T * (Hq + Hkv) * D * 2 * 2
        sets = make_sets(lambda: (torch.randn(T, Hq * 2 * D, **BF), torch.randn(T, Hkv * D, **BF)), nb)
        qg0, k0 = sets[0][0]
        rq, rk = torch.empty(T, Hq, D, **BF), torch.empty(T, Hkv, D, **BF)
        RO.qk_norm_rope(qg0, k0, pos, wq, wk, Hq, Hkv, D, 1e-6, 1e7, q_out=rq, k_out=rk)
        torch.cuda.synchronize()
        case = f"{Hq}/{Hkv}x{D} T={T}"
        vend = graph_ms(lambda i, st: RO.qk_norm_rope(*sets[i][0], pos, wq, wk, Hq, Hkv, D, 1e-6, 1e7, q_out=qo,
                                                      k_out=ko, stream=st), vkc=True, n_sets=len(sets),
                        inner=max(5, len(sets)))
        rows.append({"part": "rope", "case": case, "variant": "vendored op", "us": vend * 1e3,
                     "tbs": nb / vend / 1e9})
        print(rows[-1], flush=True)
        for tok, hpp, warps in ROPE_VARIANTS:
            grid = (triton.cdiv(T, tok), triton.cdiv(Hq, hpp) + triton.cdiv(Hkv, hpp))

            def run(i, st, tok=tok, hpp=hpp, warps=warps):
                qg, k = sets[i][0]
                qk_norm_rope_kernel[grid](qg, k, pos, wq, wk, qo, ko, qg.stride(0), k.stride(0), T, Hq, Hkv, 1e-6,
                                          1e7, D=D, ROT=rot, TOK=tok, HEADS_PER_PROG=hpp, PDL=False,
                                          num_warps=warps)
            name = f"tok{tok}.h{hpp}.w{warps}"
            qo.fill_(float("nan"))
            ko.fill_(float("nan"))
            run(0, None)
            torch.cuda.synchronize()
            exact = bool(torch.equal(qo, rq) and torch.equal(ko, rk))
            diff = max((qo.float() - rq.float()).abs().max().item(), (ko.float() - rk.float()).abs().max().item())
            us = graph_ms(run, vkc=False, n_sets=len(sets), inner=max(5, len(sets))) * 1e3
            rows.append({"part": "rope", "case": case, "variant": name, "us": us, "tbs": nb / us / 1e6,
                         "exact_vs_vendored": exact, "max_abs_diff": diff, "vs_vendored": vend * 1e3 / us})
            print(rows[-1], flush=True)
        sets = None
        torch.cuda.empty_cache()


# (BLOCK_V, warps); (32, 4) and (16, 2) are the vendored specs
GDN_VARIANTS = [(32, 4), (16, 2), (64, 4), (64, 8), (32, 2), (32, 8), (128, 8), (16, 1)]
GDN_CASES = [(64, 48), (256, 48), (256, 32)]


def bench_gdn(rows):
    D, hk = 128, 16
    for B, hv in GDN_CASES:
        nb = C.gdn_decode_bytes(B, hv, D)
        per_set = B * hv * D * D * 4
        n = max(2, min(16, int(2.5 * C.L2_BYTES // per_set) + 1))
        Cq = 2 * hk * D + hv * D
        qkv = [torch.randn(B, Cq, **BF) for _ in range(n)]
        a = [torch.randn(B, hv, **BF) for _ in range(n)]
        b = [torch.randn(B, hv, **BF) for _ in range(n)]
        A_log = torch.rand(hv, device="cuda") * 2 - 1
        dt_bias = torch.randn(hv, device="cuda") * 0.5
        pool = torch.randn(n * B, hv, D, D, device="cuda") * 0.1
        slots = [torch.arange(i * B, (i + 1) * B, device="cuda", dtype=torch.int32) for i in range(n)]
        out = torch.empty(B, hv, D, **BF)
        pool0 = pool[:B].clone()  # the state before any timed replay (the variants start from it too)
        s0 = pool.clone()
        ref = torch.empty(B, hv, D, **BF)
        GD.recurrent_decode(qkv[0], a[0], b[0], A_log, dt_bias, s0, slots[0], hk, hv, out=ref)
        ref_state = s0[:B].clone()
        s0 = None
        case = f"B={B} Hv={hv}"
        for tile in ("bv32", "bv16"):
            us = graph_ms(lambda i, st, tile=tile: GD.recurrent_decode(qkv[i], a[i], b[i], A_log, dt_bias, pool,
                                                                       slots[i], hk, hv, out=out, stream=st,
                                                                       _tile=tile),
                          vkc=True, n_sets=n, inner=max(10, n)) * 1e3
            rows.append({"part": "gdn", "case": case, "variant": f"vendored {tile}", "us": us, "tbs": nb / us / 1e6,
                         "pct_nominal": 100 * nb / us / 1e6 / C.HBM_NOMINAL_TBS})
            print(rows[-1], flush=True)
        for bv, warps in GDN_VARIANTS:
            def run(i, st, bv=bv, warps=warps, state=pool):
                gdn_decode_kernel[(B * hv * (D // bv),)](
                    qkv[i], a[i], b[i], A_log, dt_bias, state, slots[i], out, qkv[i].stride(0), a[i].stride(0),
                    b[i].stride(0), state.stride(0), out.stride(0), hk, hv, state.shape[0], D ** -0.5, 1e-6, 0,
                    K=D, V=D, BLOCK_V=bv, BA=False, BLOCK_H=1024, PDL=False, num_warps=warps)
            s1 = pool0.clone()
            out.fill_(float("nan"))
            run(0, None, state=s1)
            torch.cuda.synchronize()
            err = max((out.float() - ref.float()).abs().max().item(), (s1 - ref_state).abs().max().item())
            s1 = None
            us = graph_ms(run, vkc=False, n_sets=n, inner=max(10, n)) * 1e3
            rows.append({"part": "gdn", "case": case, "variant": f"bv{bv}.w{warps}", "us": us, "tbs": nb / us / 1e6,
                         "pct_nominal": 100 * nb / us / 1e6 / C.HBM_NOMINAL_TBS, "max_abs_diff_vs_vendored": err})
            print(rows[-1], flush=True)
        qkv = a = b = pool = pool0 = None
        torch.cuda.empty_cache()


LAYOUT_CASES = [(64, 32768), (256, 4096), (16, 32768)]


def _vkc_decode(B, L, Hq, Hkv, D=256, bs=64):
    nblk = L // bs
    kc = torch.randn(B * nblk, bs, Hkv, D, **BF)
    vc = torch.randn_like(kc)
    bt = torch.randperm(B * nblk, device="cuda").to(torch.int32).view(B, nblk)
    q = torch.randn(B, Hq, D, **BF)
    sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    ws = A.decode_workspace(B, Hq, D, 64, num_kv_heads=Hkv)
    plan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=bs, workspace=ws,
                        max_seq_len=L)
    us = graph_ms(lambda i, st: A.decode(q, kc, vc, bt, sl, D ** -0.5, out=out, workspace=ws, max_seq_len=L,
                                         stream=st), vkc=True, inner=10) * 1e3
    return us, plan.num_splits, bool(plan.batch.tma)


def bench_layout(rows):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    D = 256
    for B, L in LAYOUT_CASES:
        nbytes = C.attn_decode_bytes(B, L, 24, 4, D)
        r = {"part": "layout", "case": f"{B}x{L}", "bytes": nbytes}
        r["vkc_24_4_us"], r["splits_24_4"], r["tma"] = _vkc_decode(B, L, 24, 4)
        torch.cuda.empty_cache()
        r["vkc_6_1_x4_us"], r["splits_6_1"], _ = _vkc_decode(4 * B, L, 6, 1)
        torch.cuda.empty_cache()
        q = torch.randn(B, 24, 1, D, **BF)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            k, v = torch.randn(B, 4, L, D, **BF), torch.randn(B, 4, L, D, **BF)
            r["flash_contiguous_us"] = graph_ms(
                lambda i, st: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), vkc=False, inner=10) * 1e3
            k = v = None
            torch.cuda.empty_cache()
            kn, vn = torch.randn(B, L, 4, D, **BF), torch.randn(B, L, 4, D, **BF)
            try:
                r["flash_interleaved_us"] = graph_ms(
                    lambda i, st: F.scaled_dot_product_attention(q, kn.transpose(1, 2), vn.transpose(1, 2),
                                                                 enable_gqa=True), vkc=False, inner=10) * 1e3
            except Exception as e:  # noqa: BLE001 - the backend may refuse the strides
                r["flash_interleaved_error"] = f"{type(e).__name__}: {e}"[:300]
            kn = vn = None
        for key in [k for k in r if k.endswith("_us")]:
            r[key.replace("_us", "_pct_floor")] = 100 * nbytes / (r[key] * 1e-6) / 1e12 / C.HBM_NOMINAL_TBS
        rows.append(r)
        print(r, flush=True)
        torch.cuda.empty_cache()


def main(path, parts):
    rows = []
    res = {"bench": "explore_stream", "meta": C.meta(), "rows": rows}
    for p in parts:
        try:
            {"rope": bench_rope, "gdn": bench_gdn, "layout": bench_layout}[p](rows)
        except Exception as e:  # noqa: BLE001 - keep the other parts' rows
            rows.append({"part": p, "error": f"{type(e).__name__}: {e}"[:500]})
            print(rows[-1], flush=True)
        C.write(path, res)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["rope", "gdn", "layout"])
