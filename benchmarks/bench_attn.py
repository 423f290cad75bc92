"""Attention on the H200: vkc paged prefill / decode vs torch SDPA with native GQA on the same data, de-paged
into contiguous [1|B, Hkv, L, D] K/V (``enable_gqa=True``: K/V are never expanded to the query heads, so
SDPA reads the same bytes as vkc).

prefill: causal, one sequence whose cache holds exactly its T tokens, Hq/Hkv in {24/4, 16/2}, D 256
         (bench_common.attn_prefill_cases); peers SDPA FLASH and CUDNN, each backend forced with
         torch.nn.attention.sdpa_kernel entered once around that peer's whole measurement (warm-up, eager
         timing, capture, replays), never inside a timed call; the kernels each peer ran eagerly and in its
         graph are recorded (*_kernels_*, *_backend_*). vkc at block size 64 (the TMA kernel on sm_90a) through
         prefill() and a PrefillPlan, and at block size 16 (the gather kernel, eager only).
decode:  B x context from bench_common.attn_decode_cases(), 24/4 x 256, block 16 (BENCH_ATTN_DECODE_BS=64: the
         engine's block size, the TMA kernels on sm_90a; row "tma" says which ran); peers SDPA FLASH, EFFICIENT
         and CUDNN (native GQA, q [B, Hq, 1, D]); vkc through decode() and a DecodePlan. HBM floor = K + V +
         q + out bytes at the card's nominal HBM bandwidth (pct_limit) and at the copy bandwidth measured in this
         process (*_pct_copy). At B*L <= 16*4096 also host times, VKC_FASTPATH=0 (validated) times and the
         graph time of each forced split count; then a cProfile of the decode call's host path (printed).
         BENCH_ATTN_DECODE_CASES="64x4096 ..." keeps only those B x L; BENCH_ATTN_SPLITS="1 2 3 ..." sweeps those
         forced split counts (fused and unfused) on every case, large ones included.
Modes (bench_common): device = graph vs graph (vkc_runtime.Graph launched on the capture stream /
torch.cuda.CUDAGraph), eager = events around single calls vs the same for the peer, host = wall clock per call.
Every row's numbers and the flat "comparisons" list go to OUT.json (schema vkc-bench/2).
BENCH_ATTN="prefill decode" (default) selects the parts. Usage: python benchmarks/bench_attn.py OUT.json
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

import torch
import torch.nn.functional as F

from vkc_runtime.ops import attn as A

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as C  # noqa: E402
import timing  # noqa: E402

DEVICE = "cuda"  # the CPU dry run (tests/test_bench_logic.py) sets "cpu"

BS = int(os.environ.get("BENCH_ATTN_DECODE_BS", "16"))  # decode block size (64: the TMA kernels on sm_90a)
DECODE_ONLY = os.environ.get("BENCH_ATTN_DECODE_CASES", "").split()  # e.g. "64x4096 256x4096"
FORCED_SPLITS = [int(s) for s in os.environ.get("BENCH_ATTN_SPLITS", "").split()]
PREFILL_BS = 64
EAGER = {"inner": 1, "reps": 20, "warm": 3}   # events around single calls
HOST_N = 50
PREFILL_GRAPH_INNER, DECODE_GRAPH_INNER, GRAPH_REPS = 3, 10, 20
PREFILL_PEERS = ("flash", "cudnn")
DECODE_PEERS = ("flash", "efficient", "cudnn")
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def time_ms(fn, n_sets=1):
    """Eager ms per call of fn(i) (events around single calls, rotating over the sets; host cost included)."""
    return timing.events_ms(lambda i, st: fn(i), n_sets=n_sets, **EAGER)


def graph_ms(fn, inner, n_sets=1, kernels=None, vkc=True):
    """Device ms per call of fn(i, stream): max(inner, n_sets) calls in one graph (every set at least once)."""
    return timing.graph_ms(fn, vkc=vkc, n_sets=n_sets, inner=max(inner, n_sets), reps=GRAPH_REPS, kernels=kernels)


def host_us(fn, n_sets=1):
    return timing.host_us(lambda i, st: fn(i), n=HOST_N, n_sets=n_sets)


def paged(B, L, Hkv, D, bs=BS, dense=True, device=None, bt=None):
    """Cache of B sequences of L tokens each, blocks shuffled (or laid out by the given block table bt);
    returns (kc, vc, bt, k, v contiguous [B, Hkv, L, D]) (k, v are None when dense=False)."""
    device = device or DEVICE
    nblk = -(-L // bs)
    nb = B * nblk
    kc = torch.randn(nb, bs, Hkv, D, device=device, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    if bt is None:
        bt = torch.randperm(nb, device=device).to(torch.int32).view(B, nblk)
    if not dense:
        return kc, vc, bt, None, None
    n = torch.arange(L, device=device)
    blk = bt[:, n // bs].long()  # [B, L]
    k = kc[blk, n % bs].permute(0, 2, 1, 3).contiguous()
    v = vc[blk, n % bs].permute(0, 2, 1, 3).contiguous()
    return kc, vc, bt, k, v


def decode_inputs(B, L, Hq=24, Hkv=4, D=256, dense=True, device=None, bt=None):
    """A decode batch of B sequences of L tokens: (kc, vc, bt, k, v, q, seq_lens, out); k, v are the de-paged
    copies (None when dense=False)."""
    device = device or DEVICE
    kc, vc, bt, k, v = paged(B, L, Hkv, D, dense=dense, device=device, bt=bt)
    q = torch.randn(B, Hq, D, device=device, dtype=torch.bfloat16)
    sl = torch.full((B,), L, dtype=torch.int32, device=device)
    return kc, vc, bt, k, v, q, sl, torch.empty_like(q)


def sdpa_ctx(backend):
    """The backend restriction for one peer (entered by the caller around its whole measurement)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])])


