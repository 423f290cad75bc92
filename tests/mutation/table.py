"""The kernel mutation table: each entry is one deliberate bug in one kernel source under kernels_src/, and
the CPU interpreter tests (``tests``, narrowed by the pytest ``-k`` expression ``k``) that must fail with it.

``old`` must occur exactly once in ``file`` (the runner refuses the table otherwise, so an entry cannot go
stale silently when a kernel changes: update its snippet with the kernel). Mutations keep every memory
access inside the buffers the tests pass (no out-of-bounds address is produced), never touch the loads or
bound checks of device-resident indices (cu_seqlens, slots, block tables, token ids), and keep the source
importable: a mutation counts as caught only when the selected tests run and fail.
"""
from __future__ import annotations

from dataclasses import dataclass

NORM = "tests/test_norm_interp.py"
ATTN = "tests/test_attn_interp.py"
GDN = "tests/test_gdn_interp.py"
GDN_DECODE = "tests/test_gdn_decode_interp.py"
CONV = "tests/test_conv_interp.py"
MOE_W8A8 = "tests/test_moe_w8a8_interp.py"
GEMM_FP8 = "tests/test_gemm_fp8_interp.py"
GEMM_FP4 = "tests/test_gemm_fp4_interp.py"


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str          # path under kernels_src/
    old: str           # exact snippet, present exactly once
    new: str
    tests: str         # test file (pytest path) expected to catch it
    k: str | None      # pytest -k expression narrowing the selection (None: the whole file)
    what: str          # short description of the bug


M = Mutation

