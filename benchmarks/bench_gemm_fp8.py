"""TFLOPS of ``vkc_runtime.ops.gemm_fp8`` (Triton FP8 e4m3 W8A8 GEMMs) vs torch._scaled_mm (cuBLAS), one process.

out[M, N] bf16 = fp8 x[M, K] @ fp8 weight[N, K]^T over the Qwen3.5 27B / 35B-A3B projection shapes, with
  per-tensor scales:            vkc linear_fp8 vs torch._scaled_mm (scalar scales; default and use_fast_accum=True)
  per-token x per-channel:      vkc linear_fp8 vs torch._scaled_mm rowwise (scale_a [M, 1], scale_b [1, N])
                                (linear_fp8 / linear_fp8_block: the op's lane pick, then the Triton and the CuTe
                                sm_90a kernels forced)
  block-wise (1x128, 128x128):  vkc linear_fp8_block vs the per-tensor cuBLAS time (torch has no block-scaled GEMM
                                here; the target is a ratio to per-tensor cuBLAS)
and, per M, the activation quantizers (per token, per tensor, per token group) against the HBM floor of their
bytes. Both sides graph-replayed (timing.graph_ms: `inner` calls in one CUDA graph, vkc_runtime.Graph for vkc,
torch.cuda.CUDAGraph for torch; CUDA events around replays; median); weights rotate over enough copies to exceed
2.5 x the L2. Per case the tile the op picks and every compiled tile forced, each with its relative error against
the float32 product of the dequantized operands (a fast wrong kernel cannot pass). ratio = torch time / vkc time.
Usage: python benchmarks/bench_gemm_fp8.py OUT.json [M,M,...]
"""
from __future__ import annotations

import os
import sys

import torch

from vkc_runtime.kernels import has_kernel
from vkc_runtime.ops import gemm_fp8 as G

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as C  # noqa: E402
import timing  # noqa: E402

NKS = [(10240, 5120), (6144, 5120), (14336, 5120), (5120, 6144), (34816, 5120), (5120, 17408), (8192, 2048),
       (9216, 2048), (2048, 4096)]
MS = [16, 64, 255, 2048, 4096, 8192]
SMALL_M = 256  # below: bandwidth-bound, limit = HBM floor
FP8_DENSE_TFLOPS = 1979.0  # H200 dense fp8 tensor-core peak (no sparsity)
F8 = torch.float8_e4m3fn


def fp8_rand(*shape):
    return (torch.randn(*shape, device="cuda") * 16).clamp(-448, 448).to(F8)


def variants(kind):
    """(name, lane, patch) per timed variant: the op's own pick, then every compiled tile of each lane forced."""
    out = [("picked", None, None)]
    for t in G.TILES[kind]:
        if has_kernel(G.gemm_base(kind, *t)):
            out.append((f"triton_t{t[0]}x{t[1]}", "triton", (G, "pick_tile", lambda m, n, s, tiles=None, t_=t: t_)))
    if kind == "scaled":
        for tn in (G._cute.TILES if G._cute_available() else ()):
            out.append((f"cute_t128x{tn}", "cute", (G._cute, "pick_tile", lambda m, n, s, tiles=None, t_=tn: t_)))
    else:
        for t in (G._cute.FP8_BLOCK_TILES if G._cute.has_fp8_block() else ()):
            out.append((f"cute_t{t[0]}x{t[1]}", "cute", (G._cute, "pick_block_tile", lambda m, n, s, t_=t: t_)))
    return out


