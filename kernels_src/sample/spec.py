"""AOT specs of the sampler family (kernels in sample.py).

``row.<dtype>.a16``: the logits and counts pointers 16-byte aligned, their row strides and V multiples of 16
(checked by the runtime; Qwen3.5/3.6's V = 248320 is); ``row.<dtype>.any``: no hints. <dtype> is the logits'
(f32 or bf16). One program per row; BLOCK = 8192 elements per step of a pass (16 per thread at 16 warps:
32 KiB of fp32 logits in flight per step), NTOP = 32 slots for the top-n list (n <= 20), MAX_ROUNDS = 32
draws per filtered row before the argmax fallback, SMAX = 64 row-statistics partials at most.
``stats.<dtype>.<variant>``: pass 1 of one slice of a row (span 8192 elements, ops/sample.py SPAN) in two steps of
BLOCK 4096 (the second loaded before the first is reduced), 8 warps (~100-130 registers: two programs per SM); the
row kernel gets the same span, to walk its later passes slice by slice.

Grids:
  stats.*   (B, n_slices)
  row.*     (B,)
  counts    (cdiv(n, 1024),)
  reset     (n, cdiv(V, 4096))
"""
from vkc.spec import Arg, KernelSpec, with_pdl

_ROW_CONST = {"NF": 8, "NI": 4, "BLOCK": 8192, "NTOP": 32, "MAX_ROUNDS": 32, "SMAX": 64}


def _row_args(dtype, aligned):
    d = 16 if aligned else None
    return [Arg("logits_ptr", f"*{dtype}", div=d), Arg("fp_ptr", "*fp32"), Arg("ip_ptr", "*i64"),
            Arg("counts_ptr", "*i32", div=d), Arg("tok_ptr", "*i32"), Arg("lp_ptr", "*fp32"),
            Arg("topv_ptr", "*fp32"), Arg("topi_ptr", "*i32"), Arg("part_ptr", "*fp32"),
            Arg("stride_l", "i32", div=d), Arg("V", "i32", div=d), Arg("stride_c", "i32", div=d),
            Arg("num_slots", "i32"), Arg("n_top", "i32"), Arg("stride_top", "i32"), Arg("want_lp", "i32"),
            Arg("n_slices", "i32"), Arg("span", "i32", div=d)]


def _stats_args(dtype, aligned):
    d = 16 if aligned else None
    return [Arg("logits_ptr", f"*{dtype}", div=d), Arg("fp_ptr", "*fp32"), Arg("ip_ptr", "*i64"),
            Arg("counts_ptr", "*i32", div=d), Arg("part_ptr", "*fp32"), Arg("stride_l", "i32", div=d),
            Arg("V", "i32", div=d), Arg("stride_c", "i32", div=d), Arg("num_slots", "i32"),
            Arg("span", "i32", div=d)]


SPECS = []
for _dt, _name in (("fp32", "f32"), ("bf16", "bf16")):
    for _v, _al in (("a16", True), ("any", False)):
        # unhinted loads keep a 64-bit address per element: half the block (8 per thread) fits without spills
        SPECS.append(KernelSpec(name=f"row.{_name}.{_v}", source="sample.py", entry="sample_kernel",
                                args=_row_args(_dt, _al),
                                constexprs={**_ROW_CONST, "BLOCK": 8192 if _al else 4096}, num_warps=16,
                                num_stages=1))
        SPECS.append(KernelSpec(name=f"stats.{_name}.{_v}", source="sample.py", entry="sample_stats_kernel",
                                args=_stats_args(_dt, _al),
                                constexprs={"NF": 8, "NI": 4, "BLOCK": 4096}, num_warps=8, num_stages=1))
SPECS.append(KernelSpec(
    name="counts", source="sample.py", entry="counts_kernel",
    args=[Arg("counts_ptr", "*i32"), Arg("tok_ptr", "*i32"), Arg("slot_ptr", "*i64"), Arg("n", "i32"),
          Arg("V", "i32"), Arg("stride_c", "i32"), Arg("num_slots", "i32"), Arg("slot_off", "i32"),
          Arg("slot_stride", "i32"), Arg("prompt", "i32")],
    constexprs={"BLOCK": 1024}, num_warps=4, num_stages=1))
SPECS.append(KernelSpec(
    name="reset", source="sample.py", entry="reset_kernel",
    args=[Arg("counts_ptr", "*i32"), Arg("slot_ptr", "*i64"), Arg("V", "i32"), Arg("stride_c", "i32"),
          Arg("num_slots", "i32")],
    constexprs={"BLOCK": 4096}, num_warps=4, num_stages=1))

del _dt, _name, _v, _al

SPECS = [with_pdl(s) for s in SPECS]  # decode steps: programmatic dependent launch (common.py pdl_enter)
