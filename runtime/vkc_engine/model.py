"""The Qwen3.5/3.6 decoder (dense and MoE) over a backend's ops (vkc_engine.backend): weights fused at load,
one small class per block kind, activations in buffers allocated once for the largest step.

Per layer: RMSNorm(1 + w) (fused with the residual add from the second layer on), then the token mixer --
a Gated DeltaNet block (``linear_attention``) or a gated full-attention block (``full_attention``) -- then
add + RMSNorm and the SwiGLU MLP (dense models) or the sparse MoE block (qwen3_5_moe); at the end add +
RMSNorm and the LM head on the rows that need logits.

Fusions at load (rows stacked, one GEMM each): GDN ``in_proj_qkv | in_proj_z | in_proj_b | in_proj_a``;
attention ``q_proj | k_proj | v_proj`` (q_proj keeps HF's per-head [query | gate] rows, which is what
qk_norm_rope and the attention gate read); MLP ``gate_proj | up_proj``. MoE: every expert's ``gate | up`` rows
stacked into ``w1`` [E', 2I, H] and its ``down`` into ``w2`` [E', H, I] (see :class:`_MoE`). When ``in_proj_b |
in_proj_a`` end up a bf16 run of their own after a quantized one (NVFP4 / FP8 checkpoints keep them bf16), a decode
step of at most BA_IN_STEP_MAX_ROWS rows does not run them as a GEMV: the recurrent step computes b and a from the
block's input (ops.gdn_decode's ba=).

MoE experts of block-wise FP8 checkpoints stored per expert whose every projection (the folded shared expert's
included) is F8_E4M3 with whole 128-row blocks (I % 128 == 0) stay FP8 as stored (``backend.experts_fp8``: ops.moe's
W8A16 expert kernels); NVFP4 experts likewise (below). ``quantized_experts=False`` (LLM) dequantizes them instead.

Block-wise FP8 checkpoints (``cfg.quant``; vkc_engine.config): a linear whose stored ``weight`` is F8_E4M3 (with
its ``weight_scale_inv``) stays FP8 on the device and runs the backend's FP8 GEMM (``backend.weight_fp8``;
activations quantized per token per 128 columns); a bf16 one (``modules_to_not_convert``) stays bf16. Which is
which is read from each tensor's stored dtype. Fusion (:meth:`_Weights.linear`): the parts of a fused projection
are grouped into runs of consecutive parts of one kind -- FP8 parts whose N is a multiple of 128 (whole scale
blocks, so the stacked scales are the fused weight's block grid) and K a multiple of 16 (the FP8 GEMM's rule), or
bf16 parts -- one weight per run, each writing its columns of the projection's output (:class:`_Segments`);
an FP8 part that fits neither rule (e.g. a quantized ``in_proj_b`` [48, H]) is dequantized to bf16 at load and
joins the bf16 run. If a run would start at a column that is not a multiple of 8, or the projection's width is
not one (the GEMMs write 16-byte aligned output columns with a row pitch of 8k elements), the whole projection is
loaded as bf16 (dequantized). Tensors that are not linears of the mixers or
the dense MLP -- MoE experts the FP8 expert kernels cannot take, the router, embeddings -- are dequantized to bf16
at load (one log line with the count and the bytes).

NVFP4 checkpoints (``cfg.quant.method`` "nvfp4", either layout of vkc_engine.loader.nvfp4_names): a linear whose
global scale is stored is NVFP4 (the others, the checkpoint's ignore list, are bf16). In a fused projection,
consecutive NVFP4 parts with the same global multiplier form one run (packed codes and group scales stacked:
``backend.weight_nvfp4``: packed into ops.nvfp4's MMA layout, run as W4A16); parts with another multiplier start a
new run, and the column rule above applies to the runs (an unaligned mix loads the whole projection as bf16). MoE
experts stored per expert whose every projection, the folded shared expert's included, is NVFP4 stay 4-bit as
stored (``backend.experts_nvfp4``: ops.moe's W4A16 expert kernels, a global multiplier per expert and projection;
hidden and intermediate sizes multiples of 32).
Other NVFP4 tensors read through ``load`` (experts beside a bf16 shared expert, a quantized router or embedding)
are dequantized to bf16 at load.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from .loader import (FLOAT_DTYPES, FP8_DTYPE, Checkpoint, CheckpointError, Nvfp4Tensor, RawTensor, dequantize_fp8,
                     dequantize_nvfp4, fp8_block_scales, is_nvfp4, nvfp4_tensor, to_bf16_bits)

__all__ = ["Step", "Qwen35Model", "BA_IN_STEP_MAX_ROWS"]

# Decode steps of at most this many rows compute a GDN layer's b | a inside the recurrent step (the ``ba`` of
# _GatedDeltaNet); larger ones run the GEMV. Each (row, head, value block) program of the step repeats the two
# dots, so the fused cost grows with the rows: H200 (BENCHMARKS.md, session 18) 35B-A3B NVFP4 9.1 us a layer
# fused vs ~11.4 unfused at 4 rows, 27B NVFP4 39 us fused at 16 rows (the step 11.8 -> 12.2 ms).
BA_IN_STEP_MAX_ROWS = 4


@dataclass
class Step:
    """One forward's batch, already on the device: T tokens of N sequences (packed in sequence order)."""
    T: int
    N: int
    decode: bool              # every sequence contributes exactly one token
    ids: object               # int32 [T]
    positions: object         # int32 [T]
    slot_mapping: object      # int32 [T]  KV slot of each token
    cu_seqlens: object        # int32 [N + 1]
    seq_lens: object          # int32 [N]  context length after this step
    block_tables: object      # int32 [N, max_blocks]
    gdn_slots: object         # int32 [N]
    logit_rows: object        # int32 [n_logits]  rows of the batch to project to logits
    n_logits: int


