"""Typed ops of the sampler family: one token per row of logits, with per-row parameters on the device.

Semantics (kernels_src/sample/sample.py has the exact formulas): penalties as vLLM applies them (repetition
divides positive / multiplies negative logits of every token seen in the prompt or the output; frequency
subtracts ``freq * count``, presence subtracts ``pres`` once, both over output tokens), then temperature;
``temperature <= 0`` is greedy (argmax, lowest index among equal maxima); otherwise a seeded draw from the
softmax restricted by min-p, top-k and top-p, each measured on the full (penalized, tempered) distribution
("joint" filters: a token stays iff fewer than top_k tokens are larger, the mass of the larger ones is below
top_p, and its probability is at least min_p times the largest). With only one of top-k / top-p set this is
vLLM's rule; with both, vLLM applies top-p after top-k's renormalization and the sets can differ.

Per-row parameters, one row per batch row (build them on the host with :func:`host_params`, copy them into
device arrays allocated once; a captured graph then replays with whatever the arrays hold):

  ``fparams`` float32 [B, NF = 8]: F_TEMPERATURE, F_TOP_P (1 = off), F_MIN_P (0 = off), F_REPETITION (1 = off),
              F_PRESENCE, F_FREQUENCY (0 = off); columns 6, 7 unused
  ``iparams`` int64 [B, NI = 4]: I_TOP_K (0 or negative = off), I_SEED, I_STEP, I_SLOT (penalty slot; -1 = none)

Randomness: a row's draws are Philox(seed) at counters from ``step`` (the caller advances it per generated
token, e.g. the output position), so equal (seed, step, logits row, parameters) give equal tokens whatever
else is in the batch.

Token counts for the penalties: ``counts`` int32 [max_slots, V] (:func:`counts_buffer`), one row per sequence
slot: ``counts[slot, v] = (number of times v was sampled) | PROMPT_BIT (1 << 30) if v is in the prompt``.
:func:`reset_counts` zeroes slots, :func:`add_prompt_tokens` sets the prompt bit (packed prompts, one slot per
token; idempotent), :func:`add_output_tokens` adds the sampled tokens (slot from ``iparams``). Slot and token
values are device data: the kernels skip a slot outside [0, max_slots) or a token outside [0, V) (no counts
read, nothing written). A row whose slot is invalid, or whose three penalties are neutral, reads no counts.

Outputs: ``out`` int32 [B] tokens (always in [0, V)); optional ``logprobs`` float32 [B] (the sampled token's
log-softmax of the processed logits: penalized, tempered, before the filters; greedy rows untempered) and
``top_logprobs`` float32 [B, n] + ``top_ids`` int32 [B, n] (n <= 20: the n most likely tokens, ties lower id
first; id -1 / -inf where the row has fewer finite logits).

Cost (one program per row, each pass reads the row's logits once, plus its counts row when it has penalties):
greedy 1 pass; plain temperature 1 pass + a scan that stops at the drawn token (~1.5 passes); with filters each
draw adds a scan and a check pass (a top-p row needs about 1/top_p draws; flat distributions with a small top-k
need more, at most 32 before the argmax fallback). At small B a pass is bound by one SM's latency, not HBM (the
first pass is not, with a workspace: below); graph-vs-graph figures against torch in BENCHMARKS.md
(benchmarks/bench_sample.py).

Row statistics in parallel (``workspace=``, :func:`sample_workspace`): pass 1 (max, normalizer, argmax) of each
row runs first as B x cdiv(V, SPAN) programs of one slice each (``sample.stats.*``), and the row program merges
their partials instead of reading the row once more on one SM: a greedy row costs one parallel pass and a merge
instead of V / BLOCK dependent steps (Qwen3.6's V = 248320: 31 slices). Rows asking for top-n log-probabilities
still run their own pass 1. The same tokens as without the workspace (the normalizer up to fp32 summation order).

Logits: float32 or bfloat16 [B, V], row stride free, contiguous rows. The ops allocate only outputs that are not
passed (pass ``out=``, the optional outputs and the workspace inside a graph capture). With ``out=`` and torch
tensors, a call with the layout of a recent one is a bound call (vkc_runtime.bound).
"""
from __future__ import annotations

import numpy as np

from .. import memory
from ..bound import CallCache, Launch, run_launches
from ..kernels import get_kernel
from ._check import OpError, aligned, fits_i32, row_stride, same_device, stream_of, tensor

