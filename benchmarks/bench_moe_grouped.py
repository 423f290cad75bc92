"""MoE grouped GEMMs on the H200: vkc's grouped_gemm (GEMM1 x -> h with SwiGLU fused, GEMM2 h -> y with the
routing weights as row_scale) vs torch._grouped_mm (bf16) on the same routing, graph vs graph in one process,
microseconds, % of the active-weight HBM floor.

Shapes: Qwen3.6-35B-A3B, E' = 256 routed + 1 shared expert, H = 2048, I = 512, k' = 8 + 1 pairs per token,
uniform random top-8 routing; M in MS tokens. vkc's side: the two grouped GEMMs on align's grouping (built here
with torch, outside the timed region), block_m from ``choose_block_m`` and tiles from the op's rule; forced
alternatives (the other block_m, each tile) are timed next to it (``alternatives``, ``best_alternative``).
torch's side: ``_grouped_mm`` x2 on rows already permuted by expert (``torch_gemms_graph_us``: the figure the
issue quotes), and with the SwiGLU between them (``torch_gemms_act_graph_us``); vkc's GEMM1 also gathers its
rows and applies the SwiGLU, so the comparison favours torch. Floor = the active experts' weights (w1 + w2 of
every expert with a pair) + x read + h written and read + y written, at the card's nominal HBM bandwidth (pct_floor) and
at the copy bandwidth measured in this process (pct_copy). The routing rotates over n_sets independent draws whose
active weights together exceed 2.5x the 60 MB L2 (at M = 1 a set touches 9 experts, 54 MB), so no case
times cache hits. Every case records vkc's relative error against a float32 torch evaluation of the same block.
Usage: python benchmarks/bench_moe_grouped.py OUT.json [M,M,...]   (about 2 minutes)
"""
from __future__ import annotations

import os
import sys
import traceback

import torch

from vkc_runtime.ops.moe import grouped_ops as G

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as BC  # noqa: E402
from timing import graph_ms, method  # noqa: E402

E_ROUTED, TOP_K, H, I = 256, 8, 2048, 512
E = E_ROUTED + 1
KP = TOP_K + 1
MS = (1, 16, 256, 2048, 8192)
SWEEP_MAX_M = 8192
INNER, REPS = 10, 20
EXPERT_BYTES = (2 * I * H + H * I) * 2


def routing(M, g):
    ids = torch.rand(M, E_ROUTED, device="cuda", generator=g).argsort(1)[:, :TOP_K]
    return torch.cat([ids, torch.full((M, 1), E_ROUTED, device="cuda", dtype=torch.long)], 1).to(torch.int32)