class _Segments:
    """A fused projection loaded as several weights (FP8 / NVFP4 and bf16 runs): ``(weight, first column, width)``
    each, every one writing its columns of the output; ``kinds`` the runs' kinds ("bf16", "fp8", ("nvfp4", alpha))."""

    def __init__(self, segs, kinds):
        self.segs, self.kinds = segs, kinds


def _linear(be, x, w, out):
    """``be.linear`` of one weight, or of each segment of a :class:`_Segments` into its output columns."""
    if not isinstance(w, _Segments):
        return be.linear(x, w, out)
    for wi, c0, n in w.segs:
        be.linear(x, wi, be.cols(out, c0, n))
    return out


class _Weights:
    """Reads, checks and uploads tensors; remembers which checkpoint names were used and what was dequantized."""

    def __init__(self, ckpt: Checkpoint, backend, progress=None, total: int = 0, quant=None,
                 quantized_experts: bool = True):
        self.ckpt, self.be, self.used = ckpt, backend, set()
        self.quantized_experts = quantized_experts  # False: MoE experts dequantized to bf16 at load
        self.progress, self.total, self.done = progress, total, 0
        self.quant = quant
        self.fp8 = quant is not None and quant.method == "fp8"
        self.nvfp4 = quant.layout if quant is not None and quant.method == "nvfp4" else None
        self.dtypes = FLOAT_DTYPES + (FP8_DTYPE,) if self.fp8 else FLOAT_DTYPES
        self.fp8_parts = 0
        self.nvfp4_experts = 0  # expert projections kept NVFP4 (experts_nvfp4)
        self.fp8_experts = 0    # expert projections kept FP8 (experts_fp8)
        self.dequantized = {"other": [0, 0], "linear": [0, 0]}  # kind -> [tensors, bf16 bytes]
        self.bf16_linears: set[tuple[int, int]] = set()  # (N, K) of every bf16 weight a linear runs on

    def _get(self, name, shp):
        """The stored tensor ``name``; an NVFP4 linear's ``<module>.weight`` comes back as its Nvfp4Tensor."""
        if self.nvfp4 and name.endswith(".weight") and shp is not None and len(shp) == 2 and \
                is_nvfp4(self.ckpt, self.nvfp4, name[:-len(".weight")]):
            t = nvfp4_tensor(self.ckpt, self.nvfp4, name[:-len(".weight")], shp)
            self.used.update(t.names)
            return t
        t = self.ckpt.get(name, shp, self.dtypes)
        self.used.add(name)
        return t

    def _scales(self, t: RawTensor) -> RawTensor:
        s = fp8_block_scales(self.ckpt, t, self.quant.block)
        self.used.add(s.name)
        return s

    def _dequantized(self, t, kind: str) -> RawTensor:
        """An FP8 or NVFP4 weight as bf16 bits of its dequantized values (a host copy of this one tensor)."""
        if isinstance(t, Nvfp4Tensor):
            f, name, file = dequantize_nvfp4(t), t.name + ".weight", t.packed.file
        else:
            f, name, file = dequantize_fp8(t, self._scales(t), self.quant.block), t.name, t.file
        bits = to_bf16_bits(RawTensor(name, "F32", f, file))
        t = RawTensor(name, "BF16", bits, file)
        acc = self.dequantized[kind]
        acc[0] += 1
        acc[1] += bits.nbytes
        return t

    def _advance(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)

    def load(self, names_shapes, dtype: str, shape=None, rows: int | None = None):
        """The named tensors (each checked against its shape) stacked along dim 0 as one device array, reshaped
        to ``shape``; ``rows``: view every part as 2-D [-1, rows] first (stacking 3-D fused experts with 2-D
        per-expert tensors). FP8 parts are dequantized to bf16 here."""
        parts = []
        for name, shp in names_shapes:
            t = self._get(name, shp)
            if isinstance(t, Nvfp4Tensor) or t.dtype == FP8_DTYPE:
                t = self._dequantized(t, "other")
            if rows is not None and t.data.ndim != 2:
                t = RawTensor(t.name, t.dtype, t.data.reshape(-1, rows), t.file)
            parts.append(t)
        out = self.be.weight(parts, dtype, shape)
        self._advance(len(parts))
        return out

    def linear(self, names_shapes):
        """A projection's weight [sum N, K] from its parts (rows stacked): one bf16 device array, one FP8 weight
        (``backend.weight_fp8``), or :class:`_Segments` of both (the module docstring's rule)."""
        parts = [self._get(name, shp) for name, shp in names_shapes]
        bn = self.quant.block[0] if self.fp8 else 0
        kinds = [("nvfp4", t.alpha) if isinstance(t, Nvfp4Tensor) else
                 "fp8" if self.fp8 and t.dtype == FP8_DTYPE and t.shape[0] % bn == 0 and t.shape[1] % 16 == 0
                 else "bf16" for t in parts]
        runs, start = [], 0  # [kind, parts, first column]
        for k, t in zip(kinds, parts):
            if runs and runs[-1][0] == k:
                runs[-1][1].append(t)
            else:
                runs.append([k, [t], start])
            start += t.shape[0]
        if len(runs) > 1 and (start % 8 or any(r[2] % 8 for r in runs)):
            runs = [["bf16", parts, 0]]
        segs = []
        for k, ts, c0 in runs:
            if k == "fp8":
                w = self.be.weight_fp8(ts, [self._scales(t) for t in ts])
                self.fp8_parts += len(ts)
            elif k != "bf16":
                w = self.be.weight_nvfp4([t.packed for t in ts], [t.scale for t in ts], k[1])
                self.fp8_parts += len(ts)
            else:
                w = self.be.weight([self._dequantized(t, "linear") if isinstance(t, Nvfp4Tensor) or
                                    t.dtype == FP8_DTYPE else t for t in ts], "bf16")
                self.bf16_linears.add((sum(t.shape[0] for t in ts), ts[0].shape[1]))
            segs.append((w, c0, sum(t.shape[0] for t in ts)))
        self._advance(len(parts))
        return segs[0][0] if len(segs) == 1 else _Segments(segs, [r[0] for r in runs])

    def all_nvfp4(self, modules) -> bool:
        """Whether every module (a linear's name without ``.weight``) is stored as NVFP4."""
        return bool(self.nvfp4) and all(is_nvfp4(self.ckpt, self.nvfp4, m) for m in modules)

    def experts_nvfp4(self, experts: list[list[str]], shape: tuple[int, int]):
        """NVFP4 MoE experts kept 4-bit (backend.experts_nvfp4: ops.moe's W4A16 kernels): ``experts`` lists each
        expert's modules (gate, up or down), every one NVFP4 of ``shape`` [N, K]; their codes and group scales are
        stacked as stored, alpha [E', modules per expert] holds each module's global multiplier."""
        ts = [[self._get(m + ".weight", shape) for m in mods] for mods in experts]
        flat = [t for mods in ts for t in mods]
        if not all(isinstance(t, Nvfp4Tensor) for t in flat):
            raise CheckpointError(f"{self.ckpt.dir}: expert weights {experts[0]} ... mix NVFP4 and other dtypes")
        alpha = np.array([[t.alpha for t in mods] for mods in ts], np.float32)
        out = self.be.experts_nvfp4([t.packed for t in flat], [t.scale for t in flat], alpha, len(experts))
        self.nvfp4_experts += len(flat)
        self._advance(len(flat))
        return out

    def fp8_expert_parts(self, experts: list[list[str]], shape: tuple[int, int]):
        """The F8_E4M3 weights of ``experts`` (each expert's gate and up, or its down; every one [N, K] = ``shape``)
        when all of them are stored so with 128 x 128 blocks and whole blocks per module (N % 128 == 0): what
        :meth:`experts_fp8` uploads; None otherwise (the caller dequantizes). Reads headers and map views only."""
        N, K = shape
        if not self.fp8 or tuple(self.quant.block) != (128, 128) or N % 128 or K % 16:
            return None
        ts = [self._get(m + ".weight", shape) for mods in experts for m in mods]
        return ts if all(t.dtype == FP8_DTYPE for t in ts) else None

    def experts_fp8(self, parts: list, experts: int):
        """Block-wise FP8 MoE experts kept e4m3 (backend.experts_fp8: ops.moe's W8A16 kernels) from
        :meth:`fp8_expert_parts`'s weights, with their block scales."""
        out = self.be.experts_fp8(parts, [self._scales(t) for t in parts], experts)
        self.fp8_experts += len(parts)
        self._advance(len(parts))
        return out

    def summary(self) -> str:
        """One line on the quantized weights: how many linears run quantized, what was dequantized to bf16 (and its
        bytes)."""
        if self.quant is None:
            return ""
        (no, bo), (nl, bl) = self.dequantized["other"], self.dequantized["linear"]
        gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.2f} MiB"  # noqa: E731
        if self.fp8:
            msg = f"FP8 checkpoint: {self.fp8_parts} linear weights run the FP8 block GEMM"
            if self.fp8_experts:
                msg += f"; {self.fp8_experts} MoE expert weights kept FP8 (W8A16 in the MoE kernels)"
            why_other, over = "not FP8 in the checkpoint, or experts the FP8 expert kernels cannot take", bo / 2
            why_linear = "N not whole 128-row blocks, or a fused projection the GEMMs cannot split into FP8 and bf16 " \
                         "columns"
        else:
            msg = (f"NVFP4 checkpoint ({self.nvfp4}): {self.fp8_parts} linear weights packed into the MMA layout, run "
                   "as W4A16 (weights decoded in the tensor-core kernel; the checkpoint's activation scales are not used)")
            if self.nvfp4_experts:
                msg += f"; {self.nvfp4_experts} MoE expert weights kept NVFP4 (W4A16 in the MoE kernels)"
            why_other, over = "not NVFP4 in the checkpoint, or NVFP4 experts beside a bf16 shared expert", bo * 0.71875
            why_linear = "a fused projection the GEMMs cannot split into NVFP4 and bf16 columns"
        if no:
            msg += (f"; {no} tensors outside the quantized linears (MoE experts, router, shared expert, embeddings) "
                    f"dequantized to bf16 at load ({gib(bo)} as bf16, +{gib(over)} over the checkpoint: "
                    f"{why_other})")
        if nl:
            msg += f"; {nl} quantized linear parts dequantized to bf16 ({gib(bl)}: {why_linear})"
        return msg


