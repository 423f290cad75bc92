"""AOT specs of the attention family: paged KV cache write, varlen causal prefill, split-KV decode.

All attention bases require 16-byte aligned bf16 pointers and strides that are multiples of 16 elements
(the runtime op checks this and refuses otherwise); the small int32 metadata arrays (block tables,
cu_seqlens, seq_lens, slot_mapping) carry no hint. reshape_and_cache comes as ``.a16`` and ``.any``.

Grids (all on axis x, so no product ever meets the 65535 limit of axes y/z):
  reshape_and_cache.*            (T, cdiv(Hkv*D, BLOCK))
  prefill.d{D}.{gate,nogate}[.tma]  (Hq * (cdiv(T, BLOCK_M) + N),)  every m-block any cu_seqlens can own
  decode_split.d{D}              (B * Hkv * num_splits,)
  decode_direct.d{D}.{gate,nogate}   (B * Hkv,)   one split: output written directly, no combine
  decode_fused.d{D}.{gate,nogate}    (B * Hkv * splits,)  split + the last split of each group combines
  decode_combine.d{D}.{gate,nogate}  (B * Hq,)

prefill.*.tma (sm_90a, sm_100a): K/V tiles come in by TMA, one box of BLOCK_N slots of one cache block per
tile (the runtime takes it when block_size % BLOCK_N == 0 and the block stride is a multiple of the slot
stride; descriptors are built on the device in global scratch). Without per-row address registers the
D=256 tile grows to 128 x 64 with 8 warps (no spills; faster than the gather kernel's 64 x 32 tile, as
measured in BENCHMARKS.md); D=128 uses 128 x 128.

Tiles per arch (shared memory: sm_80 163 KB, sm_86/89/120a/121a 99 KB, sm_90a/100a 227 KB):
  prefill D=256: sm_90a BLOCK_M 64 x BLOCK_N 32, 8 warps, 3 stages (190-226 registers; 128 x 64 /
                 64 x 64 spill in the gated variant: the fp32 accumulator alone is 128 registers per thread
                 for 64 rows per warpgroup); sm_100a 64 x 64, 8 warps, 2 stages; sm_80 64 x 32, 8 warps,
                 3 stages; 99 KB archs 64 x 32, 8 warps, 2 stages.
  prefill D=128: sm_90a/sm_100a 128 x 64, 8 warps, 2 stages (128 x 128 spills); sm_80 64 x 64, 8 warps,
                 3 stages; 99 KB archs 64 x 64, 8 warps, 2 stages.
  decode D=256: QB 16 rows (the q heads of one kv head, padded), BLOCK_N 64, 4 warps, 3 stages (Hopper/
                Blackwell/sm_80; 8 warps on sm_100a, where 4 spill), BLOCK_N 32 on 99 KB archs.
"""
from vkc.spec import Arg, KernelSpec, ScratchContract, with_pdl

_A = 16  # divisibility hint


def _args(params):
    return [Arg(n, t, div=_A if h else None) for n, t, h in params]


_RESHAPE = [
    ("k_ptr", "*bf16", True), ("v_ptr", "*bf16", True), ("k_cache_ptr", "*bf16", True),
    ("v_cache_ptr", "*bf16", True), ("slot_ptr", "*i32", False),
    ("stride_kt", "i32", True), ("stride_vt", "i32", True), ("stride_cb", "i64", True), ("stride_cs", "i32", True),
    ("block_size", "i32", False), ("N", "i32", True), ("num_slots", "i64", False),
]

# the paged-cache geometry every attention kernel that reads the cache takes last
_PAGED_CACHE = [
    ("stride_cb", "i64", True), ("stride_cs", "i32", True), ("stride_ch", "i32", True),
    ("stride_bt", "i32", False), ("block_size", "i32", False), ("max_blocks", "i32", False),
    ("num_blocks", "i32", False),
]
# the inputs every decode kernel that attends starts with
_DECODE_INPUTS = [
    ("q_ptr", "*bf16", True), ("k_cache_ptr", "*bf16", True), ("v_cache_ptr", "*bf16", True),
    ("bt_ptr", "*i32", False), ("seqlen_ptr", "*i32", False),
]

_PREFILL = [
    ("q_ptr", "*bf16", True), ("k_cache_ptr", "*bf16", True), ("v_cache_ptr", "*bf16", True),
    ("o_ptr", "*bf16", True), ("gate_ptr", "*bf16", True),
    ("bt_ptr", "*i32", False), ("cu_ptr", "*i32", False), ("seqlen_ptr", "*i32", False),
    ("scale", "fp32", False), ("num_seqs", "i32", False), ("num_tokens", "i32", False),
    ("num_q_heads", "i32", False), ("group", "i32", False),
    ("stride_qt", "i32", True), ("stride_qh", "i32", True), ("stride_ot", "i32", True), ("stride_oh", "i32", True),
    ("stride_gt", "i32", True), ("stride_gh", "i32", True),
    *_PAGED_CACHE,
]

