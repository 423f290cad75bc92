"""Build description of the CuTe DSL GEMM family: which kernel variants each arch's artifact holds.

Plain Python (no DSL import), read by tools/cute/build.py on both sides of its subprocess boundary. A variant is
one compiled kernel: N and K fixed, M a runtime argument of the launcher. Its launcher in the linked shared
object is the C function

    int32_t <symbol>(const void *a, const void *w, void *c, int64_t m, void *stream)

(A [m, K], W [N, K], C [m, N], all bf16 row-major and 16-byte aligned; `stream` a CUstream; returns a CUresult),
callable once ``int32_t vkc_cute_load(int32_t device)`` has returned 0 for the current device.

This file is deliberately not named spec.py: the Triton regen's discovery picks up kernels_src/*/spec.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

LAUNCHER_C_SIGNATURE = "int32_t {symbol}(const void *a, const void *w, void *c, int64_t m, void *stream)"
LOAD_C_SIGNATURE = "int32_t vkc_cute_load(int32_t device)"
STATUS_C_SIGNATURE = "int vkc_cute_driver_status(void)"


@dataclass(frozen=True)
class GemmVariant:
    arch: str
    n: int
    k: int
    tile_m: int = 128
    tile_n: int = 256
    stages: int = 4
    epi_stages: int = 2
    group_m: int = 8

    @property
    def name(self) -> str:
        return f"gemm_bf16_n{self.n}_k{self.k}_t{self.tile_m}x{self.tile_n}"

    @property
    def symbol(self) -> str:
        return f"vkc_cute_{self.name}"

    @property
    def c_signature(self) -> str:
        return LAUNCHER_C_SIGNATURE.format(symbol=self.symbol)

    def to_json(self) -> dict:
        return asdict(self)


# (N, K) of the Qwen3.5 27B/35B projections the first slice covers; the same list for every kernel kind
SHAPES_NK = [(10240, 5120), (5120, 6144), (34816, 5120), (2048, 4096)]

# arch -> the kernel module compiled for it (tools/cute/build.py imports kernels_src.gemm.<module>)
KERNEL_MODULE = {"sm_90a": "sm90_wgmma"}

# (tile_m, tile_n, stages) per sm_90a variant: the 128x256 tile does the most MMA work per byte of shared memory
# traffic; 128x128 quantises better when few 128x256 tiles fill the last wave (e.g. M = 2048, N = 5120)
SM90_TILES = [(128, 256, 4), (128, 128, 6)]

VARIANTS: dict[str, list[GemmVariant]] = {
    "sm_90a": [GemmVariant("sm_90a", n, k, tile_m=tm, tile_n=tn, stages=st)
               for n, k in SHAPES_NK for tm, tn, st in SM90_TILES],
}


def variants_for(arch: str) -> list[GemmVariant]:
    if arch not in VARIANTS:
        raise KeyError(f"no CuTe GEMM variants for {arch} (have: {', '.join(sorted(VARIANTS))})")
    vs = VARIANTS[arch]
    names = [v.name for v in vs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate variant names for {arch}")
    return vs
