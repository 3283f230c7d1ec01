"""Prometheus metrics with vLLM-like names under a ``surge:`` prefix, and the periodic log line.

Request metrics (counters, latency histograms) are observed in the API process as outputs
arrive; engine gauges (running, waiting, KV usage, preemptions) come from the latest
:class:`SchedulerStats` snapshot the engine sends with its ready message (the KV pool at
start-up) and with every output batch. ``surge:engine_up``
is 1 while the engine is running; once it is gone the engine gauges read 0 (its last snapshot no
longer describes anything). Prompt tokens are counted when their prefill is done (a prompt's
first output token), not when the request arrives. Each choice of an ``n > 1`` request counts
as one request (its prompt tokens, its finish, its e2e latency), as vLLM's child requests do;
an aborted one (a client's hang-up) is no finished one, as in vLLM.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from surge.core.outputs import SchedulerStats

logger = logging.getLogger("surge.server")

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_GRAMMAR_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


METRICS_PREFIXES = ("surge", "vllm")
"""The metric name prefixes ``--metrics-prefix`` takes: Surge's own, or vLLM's (the metrics
that both servers have carry the same name after the prefix)."""


class _EngineStatsCollector(Collector):
    """Exports the latest SchedulerStats as gauges and counters at scrape time."""

    def __init__(
        self,
        get_stats: Callable[[], SchedulerStats | None],
        model_name: str,
        get_replica_stats: Callable[[], list[SchedulerStats | None]] | None = None,
        engine_up: Callable[[], bool] = lambda: True,
        prefix: str = "surge",
    ) -> None:
        self._prefix = prefix
        self._get_stats = get_stats
        self._model_name = model_name
        self._get_replica_stats = get_replica_stats
        self._engine_up = engine_up

    def collect(self) -> Iterator[Metric]:
        up = self._engine_up()
        g = GaugeMetricFamily(
            f"{self._prefix}:engine_up", "1 while the engine is running, else 0.", labels=["model_name"]
        )
        g.add_metric([self._model_name], 1 if up else 0)
        yield g
        if self._get_replica_stats is None:
            yield from self._collect(
                [([self._model_name], self._get_stats() if up else None)], ["model_name"]
            )
            return
        replicas = self._get_replica_stats()
        rows = [([self._model_name, str(d)], s if up else None) for d, s in enumerate(replicas)]
        yield from self._collect(rows, ["model_name", "replica"])

    def _collect(
        self, rows: list[tuple[list[str], SchedulerStats | None]], labels: list[str]
    ) -> Iterator[Metric]:
        """One family per metric with a sample per row (a row: label values and stats)."""
        families: dict[str, Metric] = {}
        for values, s in rows:
            for metric in self._samples(s, labels, values):
                if metric.name in families:
                    families[metric.name].samples.extend(metric.samples)
                else:
                    families[metric.name] = metric
        yield from families.values()

    def _samples(self, s: SchedulerStats | None, labels: list[str], values: list[str]) -> Iterator[Metric]:

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"{self._prefix}:{name}", doc, labels=labels)
            g.add_metric(values, value)
            return g

        yield gauge("num_requests_running", "Requests in the running batch.", s.num_running if s else 0)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting if s else 0)
        yield gauge(
            "kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).", s.kv_cache_usage if s else 0
        )
        yield gauge("kv_cache_free_blocks", "Free KV cache blocks.", s.num_free_blocks if s else 0)
        yield gauge("kv_cache_total_blocks", "KV cache blocks in the pool.", s.num_total_blocks if s else 0)
        c = CounterMetricFamily(f"{self._prefix}:num_preemptions", "Preemptions since start.", labels=labels)
        c.add_metric(values, s.num_preemptions_total if s else 0)
        yield c
        for name, doc, value in (
            (
                "prefix_cache_hits",
                "Prompt tokens found in the prefix cache.",
                s.prefix_cache_hit_tokens if s else 0,
            ),
            (
                "prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                s.prefix_cache_query_tokens if s else 0,
            ),
        ):
            c = CounterMetricFamily(f"{self._prefix}:{name}", doc, labels=labels)
            c.add_metric(values, value)
            yield c


class ServerMetrics:
    """All metrics of one server, in their own registry.

    Args:
        model_name: the served model name (label ``model_name``).
        get_stats: returns the latest engine SchedulerStats (or None); with data parallelism,
            the replicas' stats added up (for the log line).
        get_replica_stats: with data parallelism, each replica's latest stats: the engine
            gauges and counters then carry a ``replica`` label.
        engine_up: returns whether the engine is running (default: always); while it is not,
            the engine gauges read 0.
        multiprocess_dir: the folder of prometheus_client's multiprocess mode when this is one
            of several API processes (the counters and histograms of all of them are then
            rendered; the process was started with ``PROMETHEUS_MULTIPROC_DIR`` set to it).
        prefix: the metric names' prefix, ``surge`` (``surge:num_requests_running``) or
            ``vllm`` (``--metrics-prefix vllm``: the names vLLM gives the same metrics, for
            dashboards and autoscalers written for vLLM).

    Raises:
        ValueError: ``prefix`` is not one of :data:`METRICS_PREFIXES`.
    """

    def __init__(
        self,
        model_name: str,
        get_stats: Callable[[], SchedulerStats | None],
        get_replica_stats: Callable[[], list[SchedulerStats | None]] | None = None,
        engine_up: Callable[[], bool] = lambda: True,
        multiprocess_dir: str | None = None,
        prefix: str = "surge",
    ) -> None:
        if prefix not in METRICS_PREFIXES:
            raise ValueError(f"metrics prefix must be one of {', '.join(METRICS_PREFIXES)}, got {prefix!r}")
        self.prefix = prefix
        self.registry = CollectorRegistry()
        self._multiprocess_dir = multiprocess_dir
        self._get_stats = lambda: get_stats() if engine_up() else None
        reg, lbl = self.registry, ["model_name"]
        self._model_name = model_name
        self._prompt_tokens = Counter(
            f"{prefix}:prompt_tokens", "Prompt tokens processed.", lbl, registry=reg
        ).labels(model_name)
        self._generation_tokens = Counter(
            f"{prefix}:generation_tokens", "Generated tokens.", lbl, registry=reg
        ).labels(model_name)
        self._success = Counter(
            f"{prefix}:request_success",
            "Finished requests by finish reason.",
            [*lbl, "finished_reason"],
            registry=reg,
        )
        self._success_by_reason = {
            r: self._success.labels(model_name, r) for r in ("stop", "length", "abort", "repetition")
        }
        self.ttft = Histogram(
            f"{prefix}:time_to_first_token_seconds",
            "Time to first token (s).",
            lbl,
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        ).labels(model_name)
        self.itl = Histogram(
            f"{prefix}:inter_token_latency_seconds",
            "Time between tokens (s).",
            lbl,
            buckets=_ITL_BUCKETS,
            registry=reg,
        ).labels(model_name)
        self.e2e = Histogram(
            f"{prefix}:e2e_request_latency_seconds",
            "End-to-end request latency (s).",
            lbl,
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        ).labels(model_name)
        self.grammar_compile_time = Histogram(
            f"{prefix}:grammar_compile_time_seconds",
            "Time to compile one structured-output grammar in the engine (s).",
            lbl,
            buckets=_GRAMMAR_BUCKETS,
            registry=reg,
        ).labels(model_name)
        self._structured = Counter(
            f"{prefix}:structured_output_requests",
            "Requests constrained by a grammar, by kind (json, regex, choice, grammar, json_object, structural_tag).",
            [*lbl, "kind"],
            registry=reg,
        )
        self._engine_collector = _EngineStatsCollector(
            get_stats, model_name, get_replica_stats, engine_up, prefix
        )
        self.registry.register(self._engine_collector)
        self._last_log_time = time.monotonic()
        self.total_prompt_tokens = 0
        self.total_generation_tokens = 0
        self._last_prompt = 0
        self._last_gen = 0
        self._last_prefix_hits = 0
        self._last_prefix_queries = 0

    def add_prompt_tokens(self, n: int) -> None:
        """Count ``n`` prompt tokens whose prefill is done."""
        self.total_prompt_tokens += n
        self._prompt_tokens.inc(n)

    def structured_request(self, kind: str, n: int = 1) -> None:
        """Count ``n`` engine requests constrained by a grammar of ``kind``."""
        self._structured.labels(self._model_name, kind).inc(n)

    def add_generation_tokens(self, n: int) -> None:
        """Count ``n`` generated tokens."""
        self.total_generation_tokens += n
        self._generation_tokens.inc(n)

    def request_finished(self, finish_reason: str, e2e_seconds: float) -> None:
        """Count one finished choice and observe its end-to-end latency."""
        counter = self._success_by_reason.get(finish_reason)
        if counter is None:
            counter = self._success_by_reason[finish_reason] = self._success.labels(
                self._model_name, finish_reason
            )
        counter.inc()
        self.e2e.observe(e2e_seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (with several API processes, their
        counters and histograms summed from the shared folder, and the engine gauges)."""
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, self._multiprocess_dir)
        registry.register(self._engine_collector)
        return generate_latest(registry)

    def log_stats(self) -> None:
        """Log throughput since the previous call (or the end of the last idle interval, see
        :meth:`skip_interval`), running / waiting requests, KV usage, and the prefix cache hit
        rate of the prompts admitted in that time (hit tokens / looked-up tokens, as vLLM)."""
        now = time.monotonic()
        dt = max(now - self._last_log_time, 1e-9)
        prompt = self.total_prompt_tokens
        gen = self.total_generation_tokens
        s = self._get_stats()
        hits = s.prefix_cache_hit_tokens if s else 0
        queries = s.prefix_cache_query_tokens if s else 0
        d_queries = queries - self._last_prefix_queries
        hit_rate = 100.0 * (hits - self._last_prefix_hits) / d_queries if d_queries > 0 else 0.0
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%, "
            "Preemptions: %d",
            (prompt - self._last_prompt) / dt,
            (gen - self._last_gen) / dt,
            s.num_running if s else 0,
            s.num_waiting if s else 0,
            100.0 * (s.kv_cache_usage if s else 0.0),
            hit_rate,
            s.num_preemptions_total if s else 0,
        )
        self.skip_interval()

    def skip_interval(self) -> None:
        """Start the next log interval now (called after an idle interval and after each line)."""
        s = self._get_stats()
        self._last_log_time = time.monotonic()
        self._last_prompt = self.total_prompt_tokens
        self._last_gen = self.total_generation_tokens
        self._last_prefix_hits = s.prefix_cache_hit_tokens if s else 0
        self._last_prefix_queries = s.prefix_cache_query_tokens if s else 0

    def has_activity(self) -> bool:
        """True if tokens were processed since the last log line or requests are in flight."""
        s = self._get_stats()
        busy = s is not None and (s.num_running or s.num_waiting)
        return (
            bool(busy)
            or self.total_generation_tokens != self._last_gen
            or self.total_prompt_tokens != self._last_prompt
        )