_DECODE_SPLIT = [
    *_DECODE_INPUTS,
    ("part_o_ptr", "*fp32", True), ("part_lse_ptr", "*fp32", True),
    ("scale", "fp32", False), ("num_kv_heads", "i32", False), ("group", "i32", False), ("num_splits", "i32", False),
    ("stride_qb", "i32", True), ("stride_qh", "i32", True),
    *_PAGED_CACHE,
]

_DECODE_FUSED = [
    *_DECODE_INPUTS,
    ("part_o_ptr", "*fp32", True), ("part_lse_ptr", "*fp32", True), ("count_ptr", "*i32", True),
    ("o_ptr", "*bf16", True), ("gate_ptr", "*bf16", True),
    ("scale", "fp32", False), ("num_kv_heads", "i32", False), ("group", "i32", False), ("num_splits", "i32", False),
    ("stride_qb", "i32", True), ("stride_qh", "i32", True), ("stride_ob", "i32", True), ("stride_oh", "i32", True),
    ("stride_gb", "i32", True), ("stride_gh", "i32", True),
    *_PAGED_CACHE,
]

_DECODE_DIRECT = [
    *_DECODE_INPUTS, ("o_ptr", "*bf16", True), ("gate_ptr", "*bf16", True),
    ("scale", "fp32", False), ("num_kv_heads", "i32", False), ("group", "i32", False),
    ("stride_qb", "i32", True), ("stride_qh", "i32", True), ("stride_ob", "i32", True), ("stride_oh", "i32", True),
    ("stride_gb", "i32", True), ("stride_gh", "i32", True),
    *_PAGED_CACHE,
]

_DECODE_COMBINE = [
    ("part_o_ptr", "*fp32", True), ("part_lse_ptr", "*fp32", True), ("o_ptr", "*bf16", True),
    ("gate_ptr", "*bf16", True), ("num_q_heads", "i32", False), ("num_splits", "i32", False),
    ("stride_ob", "i32", True), ("stride_oh", "i32", True), ("stride_gb", "i32", True), ("stride_gh", "i32", True),
]

_SMALL_SMEM = ("sm_86", "sm_89", "sm_120a", "sm_121a")


def _per_arch(small, sm80, big=None):
    ov = {a: small for a in _SMALL_SMEM}
    ov["sm_80"] = sm80
    if big:
        ov["sm_90a"] = big
        ov["sm_100a"] = big
    return ov