def sdpa_gqa(q, k, v, causal):
    """The peer call on one set: q [B, Hq, Lq, D], k/v [B, Hkv, L, D] contiguous, native GQA (no K/V
    expansion)."""
    assert k.is_contiguous() and v.is_contiguous() and k.shape[1] == v.shape[1] and q.shape[1] % k.shape[1] == 0
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def measure_peer(r, backend, run, *, graph_inner, host, n_sets=1):
    """Peer `sdpa_<backend>` into r: eager ms, host us, graph ms. A peer that cannot run or cannot be captured
    gets *_error / *_graph_error; nothing is dropped silently. Which kernels it ran is checked afterwards by
    verify_backends (the profiler would slow every later launch if it ran before the timings)."""
    name = f"sdpa_{backend}"
    with sdpa_ctx(backend):  # outside every timed region and around the capture
        try:
            run(0)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - backend unavailable for this shape/GPU
            r[f"{name}_error"] = C.err(e)
            return
        r[f"{name}_ms"] = time_ms(run, n_sets)
        if host:
            r[f"{name}_host_us"] = host_us(run, n_sets)
        try:
            r[f"{name}_graph_ms"] = graph_ms(lambda i, st: run(i), graph_inner, n_sets, vkc=False)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            r[f"{name}_graph_error"] = C.err(e)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()