class _MLP:
    def __init__(self, w: _Weights, p: str, cfg: ModelConfig):
        H, I = cfg.hidden_size, cfg.intermediate_size
        self.gate_up = w.linear([(p + "gate_proj.weight", (I, H)), (p + "up_proj.weight", (I, H))])
        self.down = w.linear([(p + "down_proj.weight", (H, I))])

    def forward(self, be, bufs, x, T):
        gu = _linear(be, x, self.gate_up, be.rows(bufs["gate_up"], T))
        act = be.silu_mul(gu, be.rows(bufs["act"], T))
        return _linear(be, act, self.down, be.rows(bufs["mix"], T))


class _MoE:
    """The sparse MoE block (HF ``Qwen3_5MoeSparseMoeBlock``): router ``gate.weight`` [E, H], softmax, top-k,
    renormalised; each pick a SwiGLU expert; plus the shared expert scaled by ``sigmoid(shared_expert_gate(x))``.

    Two stored layouts, told apart by layer 0: as transformers 5 holds the parameters (``experts.gate_up_proj``
    [E, 2I, H] rows gate then up, ``experts.down_proj`` [E, H, I]) and as the released checkpoints store them
    (``experts.N.{gate,up,down}_proj.weight``, [I, H] / [I, H] / [H, I]; transformers' qwen2_moe conversion
    stacks those into the former). Both upload as ``w1`` [E', 2I, H] / ``w2`` [E', H, I], the parts copied
    one by one into the device buffer (no host copy of the experts). When the shared expert has the routed
    experts' width it is stacked as expert E (E' = E + 1) and the ops fold it in as a (k+1)-th pick with the
    weight sigmoid(x . shared_gate_w); otherwise (E' = E) it stays a separate SwiGLU MLP passed beside.
    """

    def __init__(self, w: _Weights, p: str, cfg: ModelConfig, fused: bool):
        H, E, I, Is = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
        self.top_k, self.folded = cfg.num_experts_per_tok, Is == I
        self.gate_w = w.load([(p + "gate.weight", (E, H))], "bf16")
        self.shared_gate_w = w.load([(p + "shared_expert_gate.weight", (1, H))], "bf16")
        sh = p + "shared_expert."
        sh_gu = [(sh + "gate_proj.weight", (Is, H)), (sh + "up_proj.weight", (Is, H))]
        sh_d = [(sh + "down_proj.weight", (H, Is))]
        if not fused and self.folded and w.quantized_experts:  # quantized experts kept quantized (module doc)
            mods = [[f"{p}experts.{e}.{n}_proj" for n in ("gate", "up")] for e in range(E)] + \
                [[sh + "gate_proj", sh + "up_proj"]]
            down = [[f"{p}experts.{e}.down_proj"] for e in range(E)] + [[sh + "down_proj"]]
            if H % 32 == 0 and I % 32 == 0 and w.all_nvfp4([m for ms in mods + down for m in ms]):
                self.w1 = w.experts_nvfp4(mods, (I, H))
                self.w2 = w.experts_nvfp4(down, (H, I))
                self.shared = None
                return
            g = w.fp8_expert_parts(mods, (I, H))
            d = w.fp8_expert_parts(down, (H, I)) if g else None
            if g and d:  # both checked before either uploads
                self.w1, self.w2, self.shared = w.experts_fp8(g, len(mods)), w.experts_fp8(d, len(down)), None
                return
        if fused:
            gu = [(p + "experts.gate_up_proj", (E, 2 * I, H))]
            dn = [(p + "experts.down_proj", (E, H, I))]
        else:
            gu = [(f"{p}experts.{e}.{n}_proj.weight", (I, H)) for e in range(E) for n in ("gate", "up")]
            dn = [(f"{p}experts.{e}.down_proj.weight", (H, I)) for e in range(E)]
        if self.folded:
            self.w1 = w.load(gu + sh_gu, "bf16", shape=(E + 1, 2 * I, H), rows=H)
            self.w2 = w.load(dn + sh_d, "bf16", shape=(E + 1, H, I), rows=I)
            self.shared = None
        else:
            self.w1 = w.load(gu, "bf16", shape=(E, 2 * I, H), rows=H)
            self.w2 = w.load(dn, "bf16", shape=(E, H, I), rows=I)
            self.shared = (w.load(sh_gu, "bf16"), w.load(sh_d, "bf16"))

    def forward(self, be, bufs, x, T):
        return be.moe_block(x, self.gate_w, self.w1, self.w2, self.top_k, self.shared_gate_w,
                            be.rows(bufs["mix"], T), shared=self.shared)


