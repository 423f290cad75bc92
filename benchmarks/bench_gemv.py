"""Small-M GEMM ("GEMV", decode) on the H200: vkc's gemv / gemv_w4a16 / gemv_w8a16 vs torch.matmul (cuBLAS bf16),
graph vs graph in the same process, microseconds, % of the HBM floor.

y[M, N] = x[M, K] @ W[N, K]^T over the Qwen3.5/3.6 27B and 35B-A3B projection shapes, M in MS. Floor = the
compulsory bytes (weights, x read, y written; NVFP4 weights: K/2 packed bytes + K/16 scale bytes per row) at
the card's nominal HBM bandwidth (pct_floor) and at the copy bandwidth measured in this process (pct_copy); block-FP8
weights: K bytes + cdiv(K, 128) / 128 fp32 scales per row. Weight buffers rotate over enough copies that all of them
together exceed 2.5x the 60 MB L2 (n_sets), so no case times cache hits. The W4A16 and W8A16 rows also time
cuBLAS bf16 on the dequantized weights (the bytes the format saves); the W8A16 rows also time cuBLAS FP8
(torch._scaled_mm, W8A8 with per-tensor scales, x already quantized: its quantization is not timed; x padded to
a multiple of 16 rows, which cuBLASLt FP8 needs) as ``torch_scaled_mm_graph_us``.
Every vkc case records its relative error against torch (a fast wrong kernel cannot pass unnoticed), the plan
the dispatch rule picked, and, for weights up to SWEEP_MAX_BYTES, forced alternatives (each tile, split
1/2/4/8) so the rule can be checked and retuned (``alternatives``, ``best_alternative``; env
BENCH_GEMV_SWEEP_MAX_BYTES sets that limit, 0 for none). W4A16 rows time both
weight decoders (``vkc_graph_us``: the default, ``vkc_<other>_graph_us``; the alternatives use the other one).
Usage: python benchmarks/bench_gemv.py OUT.json [M,M,...] [kind,kind,...]   (kinds: bf16, w4a16, w8a16, all by
default; about 5 minutes for all: BENCH_TIMEOUT=600)
"""
from __future__ import annotations

import os
import sys
import traceback

import torch

from vkc_runtime.ops import gemv as G

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as BC  # noqa: E402
from timing import graph_ms, method  # noqa: E402

SHAPES = [  # (model, projection, N, K)
    ("27B", "gdn_in_fused", 10240 + 6144 + 48 + 48, 5120),
    ("27B", "gdn_qkv", 10240, 5120),
    ("27B", "gdn_z", 6144, 5120),
    ("27B", "gdn_out", 5120, 6144),
    ("27B", "attn_qkv", 12288 + 1024 + 1024, 5120),
    ("27B", "attn_out", 5120, 6144),
    ("27B", "mlp_gate_up", 34816, 5120),
    ("27B", "mlp_down", 5120, 17408),
    ("27B", "lm_head", 248320, 5120),
    ("35B-A3B", "gdn_in_fused", 8192 + 4096 + 32 + 32, 2048),
    ("35B-A3B", "gdn_out", 2048, 4096),
    ("35B-A3B", "attn_qkv", 8192 + 512 + 512, 2048),
    ("35B-A3B", "lm_head", 248320, 2048),
]
MS = (1, 7, 16, 64)
SWEEP_MAX_BYTES = float(os.environ.get("BENCH_GEMV_SWEEP_MAX_BYTES", 400e6))  # 0: the rule's plan only
INNER, REPS = 20, 20


