"""The engine's one door to the kernels: every op the model, the caches and the runner need, as methods of a
backend object. :class:`VkcBackend` maps them onto ``vkc_runtime.ops`` (the only place the engine names an op
module or function); tests run the same model code on a float32 numpy backend with the same methods.

Arrays are whatever the backend makes: here ``vkc_runtime.DeviceArray`` for owned contiguous buffers and
``vkc_runtime.TensorRef`` for strided views (column slices of a fused projection, per-head views, the
attention gate). Layout conventions the model relies on (all row-major, rows = tokens):

  linear(x [M, K], w [N, K]) -> [M, N]           embedding(ids [T], table [V, N]) -> [T, N] (rows gather)
  rmsnorm / add_rmsnorm: RMSNorm(1 + w); add_rmsnorm updates ``residual`` in place to x + residual
  gated_rmsnorm(x [T, Hv*128], z, w [128])       silu_mul([T, 2I]) -> [T, I]
  qk_norm_rope(qg [T, Hq*2*D] (per head query|gate), k [T, Hkv*D], positions) -> q [T, Hq, D], k [T, Hkv, D]
  attention caches [num_blocks, block_size, Hkv, D]; GDN state [slots, Hv, 128, 128] fp32; conv state
  [slots, 3, C] bf16 (C = the GDN conv channels)
"""
from __future__ import annotations

import numpy as np

from .loader import RawTensor, to_bf16_bits, to_float32

__all__ = ["VkcBackend", "BackendError"]

BF16, F32, I32 = "bfloat16", "float32", "int32"
_DT = {"bf16": BF16, "f32": F32, "i32": I32}


class BackendError(RuntimeError):
    """The backend cannot run this model or configuration (the message says which op or size)."""