class _Attention:
    def __init__(self, w: _Weights, p: str, cfg: ModelConfig, layer: int):
        H, Hq, Hkv, D = cfg.hidden_size, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        self.layer, self.Hq, self.Hkv, self.D = layer, Hq, Hkv, D
        self.eps, self.theta, self.scale = cfg.rms_norm_eps, cfg.rope_theta, D ** -0.5
        self.qkv = w.linear([(p + "q_proj.weight", (Hq * 2 * D, H)), (p + "k_proj.weight", (Hkv * D, H)),
                             (p + "v_proj.weight", (Hkv * D, H))])
        self.o = w.linear([(p + "o_proj.weight", (H, Hq * D))])
        self.q_norm = w.load([(p + "q_norm.weight", (D,))], "bf16")
        self.k_norm = w.load([(p + "k_norm.weight", (D,))], "bf16")

    def forward(self, be, bufs, cache, s: Step, x):
        T, Hq, Hkv, D = s.T, self.Hq, self.Hkv, self.D
        qkv = _linear(be, x, self.qkv, be.rows(bufs["attn_qkv"], T))
        qg = be.cols(qkv, 0, Hq * 2 * D)
        k = be.cols(qkv, Hq * 2 * D, Hkv * D)
        v = be.heads(be.cols(qkv, Hq * 2 * D + Hkv * D, Hkv * D), Hkv, D)
        q, k = be.qk_norm_rope(qg, k, s.positions, self.q_norm, self.k_norm, Hq, Hkv, D, self.eps, self.theta,
                               be.rows(bufs["q"], T), be.rows(bufs["k"], T))
        kc, vc = cache.kv[self.layer]
        be.reshape_and_cache(k, v, kc, vc, s.slot_mapping)
        gate = be.gate_of(qg, Hq, D)
        out = be.rows(bufs["attn_o"], T)
        if s.decode:
            o = be.attn_decode(q, kc, vc, s.block_tables, s.seq_lens, self.scale, gate, out)
        else:
            o = be.attn_prefill(q, kc, vc, s.block_tables, s.cu_seqlens, s.seq_lens, self.scale, gate, out)
        return _linear(be, be.flat(o), self.o, be.rows(bufs["mix"], T))


