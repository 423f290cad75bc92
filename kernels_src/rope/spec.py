"""AOT specs of the rope family: the attention preamble, per-head RMSNorm(1 + w) of q and k followed by partial
rotate-half RoPE (kernels in rope.py).

Every kernel comes as ``.a16`` (all pointers and row strides carry div=16, which the runtime checks) and
``.any`` (no hints). Head counts never carry hints.

Grid (axis 0 first):
  qk_norm_rope.*             (cdiv(T, TOK), cdiv(Hq, HEADS_PER_PROG) + cdiv(Hkv, HEADS_PER_PROG))
"""
from vkc.spec import Arg, KernelSpec, with_pdl


def _args(params, aligned):
    """params: (name, type, aligned_hint). The hint is applied only in the aligned variant."""
    return [Arg(n, t, div=16 if (aligned and h) else None) for n, t, h in params]


_VARIANTS = (("a16", True), ("any", False))

# (name, type, gets div=16 in .a16)
_QK_NORM_ROPE = [
    ("qg_ptr", "*bf16", True), ("k_ptr", "*bf16", True), ("pos_ptr", "*i32", True),
    ("wq_ptr", "*bf16", True), ("wk_ptr", "*bf16", True),
    ("q_out_ptr", "*bf16", True), ("k_out_ptr", "*bf16", True),
    ("stride_qg", "i32", True), ("stride_k", "i32", True), ("T", "i32", False),
    ("Hq", "i32", False), ("Hkv", "i32", False), ("eps", "fp32", False), ("theta", "fp32", False),
]

SPECS = []

for _sfx, _al in _VARIANTS:
    # 4 heads of one token per program (cos/sin computed once for them), 8 bf16 per thread. sm_90a overrides
    # (tuning/sm_90a.json, `vkc tune`, BENCHMARKS.md): d128 takes 8 heads a program, d256 2 warps (16 bf16 per
    # thread: twice the loads in flight per SM at the same occupancy, 2-5% faster on the H100).
    for _d, _rot, _warps in ((256, 64, 4), (128, 32, 2)):
        SPECS.append(KernelSpec(
            name=f"qk_norm_rope.d{_d}.r{_rot}.{_sfx}", source="rope.py", entry="qk_norm_rope_kernel",
            args=_args(_QK_NORM_ROPE, _al), constexprs={"D": _d, "ROT": _rot, "TOK": 1, "HEADS_PER_PROG": 4},
            num_warps=_warps, num_stages=1))

del _sfx, _al, _d, _rot, _warps

SPECS = [with_pdl(s) for s in SPECS]  # decode steps: programmatic dependent launch (common.py pdl_enter)
