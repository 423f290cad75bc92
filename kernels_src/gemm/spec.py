"""Specs of the GEMM family: CuTe DSL kernels (``CUTE_SPECS``, built by the CuTe lane of `vkc regen`) and the
portable Triton BF16 GEMM (``SPECS``, ``mma.py``) for every arch.

One kernel per (operand type, tile configuration); M, N, K and the row strides are runtime arguments of every
launcher (C signatures ``vkc.cute_spec.ABIS["gemm_bf16"]`` and ``["gemm_fp8"]``: the FP8 e4m3 kernels also take two
fp32 scale vectors with element steps, per tensor = step 0). ``vkc_runtime.ops.gemm`` picks the tile per call (its
docstring states the rule) and names the bases with the same ``<type>.t<tile_m>x<tile_n>`` spelling.

Tiles (sm_90a WGMMA, 128-row tiles: two math warp groups of 64 rows each; persistent kernels: the launcher caps
the grid at the device's SM count, and each CTA walks its tiles while its loader already fetches the next tile's
slices):

* 128x256, 4 stages: the most MMA work per byte of shared-memory traffic, the large-shape workhorse;
* 128x128, 6 stages: quantises better when few 128x256 tiles would fill the last wave (e.g. M = 2048, N = 5120);
* 128x64, 8 stages: narrow outputs (N <= 64) and small grids, where wider tiles leave most SMs idle.

The FP8 kernels use the same tiles and stages: a k-slice is 128 fp8 values (one 128-byte swizzle row, as 64 bf16
are), so the shared-memory ring has the same bytes. The block-scaled FP8 kernels (``fp8_block.t192x128``,
``fp8_block.t128x{128,64}``, ABI ``gemm_fp8_block``: Qwen's 128 x 128 weight blocks and 1 x 128 activation groups)
promote every k-slice's partial product with its scales, which takes a second fp32 tile of registers: no 128x256
tile. The 192-row tile runs three math warp groups with one partial product each, so that two warp groups' WGMMAs
keep the tensor cores busy while the third promotes (sm90_wgmma.py, Sm90FP8BlockGemm).

The Triton BF16 GEMM (``bf16.mma.t<bm>x<bn>``, all seven archs; the op runs it where no CuTe kernel exists and
tests / benchmarks force it on sm_90a): BLOCK_K 32, 4 stages (64 / 48 KB of shared memory, inside the 99 KB of
sm_86 / sm_89 / sm_120a / sm_121a), 128x128 with 8 warps and 64x128 with 4 (the small-M / small-grid tile). Every
pointer, K and the x / w row strides carry div=16 (checked by the op); M, N and the out row stride none. Grid
(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),). ``nvfp4_dequant`` (NVFP4 -> bf16 weights, 16 x 256 per program): grid
(cdiv(N, 16), cdiv(K, 256)).
"""
from vkc.cute_spec import CuteKernelSpec
from vkc.spec import Arg, KernelSpec

_MMA_ARGS = [Arg("a_ptr", "*bf16", div=16), Arg("w_ptr", "*bf16", div=16), Arg("out_ptr", "*bf16", div=16),
             Arg("M", "i32"), Arg("N", "i32"), Arg("K", "i32", div=16),
             Arg("stride_am", "i32", div=16), Arg("stride_wn", "i32", div=16), Arg("stride_om", "i32")]
# (BLOCK_M, BLOCK_N, num_warps); BLOCK_K 32, 4 stages
MMA_TILES = ((128, 256, 8), (128, 128, 8), (64, 128, 4))

_W4A16_ARGS = [Arg("a_ptr", "*bf16", div=16), Arg("w_ptr", "*u8", div=16), Arg("s_ptr", "*u8", div=16),
               Arg("out_ptr", "*bf16", div=16), Arg("alpha", "fp32"),
               Arg("M", "i32"), Arg("N", "i32"), Arg("K", "i32", div=16),
               Arg("stride_am", "i32", div=16), Arg("stride_wn", "i32", div=16), Arg("stride_sn", "i32", div=16),
               Arg("stride_om", "i32")]
# (BLOCK_M, BLOCK_N, num_warps); BLOCK_K 64 (4 scale groups), 3 stages, the packed-word decoder
W4A16_TILES = ((128, 128, 8), (64, 128, 4))

SPECS = [
    KernelSpec(name=f"bf16.mma.t{bm}x{bn}", source="mma.py", entry="gemm_bf16_kernel", args=_MMA_ARGS,
               constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=w, num_stages=4)
    for bm, bn, w in MMA_TILES
] + [
    KernelSpec(name=f"w4a16.t{bm}x{bn}", source="mma.py", entry="gemm_w4a16_kernel", args=_W4A16_ARGS,
               constexprs={"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8, "PRMT": True},
               num_warps=w, num_stages=3)
    for bm, bn, w in W4A16_TILES
] + [
    KernelSpec(name="nvfp4_dequant", source="mma.py", entry="nvfp4_dequant_kernel",
               args=[Arg("w_ptr", "*u8", div=16), Arg("s_ptr", "*u8", div=16), Arg("out_ptr", "*bf16", div=16),
                     Arg("alpha", "fp32"), Arg("N", "i32"), Arg("K", "i32", div=16),
                     Arg("stride_wn", "i32", div=16), Arg("stride_sn", "i32", div=16), Arg("stride_on", "i32", div=16)],
               constexprs={"BLOCK_N": 16, "BLOCK_K": 256, "PRMT": True}, num_warps=4, num_stages=1)
]

_SM90_TILES = [(128, 256, 4), (128, 128, 6), (128, 64, 8)]
# block-scaled FP8: one weight-scale block per tile column range (no 256-wide tile); 192 rows = three math warp
# groups with one partial product each, 5 stages of 40 KB
_SM90_BLOCK_TILES = [(192, 128, 5), (128, 128, 6), (128, 64, 8)]

CUTE_SPECS = [
    CuteKernelSpec(
        name=f"bf16.t{tm}x{tn}", source="sm90_wgmma.py", kernel_class="Sm90BF16Gemm", abi="gemm_bf16",
        archs=("sm_90a",),
        config={"tile_m": tm, "tile_n": tn, "stages": st, "epi_stages": 2, "group_m": 8},
    )
    for tm, tn, st in _SM90_TILES
] + [
    CuteKernelSpec(
        name=f"fp8.t{tm}x{tn}", source="sm90_wgmma.py", kernel_class="Sm90FP8Gemm", abi="gemm_fp8",
        archs=("sm_90a",),
        config={"tile_m": tm, "tile_n": tn, "stages": st, "epi_stages": 2, "group_m": 8},
    )
    for tm, tn, st in _SM90_TILES
] + [
    CuteKernelSpec(
        name=f"fp8_block.t{tm}x{tn}", source="sm90_wgmma.py", kernel_class="Sm90FP8BlockGemm",
        abi="gemm_fp8_block", archs=("sm_90a",),
        config={"tile_m": tm, "tile_n": tn, "stages": st, "epi_stages": 2, "group_m": 8},
    )
    for tm, tn, st in _SM90_BLOCK_TILES
]