def align(ids, bm):
    """align's output (the contract in MOE_CONTRACT / ops.moe) built with torch: sorted_ids, block_expert,
    num_padded."""
    flat = ids.reshape(-1).long()
    P = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    padded = (counts + bm - 1) // bm * bm
    starts = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts
    cap = -(-(P + E * (bm - 1)) // bm) * bm
    st = torch.full((cap,), P, device="cuda", dtype=torch.int32)
    e_of = flat[order]
    st[starts[e_of] + torch.arange(P, device="cuda") - first[e_of]] = order.to(torch.int32)
    be = torch.full((cap // bm,), -1, device="cuda", dtype=torch.int32)
    nb = int(padded.sum()) // bm
    be[:nb] = torch.repeat_interleave(torch.arange(E, device="cuda"), padded // bm).to(torch.int32)
    return st, be, torch.tensor([nb * bm], device="cuda", dtype=torch.int32)


def floor_bytes(ids, M):
    active = int(torch.unique(ids).numel())
    P = M * KP
    return active * EXPERT_BYTES + M * H * 2 + 2 * P * I * 2 + P * H * 2, active


class Case:
    def __init__(self, M, n_sets, w1, w2, g):
        self.M, self.P = M, M * KP
        self.w1, self.w2 = w1, w2
        self.x = [torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16) for _ in range(n_sets)]
        self.ids = [routing(M, g) for _ in range(n_sets)]
        self.tw = [torch.rand(self.P, device="cuda", generator=g) for _ in range(n_sets)]
        self.idx = {}
        self.h = torch.empty(self.P, I, device="cuda", dtype=torch.bfloat16)
        self.y = torch.empty(self.P, H, device="cuda", dtype=torch.bfloat16)

    def grouping(self, bm):
        if bm not in self.idx:
            self.idx[bm] = [align(ids, bm) for ids in self.ids]
        return self.idx[bm]

    def vkc(self, bm, tiles=(None, None), which="both"):
        idx = self.grouping(bm)

        def fn(i, st):
            if which in ("both", "gemm1"):
                G.grouped_gemm(self.x[i], self.w1, *idx[i], a_row_div=KP, out=self.h, block_m=bm, act="silu_mul",
                               stream=st, _tile=tiles[0])
            if which in ("both", "gemm2"):
                G.grouped_gemm(self.h, self.w2, *idx[i], a_row_div=1, out=self.y, block_m=bm, row_scale=self.tw[i],
                               stream=st, _tile=tiles[1])
        return fn

    def torch_fns(self):
        """_grouped_mm x2 on expert-sorted rows (and with the SwiGLU between them)."""
        w1t, w2t = self.w1.transpose(1, 2), self.w2.transpose(1, 2)
        sets = []
        for x, ids in zip(self.x, self.ids):
            flat = ids.reshape(-1).long()
            order = torch.argsort(flat, stable=True)
            offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
            a0 = torch.randn(self.P, I, device="cuda").to(torch.bfloat16)  # GEMM2's input without the SwiGLU
            sets.append((x[order // KP].contiguous(), offs, a0))

        def gemms(i, st, act=False):
            xs, offs, a0 = sets[i]
            hh = torch._grouped_mm(xs, w1t, offs=offs)
            a = torch.nn.functional.silu(hh[:, :I]) * hh[:, I:] if act else a0
            return torch._grouped_mm(a, w2t, offs=offs)
        return gemms, sets

    def check(self, bm):
        """vkc's y against float32 torch on set 0 (rel err over all rows)."""
        st, be, npad = self.grouping(bm)[0]
        self.vkc(bm)(0, None)
        torch.cuda.synchronize()
        flat = self.ids[0].reshape(-1).long()
        x = self.x[0].float()
        ref = torch.empty(self.P, H, device="cuda")
        for e in torch.unique(flat).tolist():
            f = torch.nonzero(flat == e).view(-1)
            gu = x[f // KP] @ self.w1[e].float().T
            hh = (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]).to(torch.bfloat16).float()
            ref[f] = (hh @ self.w2[e].float().T) * self.tw[0][f, None]
        return BC.rel_err(self.y.float(), ref)


def tiles_of(bm):
    return [(t1, t2) for t1 in G.TILES[bm]["silu_mul"] for t2 in G.TILES[bm][None]]


def tile_name(bm, t):
    return f"m{bm}.gemm1_n{t[0][0]}k{t[0][1]}.gemm2_n{t[1][0]}k{t[1][1]}"


def bench_case(M, w1, w2, copy_tbs, num_sms):
    g = torch.Generator(device="cuda").manual_seed(1000 + M)
    probe = routing(M, g)
    per_set = min(E, int(torch.unique(probe).numel())) * EXPERT_BYTES
    n_sets = BC.n_sets_for(per_set, lo=1, hi=8)
    c = Case(M, n_sets, w1, w2, g)
    fb, active = floor_bytes(c.ids[0], M)
    bm = G.choose_block_m(M, KP, E)
    st0 = c.grouping(bm)[0][0]
    nb = G.max_blocks(c.P, E, bm, st0.numel())
    p1 = G.plan(bm, "silu_mul", nb, I, num_sms)
    p2 = G.plan(bm, None, nb, H, num_sms)
    row = {"M": M, "pairs": c.P, "active_experts": active, "n_sets": n_sets, "block_m": bm,
           "plan": tile_name(bm, (p1, p2)), "grid_blocks": nb, "floor_bytes": fb,
           "floor_us": BC.floor_ms(fb, BC.HBM_NOMINAL_TBS) * 1e3, "floor_copy_us": BC.floor_ms(fb, copy_tbs) * 1e3}
    row["rel_err_vs_torch_fp32"] = c.check(bm)
    t = graph_ms(c.vkc(bm), vkc=True, n_sets=n_sets, inner=INNER, reps=REPS)
    row["vkc_graph_us"] = t * 1e3
    row["vkc_gemm1_graph_us"] = graph_ms(c.vkc(bm, which="gemm1"), vkc=True, n_sets=n_sets, inner=INNER,
                                         reps=REPS) * 1e3
    row["vkc_gemm2_graph_us"] = graph_ms(c.vkc(bm, which="gemm2"), vkc=True, n_sets=n_sets, inner=INNER,
                                         reps=REPS) * 1e3
    row["pct_floor"] = 100 * row["floor_us"] / row["vkc_graph_us"]
    row["pct_copy"] = 100 * row["floor_copy_us"] / row["vkc_graph_us"]
    try:
        gemms, _ = c.torch_fns()
        row["torch_gemms_graph_us"] = graph_ms(lambda i, st: gemms(i, st), vkc=False, n_sets=n_sets, inner=INNER,
                                               reps=REPS) * 1e3
        row["torch_gemms_act_graph_us"] = graph_ms(lambda i, st: gemms(i, st, True), vkc=False, n_sets=n_sets,
                                                   inner=INNER, reps=REPS) * 1e3
        row["ratio_vs_torch_gemms"] = row["torch_gemms_graph_us"] / row["vkc_graph_us"]
        row["ratio_vs_torch_gemms_act"] = row["torch_gemms_act_graph_us"] / row["vkc_graph_us"]
    except Exception as e:  # noqa: BLE001 - recorded, never silently dropped
        traceback.print_exc()
        row["torch_error"] = BC.err(e)
    if M <= SWEEP_MAX_M:
        alts = {}
        for b in G.BLOCK_MS:
            for tl in tiles_of(b):
                try:
                    alts[tile_name(b, tl)] = graph_ms(c.vkc(b, tl), vkc=True, n_sets=n_sets, inner=INNER,
                                                      reps=10) * 1e3
                except Exception as e:  # noqa: BLE001
                    alts[tile_name(b, tl)] = BC.err(e)
        BC.best_alternative(row, alts)
    del c
    return row


def main(out_path: str) -> None:
    ms = MS
    if len(sys.argv) > 2:
        ms = tuple(int(v) for v in sys.argv[2].split(","))
    copy_tbs = BC.measured_copy_tbs()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = torch.Generator(device="cuda").manual_seed(7)
    w1 = (torch.randn(E, 2 * I, H, device="cuda", generator=g) * H ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, device="cuda", generator=g) * I ** -0.5).to(torch.bfloat16)
    G.load_kernels()
    rows, cmp = [], BC.Comparisons()
    lim = f"active-expert weights + activations at {BC.HBM_NOMINAL_TBS} TB/s nominal"
    for M in ms:
        try:
            r = bench_case(M, w1, w2, copy_tbs, num_sms)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            r = {"M": M, "error": BC.err(e)}
        rows.append(r)
        print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if k != "alternatives"},
              flush=True)
        case = f"35B-A3B experts M={M}"
        cmp.add("moe_grouped", case, "device", "grouped_gemm_x2", r.get("vkc_graph_us"), "torch_grouped_mm_x2",
                r.get("torch_gemms_graph_us"), unit="us", pct_limit=r.get("pct_floor"), limit=lim)
        cmp.add("moe_grouped", case, "device", "grouped_gemm_x2", r.get("vkc_graph_us"),
                "torch_grouped_mm_x2_silu", r.get("torch_gemms_act_graph_us"), unit="us",
                pct_limit=r.get("pct_floor"), limit=lim)
        BC.write(out_path, BC.result("moe_grouped", method=method(graph_defaults={"inner": INNER, "reps": REPS}),
                                     limits=BC.hbm_limits(copy_tbs), rows=rows, comparisons=cmp))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