MUTATIONS: tuple[Mutation, ...] = (
    # ------------------------------------------------------------------------------------ norm / norm.py
    M("norm-rms-eps-x10", "norm/norm.py",
      "rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)", "rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + 10.0 * eps)",
      NORM, "rmsnorm", "rmsnorm adds 10x eps"),
    M("norm-rms-eps-hardcoded", "norm/norm.py",
      "rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)", "rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + 1e-6)",
      NORM, "rmsnorm_small", "rmsnorm ignores the eps argument (hard-coded 1e-6)"),
    M("norm-rms-mean-over-block", "norm/norm.py",
      "rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)", "rstd = tl.rsqrt(tl.sum(x * x, axis=0) / BLOCK + eps)",
      NORM, "rmsnorm", "mean of x^2 over the padded block instead of N"),
    M("norm-rms-plain-weight", "norm/norm.py",
      "y = x * rstd * (1.0 + w)", "y = x * rstd * w",
      NORM, "rmsnorm", "rmsnorm scales by w instead of (1 + w)"),
    M("norm-add-eps-dropped", "norm/norm.py",
      "rstd = tl.rsqrt(tl.sum(sf * sf, axis=0) / N + eps)", "rstd = tl.rsqrt(tl.sum(sf * sf, axis=0) / N)",
      NORM, "add_rmsnorm", "add_rmsnorm drops eps"),
    M("norm-add-residual-sign", "norm/norm.py",
      "s = (x + r).to(tl.bfloat16)", "s = (x - r).to(tl.bfloat16)",
      NORM, "add_rmsnorm", "residual add becomes a subtraction"),
    M("norm-gated-eps-x10", "norm/norm.py",
      "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD + eps)", "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD + 10.0 * eps)",
      NORM, "gated", "gated_rmsnorm adds 10x eps"),
    M("norm-gated-gate-dropped", "norm/norm.py",
      "y = x * rstd[:, None] * w[None, :] * silu_f32(z)", "y = x * rstd[:, None] * w[None, :]",
      NORM, "gated", "gated_rmsnorm drops the silu(z) gate"),
    # ------------------------------------------------------------------------------------------- rope
    M("rope-eps-x10", "rope/rope.py",
      "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]",
      "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + 10.0 * eps)[:, None]",
      NORM, "qk_norm_rope", "q/k head norm adds 10x eps"),
    M("rope-theta-hardcoded", "rope/rope.py",
      "log2_theta = tl.log2(theta)", "log2_theta = tl.log2(10000.0)",
      NORM, "qk_norm_rope", "RoPE ignores theta (hard-coded 1e4)"),
    M("rope-partial-factor", "rope/rope.py",
      "inv_freq = tl.exp2(-(2.0 * j.to(tl.float32) / ROT) * log2_theta)",
      "inv_freq = tl.exp2(-(2.0 * j.to(tl.float32) / D) * log2_theta)",
      NORM, "qk_norm_rope", "frequencies over the head dim instead of the rotary dims (partial factor lost)"),
    M("rope-rotation-sign", "rope/rope.py",
      "(n1 * c - n2 * s)", "(n1 * c + n2 * s)",
      NORM, "qk_norm_rope", "rotate-half sign flipped in the first half"),
    M("rope-position-off-by-one", "rope/rope.py",
      "pos = tl.load(pos_ptr + t, mask=t < T, other=0).to(tl.float32)",
      "pos = (tl.load(pos_ptr + t, mask=t < T, other=0) + 1).to(tl.float32)",
      NORM, "qk_norm_rope", "rotation angle of position p + 1"),
    M("rope-token-of-row", "rope/rope.py",
      "t = t0 + r // HEADS_PER_PROG", "t = t0 + r % TOK",
      NORM, "qk_norm_rope", "a multi-token tile maps its rows to the wrong tokens"),
    M("rope-passthrough-mask", "rope/rope.py",
      "mask=hmask & (d[None, :] >= ROT))", "mask=hmask & (d[None, :] > ROT))",
      NORM, "qk_norm_rope", "first pass-through dim (d == ROT) never written (>= became >)"),
    # ------------------------------------------------------- act/act.py, embedding/embedding.py, common
    M("act-silu-operands-swapped", "act/act.py",
      "(silu_f32(g) * u)", "(silu_f32(u) * g)",
      NORM, "silu_mul", "SwiGLU applies silu to the up half"),
    M("act-gate-head-stride", "act/act.py",
      "g_offs = heads[:, None].to(tl.int64) * gate_stride_h + d[None, :]",
      "g_offs = heads[:, None].to(tl.int64) * D + d[None, :]",
      NORM, "sigmoid_mul", "gate heads read at stride D instead of gate_stride_h"),
    M("emb-out-row-stride", "embedding/embedding.py",
      "out_row = out_ptr + t * stride_out", "out_row = out_ptr + t * N",
      NORM, "embedding", "output rows at stride N instead of stride_out"),
    M("common-sigmoid-sign", "common.py",
      "return 1.0 / (1.0 + tl.exp(-x))", "return 1.0 / (1.0 + tl.exp(x))",
      NORM, "sigmoid_mul", "shared sigmoid computes sigmoid(-x)"),
    M("common-silu-sign", "common.py",
      "return x / (1.0 + tl.exp(-x))", "return x / (1.0 + tl.exp(x))",
      CONV, "update", "shared silu computes x * sigmoid(-x)"),
    # ------------------------------------------------------------------------------------------- attn
    M("attn-prefill-log2e-dropped", "attn/prefill.py",
      "qk_scale = scale * 1.4426950408889634", "qk_scale = scale",
      ATTN, "test_prefill and not tma", "exp2-domain scale without log2(e): softmax temperature off by 1.44"),
    M("attn-prefill-scale-ignored", "attn/prefill.py",
      "qk_scale = scale * 1.4426950408889634", "qk_scale = D ** -0.5 * 1.4426950408889634",
      ATTN, "long_chunk", "prefill ignores the scale argument (hard-coded D^-0.5)"),
    M("attn-prefill-causal-diagonal", "attn/prefill.py",
      "vis = ok[None, :] & (offs_n[None, :] <= pos[:, None])", "vis = ok[None, :] & (offs_n[None, :] < pos[:, None])",
      ATTN, "test_prefill and not tma", "causal mask hides the query's own key (<= became <)"),
    M("attn-prefill-tma-causal-future", "attn/prefill.py",
      "s = tl.where(offs_n[None, :] <= pos[:, None], s * qk_scale, float(\"-inf\"))",
      "s = tl.where(offs_n[None, :] <= pos[:, None] + 1, s * qk_scale, float(\"-inf\"))",
      ATTN, "prefill_tma", "TMA path's causal mask lets a query see the next key"),
    M("attn-prefill-rescale-dropped", "attn/prefill.py",
      "            v = tl.load(v_cache_ptr + rows[:, None] + d[None, :])\n"
      "        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)",
      "            v = tl.load(v_cache_ptr + rows[:, None] + d[None, :])\n"
      "        acc = acc + tl.dot(p.to(tl.bfloat16), v)",
      ATTN, "long_chunk", "online softmax: accumulator not rescaled when the running max grows"),
    M("attn-prefill-gqa-map", "attn/prefill.py",
      "kvh = h // group", "kvh = (h // group + 1) % (num_q_heads // group)",
      ATTN, "test_prefill and not tma", "q head reads the wrong kv head (GQA map rotated)"),
    M("attn-prefill-gate-sign", "attn/prefill.py",
      "(o_a * sigmoid_f32(g))", "(o_a * sigmoid_f32(-g))",
      ATTN, "test_prefill and not tma", "gated epilogue uses sigmoid(-gate) on the first quarter"),
    M("attn-decode-log2e-dropped", "attn/decode.py",
      "qk_scale = scale * 1.4426950408889634", "qk_scale = scale",
      ATTN, "test_decode", "decode softmax temperature off by 1.44"),
    M("attn-decode-scale-ignored", "attn/decode.py",
      "qk_scale = scale * 1.4426950408889634", "qk_scale = D ** -0.5 * 1.4426950408889634",
      ATTN, "test_decode_direct", "decode ignores the scale argument (hard-coded D^-0.5)"),
    M("attn-decode-last-key-dropped", "attn/decode.py",
      "return n_lo, tl.minimum(n_lo + kps, L)", "return n_lo, tl.minimum(n_lo + kps, L - 1)",
      ATTN, "test_decode", "split ranges end one key early (the newest key is never attended)"),
    M("attn-decode-lse-sum-dropped", "attn/decode.py",
      "lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float(\"-inf\"))",
      "lse = tl.where(seen, m_i, float(\"-inf\"))",
      ATTN, "test_decode", "split log-sum-exp keeps only the max (combine weights wrong)"),
    M("attn-combine-rescale-dropped", "attn/decode.py",
      "acc = acc * alpha + tl.sum(w[:, None] * po, 0)", "acc = acc + tl.sum(w[:, None] * po, 0)",
      ATTN, "many_live_splits and False", "combine kernel does not rescale its accumulator between split blocks"),
    M("attn-fused-gate-dropped", "attn/decode.py",
      "res = res * sigmoid_f32(g)", "res = res",
      ATTN, "test_decode and True-256-6-1-3-True", "fused decode drops the output gate"),
    M("attn-decode-tma-tail-v-unmasked", "attn/decode.py",
      "        v = tl.where(ok[:, None], v, 0.0)\n", "",
      ATTN, "test_decode_tma and not bad", "TMA decode: the last tile's slots past L (NaN) reach the P.V product"),
    M("attn-decode-tma-tail-one-past-end", "attn/decode.py",
      "ok = (n_full + cols < n_hi) & valid", "ok = (n_full + cols <= n_hi) & valid",
      ATTN, "test_decode_tma and not bad", "TMA decode: the last tile attends the stale slot after the newest key"),
    M("attn-decode-tma-bad-block-counted", "attn/decode.py",
      "acc = tl.where(valid, acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v), acc)",
      "acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)",
      ATTN, "test_decode_tma_bad", "TMA decode: a bad block id's tile (block 0, NaN) is added to the output"),
    # -------------------------------------------------------------------------------------------- gdn
    M("gdn-l2norm-eps-x10", "gdn/chunk.py",
      "x = x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]", "x = x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-5)[:, None]",
      GDN, "test_prep", "q/k L2 norm eps 1e-5 instead of 1e-6"),
    M("gdn-softplus-max-term", "gdn/chunk.py",
      "sp = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))", "sp = tl.log(1.0 + tl.exp(-tl.abs(x)))",
      GDN, "test_prep", "softplus loses its max(x, 0) term"),
    M("gdn-beta-sign", "gdn/chunk.py",
      "beta = 1.0 / (1.0 + tl.exp(-b))", "beta = 1.0 / (1.0 + tl.exp(b))",
      GDN, "test_prep", "beta = sigmoid(-b)"),
    M("gdn-kkt-diagonal", "gdn/chunk.py",
      "keep = (tl.arange(0, BT)[:, None] > tl.arange(0, BT)[None, :]) & m[:, None]",
      "keep = (tl.arange(0, BT)[:, None] >= tl.arange(0, BT)[None, :]) & m[:, None]",
      GDN, "test_empty_sequences_in_batch and delta_h0",
      "A = tril(...) keeps its diagonal (strict lower triangle lost)"),
    M("gdn-w-decay-dropped", "gdn/chunk.py",
      "kb = (k.to(tl.float32) * (beta * tl.exp(g))[:, None]).to(tl.bfloat16)",
      "kb = (k.to(tl.float32) * beta[:, None]).to(tl.bfloat16)",
      GDN, "test_empty_sequences_in_batch and delta_h0", "W = Tm (beta K) without the exp(g) decay"),
    M("gdn-state-decay-dropped", "gdn/chunk.py",
      "ST = ST * tl.exp(g_last) + tl.dot(vst, k)", "ST = ST + tl.dot(vst, k)",
      GDN, "test_empty_sequences_in_batch and delta_h0", "register-state path forgets the chunk decay"),
    M("gdn-tma-state-decay-dropped", "gdn/chunk.py",
      "S = tl.dot(tl.trans(k), vd, S * tl.exp(g_last))", "S = tl.dot(tl.trans(k), vd, S)",
      GDN, "test_empty_sequences_in_batch and delta_h1", "TMA state path forgets the chunk decay"),
    M("gdn-glast-off-by-one", "gdn/chunk.py",
      "    g_nx = tl.load(g_ptr + r64 * HV + hv, mask=m, other=0.0)\n"
      "    gl_nx = tl.load(g_ptr + (tl.minimum(bos + BT, eos) - 1).to(tl.int64) * HV + hv, mask=nc > 0, other=0.0)",
      "    g_nx = tl.load(g_ptr + r64 * HV + hv, mask=m, other=0.0)\n"
      "    gl_nx = tl.load(g_ptr + (tl.minimum(bos + BT - 1, eos) - 1).to(tl.int64) * HV + hv, mask=nc > 0, other=0.0)",
      GDN, "test_empty_sequences_in_batch and delta_h0", "first chunk's g_last read one row early"),
    M("gdn-o-diagonal", "gdn/chunk.py",
      "keep = (tl.arange(0, BT)[:, None] >= tl.arange(0, BT)[None, :]) & m[:, None]",
      "keep = (tl.arange(0, BT)[:, None] > tl.arange(0, BT)[None, :]) & m[:, None]",
      GDN, "test_empty_sequences_in_batch and delta_h0", "output drops the current token (>= became >)"),
    M("gdn-o-interchunk-decay", "gdn/chunk.py",
      "o = tl.dot(q, h) * tl.exp(g)[:, None]", "o = tl.dot(q, h)",
      GDN, "test_empty_sequences_in_batch and delta_h0", "inter-chunk term without exp(g)"),
    M("gdn-o-scale-dropped", "gdn/chunk.py",
      "o = o * scale", "o = o",
      GDN, "test_empty_sequences_in_batch and delta_h0", "output not scaled by K^-0.5"),
    # ------------------------------------------------------------------------------------- gdn_decode
    M("gdnd-l2norm-eps-x10", "gdn_decode/decode.py",
      "q = q / tl.sqrt(tl.sum(q * q, axis=0) + eps)", "q = q / tl.sqrt(tl.sum(q * q, axis=0) + 10.0 * eps)",
      GDN_DECODE, "test_decode", "q L2 norm adds 10x eps"),
    M("gdnd-l2norm-eps-hardcoded", "gdn_decode/decode.py",
      "k = k / tl.sqrt(tl.sum(k * k, axis=0) + eps)", "k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)",
      GDN_DECODE, "test_decode", "k L2 norm ignores the eps argument (hard-coded 1e-6)"),
    M("gdnd-decay-dropped", "gdn_decode/decode.py",
      "S = S * decay", "S = S * 1.0",
      GDN_DECODE, "test_decode", "state not decayed by exp(g)"),
    M("gdnd-alog-exp-dropped", "gdn_decode/decode.py",
      "g = -tl.exp(tl.load(A_log_ptr + h)) *", "g = -tl.load(A_log_ptr + h) *",
      GDN_DECODE, "test_decode", "gate uses A_log instead of exp(A_log)"),
    M("gdnd-beta-dropped", "gdn_decode/decode.py",
      "delta = beta * (v - sk)", "delta = (v - sk)",
      GDN_DECODE, "test_decode", "delta rule without beta"),
    M("gdnd-rank1-output-term", "gdn_decode/decode.py",
      "o = scale * (sq + delta * tl.sum(k * q, axis=0))", "o = scale * sq",
      GDN_DECODE, "test_decode", "output misses the rank-1 update's contribution"),
    M("gdnd-key-head-map", "gdn_decode/decode.py",
      "kh = h // (Hv // Hk)", "kh = h % Hk",
      GDN_DECODE, "test_decode", "value head reads the wrong key head"),
    # ------------------------------------------------------------------------------------------- conv
    M("conv-update-tap3-weight", "conv/conv.py",
      "acc += tl.load(wrow + 3, mask=cmask, other=0.0).to(tl.float32) * xv.to(tl.float32)",
      "acc += tl.load(wrow + 2, mask=cmask, other=0.0).to(tl.float32) * xv.to(tl.float32)",
      CONV, "update", "decode step weighs the new token with tap 2"),
    M("conv-update-roll-stale", "conv/conv.py",
      "tl.store(srow + 2 * stride_sr, xv, mask=smask)", "tl.store(srow + 2 * stride_sr, s2, mask=smask)",
      CONV, "update", "state roll keeps the old newest row instead of the new token"),
    M("conv-prefill-tap-row", "conv/conv.py",
      "p3, p2, p1 = a1, a2, a3", "p3, p2, p1 = a2, a2, a3",
      CONV, "prefill_varlen", "prefill body's register roll keeps a row one step late as the oldest tap"),
    M("conv-prefill-first-token-mask", "conv/conv.py",
      "x0 = tl.load(xrow, mask=cmask & (ln_v > 0), other=0.0)",
      "x0 = tl.load(xrow, mask=cmask & (ln_v > 1), other=0.0)",
      CONV, "prefill_varlen", "input position 0 of each sequence never read by its head rows (> 0 became > 1)"),
    M("conv-heads-state-tap", "conv/conv.py",
      "silu_f32(w0 * f0 + w1 * f1 + w2 * f2 + w3 * g0)", "silu_f32(w0 * f0 + w1 * f1 + w2 * f1 + w3 * g0)",
      CONV, "prefill_varlen", "a sequence's first row weighs the state's middle row for its newest"),
    M("conv-prefill-silu-dropped", "conv/conv.py",
      "y = tl.where((tv >= lo) & (tv < hi), _silu_approx(acc), 0.0)", "y = tl.where((tv >= lo) & (tv < hi), acc, 0.0)",
      CONV, "prefill_no_state", "prefill output without SiLU"),
    M("conv-final-state-row", "conv/conv.py",
      "tl.store(srow + 2 * stride_sr, n2, mask=m)", "tl.store(srow + 2 * stride_sr, n1, mask=m)",
      CONV, "prefill_varlen", "final conv state's newest row holds the second newest input"),
    # ------------------------------------------------------------------------------------ moe / w8a8.py
    M("moe-w8a8-act-scale-slice", "moe/w8a8.py",
      "s_a = tl.load(sa_rows + kb, mask=row_ok, other=0.0)", "s_a = tl.load(sa_rows + 0, mask=row_ok, other=0.0)",
      MOE_W8A8, "grouped_w8a8", "every k-slice promoted with the first slice's activation multiplier"),
    M("moe-w8a8-weight-scale-slice", "moe/w8a8.py",
      "s_a, tl.load(sg + kb))", "s_a, tl.load(sg + 0))",
      MOE_W8A8, "grouped_w8a8", "every k-slice promoted with the first slice's weight multiplier"),
    M("moe-w8a8-weight-scale-row", "moe/w8a8.py",
      "sg = s_e + ((pid_n * BLOCK_N) // 128)", "sg = s_e + ((pid_n * BLOCK_N) // 256)",
      MOE_W8A8, "grouped_w8a8", "output columns read the weight multipliers of the wrong 128-row block"),
    M("moe-w8a8-quant-max", "moe/w8a8.py",
      "tl.math.div_rn(tl.max(tl.abs(h), axis=1), FP8_MAX)", "tl.math.div_rn(tl.max(tl.abs(h), axis=1), 240.0)",
      MOE_W8A8, "grouped_w8a8", "the epilogue's h multipliers for e4m3's 240 instead of 448"),
    M("moe-w8a8-quant-silu-dropped", "moe/w8a8.py",
      "h = acc / (1.0 + tl.exp(-acc)) * acc_u", "h = acc * acc_u",
      MOE_W8A8, "grouped_w8a8", "the quantizing epilogue multiplies gate and up without SiLU"),
    # ------------------------------------------------------------------------------------ gemm_fp8 / gemm_fp8.py
    M("gemm-fp8-quant-group-tile-map", "gemm_fp8/gemm_fp8.py",
      "g = tl.program_id(1) * GROUPS + i % GROUPS", "g = tl.program_id(1) * GROUPS + i // ROWS",
      GEMM_FP8, "quant_group", "the group quantizer's 4 x 4 tile gives each row one group (the tile's row index)"),
    M("gemm-fp8-quant-group-rows", "gemm_fp8/gemm_fp8.py",
      "row = tl.program_id(0) * ROWS + i // GROUPS", "row = tl.program_id(0) + i // GROUPS",
      GEMM_FP8, "quant_group", "the group quantizer's programs overlap by rows (rows past the first tile unwritten)"),
    # ------------------------------------------------------------------------------------ gemm_fp4 / gemm_fp4.py
    M("gemm-fp4-alpha-dropped", "gemm_fp4/gemm_fp4.py",
      "acc = acc * tl.load(alpha_ptr)", "acc = acc * 1.0",
      GEMM_FP4, "gemm", "the W4A4 GEMM ignores the global multipliers' product"),
    M("gemm-fp4-scale-slice-mask", "gemm_fp4/gemm_fp4.py",
      "smask = ks[None, :] < left // 16", "smask = ks[None, :] < left // 8",
      GEMM_FP4, "gemm", "a partial last k-slice reads the scales of the groups past K"),
    M("gemm-fp4-quant-nibble-order", "gemm_fp4/gemm_fp4.py",
      "byte = (lo | (hi << 4)).to(tl.uint8)", "byte = (hi | (lo << 4)).to(tl.uint8)",
      GEMM_FP4, "quant or e2m1", "the quantizer packs k = 2j into the high nibble"),
    M("gemm-fp4-quant-tie-up", "gemm_fp4/gemm_fp4.py",
      "(a >= 0.75).to(tl.int32)", "(a > 0.75).to(tl.int32)",
      GEMM_FP4, "e2m1", "0.75 rounds to 0.5 (tie to the odd code)"),
    M("gemm-fp4-quant-gs-inverted", "gemm_fp4/gemm_fp4.py",
      "sf = (tl.math.div_rn(amax, 6.0) * gs)", "sf = (tl.math.div_rn(amax, 6.0) / gs)",
      GEMM_FP4, "quant", "the global scale multiplies the block scale's inverse (a multiplier, not a divisor)"),
)

# Not a bug but a probe: proves the runner's subprocess imports the mutated copy (it must fail with MARKER).
SANITY_MARKER = "vkc-mutation-sanity-probe"
SANITY = Mutation(
    "sanity-import-probe", "norm/norm.py",
    "from kernels_src.common import floor16, pdl_enter, silu_f32\n",
    f"from kernels_src.common import floor16, pdl_enter, silu_f32\nraise ImportError({SANITY_MARKER!r})\n",
    NORM, "test_rmsnorm_small", "importing the mutated copy raises")

FAMILIES = ("norm", "rope", "act", "embedding", "attn", "gdn", "gdn_decode", "conv", "moe", "gemm_fp8", "gemm_fp4")
