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
  moe_block(x [T, H], gate_w [E, H], w1 [E', 2I, H], w2 [E', H, I], top_k, shared_gate_w [1, H], out [T, H]):
  softmax router, top-k (ties: lower id), renormalised, SwiGLU experts, plus the shared expert times
  sigmoid(x . shared_gate_w) -- stacked as expert E of w1 / w2 (E' = E + 1), or given apart as
  ``shared=(gate_up [2Is, H], down [H, Is])`` (E' = E; the numpy backend's only: the kernels fold it in)

Streams: :class:`VkcBackend` owns one non-blocking CUDA stream and passes it to every op; uploads are async
copies on it from a pinned staging ring, downloads wait for that stream only, and nothing uses the legacy
default stream. CUDA graphs (vkc_engine.graphs): :meth:`VkcBackend.capture` / :meth:`replay`; inside
:meth:`VkcBackend.graph_ops` the small-M linear rule below applies.

Small-M linear rule (only for the captured decode steps, where host cost is gone): M <= GEMV_MAX_M (16) rows
-> ``ops.gemv`` (bf16 gemv measured 0.85-1.10x cuBLAS at M <= 16, the CuTe GEMM 0.37-0.82x at M <= 64: the
figures are in BENCHMARKS.md), with a split-K workspace owned here; larger M, K not a multiple of 16, or a
split the workspace cannot hold -> the CuTe GEMM. Eager steps keep the CuTe GEMM for every M: an eager engine
run with gemv at M <= 16 measured slower, being host-bound (BENCHMARKS.md, the engine notes).

FP8 linears (block-wise FP8 checkpoints, vkc_engine.model): :meth:`VkcBackend.weight_fp8` uploads the e4m3 bytes
and the float32 block scales as an :class:`Fp8Weight`; ``linear`` of one runs ``ops.gemm_fp8``:
``quantize_fp8_per_token_group`` of the bf16 activations into buffers made once in ``prepare`` (rows up to the
step's token budget, K up to the model's widest FP8 linear: no allocation, graph-capturable), then
``linear_fp8_block``, at every M. With FP8_GEMV on (the default), captured steps' FP8 linears of M <=
FP8_GEMV_MAX_M (1) rows take ``ops.gemv.gemv_w8a16`` instead (the e4m3 weights dequantized in the kernel, bf16
activations: W8A16 where the GEMM path is W8A8): its CUDA-core M = 1 kernel ran the 27B projections at 49-73%
of the FP8 floor on the H200 (1.35-1.63x cuBLAS bf16), 1.4-1.8x its MMA kernels, which stay behind the W8A8 GEMM
at larger M; a 27B FP8 step at B = 1 went from 20.4 to 10.2 ms (BENCHMARKS.md, session 12). A model
with FP8 weights on an arch without the FP8 kernels (sm_80 / sm_86) is refused by ``check_model`` (no silent
dequantization).

NVFP4 linears (NVFP4 checkpoints, vkc_engine.model): :meth:`VkcBackend.weight_nvfp4` uploads the packed e2m1 codes
and the e4m3 group scales to a temporary device copy and packs them (``ops.nvfp4.pack``) into the MMA layout of
``ops.nvfp4`` with the global multiplier as an :class:`Nvfp4Weight`; ``linear`` of one runs W4A16 through
``ops.nvfp4.linear_nvfp4`` at every M on every arch (the tensor-core kernel, eager and captured steps alike, so a
replay equals its eager step), with a bf16 workspace of the largest NVFP4 linear (made in ``prepare``), so steps of
more than ops.nvfp4.MMA_MAX_M rows dequantize each weight once and run the bf16 GEMM.
"""
from __future__ import annotations

import numpy as np

from .loader import RawTensor, to_bf16_bits, to_float32
from .device_sampling import DeviceSampling
from .profiling import FAMILIES, OpProfiler
from .weights import BackendError, Fp8Weight, Nvfp4Weight, QuantizedUploads

__all__ = ["VkcBackend", "BackendError", "Fp8Weight", "Nvfp4Weight", "GEMV_MAX_M", "FP8_GEMV", "FP8_GEMV_MAX_M",
           "FAMILIES"]

BF16, F32, I32 = "bfloat16", "float32", "int32"
_DT = {"bf16": BF16, "f32": F32, "i32": I32, "u8": "uint8"}
GEMV_MAX_M = 16  # the small-M linear rule (module docstring)
FP8_GEMV = True  # the small-M rule for FP8 linears too (gemv_w8a16, module docstring)
FP8_GEMV_MAX_M = 1  # ... for M <= this (gemv_w8a16's CUDA-core M = 1 kernel)
STAGING_BYTES = 4 << 20  # initial pinned upload ring (grows when one upload needs more than half of it)



def _free_host(drv, ptr: int) -> None:
    from vkc_runtime import deferred  # noqa: PLC0415 - the engine imports vkc_runtime lazily
    if deferred.defer(lambda: _free_host(drv, ptr)):  # cuMemFreeHost inside a capture would invalidate it
        return
    try:
        drv.call(drv.cu.cuMemFreeHost, ptr)
    except Exception:  # interpreter shutdown, context gone: nothing sensible left to do
        pass


def _op_module(name: str, what: str):
    """``vkc_runtime.ops.<name>``, imported on first use (as ``from vkc_runtime.ops import <name>`` would);
    BackendError naming ``what`` when this build lacks it."""
    try:
        return getattr(__import__("vkc_runtime.ops", fromlist=[name]), name)
    except (ImportError, AttributeError) as e:
        raise BackendError(f"vkc_runtime.ops.{name} ({what}) is not available: {e}") from None


def _fp8(cfg) -> bool:
    q = getattr(cfg, "quant", None)
    return q is not None and q.method == "fp8"


class VkcBackend(QuantizedUploads, DeviceSampling, OpProfiler):
    """vkc_runtime's kernels on one CUDA device, on the backend's own stream. Op calls, in the order the model
    uses them (the names the lead wires at merge live only in this class):

    embedding.embedding, norm.rmsnorm, norm.add_rmsnorm, gemm.linear, rope.qk_norm_rope,
    attn.reshape_and_cache, attn.prefill (+ prefill_workspace), attn.decode (+ decode_workspace),
    conv.causal_conv1d, conv.causal_conv1d_update, gdn.chunk_gated_delta_rule (+ workspace_for),
    gdn_decode.recurrent_decode, norm.gated_rmsnorm, act.silu_mul, moe.sparse_moe_block (+ moe_workspace; MoE
    models only, imported when one is loaded); sampling: :meth:`sample`.
    """

    name = "vkc"
    supports_graphs = True  # pure-decode steps replay CUDA graphs (vkc_engine.graphs)
    supports_async_sampling = True  # sample_async + copy_rows: the engine overlaps steps (vkc_engine.llm)
    _nvfp4_elems = 0        # N * K of the largest NVFP4 linear uploaded (weight_nvfp4)
    _nvfp4_ws = None        # its bf16 dequantization workspace (prepare)
    # per-instance state, set by __init__ / prepare (class defaults keep driver-free test subclasses working)
    _s = 0             # the stream handle every op gets (__init__: the backend's own non-blocking stream)
    _small_m = 0       # > 0 inside graph_ops(): linear takes ops.gemv for M <= this
    _gemv_ws = None    # gemv split-K workspace (grown on eager calls inside graph_ops, never during capture)
    _gemv_need = None  # (M, N, K) -> split-K elements (-1: not a gemv shape)
    _capturing = False
    _staging = None    # pinned upload ring: [ptr, nbytes, offset, numpy view]
    _prof = None       # list of (family, event) while profiling
    _gemm_fp8 = None   # vkc_runtime.ops.gemm_fp8 (FP8 checkpoints only)
    _nvfp4 = None      # vkc_runtime.ops.nvfp4 (NVFP4 checkpoints only)
    _fp8_buf = None    # (x_q bytes, x_scale float32, max rows, max K): the FP8 activation buffers (prepare)

    def __init__(self, device: int | None = None):
        self._bind_modules()
        self._drv.ensure_context(device)
        self.device = self._drv.context_device()
        self._gdn_ws = self._pws = self._dws = self._moe_ws = None
        self.stream = self._streams.Stream(device=self.device)
        self._s = self.stream.handle
        self._events: list = []

    def _bind_modules(self, gemm=None, moe=None) -> None:
        """The vkc_runtime modules this backend calls (``gemm`` and ``moe`` injectable for driver-free tests;
        ``moe`` is imported by :meth:`check_model` for MoE models only, so dense models run without it)."""
        from vkc_runtime import driver, memory  # noqa: PLC0415
        from vkc_runtime import stream as streams  # noqa: PLC0415
        from vkc_runtime.ops import act, attn, conv, embedding, gdn, gdn_decode, norm, rope  # noqa: PLC0415
        from vkc_runtime.tensor import TensorRef  # noqa: PLC0415
        if gemm is None:
            gemm = _op_module("gemm", "the BF16 linear op")
        self._drv, self._mem, self._Ref, self._streams = driver, memory, TensorRef, streams
        self._norm, self._attn, self._conv, self._gdn, self._gdn_dec, self._gemm = \
            norm, attn, conv, gdn, gdn_decode, gemm
        self._rope, self._act, self._emb = rope, act, embedding
        from vkc_runtime.ops import gemv, sample  # noqa: PLC0415
        self._sample, self._samp, self._gemv = sample, None, gemv
        self._counts = None  # the penalty counts buffer (init_counts allocates it on first use)
        self._moe = moe

    def _moe_ops(self):
        if self._moe is None:
            self._moe = _op_module("moe", "the MoE kernels a qwen3_5_moe model needs")
        return self._moe

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
        if _fp8(cfg):
            self._fp8_ops()
        if cfg.is_moe:
            self._moe_ops()
            if cfg.shared_expert_intermediate_size != cfg.moe_intermediate_size:
                raise BackendError(f"shared_expert_intermediate_size {cfg.shared_expert_intermediate_size} != "
                                   f"moe_intermediate_size {cfg.moe_intermediate_size}: the MoE kernels run the "
                                   "shared expert as expert E of the stacked weights, which needs equal widths")
            if cfg.num_experts + 1 > 512 or cfg.num_experts_per_tok + 1 > 16:
                raise BackendError(f"{cfg.num_experts} experts, top-{cfg.num_experts_per_tok}: the MoE ops take at "
                                   "most 511 routed experts and top-15 (plus the shared expert)")

    def _fp8_ops(self):
        """ops.gemm_fp8, checked to have the block GEMM and the group quantizer on this device's arch."""
        if self._gemm_fp8 is None:
            g = _op_module("gemm_fp8", "the FP8 GEMM an FP8 checkpoint needs")
            need = [g.quant_base("group")] + [g.gemm_base("block", bm, bn) for bm, bn in g.TILES["block"]]
            have = [b for b in need if g.has_kernel(b)]
            if need[0] not in have or len(have) < 2:
                raise BackendError("this checkpoint has FP8 weights (quantization_config quant_method 'fp8'), but "
                                   "this device's arch has no FP8 kernels (ops.gemm_fp8: linear_fp8_block and "
                                   f"quantize_fp8_per_token_group; missing {[b for b in need if b not in have]}); "
                                   "they exist for sm_89, sm_90a, sm_100a, sm_120a and sm_121a. Use the bf16 "
                                   "checkpoint on this GPU")
            self._gemm_fp8 = g
        return self._gemm_fp8

    def _prepare_fp8(self, max_rows: int, cfg) -> None:
        """The FP8 activation buffers: max_rows x the widest K of any linear (bytes + per-128 scales)."""
        K = max(cfg.hidden_size, cfg.num_q_heads * cfg.head_dim, cfg.gdn_value_dim, cfg.intermediate_size,
                cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size)
        kb = -(-K // 128)
        self._fp8_buf = (self.empty((max_rows * K,), "u8"), self.empty((max_rows * kb,), "f32"), max_rows, K)

    def prepare(self, max_tokens: int, max_seqs: int, cfg) -> None:
        """Workspaces for batches of up to max_tokens tokens in max_seqs sequences (before any capture)."""
        d = self.device
        if self._nvfp4_elems and self._nvfp4_ws is None:
            self._nvfp4_ws = self.empty((self._nvfp4_elems,), "bf16")  # linear_w4a16's dequantized weights
        if _fp8(cfg):
            self._prepare_fp8(max(max_tokens, max_seqs), cfg)
        self._max_seqs, self._vocab = max_seqs, cfg.vocab_size  # the penalty counts buffer's shape (init_counts)
        self._gdn_ws = self._gdn.workspace_for(max_tokens, max_seqs, cfg.gdn_k_heads, cfg.gdn_v_heads, device=d)
        self._pws = self._attn.prefill_workspace(max_tokens, max_seqs, cfg.num_q_heads, cfg.head_dim, device=d)
        self._dws = self._attn.decode_workspace(max_seqs, cfg.num_q_heads, cfg.head_dim, num_kv_heads=cfg.num_kv_heads,
                                                device=d)
        if cfg.is_moe:
            self._moe_ws = self._moe_ops().moe_workspace(max_tokens, cfg.num_experts, cfg.num_experts_per_tok,
                                                         cfg.hidden_size, cfg.moe_intermediate_size, shared=True,
                                                         w8a8=_fp8(cfg), device=d)

    def warm_gemm_plans(self, nks, max_m: int) -> dict:
        """Resolve the GEMM plan (vkc_runtime.plans, ARCHITECTURE.md section 13) of every (M bucket <= ``max_m``,
        N, K) for ``nks`` once, before the first step and any capture: the plan files are loaded, a missing key is
        tuned on this backend's stream (readwrite) or raises here, naming it, before anything is tuned or written
        (frozen), and the native file is published only after every key resolved. Returns the plan cache's report
        (path, mode, fingerprint, file state, declared / loaded / defaults / tuned / rejected / saved)."""
        from vkc_runtime import plans  # noqa: PLC0415
        c = plans.cache_for_context()
        if not plans.tactics.tactics_for(c.arch):  # no GEMM on this arch: ops.gemm.linear raises at the first step
            return c.report()
        return plans.warmup_gemm(plans.declared(nks, max_m), stream=self._s)

    def free_memory(self) -> tuple[int, int]:
        """(free, total) bytes of the device."""
        free, total = self._drv.call(self._drv.cu.cuMemGetInfo)
        return int(free), int(total)

    # ---------------------------------------------------------------------------------------- memory
    def empty(self, shape, dtype: str):
        return self._mem.DeviceArray.empty(tuple(shape), _DT[dtype], device=self.device)

    def zeros(self, shape, dtype: str):
        return self._mem.DeviceArray.zeros(tuple(shape), _DT[dtype], device=self.device, stream=self._s)

    def weight(self, parts: list[RawTensor], dtype: str, shape=None):
        """Upload tensors stacked along dim 0 (a fused projection when several) as one contiguous array of
        ``dtype`` ('bf16' or 'f32'); bf16 parts stored as bf16 are copied from the file mapping directly."""
        rows = sum(p.shape[0] for p in parts)
        tail = parts[0].shape[1:]
        out = self.empty((rows,) + tuple(tail), dtype)
        off = 0
        for p in parts:
            host = p.data if dtype == "u8" else to_bf16_bits(p) if dtype == "bf16" else to_float32(p)
            host = np.ascontiguousarray(host)
            if host.nbytes:  # from pageable memory, then waited for: the host array may go right after
                self._drv.call(self._drv.cu.cuMemcpyHtoDAsync, out.ptr + off, host.ctypes.data, host.nbytes,
                               self._s)
                self.synchronize()
            off += host.nbytes
        return out if shape is None else out.reshape(*shape)

    def _nvfp4_ops(self):
        if self._nvfp4 is None:
            self._nvfp4 = _op_module("nvfp4", "the NVFP4 linears an NVFP4 checkpoint needs")
        return self._nvfp4

    def upload_into(self, dst, host: np.ndarray):
        """Copy a host array into the front of a preallocated flat device buffer of its dtype (an async copy on
        the backend's stream from the pinned staging ring); returns that prefix, shaped like ``host``."""
        host = np.ascontiguousarray(host)
        view = self.rows(dst, host.size).reshape(*host.shape)
        n = host.nbytes
        if n:
            src = self._stage(host)
            self._drv.call(self._drv.cu.cuMemcpyHtoDAsync, view.ptr, src, n, self._s)
        return view

    # -- pinned staging: a ring of page-locked host memory (cuMemHostAlloc, allocated on the first upload). Each
    # upload takes the next 256-byte-aligned region; when the ring is full the stream is synchronised (every
    # copy queued from it has then completed) and it starts over. One upload over half the ring grows it.
    def _pinned(self, nbytes: int, owner) -> tuple[int, np.ndarray, object]:
        """Page-locked host memory (cuMemHostAlloc): (address, uint8 numpy view, finalizer), freed when ``owner``
        is collected or the finalizer is called (after the copies that use it have run)."""
        import ctypes  # noqa: PLC0415
        import weakref  # noqa: PLC0415
        ptr = int(self._drv.call(self._drv.cu.cuMemHostAlloc, int(nbytes), 0, detail=f"pinning {nbytes} host bytes"))
        view = np.ctypeslib.as_array((ctypes.c_uint8 * int(nbytes)).from_address(ptr))
        fin = weakref.finalize(owner, _free_host, self._drv, ptr)
        fin.atexit = False
        return ptr, view, fin

    def _staging_alloc(self, nbytes: int) -> None:
        self._staging_free()
        ptr, view, fin = self._pinned(nbytes, self)
        self._staging = [ptr, int(nbytes), 0, view, fin]

    def _staging_free(self) -> None:
        st, self._staging = self._staging, None
        if st is not None:
            self.synchronize()  # copies queued from it must have run
            st[4].detach()
            _free_host(self._drv, st[0])

    def _stage(self, host: np.ndarray) -> int:
        """The pinned address of a copy of ``host`` (contiguous), valid until the stream has run its copy."""
        n = host.nbytes
        st = self._staging
        if st is None or 2 * n > st[1]:
            self._staging_alloc(max(STAGING_BYTES, 4 * n, 2 * st[1] if st is not None else 0))
            st = self._staging
        off = st[2]
        if off + n > st[1]:
            self.synchronize()
            off = 0
        st[3][off:off + n] = host.reshape(-1).view(np.uint8)
        st[2] = off + (n + 255) // 256 * 256
        return st[0] + off

    def copy_rows(self, dst, dst_start: int, src, src_start: int, n: int) -> None:
        """dst[dst_start : dst_start + n] = src[src_start : src_start + n] (flat device arrays of one dtype), an
        async device-to-device copy on the backend's stream (the engine feeds drawn tokens to the next step)."""
        if dst.dtype_name != src.dtype_name or len(dst.shape) != 1 or len(src.shape) != 1:
            raise BackendError(f"copy_rows needs flat arrays of one dtype, got {dst.shape} {dst.dtype_name} and "
                               f"{src.shape} {src.dtype_name}")
        if n < 0 or not (0 <= dst_start <= dst_start + n <= dst.shape[0]) or not (
                0 <= src_start <= src_start + n <= src.shape[0]):
            raise BackendError(f"copy_rows [{dst_start}, +{n}) <- [{src_start}, +{n}) outside arrays of "
                               f"{dst.shape[0]} / {src.shape[0]}")
        if n:
            it = dst.itemsize
            self._drv.call(self._drv.cu.cuMemcpyDtoDAsync, dst.ptr + dst_start * it, src.ptr + src_start * it,
                           n * it, self._s)

    def synchronize(self) -> None:
        """Wait for everything queued on the backend's stream."""
        self._drv.call(self._drv.cu.cuStreamSynchronize, self._s)

    def to_host(self, x) -> np.ndarray:
        """float32 (bf16 exact) / int32 host copy; waits for the backend's stream only."""
        if isinstance(x, self._mem.DeviceArray):
            return x.to_numpy(stream=self._s)
        raise BackendError("to_host needs a contiguous DeviceArray")

    def zero_slots(self, pool, slots) -> None:
        """Zero pool[s] (a [slots, ...] state pool) for each slot index s (async, on the backend's stream)."""
        per = pool.nbytes // pool.shape[0]
        for s in slots:
            self._drv.call(self._drv.cu.cuMemsetD8Async, pool.ptr + int(s) * per, 0, per, self._s)

    # ---------------------------------------------------------------------------------------- views
    def rows(self, x, n: int):
        """The first n rows of x (a view)."""
        if isinstance(x, self._mem.DeviceArray):
            return self._mem.DeviceArray((n,) + x.shape[1:], x.dtype_name, ptr=x.ptr, base=x, device=x.device,
                                         ctx=x.ctx)
        return self._Ref(x.ptr, (n,) + tuple(x.shape[1:]), tuple(x.strides), x.dtype, x.device, x)

    def segment(self, x, start: int, n: int):
        """Elements [start, start + n) of a flat contiguous array (a view)."""
        if not 0 <= start <= start + n <= x.shape[0] or len(x.shape) != 1:
            raise BackendError(f"segment [{start}, {start + n}) of an array of shape {x.shape}")
        return self._mem.DeviceArray((n,), x.dtype_name, ptr=x.ptr + start * x.itemsize, base=x, device=x.device,
                                     ctx=x.ctx)

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
        return self._emb.embedding(ids, table, out=out, stream=self._s)

    def rmsnorm(self, x, w, eps, out):
        return self._norm.rmsnorm(x, w, eps, out=out, stream=self._s)

    def add_rmsnorm(self, x, residual, w, eps, out):
        return self._norm.add_rmsnorm(x, residual, w, eps, out=out, stream=self._s)

    def gated_rmsnorm(self, x, z, w, eps, out):
        return self._norm.gated_rmsnorm(x, z, w, eps, out=out, stream=self._s)

    def silu_mul(self, x, out):
        return self._act.silu_mul(x, out=out, stream=self._s)

    def linear(self, x, w, out):
        if isinstance(w, Fp8Weight):
            return self._linear_fp8(x, w, out)
        if isinstance(w, Nvfp4Weight):
            return self._linear_nvfp4(x, w, out)
        m = self._small_m
        if m and x.shape[0] <= m:
            ok, ws = self._gemv_plan(x.shape[0], w.shape[0], w.shape[1])
            if ok:
                return self._gemv.gemv(x, w, out, stream=self._s, workspace=ws)
        return self._gemm.linear(x, w, out, stream=self._s)

    def _linear_nvfp4(self, x, w: Nvfp4Weight, out):
        """W4A16 from the MMA layout at every M (ops.nvfp4.linear_nvfp4; module docstring)."""
        ok, ws = self._gemv_plan(x.shape[0], w.shape[0], w.shape[1], kind="nvfp4")
        return self._nvfp4.linear_nvfp4(x, w.mma, out, stream=self._s, workspace=ws if ok else None,
                                        dequant_workspace=self._nvfp4_ws)

    def _linear_fp8(self, x, w: Fp8Weight, out):
        """quantize_fp8_per_token_group(x) into the prepared buffers, then linear_fp8_block (any M); with FP8_GEMV
        the small-M rule's gemv_w8a16."""
        g, buf = self._gemm_fp8, self._fp8_buf
        M, K = x.shape
        m = self._small_m
        if FP8_GEMV and m and M <= min(m, FP8_GEMV_MAX_M):
            ok, ws = self._gemv_plan(M, w.q.shape[0], K, kind="w8a16")
            if ok:
                return self._gemv.gemv_w8a16(x, w.q, w.scale, out, stream=self._s, workspace=ws)
        if g is None or buf is None:
            raise BackendError("an FP8 linear needs check_model and prepare of a model with a quantization_config")
        if M > buf[2] or K > buf[3]:
            raise BackendError(f"FP8 linear of {M} x {K} exceeds the prepared activation buffers ({buf[2]} rows, "
                               f"K {buf[3]})")
        DA = self._mem.DeviceArray
        xq = DA((M, K), "uint8", ptr=buf[0].ptr, base=buf[0], device=buf[0].device, ctx=buf[0].ctx)
        xs = DA((M, -(-K // 128)), F32, ptr=buf[1].ptr, base=buf[1], device=buf[1].device, ctx=buf[1].ctx)
        g.quantize_fp8_per_token_group(x, out=xq, scale=xs, stream=self._s)
        return g.linear_fp8_block(xq, xs, w.q, w.scale, out=out, stream=self._s)

    def qk_norm_rope(self, qg, k, positions, qw, kw, Hq, Hkv, D, eps, theta, q_out, k_out):
        return self._rope.qk_norm_rope(qg, k, positions, qw, kw, Hq, Hkv, D, eps=eps, theta=theta, q_out=q_out,
                                       k_out=k_out, stream=self._s)

    def reshape_and_cache(self, k, v, k_cache, v_cache, slot_mapping):
        self._attn.reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, stream=self._s)

    def attn_prefill(self, q, k_cache, v_cache, block_tables, cu_seqlens, seq_lens, scale, gate, out):
        return self._attn.prefill(q, k_cache, v_cache, block_tables, cu_seqlens, seq_lens, scale, gate=gate, out=out,
                                  workspace=self._pws, stream=self._s)

    def attn_decode(self, q, k_cache, v_cache, block_tables, seq_lens, scale, gate, out):
        return self._attn.decode(q, k_cache, v_cache, block_tables, seq_lens, scale, gate=gate, out=out,
                                 workspace=self._dws, stream=self._s)

    def conv_prefill(self, x, w, cu_seqlens, conv_state, slots, out):
        return self._conv.causal_conv1d(x, w, cu_seqlens, conv_state=conv_state, slot_idx=slots, out=out,
                                        stream=self._s)

    def conv_decode(self, x, w, conv_state, slots, out):
        return self._conv.causal_conv1d_update(x, w, conv_state, slots, out=out, stream=self._s)

    def gdn_prefill(self, qkv, a, b, A_log, dt_bias, cu_seqlens, Hk, Hv, state, slots, out):
        return self._gdn.chunk_gated_delta_rule(qkv, a, b, A_log, dt_bias, cu_seqlens, Hk, Hv, state=state,
                                                slot_idx=slots, out=out, workspace=self._gdn_ws, stream=self._s)

    def gdn_decode(self, qkv, a, b, A_log, dt_bias, state, slots, Hk, Hv, out, ba=None):
        return self._gdn_dec.recurrent_decode(qkv, a, b, A_log, dt_bias, state, slots, Hk, Hv, out=out,
                                              stream=self._s, ba=ba)

    def moe_block(self, x, gate_w, w1, w2, top_k, shared_gate_w, out, shared=None):
        if shared is not None:
            raise BackendError("the MoE kernels fold the shared expert in as expert E (check_model refuses others)")
        return self._moe.sparse_moe_block(x, gate_w, w1, w2, top_k, renormalize=True, shared_gate_w=shared_gate_w,
                                          workspace=self._moe_ws, out=out, stream=self._s)

    def logits_to_host(self, logits) -> np.ndarray:
        """[B, V] float32 on the host (bf16 logits widened exactly)."""
        return self.to_host(logits)

    # ---------------------------------------------------------------------------------------- graphs
    def _gemv_plan(self, M: int, N: int, K: int, kind: str = "bf16"):
        """(whether ops.gemv takes this call, the workspace to pass it): the small-M rule -- K % 16 == 0 and its
        split-K fits the workspace, which grows here on eager calls (the graph runner warms every bucket up
        before the first capture); a call that does not split gets no workspace."""
        key = (M, N, K, kind)
        if self._gemv_need is None:
            self._gemv_need = {}
        need = self._gemv_need.get(key)
        if need is None:
            if K % 16 or N < 1:
                need = -1
            elif kind == "nvfp4":
                need = self._nvfp4.split_workspace_elems(M, N, K, dequant=self._nvfp4_ws is not None,
                                                         device=self.device)
            else:
                need = self._gemv.split_workspace_elems(M, N, K, kind=kind, device=self.device)
            self._gemv_need[key] = need
        if need < 0:
            return False, None
        if need == 0:
            return True, None
        have = 0 if self._gemv_ws is None else self._gemv_ws.size
        if need > have:
            if self._capturing:
                return False, None  # not seen by the warm-up: the GEMM, which needs no workspace
            self.synchronize()  # a launch queued on the old workspace must finish before it is freed
            self._gemv_ws = self._mem.DeviceArray.empty((max(need, 2 * have),), F32, device=self.device)
        return True, self._gemv_ws

    def graph_ops(self):
        """Context manager: the op choices of captured decode steps (the small-M linear rule). Use it around
        the eager warm-up and the capture of a graph alike, so both launch the same kernels."""
        import contextlib  # noqa: PLC0415

        @contextlib.contextmanager
        def ctx():
            old, self._small_m = self._small_m, min(GEMV_MAX_M, self._gemv.max_m())
            try:
                yield self
            finally:
                self._small_m = old
        return ctx()

    def capture(self, fn):
        """Capture ``fn()`` (op calls of this backend) on the backend's stream into an instantiated CUDA graph
        (vkc_runtime.Graph; thread-local capture mode: an unsafe call from this thread -- a synchronisation, an
        allocation, a legacy-stream copy -- fails the capture; a GEMM plan miss raises vkc_runtime.plans.PlanError
        instead of tuning). Run the same calls eagerly once first. The graph is uploaded to the device here
        (cuGraphUpload), so its first replay allocates nothing."""
        from vkc_runtime import plans  # noqa: PLC0415
        g = self._streams.Graph()
        self.synchronize()
        self._capturing = True
        try:  # plans.capturing(): a GEMM plan lookup that would tune, parse or write raises instead
            with g.capture(self._s, mode="thread_local"), plans.capturing():
                fn()
        finally:
            self._capturing = False
        self._drv.call(self._drv.cu.cuGraphUpload, g.exec, self._s)
        return g

    def replay(self, graph) -> None:
        """Launch a captured graph on the backend's stream (returns at once; downloads wait for it)."""
        graph.replay(self._s)

    def release_graph(self, graph) -> None:
        graph.reset()
