"""A float32 numpy implementation of vkc_engine's backend interface (runtime/vkc_engine/backend.py), for CPU
tests of the engine's wiring against HF transformers. Straightforward per-sequence, per-token math (no
chunking tricks), written from the op contracts in runtime/vkc_runtime/ops/*.py.

Freshly allocated float buffers are filled with NaN (int buffers with -7), so a read of anything the step did
not write shows up in the logits.

FP8 linears (``weight_fp8``): the math of ops.gemm_fp8 in numpy -- the activations quantized per token per 128
columns (scale = max(amax / 448, 1 / (448 * 512)) in float32, q = e4m3(clip(x / scale, +-448)) rounded to
nearest even (:func:`round_e4m3`, checked against ml_dtypes in tests/test_engine_fp8_cpu.py), then the GEMM of the
dequantized operands in float64 (equal, up to rounding, to the kernel's sum of per-block partial products times
both scales). ``NumpyBackend(fp8_act_quant=False)`` skips the activation quantization (weight-loading tests).
"""
from __future__ import annotations

import numpy as np

from vkc_engine.loader import E4M3_VALUES, to_float32

_NP = {"bf16": np.float32, "f32": np.float32, "i32": np.int32}


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _rms(x, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)


FP8_MAX, MIN_SCALE = np.float32(448.0), np.float32(1.0 / (448.0 * 512.0))


def round_e4m3(v: np.ndarray) -> np.ndarray:
    """Round float values in [-448, 448] to the nearest float8_e4m3fn value, ties to even (3 mantissa bits; below
    2^-6 the subnormal step 2^-9), exactly in float64."""
    v = np.asarray(v, np.float64)
    _, ex = np.frexp(v)
    step = np.ldexp(1.0, np.maximum(ex - 1, -6) - 3)
    return np.round(v / step) * step