def verify_backends(rows):
    """After every timing: for each row and each peer that ran, the CUDA kernels (torch.profiler) of one eager
    call and of one replay of a captured call, under the same forced backend, on fresh inputs of the row's
    shapes -> sdpa_<be>_kernels_eager/_graph, _backend_eager/_graph (bench_common.sdpa_backend_of), _backend_ok."""
    for r in rows:
        if r["kind"] == "prefill":
            B, Lq, L, causal = 1, r["T"], r["T"], True
        elif r["kind"] == "decode":
            B, Lq, L, causal = r["B"], 1, r["L"], False
        else:
            continue
        peers = [k[len("sdpa_"):-len("_ms")] for k in r if k.startswith("sdpa_") and k.endswith("_ms")
                 and not k.endswith(("_graph_ms",))]
        if not peers:
            continue
        q = torch.randn(B, r["Hq"], Lq, r["D"], device=DEVICE, dtype=torch.bfloat16)
        k = torch.randn(B, r["Hkv"], L, r["D"], device=DEVICE, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        for be in peers:
            name = f"sdpa_{be}"
            with sdpa_ctx(be):
                try:
                    names = timing.kernel_names(lambda: sdpa_gqa(q, k, v, causal))
                except Exception as e:  # noqa: BLE001 - diagnostic only
                    names = [f"<profiler failed: {C.err(e)}>"]
                r[f"{name}_kernels_eager"], r[f"{name}_backend_eager"] = names, C.sdpa_backend_of(names)
                if f"{name}_graph_ms" in r:
                    ks = []
                    try:
                        timing.graph_ms(lambda i, st: sdpa_gqa(q, k, v, causal), vkc=False, inner=1, reps=1, kernels=ks)
                    except Exception as e:  # noqa: BLE001
                        ks.append(f"<capture failed: {C.err(e)}>")
                    r[f"{name}_kernels_graph"], r[f"{name}_backend_graph"] = ks, C.sdpa_backend_of(ks)
            r[f"{name}_backend_ok"] = (r[f"{name}_backend_eager"] == be
                                       and r.get(f"{name}_backend_graph", be) == be)
        q = k = v = None
        torch.cuda.empty_cache()


def bench_prefill(rows, copy_tbs):
    D = C.ATTN_HEAD_DIM
    for Hq, Hkv, T in C.attn_prefill_cases():
        set_bytes = C.attn_prefill_set_bytes(T, Hq, Hkv, D)
        n = C.n_sets_for(set_bytes, lo=1, hi=16)  # rotate over sets whose sum exceeds the L2 (small T)
        bt = None
        sets = []
        for _ in range(n):  # one block table for all sets (a PrefillPlan is made for one)
            kc, vc, bt, k, v = paged(1, T, Hkv, D, PREFILL_BS, bt=bt)
            q = torch.randn(T, Hq, D, device=DEVICE, dtype=torch.bfloat16)
            sets.append({"kc": kc, "vc": vc, "k": k, "v": v, "q": q, "out": torch.empty_like(q),
                         "qc": q.permute(1, 0, 2).unsqueeze(0).contiguous()})  # [1, Hq, T, D] for SDPA
        cu = torch.tensor([0, T], dtype=torch.int32, device=DEVICE)
        sl = torch.tensor([T], dtype=torch.int32, device=DEVICE)
        flops = C.attn_prefill_flops(T, Hq, D)
        r = {"kind": "prefill", "Hq": Hq, "Hkv": Hkv, "D": D, "T": T, "block_size": PREFILL_BS, "flops": flops,
             "tma": A.prefill_uses_tma(sets[0]["kc"]), "peak_ms": flops / (C.BF16_DENSE_TFLOPS * 1e12) * 1e3,
             "n_sets": n, "set_bytes": set_bytes}
        host = T <= 4096  # host-visible sizes

        def op(i, st=None):
            x = sets[i]
            A.prefill(x["q"], x["kc"], x["vc"], bt, cu, sl, D ** -0.5, out=x["out"], max_seqlen_q=T, stream=st)
        plan = A.PrefillPlan(cu, sl, bt, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=PREFILL_BS,
                             max_seqlen_q=T)

        def prun(i, st=None):
            x = sets[i]
            plan.run(x["q"], x["kc"], x["vc"], D ** -0.5, out=x["out"], stream=st)
        r["vkc_ms"], r["vkc_plan_ms"] = time_ms(op, n), time_ms(prun, n)
        r["vkc_graph_ms"] = graph_ms(op, PREFILL_GRAPH_INNER, n)
        r["vkc_plan_graph_ms"] = graph_ms(prun, PREFILL_GRAPH_INNER, n)
        r["vkc_graph_tflops"] = flops / r["vkc_graph_ms"] / 1e9
        if host:
            r["vkc_host_us"], r["vkc_plan_host_us"] = host_us(op, n), host_us(prun, n)
            with C.validated():
                r["vkc_validated_ms"], r["vkc_validated_host_us"] = time_ms(op, n), host_us(op, n)
        kc16, vc16, bt16, _, _ = paged(1, T, Hkv, D, 16, dense=False)
        x0 = sets[0]
        r["vkc_bs16_ms"] = time_ms(lambda i: A.prefill(x0["q"], kc16, vc16, bt16, cu, sl, D ** -0.5, out=x0["out"],
                                                       max_seqlen_q=T))
        kc16 = vc16 = None  # noqa: F841 - free before the peers
        for be in PREFILL_PEERS:
            measure_peer(r, be, lambda i: sdpa_gqa(sets[i]["qc"], sets[i]["k"], sets[i]["v"], True),
                         graph_inner=PREFILL_GRAPH_INNER, host=host, n_sets=n)
        rows.append(r)
        sets = plan = None  # free this case before the next one
        torch.cuda.empty_cache()


def bench_decode(rows, copy_tbs):
    Hq, Hkv, D = 24, 4, C.ATTN_HEAD_DIM
    warm_host()
    for B, L in C.attn_decode_cases(Hkv, D):
        if DECODE_ONLY and f"{B}x{L}" not in DECODE_ONLY:
            continue
        nbytes = C.attn_decode_bytes(B, L, Hq, Hkv, D)
        n = C.n_sets_for(nbytes, lo=1, hi=64)  # small batches: rotate over caches that together exceed the L2
        bt = None
        sets = []
        for _ in range(n):  # one block table / seq_lens / workspace for all sets (a DecodePlan is made for one)
            kc, vc, bt, k, v, q, sl, out = decode_inputs(B, L, Hq, Hkv, D, bt=bt)
            sets.append({"kc": kc, "vc": vc, "k": k, "v": v, "q": q, "out": out, "q4": q.unsqueeze(2)})
        ws = A.decode_workspace(B, Hq, D, 64)
        r = {"kind": "decode", "B": B, "L": L, "Hq": Hq, "Hkv": Hkv, "D": D, "bytes": nbytes, "n_sets": n,
             "floor_ms": C.floor_ms(nbytes, C.HBM_NOMINAL_TBS), "floor_copy_ms": C.floor_ms(nbytes, copy_tbs)}
        host = B * L <= C.HOST_VISIBLE_DECODE

        def op(i, st=None, **kw):
            x = sets[i]
            A.decode(x["q"], x["kc"], x["vc"], bt, sl, D ** -0.5, out=x["out"], workspace=ws, max_seq_len=L,
                     stream=st, **kw)
        plan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=BS, workspace=ws,
                            max_seq_len=L)
        r["splits"], r["tma"] = plan.num_splits, plan.batch.tma  # what decode() picks for this batch too

        def prun(i, st=None):
            x = sets[i]
            plan.run(x["q"], x["kc"], x["vc"], D ** -0.5, out=x["out"], stream=st)
        r["vkc_ms"], r["vkc_plan_ms"] = time_ms(op, n), time_ms(prun, n)
        r["vkc_graph_ms"] = graph_ms(op, DECODE_GRAPH_INNER, n)
        r["vkc_plan_graph_ms"] = graph_ms(prun, DECODE_GRAPH_INNER, n)
        r["vkc_pct_floor"] = C.pct(r["floor_ms"], r["vkc_graph_ms"])
        r["vkc_pct_copy"] = C.pct(r["floor_copy_ms"], r["vkc_graph_ms"])
        if host:
            r["vkc_host_us"], r["vkc_plan_host_us"] = host_us(op, n), host_us(prun, n)
            with C.validated():
                r["vkc_validated_ms"], r["vkc_validated_host_us"] = time_ms(op, n), host_us(op, n)
        if host or FORCED_SPLITS:
            splits = FORCED_SPLITS or (1, 2, 4, 8, 16, 32)
            r["split_sweep_graph_ms"] = {
                s: graph_ms(lambda i, st, s=s: op(i, st, num_splits=s), DECODE_GRAPH_INNER, n)
                for s in splits if s * 64 <= L}
            r["split_sweep_unfused_graph_ms"] = {  # the same with a separate combine launch
                s: graph_ms(lambda i, st, s=s: op(i, st, num_splits=s, fused=False), DECODE_GRAPH_INNER, n)
                for s in splits if 1 < s and s * 64 <= L}
        for be in DECODE_PEERS:
            measure_peer(r, be, lambda i: sdpa_gqa(sets[i]["q4"], sets[i]["k"], sets[i]["v"], False),
                         graph_inner=DECODE_GRAPH_INNER, host=host, n_sets=n)
            if f"sdpa_{be}_graph_ms" in r:
                r[f"sdpa_{be}_pct_floor"] = C.pct(r["floor_ms"], r[f"sdpa_{be}_graph_ms"])
        rows.append(r)
        print("== decode row:", json.dumps(r), flush=True)  # kept in the log if a time limit cuts the run
        sets = plan = ws = None  # free this case before the next one
        torch.cuda.empty_cache()


