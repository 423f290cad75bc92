"""Prometheus metrics of one server (its own registry, so several apps can live in one process, e.g. in tests); the
GEMM plan counts of the engine's start-up warm-up (``LLM.plan_report``) as ``vkc_gemm_plans{count=...}``."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the app)

__all__ = ["Metrics", "CONTENT_TYPE_LATEST"]

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TTFT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, engine):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("vkc_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("vkc_prompt_tokens", "prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter("vkc_generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram("vkc_time_to_first_token_seconds", "request arrival to its first generated token",
                              buckets=_TTFT, registry=r)
        self.itl = Histogram("vkc_inter_token_latency_seconds", "time between consecutive tokens of a sequence",
                             buckets=_LATENCY, registry=r)
        self.e2e = Histogram("vkc_request_latency_seconds", "request arrival to its last token", buckets=_TTFT,
                             registry=r)
        st = engine.stats
        for name, key, doc in (("vkc_queue_waiting", "waiting", "sequences waiting for admission"),
                               ("vkc_sequences_running", "running", "sequences in the running batch"),
                               ("vkc_kv_blocks_used", "blocks_used", "KV cache blocks held"),
                               ("vkc_kv_blocks_total", "blocks_total", "KV cache blocks"),
                               ("vkc_state_slots_used", "slots_used", "GDN state slots held"),
                               ("vkc_state_slots_total", "slots_total", "GDN state slots")):
            Gauge(name, doc, registry=r).set_function(lambda k=key: float(st.get(k, 0)))
        Gauge("vkc_pending_requests", "requests queued or waiting (the overload check's count)",
              registry=r).set_function(lambda: float(engine.num_waiting()) if engine.alive else 0.0)
        self.load_seconds = Gauge("vkc_model_load_seconds", "LLM construction time (weights + caches)", registry=r)
        plans = getattr(getattr(engine, "llm", None), "plan_report", None)  # the LLM's GEMM plan warm-up
        if plans:
            g = Gauge("vkc_gemm_plans", "GEMM plan keys at start, by count of the warm-up report", ["count"], registry=r)
            for k in ("declared", "loaded", "defaults", "tuned", "rejected", "saved"):
                g.labels(k).set(float(plans.get(k) or 0))
            Gauge("vkc_gemm_plans_info", "GEMM plan cache mode, file and fingerprint (value 1)",
                  ["mode", "path", "fingerprint"], registry=r).labels(
                str(plans.get("mode")), str(plans.get("path")), str(plans.get("fingerprint"))).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