def weight_bytes(kind, N, K):
    if kind == "w8a16":
        return N * K + 4 * (-(-N // 128)) * (-(-K // 128))
    return N * K * 2 if kind == "bf16" else N * K // 2 + N * K // 16


def floor_bytes(kind, M, N, K):
    return weight_bytes(kind, N, K) + M * K * 2 + M * N * 2


def nvfp4_weights(N, K, g):
    packed = torch.randint(0, 256, (N, K // 2), device="cuda", dtype=torch.uint8, generator=g)
    # e4m3 scales in [2^-4, 2^3] (positive, finite): bytes 0x18..0x57
    scale = torch.randint(0x18, 0x58, (N, K // 16), device="cuda", dtype=torch.uint8, generator=g)
    return packed, scale


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequant_bf16(packed, scale, alpha, rows=16384):
    """bf16 W [N, K] from NVFP4 (chunks of rows; exact before the bf16 rounding of alpha's product)."""
    N = packed.shape[0]
    lut = torch.tensor(E2M1, device="cuda", dtype=torch.float32)
    out = torch.empty(N, packed.shape[1] * 2, device="cuda", dtype=torch.bfloat16)
    for lo in range(0, N, rows):
        p = packed[lo:lo + rows].long()
        codes = torch.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1)
        s = scale[lo:lo + rows].view(torch.float8_e4m3fn).float().repeat_interleave(16, 1)
        out[lo:lo + rows] = (lut[codes] * s * alpha).to(torch.bfloat16)
    return out


def fp8_weights(N, K, g):
    """e4m3 bytes (no NaN codes) and fp32 128 x 128 block scales."""
    q = torch.randint(0, 256, (N, K), device="cuda", dtype=torch.uint8, generator=g)
    q = torch.where((q & 0x7F) == 0x7F, q ^ 1, q)
    sc = torch.exp2(-4 * torch.rand(-(-N // 128), -(-K // 128), device="cuda", generator=g)) * 0.01
    return q, sc


def dequant_fp8_bf16(q, sc, rows=16384):
    N, K = q.shape
    out = torch.empty(N, K, device="cuda", dtype=torch.bfloat16)
    for lo in range(0, N, rows):
        w = q[lo:lo + rows].view(torch.float8_e4m3fn).float()
        s = sc.repeat_interleave(128, 0)[lo:lo + rows][:w.shape[0]].repeat_interleave(128, 1)[:, :K]
        out[lo:lo + rows] = (w * s).to(torch.bfloat16)
    return out


def scaled_mm_us(xs, qs, M):
    """cuBLAS FP8 W8A8 (per-tensor scales) on the same weight bytes, x quantized beforehand (module doc)."""
    Mp = -(-M // 16) * 16
    one = torch.ones((), device="cuda")
    xq = []
    for x in xs:
        xp = torch.zeros(Mp, x.shape[1], device="cuda", dtype=torch.bfloat16)
        xp[:M] = x
        xq.append(xp.clamp(-448, 448).to(torch.float8_e4m3fn))
    wq = [q.view(torch.float8_e4m3fn) for q, _ in qs]
    n = len(xq)
    return graph_ms(lambda i, st: torch._scaled_mm(xq[i % n], wq[i % n].T, scale_a=one, scale_b=one,
                                                   out_dtype=torch.bfloat16), vkc=False, n_sets=n, inner=INNER,
                    reps=REPS)


def alternatives(kind, M, N, K):
    bm = G.bucket(kind, M)
    alts = []
    # BF16 / FP8 at M = 1 also time the MMA kernel's tiles (bucket 16: the path before the CUDA-core M = 1 kernels)
    for b in (bm, 16) if (kind in ("bf16", "w8a16") and bm == 1) else (bm,):
        for bn, bk in G.tiles(kind, b):
            kt = -(-K // bk)
            for s in (1, 2, 4, 8):
                tiles = -(-kt // s)
                if -(-kt // tiles) == s:
                    alts.append(G.Plan(b, bn, bk, s, tiles * bk))
    return alts


def plan_name(p):
    return f"m{p.bm}.n{p.bn}.k{p.bk}.s{p.split}"


def bench_case(kind, model, proj, N, K, M, copy_tbs, ws):
    wb = weight_bytes(kind, N, K)
    n_sets = BC.n_sets_for(wb)
    g = torch.Generator(device="cuda").manual_seed(N * 7 + K + M)
    xs = [torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16) for _ in range(n_sets)]
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = torch.empty_like(out)
    fb = floor_bytes(kind, M, N, K)
    row = {"kind": kind, "model": model, "proj": proj, "M": M, "N": N, "K": K, "weight_bytes": wb,
           "floor_bytes": fb, "floor_us": BC.floor_ms(fb, BC.HBM_NOMINAL_TBS) * 1e3,
           "floor_copy_us": BC.floor_ms(fb, copy_tbs) * 1e3, "n_sets": n_sets}
    if kind == "bf16":
        ws_ = [(torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).to(torch.bfloat16) for _ in range(n_sets)]

        def vkc(i, st, p=None, dec=None):
            G.gemv(xs[i], ws_[i], out=out, stream=st, workspace=ws, _plan=p)
        torch_w = ws_
        torch_sets = n_sets
    elif kind == "w8a16":
        qs = [fp8_weights(N, K, g) for _ in range(n_sets)]

        def vkc(i, st, p=None, dec=None):
            G.gemv_w8a16(xs[i], qs[i][0], qs[i][1], out=out, stream=st, workspace=ws, _plan=p)
        torch_sets = BC.n_sets_for(N * K * 2)
        torch_w = [dequant_fp8_bf16(*qs[0])]
        torch_w += [torch_w[0].clone() for _ in range(torch_sets - 1)]
    else:
        qs = [nvfp4_weights(N, K, g) for _ in range(n_sets)]
        alpha = 0.0625

        def vkc(i, st, p=None, dec=None):
            G.gemv_w4a16(xs[i], qs[i][0], qs[i][1], alpha, out=out, stream=st, workspace=ws, _plan=p, _decoder=dec)
        torch_sets = BC.n_sets_for(N * K * 2)
        torch_w = [dequant_bf16(qs[0][0], qs[0][1], alpha)]
        torch_w += [torch_w[0].clone() for _ in range(torch_sets - 1)]  # bytes matter, not values
    chosen = G.plan(kind, M, N, K, torch.cuda.get_device_properties(0).multi_processor_count,
                    tuple(max(1, G.get_kernel(G._base(kind, G.bucket(kind, M, N), bn, bk, G.DEFAULT_DECODER))
                              .max_active_blocks()) for bn, bk in G.tiles(kind, G.bucket(kind, M, N))))
    row["plan"] = plan_name(chosen)
    vkc(0, None)
    torch.matmul(xs[0], torch_w[0].T, out=ref)
    torch.cuda.synchronize()
    row["rel_err_vs_torch"] = BC.rel_err(out, ref)
    t = graph_ms(vkc, vkc=True, n_sets=n_sets, inner=INNER, reps=REPS)
    row["vkc_graph_us"] = t * 1e3
    row["pct_floor"] = 100 * row["floor_us"] / row["vkc_graph_us"]
    row["pct_copy"] = 100 * row["floor_copy_us"] / row["vkc_graph_us"]
    sweep_dec = None
    if kind == "w4a16":  # the other decoder (gemv.py): same plan, and the one the alternatives use
        sweep_dec = "prmt" if G.DEFAULT_DECODER != "prmt" else "int"
        vkc(0, None, dec=sweep_dec)
        torch.cuda.synchronize()
        row[f"rel_err_{sweep_dec}_vs_torch"] = BC.rel_err(out, ref)
        t2 = graph_ms(lambda i, st: vkc(i, st, dec=sweep_dec), vkc=True, n_sets=n_sets, inner=INNER, reps=REPS)
        row[f"vkc_{sweep_dec}_graph_us"] = t2 * 1e3
        row[f"{sweep_dec}_pct_floor"] = 100 * row["floor_us"] / row[f"vkc_{sweep_dec}_graph_us"]
        row["default_decoder"] = G.DEFAULT_DECODER
    tt = graph_ms(lambda i, st: torch.matmul(xs[i % n_sets], torch_w[i % torch_sets].T, out=ref), vkc=False,
                  n_sets=max(n_sets, torch_sets), inner=INNER, reps=REPS)
    row["torch_graph_us"] = tt * 1e3
    tfb = floor_bytes("bf16", M, N, K)
    row["torch_pct_bf16_floor"] = 100 * BC.floor_ms(tfb, BC.HBM_NOMINAL_TBS) / tt
    row["ratio_vs_torch"] = tt / t
    if kind == "w8a16":
        try:
            row["torch_scaled_mm_graph_us"] = scaled_mm_us(xs, qs, M) * 1e3
            row["ratio_vs_torch_scaled_mm"] = row["torch_scaled_mm_graph_us"] / row["vkc_graph_us"]
        except Exception as e:  # noqa: BLE001 - recorded, never replaced by another figure
            row["torch_scaled_mm_error"] = BC.err(e)
    if wb <= SWEEP_MAX_BYTES:
        alts = {}
        for p in alternatives(kind, M, N, K):
            try:
                alts[plan_name(p)] = graph_ms(lambda i, st, p=p: vkc(i, st, p, sweep_dec), vkc=True, n_sets=n_sets,
                                              inner=INNER, reps=10) * 1e3
            except Exception as e:  # noqa: BLE001 - recorded, never silently dropped
                alts[plan_name(p)] = BC.err(e)
        BC.best_alternative(row, alts)
    del xs
    return row


def run_case(fn, ident: dict) -> dict:
    """One benchmark row: ``fn()``, or ``ident`` with the error when it raised (traceback printed); printed."""
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001 - recorded as the row, never silently dropped
        traceback.print_exc()
        r = {**ident, "error": BC.err(e)}
    print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if k != "alternatives"}, flush=True)
    return r


def main(out_path: str) -> None:
    ms = MS
    if len(sys.argv) > 2:
        ms = tuple(int(v) for v in sys.argv[2].split(","))
    copy_tbs = BC.measured_copy_tbs()
    ws = torch.empty(G.workspace_elems(max(ms), max(n for _, _, n, _ in SHAPES)), device="cuda", dtype=torch.float32)
    rows, cmp = [], BC.Comparisons()
    lim = f"HBM floor (weights + x + y) at {BC.HBM_NOMINAL_TBS} TB/s nominal"
    kinds = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("bf16", "w4a16", "w8a16")
    for kind in kinds:
        for model, proj, N, K in SHAPES:
            for M in ms:
                r = run_case(lambda: bench_case(kind, model, proj, N, K, M, copy_tbs, ws),
                             {"kind": kind, "model": model, "proj": proj, "M": M, "N": N, "K": K})
                rows.append(r)
                case = f"{kind} {model} {proj} M={M}"
                cmp.add("gemv", case, "device", "op", r.get("vkc_graph_us"), "torch_matmul_bf16",
                        r.get("torch_graph_us"), unit="us", pct_limit=r.get("pct_floor"), limit=lim)
                if "torch_scaled_mm_graph_us" in r:
                    cmp.add("gemv", case, "device", "op", r.get("vkc_graph_us"), "torch_scaled_mm_fp8",
                            r["torch_scaled_mm_graph_us"], unit="us", pct_limit=r.get("pct_floor"), limit=lim)
                for dec in ("int", "prmt"):
                    if f"vkc_{dec}_graph_us" in r:
                        cmp.add("gemv", case, "device", f"op_{dec}", r[f"vkc_{dec}_graph_us"], "torch_matmul_bf16",
                                r.get("torch_graph_us"), unit="us", pct_limit=r.get(f"{dec}_pct_floor"), limit=lim)
                BC.write(out_path, BC.result("gemv", method=method(graph_defaults={"inner": INNER, "reps": REPS}),
                                             limits=BC.hbm_limits(copy_tbs), rows=rows, comparisons=cmp))
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