class _GatedDeltaNet:
    def __init__(self, w: _Weights, p: str, cfg: ModelConfig, layer: int):
        H, Hk, Hv, Dh = cfg.hidden_size, cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_head_dim
        C, Vd = cfg.gdn_qkv_dim, cfg.gdn_value_dim
        self.layer, self.Hk, self.Hv, self.C, self.Vd, self.eps = layer, Hk, Hv, C, Vd, cfg.rms_norm_eps
        self.in_proj = w.linear([(p + "in_proj_qkv.weight", (C, H)), (p + "in_proj_z.weight", (Vd, H)),
                                 (p + "in_proj_b.weight", (Hv, H)), (p + "in_proj_a.weight", (Hv, H))])
        self.conv = w.load([(p + "conv1d.weight", (C, 1, cfg.conv_width))], "bf16", shape=(C, cfg.conv_width))
        self.A_log = w.load([(p + "A_log", (Hv,))], "f32")
        self.dt_bias = w.load([(p + "dt_bias", (Hv,))], "f32")
        self.norm = w.load([(p + "norm.weight", (Dh,))], "bf16")
        self.out = w.linear([(p + "out_proj.weight", (H, Vd))])
        # b | a as a bf16 run of their own after a quantized one (NVFP4 / FP8 checkpoints keep in_proj_b / a bf16):
        # a decode step computes them inside the recurrent step (recurrent_decode's ba=) instead of a GEMV launch
        ip = self.in_proj
        self.ba = None
        if isinstance(ip, _Segments) and ip.kinds[-1] == "bf16" and tuple(ip.segs[-1][1:]) == (C + Vd, 2 * Hv):
            self.ba = ip.segs[-1][0]
            self.in_proj_decode = _Segments(ip.segs[:-1], ip.kinds[:-1])

    def forward(self, be, bufs, cache, s: Step, x):
        T, C, Vd, Hv = s.T, self.C, self.Vd, self.Hv
        fuse_ba = s.decode and self.ba is not None and T <= BA_IN_STEP_MAX_ROWS
        proj = _linear(be, x, self.in_proj_decode if fuse_ba else self.in_proj, be.rows(bufs["gdn_proj"], T))
        mixed = be.cols(proj, 0, C)
        z = be.cols(proj, C, Vd)
        b = be.cols(proj, C + Vd, Hv)
        a = be.cols(proj, C + Vd + Hv, Hv)
        state, conv_state = cache.gdn[self.layer]
        cout = be.rows(bufs["conv_out"], T)
        core = be.rows(bufs["core"], T)
        if s.decode:
            y = be.conv_decode(mixed, self.conv, conv_state, s.gdn_slots, cout)
            if fuse_ba:  # b and a computed in the step (their columns of proj are not written)
                o = be.gdn_decode(y, None, None, self.A_log, self.dt_bias, state, s.gdn_slots, self.Hk, Hv, core,
                                  ba=(x, self.ba))
            else:
                o = be.gdn_decode(y, a, b, self.A_log, self.dt_bias, state, s.gdn_slots, self.Hk, Hv, core)
        else:
            y = be.conv_prefill(mixed, self.conv, s.cu_seqlens, conv_state, s.gdn_slots, cout)
            o = be.gdn_prefill(y, a, b, self.A_log, self.dt_bias, s.cu_seqlens, self.Hk, Hv, state, s.gdn_slots,
                               core)
        g = be.gated_rmsnorm(be.flat(o), z, self.norm, self.eps, be.rows(bufs["gnorm"], T))
        return _linear(be, g, self.out, be.rows(bufs["mix"], T))


