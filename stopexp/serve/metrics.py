"""GET /metrics: the server's Prometheus metrics (prometheus_client), under vLLM's names where
the meaning is the same, so that a dashboard made for `vllm serve` reads this server too,
and stopexp's own for what pruning does. Each server has its own registry (several may run
in one process, as in the tests).

As vLLM's engine, every metric counts each prompt of a request with a list of prompts as a
request of its own, and a prompt scored without generating (echo, max_tokens 0) too.

vLLM's: vllm:num_requests_running / _waiting (gauges), vllm:prompt_tokens_total (each
prompt once), vllm:generation_tokens_total (every token of every path, pruned and
cancelled ones included: the usage's completion tokens), vllm:request_success_total (by
the finish reason of the first choice), vllm:e2e_request_latency_seconds and
vllm:time_to_first_token_seconds (from the request's arrival to its last byte / to the
first text the client is sent). stopexp's: stopexp:requests_total (by outcome: answered,
cancelled, failed), stopexp:paths_launched_total, stopexp:paths_pruned_total,
stopexp:tokens_saved_total (the responses' estimate) and stopexp:check_seconds (one check:
scoring the live paths and deciding which to keep)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# vLLM's buckets (vllm.v1.metrics.buckets)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                       7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
CHECK_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class LoopCollector:
    """What the engine loop counts (stopexp.serve.loop.EngineLoop.status), read at each scrape."""

    def __init__(self, status, model: str):
        self.status, self.model = status, model

    def collect(self):
        s = self.status()

        def one(family, name, text, value):
            metric = family(name, text, labels=["model_name"])
            metric.add_metric([self.model], value)
            return metric
        yield one(GaugeMetricFamily, "vllm:num_requests_running", "Requests in the engine.", s["active"])
        yield one(GaugeMetricFamily, "vllm:num_requests_waiting", "Requests waiting for the engine.",
                  s["waiting"])
        yield one(CounterMetricFamily, "vllm:prompt_tokens", "Prompt tokens (each request's once).",
                  s.get("prompt_tokens", 0))
        yield one(CounterMetricFamily, "vllm:generation_tokens",
                  "Generated tokens, every path's (pruned and cancelled ones too).", s["completion_tokens"])
        outcomes = CounterMetricFamily("stopexp:requests", "Requests by outcome.", labels=["model_name", "outcome"])
        for outcome in ("answered", "cancelled", "failed"):
            outcomes.add_metric([self.model, outcome], s.get(outcome, 0))
        yield outcomes


class Metrics:
    """The registry of one server over `status` (the loop's counts) for `model`."""

    def __init__(self, status, model: str):
        self.model = model
        self.registry = CollectorRegistry()
        self.registry.register(LoopCollector(status, model))
        labels, reg = ["model_name"], self.registry
        self.success = Counter("vllm:request_success", "Requests answered, by finish reason.",
                               [*labels, "finished_reason"], registry=reg)
        self.latency = Histogram("vllm:e2e_request_latency_seconds", "From arrival to the last byte.",
                                 labels, registry=reg, buckets=LATENCY_BUCKETS)
        self.first_token = Histogram("vllm:time_to_first_token_seconds",
                                     "From arrival to the first text sent to the client.", labels,
                                     registry=reg, buckets=FIRST_TOKEN_BUCKETS)
        self.launched = Counter("stopexp:paths_launched", "Paths launched.", labels, registry=reg)
        self.pruned = Counter("stopexp:paths_pruned", "Paths pruned (or stopped inside).", labels, registry=reg)
        self.saved = Counter("stopexp:tokens_saved", "Tokens saved against no pruning (the responses' "
                             "estimate).", labels, registry=reg)
        self.check = Histogram("stopexp:check_seconds", "One check of a request's live paths.", labels,
                               registry=reg, buckets=CHECK_BUCKETS)

    def answered(self, info: dict, finish_reason: str, check_seconds=()) -> None:
        """One prompt of a request was answered (in the engine loop): `info`, its `stopexp`
        field (paths launched and pruned, tokens saved; a scored prompt launches none), the
        finish reason of its first choice, and the seconds of each of its checks."""
        m = self.model
        self.success.labels(m, finish_reason).inc()
        self.launched.labels(m).inc(info["paths_launched"])
        self.pruned.labels(m).inc(info.get("paths_pruned", 0))
        self.saved.labels(m).inc(info.get("tokens_saved", 0))
        for seconds in check_seconds:
            self.check.labels(m).observe(seconds)

    def timed(self, first_token_s: float, total_s: float) -> None:
        """A prompt's times, as its client saw them (each prompt of a list: its response's)."""
        self.first_token.labels(self.model).observe(first_token_s)
        self.latency.labels(self.model).observe(total_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
