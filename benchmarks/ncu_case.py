"""A workload for Nsight Compute (tools/gpu/run.sh ncu): one warm call of an op, bracketed by
cudaProfilerStart/Stop so `ncu --profile-from-start off` sees only that call's kernels.

usage: python benchmarks/ncu_case.py gdn <T> <hk> <hv>      (chunked GDN prefill, one sequence of T tokens)
       python benchmarks/ncu_case.py decode <B> <L>           (attention decode, 24/4 x 256, block 16)
       python benchmarks/ncu_case.py prefill <Hq> <Hkv> <T>  (causal attention prefill x 256, one sequence,
                                     block 64: the TMA kernel on sm_90a)
       python benchmarks/ncu_case.py engine <shape> <B> [eager|graph]   (one decode step of bench_engine's
                                     model shape with random weights, B sequences; graph: the step's CUDA graph
                                     replayed, which ncu profiles node by node; the eager mode ran on the H200 in session 12, the graph
                                     mode not yet; ncu backs the KV cache up per replay pass, so give ncu
                                     --replay-mode application or profile one kernel with --launch-count)
       python benchmarks/ncu_case.py moe <M> [decode|grouped] [nvfp4|nvfp4_mma|fp8]  (the 35B-A3B MoE block,
                                     sparse_moe_block on M tokens, random weights: ~1.6 GB, no engine; the path the
                                     rule takes unless named; nvfp4 / fp8: the experts quantized, bench_moe's)
       python benchmarks/ncu_case.py gemm_fp8 <tensor|block> <M> <N> <K> [tile]
                                     (the FP8 GEMM on the CuTe lane, random e4m3 operands and bench_gemm_fp8's
                                     scales; tile "N" or "MxN" forces the CuTe tile 128 x N / M x N, else the
                                     op's rule)
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _engine_step(shape: str, B: int, graphs: bool = False):
    """One pure-decode step of B sequences (eager: every kernel a launch of its own; graph: the replayed step)."""
    import json
    import tempfile
    from pathlib import Path

    import bench_engine
    from vkc_engine import LLM, SamplingParams
    d = tempfile.mkdtemp()
    (Path(d) / "config.json").write_text(json.dumps(bench_engine.SHAPES[shape]))
    llm = LLM(d, load_format="dummy", max_num_seqs=B, max_num_batched_tokens=max(64, B), max_model_len=128,
              memory_fraction=0.3, enforce_eager=not graphs)
    V = llm.cfg.vocab_size
    sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for b in range(B):
        llm.add_request([(7 * b + j) % V for j in range(16)], sp)
    llm.step()  # the prefill
    llm.step()  # one warm decode step
    bench_engine._sync(llm)

    def call():
        llm.step()
        bench_engine._sync(llm)
    return call


def _moe_block(M: int, path, kind=None):
    """One sparse_moe_block call at bench_moe's 35B-A3B shape (E = 256 + the shared expert, top-8, H 2048, I 512);
    ``kind`` nvfp4 / fp8: the experts quantized (bench_moe.quant_weights)."""
    import bench_moe as BM
    from vkc_runtime.ops import moe
    (gw, sg, w1, w2), g = BM.random_weights()
    if kind is not None:
        (w1, _), (w2, _) = BM.quant_weights(kind)
    x = torch.randn(M, BM.H, device="cuda", generator=g).to(torch.bfloat16)
    ws = moe.moe_workspace(M, BM.E, BM.K, BM.H, BM.I, shared=True)
    out = torch.empty(M, BM.H, dtype=torch.bfloat16, device="cuda")

    def call():
        moe.sparse_moe_block(x, gw, w1, w2, BM.K, renormalize=True, shared_gate_w=sg, workspace=ws, out=out,
                             path=path)
    return call


def _gemm_fp8(kind: str, M: int, N: int, K: int, tile: str | None):
    """One CuTe-lane FP8 GEMM: per-tensor scales (``tensor``) or 128 x 128 weight blocks (``block``); ``tile``
    ("128" or "192x128") forces the kernel's tile."""
    from vkc_runtime.ops import gemm_fp8 as G
    f8 = torch.float8_e4m3fn
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, K, device="cuda", generator=g) * 16).clamp(-448, 448).to(f8)
    w = (torch.randn(N, K, device="cuda", generator=g) * 16).clamp(-448, 448).to(f8)
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    if tile is not None:
        tm, _, tn = tile.rpartition("x")
        if kind == "block":
            G._cute.pick_block_tile = lambda m, n, s: (int(tm or 128), int(tn))
        else:
            G._cute.pick_tile = lambda m, n, s, tiles=None: int(tn)
    if kind == "block":
        xs = torch.rand(M, -(-K // 128), device="cuda", generator=g) + 0.5
        ws = torch.rand(-(-N // 128), -(-K // 128), device="cuda", generator=g) * 1e-3 + 1e-3
        return lambda: G.linear_fp8_block(x, xs, w, ws, out, _lane="cute")
    st = torch.full((1,), 1e-3, device="cuda")
    return lambda: G.linear_fp8(x, st, w, st, out, _lane="cute")


def main(argv):
    what = argv[0]
    if what == "gdn":
        import bench_gdn
        T, hk, hv = (int(x) for x in argv[1:4])
        call, _, _ = bench_gdn.vkc_case([T], hk, hv)
    elif what == "decode":
        import bench_attn
        from vkc_runtime.ops import attn as A
        B, L = int(argv[1]), int(argv[2])
        kc, vc, bt, _, _, q, sl, out = bench_attn.decode_inputs(B, L, dense=False)

        def call():
            A.decode(q, kc, vc, bt, sl, 256 ** -0.5, out=out, max_seq_len=L)
    elif what == "prefill":
        import bench_attn
        from vkc_runtime.ops import attn as A
        Hq, Hkv, T = (int(x) for x in argv[1:4])
        kc, vc, bt, _, _ = bench_attn.paged(1, T, Hkv, 256, bs=64, dense=False)
        q = torch.randn(T, Hq, 256, device="cuda", dtype=torch.bfloat16)
        cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
        sl = torch.tensor([T], dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)

        def call():
            A.prefill(q, kc, vc, bt, cu, sl, 256 ** -0.5, out=out, max_seqlen_q=T)
    elif what == "moe":
        path = argv[2] if len(argv) > 2 and argv[2] in ("decode", "grouped") else None
        kind = argv[-1] if argv[-1] in ("nvfp4", "nvfp4_mma", "fp8") else None
        call = _moe_block(int(argv[1]), path, kind)
    elif what == "gemm_fp8":
        call = _gemm_fp8(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), argv[5] if len(argv) > 5 else None)
    elif what == "engine":
        call = _engine_step(argv[1], int(argv[2]), graphs=len(argv) > 3 and argv[3] == "graph")
    else:
        raise SystemExit(__doc__)
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(sys.argv[1:])