__all__ = ["sample", "sample_workspace", "host_params", "counts_buffer", "reset_counts", "add_prompt_tokens",
           "add_output_tokens", "SPAN", "SMAX", "NF", "NI", "F_TEMPERATURE", "F_TOP_P", "F_MIN_P", "F_REPETITION",
           "F_PRESENCE", "F_FREQUENCY",
           "I_TOP_K", "I_SEED", "I_STEP", "I_SLOT", "PROMPT_BIT", "MAX_TOP_LOGPROBS", "BASES"]

NF, NI = 8, 4
F_TEMPERATURE, F_TOP_P, F_MIN_P, F_REPETITION, F_PRESENCE, F_FREQUENCY = range(6)
I_TOP_K, I_SEED, I_STEP, I_SLOT = range(4)
PROMPT_BIT = 1 << 30
MAX_TOP_LOGPROBS = 20
_DTYPES = {"float32": "f32", "bfloat16": "bf16"}
_VARIANTS = ("a16", "any")
SPAN = 8192  # logits per row-statistics program (kernels_src/sample/spec.py: span, a multiple of 16)
SMAX = 64    # partials per row at most (the row kernel's SMAX): V <= SMAX * SPAN takes the parallel pass


def _row_base(dtype: str, variant: str, kind: str = "row") -> str:
    """The sampler kernels' names (spelled once: the ops call this, BASES is built from it): the row kernel, or
    ``kind`` "stats" (the row-statistics kernel)."""
    return f"sample.{kind}.{_DTYPES[dtype]}.{variant}"


def _base(kind: str) -> str:
    return f"sample.{kind}"


BASES = (*(_row_base(d, v, k) for k in ("row", "stats") for d in _DTYPES for v in _VARIANTS), _base("counts"),
         _base("reset"))
_calls = CallCache()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def host_params(B: int, *, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                presence_penalty=0.0, frequency_penalty=0.0, seed=0, step=0, slot=-1):
    """Host (numpy) parameter rows for B batch rows: ``(fparams float32 [B, NF], iparams int64 [B, NI])``. Each
    keyword is a scalar (every row) or a sequence of B values. Copy the result into the device arrays."""
    def col(v, dtype):
        a = np.asarray(v, dtype=dtype)
        if a.ndim == 0:
            return np.full(B, a, dtype=dtype)
        if a.shape != (B,):
            raise OpError(f"host_params: expected a scalar or {B} values, got shape {a.shape}")
        return a
    fp = np.zeros((B, NF), np.float32)
    ip = np.zeros((B, NI), np.int64)
    for c, v in ((F_TEMPERATURE, temperature), (F_TOP_P, top_p), (F_MIN_P, min_p),
                 (F_REPETITION, repetition_penalty), (F_PRESENCE, presence_penalty),
                 (F_FREQUENCY, frequency_penalty)):
        fp[:, c] = col(v, np.float32)
    for c, v in ((I_TOP_K, top_k), (I_SEED, seed), (I_STEP, step), (I_SLOT, slot)):
        ip[:, c] = col(v, np.int64)
    return fp, ip


def sample_workspace(max_batch: int, V: int, *, device: int | None = None):
    """The row-statistics partials for up to ``max_batch`` rows of V logits (module doc; allocate once, before any
    capture), or None when V needs more than SMAX slices (the serial pass then)."""
    n = _cdiv(V, SPAN)
    if max_batch < 1 or V < 1 or n > SMAX:
        return None
    return memory.DeviceArray.empty((max_batch * n * 4,), "float32", device=device)


def counts_buffer(max_slots: int, V: int, *, device: int | None = None, stream=None):
    """A zeroed int32 [max_slots, V] token-count buffer (allocate it once, before any capture)."""
    return memory.DeviceArray.zeros((max_slots, V), "int32", device=device, stream=stream)


def _params(op, fparams, iparams, B):
    ft = tensor(op, "fparams", fparams, "float32", ndim=2, shape=(B, NF))
    it = tensor(op, "iparams", iparams, "int64", ndim=2, shape=(B, NI))
    for name, t, n in (("fparams", ft, NF), ("iparams", it, NI)):
        if B > 1 and t.strides[0] != n:
            raise OpError(f"{op}: {name} must be a contiguous [B, {n}] array (strides {tuple(t.strides)})")
    return ft, it


