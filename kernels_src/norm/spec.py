"""AOT specs of the norm family: RMSNorm, RMSNorm fused with the residual add, the GDN output's gated RMSNorm.

Every kernel comes as ``.a16`` (all pointers and row strides carry div=16, which the runtime checks) and
``.any`` (no hints). Sizes (N, H) never carry hints; the kernels branch on ``size % 16`` internally so the
aligned variants still vectorize their masked loads and stores.

Grids (axis 0 first):
  rmsnorm.*, add_rmsnorm.*   (M,)                                BLOCK >= N required
  gated_rmsnorm.*            (M, cdiv(H, HEADS_PER_PROG))
"""
from vkc.spec import Arg, KernelSpec, with_pdl


def _args(params, aligned):
    """params: (name, type, aligned_hint). The hint is applied only in the aligned variant."""
    return [Arg(n, t, div=16 if (aligned and h) else None) for n, t, h in params]


_VARIANTS = (("a16", True), ("any", False))

# (name, type, gets div=16 in .a16)
_RMSNORM = [
    ("x_ptr", "*bf16", True), ("w_ptr", "*bf16", True), ("y_ptr", "*bf16", True),
    ("stride_x", "i32", True), ("stride_y", "i32", True), ("N", "i32", False), ("eps", "fp32", False),
]
_ADD_RMSNORM = [
    ("x_ptr", "*bf16", True), ("res_ptr", "*bf16", True), ("w_ptr", "*bf16", True), ("y_ptr", "*bf16", True),
    ("stride_x", "i32", True), ("stride_r", "i32", True), ("stride_y", "i32", True),
    ("N", "i32", False), ("eps", "fp32", False),
]
_GATED_RMSNORM = [
    ("x_ptr", "*bf16", True), ("z_ptr", "*bf16", True), ("w_ptr", "*bf16", True), ("y_ptr", "*bf16", True),
    ("stride_x", "i32", True), ("stride_z", "i32", True), ("stride_y", "i32", True),
    ("H", "i32", False), ("eps", "fp32", False),
]

# Row-reduction BLOCK -> num_warps. 4 warps up to BLOCK 8192: the tuning runs (vkc tune build/run/apply,
# BENCHMARKS.md) preferred it to 8 and 16 warps for every measured (hidden, tokens) of rmsnorm/add_rmsnorm:
# fewer threads per row, more rows in flight per SM. The same
# choice is used on the build-verified archs (it compiles there without spills); sm_90a pins the measured
# winners in tuning/sm_90a.json. BLOCK 16384 keeps 16 warps (4 would need > 255 registers).
# Hidden 5120 (Qwen3.6-27B) runs in the 8192 block: a split 4096 + 1024 block without masked lanes measured
# slower (BENCHMARKS.md, session 3) and was removed.
_ROW_BLOCKS = {1024: 4, 2048: 4, 4096: 4, 8192: 4, 16384: 16}  # BLOCK -> num_warps

SPECS = []

for _sfx, _al in _VARIANTS:
    for _block, _warps in _ROW_BLOCKS.items():
        SPECS.append(KernelSpec(
            name=f"rmsnorm.b{_block}.{_sfx}", source="norm.py", entry="rmsnorm_kernel",
            args=_args(_RMSNORM, _al), constexprs={"BLOCK": _block}, num_warps=_warps, num_stages=1))
        SPECS.append(KernelSpec(
            name=f"add_rmsnorm.b{_block}.{_sfx}", source="norm.py", entry="add_rmsnorm_kernel",
            args=_args(_ADD_RMSNORM, _al), constexprs={"BLOCK": _block}, num_warps=_warps, num_stages=1))

    # GDN output norm: 4 value heads of 128 per program, 2 warps (8 bf16 = 16 B per thread).
    SPECS.append(KernelSpec(
        name=f"gated_rmsnorm.h128.{_sfx}", source="norm.py", entry="gated_rmsnorm_kernel",
        args=_args(_GATED_RMSNORM, _al), constexprs={"HEAD": 128, "HEADS_PER_PROG": 4},
        num_warps=2, num_stages=1))

SPECS = [with_pdl(s) for s in SPECS]  # decode steps run every norm (kernels_src/common.py pdl_enter)

del _sfx, _al, _block, _warps
