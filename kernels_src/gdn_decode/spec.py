"""AOT specs of the GDN packed decode step (kernel in decode.py).

The state pointer and its slot stride carry div=16 (the runtime refuses a state that breaks this: it is
always a whole allocation or a slot-aligned view of one); qkv / a / b / o carry no hints (a few hundred
bytes per program next to the 2 * K * BLOCK_V * 4 state bytes).

Grid: (B * Hv * (V // BLOCK_V),), axis 0 only.
  recurrent.k128_v128.bv32   4 warps, [128, 32] fp32 state slab per program (32 values per thread)
  recurrent.k128_v128.bv16   2 warps, [128, 16] slab: twice the CTAs for small batches (B * Hv < 512)
  *.ba                       the same, b and a computed from x and the b | a weight rows (BA; BLOCK_H 1024 columns
                             a chunk: two chunks at H = 2048, five at 5120); H is 0 (unused) for the others
"""
from vkc.spec import Arg, KernelSpec, with_pdl

_ARGS = [
    Arg("qkv_ptr", "*bf16"), Arg("a_ptr", "*bf16"), Arg("b_ptr", "*bf16"),
    Arg("A_log_ptr", "*fp32"), Arg("dt_bias_ptr", "*fp32"), Arg("state_ptr", "*fp32", div=16),
    Arg("slot_ptr", "*i32"), Arg("o_ptr", "*bf16"),
    Arg("stride_qkv", "i32"), Arg("stride_a", "i32"), Arg("stride_b", "i32"), Arg("stride_state", "i32", div=16),
    Arg("stride_o", "i32"), Arg("Hk", "i32"), Arg("Hv", "i32"), Arg("num_slots", "i32"),
    Arg("scale", "fp32"), Arg("eps", "fp32"), Arg("H", "i32"),
]

SPECS = [
    KernelSpec(name=f"recurrent.k128_v128.bv{bv}" + (".ba" if ba else ""), source="decode.py",
               entry="gdn_decode_kernel", args=_ARGS,
               constexprs={"K": 128, "V": 128, "BLOCK_V": bv, "BA": ba, "BLOCK_H": 1024}, num_warps=w, num_stages=1)
    for ba in (False, True) for bv, w in ((32, 4), (16, 2))
]
SPECS = [with_pdl(s) for s in SPECS]  # decode steps: programmatic dependent launch (common.py pdl_enter)