def _counts(op, counts, V):
    ct = tensor(op, "counts", counts, "int32", ndim=2, shape=(None, V))
    S = ct.shape[0]
    return ct, S, (row_stride(ct) if S > 0 else 0)


def _vec(op, name, obj, dtype, n):
    t = tensor(op, name, obj, dtype, ndim=1, shape=(n,))
    if n > 1 and t.strides[0] != 1:
        raise OpError(f"{op}: {name} must be contiguous")
    return t


def sample(logits, fparams, iparams, *, counts=None, out=None, logprobs=None, top_logprobs=None, top_ids=None,
           workspace=None, stream=None):
    """One token per row of ``logits`` [B, V] (float32 or bfloat16) with the rows' ``fparams`` / ``iparams``
    (module docstring) -> ``out`` int32 [B]. ``counts``: the penalty buffer (None: no penalties for any row).
    ``logprobs`` float32 [B]: the sampled tokens' log-probabilities; ``top_logprobs`` float32 [B, n] with
    ``top_ids`` int32 [B, n] (n <= 20): the top-n log-probabilities. Optional outputs are written only when
    passed. ``workspace``: :func:`sample_workspace` for at least B rows of V (the parallel row statistics)."""
    op = "sample"
    s = stream_of(stream)
    key = (op, counts is None, logprobs is None, top_logprobs is None, workspace is None)
    opt = tuple(t for t in (counts, logprobs, top_logprobs, top_ids, workspace) if t is not None)
    if out is not None and _calls.run(key, (logits, fparams, iparams, out, *opt), (), s):
        return out
    lt = _logits(op, logits)
    B, V = lt.shape
    if not 1 <= V <= 2**30:
        raise OpError(f"{op}: logits must have 1 <= V <= 2**30 columns, got {V}")
    ft, it = _params(op, fparams, iparams, B)
    res = out if out is not None else memory.DeviceArray.empty((B,), "int32", device=lt.device)
    ot = _vec(op, "out", res, "int32", B)
    ts = [lt, ft, it, ot]
    if counts is not None:
        ct, S, sc = _counts(op, counts, V)
        ts.append(ct)
    else:
        ct, S, sc = lt, 0, 0  # never dereferenced as counts (num_slots = 0)
    if logprobs is not None:
        pt = _vec(op, "logprobs", logprobs, "float32", B)
        ts.append(pt)
    else:
        pt = ot  # never written (want_lp = 0)
    if (top_logprobs is None) != (top_ids is None):
        raise OpError(f"{op}: pass top_logprobs and top_ids together (or neither)")
    if top_logprobs is not None:
        tv = tensor(op, "top_logprobs", top_logprobs, "float32", ndim=2, shape=(B, None))
        n = tv.shape[1]
        ti = tensor(op, "top_ids", top_ids, "int32", ndim=2, shape=(B, n))
        if not 1 <= n <= MAX_TOP_LOGPROBS:
            raise OpError(f"{op}: top_logprobs must have 1..{MAX_TOP_LOGPROBS} columns, got {n}")
        st = row_stride(tv) if B > 0 else n
        if B > 0 and row_stride(ti) != st:
            raise OpError(f"{op}: top_logprobs and top_ids must have the same row stride")
        ts += [tv, ti]
    else:
        tv, ti, n, st = ot, ot, 0, 0
    ns = 0
    if workspace is not None:
        ns = _cdiv(V, SPAN)
        wt = tensor(op, "workspace", workspace, "float32", ndim=1)
        if ns > SMAX or wt.shape[0] < B * ns * 4 or (wt.shape[0] > 1 and wt.strides[0] != 1):
            raise OpError(f"{op}: workspace must be a contiguous float32 buffer of >= B * cdiv(V, {SPAN}) * 4 = "
                          f"{B * ns * 4} elements with cdiv(V, {SPAN}) <= {SMAX} (sample_workspace), got "
                          f"{wt.shape[0]} for V = {V}")
        ts.append(wt)
    else:
        wt = ft  # never read (n_slices = 0)
    same_device(op, *ts)
    if B == 0:
        return res
    sl = row_stride(lt)
    fits_i32(op, B=B, V=V, stride_logits=sl, stride_counts=sc, num_slots=S, stride_top=st)
    v = "a16" if aligned((lt.ptr, ct.ptr), (sl, V, sc)) else "any"
    launches = []
    if ns:
        launches.append(Launch(get_kernel(_row_base(lt.dtype, v, "stats")), (B, ns, 1),
                               (lt, ft, it, ct, wt, sl, V, sc, S, SPAN)))
    launches.append(Launch(get_kernel(_row_base(lt.dtype, v)), (B, 1, 1),
                           (lt, ft, it, ct, ot, pt, tv, ti, wt, sl, V, sc, S, n, st, int(logprobs is not None), ns, SPAN)))
    _calls.launch(key, None if out is None else tuple(ts), (), launches, s)
    return res


