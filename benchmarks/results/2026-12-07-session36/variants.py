# How session 36's variants were built (CPU box): python3 variants.py NAME (TW1 / TW2 from a043bf7, AG from
# 57e646b). Each root = the tree's changed sm_90a cubins + their manifest (tools/variant_root.py).
# TW1 / TW2: the router's top-k kernel for E <= 256 (moe/route.topk.e256) at 1 / 2 warps instead of 4: its
#     reductions over the 256 experts (softmax max and sum, one max per pick) within a warp (shuffles only) or
#     across 2, instead of across 4 warps through shared memory and barriers.
# AG: the TMA attention decode kernels (attn/decode_*.tma) take the gather loads for a key range of at most
#     2 x BLOCK_N keys (no device-built descriptors, no tensormap fences for a short split); longer ranges by TMA.
#     Both paths in one kernel spill 8-16 B of stack on sm_90a: allowed here (a timing variant).
# CT (builds from a68389d only: the .conv kernels were reverted in e06d613; built, never timed): gdn_decode's .conv
#     kernels with the q / k conv-state ticket (barrier, acq_rel atomic, the last program's roll)
#     after the recurrent step instead of before it: the fence off the step's critical path.
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from variant_root import build, replace_once  # noqa: E402

name = sys.argv[1]
WARPS = {"TW1": 1, "TW2": 2}
assert name in WARPS or name in ("AG", "CT"), name


def patch_topk(tree):
    replace_once(tree / "kernels_src/moe/spec.py", "num_warps=1 if eb <= 32 else 4, num_stages=1)",
                 f"num_warps=1 if eb <= 32 else ({WARPS[name]} if eb == 256 else 4), num_stages=1)")


def patch_attn(tree):
    replace_once(tree / "kernels_src/attn/decode.py", """    if TMA:
        out, lse = _attend_range_tma(""", """    if TMA and (n_hi - n_lo > 2 * BLOCK_N):
        out, lse = _attend_range_tma(""")
    # both load paths in one kernel spill 8-16 B of stack on sm_90a (ptxas): allowed for this timing variant
    replace_once(tree / "kernels_src/attn/spec.py", """**({"archs": _TMA_ARCHS} if _tma else {"overrides": _ov}))""",
                 """**({"archs": _TMA_ARCHS, "allow_spills": True} if _tma else {"overrides": _ov}))""")


def patch_ticket(tree):
    f = tree / "kernels_src/gdn_decode/decode.py"
    src = f.read_text()
    a = src.index("        # the q / k channels of key head kh are read by every program")
    b = src.index("        _step(S, sp, q, k, v, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, bi, h, cv, o_row, stride_a, stride_b, Hv, "
                  "scale,\n              eps, H, BA, BLOCK_H)\n    else:", a)
    c = src.index("    else:", b)
    ticket, step = src[a:b], src[b:c]
    f.write_text(src[:a] + step + "        tl.debug_barrier()\n" + ticket + src[c:])


if name == "AG":
    build(name, patch_attn, ["attn/decode_*.tma.cubin"])
elif name == "CT":
    build(name, patch_ticket, ["gdn_decode/*.conv*.cubin"])
else:
    build(name, patch_topk, ["moe/route.topk.e256.cubin"])
