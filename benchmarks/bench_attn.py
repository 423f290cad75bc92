"""Attention on the H200: vkc paged prefill / decode vs torch SDPA (FLASH and CUDNN backends for prefill,
the default SDPA dispatch for decode) on the same data, de-paged into contiguous [1|B, H, L, D] tensors.

prefill: causal, one sequence whose cache holds exactly its T tokens, Hq/Hkv in {24/4, 16/2}, D 256;
         TFLOPS = 4 * T^2 * D * Hq / 2 / time. vkc is timed at block size 64 (the TMA kernel on sm_90a)
         and 16 (the gather kernel, vkc_bs16_*). Eager (events around single calls, host cost included) and
         graph times (3 calls in one CUDA graph; *_graph_ms, x_*_graph) for vkc at block size 64 and SDPA;
         vkc_plan_ms / x_*_plan: the eager call through a PrefillPlan made once (as engines do per step).
decode:  B in {1, 16, 64, 256} x context {512, 4096, 32768}, 24/4 x 256 (combos above ~40 GB of KV are
         skipped); % of the HBM floor = K+V bytes / 4.26 TB/s / time. Eager (events around single calls,
         host cost included) and graph (10 calls in one CUDA graph: vkc_runtime.Graph / torch.cuda.CUDAGraph)
         times for both. At B*L <= 16*4096 also the host time per call (vkc_host_us / sdpa_host_us) and the
         graph time of each forced split count (split_sweep_graph_ms: how good num_splits_for's choice is;
         vkc_plan_ms / vkc_plan_host_us: the same call through a DecodePlan made once, as engines do per step;
         split_sweep_unfused_graph_ms: with a separate combine launch instead of decode_fused);
         then a cProfile of the decode call's validation path (printed).
Eager calls with out= and torch tensors are bound calls after the first (vkc_runtime.bound: no revalidation);
*_validated_* columns time the same calls with VKC_FASTPATH=0 (every call validated, the pre-bound-call path).
BENCH_ATTN="prefill decode" (default) selects the parts.
CUDA events, warm-up, median of repeats. Usage: python benchmarks/bench_attn.py OUT.json
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

import torch
import torch.nn.functional as F

from vkc_runtime.bound import clear_bound_calls
from vkc_runtime.kernels import get_kernel
from vkc_runtime.ops import attention as A

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timing  # noqa: E402

HBM_TBS = 4.26
BS = 16  # decode block size
PREFILL_BS = 64


def time_ms(fn, reps=20, warm=3):
    """Eager ms per call of fn() (events around single calls; host launch cost included)."""
    return timing.events_ms(lambda i, st: fn(), inner=1, reps=reps, warm=warm)


@contextlib.contextmanager
def validated():
    """Bound calls off: every call validates its inputs (VKC_FASTPATH=0)."""
    old = os.environ.get("VKC_FASTPATH")
    os.environ["VKC_FASTPATH"] = "0"
    clear_bound_calls()
    try:
        yield
    finally:
        if old is None:
            del os.environ["VKC_FASTPATH"]
        else:
            os.environ["VKC_FASTPATH"] = old
        clear_bound_calls()


def paged(B, L, Hkv, D, bs=BS, dense=True):
    """Cache of B sequences of L tokens each, blocks shuffled; returns (kc, vc, bt, k, v contiguous [B, Hkv, L, D])
    (k, v are None when dense=False)."""
    nblk = -(-L // bs)
    nb = B * nblk
    kc = torch.randn(nb, bs, Hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    bt = torch.randperm(nb, device="cuda").to(torch.int32).view(B, nblk)
    if not dense:
        return kc, vc, bt, None, None
    n = torch.arange(L, device="cuda")
    blk = bt[:, n // bs].long()  # [B, L]
    k = kc[blk, n % bs].permute(0, 2, 1, 3).contiguous()
    v = vc[blk, n % bs].permute(0, 2, 1, 3).contiguous()
    return kc, vc, bt, k, v


def decode_inputs(B, L, Hq=24, Hkv=4, D=256, dense=True):
    """A decode batch of B sequences of L tokens: (kc, vc, bt, k, v, q, seq_lens, out); k, v are the de-paged
    copies (None when dense=False)."""
    kc, vc, bt, k, v = paged(B, L, Hkv, D, dense=dense)
    q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
    sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
    return kc, vc, bt, k, v, q, sl, torch.empty_like(q)


def sdpa(backend, q, k, v, causal, Hq, Hkv):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
          "default": None}[backend]
    kk, vv = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)

    def run():
        if be is None:
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
    try:
        run()
        torch.cuda.synchronize()
    except Exception as e:  # backend unavailable for this shape/GPU
        return None, f"{type(e).__name__}: {str(e)[:120]}"
    return run, None


def bench_prefill(rows):
    for Hq, Hkv in ((24, 4), (16, 2)):
        D = 256
        for T in (1024, 4096, 8192, 32768):
            kc, vc, bt, k, v = paged(1, T, Hkv, D, PREFILL_BS)
            q = torch.randn(T, Hq, D, device="cuda", dtype=torch.bfloat16)
            cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
            sl = torch.tensor([T], dtype=torch.int32, device="cuda")
            out = torch.empty_like(q)
            flops = 4 * T * T * D * Hq / 2
            r = {"kind": "prefill", "Hq": Hq, "Hkv": Hkv, "D": D, "T": T, "block_size": PREFILL_BS,
                 "tma": A.prefill_uses_tma(kc)}
            t = time_ms(lambda: A.prefill(q, kc, vc, bt, cu, sl, D ** -0.5, out=out, max_seqlen_q=T))
            r["vkc_ms"], r["vkc_tflops"] = t, flops / t / 1e9
            if T <= 4096:  # host-visible sizes
                with validated():
                    r["vkc_validated_ms"] = time_ms(lambda: A.prefill(q, kc, vc, bt, cu, sl, D ** -0.5, out=out,
                                                                      max_seqlen_q=T))
            plan = A.PrefillPlan(cu, sl, bt, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=PREFILL_BS,
                                 max_seqlen_q=T)
            r["vkc_plan_ms"] = time_ms(lambda: plan.run(q, kc, vc, D ** -0.5, out=out))
            tg = timing.graph_ms(lambda i, st: A.prefill(q, kc, vc, bt, cu, sl, D ** -0.5, out=out, max_seqlen_q=T,
                                                          stream=st), vkc=True, inner=3)
            r["vkc_graph_ms"], r["vkc_graph_tflops"] = tg, flops / tg / 1e9
            kc16, vc16, bt16, _, _ = paged(1, T, Hkv, D, 16, dense=False)
            t16 = time_ms(lambda: A.prefill(q, kc16, vc16, bt16, cu, sl, D ** -0.5, out=out, max_seqlen_q=T))
            r["vkc_bs16_ms"], r["vkc_bs16_tflops"] = t16, flops / t16 / 1e9
            del kc16, vc16
            qc = q.permute(1, 0, 2).unsqueeze(0).contiguous()
            for be in ("flash", "cudnn"):
                fn, err = sdpa(be, qc, k, v, True, Hq, Hkv)
                if fn is None:
                    r[f"{be}_error"] = err
                    continue
                tb = time_ms(fn)
                r[f"{be}_ms"], r[f"{be}_tflops"], r[f"x_{be}"] = tb, flops / tb / 1e9, tb / t
                r[f"x_{be}_plan"] = tb / r["vkc_plan_ms"]
                if "vkc_validated_ms" in r:
                    r[f"x_{be}_validated"] = tb / r["vkc_validated_ms"]
                try:  # device time without either side's host cost (matters at T = 1024)
                    tbg = timing.graph_ms(lambda i, st: fn(), vkc=False, inner=3)
                    r[f"{be}_graph_ms"], r[f"x_{be}_graph"] = tbg, tbg / tg
                except Exception as e:  # noqa: BLE001 - a backend that cannot be captured is reported, not fatal
                    r[f"{be}_graph_error"] = f"{type(e).__name__}: {str(e)[:120]}"
            rows.append(r)
            del kc, vc, k, v
            torch.cuda.empty_cache()


def bench_decode(rows):
    Hq, Hkv, D = 24, 4, 256
    warm_host()
    for B in (1, 16, 64, 256):
        for L in (512, 4096, 32768):
            kv_bytes = 2 * B * L * Hkv * D * 2
            if kv_bytes * 2 > 40e9:  # paged + de-paged copies
                continue
            kc, vc, bt, k, v, q, sl, out = decode_inputs(B, L, Hq, Hkv, D)
            ws = A.decode_workspace(B, Hq, D, 64)
            r = {"kind": "decode", "B": B, "L": L, "Hq": Hq, "Hkv": Hkv, "D": D, "kv_bytes": kv_bytes}
            def dec(i, st):
                A.decode(q, kc, vc, bt, sl, D ** -0.5, out=out, workspace=ws, max_seq_len=L, stream=st)
            t = time_ms(lambda: dec(0, None))
            plan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=BS, workspace=ws,
                                max_seq_len=L)
            r["vkc_plan_ms"] = time_ms(lambda: plan.run(q, kc, vc, D ** -0.5, out=out))
            tg = timing.graph_ms(dec, vkc=True, inner=10)
            floor = kv_bytes / (HBM_TBS * 1e12) * 1e3
            if B * L <= 16 * 4096:  # host-visible sizes: host time per call and the graph time of each split count
                r["vkc_host_us"] = timing.host_us(dec, n=50)
                with validated():
                    r["vkc_validated_ms"] = time_ms(lambda: dec(0, None))
                    r["vkc_validated_host_us"] = timing.host_us(dec, n=50)
                r["vkc_plan_host_us"] = timing.host_us(lambda i, st: plan.run(q, kc, vc, D ** -0.5, out=out), n=50)
                r["split_sweep_graph_ms"] = {
                    s: timing.graph_ms(lambda i, st, s=s: A.decode(q, kc, vc, bt, sl, D ** -0.5, out=out, workspace=ws,
                                                                    max_seq_len=L, num_splits=s, stream=st),
                                       vkc=True, inner=10)
                    for s in (1, 2, 4, 8, 16, 32) if s * 64 <= L}
                r["split_sweep_unfused_graph_ms"] = {  # the same with a separate combine launch
                    s: timing.graph_ms(lambda i, st, s=s: A.decode(q, kc, vc, bt, sl, D ** -0.5, out=out, workspace=ws,
                                                                    max_seq_len=L, num_splits=s, fused=False,
                                                                    stream=st),
                                       vkc=True, inner=10)
                    for s in (2, 4, 8, 16, 32) if s * 64 <= L}
            r.update(vkc_ms=t, vkc_graph_ms=tg, floor_ms=floor, vkc_pct_floor=100 * floor / min(t, tg),
                     splits=A.num_splits_for(B, Hkv, L, torch.cuda.get_device_properties(0).multi_processor_count,
                                             ctas_per_sm=get_kernel(f"attn.decode_split.d{D}").max_active_blocks()))
            fn, err = sdpa("default", q.unsqueeze(2), k, v, False, Hq, Hkv)
            if fn is None:
                r["sdpa_error"] = err
            else:
                tb = time_ms(fn)
                tbg = timing.graph_ms(lambda i, st: fn(), vkc=False, inner=10)
                r.update(sdpa_ms=tb, sdpa_graph_ms=tbg, x_sdpa=tb / t, x_sdpa_graph=tbg / tg,
                         x_sdpa_plan=tb / r["vkc_plan_ms"])
                if "vkc_validated_ms" in r:
                    r["x_sdpa_validated"] = tb / r["vkc_validated_ms"]
                if "vkc_host_us" in r:
                    r["sdpa_host_us"] = timing.host_us(lambda i, st: fn(), n=50)
            rows.append(r)
            del kc, vc, k, v
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
    stack.enter_context(validated())
    res["decode_validated_us"] = timing.host_us(call)
    real = A.get_kernel

    class NoLaunch:
        def __init__(self, k):
            self.k = k
            self.device = k.device

        def max_active_blocks(self):
            return self.k.max_active_blocks()

        def launch(self, grid, args, stream=0):
            pass
    A.get_kernel = lambda base: NoLaunch(real(base))  # noqa: E731
    try:
        res["decode_no_launch_us"] = timing.host_us(call, n=2000)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            call(0, None)
        pr.disable()
    finally:
        A.get_kernel = real
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
    rows = []
    parts = os.environ.get("BENCH_ATTN", "prefill decode").split()  # e.g. BENCH_ATTN=decode
    if "prefill" in parts:
        bench_prefill(rows)
    if "decode" in parts:
        bench_decode(rows)
        rows.append({"kind": "decode_host", **host_profile()})
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "hbm_tbs": HBM_TBS, "decode_block_size": BS,
           "prefill_block_size": PREFILL_BS,
           "note": "torch SDPA gets GQA by repeat_interleave of K/V outside the timed region", "rows": rows}
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'prefill':<8}{'Hq/Hkv':>8}{'T':>7}{'vkc ms':>9}{'TFLOPS':>8}{'bs16':>8}{'flash':>8}{'cudnn':>8}"
          f"{'x flash':>8}{'x cudnn':>8}{'graph':>8}{'x flash':>8}{'x cudnn':>8}{'plan':>8}{'x flash':>8}")
    for r in rows:
        if r["kind"] == "prefill":
            print(f"{'':<8}{r['Hq']:>5}/{r['Hkv']:<2}{r['T']:>7}{r['vkc_ms']:>9.3f}{r['vkc_tflops']:>8.0f}"
                  f"{r['vkc_bs16_tflops']:>8.0f}"
                  f"{r.get('flash_tflops', float('nan')):>8.0f}{r.get('cudnn_tflops', float('nan')):>8.0f}"
                  f"{r.get('x_flash', float('nan')):>8.2f}{r.get('x_cudnn', float('nan')):>8.2f}"
                  f"{r.get('vkc_graph_ms', float('nan')):>8.3f}{r.get('x_flash_graph', float('nan')):>8.2f}"
                  f"{r.get('x_cudnn_graph', float('nan')):>8.2f}{r.get('vkc_plan_ms', float('nan')):>8.3f}"
                  f"{r.get('x_flash_plan', float('nan')):>8.2f}"
                  f"  validated {r.get('vkc_validated_ms', float('nan')):.3f} ({r.get('x_flash_validated', float('nan')):.2f}x)")
    print(f"{'decode':<8}{'B':>5}{'L':>7}{'splits':>7}{'vkc ms':>9}{'graph':>8}{'floor':>8}{'% HBM':>7}{'sdpa ms':>9}"
          f"{'graph':>8}{'x sdpa':>8}{'x graph':>8}")
    for r in rows:
        if r["kind"] == "decode":
            print(f"{'':<8}{r['B']:>5}{r['L']:>7}{r['splits']:>7}{r['vkc_ms']:>9.3f}{r['vkc_graph_ms']:>8.3f}"
                  f"{r['floor_ms']:>8.3f}{r['vkc_pct_floor']:>7.1f}"
                  f"{r.get('sdpa_ms', float('nan')):>9.3f}{r.get('sdpa_graph_ms', float('nan')):>8.3f}"
                  f"{r.get('x_sdpa', float('nan')):>8.2f}{r.get('x_sdpa_graph', float('nan')):>8.2f}"
                  f"  plan {r['vkc_plan_ms']:.3f} ({r.get('x_sdpa_plan', float('nan')):.2f}x)"
                  f"  validated {r.get('vkc_validated_ms', float('nan')):.3f}"
                  f" ({r.get('x_sdpa_validated', float('nan')):.2f}x)"
                  f"  host us {r.get('vkc_host_us', float('nan')):.1f} / plan {r.get('vkc_plan_host_us', float('nan')):.1f}"
                  f" / validated {r.get('vkc_validated_host_us', float('nan')):.1f}"
                  f" / sdpa {r.get('sdpa_host_us', float('nan')):.1f}"
                  f"  sweep {r.get('split_sweep_graph_ms', '')}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "attn_bench.json")
