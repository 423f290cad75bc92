"""The MoE block of Qwen3.6-35B-A3B (vkc_runtime.ops.moe) on the H200: E = 256 routed experts + the shared one
folded in as expert 256 (E' = 257, k' = 9), H = 2048, I = 512, M in {1, 16, 256, 2048, 8192} tokens; graph vs
graph (device time), CUDA events.

vkc: the whole block (sparse_moe_block: route -> align -> grouped GEMM x2 -> combine; needs
ops/moe/grouped_ops.py, recorded as an error where absent) and its pieces (route, align, combine).
torch's pieces with the same routing: the router (F.linear + fp32 softmax + topk + renormalise + the shared
gate), the grouping (stable argsort of the expert ids, counts by scatter_add, cumsum offsets, a row gather),
torch._grouped_mm x2 with SiLU-and-mul between, and the combine (un-permute, weighted fp32 sum); and all of
them in sequence ("torch_block").
Paths (rows ``op: moe_block_paths``, M in PATH_MS = 1, 2, 4, 8, 16, first): the block's decode path (route ->
decode_gate_up -> decode_down, ops/moe/decode_ops.py) and its grouped path (route -> align -> grouped GEMMs ->
combine) forced with ``path=`` on the same inputs, side by side with the floor and % of it, the path the rule
(``DECODE_MAX_M``) takes, the decode path's pieces, and each compiled decode tile forced (``alternatives``:
gate_up / down alone, on the routing of the set): the figures to set DECODE_MAX_M and the tile rule from.
``decode_pair_bytes``: what the decode kernels would read if no pair's weights came from L2 (pairs x expert).
Router tiles (rows ``op: moe_route_tiles``, M in ROUTE_MS): moe.route with each logits kernel forced
(route.logits.small / .large through ops/moe/common.py SMALL_M) and the kernel the rule picks: the crossover
SMALL_M is set from.
Floor: the active weights (distinct experts hit, averaged over the input sets, x (2I*H + H*I) bf16) plus the
router weight, x and out, read once at 4.26 TB/s (the H200's measured copy bandwidth; the run's own copy
measurement is recorded too). Inputs: n_sets token sets (randn), rotated so that the weights of a set are not
in L2 when it runs. Quantized experts (rows ``op: moe_block_nvfp4`` / ``moe_block_fp8``, ``nvfp4`` and / or ``fp8``
on the command line: only these rows; ``nvfp4_mma``: the NVFP4 experts packed into the MMA layout,
ops.moe.Nvfp4MmaExperts): the block with ops.moe.Nvfp4Experts (W4A16) or Fp8Experts (W8A16) vs the same
block on the dequantized bf16 weights, same inputs, and at M = 1 each decode tile of the kind forced; the floor
counts the kind's bytes per active weight (NVFP4 4.5 bits, FP8 8 bits + block scales).
Usage: python benchmarks/bench_moe.py OUT.json [paths | nvfp4 | nvfp4_mma | fp8 ...]
"""
from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.nn.functional as F

from vkc_runtime.ops import moe
from vkc_runtime.ops.moe.w8a8_ops import TILES as W8A8_TILES

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as BC  # noqa: E402
from timing import graph_ms, method  # noqa: E402

E, K, H, I = 256, 8, 2048, 512
EP, KOUT = E + 1, K + 1
MS = (1, 16, 256, 2048, 8192)
PATH_MS = (1, 2, 4, 8, 16)
if os.environ.get("VKC_BENCH_PATH_MS"):  # a subset of PATH_MS (quick A/B runs of the decode kernels)
    PATH_MS = tuple(int(m) for m in os.environ["VKC_BENCH_PATH_MS"].split(","))
ROUTE_MS = (16, 32, 64, 128, 256, 512, 1024, 2048, 8192)
FLOOR_TBS = 4.26
GRAPH_INNER = 10
LIMIT = "active-weight HBM floor: distinct experts' weights + router + x + out at 4.26 TB/s"
EXPERT_BYTES = (2 * I * H + H * I) * 2