def warm_host(n=3000):
    """Bring the host path to steady state before the first timed row (first-row eager/host times read ~2x
    high otherwise: clocks, caches, lazy loads)."""
    kc, vc, bt, _, _, q, sl, out = decode_inputs(1, 512, dense=False)
    for i in range(n):
        A.decode(q, kc, vc, bt, sl, 256 ** -0.5, out=out, max_seq_len=512)
        if i % 256 == 255:
            torch.cuda.synchronize()
    torch.cuda.synchronize()


def host_profile(B=1, L=512):
    """Where a decode call's host time goes (B = 1 x 512: the device is faster than the host, so n calls
    never back up the launch queue): the bound call and the validated call (VKC_FASTPATH=0), the validated call
    with no-op kernels (validation + interop), one raw Kernel.launch, one as_tensor of a torch tensor, and a
    cProfile of the validated no-op-kernel call."""
    import cProfile
    import pstats
    from vkc_runtime import memory
    Hq, Hkv, D = 24, 4, 256
    kc, vc, bt, _, _, q, sl, out = decode_inputs(B, L, Hq, Hkv, D, dense=False)
    ws = A.decode_workspace(B, Hq, D, 64)
    call = lambda i, st: A.decode(q, kc, vc, bt, sl, D ** -0.5, out=out, workspace=ws, max_seq_len=L)  # noqa: E731
    res = {"B": B, "L": L, "decode_us": timing.host_us(call)}
    stack = contextlib.ExitStack()
    stack.enter_context(C.validated())
    res["decode_validated_us"] = timing.host_us(call)
    from vkc_runtime.ops.attn import decode_ops
    real = decode_ops.get_kernel

    class NoLaunch:
        def __init__(self, k):
            self.k = k
            self.device = k.device
            self.constexprs = k.constexprs

        def max_active_blocks(self):
            return self.k.max_active_blocks()

        def scratch_bytes(self, grid):
            return self.k.scratch_bytes(grid)

        def load(self):
            return self

        def launch(self, grid, args, stream=0, scratch=None):
            pass
    # the workspace holds the kernels it will launch (loaded when it is made): make one under the patch
    decode_ops.get_kernel = lambda base, **kw: NoLaunch(real(base, **kw))  # noqa: E731
    try:
        ws_nl = A.decode_workspace(B, Hq, D, 64)
        call_nl = lambda i, st: A.decode(q, kc, vc, bt, sl, D ** -0.5, out=out, workspace=ws_nl,  # noqa: E731
                                         max_seq_len=L)
        res["decode_no_launch_us"] = timing.host_us(call_nl, n=2000)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            call_nl(0, None)
        pr.disable()
    finally:
        decode_ops.get_kernel = real
        stack.close()
    k = real(f"attn.decode_direct.d{D}.nogate")
    args = (q.data_ptr(), kc.data_ptr(), vc.data_ptr(), bt.data_ptr(), sl.data_ptr(), out.data_ptr(), 0, D ** -0.5,
            Hkv, Hq // Hkv, Hq * D, D, Hq * D, D, 0, 0, kc.stride(0), kc.stride(1), kc.stride(2), bt.stride(0), 16,
            bt.shape[1], kc.shape[0])
    res["raw_launch_us"] = timing.host_us(lambda i, st: k.launch((B * Hkv, 1, 1), args, 0))
    res["as_tensor_us"] = timing.host_us(lambda i, st: memory.as_tensor(q, "q"), n=2000)
    print("== decode host time:", json.dumps(res))
    pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(16)
    return res


