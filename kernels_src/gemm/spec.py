"""Specs of the GEMM family: CuTe DSL kernels (``CUTE_SPECS``, built by the CuTe lane of `vkc regen`).

One kernel per (operand type, tile configuration); M, N, K and the row strides are runtime arguments of every
launcher (C signatures ``vkc.cute_spec.ABIS["gemm_bf16"]`` and ``["gemm_fp8"]``: the FP8 e4m3 kernels also take two
fp32 scale vectors with element steps, per tensor = step 0). ``vkc_runtime.ops.gemm`` picks the tile per call (its
docstring states the rule) and names the bases with the same ``<type>.t<tile_m>x<tile_n>`` spelling.

Tiles (sm_90a WGMMA, 128-row tiles: two math warp groups of 64 rows each):

* 128x256, 4 stages: the most MMA work per byte of shared-memory traffic, the large-shape workhorse;
* 128x128, 6 stages: quantises better when few 128x256 tiles would fill the last wave (e.g. M = 2048, N = 5120);
* 128x64, 8 stages: narrow outputs (N <= 64) and small grids, where wider tiles leave most SMs idle.

The FP8 kernels use the same tiles and stages: a k-slice is 128 fp8 values (one 128-byte swizzle row, as 64 bf16
are), so the shared-memory ring has the same bytes.
"""
from vkc.cute_spec import CuteKernelSpec

SPECS: list = []  # no Triton kernels in this family

_SM90_TILES = [(128, 256, 4), (128, 128, 6), (128, 64, 8)]

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
]
