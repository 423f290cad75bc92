"""Token sampling on the device for the backend (a mixin of :class:`vkc_engine.backend.VkcBackend`, like
vkc_engine.profiling): :meth:`DeviceSampling.sample` draws one token per logits row with ``ops.sample`` and
:meth:`DeviceSampling.init_counts` sets up the penalty-count rows it reads. It uses the backend's sample module
(``self._sample``), stream (``self._s``), memory module (``self._mem``), ``empty`` / ``rows`` / ``upload_into`` /
``to_host`` and the counts buffer's shape set by ``prepare`` (``self._max_seqs``, ``self._vocab``); it imports
nothing of vkc_runtime itself."""
from __future__ import annotations

import numpy as np

from .sampler import SampleResult

__all__ = ["DeviceSampling"]


class DeviceSampling:
    """sample / init_counts of a backend (module docstring)."""

    _samp = None    # (capacity, float params, int params, tokens, logprobs, top values, top ids, row-statistics
    #                  workspace) buffers
    _counts = None  # the penalty counts buffer (init_counts allocates it on first use)

    def sample(self, logits, params: list, generators: list, *, slots=None):
        """One token per row of logits [B, V] under per-row SamplingParams -> ``sampler.SampleResult`` (host
        arrays), drawn on the device by ``ops.sample`` (only the B tokens, and the log-probabilities when a row
        asks for them, cross to the host). Each sampled row takes a fresh 62-bit seed from its request's
        generator (seeded requests repeat; ``step`` stays 0). Filters follow the kernel's joint
        top-k/top-p/min-p rule (ops.sample); the host sampler stays the tests' reference. ``slots[b]``: row b's
        penalty-count row (set up by :meth:`init_counts`; -1: no penalties); the sampled tokens of those rows
        are counted on the device right after the draw."""
        sp = self._sample
        B = len(params)
        if self._samp is None or self._samp[0] < B:
            cap = max(B, 8)
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
