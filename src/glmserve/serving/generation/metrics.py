"""Prometheus metrics for ``GET /metrics`` (prometheus-client), with vLLM's metric names
(``vllm/v1/metrics/loggers.py``) under a ``glmserve:`` prefix where they mean the same thing.

Per requested model (the base model or a LoRA adapter: label ``model_name``):
``request_success_total{finished_reason}`` (stop, length, tool_calls, abort, error),
``request_rejected_total`` (429s, glmserve's own), ``prompt_tokens_total``,
``generation_tokens_total``, ``prefix_cache_queries_total`` / ``prefix_cache_hits_total``
(prompt tokens looked up / found in the cache), and the histograms
``time_to_first_token_seconds``, ``time_per_output_token_seconds``,
``e2e_request_latency_seconds``; glmserve's own ``loops_stopped_total{where}`` (``--loop-guard``) and ``calls_healed_total{result}``
(``--heal-calls``). Read from the engine at each scrape:
``num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc`` (0..1; engines that
do not know it leave it out), and with speculative decoding vLLM's counters
``spec_decode_num_drafts_total``, ``spec_decode_num_draft_tokens_total``,
``spec_decode_num_accepted_tokens_total``; with a host prompt cache (``--cache-ram``),
``prompt_cache_ram_bytes``, ``prompt_cache_ram_entries`` and ``prompt_cache_ram_restores_total``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from glmserve.engine.base import Engine

# vLLM's buckets (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _EngineCollector:
    """The engine's load, read at each scrape."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self._engine, self._model = engine, model_name

    def collect(self):
        stats = self._engine.stats()
        for name, doc, value in (
            ("glmserve:num_requests_running", "Requests running (at most --max-num-seqs).", stats.running),
            ("glmserve:num_requests_waiting", "Requests admitted and waiting for a sequence.", stats.waiting),
            ("glmserve:kv_cache_usage_perc", "Share of the KV cache in use (1 = full).", stats.kv_cache_usage),
        ):
            if value is not None:
                family = GaugeMetricFamily(name, doc, labels=["model_name"])
                family.add_metric([self._model], value)
                yield family
        if stats.prompt_cache_ram is not None:
            nbytes, entries, restores = stats.prompt_cache_ram
            for family, value in (
                (GaugeMetricFamily("glmserve:prompt_cache_ram_bytes", "Host prompt cache: bytes of sequence "
                                   "states held (at most --cache-ram MiB).", labels=["model_name"]), nbytes),
                (GaugeMetricFamily("glmserve:prompt_cache_ram_entries", "Host prompt cache: sequence states held.",
                                   labels=["model_name"]), entries),
                (CounterMetricFamily("glmserve:prompt_cache_ram_restores", "Host prompt cache: states loaded "
                                     "into a sequence instead of recomputing their prompt.", labels=["model_name"]),
                 restores),
            ):
                family.add_metric([self._model], value)
                yield family
        if stats.spec_decode is not None:
            for name, doc, value in zip(
                ("glmserve:spec_decode_num_drafts", "glmserve:spec_decode_num_draft_tokens",
                 "glmserve:spec_decode_num_accepted_tokens"),
                ("Speculative decoding: drafts verified.", "Speculative decoding: tokens drafted.",
                 "Speculative decoding: drafted tokens accepted."),
                stats.spec_decode,
            ):
                family = CounterMetricFamily(name, doc, labels=["model_name"])
                family.add_metric([self._model], value)
                yield family


class ServingMetrics:
    """The metrics of one served model, in a registry of their own (one per app, so that
    several apps in a process do not share counters)."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, label = self.registry, ["model_name"]
        self.success = Counter("glmserve:request_success", "Finished requests.", label + ["finished_reason"],
                               registry=r)
        self.rejected = Counter("glmserve:request_rejected", "Requests refused with 429 (server full).", label,
                                registry=r)
        self.prompt_tokens = Counter("glmserve:prompt_tokens", "Prompt tokens of admitted requests.", label, registry=r)
        self.generation_tokens = Counter("glmserve:generation_tokens", "Generated tokens.", label, registry=r)
        self.cache_queries = Counter("glmserve:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                     label, registry=r)
        self.cache_hits = Counter("glmserve:prefix_cache_hits", "Prompt tokens found in the prefix cache.", label,
                                  registry=r)
        self.loops = Counter("glmserve:loops_stopped", "Loops the loop guard stopped (--loop-guard), by where: "
                             "reasoning (ended) or answer (stopped).", label + ["where"], registry=r)
        self.healed = Counter("glmserve:calls_healed", "Tool calls whose arguments failed their schema, decoded "
                              "again (--heal-calls), by result: healed or failed.", label + ["result"], registry=r)
        self.ttft = Histogram("glmserve:time_to_first_token_seconds", "Time to the first generated token.", label,
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("glmserve:time_per_output_token_seconds", "Mean time per generated token after the "
                              "first, per request.", label, buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("glmserve:e2e_request_latency_seconds", "Time from arrival to the last token.", label,
                             buckets=E2E_BUCKETS, registry=r)
        r.register(_EngineCollector(engine, model_name))

    def finished(self, model: str, reason: str, prompt_tokens: int, cached_tokens: int, generated: int,
                 arrival: float, first_token: float | None, end: float) -> None:
        """Record one request that ended (times from ``time.perf_counter``, seconds)."""
        self.success.labels(model, reason).inc()
        self.prompt_tokens.labels(model).inc(prompt_tokens)
        self.generation_tokens.labels(model).inc(generated)
        self.cache_queries.labels(model).inc(prompt_tokens)
        self.cache_hits.labels(model).inc(cached_tokens)
        self.e2e.labels(model).observe(end - arrival)
        if first_token is not None:
            self.ttft.labels(model).observe(first_token - arrival)
            if generated > 1:
                self.tpot.labels(model).observe((end - first_token) / (generated - 1))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _Merged:
    """The metric families of several registries, samples of a family under one name together
    (the text format declares each family once)."""

    def __init__(self, registries: list[CollectorRegistry]) -> None:
        self._registries = registries

    def collect(self):
        families: dict[str, Any] = {}
        for registry in self._registries:
            for family in registry.collect():
                if family.name in families:
                    families[family.name].samples.extend(family.samples)
                else:
                    families[family.name] = family
        return list(families.values())


def render_all(metrics: list[ServingMetrics]) -> bytes:
    """The Prometheus text exposition of the metrics of several models (each labelled by
    ``model_name``)."""
    if len(metrics) == 1:
        return metrics[0].render()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged([m.registry for m in metrics]))
    return generate_latest(registry)