def timed_tiles(kind, run, ref, out, n_sets, flop, floor, m):
    """{variant name: stats} for the picked variant and every compiled tile of each lane forced; ``run(i, stream,
    lane)``."""
    res = {}
    for name, lane, patch in variants(kind):
        old = None
        if patch is not None:
            mod, attr, fn = patch
            old = getattr(mod, attr)
            setattr(mod, attr, fn)
        try:
            out.fill_(float("nan"))
            run(0, torch.cuda.current_stream().cuda_stream, lane)
            torch.cuda.synchronize()
            err = C.rel_err(out.float(), ref)
            t = timing.graph_ms(lambda i, st: run(i, st, lane), vkc=True, n_sets=n_sets)
        finally:
            if patch is not None:
                setattr(mod, attr, old)
        pct = (100.0 * flop / t / 1e9 / FP8_DENSE_TFLOPS) if m >= SMALL_M else C.pct(floor, t)
        res[name] = {"ms": t, "tflops": flop / t / 1e9, "rel_err_vs_f32": err, "pct_limit": pct}
    return res


def main(argv: list[str]) -> int:
    out_path = argv[1]
    ms = [int(x) for x in argv[2].split(",")] if len(argv) > 2 else MS
    torch.manual_seed(0)
    rows, cmp = [], C.Comparisons()
    for n, k in NKS:
        n_sets = C.n_sets_for(n * k)
        kb, nb = -(-k // 128), -(-n // 128)
        ws = [fp8_rand(n, k) for _ in range(n_sets)]
        wcs = [torch.rand(n, device="cuda") * 1e-3 + 1e-3 for _ in range(n_sets)]
        wbs = [torch.rand(nb, kb, device="cuda") * 1e-3 + 1e-3 for _ in range(n_sets)]
        st = torch.tensor(1e-3, device="cuda")
        for m in ms:
            xs = [fp8_rand(m, k) for _ in range(n_sets)]
            xcs = [torch.rand(m, device="cuda") + 0.5 for _ in range(n_sets)]
            xbs = [torch.rand(m, kb, device="cuda") + 0.5 for _ in range(n_sets)]
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            flop = 2.0 * m * n * k
            floor = C.floor_ms(n * k + m * k + 2 * m * n, C.HBM_NOMINAL_TBS)
            case = f"M={m} N={n} K={k}"
            row = {"m": m, "n": n, "k": k, "n_sets": n_sets, "floor_ms": floor}
            a32, w32 = xs[0].float(), ws[0].float()
            prod = a32 @ w32.T
            # torch peers
            peers = {
                "tensor": lambda i, s_: torch._scaled_mm(xs[i], ws[i].T, scale_a=st, scale_b=st,
                                                         out_dtype=torch.bfloat16),
                "tensor_fast": lambda i, s_: torch._scaled_mm(xs[i], ws[i].T, scale_a=st, scale_b=st,
                                                              out_dtype=torch.bfloat16, use_fast_accum=True),
                "rowwise": lambda i, s_: torch._scaled_mm(xs[i], ws[i].T, scale_a=xcs[i][:, None],
                                                          scale_b=wcs[i][None, :], out_dtype=torch.bfloat16),
            }
            row["torch"] = {}
            for name, fn in peers.items():
                try:
                    fn(0, None)
                    t = timing.graph_ms(fn, vkc=False, n_sets=n_sets)
                    row["torch"][name] = {"ms": t, "tflops": flop / t / 1e9}
                except RuntimeError as e:  # e.g. rowwise scaling unsupported by this torch / cuBLAS
                    row["torch"][name] = {"error": str(e).splitlines()[0][:200]}
            t_ref = row["torch"]["tensor"].get("ms")
            # vkc
            vk = {
                "tensor": ("scaled", lambda i, s_, ln: G.linear_fp8(xs[i], st.reshape(1), ws[i], st.reshape(1), out,
                                                                    stream=s_, _lane=ln), prod * 1e-6),
                "rowwise": ("scaled", lambda i, s_, ln: G.linear_fp8(xs[i], xcs[i], ws[i], wcs[i], out, stream=s_,
                                                                     _lane=ln),
                            prod * xcs[0][:, None] * wcs[0][None, :]),
                "block": ("block", lambda i, s_, ln: G.linear_fp8_block(xs[i], xbs[i], ws[i], wbs[i], out,
                                                                        stream=s_, _lane=ln), None),
            }
            row["vkc"] = {}
            for name, (kind, fn, ref) in vk.items():
                if ref is None:
                    sa_full = xbs[0].repeat_interleave(128, 1)[:, :k]
                    sw_full = wbs[0].repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
                    ref = (a32 * sa_full) @ (w32 * sw_full).T
                row["vkc"][name] = timed_tiles(kind, fn, ref, out, n_sets, flop, floor, m)
                del ref
                peer = "tensor" if name in ("tensor", "block") else "rowwise"
                tp = row["torch"][peer].get("ms")
                for tname, r in row["vkc"][name].items():
                    r["ratio_vs_cublas"] = (tp / r["ms"]) if tp else None
                    r["ratio_vs_cublas_fast"] = (row["torch"]["tensor_fast"].get("ms", 0) / r["ms"]) or None
                    if tp:
                        cmp.add("gemm_fp8", f"{case} {name}", "device", tname, r["ms"], f"cublas_{peer}", tp,
                                pct_limit=r["pct_limit"], limit="fp8 peak" if m >= SMALL_M else "HBM floor")
            rows.append(row)
            print(f"{case:<24} cuBLAS {flop / t_ref / 1e9 if t_ref else float('nan'):7.1f} TF  " + "  ".join(
                f"{nm} {r['picked']['tflops']:7.1f} TF {r['picked']['ratio_vs_cublas'] or 0:.2f}x "
                f"err {r['picked']['rel_err_vs_f32']:.1e}" for nm, r in row["vkc"].items()), flush=True)
            write(out_path, rows, cmp)  # after every case: a run cut short keeps what it measured
            del xs, xcs, xbs, out, prod, a32, w32
        del ws, wcs, wbs
        torch.cuda.empty_cache()
    quant_rows(rows, ms, out_path, cmp)
    return 0


def quant_rows(rows, ms, out_path, cmp):
    for k in (5120, 17408):
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            q = torch.empty(m, k, device="cuda", dtype=F8)
            s = torch.empty(m, device="cuda")
            sg = torch.empty(m, -(-k // 128), device="cuda")
            st = torch.tensor([0.01], device="cuda")
            floor = C.floor_ms(3 * m * k, C.HBM_NOMINAL_TBS)
            row = {"quant": True, "m": m, "k": k, "floor_ms": floor}
            for name, fn in (("per_token", lambda i, s_: G.quantize_fp8_per_token(x, q, s, stream=s_)),
                             ("per_tensor", lambda i, s_: G.quantize_fp8_per_tensor(x, st, q, stream=s_)),
                             ("per_token_group", lambda i, s_: G.quantize_fp8_per_token_group(x, q, sg, stream=s_))):
                t = timing.graph_ms(fn, vkc=True)
                row[name] = {"ms": t, "pct_floor": C.pct(floor, t)}
            rows.append(row)
            print(f"quant M={m} K={k}: " + "  ".join(f"{nm} {row[nm]['ms'] * 1e3:.1f} us ({row[nm]['pct_floor']:.0f}%)"
                                                     for nm in ("per_token", "per_tensor", "per_token_group")),
                  flush=True)
            write(out_path, rows, cmp)


def write(out_path, rows, cmp):
    meth = timing.method(graph_used={"inner": 5, "reps": 20},
                         inputs="fp8 e4m3 from torch.randn * 16 (clamped); fp32 scales in [0.5, 1.5) (activations) "
                                "and [1e-3, 2e-3) (weights); n_sets copies rotated so they exceed 2.5 x the 60 MB L2",
                         peer="torch._scaled_mm (cuBLASLt) per tensor (default and use_fast_accum=True) and rowwise, "
                              "captured in a torch.cuda.CUDAGraph")
    C.write(out_path, C.result("gemm_fp8", method=meth, limits=C.hbm_limits(None), rows=rows, comparisons=cmp))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