def main(path):
    torch.manual_seed(0)
    rows, cmp = [], C.Comparisons()
    copy_tbs = C.measured_copy_tbs()
    parts = os.environ.get("BENCH_ATTN", "prefill decode").split()  # e.g. BENCH_ATTN=decode
    if "prefill" in parts:
        bench_prefill(rows, copy_tbs)
    if "decode" in parts:
        bench_decode(rows, copy_tbs)
        rows.append({"kind": "decode_host", **host_profile()})
    verify_backends(rows)  # last: the profiler leaves CUPTI attached, which slows every later launch
    for r in rows:
        if r["kind"] in ("prefill", "decode"):
            C.attn_comparisons(cmp, r, PREFILL_PEERS if r["kind"] == "prefill" else DECODE_PEERS)
    method = timing.method(
        eager_used=EAGER, host_used={"n": HOST_N, "warm": 3},
        graph_used={"prefill_inner": PREFILL_GRAPH_INNER, "decode_inner": DECODE_GRAPH_INNER, "reps": GRAPH_REPS},
        peers="torch SDPA, native GQA (enable_gqa=True) on contiguous de-paged K/V [B, Hkv, L, D]; one backend "
              "per peer forced by torch.nn.attention.sdpa_kernel([backend]) (no fallback) entered around the "
              "peer's whole measurement; after all timings, sdpa_<be>_kernels_eager/_graph record the kernels one "
              "eager call and one graph replay ran (torch.profiler) and _backend_eager/_graph the backend they "
              "belong to",
        vkc=f"prefill at block size 64 (TMA on sm_90a), decode at block size {BS}; eager calls with out= are bound "
            "calls after the first; *_validated_*: VKC_FASTPATH=0",
        inputs="bf16 torch.randn; a case whose bytes are under 2.5 x the 60 MB L2 rotates over n_sets copies "
               "(row n_sets; graphs hold max(inner, n_sets) calls so every copy is read)")
    res = C.result("attn", method=method, limits=C.hbm_limits(copy_tbs), rows=rows, comparisons=cmp,
                   decode_block_size=BS, prefill_block_size=PREFILL_BS)
    C.write(path, res)
    print(f"commit {res['meta']['commit']} ({res['meta']['commit_source']}), copy {copy_tbs:.2f} TB/s")
    for r in rows:
        if r["kind"] in ("prefill", "decode"):
            keys = [k for k in r if k.endswith(("_ms", "_us", "_pct_floor", "_backend_ok", "_error"))]
            print(json.dumps({k: (round(r[k], 4) if isinstance(r[k], float) else r[k])
                              for k in ["kind", "Hq", "Hkv", "T", "B", "L", "splits"] + keys if k in r}))
    import summarize
    print(summarize.markdown({"attn.json": res}))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "attn_bench.json")
