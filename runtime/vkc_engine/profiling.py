"""Per-kernel-family device time of engine steps (``bench_engine.py --breakdown``, DecodeGraphs.profile): a
mixin of the backend that records a CUDA event on the backend's stream before every op call, so the time from one
op's event to the next is charged to the op's family. It uses the backend's own driver module (``self._drv``),
stream (``self._s``), capture flag (``self._capturing``), event pool (``self._events``) and ``synchronize``;
it imports nothing of vkc_runtime (the engine reaches the runtime through vkc_engine/backend.py only)."""
from __future__ import annotations

__all__ = ["FAMILIES", "OpProfiler"]

# op method -> kernel family, for the per-family step breakdown (profile_start / profile_stop)
FAMILIES = {"embedding": "embedding", "rmsnorm": "norm", "add_rmsnorm": "norm", "gated_rmsnorm": "norm",
            "silu_mul": "act", "linear": "linear", "qk_norm_rope": "rope", "reshape_and_cache": "attn_cache",
            "attn_prefill": "attn_prefill", "attn_decode": "attn_decode", "conv_prefill": "conv",
            "conv_decode": "conv", "gdn_prefill": "gdn_prefill", "gdn_decode": "gdn_decode", "moe_block": "moe",
            "sample": "sample"}


class OpProfiler:
    """profile_start / profile_mark / profile_stop for a backend (module docstring)."""

    def profile_start(self) -> None:
        """Record a CUDA event on the stream before every op call (and one at profile_stop), so the time from
        one op's event to the next is charged to the op's kernel family (FAMILIES). Eager steps: device time
        between op starts, host gaps included when the step is host-bound. Inside :meth:`capture` the events
        become graph nodes (CU_EVENT_RECORD_EXTERNAL), so a replay measures device time only."""
        self._prof = []
        for name, fam in FAMILIES.items():
            setattr(self, name, self._timed(fam, getattr(type(self), name).__get__(self)))

    def _event(self):
        cu = self._drv.cu
        i = len(self._prof)
        if i >= len(self._events):
            self._events.append(self._drv.call(cu.cuEventCreate, int(cu.CUevent_flags.CU_EVENT_DEFAULT)))
        ev = self._events[i]
        if self._capturing:
            self._drv.call(cu.cuEventRecordWithFlags, ev, self._s,
                           int(cu.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL))
        else:
            self._drv.call(cu.cuEventRecord, ev, self._s)
        return ev

    def _timed(self, family: str, fn):
        def call(*args, **kw):
            self._prof.append((family, self._event()))
            return fn(*args, **kw)
        return call

    def profile_mark(self) -> None:
        """Close the op list of a profile (the event after the last op), e.g. at the end of a capture."""
        self._prof.append(("end", self._event()))

    def profile_stop(self, replay=None) -> dict:
        """Stop profiling; returns {family: [ms, calls]} summed over the recorded ops. ``replay``: a callable run
        first (e.g. a graph replay whose event nodes write the timestamps)."""
        prof, self._prof = self._prof, None
        for name in FAMILIES:
            self.__dict__.pop(name, None)
        if prof is None:
            return {}
        if replay is not None:
            replay()
        elif not prof or prof[-1][0] != "end":
            self._prof = prof
            self.profile_mark()
            prof, self._prof = self._prof, None
        self.synchronize()
        out: dict = {}
        cu = self._drv.cu
        for (fam, e0), (_, e1) in zip(prof, prof[1:]):
            ms = float(self._drv.call(cu.cuEventElapsedTime, e0, e1))
            acc = out.setdefault(fam, [0.0, 0])
            acc[0] += ms
            acc[1] += 1
        return out
