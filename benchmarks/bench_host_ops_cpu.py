"""Host cost per op call without a GPU: bound calls on vs off (VKC_FASTPATH=1 / 0), driver-free.

The ops run on torch-like stand-ins (tests/ops_fakes.TorchLike) with kernels whose launch does nothing, so the
figures are the ops' own Python host path -- validation, kernel choice, bound-call replay through
vkc_runtime.bound.PyBoundCall (the GPU path uses the native BoundCall, cheaper still) -- not a launch. Best of 7
rounds of N calls. Used to decide whether Plans alone (no bound calls) give the host cost bound calls give.

Usage: python benchmarks/bench_host_ops_cpu.py [OUT.json]
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VKC_IMPORT_CHECK", "0")

from tests.ops_fakes import MANIFEST, TorchLike as T  # noqa: E402
from vkc_runtime import bound  # noqa: E402
from vkc_runtime.ops import attn as A, norm as N  # noqa: E402
from vkc_runtime.ops.attn import cache_ops, decode_ops, prefill_ops  # noqa: E402

N_CALLS = 4000
I32 = "torch.int32"


class _Kernel:
    """A kernel whose launch does nothing (constexprs from the committed sm_90a manifest)."""
    device = 0

    def __init__(self, base):
        self.base, self.constexprs = base, MANIFEST["kernels"][base]["inputs"]["constexprs"]

    def max_active_blocks(self):
        return 2

    def load(self):
        pass

    def launch(self, grid, args, stream=0, scratch=None):
        pass


def _install():
    cache = {}

    def get_kernel(base, device=None):
        k = cache.get(base)
        return k if k is not None else cache.setdefault(base, _Kernel(base))
    for mod in (cache_ops, decode_ops, prefill_ops, N):
        mod.get_kernel = get_kernel
    prefill_ops.has_kernel = lambda base, device=None: base in MANIFEST["kernels"]
    decode_ops._sm_count = lambda dev: 132


def _best_us(fn, n=N_CALLS):
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def cases():
    B, Hq, Hkv, D, BS = 1, 24, 4, 256, 16
    ws = A.DecodeWorkspace(T((B * Hq * 64 * D,), "torch.float32"), T((B * Hq * 64,), "torch.float32"),
                           T((B * Hq,), I32), B, Hq, D, 64)
    bt, sl = T((B, 32), I32), T((B,), I32)
    q, kc, vc, out = T((B, Hq, D)), T((64, BS, Hkv, D)), T((64, BS, Hkv, D)), T((B, Hq, D))
    dplan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=BS, workspace=ws,
                         max_seq_len=512)
    Tp, bsp = 1024, 64
    qp, kp, vp, op = T((Tp, Hq, D)), T((40, bsp, Hkv, D)), T((40, bsp, Hkv, D)), T((Tp, Hq, D))
    cu, slp, btp = T((2,), I32), T((1,), I32), T((1, 40), I32)
    pplan = A.PrefillPlan(cu, slp, btp, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=bsp,
                          max_seqlen_q=Tp)
    x, w, y = T((8, 5120)), T((5120,)), T((8, 5120))
    return {
        "decode_plan_run_b1": lambda: dplan.run(q, kc, vc, 0.0625, out=out),
        "decode_b1": lambda: A.decode(q, kc, vc, bt, sl, 0.0625, out=out, workspace=ws, max_seq_len=512),
        "prefill_plan_run_t1024": lambda: pplan.run(qp, kp, vp, 0.0625, out=op),
        "prefill_t1024": lambda: A.prefill(qp, kp, vp, btp, cu, slp, 0.0625, out=op, max_seqlen_q=Tp),
        "rmsnorm_8x5120": lambda: N.rmsnorm(x, w, 1e-6, out=y),
    }


def main(out_path: str | None = None) -> dict:
    _install()
    res = {}
    for fast in ("1", "0"):
        os.environ["VKC_FASTPATH"] = fast
        bound.clear_bound_calls()
        for name, fn in cases().items():
            res.setdefault(name, {})["bound_us" if fast == "1" else "validated_us"] = round(_best_us(fn), 2)
    for name, r in res.items():
        print(f"{name:26s} bound {r['bound_us']:7.2f} us   validated {r['validated_us']:7.2f} us")
    if out_path:
        Path(out_path).write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
