"""Token sampling on the device for the backend (a mixin of :class:`vkc_engine.backend.VkcBackend`, like
vkc_engine.profiling): :meth:`DeviceSampling.sample_async` queues one draw per logits row with ``ops.sample`` and
the copies of the draws to page-locked host memory, and returns at once (:class:`PendingDraws`: the device tokens
a following step may read, and ``result()``, which waits for the copies); :meth:`DeviceSampling.sample` is the
same, waited for; :meth:`DeviceSampling.init_counts` sets up the penalty-count rows the draws read. It uses the
backend's driver (``self._drv``), sample module (``self._sample``), stream (``self._s``), memory module
(``self._mem``), ``empty`` / ``rows`` / ``upload_into`` / ``_pinned`` and the counts buffer's shape set by
``prepare`` (``self._max_seqs``, ``self._vocab``); it imports nothing of vkc_runtime itself."""
from __future__ import annotations

import numpy as np

from .sampler import SampleResult

__all__ = ["DeviceSampling", "PendingDraws"]


def _destroy_event(drv, ev) -> None:
    try:
        drv.call(drv.cu.cuEventDestroy, ev)
    except Exception:  # interpreter shutdown, context gone: nothing sensible left to do
        pass


class _Landing:
    """Page-locked host memory for one step's draws (tokens, their log-probabilities, the top-n values and ids of
    up to ``cap`` rows) and the event recorded after the copies into it; ``gen`` counts its uses."""

    def __init__(self, backend, cap: int, n_top: int):
        import weakref  # noqa: PLC0415
        self.drv, self.cap, self.gen = backend._drv, cap, 0
        _, view, self._fin = backend._pinned(cap * 4 * (2 + 2 * n_top), self)
        parts = np.split(view, np.cumsum([cap * 4, cap * 4, cap * 4 * n_top]))
        self.tok, self.lp, self.tv, self.ti = (p.view(t) for p, t in zip(parts, (np.int32, np.float32, np.float32,
                                                                                np.int32)))
        cu = self.drv.cu
        self.event = self.drv.call(cu.cuEventCreate, int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        weakref.finalize(self, _destroy_event, self.drv, self.event).atexit = False


class PendingDraws:
    """One step's draws, queued on the device (:meth:`DeviceSampling.sample_async`). ``tokens``: the device int32
    [B] the draws land in -- a valid copy source until the backend's next draw is queued; ``result()`` waits for
    their copy to the host and returns the ``sampler.SampleResult``. Two steps' draws may be pending at once;
    reading a step's draws after two later ones were queued raises (its landing memory was reused)."""

    def __init__(self, land: _Landing, B: int, n_top, has_lp: bool, tokens):
        self._land, self._gen, self._B, self._n_top, self._has_lp = land, land.gen, B, n_top, has_lp
        self.tokens = tokens
        self._res = None

    def result(self) -> SampleResult:
        if self._res is None:
            L, B, n = self._land, self._B, self._n_top
            if L.gen != self._gen:
                raise RuntimeError("these draws were not read before two later steps' draws reused their memory")
            L.drv.call(L.drv.cu.cuEventSynchronize, L.event)
            res = SampleResult(L.tok[:B].copy())
            if self._has_lp:
                res.logprobs = L.lp[:B].copy()
            if n:
                res.top_logprobs = L.tv[:B * n].reshape(B, n).copy()
                res.top_ids = L.ti[:B * n].reshape(B, n).copy()
            self._res = res
        return self._res


class DeviceSampling:
    """sample / init_counts of a backend (module docstring)."""

    _samp = None    # (capacity, float params, int params, tokens, logprobs, top values, top ids, row-statistics
    #                  workspace) buffers
    _counts = None  # the penalty counts buffer (init_counts allocates it on first use)
    _land = None    # [capacity, the two _Landing areas used in turn, the next one's index]

    def sample(self, logits, params: list, generators: list, *, slots=None):
        """:meth:`sample_async`, waited for: a ``sampler.SampleResult`` of host arrays."""
        return self.sample_async(logits, params, generators, slots=slots).result()

    def sample_async(self, logits, params: list, generators: list, *, slots=None) -> PendingDraws:
        """One token per row of logits [B, V] under per-row SamplingParams, drawn on the device by ``ops.sample``
        and copied (only the B tokens, and the log-probabilities when a row asks for them) to page-locked host
        memory, all queued on the backend's stream: returns at once (:class:`PendingDraws`). Each sampled row
        takes a fresh 62-bit seed from its request's
        generator (seeded requests repeat; ``step`` stays 0). Filters follow the kernel's joint
        top-k/top-p/min-p rule (ops.sample); the host sampler stays the tests' reference. ``slots[b]``: row b's
        penalty-count row (set up by :meth:`init_counts`; -1: no penalties); the sampled tokens of those rows
        are counted on the device right after the draw."""
        sp = self._sample
        B = len(params)
        if self._samp is None or self._samp[0] < B:
            if self._samp is not None:
                self.synchronize()  # pending draws may still be read from the old buffers
            cap = max(B, 8, getattr(self, "_max_seqs", 0))
            I64 = lambda n: self._mem.DeviceArray.empty((n,), "int64", device=self.device)  # noqa: E731
            self._samp = (cap, self.empty((cap * sp.NF,), "f32"), I64(cap * sp.NI), self.empty((cap,), "i32"),
                          self.empty((cap,), "f32"), self.empty((cap * sp.MAX_TOP_LOGPROBS,), "f32"),
                          self.empty((cap * sp.MAX_TOP_LOGPROBS,), "i32"),
                          sp.sample_workspace(cap, logits.shape[1], device=self.device))
        _, fbuf, ibuf, obuf, lbuf, tvbuf, tibuf, ws = self._samp
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
        sp.sample(logits, fv, iv, counts=counts, out=ov, logprobs=lp, top_logprobs=tv, top_ids=ti, workspace=ws,
                  stream=self._s)
        if counts is not None:
            sp.add_output_tokens(counts, ov, iv, stream=self._s)
        return self._land_draws(B, ov, lp, tv, ti, n_top)

    def _land_draws(self, B: int, ov, lp, tv, ti, n_top) -> PendingDraws:
        """Queue the copies of one step's draws into the next landing area and the event after them."""
        cap = self._samp[0]
        if self._land is None or self._land[0] < cap:
            mt = self._sample.MAX_TOP_LOGPROBS
            self._land = [cap, [_Landing(self, cap, mt), _Landing(self, cap, mt)], 0]
        L = self._land[1][self._land[2]]
        self._land[2] ^= 1
        L.gen += 1
        cu, s = self._drv.cu, self._s
        for dev, host in ((ov, L.tok), (lp, L.lp), (tv, L.tv), (ti, L.ti)):
            if dev is not None and dev.nbytes:
                self._drv.call(cu.cuMemcpyDtoHAsync, host.ctypes.data, dev.ptr, dev.nbytes, s)
        self._drv.call(cu.cuEventRecord, L.event, s)
        return PendingDraws(L, B, n_top, lp is not None, ov)

    def init_counts(self, rows) -> None:
        """Set up penalty-count rows: for each ``(slot, prompt_ids, output_ids)``, row ``slot`` of the device
        counts buffer (``ops.sample.counts_buffer``, one row per sequence slot, allocated on first use) becomes
        the prompt bit of each prompt token | the count of each output token (a slot handed to a new sequence,
        or to a recomputed one, starts over)."""
        if not rows:
            return
        sp = self._sample
        if self._counts is None:
            self._counts = sp.counts_buffer(self._max_seqs, self._vocab, device=self.device, stream=self._s)

        keep = []  # the launches' index arrays stay alive until the next set-up (the kernels may still be queued)

        def dev(host, dtype):
            host = np.ascontiguousarray(host)
            keep.append(self._mem.DeviceArray.empty((host.size,), dtype, device=self.device))
            return self.upload_into(keep[-1], host)
        sl = np.array([r[0] for r in rows], np.int64)
        sp.reset_counts(self._counts, dev(sl, "int64"), stream=self._s)
        pt = np.concatenate([np.asarray(r[1], np.int32) for r in rows])
        ps = np.concatenate([np.full(len(r[1]), r[0], np.int64) for r in rows])
        if len(pt):
            sp.add_prompt_tokens(self._counts, dev(pt, "int32"), dev(ps, "int64"), stream=self._s)
        ot = np.concatenate([np.asarray(r[2], np.int32) for r in rows])
        if len(ot):
            oi = np.zeros((len(ot), sp.NI), np.int64)
            oi[:, sp.I_SLOT] = np.concatenate([np.full(len(r[2]), r[0], np.int64) for r in rows])
            sp.add_output_tokens(self._counts, dev(ot, "int32"), dev(oi, "int64"), stream=self._s)
        self._count_args = keep
