# How session 35's bf16 M = 1 GEMV variants were built (CPU box), from this session's tree (the FP8 M = 1 change
# landed): python3 variants.py {BS,BN,BN4}. Each root = the tree's sm_90a gemv/bf16.m1.* cubin + its manifest
# (tools/variant_root.py).
# BS: gemv_bf16_m1_kernel with per-step sums ([BLOCK_N] fp32 accumulator), the weight tile still loaded one step
#     ahead (the first before the grid-dependency wait).
# BN: BS without the tile ahead (the FP8 M = 1 kernel's landed loop).
# BN4: BN at 4 warps instead of 8 (built after call 3, not yet timed). sm_90a SASS of the K loop: head 2 BAR.SYNC a
#      step (x into the tile's layout; its one reduction after the loop), BS / BN 4 (the per-step sum across warps
#      through shared memory as well), BN4 2; registers head 59, BS / BN 48, BN4 40.
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from variant_root import build, replace_once  # noqa: E402

name = sys.argv[1]
assert name in ("BS", "BN", "BN4"), name


def patch(tree):
    g = tree / "kernels_src/gemv/gemv.py"
    s = g.read_text()
    k0, k1 = s.index("def gemv_bf16_m1_kernel"), s.index("@triton.jit\ndef _e2m1_bits")
    body = s[k0:k1]
    for old, new in [
        ("    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)\n", "    y = tl.zeros((BLOCK_N,), dtype=tl.float32)\n"),
        ("        acc += w.to(tl.float32) * xk.to(tl.float32)[None, :]\n",
         "        y += tl.sum(w.to(tl.float32) * xk.to(tl.float32)[None, :], axis=1)\n"),
        ("    y = tl.sum(acc, axis=1)\n", ""),
    ] + ([] if name == "BS" else [
        ("    w = tl.load(w_rows + k_lo, mask=n_ok[:, None] & ((k_lo + rk) < k_hi)[None, :], other=0.0)\n", ""),
        ("        xk = tl.load(x_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0)\n",
         "        xk = tl.load(x_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0)\n"
         "        w = tl.load(w_rows + k0, mask=n_ok[:, None] & ((k0 + rk) < k_hi)[None, :], other=0.0)\n"),
        ("        w = tl.load(w_rows + (k0 + BLOCK_K), mask=n_ok[:, None] & ((k0 + BLOCK_K + rk) < k_hi)[None, :], "
         "other=0.0)\n", ""),
    ]):
        assert body.count(old) == 1, old
        body = body.replace(old, new)
    g.write_text(s[:k0] + body + s[k1:])
    if name == "BN4":
        replace_once(tree / "kernels_src/gemv/spec.py", 'M1_TILES = {"bf16": ((4, 1024, 8),)',
                     'M1_TILES = {"bf16": ((4, 1024, 4),)')


build(name, patch, ["gemv/bf16.m1.*.cubin"])
