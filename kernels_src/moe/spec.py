"""AOT specs of the moe family: the router, the grouping by expert and the combine (route.py, align.py,
combine.py); the grouped GEMMs' specs come from grouped_spec.py, the decode kernels' from decode_spec.py, the
NVFP4 (W4A16) and block-FP8 (W8A16, W8A8) expert kernels' from nvfp4_spec.py, fp8_spec.py and w8a8_spec.py,
appended.

Bases:
  route.logits.small   BM 16, BE 32, BK 128 (decode: many programs over E tiles and K splits)
  route.logits.large   BM 128, BE 128, BK 64 (prefill)
  route.topk.e{32,256,512}   softmax + top-k over E <= EB experts; one row per program, KB 16 slots, NS 16
                       partial splits at most (ops/moe/common.py MAX_SPLIT)
  align.hist           CH 2048 pairs per program, EB 512 bins (E' <= 512)
  align.scatter        one program per expert; BLOCK 1024, CH 2048, EB 512
  combine              BH 512 columns per program

Pointers, H, x's row stride and k_split carry div=16 (route); y/out pointers, H and the row strides div=16
(combine); the runtime checks them. num_warps / num_stages are first choices made without a device to time.

Grids:
  route.logits.*   (cdiv(M, BM), cdiv(E, BE), n_split)
  route.topk.*     (M,)
  align.hist       (cdiv(P, CH),)
  align.scatter    (E',)
  combine          (M, cdiv(H, BH))
"""
import importlib.util
from pathlib import Path

from vkc.spec import Arg, KernelSpec, with_pdl


def _grouped_specs(file: str = "grouped_spec.py") -> list:
    """``file``'s SPECS (loaded by path: vkc loads spec files by path, not as a package)."""
    path = Path(__file__).with_name(file)
    spec = importlib.util.spec_from_file_location(f"_vkc_spec_moe_{file[:-len('_spec.py')]}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return list(mod.SPECS)


_SMALL_SMEM = ("sm_86", "sm_89", "sm_120a", "sm_121a")  # 99 KB of shared memory per block

_LOGITS = [Arg("x_ptr", "*bf16", div=16), Arg("w_ptr", "*bf16", div=16), Arg("sg_ptr", "*bf16", div=16),
           Arg("part_ptr", "*fp32", div=16), Arg("M", "i32"), Arg("E", "i32"), Arg("H", "i32", div=16),
           Arg("stride_x", "i32", div=16), Arg("k_split", "i32", div=16), Arg("has_shared", "i32")]
_TOPK = [Arg("part_ptr", "*fp32", div=16), Arg("ids_ptr", "*i32"), Arg("wts_ptr", "*fp32"), Arg("M", "i32"),
         Arg("E", "i32"), Arg("n_split", "i32"), Arg("top_k", "i32"), Arg("k_out", "i32"), Arg("renorm", "i32"),
         Arg("has_shared", "i32")]
_HIST = [Arg("ids_ptr", "*i32"), Arg("hist_ptr", "*i32", div=16), Arg("P", "i32"), Arg("E", "i32")]
_SCATTER = [Arg("ids_ptr", "*i32"), Arg("hist_ptr", "*i32", div=16), Arg("sorted_ptr", "*i32"),
            Arg("bexp_ptr", "*i32"), Arg("npad_ptr", "*i32"), Arg("P", "i32"), Arg("E", "i32"),
            Arg("n_chunks", "i32"), Arg("cap", "i32"), Arg("block_m", "i32")]
_COMBINE = [Arg("y_ptr", "*bf16", div=16), Arg("ids_ptr", "*i32"), Arg("w_ptr", "*fp32"),
            Arg("out_ptr", "*bf16", div=16), Arg("H", "i32", div=16), Arg("k_out", "i32"), Arg("E", "i32"),
            Arg("stride_y", "i32", div=16), Arg("stride_o", "i32", div=16), Arg("has_w", "i32")]

_PDL_ENTRIES = ("router_logits_kernel", "router_topk_kernel", "moe_decode_gate_up_kernel", "moe_decode_down_kernel",
                "moe_w4a16_decode_gate_up_kernel", "moe_w4a16_decode_down_kernel", "moe_w8a16_decode_gate_up_kernel",
                "moe_w8a16_decode_down_kernel", "moe_w4a16_mma_gate_up_kernel", "moe_w4a16_mma_down_kernel")
TOPK_EB = (32, 256, 512)
MAX_SPLIT = 16  # the router's K splits at most (the runtime's ops/moe/common.py MAX_SPLIT)
EB_ALIGN = 512

SPECS = [
    KernelSpec(name="route.logits.small", source="route.py", entry="router_logits_kernel", args=_LOGITS,
               constexprs={"BM": 16, "BE": 32, "BK": 128}, num_warps=4, num_stages=3),
    KernelSpec(name="route.logits.large", source="route.py", entry="router_logits_kernel", args=_LOGITS,
               constexprs={"BM": 128, "BE": 128, "BK": 64}, num_warps=8, num_stages=3,
               # sm_120a/sm_121a spill 24 B at 2 stages (ptxas 13.4)
               overrides={a: {"num_stages": 1 if a in ("sm_120a", "sm_121a") else 2} for a in _SMALL_SMEM}),
    *(KernelSpec(name=f"route.topk.e{eb}", source="route.py", entry="router_topk_kernel", args=_TOPK,
                 constexprs={"EB": eb, "KB": 16, "NS": MAX_SPLIT}, num_warps=1 if eb <= 32 else 4, num_stages=1)
      for eb in TOPK_EB),
    KernelSpec(name="align.hist", source="align.py", entry="align_hist_kernel", args=_HIST,
               constexprs={"CH": 2048, "EB": EB_ALIGN}, num_warps=4, num_stages=1),
    KernelSpec(name="align.scatter", source="align.py", entry="align_scatter_kernel", args=_SCATTER,
               constexprs={"BLOCK": 1024, "CH": 2048, "EB": EB_ALIGN}, num_warps=4, num_stages=1),
    KernelSpec(name="combine", source="combine.py", entry="combine_kernel", args=_COMBINE,
               constexprs={"BH": 512}, num_warps=4, num_stages=1),
    *_grouped_specs(),
    *_grouped_specs("decode_spec.py"),
    *_grouped_specs("nvfp4_spec.py"),
    *_grouped_specs("fp8_spec.py"),
    *_grouped_specs("w8a8_spec.py"),
]
# the router and the decode kernels run in every decode step: programmatic dependent launch (common.py pdl_enter)
SPECS = [with_pdl(s) if s.entry in _PDL_ENTRIES else s for s in SPECS]