def torch_route(x, gw, sg):
    p = torch.softmax(F.linear(x, gw).float(), dim=-1)
    w, ids = torch.topk(p, K, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    ids = torch.cat([ids, torch.full_like(ids[:, :1], E)], 1)
    w = torch.cat([w, torch.sigmoid(F.linear(x, sg).float())], 1)
    return ids, w


def torch_group(ids):
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(EP, dtype=torch.int32, device=ids.device).scatter_add_(0, flat.long(), torch.ones_like(
        flat, dtype=torch.int32))
    return order, torch.cumsum(counts, 0, dtype=torch.int32)


def torch_experts(x, order, offs, w1t, w2t):
    xs = x[order // KOUT]
    h = torch._grouped_mm(xs, w1t, offs=offs)
    h = F.silu(h[:, :I]) * h[:, I:]
    return torch._grouped_mm(h, w2t, offs=offs)


def torch_combine(y, order, w, M):
    yu = torch.empty_like(y)
    yu[order] = y
    return (yu.view(M, KOUT, H).float() * w[..., None]).sum(1).to(torch.bfloat16)


def _time(row, name, fn, vkc, n_sets):
    try:
        row[f"{name}_graph_us"] = graph_ms(fn, vkc=vkc, n_sets=n_sets, inner=GRAPH_INNER) * 1e3
    except Exception as e:  # noqa: BLE001 - recorded, never replaced by another figure
        row[f"{name}_graph_error"] = BC.err(e)
        traceback.print_exc()


def bench_case(M, W, copy_tbs):
    gw, sg, w1, w2, w1t, w2t = W
    g = torch.Generator(device="cuda").manual_seed(M)
    n_sets = max(2, min(16, -(-int(BC.L2_BYTES * 2.5) // max(1, M * H * 2 + 9 * EXPERT_BYTES))))
    xs = [torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16) for _ in range(n_sets)]
    routes = [torch_route(x, gw, sg) for x in xs]
    groups = [torch_group(ids) for ids, _ in routes]
    active = sum(len(torch.unique(ids)) for ids, _ in routes) / n_sets
    nbytes = active * EXPERT_BYTES + (E + 1) * H * 2 + 2 * M * H * 2
    row = {"op": "moe_block", "M": M, "E": E, "top_k": K, "shared": True, "H": H, "I": I, "n_sets": n_sets,
           "active_experts": active, "bytes": nbytes, "floor_us": nbytes / (FLOOR_TBS * 1e12) * 1e6,
           "floor_copy_us": BC.floor_ms(nbytes, copy_tbs) * 1e3}
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    bm = moe.block_m_for(M, KOUT, EP)
    cap = moe.align_capacity(M * KOUT, EP, bm)
    row["block_m"] = bm
    row["path"] = moe.choose_path(M)
    ids = torch.empty(M, KOUT, dtype=torch.int32, device="cuda")
    wts = torch.empty(M, KOUT, device="cuda")
    st = torch.empty(cap, dtype=torch.int32, device="cuda")
    bt = torch.empty(cap // bm, dtype=torch.int32, device="cuda")
    nt = torch.empty(1, dtype=torch.int32, device="cuda")
    y = torch.randn(M * KOUT, H, device="cuda").to(torch.bfloat16)
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
    rid = [r[0].int().contiguous() for r in routes]
    rw = [r[1].contiguous() for r in routes]

    def v_route(i, s):
        moe.route(xs[i], gw, K, renormalize=True, shared_gate_w=sg, topk_ids=ids, topk_weights=wts, workspace=ws,
                  stream=s)

    def v_align(i, s):
        moe.align(rid[i], EP, bm, sorted_ids=st, block_expert=bt, num_padded=nt, workspace=ws, stream=s)

    def v_combine(i, s):
        moe.combine(y, rid[i], rw[i], EP, out=out, stream=s)

    def v_block(i, s):
        moe.sparse_moe_block(xs[i], gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out,
                             stream=s)

    for name, fn in (("vkc_route", v_route), ("vkc_align", v_align), ("vkc_combine", v_combine),
                     ("vkc_block", v_block)):
        _time(row, name, fn, True, n_sets)

    res = {}

    def t_route(i, s):
        res["r"] = torch_route(xs[i], gw, sg)

    def t_group(i, s):
        res["g"] = torch_group(routes[i][0])

    def t_experts(i, s):
        order, offs = groups[i]
        res["y"] = torch_experts(xs[i], order, offs, w1t, w2t)

    def t_combine(i, s):
        res["o"] = torch_combine(y, groups[i][0], rw[i], M)

    def t_block(i, s):
        ids_, w_ = torch_route(xs[i], gw, sg)
        order, offs = torch_group(ids_)
        res["o"] = torch_combine(torch_experts(xs[i], order, offs, w1t, w2t), order, w_, M)

    for name, fn in (("torch_route", t_route), ("torch_group", t_group), ("torch_grouped_mm", t_experts),
                     ("torch_combine", t_combine), ("torch_block", t_block)):
        _time(row, name, fn, False, n_sets)
    if "vkc_block_graph_us" in row:
        row["vkc_pct_floor"] = BC.pct(row["floor_us"], row["vkc_block_graph_us"])
        row["vkc_pct_floor_copy"] = BC.pct(row["floor_copy_us"], row["vkc_block_graph_us"])
        if "torch_block_graph_us" in row:
            row["speedup_vs_torch_block"] = row["torch_block_graph_us"] / row["vkc_block_graph_us"]
        try:  # the block's output vs torch's pieces on set 0 (same function up to routing near-ties)
            v_block(0, None)
            t_block(0, None)
            torch.cuda.synchronize()
            row["rel_err_vs_torch"] = BC.rel_err(out, res["o"])
        except Exception as e:  # noqa: BLE001
            row["rel_err_error"] = BC.err(e)
    return row


def _sets(M, W):
    gw, sg = W[0], W[1]
    g = torch.Generator(device="cuda").manual_seed(1000 + M)
    n_sets = max(2, min(16, -(-int(BC.L2_BYTES * 2.5) // max(1, M * H * 2 + 9 * EXPERT_BYTES))))
    xs = [torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16) for _ in range(n_sets)]
    routes = [torch_route(x, gw, sg) for x in xs]
    return n_sets, xs, routes


def bench_paths(M, W, copy_tbs):
    """The decode and grouped paths of the block at M tokens, same inputs (module doc)."""
    gw, sg, w1, w2 = W[:4]
    n_sets, xs, routes = _sets(M, W)
    active = sum(len(torch.unique(ids)) for ids, _ in routes) / n_sets
    nbytes = active * EXPERT_BYTES + (E + 1) * H * 2 + 2 * M * H * 2
    row = {"op": "moe_block_paths", "M": M, "E": E, "top_k": K, "shared": True, "H": H, "I": I, "n_sets": n_sets,
           "active_experts": active, "bytes": nbytes, "decode_pair_bytes": M * KOUT * EXPERT_BYTES,
           "floor_us": nbytes / (FLOOR_TBS * 1e12) * 1e6, "floor_copy_us": BC.floor_ms(nbytes, copy_tbs) * 1e3,
           "rule_path": moe.choose_path(M), "decode_max_m": moe.DECODE_MAX_M}
    ws = moe.moe_workspace(M, E, K, H, I, shared=True)
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
    h = torch.empty(M * KOUT, I, dtype=torch.bfloat16, device="cuda")
    rid = [r[0].int().contiguous() for r in routes]
    rw = [r[1].contiguous() for r in routes]
    outs = {}
    for path in moe.PATHS:
        def blk(i, s, path=path):
            moe.sparse_moe_block(xs[i], gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out,
                                 stream=s, path=path)
        _time(row, path, blk, True, n_sets)
        try:
            blk(0, None)
            torch.cuda.synchronize()
            outs[path] = out.clone()
        except Exception as e:  # noqa: BLE001
            row[f"{path}_run_error"] = BC.err(e)
    if len(outs) == 2:
        row["rel_err_decode_vs_grouped"] = BC.rel_err(outs["decode"], outs["grouped"])
    for key in ("decode", "grouped"):
        t = row.get(f"{key}_graph_us")
        if t:
            row[f"{key}_pct_floor"] = BC.pct(row["floor_us"], t)
    if row.get("decode_graph_us") and row.get("grouped_graph_us"):
        row["grouped_over_decode"] = row["grouped_graph_us"] / row["decode_graph_us"]
    from vkc_runtime.ops.moe import decode_ops as D
    ids = torch.empty(M, KOUT, dtype=torch.int32, device="cuda")
    wts = torch.empty(M, KOUT, device="cuda")

    def v_route(i, s):
        moe.route(xs[i], gw, K, renormalize=True, shared_gate_w=sg, topk_ids=ids, topk_weights=wts, workspace=ws,
                  stream=s)
    _time(row, "route", v_route, True, n_sets)
    alts = {}
    for kind, tiles in D.TILES.items():
        for tile in tiles:
            if kind == "gate_up":
                def fn(i, s, tile=tile):
                    moe.decode_gate_up(xs[i], w1, rid[i], out=h, stream=s, _tile=tile)
            else:
                def fn(i, s, tile=tile):
                    moe.decode_down(h, w2, rid[i], rw[i], out=out, stream=s, _tile=tile)
            sub = {}
            _time(sub, "t", fn, True, n_sets)
            alts[D._base(kind, tile)] = sub.get("t_graph_us", sub.get("t_graph_error"))
            if tile == tiles[0] and "t_graph_us" in sub:
                row[f"decode_{kind}_graph_us"] = sub["t_graph_us"]
    row["alternatives"] = alts
    return row


def bench_route_tiles(M, W):
    """moe.route with each logits kernel forced (module doc); a fresh workspace per kernel, so that no bound
    call of the other kernel is replayed."""
    from vkc_runtime.ops.moe import common
    gw, sg = W[0], W[1]
    n_sets, xs, _ = _sets(M, W)
    row = {"op": "moe_route_tiles", "M": M, "E": E, "top_k": K, "H": H, "n_sets": n_sets,
           "rule_kernel": common.logits_size(M), "rule_small_m": common.RULE_SMALL_M, "small_m": common.SMALL_M}
    ids = torch.empty(M, KOUT, dtype=torch.int32, device="cuda")
    wts = torch.empty(M, KOUT, device="cuda")
    orig = common.SMALL_M
    for size, small_m in (("small", 1 << 30), ("large", 0)):
        common.SMALL_M = small_m  # before the workspace: its router scratch is sized for the kernel taken
        try:
            ws = moe.moe_workspace(M, E, K, H, I, shared=True)

            def fn(i, s, ws=ws):
                moe.route(xs[i], gw, K, renormalize=True, shared_gate_w=sg, topk_ids=ids, topk_weights=wts,
                          workspace=ws, stream=s)
            _time(row, size, fn, True, n_sets)
        finally:
            common.SMALL_M = orig
    if row.get("small_graph_us") and row.get("large_graph_us"):
        row["large_over_small"] = row["large_graph_us"] / row["small_graph_us"]
    print("route tiles", {k: v for k, v in row.items() if k in ("M", "small_graph_us", "large_graph_us",
                                                                "large_over_small", "rule_kernel")})
    return row


def _print_paths(rows):
    print(f"{'M':>4}{'floor':>8}{'decode':>8}{'%fl':>6}{'grouped':>9}{'%fl':>6}{'g/d':>6}{'route':>7}{'gate_up':>8}"
          f"{'down':>7}  rule")
    for r in rows:
        def f(k):
            v = r.get(k)
            return f"{v:.1f}" if isinstance(v, float) else "-"
        print(f"{r['M']:>4}{f('floor_us'):>8}{f('decode_graph_us'):>8}{f('decode_pct_floor'):>6}"
              f"{f('grouped_graph_us'):>9}{f('grouped_pct_floor'):>6}{f('grouped_over_decode'):>6}"
              f"{f('route_graph_us'):>7}{f('decode_gate_up_graph_us'):>8}{f('decode_down_graph_us'):>7}  "
              f"{r['rule_path']}  {r.get('alternatives')}")


def random_weights(seed: int = 1):
    """The block's random bf16 weights (router gw [E, H], shared gate sg [1, H], w1 [E', 2I, H], w2 [E', H, I])
    and the generator they came from (benchmarks/ncu_case.py draws its x from it)."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return (torch.randn(*shape, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    return (rnd(E, H), rnd(1, H), rnd(EP, 2 * I, H), rnd(EP, H, I)), g


QUANT_MS = (1, 2, 4, 8, 16, 256, 2048, 8192)
if os.environ.get("VKC_BENCH_MS"):  # a subset of the M list (quick runs)
    QUANT_MS = tuple(int(m) for m in os.environ["VKC_BENCH_MS"].split(","))
# bytes a weight: NVFP4 codes + e4m3 group scales (4.5 bits); FP8 e4m3 + fp32 128 x 128 block scales
QUANT_BYTES_PER_WEIGHT = {"nvfp4": 9 / 16, "nvfp4_mma": 9 / 16, "fp8": 1 + 4 / 128 ** 2}


def quant_weights(kind: str, seed: int = 2):
    """Random quantized experts of ``kind`` as moe.Nvfp4Experts (codes any byte, e4m3 group scales 0.25 .. 0.94,
    alpha 2^-7; "nvfp4_mma": the same packed into the MMA layout, moe.Nvfp4MmaExperts) or moe.Fp8Experts (finite
    e4m3 bytes, block scales 2^-7), and the same weights dequantized to bf16 [E', R, K] (exact: powers-of-two
    multipliers)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    table = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], device="cuda")
    out = []
    for R, K_, na in ((2 * I, H, 2), (H, I, 1)):
        if kind in ("nvfp4", "nvfp4_mma"):
            codes = torch.randint(0, 256, (EP, R, K_ // 2), dtype=torch.uint8, device="cuda", generator=g)
            scales = torch.randint(0x28, 0x38, (EP, R, K_ // 16), dtype=torch.uint8, device="cuda", generator=g)
            alpha = torch.full((EP, na), 2.0 ** -7, device="cuda")
            vals = torch.stack([table[(codes & 15).long()], table[(codes >> 4).long()]], -1).reshape(EP, R, K_)
            vals = vals * scales.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=-1)
            w = moe.Nvfp4Experts(codes, scales, alpha)
            if kind == "nvfp4_mma":
                ws_, ss_ = moe.nvfp4_mma_shapes(EP, R, K_)
                w = moe.pack_experts(w, torch.empty(ws_, dtype=torch.int32, device="cuda"),
                                     torch.empty(ss_, dtype=torch.int32, device="cuda"), gate_up=na == 2)
                del codes, scales
        else:
            q = torch.randint(0, 256, (EP, R, K_), dtype=torch.uint8, device="cuda", generator=g)
            q[(q & 0x7F) == 0x7F] = 0x3C
            scale = torch.full((EP, R // 128, -(-K_ // 128)), 2.0 ** -7, device="cuda")
            vals = q.view(torch.float8_e4m3fn).float()
            w = moe.Fp8Experts(q, scale)
        out.append((w, (vals * 2.0 ** -7).to(torch.bfloat16)))
        del vals
    return out


def bench_quant(kind, M, gw, sg, q1, q2, d1, d2, copy_tbs):
    """The block with ``kind`` experts (the rule's path) vs the same block on the dequantized bf16 weights, same
    inputs; at M = 1 each compiled decode tile of the kind's kernels forced."""
    n_sets, xs, routes = _sets(M, (gw, sg))
    active = sum(len(torch.unique(ids)) for ids, _ in routes) / n_sets
    nbytes = active * 3 * I * H * QUANT_BYTES_PER_WEIGHT[kind] + (E + 1) * H * 2 + 2 * M * H * 2
    row = {"op": f"moe_block_{kind}", "M": M, "E": E, "top_k": K, "shared": True, "H": H, "I": I, "n_sets": n_sets,
           "active_experts": active, "bytes": nbytes, "floor_us": nbytes / (FLOOR_TBS * 1e12) * 1e6,
           "floor_copy_us": BC.floor_ms(nbytes, copy_tbs) * 1e3, "path": moe.choose_path(M, kind)}
    ws = moe.moe_workspace(M, E, K, H, I, shared=True, w8a8=kind == "fp8")
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
    outs = {}
    for name, w1, w2 in ((kind, q1, q2), ("bf16", d1, d2)):
        def blk(i, s, w1=w1, w2=w2):
            moe.sparse_moe_block(xs[i], gw, w1, w2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out,
                                 stream=s)
        _time(row, name, blk, True, n_sets)
        try:
            blk(0, None)
            torch.cuda.synchronize()
            outs[name] = out.clone()
        except Exception as e:  # noqa: BLE001
            row[f"{name}_run_error"] = BC.err(e)
    if M <= 16:  # both paths forced (the DECODE_MAX_M rule per kind)
        for path in moe.PATHS:
            def blk(i, s, path=path):
                moe.sparse_moe_block(xs[i], gw, q1, q2, K, renormalize=True, shared_gate_w=sg, workspace=ws,
                                     out=out, stream=s, path=path)
            _time(row, f"{kind}_{path}", blk, True, n_sets)
    if len(outs) == 2:
        row[f"rel_err_{kind}_vs_bf16"] = BC.rel_err(outs[kind], outs["bf16"])
    if row.get(f"{kind}_graph_us"):
        row[f"{kind}_pct_floor"] = BC.pct(row["floor_us"], row[f"{kind}_graph_us"])
        if row.get("bf16_graph_us"):
            row[f"bf16_over_{kind}"] = row["bf16_graph_us"] / row[f"{kind}_graph_us"]
    if M == 1:
        from vkc_runtime.ops.moe import decode_ops as D, experts as X
        rid = [r[0].int().contiguous() for r in routes]
        rw = [r[1].contiguous() for r in routes]
        h = torch.empty(M * KOUT, I, dtype=torch.bfloat16, device="cuda")
        alts = {}
        for part in ("gate_up", "down"):
            for tile in X.module(kind).TILES[part]:
                if part == "gate_up":
                    def fn(i, s, tile=tile):
                        D.decode_gate_up(xs[i], q1, rid[i], out=h, stream=s, _tile=tile)
                else:
                    def fn(i, s, tile=tile):
                        D.decode_down(h, q2, rid[i], rw[i], out=out, stream=s, _tile=tile)
                sub = {}
                _time(sub, "t", fn, True, n_sets)
                alts[X.module(kind).base(part, tile)] = sub.get("t_graph_us", sub.get("t_graph_error"))
        row["alternatives"] = alts
    if kind == "fp8" and M >= 2:  # every grouped mode forced (the W8A8 rule's data; M 2-4: vs the decode path)
        row["fp8_modes"] = _fp8_modes(M, gw, sg, q1, q2, ws, xs, out, outs.get("bf16"), n_sets)
    if kind == "fp8" and M >= 256:
        row["w8a8_kernels"] = _w8a8_kernels(M, ws, xs, routes, q1, q2, n_sets)
    if M >= 256:  # each compiled grouped tile of the kind forced, both GEMMs, on the first set's grouping
        row["grouped_alternatives"] = _grouped_tiles(kind, M, ws, xs, routes, q1, q2, n_sets)
    print(kind, {k: v for k, v in row.items() if k in ("M", "floor_us", f"{kind}_graph_us", "bf16_graph_us",
                                                      f"{kind}_pct_floor", f"rel_err_{kind}_vs_bf16",
                                                      f"{kind}_decode_graph_us", f"{kind}_grouped_graph_us",
                                                      "alternatives")})
    return row


def _fp8_modes(M, gw, sg, q1, q2, ws, xs, out, ref, n_sets) -> dict:
    """The grouped path with FP8 experts in each mode (W8A16, W8A8 with h quantized in the gate_up epilogue or by its
    own launch) at block_m 64 and 128, forced: graph device time and the relative error vs the bf16 block."""
    res = {}
    for bm in (64, 128):
        for mode in moe.FP8_MODES:
            if mode == "w8a8" and not W8A8_TILES[bm]["gate_up_q"]:
                continue

            def blk(i, s, bm=bm, mode=mode):
                moe.sparse_moe_block(xs[i], gw, q1, q2, K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out,
                                     stream=s, path="grouped", _fp8_mode=mode, _block_m=bm)
            sub = {}
            _time(sub, "t", blk, True, n_sets)
            r = res[f"{mode}.m{bm}"] = {"graph_us": sub.get("t_graph_us", sub.get("t_graph_error"))}
            try:
                blk(0, None)
                torch.cuda.synchronize()
                if ref is not None:
                    r["rel_err_vs_bf16"] = BC.rel_err(out, ref)
            except Exception as e:  # noqa: BLE001
                r["run_error"] = BC.err(e)
    print("fp8 modes", M, res)
    return res


def _grouping(M, bm, ws, routes):
    """sorted_ids, block_expert, num_padded of the first input set's routing at block_m ``bm``."""
    cap = moe.align_capacity(M * KOUT, EP, bm)
    st, bt = (torch.empty(n, dtype=torch.int32, device="cuda") for n in (cap, cap // bm))
    nt = torch.empty(1, dtype=torch.int32, device="cuda")
    moe.align(routes[0][0].int().contiguous(), EP, bm, sorted_ids=st, block_expert=bt, num_padded=nt, workspace=ws)
    return st, bt, nt


def _w8a8_kernels(M, ws, xs, routes, q1, q2, n_sets) -> dict:
    """Graph device time of each W8A8 launch alone (the x / h quantizer, each compiled gate_up and down tile) at
    block_m 64 and 128 on the first input set's grouping (the block's own per-launch split)."""
    from vkc_runtime.ops import gemm_fp8 as G8
    from vkc_runtime.ops.moe import w8a8_ops as W
    P = M * KOUT
    xq = torch.empty(M, H, dtype=torch.uint8, device="cuda")
    xsc = torch.empty(M, H // 128, dtype=torch.float32, device="cuda")
    h = torch.empty(P, I, dtype=torch.bfloat16, device="cuda")
    hq = torch.empty(P, I, dtype=torch.uint8, device="cuda")
    hs = torch.empty(P, I // 128, dtype=torch.float32, device="cuda")
    y = torch.empty(P, H, dtype=torch.bfloat16, device="cuda")
    G8.quantize_fp8_per_token_group(xs[0], xq, xsc)
    G8.quantize_fp8_per_token_group(h.normal_(), hq, hs)
    res = {}
    for name, fn in (("quant_x", lambda i, s: G8.quantize_fp8_per_token_group(xs[i], xq, xsc, stream=s)),
                     ("quant_h", lambda i, s: G8.quantize_fp8_per_token_group(h, hq, hs, stream=s))):
        sub = {}
        _time(sub, "t", fn, True, n_sets)
        res[name] = sub.get("t_graph_us", sub.get("t_graph_error"))
    for bm, per in W.TILES.items():
        st, bt, nt = _grouping(M, bm, ws, routes)
        for kn, bns in per.items():
            for bn in bns:
                def fn(i, s, bm=bm, kn=kn, bn=bn, st=st, bt=bt, nt=nt):
                    if kn == "down":
                        W.grouped_gemm_w8a8(hq, hs, q2, st, bt, nt, a_row_div=1, out=y, block_m=bm, stream=s, _tile=bn)
                    else:
                        q = kn == "gate_up_q"
                        W.grouped_gemm_w8a8(xq, xsc, q1, st, bt, nt, a_row_div=KOUT, out=hq if q else h,
                                            out_scale=hs if q else None, block_m=bm, act="silu_mul", stream=s,
                                            _tile=bn)
                sub = {}
                _time(sub, "t", fn, True, n_sets)
                res[W.base(bm, bn, kn)] = sub.get("t_graph_us", sub.get("t_graph_error"))
    print("w8a8 kernels", M, res)
    return res


def _grouped_tiles(kind, M, ws, xs, routes, q1, q2, n_sets) -> dict:
    """Graph device time of each compiled grouped tile of ``kind`` (gate_up with SiLU-and-mul, then down) at the
    rule's block_m, on the grouping of the first input set."""
    from vkc_runtime.ops.moe import experts as X, grouped_ops as G
    bm = moe.block_m_for(M, KOUT, EP)
    st, bt, nt = _grouping(M, bm, ws, routes)
    h = torch.empty(M * KOUT, I, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(M * KOUT, H, dtype=torch.bfloat16, device="cuda")
    alts = {}
    for act, w, a, o, div in (("silu_mul", q1, xs[0], h, KOUT), (None, q2, h, y, 1)):
        for tile in X.module(kind).TILES["grouped"][bm][act]:
            def fn(i, s, tile=tile, act=act, w=w, a=a, o=o, div=div):
                G.grouped_gemm(a, w, st, bt, nt, a_row_div=div, out=o, block_m=bm, act=act, stream=s, _tile=tile)
            sub = {}
            _time(sub, "t", fn, True, n_sets)
            alts[X.module(kind).base("grouped", tile, bm, act)] = sub.get("t_graph_us", sub.get("t_graph_error"))
    return alts


def main_quant(out_path: str, kinds) -> None:
    """The quantized-expert rows only (``nvfp4`` / ``fp8`` on the command line)."""
    torch.manual_seed(0)
    copy_tbs = BC.measured_copy_tbs()
    (gw, sg, _, _), _ = random_weights()
    rows, cmp = [], BC.Comparisons()
    for kind in kinds:
        (q1, d1), (q2, d2) = quant_weights(kind)
        for M in QUANT_MS:
            r = bench_quant(kind, M, gw, sg, q1, q2, d1, d2, copy_tbs)
            rows.append(r)
            cmp.add("moe", f"M={M} E={E}+1 k={K} H={H} I={I} {kind} experts", "device", f"sparse_moe_block[{kind}]",
                    r.get(f"{kind}_graph_us"), "sparse_moe_block[bf16 dequantized]", r.get("bf16_graph_us"),
                    unit="us", pct_limit=r.get(f"{kind}_pct_floor"),
                    limit=f"active-weight HBM floor ({kind} bytes: codes + scales) + router + x + out at 4.26 TB/s")
        del q1, q2, d1, d2
        torch.cuda.empty_cache()
    meth = method(graph_used={"inner": GRAPH_INNER, "reps": 20},
                  inputs="n_sets rotating randn token sets; random codes, scales, multipliers 2^-7",
                  peer="the same block (vkc) on the dequantized bf16 weights")
    limits = {**BC.hbm_limits(copy_tbs), "hbm_used_for_pct_limit": "4.26 TB/s (H200 measured copy, fixed)"}
    BC.write(out_path, BC.result("moe", method=meth, limits=limits, rows=rows, comparisons=cmp))


def main(out_path: str, only_paths: bool = False) -> None:
    torch.manual_seed(0)
    copy_tbs = BC.measured_copy_tbs()
    (gw, sg, w1, w2), _ = random_weights()
    W = (gw, sg, w1, w2, w1.transpose(1, 2), w2.transpose(1, 2))
    rows, cmp = [], BC.Comparisons()
    for M in PATH_MS:
        r = bench_paths(M, W, copy_tbs)
        rows.append(r)
        cmp.add("moe", f"M={M} E={E}+1 k={K} H={H} I={I}", "device", "sparse_moe_block[decode]",
                r.get("decode_graph_us"), "sparse_moe_block[grouped]", r.get("grouped_graph_us"), unit="us",
                pct_limit=BC.pct(r["floor_us"], r.get("decode_graph_us")), limit=LIMIT)
    path_rows = list(rows)
    _print_paths(path_rows)
    route_rows = [] if only_paths else [bench_route_tiles(M, W) for M in ROUTE_MS]
    for M in () if only_paths else MS:
        r = bench_case(M, W, copy_tbs)
        rows.append(r)
        case = f"M={M} E={E}+1 k={K} H={H} I={I}"
        pl = BC.pct(r["floor_us"], r.get("vkc_block_graph_us"))
        cmp.add("moe", case, "device", "sparse_moe_block", r.get("vkc_block_graph_us"), "torch_block",
                r.get("torch_block_graph_us"), unit="us", pct_limit=pl, limit=LIMIT)
        for piece, peer in (("route", "torch_route"), ("align", "torch_group"), ("combine", "torch_combine")):
            cmp.add("moe", case, "device", f"moe.{piece}", r.get(f"vkc_{piece}_graph_us"), peer,
                    r.get(f"{peer}_graph_us"), unit="us")
    rows += route_rows
    meth = method(graph_used={"inner": GRAPH_INNER, "reps": 20},
                  inputs="n_sets rotating randn token sets (different routings, so a set's experts are not in L2)",
                  peer="torch pieces: F.linear + softmax + topk router, argsort grouping, torch._grouped_mm x2, "
                       "un-permute + weighted sum")
    limits = {**BC.hbm_limits(copy_tbs), "hbm_used_for_pct_limit": "4.26 TB/s (H200 measured copy, fixed)"}
    BC.write(out_path, BC.result("moe", method=meth, limits=limits, rows=rows, comparisons=cmp))
    print(f"{'M':>5}{'floor':>8}{'block':>8}{'%fl':>6}{'route':>7}{'align':>7}{'comb':>7}{'t_blk':>8}{'t_mm':>8}"
          f"{'x':>6}")
    _print_paths(path_rows)
    for r in rows[len(path_rows):len(rows) - len(route_rows)]:
        def f(k):
            v = r.get(k)
            return f"{v:.1f}" if isinstance(v, float) else "-"
        print(f"{r['M']:>5}{f('floor_us'):>8}{f('vkc_block_graph_us'):>8}{f('vkc_pct_floor'):>6}"
              f"{f('vkc_route_graph_us'):>7}{f('vkc_align_graph_us'):>7}{f('vkc_combine_graph_us'):>7}"
              f"{f('torch_block_graph_us'):>8}{f('torch_grouped_mm_graph_us'):>8}{f('speedup_vs_torch_block'):>6}")


if __name__ == "__main__":
    quant = [k for k in ("nvfp4", "nvfp4_mma", "fp8") if k in sys.argv[2:]]
    if quant:
        main_quant(sys.argv[1], quant)
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "bench_moe.json", only_paths="paths" in sys.argv[2:])