def _logits(op, logits):
    """logits [B, V] as float32 or bfloat16 (either is accepted; anything else is refused by tensor())."""
    try:
        dt = memory.as_tensor(logits, "logits").dtype
    except (TypeError, ValueError):
        dt = "float32"  # tensor() reports the problem
    return tensor(op, "logits", logits, dt if dt in _DTYPES else "float32", ndim=2)


def reset_counts(counts, slots, *, stream=None):
    """Zero the count rows of ``slots`` (int64 [n]; values outside [0, max_slots) are skipped on the device)."""
    op = "reset_counts"
    s = stream_of(stream)
    ct = tensor(op, "counts", counts, "int32", ndim=2)
    S, V = ct.shape
    sl = _vec(op, "slots", slots, "int64", _len(op, slots))
    same_device(op, ct, sl)
    n = sl.shape[0]
    if n == 0 or V == 0 or S == 0:
        return
    sc = row_stride(ct)
    k = get_kernel(_base("reset"))
    gy = _cdiv(V, k.constexprs["BLOCK"])
    if gy > 65535:
        raise OpError(f"{op}: V={V} needs {gy} programs on grid axis y (limit 65535)")
    fits_i32(op, n=n, V=V, stride_counts=sc, num_slots=S)
    run_launches([Launch(k, (n, gy, 1), (ct, sl, V, sc, S))], s)


def _len(op, obj) -> int:
    try:
        t = memory.as_tensor(obj, "slots")
    except (TypeError, ValueError) as e:
        raise OpError(f"{op}: {e}") from None
    if len(t.shape) != 1:
        raise OpError(f"{op}: must be 1-dimensional, got shape {tuple(t.shape)}")
    return t.shape[0]


def _add(op, counts, tokens, slot_ref, slot_off, slot_stride, prompt, s):
    ct = tensor(op, "counts", counts, "int32", ndim=2)
    S, V = ct.shape
    n = tokens.shape[0]
    same_device(op, ct, tokens, slot_ref)
    if n == 0 or S == 0 or V == 0:
        return
    sc = row_stride(ct)
    fits_i32(op, n=n, V=V, stride_counts=sc, num_slots=S)
    k = get_kernel(_base("counts"))
    run_launches([Launch(k, (_cdiv(n, k.constexprs["BLOCK"]), 1, 1),
                         (ct, tokens, slot_ref, n, V, sc, S, slot_off, slot_stride, int(prompt)))], s)


def add_prompt_tokens(counts, tokens, slots, *, stream=None):
    """Mark prompt tokens: ``counts[slots[i], tokens[i]] |= PROMPT_BIT`` (tokens int32 [n], slots int64 [n], e.g.
    packed prompts with each token's slot; repeating a token is harmless)."""
    op = "add_prompt_tokens"
    s = stream_of(stream)
    n = _len(op, tokens)
    tt = _vec(op, "tokens", tokens, "int32", n)
    sl = _vec(op, "slots", slots, "int64", n)
    _add(op, counts, tt, sl, 0, 1, True, s)


def add_output_tokens(counts, tokens, iparams, *, stream=None):
    """Count sampled tokens: ``counts[iparams[b, I_SLOT], tokens[b]] += 1`` (tokens int32 [B], e.g. ``out`` of
    :func:`sample` with the same ``iparams``). Graph-capturable."""
    op = "add_output_tokens"
    s = stream_of(stream)
    n = _len(op, tokens)
    tt = _vec(op, "tokens", tokens, "int32", n)
    it = tensor(op, "iparams", iparams, "int64", ndim=2, shape=(n, NI))
    if n > 1 and it.strides[0] != NI:
        raise OpError(f"{op}: iparams must be a contiguous [B, {NI}] array")
    _add(op, counts, tt, it, I_SLOT, NI, False, s)
