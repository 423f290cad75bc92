"""A workload for Nsight Compute (tools/gpu/run.sh ncu): one warm call of an op, bracketed by
cudaProfilerStart/Stop so `ncu --profile-from-start off` sees only that call's kernels.

usage: python benchmarks/ncu_case.py gdn <T> <hk> <hv>      (chunked GDN prefill, one sequence of T tokens)
       python benchmarks/ncu_case.py decode <B> <L>           (attention decode, 24/4 x 256, block 16)
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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