class _Layer:
    def __init__(self, w: _Weights, cfg: ModelConfig, i: int, fused_experts: bool = False):
        p = f"model.layers.{i}."
        H = cfg.hidden_size
        self.in_norm = w.load([(p + "input_layernorm.weight", (H,))], "bf16")
        self.post_norm = w.load([(p + "post_attention_layernorm.weight", (H,))], "bf16")
        if cfg.layer_types[i] == "full_attention":
            self.mixer = _Attention(w, p + "self_attn.", cfg, i)
        else:
            self.mixer = _GatedDeltaNet(w, p + "linear_attn.", cfg, i)
        self.mlp = _MoE(w, p + "mlp.", cfg, fused_experts) if cfg.is_moe else _MLP(w, p + "mlp.", cfg)


def _count_tensors(cfg: ModelConfig, fused_experts: bool = False) -> int:
    n_attn = len(cfg.layer_indices("full_attention"))
    # per layer: dense MLP 3; MoE router + shared gate + shared expert 3 + routed experts (2 fused, else 3 E)
    mlp = (5 + (2 if fused_experts else 3 * cfg.num_experts)) if cfg.is_moe else 3
    # embedding + final norm (+ lm_head); per layer 2 norms + MLP; attention 6; GDN 9
    return 2 + (0 if cfg.tie_word_embeddings else 1) + cfg.num_layers * (2 + mlp) + n_attn * 6 + \
        (cfg.num_layers - n_attn) * 9