def fp8_group_quant(x: np.ndarray) -> np.ndarray:
    """float32 [M, K] -> the dequantized values of its per-token-group (1 x 128) dynamic e4m3 quantization."""
    x = np.asarray(x, np.float32)
    M, K = x.shape
    kb = -(-K // 128)
    g = np.zeros((M, kb * 128), np.float32)
    g[:, :K] = x
    g = g.reshape(M, kb, 128)
    scale = np.maximum(np.abs(g).max(-1) / FP8_MAX, MIN_SCALE).astype(np.float32)[..., None]
    q = round_e4m3(np.clip(g / scale, -FP8_MAX, FP8_MAX)).astype(np.float32)
    return (q * scale).reshape(M, kb * 128)[:, :K]


class Fp8NumpyWeight:
    """An FP8 linear: e4m3 values [N, K] as float32 and the float32 block scales [cdiv(N, 128), cdiv(K, 128)]."""

    def __init__(self, q, scale):
        self.q, self.scale = q, scale
        self.shape = q.shape

    def dequantized(self) -> np.ndarray:
        N, K = self.shape
        s = np.repeat(np.repeat(self.scale.astype(np.float64), 128, 0), 128, 1)[:N, :K]
        return self.q.astype(np.float64) * s


class Fp8NumpyExperts(np.ndarray):
    """Block-wise FP8 MoE experts (backend.experts_fp8): their values e4m3 * scale [E', R, K] as float64."""


class Nvfp4NumpyExperts(np.ndarray):
    """NVFP4 MoE experts (backend.experts_nvfp4): their values e2m1 * e4m3 * alpha [E', R, K] as float64."""


class Nvfp4NumpyWeight:
    """An NVFP4 linear (W4A16): its exact values e2m1 * e4m3 [N, K] as float64 and the global multiplier."""

    def __init__(self, w, alpha):
        self.w, self.alpha = w, float(alpha)
        self.shape = w.shape


class _Pending:
    def __init__(self, res, tokens):
        self.res, self.tokens = res, tokens

    def result(self):
        return self.res


class NumpyBackend:
    name = "numpy"
    supports_graphs = False

    def __init__(self, fp8_act_quant: bool = True):
        self.calls: list[str] = []
        self.fp8_act_quant = fp8_act_quant  # False: FP8 linears on unquantized activations (weight-loading tests)

    def _log(self, name):
        self.calls.append(name)

    def check_model(self, cfg) -> None:
        if cfg.rotary_dim * 4 != cfg.head_dim:
            raise ValueError("the numpy backend, like qk_norm_rope, rotates head_dim / 4")

    def prepare(self, max_tokens, max_seqs, cfg) -> None:
        from vkc_engine.sampler import HostCounts
        self.counts = HostCounts(max_seqs, cfg.vocab_size)

    def free_memory(self):
        return 1 << 30, 1 << 30

    def warm_gemm_plans(self, nks, max_m):  # host math: no GEMM plans (VkcBackend's resolves them)
        return None

    # memory
    def empty(self, shape, dtype):
        return np.full(shape, -7 if dtype == "i32" else np.nan, dtype=_NP[dtype])

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=_NP[dtype])

    def weight(self, parts, dtype, shape=None):
        w = np.concatenate([to_float32(p) for p in parts], axis=0)
        return w if shape is None else w.reshape(shape)

    def weight_fp8(self, parts, scales):
        assert all(p.dtype == "F8_E4M3" for p in parts) and all(s.dtype == "F32" for s in scales)
        return Fp8NumpyWeight(np.concatenate([E4M3_VALUES[p.data] for p in parts], axis=0),
                              np.concatenate([to_float32(s) for s in scales], axis=0))

    def weight_nvfp4(self, packed, scales, alpha):
        assert all(p.dtype == "U8" for p in packed) and all(s.dtype == "F8_E4M3" for s in scales)
        from vkc_engine.loader import E2M1_VALUES
        p = np.concatenate([t.data for t in packed], axis=0)
        codes = np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], -1)
        s = np.repeat(np.concatenate([E4M3_VALUES[t.data] for t in scales], axis=0), 16, axis=1)
        return Nvfp4NumpyWeight(E2M1_VALUES[codes].astype(np.float64) * s, alpha)

    def experts_nvfp4(self, packed, scales, alpha, experts):
        """float64 [experts, R, K]: each part's exact e2m1 * e4m3 values times its module's multiplier (alpha
        [experts, parts per expert])."""
        parts = [self.weight_nvfp4([p], [s], 1.0).w for p, s in zip(packed, scales)]
        a = np.asarray(alpha, np.float32).reshape(-1)
        assert a.size == len(parts) and len(parts) % experts == 0
        w = np.concatenate([p * np.float64(x) for p, x in zip(parts, a)], axis=0)
        return w.reshape(experts, -1, w.shape[1]).view(Nvfp4NumpyExperts)

    def experts_fp8(self, parts, scales, experts):
        """float64 [experts, R, K]: each part's e4m3 values times its 128 x 128 block scales."""
        assert all(p.dtype == "F8_E4M3" for p in parts) and all(s.dtype == "F32" for s in scales)
        w = np.concatenate([Fp8NumpyWeight(E4M3_VALUES[p.data], to_float32(s)).dequantized()
                            for p, s in zip(parts, scales)], axis=0)
        return w.reshape(experts, -1, w.shape[1]).view(Fp8NumpyExperts)

    def upload_into(self, dst, host):
        view = dst[:host.size].reshape(host.shape)
        view[...] = host
        return view

    def to_host(self, x):
        return np.array(x, dtype=np.float32)

    def logits_to_host(self, x):
        return np.array(x, dtype=np.float32)

    def zero_slots(self, pool, slots):
        for s in slots:
            pool[int(s)] = 0

    # views
    def rows(self, x, n):
        return x[:n]

    def cols(self, x, start, width):
        return x[:, start:start + width]

    def heads(self, x, H, D):
        return x.reshape(x.shape[0], H, D)

    def flat(self, x):
        return x.reshape(x.shape[0], -1)

    def gate_of(self, qg, H, D):
        return qg.reshape(qg.shape[0], H, 2, D)[:, :, 1]

    # ops
    def embedding(self, ids, table, out):
        self._log("embedding")
        ok = (ids >= 0) & (ids < table.shape[0])
        out[...] = 0
        out[ok] = table[ids[ok]]
        return out

    def rmsnorm(self, x, w, eps, out):
        self._log("rmsnorm")
        out[...] = _rms(x, eps) * (1.0 + w)
        return out

    def add_rmsnorm(self, x, residual, w, eps, out):
        self._log("add_rmsnorm")
        residual[...] = x + residual
        out[...] = _rms(residual, eps) * (1.0 + w)
        return out

    def gated_rmsnorm(self, x, z, w, eps, out):
        self._log("gated_rmsnorm")
        T = x.shape[0]
        xh, zh = x.reshape(T, -1, 128), z.reshape(T, -1, 128)
        out[...] = (_rms(xh, eps) * w * _silu(zh.astype(np.float64))).reshape(T, -1)
        return out

    def silu_mul(self, x, out):
        self._log("silu_mul")
        I = x.shape[1] // 2
        out[...] = _silu(x[:, :I].astype(np.float64)) * x[:, I:]
        return out

    def linear(self, x, w, out):
        if isinstance(w, Fp8NumpyWeight):
            self._log("linear_fp8")
            xq = fp8_group_quant(x) if self.fp8_act_quant else x
            out[...] = xq.astype(np.float64) @ w.dequantized().T
            return out
        if isinstance(w, Nvfp4NumpyWeight):  # W4A16: the exact weights, the multiplier after the product
            self._log("linear_nvfp4")
            out[...] = (x.astype(np.float64) @ w.w.T) * w.alpha
            return out
        self._log("linear")
        out[...] = x.astype(np.float64) @ w.astype(np.float64).T
        return out

    def qk_norm_rope(self, qg, k, positions, qw, kw, Hq, Hkv, D, eps, theta, q_out, k_out):
        self._log("qk_norm_rope")
        T = qg.shape[0]
        q = qg.reshape(T, Hq, 2, D)[:, :, 0]
        r = D // 4
        inv = 1.0 / (theta ** (np.arange(0, r, 2, dtype=np.float64) / r))
        ang = positions.astype(np.float64)[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

        def one(x, w):
            y = _rms(x, eps) * (1.0 + w)
            x1, x2 = y[..., :r // 2].copy(), y[..., r // 2:r].copy()
            y[..., :r // 2] = x1 * cos - x2 * sin
            y[..., r // 2:r] = x2 * cos + x1 * sin
            return y

        q_out[...] = one(q, qw)
        k_out[...] = one(k.reshape(T, Hkv, D), kw)
        return q_out, k_out

    def reshape_and_cache(self, k, v, k_cache, v_cache, slot_mapping):
        self._log("reshape_and_cache")
        NB, BS, Hkv, D = k_cache.shape
        kf, vf = k_cache.reshape(NB * BS, Hkv, D), v_cache.reshape(NB * BS, Hkv, D)
        ok = (slot_mapping >= 0) & (slot_mapping < NB * BS)
        kf[slot_mapping[ok]] = k[ok]
        vf[slot_mapping[ok]] = v[ok]

    def _attend(self, q, kc, vc, table, L, scale):
        """q [n, Hq, D] are the last n positions of a context of L keys."""
        NB, BS, Hkv, D = kc.shape
        n, Hq, _ = q.shape
        pos = np.arange(L)
        blocks = np.asarray(table)[pos // BS]
        K = kc[blocks, pos % BS].astype(np.float64)   # [L, Hkv, D]
        Vv = vc[blocks, pos % BS].astype(np.float64)
        grp = Hq // Hkv
        K, Vv = np.repeat(K, grp, axis=1), np.repeat(Vv, grp, axis=1)  # [L, Hq, D]
        s = np.einsum("nhd,lhd->hnl", q.astype(np.float64), K) * scale
        qpos = np.arange(L - n, L)
        s = np.where(pos[None, None, :] <= qpos[None, :, None], s, -np.inf)
        s -= s.max(-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(-1, keepdims=True)
        return np.einsum("hnl,lhd->nhd", p, Vv)

    def attn_prefill(self, q, kc, vc, block_tables, cu, seq_lens, scale, gate, out):
        self._log("attn_prefill")
        for i in range(len(seq_lens)):
            a, b = cu[i], cu[i + 1]
            if b > a:
                out[a:b] = self._attend(q[a:b], kc, vc, block_tables[i], int(seq_lens[i]), scale) * \
                    _sigmoid(gate[a:b].astype(np.float64))
        return out

    def attn_decode(self, q, kc, vc, block_tables, seq_lens, scale, gate, out):
        self._log("attn_decode")
        for i in range(q.shape[0]):
            if int(seq_lens[i]) <= 0:  # the kernels' rule: a row that sees no key yields zeros
                out[i] = 0
                continue
            out[i:i + 1] = self._attend(q[i:i + 1], kc, vc, block_tables[i], int(seq_lens[i]), scale) * \
                _sigmoid(gate[i:i + 1].astype(np.float64))
        return out

    def _conv_seq(self, x, w, state, slot):
        W = w.shape[1]
        valid = 0 <= slot < state.shape[0]
        prev = state[slot].astype(np.float64) if valid else np.zeros((W - 1, x.shape[1]))
        xx = np.concatenate([prev, x.astype(np.float64)], axis=0)
        y = sum(xx[j:j + x.shape[0]] * w[:, j] for j in range(W))
        if valid and x.shape[0]:
            state[slot] = xx[-(W - 1):]
        return _silu(y)

    def conv_prefill(self, x, w, cu, conv_state, slots, out):
        self._log("conv_prefill")
        for i in range(len(slots)):
            a, b = cu[i], cu[i + 1]
            out[a:b] = self._conv_seq(x[a:b], w, conv_state, int(slots[i]))
        return out

    def conv_decode(self, x, w, conv_state, slots, out):
        self._log("conv_decode")
        for i in range(x.shape[0]):
            out[i:i + 1] = self._conv_seq(x[i:i + 1], w, conv_state, int(slots[i]))
        return out

    def _gdn_seq(self, qkv, a, b, A_log, dt_bias, Hk, Hv, state, slot):
        T = qkv.shape[0]
        K = 128
        q = qkv[:, :Hk * K].reshape(T, Hk, K).astype(np.float64)
        k = qkv[:, Hk * K:2 * Hk * K].reshape(T, Hk, K).astype(np.float64)
        v = qkv[:, 2 * Hk * K:].reshape(T, Hv, K).astype(np.float64)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * K ** -0.5
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
        rep = Hv // Hk
        q, k = np.repeat(q, rep, axis=1), np.repeat(k, rep, axis=1)
        x = a.astype(np.float64) + dt_bias
        g = -np.exp(A_log.astype(np.float64)) * np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
        beta = _sigmoid(b.astype(np.float64))
        valid = 0 <= slot < state.shape[0]
        S = state[slot].astype(np.float64) if valid else np.zeros((Hv, K, K))
        o = np.empty((T, Hv, K))
        for t in range(T):
            S = S * np.exp(g[t])[:, None, None]
            mem = np.einsum("hkv,hk->hv", S, k[t])
            delta = (v[t] - mem) * beta[t][:, None]
            S = S + k[t][:, :, None] * delta[:, None, :]
            o[t] = np.einsum("hkv,hk->hv", S, q[t])
        if valid and T:
            state[slot] = S
        return o

    def gdn_prefill(self, qkv, a, b, A_log, dt_bias, cu, Hk, Hv, state, slots, out):
        self._log("gdn_prefill")
        for i in range(len(slots)):
            s, e = cu[i], cu[i + 1]
            out[s:e] = self._gdn_seq(qkv[s:e], a[s:e], b[s:e], A_log, dt_bias, Hk, Hv, state, int(slots[i]))
        return out

    def gdn_decode(self, qkv, a, b, A_log, dt_bias, state, slots, Hk, Hv, out, ba=None):
        self._log("gdn_decode")
        if ba is not None:  # b and a from the block's input (recurrent_decode's ba=): what linear would write
            x, w = ba
            ab = (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)
            b, a = ab[:, :Hv], ab[:, Hv:]
        for i in range(qkv.shape[0]):
            out[i:i + 1] = self._gdn_seq(qkv[i:i + 1], a[i:i + 1], b[i:i + 1], A_log, dt_bias, Hk, Hv, state,
                                         int(slots[i]))
        return out

    def moe_block(self, x, gate_w, w1, w2, top_k, shared_gate_w, out, shared=None):
        """HF's Qwen3_5MoeSparseMoeBlock: softmax over the E routed experts, top-k (ties: the lower id, a stable
        descending sort), renormalised; SwiGLU experts summed with those weights; the shared expert (expert E of
        w1 / w2, or ``shared`` = (gate_up, down) apart) scaled by sigmoid(x . shared_gate_w)."""
        self._log("moe_block")
        x64 = x.astype(np.float64)
        E = gate_w.shape[0]
        logits = x64 @ gate_w.astype(np.float64).T
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        ids = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
        wts = np.take_along_axis(p, ids, axis=-1)
        wts /= wts.sum(-1, keepdims=True)

        def swiglu(xs, gu, dn):
            h = xs @ gu.astype(np.float64).T
            n = h.shape[1] // 2
            return (_silu(h[:, :n]) * h[:, n:]) @ dn.astype(np.float64).T

        acc = np.zeros_like(x64)
        for e in np.unique(ids):
            tok, j = np.nonzero(ids == e)
            acc[tok] += wts[tok, j, None] * swiglu(x64[tok], w1[e], w2[e])
        if shared is None:
            assert w1.shape[0] == E + 1 and w2.shape[0] == E + 1
            sh = swiglu(x64, w1[E], w2[E])
        else:
            assert w1.shape[0] == E and w2.shape[0] == E
            sh = swiglu(x64, *shared)
        acc += _sigmoid(x64 @ shared_gate_w.astype(np.float64).T) * sh
        out[...] = acc
        return out

    def sample(self, logits, params, generators, *, slots=None):
        from vkc_engine.sampler import sample_rows
        return sample_rows(self.logits_to_host(logits), params, generators, counts=self.counts, slots=slots)

    # overlapped steps: the draws land in one "device" token buffer that the next draw overwrites (as on the
    # device), so an engine that fed a step from stale or wrong rows would compute other tokens
    supports_async_sampling = True

    def sample_async(self, logits, params, generators, *, slots=None):
        res = self.sample(logits, params, generators, slots=slots)
        B = len(params)
        if getattr(self, "_tok", None) is None or self._tok.shape[0] < B:
            self._tok = np.full(max(B, 8), -7, np.int32)
        self._tok[:B] = res.tokens
        self._tok[B:] = -7
        self.draws = getattr(self, "draws", 0) + 1
        return _Pending(res, self._tok)

    def copy_rows(self, dst, dst_start, src, src_start, n):
        assert dst.ndim == 1 and src.ndim == 1 and n > 0
        assert 0 <= dst_start <= dst_start + n <= dst.shape[0] and 0 <= src_start <= src_start + n <= src.shape[0]
        dst[dst_start:dst_start + n] = src[src_start:src_start + n]
        self.copies = getattr(self, "copies", 0) + 1

    def init_counts(self, rows):
        for slot, prompt_ids, output_ids in rows:
            self.counts.init(slot, prompt_ids, output_ids)