class VkcBackend:
    """vkc_runtime's kernels on one CUDA device (the default stream). Op calls, in the order the model uses
    them (the names the lead wires at merge live only in this class):

    embedding.embedding, norm.rmsnorm, norm.add_rmsnorm, gemm.linear, rope.qk_norm_rope,
    attn.reshape_and_cache, attn.prefill (+ prefill_workspace), attn.decode (+ decode_workspace),
    conv.causal_conv1d, conv.causal_conv1d_update, gdn.chunk_gated_delta_rule (+ workspace_for),
    gdn_decode.recurrent_decode, norm.gated_rmsnorm, act.silu_mul; sampling: :meth:`sample`.
    """

    name = "vkc"
    supports_graphs = False  # decode capture is a later step; every decode buffer is already preallocated

    def __init__(self, device: int | None = None):
        self._bind_modules()
        self._drv.ensure_context(device)
        self.device = self._drv.context_device()
        self._gdn_ws = self._pws = self._dws = None

    def _bind_modules(self, gemm=None) -> None:
        """The vkc_runtime modules this backend calls (``gemm`` injectable for driver-free tests)."""
        from vkc_runtime import driver, memory  # noqa: PLC0415
        from vkc_runtime.ops import act, attn, conv, embedding, gdn, gdn_decode, norm, rope  # noqa: PLC0415
        from vkc_runtime.tensor import TensorRef  # noqa: PLC0415
        if gemm is None:
            try:
                from vkc_runtime.ops import gemm  # noqa: PLC0415
            except ImportError as e:
                raise BackendError(f"vkc_runtime.ops.gemm (the BF16 linear op) is not available: {e}") from None
        self._drv, self._mem, self._Ref = driver, memory, TensorRef
        self._norm, self._attn, self._conv, self._gdn, self._gdn_dec, self._gemm = \
            norm, attn, conv, gdn, gdn_decode, gemm
        self._rope, self._act, self._emb = rope, act, embedding
        from vkc_runtime.ops import sample  # noqa: PLC0415
        self._sample, self._samp, self._counts = sample, None, None

    # ---------------------------------------------------------------------------------------- checks
    def check_model(self, cfg) -> None:
        """Refuse configurations the kernels were not built for, before any weight is read."""
        if cfg.head_dim not in (128, 256):
            raise BackendError(f"attention head_dim {cfg.head_dim}: the kernels exist for 128 and 256")
        if cfg.rotary_dim * 4 != cfg.head_dim:
            raise BackendError(f"rotary dims {cfg.rotary_dim} of head_dim {cfg.head_dim}: qk_norm_rope rotates "
                               "head_dim / 4 (partial_rotary_factor 0.25)")
        if cfg.num_q_heads // cfg.num_kv_heads > 16:
            raise BackendError(f"GQA group {cfg.num_q_heads // cfg.num_kv_heads} > 16 is not supported")
        if cfg.gdn_head_dim != 128 or cfg.conv_width != 4:
            raise BackendError(f"GDN head dim {cfg.gdn_head_dim} / conv width {cfg.conv_width}: the kernels need "
                               "128 / 4")
        if cfg.hidden_size > 16384:
            raise BackendError(f"hidden_size {cfg.hidden_size} > 16384 (largest rmsnorm row)")

    def prepare(self, max_tokens: int, max_seqs: int, cfg) -> None:
        """Workspaces for batches of up to max_tokens tokens in max_seqs sequences (before any capture)."""
        d = self.device
        self._max_seqs, self._vocab = max_seqs, cfg.vocab_size  # the penalty counts buffer's shape (init_counts)
        self._gdn_ws = self._gdn.workspace_for(max_tokens, max_seqs, cfg.gdn_k_heads, cfg.gdn_v_heads, device=d)
        self._pws = self._attn.prefill_workspace(max_tokens, max_seqs, cfg.num_q_heads, cfg.head_dim, device=d)
        self._dws = self._attn.decode_workspace(max_seqs, cfg.num_q_heads, cfg.head_dim, device=d)

    def free_memory(self) -> tuple[int, int]:
        """(free, total) bytes of the device."""
        free, total = self._drv.call(self._drv.cu.cuMemGetInfo)
        return int(free), int(total)

    # ---------------------------------------------------------------------------------------- memory
    def empty(self, shape, dtype: str):
        return self._mem.DeviceArray.empty(tuple(shape), _DT[dtype], device=self.device)

    def zeros(self, shape, dtype: str):
        return self._mem.DeviceArray.zeros(tuple(shape), _DT[dtype], device=self.device)

    def weight(self, parts: list[RawTensor], dtype: str, shape=None):
        """Upload tensors stacked along dim 0 (a fused projection when several) as one contiguous array of
        ``dtype`` ('bf16' or 'f32'); bf16 parts stored as bf16 are copied from the file mapping directly."""
        rows = sum(p.shape[0] for p in parts)
        tail = parts[0].shape[1:]
        out = self.empty((rows,) + tuple(tail), dtype)
        off = 0
        for p in parts:
            host = to_bf16_bits(p) if dtype == "bf16" else to_float32(p)
            host = np.ascontiguousarray(host)
            if host.nbytes:
                self._drv.call(self._drv.cu.cuMemcpyHtoD, out.ptr + off, host.ctypes.data, host.nbytes)
            off += host.nbytes
        return out if shape is None else out.reshape(*shape)

    def upload_into(self, dst, host: np.ndarray):
        """Copy a host array into the front of a preallocated flat device buffer of its dtype; returns that
        prefix, shaped like ``host``."""
        host = np.ascontiguousarray(host)
        view = self.rows(dst, host.size).reshape(*host.shape)
        if host.nbytes:
            self._drv.call(self._drv.cu.cuMemcpyHtoD, view.ptr, host.ctypes.data, host.nbytes)
        return view

    def to_host(self, x) -> np.ndarray:
        """float32 (bf16 exact) / int32 host copy; synchronous."""
        if isinstance(x, self._mem.DeviceArray):
            return x.to_numpy()
        raise BackendError("to_host needs a contiguous DeviceArray")

    def zero_slots(self, pool, slots) -> None:
        """Zero pool[s] (a [slots, ...] state pool) for each slot index s."""
        per = pool.nbytes // pool.shape[0]
        for s in slots:
            self._drv.call(self._drv.cu.cuMemsetD8, pool.ptr + int(s) * per, 0, per)

    # ---------------------------------------------------------------------------------------- views
    def rows(self, x, n: int):
        """The first n rows of x (a view)."""
        if isinstance(x, self._mem.DeviceArray):
            return self._mem.DeviceArray((n,) + x.shape[1:], x.dtype_name, ptr=x.ptr, base=x, device=x.device,
                                         ctx=x.ctx)
        return self._Ref(x.ptr, (n,) + tuple(x.shape[1:]), tuple(x.strides), x.dtype, x.device, x)

    def _ref(self, x):
        return self._mem.as_tensor(x)

    def cols(self, x, start: int, width: int):
        """Columns [start, start + width) of a 2-D array (a strided view)."""
        r = self._ref(x)
        rs = r.strides[0] if r.shape[0] > 1 else r.shape[1]
        return self._Ref(r.ptr + start * r.itemsize, (r.shape[0], width), (rs, 1), r.dtype, r.device, x)

    def heads(self, x, H: int, D: int):
        """A [T, H*D] row view as [T, H, D]."""
        r = self._ref(x)
        rs = r.strides[0] if r.shape[0] > 1 else H * D
        return self._Ref(r.ptr, (r.shape[0], H, D), (rs, D, 1), r.dtype, r.device, x)

    def flat(self, x):
        """A contiguous [T, H, D] array as [T, H*D]."""
        return x.reshape(x.shape[0], -1)

    def gate_of(self, qg, H: int, D: int):
        """The gate halves of the per-head [query | gate] projection, a [T, H, D] view."""
        r = self._ref(qg)
        rs = r.strides[0] if r.shape[0] > 1 else 2 * H * D
        return self._Ref(r.ptr + D * r.itemsize, (r.shape[0], H, D), (rs, 2 * D, 1), r.dtype, r.device, qg)

    # ---------------------------------------------------------------------------------------- ops
    def embedding(self, ids, table, out):
        return self._emb.embedding(ids, table, out=out)

    def rmsnorm(self, x, w, eps, out):
        return self._norm.rmsnorm(x, w, eps, out=out)

    def add_rmsnorm(self, x, residual, w, eps, out):
        return self._norm.add_rmsnorm(x, residual, w, eps, out=out)

    def gated_rmsnorm(self, x, z, w, eps, out):
        return self._norm.gated_rmsnorm(x, z, w, eps, out=out)

    def silu_mul(self, x, out):
        return self._act.silu_mul(x, out=out)

    def linear(self, x, w, out):
        return self._gemm.linear(x, w, out)

    def qk_norm_rope(self, qg, k, positions, qw, kw, Hq, Hkv, D, eps, theta, q_out, k_out):
        return self._rope.qk_norm_rope(qg, k, positions, qw, kw, Hq, Hkv, D, eps=eps, theta=theta, q_out=q_out,
                                       k_out=k_out)

    def reshape_and_cache(self, k, v, k_cache, v_cache, slot_mapping):
        self._attn.reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)

    def attn_prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens, seq_lens, scale, gate, out):
        return self._attn.prefill(q, k_cache, v_cache, block_tables, cu_seqlens, seq_lens, scale, gate=gate, out=out,
                                  workspace=self._pws)

    def attn_decode(self, q, k_cache, v_cache, block_tables, seq_lens, scale, gate, out):
        return self._attn.decode(q, k_cache, v_cache, block_tables, seq_lens, scale, gate=gate, out=out,
                                 workspace=self._dws)

    def conv_prefill(self, x, w, cu_seqlens, conv_state, slots, out):
        return self._conv.causal_conv1d(x, w, cu_seqlens, conv_state=conv_state, slot_idx=slots, out=out)

    def conv_decode(self, x, w, conv_state, slots, out):
        return self._conv.causal_conv1d_update(x, w, conv_state, slots, out=out)

    def gdn_prefill(self, qkv, a, b, A_log, dt_bias, cu_seqlens, Hk, Hv, state, slots, out):
        return self._gdn.chunk_gated_delta_rule(qkv, a, b, A_log, dt_bias, cu_seqlens, Hk, Hv, state=state,
                                                slot_idx=slots, out=out, workspace=self._gdn_ws)

    def gdn_decode(self, qkv, a, b, A_log, dt_bias, state, slots, Hk, Hv, out):
        return self._gdn_dec.recurrent_decode(qkv, a, b, A_log, dt_bias, state, slots, Hk, Hv, out=out)

    def logits_to_host(self, logits) -> np.ndarray:
        """[B, V] float32 on the host (bf16 logits widened exactly)."""
        return self.to_host(logits)

    def sample(self, logits, params: list, generators: list, *, slots=None):
        """One token per row of logits [B, V] under per-row SamplingParams -> ``sampler.SampleResult`` (host
        arrays), drawn on the device by ``ops.sample`` (only the B tokens, and the log-probabilities when a row
        asks for them, cross to the host). Each sampled row takes a fresh 62-bit seed from its request's
        generator (seeded requests repeat; ``step`` stays 0). Filters follow the kernel's joint
        top-k/top-p/min-p rule (ops.sample); the host sampler stays the tests' reference. ``slots[b]``: row b's
        penalty-count row (set up by :meth:`init_counts`; -1: no penalties); the sampled tokens of those rows
        are counted on the device right after the draw."""
        from .sampler import SampleResult  # noqa: PLC0415
        sp = self._sample
        B = len(params)
        if self._samp is None or self._samp[0] < B:
            cap = max(B, 8)
            I64 = lambda n: self._mem.DeviceArray.empty((n,), "int64", device=self.device)  # noqa: E731
            self._samp = (cap, self.empty((cap * sp.NF,), "f32"), I64(cap * sp.NI), self.empty((cap,), "i32"),
                          self.empty((cap,), "f32"), self.empty((cap * sp.MAX_TOP_LOGPROBS,), "f32"),
                          self.empty((cap * sp.MAX_TOP_LOGPROBS,), "i32"))
        _, fbuf, ibuf, obuf, lbuf, tvbuf, tibuf = self._samp
        slots = [-1] * B if slots is None else [int(s) for s in slots]
        pen = [s >= 0 and p.has_penalties for p, s in zip(params, slots)]
        seeds = [0 if p.greedy else int(g.integers(0, 1 << 62)) for p, g in zip(params, generators)]
        fp, ip = sp.host_params(B, temperature=[p.temperature for p in params],
                                top_k=[max(p.top_k, 0) for p in params], top_p=[p.top_p for p in params],
                                min_p=[p.min_p for p in params], seed=seeds,
                                repetition_penalty=[p.repetition_penalty for p in params],
                                presence_penalty=[p.presence_penalty for p in params],
                                frequency_penalty=[p.frequency_penalty for p in params],
                                slot=[s if q else -1 for s, q in zip(slots, pen)])
        fv, iv, ov = self.upload_into(fbuf, fp), self.upload_into(ibuf, ip), self.rows(obuf, B)
        n_top = max((p.logprobs for p in params if p.logprobs is not None), default=None)
        lp = self.rows(lbuf, B) if n_top is not None else None
        tv = self.rows(tvbuf, B * n_top).reshape(B, n_top) if n_top else None
        ti = self.rows(tibuf, B * n_top).reshape(B, n_top) if n_top else None
        counts = self._counts if any(pen) else None
        sp.sample(logits, fv, iv, counts=counts, out=ov, logprobs=lp, top_logprobs=tv, top_ids=ti)
        if counts is not None:
            sp.add_output_tokens(counts, ov, iv)
        res = SampleResult(self.to_host(ov).astype(np.int32))
        if lp is not None:
            res.logprobs = self.to_host(lp)
        if tv is not None:
            res.top_logprobs, res.top_ids = self.to_host(tv), self.to_host(ti).astype(np.int32)
        return res

    def init_counts(self, rows) -> None:
        """Set up penalty-count rows: for each ``(slot, prompt_ids, output_ids)``, row ``slot`` of the device
        counts buffer (``ops.sample.counts_buffer``, one row per sequence slot, allocated on first use) becomes
        the prompt bit of each prompt token | the count of each output token (a slot handed to a new sequence,
        or to a recomputed one, starts over)."""
        if not rows:
            return
        sp = self._sample
        if self._counts is None:
            self._counts = sp.counts_buffer(self._max_seqs, self._vocab, device=self.device)

        keep = []  # the launches' index arrays stay alive until the next set-up (the kernels may still be queued)

        def dev(host, dtype):
            host = np.ascontiguousarray(host)
            keep.append(self._mem.DeviceArray.empty((host.size,), dtype, device=self.device))
            return self.upload_into(keep[-1], host)
        sl = np.array([r[0] for r in rows], np.int64)
        sp.reset_counts(self._counts, dev(sl, "int64"))
        pt = np.concatenate([np.asarray(r[1], np.int32) for r in rows])
        ps = np.concatenate([np.full(len(r[1]), r[0], np.int64) for r in rows])
        if len(pt):
            sp.add_prompt_tokens(self._counts, dev(pt, "int32"), dev(ps, "int64"))
        ot = np.concatenate([np.asarray(r[2], np.int32) for r in rows])
        if len(ot):
            oi = np.zeros((len(ot), sp.NI), np.int64)
            oi[:, sp.I_SLOT] = np.concatenate([np.full(len(r[2]), r[0], np.int64) for r in rows])
            sp.add_output_tokens(self._counts, dev(ot, "int32"), dev(oi, "int64"))
        self._count_args = keep