class Qwen35Model:
    """Weights + forward. ``max_tokens`` / ``max_seqs`` size the activation buffers (one step's batch)."""

    def __init__(self, cfg: ModelConfig, ckpt: Checkpoint, backend, *, max_tokens: int, max_seqs: int,
                 progress=None, log=None, quantized_experts: bool = True):
        self.cfg, self.be = cfg, backend
        self.max_tokens, self.max_seqs = int(max_tokens), int(max_seqs)
        H, V = cfg.hidden_size, cfg.vocab_size
        # the expert layout of layer 0 (a dummy checkpoint contains every name: it serves the per-expert one)
        fused = cfg.is_moe and "model.layers.0.mlp.experts.gate_up_proj" in ckpt and \
            "model.layers.0.mlp.experts.0.up_proj.weight" not in ckpt
        w = _Weights(ckpt, backend, progress, _count_tensors(cfg, fused), quant=cfg.quant,
                     quantized_experts=quantized_experts)
        self.embed = w.load([("model.embed_tokens.weight", (V, H))], "bf16")
        self.layers = [_Layer(w, cfg, i, fused) for i in range(cfg.num_layers)]
        self.final_norm = w.load([("model.norm.weight", (H,))], "bf16")
        if cfg.tie_word_embeddings:
            self.lm_head = self.embed
            w.used.add("lm_head.weight")  # a tied checkpoint may still store a copy
            w.bf16_linears.add((V, H))
        else:
            self.lm_head = w.linear([("lm_head.weight", (V, H))])
        # (N, K) of every bf16 GEMM the forward launches (FP8 linears run ops.gemm_fp8, which has no plans); for a
        # bf16 checkpoint this is vkc_engine.gemm_shapes.linear_shapes(cfg)
        self.gemm_shapes = sorted(w.bf16_linears)
        extra = [n for n in ckpt.names() if n not in w.used]
        if extra:
            more = f" (and {len(extra) - 5} more)" if len(extra) > 5 else ""
            raise CheckpointError(f"{ckpt.dir}: tensors the {'MoE' if cfg.is_moe else 'dense'} "
                                  f"Qwen3.5 decoder does not use: "
                                  f"{', '.join(extra[:5])}{more}")
        if cfg.quant is not None and log is not None:
            log(w.summary())
        self._alloc_buffers()

    def _alloc_buffers(self) -> None:
        cfg, be, Tm, Bm = self.cfg, self.be, self.max_tokens, self.max_seqs
        H, I = cfg.hidden_size, cfg.intermediate_size
        Hq, Hkv, D = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        C, Vd, Hv = cfg.gdn_qkv_dim, cfg.gdn_value_dim, cfg.gdn_v_heads
        shapes = {"residual": (Tm, H), "h": (Tm, H), "mix": (Tm, H), "sel": (Tm, H)}
        if not cfg.is_moe:
            shapes.update(gate_up=(Tm, 2 * I), act=(Tm, I))  # a MoE block's buffers are the backend's workspace
        if cfg.layer_indices("full_attention"):
            shapes.update(attn_qkv=(Tm, Hq * 2 * D + 2 * Hkv * D), q=(Tm, Hq, D), k=(Tm, Hkv, D), attn_o=(Tm, Hq, D))
        if cfg.layer_indices("linear_attention"):
            shapes.update(gdn_proj=(Tm, C + Vd + 2 * Hv), conv_out=(Tm, C), core=(Tm, Hv, cfg.gdn_head_dim),
                          gnorm=(Tm, Vd))
        self.bufs = {k: be.empty(v, "bf16") for k, v in shapes.items()}
        self.bufs["logits"] = be.empty((Bm, cfg.vocab_size), "bf16")

    def forward(self, cache, s: Step, logits_out=None):
        """Logits [s.n_logits, V] of the rows ``s.logit_rows`` (into ``logits_out`` when given, else the
        preallocated buffer, which holds up to max_seqs rows)."""
        be, bufs, cfg, T = self.be, self.bufs, self.cfg, s.T
        eps = cfg.rms_norm_eps
        if T > self.max_tokens:
            raise ValueError(f"step of {T} tokens exceeds max_tokens {self.max_tokens}")
        residual = be.embedding(s.ids, self.embed, be.rows(bufs["residual"], T))
        h_buf = be.rows(bufs["h"], T)
        out = None
        for i, layer in enumerate(self.layers):
            if i == 0:
                h = be.rmsnorm(residual, layer.in_norm, eps, h_buf)
            else:
                h = be.add_rmsnorm(out, residual, layer.in_norm, eps, h_buf)
            mix = layer.mixer.forward(be, bufs, cache, s, h)
            h = be.add_rmsnorm(mix, residual, layer.post_norm, eps, h_buf)
            out = layer.mlp.forward(be, bufs, h, T)
        h = be.add_rmsnorm(out, residual, self.final_norm, eps, h_buf)
        sel = be.embedding(s.logit_rows, h, be.rows(bufs["sel"], s.n_logits))
        if logits_out is None:
            if s.n_logits > self.max_seqs:
                raise ValueError(f"{s.n_logits} logit rows exceed the buffer of max_seqs {self.max_seqs}")
            logits_out = be.rows(bufs["logits"], s.n_logits)
        return _linear(be, sel, self.lm_head, logits_out)