# D -> (base = sm_90a/sm_100a config, overrides for the other archs)
_PREFILL_CFG = {
    256: (dict(constexprs={"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=8, num_stages=3),
          {**_per_arch(small={"constexprs": {"BLOCK_M": 64, "BLOCK_N": 32}, "num_warps": 8, "num_stages": 2},
                       sm80={"constexprs": {"BLOCK_M": 64, "BLOCK_N": 32}, "num_warps": 8, "num_stages": 3}),
           "sm_100a": {"constexprs": {"BLOCK_M": 64, "BLOCK_N": 64}, "num_warps": 8, "num_stages": 2}}),
    128: (dict(constexprs={"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=2),
          _per_arch(small={"constexprs": {"BLOCK_M": 64, "BLOCK_N": 64}, "num_warps": 8, "num_stages": 2},
                    sm80={"constexprs": {"BLOCK_M": 64, "BLOCK_N": 64}, "num_warps": 8, "num_stages": 3})),
}

# TMA prefill (sm_90a/sm_100a only; used when block_size % BLOCK_N == 0): no per-row address registers,
# so larger tiles fit without spills. D -> config
_TMA_ARCHS = ("sm_90a", "sm_100a")
_PREFILL_TMA_CFG = {
    256: dict(constexprs={"BLOCK_M": 128, "BLOCK_N": 64, }, num_warps=8, num_stages=2),
    128: dict(constexprs={"BLOCK_M": 128, "BLOCK_N": 128, }, num_warps=8, num_stages=2),
}

# TMA decode (sm_90a/sm_100a; used when block_size % BLOCK_N == 0): K / V tiles as boxes of one cache block,
# pipelined STAGES deep by tl.range. 64 x 2 stages, 4 warps: the best of 9 tiles at every 24/4 x 256 shape on the
# H100 (benchmarks/explore_attn_decode.py; 32 / 16 keys, 3 / 4 / 6 stages, 8 warps lost). D -> config
_DECODE_TMA_CFG = {
    256: dict(constexprs={"BLOCK_N": 64, "STAGES": 2}, num_warps=4, num_stages=2),
    128: dict(constexprs={"BLOCK_N": 64, "STAGES": 2}, num_warps=4, num_stages=2),
}

_DECODE_CFG = {
    256: (dict(constexprs={"BLOCK_N": 64}, num_warps=4, num_stages=3),
          {**{a: {"constexprs": {"BLOCK_N": 32}} for a in _SMALL_SMEM}, "sm_100a": {"num_warps": 8}}),
    128: (dict(constexprs={"BLOCK_N": 64}, num_warps=4, num_stages=3), {}),
}

SPECS = []

for _sfx, _al in (("a16", True), ("any", False)):
    SPECS.append(KernelSpec(
        name=f"reshape_and_cache.{_sfx}", source="cache.py", entry="reshape_and_cache_kernel",
        args=[Arg(n, t, div=_A if (h and _al) else None) for n, t, h in _RESHAPE],
        constexprs={"BLOCK": 1024}, num_warps=4, num_stages=1))

for _d in (256, 128):
    _base, _ov = _PREFILL_CFG[_d]
    for _gate in (False, True):
        SPECS.append(KernelSpec(
            name=f"prefill.d{_d}.{'gate' if _gate else 'nogate'}", source="prefill.py", entry="prefill_kernel",
            args=_args(_PREFILL),
            constexprs={"D": _d, "HAS_GATE": _gate, "SEQ_CHUNK": 128, "TMA": False,
                        **_base["constexprs"]},
            num_warps=_base["num_warps"], num_stages=_base["num_stages"], overrides=_ov))
        _t = _PREFILL_TMA_CFG[_d]
        SPECS.append(KernelSpec(
            name=f"prefill.d{_d}.{'gate' if _gate else 'nogate'}.tma", source="prefill.py", entry="prefill_kernel",
            args=_args(_PREFILL),
            constexprs={"D": _d, "HAS_GATE": _gate, "SEQ_CHUNK": 128, "TMA": True, **_t["constexprs"]},
            num_warps=_t["num_warps"], num_stages=_t["num_stages"], archs=_TMA_ARCHS))
    for _tma in (False, True):
        _base, _ov = _DECODE_CFG[_d] if not _tma else (_DECODE_TMA_CFG[_d], {})
        _kw = dict(num_warps=_base["num_warps"], num_stages=_base["num_stages"],
                   **({"archs": _TMA_ARCHS} if _tma else {"overrides": _ov}))
        _cx = {"D": _d, "QB": 16, "TMA": _tma, "STAGES": 1, **_base["constexprs"]}
        _sfx = ".tma" if _tma else ""
        SPECS.append(KernelSpec(
            name=f"decode_split.d{_d}{_sfx}", source="decode.py", entry="decode_split_kernel",
            args=_args(_DECODE_SPLIT), constexprs=_cx, **_kw,
            scratch=(ScratchContract("part_o_ptr", "poison_ok", "written before the combine reads it"),
                     ScratchContract("part_lse_ptr", "poison_ok", "every split writes its lse (-inf if empty)"))))
        for _gate in (False, True):
            _g = "gate" if _gate else "nogate"
            SPECS.append(KernelSpec(
                name=f"decode_direct.d{_d}.{_g}{_sfx}", source="decode.py", entry="decode_direct_kernel",
                args=_args(_DECODE_DIRECT), constexprs={**_cx, "HAS_GATE": _gate}, **_kw))
            SPECS.append(KernelSpec(
                name=f"decode_fused.d{_d}.{_g}{_sfx}", source="decode.py", entry="decode_fused_kernel",
                args=_args(_DECODE_FUSED), constexprs={**_cx, "HAS_GATE": _gate}, **_kw,
                scratch=(ScratchContract("part_o_ptr", "poison_ok", "each split writes its partial before its ticket"),
                         ScratchContract("part_lse_ptr", "poison_ok", "every split writes its lse (-inf if empty)"),
                         ScratchContract("count_ptr", "zero_filled",
                                         "tickets per (b, kv head); the last split resets its counter to 0"))))
    for _gate in (False, True):
        SPECS.append(KernelSpec(
            name=f"decode_combine.d{_d}.{'gate' if _gate else 'nogate'}", source="decode.py",
            entry="decode_combine_kernel", args=_args(_DECODE_COMBINE),
            constexprs={"D": _d, "SPLIT_BLOCK": 16, "HAS_GATE": _gate}, num_warps=4, num_stages=1))

del _sfx, _al, _d, _base, _ov, _gate, _t, _tma, _kw, _cx, _g

# the decode-step kernels: programmatic dependent launch (kernels_src/common.py pdl_enter); prefill stays plain
_PDL = ("reshape_and_cache_kernel", "decode_split_kernel", "decode_direct_kernel", "decode_fused_kernel",
        "decode_combine_kernel")
SPECS = [with_pdl(s) if s.entry in _PDL else s for s in SPECS]
