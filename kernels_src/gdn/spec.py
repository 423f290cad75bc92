"""AOT specs of the GDN family: chunked gated-delta-rule prefill (chunk.py), chunk BT = 64, K = V = 128.

Head counts (Hk, Hv with Hv % Hk == 0), token counts and strides are runtime arguments, so one base serves
Qwen3.6-27B (16/48) and 35B-A3B (16/32). ``div=16`` only on pointers the runtime wrapper checks (16-byte
aligned allocations) and on the qkv row stride (128 * (2 Hk + Hv), checked). Per-arch tile choices live in
``overrides``; the runtime reads BV from ``kernel.constexprs`` for its grid.

Grids (axis 0 first), max_chunks = max_tokens // 64 + max_seqs (workspace upper bound):
  chunk_index  (1,)
  prep         (max_chunks, Hk)
  kkt_wy       (max_chunks * Hv,)            value head fastest
  delta_h      (N, Hv, 128 // BV)
  chunk_o      (max_chunks * 128 // BV * Hv,)  value head fastest, then the V block
Scratch: every element a kernel reads was written earlier in the same call (masked on the sequence's eos),
so no buffer needs zero-filling.
"""
from vkc.spec import Arg, KernelSpec

_P = dict(BT=64, K=128)
_PV = dict(BT=64, K=128, V=128)

SPECS = [
    KernelSpec(
        name="chunk_index", source="chunk.py", entry="gdn_chunk_index_kernel",
        args=[Arg("cu_ptr", "*i32"), Arg("seqinfo_ptr", "*i32", div=16), Arg("cidx_ptr", "*i32", div=16),
              Arg("N", "i32"), Arg("T", "i32"), Arg("max_chunks", "i32")],
        constexprs={"BT": 64, "BLOCK": 256}, num_warps=4, num_stages=1),
    KernelSpec(
        name="prep", source="chunk.py", entry="gdn_prep_kernel",
        args=[Arg("qkv_ptr", "*bf16", div=16), Arg("a_ptr", "*bf16"), Arg("b_ptr", "*bf16"),
              Arg("alog_ptr", "*fp32"), Arg("dtb_ptr", "*fp32"), Arg("cidx_ptr", "*i32", div=16),
              Arg("qn_ptr", "*bf16", div=16), Arg("kn_ptr", "*bf16", div=16),
              Arg("g_ptr", "*fp32", div=16), Arg("beta_ptr", "*fp32", div=16),
              Arg("stride_qkv", "i32", div=16), Arg("stride_a", "i32"), Arg("stride_b", "i32"),
              Arg("HK", "i32"), Arg("HV", "i32")],
        constexprs={**_P, "GP": 4}, num_warps=4, num_stages=1),
    KernelSpec(
        name="kkt_wy", source="chunk.py", entry="gdn_kkt_wy_kernel",
        args=[Arg("kn_ptr", "*bf16", div=16), Arg("v_ptr", "*bf16", div=16), Arg("g_ptr", "*fp32", div=16),
              Arg("beta_ptr", "*fp32", div=16), Arg("cidx_ptr", "*i32", div=16),
              Arg("w_ptr", "*bf16", div=16), Arg("u_ptr", "*bf16", div=16),
              Arg("stride_v", "i32", div=16), Arg("HK", "i32"), Arg("HV", "i32")],
        constexprs=dict(_PV), num_warps=8, num_stages=1, overrides={"sm_100a": {"options": {"maxnreg": 232}}}),
    KernelSpec(
        name="delta_h", source="chunk.py", entry="gdn_delta_h_kernel",
        args=[Arg("kn_ptr", "*bf16", div=16), Arg("w_ptr", "*bf16", div=16), Arg("u_ptr", "*bf16", div=16),
              Arg("g_ptr", "*fp32", div=16), Arg("h_ptr", "*bf16", div=16), Arg("state_ptr", "*fp32", div=16),
              Arg("slot_ptr", "*i32"), Arg("seqinfo_ptr", "*i32", div=16),
              Arg("HK", "i32"), Arg("HV", "i32"), Arg("num_slots", "i32")],
        constexprs={**_PV, "BV": 32, "TMA": False}, num_warps=4, num_stages=2),
    KernelSpec(
        name="chunk_o", source="chunk.py", entry="gdn_chunk_o_kernel",
        args=[Arg("qn_ptr", "*bf16", div=16), Arg("kn_ptr", "*bf16", div=16), Arg("vp_ptr", "*bf16", div=16),
              Arg("g_ptr", "*fp32", div=16), Arg("h_ptr", "*bf16", div=16), Arg("cidx_ptr", "*i32", div=16),
              Arg("o_ptr", "*bf16", div=16), Arg("HK", "i32"), Arg("HV", "i32"), Arg("scale", "fp32")],
        constexprs={**_PV, "BV": 128}, num_warps=8, num_stages=1,
        overrides={a: {"constexprs": {"BV": 64}, "num_warps": 4} for a in ("sm_86", "sm_89", "sm_120a", "sm_121a")}),
]