def host_step_arrays(chunks, block_size: int, max_blocks: int) -> dict[str, np.ndarray]:
    """Host int32 arrays of a step from ``chunks``: (tokens, start, block_table, gdn_slot, want_logits) per
    sequence, where ``tokens`` are the new tokens at positions start .. start + len - 1. ``want_logits``:
    'last', 'all' or None."""
    ids, pos, slots, cu, lens, rows = [], [], [], [0], [], []
    bt = np.full((len(chunks), max_blocks), -1, dtype=np.int32)
    gslots = np.empty(len(chunks), dtype=np.int32)
    for n, (toks, start, table, gslot, want) in enumerate(chunks):
        t0 = cu[-1]
        L = len(toks)
        p = np.arange(start, start + L, dtype=np.int64)
        tab = np.asarray(table, dtype=np.int64)
        ids.append(np.asarray(toks, dtype=np.int32))
        pos.append(p.astype(np.int32))
        slots.append((tab[p // block_size] * block_size + p % block_size).astype(np.int32))
        cu.append(t0 + L)
        lens.append(start + L)
        bt[n, :len(table)] = table
        gslots[n] = gslot
        if want == "all":
            rows.extend(range(t0, t0 + L))
        elif want == "last":
            rows.append(t0 + L - 1)
    cat = (lambda xs: np.concatenate(xs).astype(np.int32)) if chunks else (lambda xs: np.zeros(0, np.int32))
    return {"ids": cat(ids), "positions": cat(pos), "slot_mapping": cat(slots),
            "cu_seqlens": np.asarray(cu, dtype=np.int32), "seq_lens": np.asarray(lens, dtype=np.int32),
            "block_tables": bt, "gdn_slots": gslots, "logit_rows": np.asarray(rows, dtype=np.int32)}
