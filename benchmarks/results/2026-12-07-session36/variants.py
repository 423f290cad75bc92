# How session 36's variants were built (CPU box), from this session's tree: python3 variants.py NAME. Each root =
# the tree's changed sm_90a cubins + their manifest (tools/variant_root.py).
# TW1 / TW2: the router's top-k kernel for E <= 256 (moe/route.topk.e256) at 1 / 2 warps instead of 4: its
#     reductions over the 256 experts (softmax max and sum, one max per pick) within a warp (shuffles only) or
#     across 2, instead of across 4 warps through shared memory and barriers.
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from variant_root import build, replace_once  # noqa: E402

name = sys.argv[1]
WARPS = {"TW1": 1, "TW2": 2}
assert name in WARPS, name


def patch(tree):
    replace_once(tree / "kernels_src/moe/spec.py", "num_warps=1 if eb <= 32 else 4, num_stages=1)",
                 f"num_warps=1 if eb <= 32 else ({WARPS[name]} if eb == 256 else 4), num_stages=1)")


build(name, patch, ["moe/route.topk.e256.cubin"])
