"""Prometheus metrics with vLLM 0.26's names, types, labels and buckets under a ``surge:`` prefix
(or ``vllm:`` for those vLLM has too, :data:`VLLM_METRICS`), and the hook to the periodic stats
line (:mod:`surge.server.stats_line`).

Request metrics (counters, histograms) are observed in the API process as outputs arrive, per
engine (label ``engine``: ``"0"``, or the data-parallel replica that served the request; label
``model_name`` on all). Engine gauges (running, waiting, KV usage, preemptions, prefix cache)
come from the latest :class:`SchedulerStats` snapshot the engine sends with its ready message
(the KV pool at start-up) and with every output batch. ``surge:engine_up`` is 1 while the engine
is running; once it is gone the engine gauges read 0 (its last snapshot no longer describes
anything). Prompt tokens are counted when their prefill is done (a prompt's first output
token), not when the request arrives. Each choice of an ``n > 1`` request counts as one request
(its prompt tokens, its finish, its latency histograms), as vLLM's child requests do; an
aborted one (a client's hang-up) is no finished one, as in vLLM. docs/openai-api.md
("Metrics") lists every metric and the differences from vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from surge.core.outputs import SchedulerStats
from surge.server.stats_line import StatsLine

# The bucket boundaries of vLLM 0.26's histograms (vllm/v1/metrics/loggers.py).
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""Inter-token latency and time per output token."""
_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""End-to-end latency and the queue, prefill, decode and inference times."""
_ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_N_BUCKETS = (1, 2, 5, 10, 20)
_GRAMMAR_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
"""vLLM 0.26's ``prompt_tokens_by_source`` labels (Surge has no KV transfer: always 0 there)."""

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM 0.26's ``FinishReason`` values: ``request_success_total`` has a series of each from the
start (Surge's engine ends none with ``error``; an aborted request is counted under none)."""


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` included (vLLM 0.26's buckets of its token
    count histograms, built from ``max_model_len``).

    Raises:
        ValueError: ``max_value`` is below 1.
    """
    if max_value < 1:
        raise ValueError(f"max_value must be at least 1, got {max_value}")
    buckets: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return buckets
            buckets.append(m * scale)
        scale *= 10


@dataclass(frozen=True, slots=True)
class FinishedRequestStats:
    """One finished engine request (a choice) as vLLM 0.26's ``FinishedRequestStats``.

    Attributes:
        finish_reason: "stop", "length" or "repetition".
        e2e_latency: seconds from the HTTP request's arrival to the choice's end (API clock).
        num_prompt_tokens, num_generation_tokens, num_cached_tokens: its prompt, its generated
            tokens and the prompt tokens the prefix cache served.
        max_tokens_param: the ``max_tokens`` the engine was given (the resolved default when the
            client sent none, as vLLM's serving layer resolves it).
        queued_time: seconds from the engine's queueing to its first schedule.
        prefill_time: seconds from the first schedule to the first token.
        decode_time: seconds from the first token to the last.
        inference_time: seconds from the first schedule to the last token.
    """

    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    max_tokens_param: int
    queued_time: float
    prefill_time: float
    decode_time: float
    inference_time: float

    @property
    def mean_time_per_output_token(self) -> float:
        """The decode time over the tokens after the first (0 for fewer than 2 tokens), as vLLM."""
        n = self.num_generation_tokens - 1
        return self.decode_time / n if n > 0 else 0.0


METRICS_PREFIXES = ("surge", "vllm")
"""The metric name prefixes ``--metrics-prefix`` takes: Surge's own, or vLLM's (the metrics
that both servers have carry the same name after the prefix)."""

VLLM_METRICS = frozenset(
    {
        "num_requests_running",
        "num_requests_waiting",
        "num_requests_waiting_by_reason",
        "kv_cache_usage_perc",
        "num_preemptions",
        "prefix_cache_hits",
        "prefix_cache_queries",
        "prompt_tokens",
        "prompt_tokens_by_source",
        "prompt_tokens_cached",
        "generation_tokens",
        "request_success",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_inference_time_seconds",
        "request_time_per_output_token_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_prefill_kv_computed_tokens",
        "request_params_max_tokens",
        "request_max_num_generation_tokens",
        "request_params_n",
        "iteration_tokens_total",
    }
)
"""The metrics (names after the prefix, a counter's without ``_total``) that vLLM 0.26 exports
too with the same meaning (``vllm/v1/metrics/loggers.py``): only these take the ``vllm:`` prefix
under ``--metrics-prefix vllm``. The others (``engine_up``, ``kv_cache_free_blocks``,
``kv_cache_total_blocks``, ``grammar_compile_time_seconds``, ``structured_output_requests``)
are Surge's own and keep ``surge:`` whatever the prefix: a ``vllm:`` name vLLM does not have
would send a dashboard looking for it to nothing."""


def metric_name(prefix: str, name: str) -> str:
    """The exported name of metric ``name`` under ``--metrics-prefix`` ``prefix``: ``prefix:name``
    for a metric vLLM has too (:data:`VLLM_METRICS`), ``surge:name`` for a Surge-only one."""
    return f"{prefix}:{name}" if name in VLLM_METRICS else f"surge:{name}"


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
            metric_name(self._prefix, "engine_up"),
            "1 while the engine is running, else 0.",
            labels=["model_name"],
        )
        g.add_metric([self._model_name], 1 if up else 0)
        yield g
        if self._get_replica_stats is None:
            yield from self._collect([([self._model_name, "0"], self._get_stats())], up)
            return
        replicas = self._get_replica_stats()
        yield from self._collect([([self._model_name, str(d)], s) for d, s in enumerate(replicas)], up)

    def _collect(self, rows: list[tuple[list[str], SchedulerStats | None]], up: bool) -> Iterator[Metric]:
        """One family per metric with a sample per row (a row: ``model_name`` and ``engine``
        label values, and that engine's latest stats). With the engine down the gauges read 0
        and the counters keep their last values (a drop to 0 reads as a counter reset)."""
        families: dict[str, Metric] = {}
        for values, s in rows:
            for metric in self._samples(s, up, ["model_name", "engine"], values):
                if metric.name in families:
                    families[metric.name].samples.extend(metric.samples)
                else:
                    families[metric.name] = metric
        yield from families.values()

    def _samples(
        self, last: SchedulerStats | None, up: bool, labels: list[str], values: list[str]
    ) -> Iterator[Metric]:
        s = last if up else None  # the gauges' stats: none while the engine is down

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(metric_name(self._prefix, name), doc, labels=labels)
            g.add_metric(values, value)
            return g

        yield gauge("num_requests_running", "Requests in the running batch.", s.num_running if s else 0)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting if s else 0)
        g = GaugeMetricFamily(
            metric_name(self._prefix, "num_requests_waiting_by_reason"),
            "Waiting requests by reason: 'capacity' (scheduling capacity), 'deferred' (grammar "
            "compiling); they add up to num_requests_waiting.",
            labels=[*labels, "reason"],
        )
        deferred = s.num_waiting_deferred if s else 0
        g.add_metric([*values, "capacity"], (s.num_waiting if s else 0) - deferred)
        g.add_metric([*values, "deferred"], deferred)
        yield g
        yield gauge(
            "kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).", s.kv_cache_usage if s else 0
        )
        yield gauge("kv_cache_free_blocks", "Free KV cache blocks.", s.num_free_blocks if s else 0)
        yield gauge("kv_cache_total_blocks", "KV cache blocks in the pool.", s.num_total_blocks if s else 0)
        c = CounterMetricFamily(
            metric_name(self._prefix, "num_preemptions"), "Preemptions since start.", labels=labels
        )
        c.add_metric(values, last.num_preemptions_total if last else 0)
        yield c
        for name, doc, value in (
            (
                "prefix_cache_hits",
                "Prompt tokens found in the prefix cache.",
                last.prefix_cache_hit_tokens if last else 0,
            ),
            (
                "prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                last.prefix_cache_query_tokens if last else 0,
            ),
        ):
            c = CounterMetricFamily(metric_name(self._prefix, name), doc, labels=labels)
            c.add_metric(values, value)
            yield c


class EngineMetrics:
    """The request metrics of one engine (label ``engine``, as vLLM's per-engine series): the
    counters and histograms of the requests it serves, observed in the API process.

    Made by :meth:`ServerMetrics.engine`; its methods feed the stats line too.
    """

    def __init__(
        self, families: dict[str, Counter | Histogram], labels: list[str], stats_line: StatsLine
    ) -> None:
        def child(name: str, *extra: str) -> Any:
            return families[name].labels(*labels, *extra)

        self._stats_line = stats_line
        self._success = families["request_success"]
        self._labels = labels
        self._prompt_tokens = child("prompt_tokens")
        self._prompt_by_source = {src: child("prompt_tokens_by_source", src) for src in PROMPT_TOKEN_SOURCES}
        self._prompt_tokens_cached = child("prompt_tokens_cached")
        self._generation_tokens = child("generation_tokens")
        self._success_by_reason = {r: child("request_success", r) for r in FINISH_REASONS}
        self.ttft = child("time_to_first_token_seconds")
        self.itl = child("inter_token_latency_seconds")
        self.e2e = child("e2e_request_latency_seconds")
        self.iteration_tokens = child("iteration_tokens_total")
        self._queue_time = child("request_queue_time_seconds")
        self._prefill_time = child("request_prefill_time_seconds")
        self._decode_time = child("request_decode_time_seconds")
        self._inference_time = child("request_inference_time_seconds")
        self._tpot = child("request_time_per_output_token_seconds")
        self._request_prompt_tokens = child("request_prompt_tokens")
        self._request_generation_tokens = child("request_generation_tokens")
        self._prefill_kv_computed = child("request_prefill_kv_computed_tokens")
        self._max_tokens_param = child("request_params_max_tokens")
        self._max_num_generation_tokens = child("request_max_num_generation_tokens")
        self._n_param = child("request_params_n")

    def add_prompt_tokens(self, n: int, num_cached: int = 0) -> None:
        """Count a prompt of ``n`` tokens whose prefill is done, ``num_cached`` of them served by
        the prefix cache (``prompt_tokens_total`` counts all ``n``, as vLLM's; the stats line's
        prompt throughput the computed ones)."""
        cached = min(num_cached, n)
        self._prompt_tokens.inc(n)
        self._prompt_tokens_cached.inc(cached)
        self._prompt_by_source["local_compute"].inc(n - cached)
        self._prompt_by_source["local_cache_hit"].inc(cached)
        self._stats_line.add_prompt_tokens(n - cached)

    def add_generation_tokens(self, n: int) -> None:
        """Count ``n`` generated tokens."""
        self._generation_tokens.inc(n)
        self._stats_line.add_generation_tokens(n)

    def request_finished(self, stats: FinishedRequestStats) -> None:
        """Count one finished choice and observe its histograms (vLLM's per finished request:
        success by reason, e2e, queue, prefill, decode and inference times, time per output
        token, prompt, generation and computed prompt tokens, ``max_tokens``)."""
        counter = self._success_by_reason.get(stats.finish_reason)
        if counter is None:
            counter = self._success_by_reason[stats.finish_reason] = self._success.labels(
                *self._labels, stats.finish_reason
            )
        counter.inc()
        self.e2e.observe(stats.e2e_latency)
        self._queue_time.observe(stats.queued_time)
        self._prefill_time.observe(stats.prefill_time)
        self._inference_time.observe(stats.inference_time)
        self._decode_time.observe(stats.decode_time)
        self._prefill_kv_computed.observe(stats.num_prompt_tokens - max(stats.num_cached_tokens, 0))
        self._request_prompt_tokens.observe(stats.num_prompt_tokens)
        self._request_generation_tokens.observe(stats.num_generation_tokens)
        self._tpot.observe(stats.mean_time_per_output_token)
        if stats.max_tokens_param:
            self._max_tokens_param.observe(stats.max_tokens_param)

    def prompt_finished(self, n: int, max_num_generation_tokens: int) -> None:
        """Observe a prompt whose ``n`` choices all finished (none aborted): ``n`` and the most
        tokens one of them generated (vLLM's ``ParentRequest.observe_finished_request``)."""
        self._n_param.observe(n)
        self._max_num_generation_tokens.observe(max_num_generation_tokens)


class ServerMetrics:
    """All metrics of one server, in their own registry.

    Args:
        model_name: the served model name (label ``model_name``).
        get_stats: returns the latest engine SchedulerStats (or None); with data parallelism,
            the replicas' stats added up (for the log line).
        get_replica_stats: with data parallelism, each replica's latest stats: the engine
            gauges and counters then have one series per replica (label ``engine``, its index).
        engine_up: returns whether the engine is running (default: always); while it is not,
            the engine gauges read 0.
        multiprocess_dir: the folder of prometheus_client's multiprocess mode when this is one
            of several API processes (the counters and histograms of all of them are then
            rendered; the process was started with ``PROMETHEUS_MULTIPROC_DIR`` set to it).
        prefix: the metric names' prefix, ``surge`` (``surge:num_requests_running``) or
            ``vllm`` (``--metrics-prefix vllm``: the names vLLM gives the same metrics, for
            dashboards and autoscalers written for vLLM; Surge-only metrics, those not in
            :data:`VLLM_METRICS`, keep ``surge:``).
        max_model_len: the context length in tokens: the top bucket of the token count
            histograms (:func:`build_1_2_5_buckets`, as vLLM).

    Every metric vLLM also has carries its labels ``model_name`` and ``engine`` (``"0"``, or
    the data-parallel replica's index); the request metrics are reached through :meth:`engine`.

    Raises:
        ValueError: ``prefix`` is not one of :data:`METRICS_PREFIXES`, or ``max_model_len`` is
            below 1.
    """

    def __init__(
        self,
        model_name: str,
        get_stats: Callable[[], SchedulerStats | None],
        get_replica_stats: Callable[[], list[SchedulerStats | None]] | None = None,
        engine_up: Callable[[], bool] = lambda: True,
        multiprocess_dir: str | None = None,
        prefix: str = "surge",
        *,
        max_model_len: int,
    ) -> None:
        if prefix not in METRICS_PREFIXES:
            raise ValueError(f"metrics prefix must be one of {', '.join(METRICS_PREFIXES)}, got {prefix!r}")
        self.prefix = prefix
        self.registry = CollectorRegistry()
        # vLLM's single API process serves prometheus_client's default registry, whose
        # process_*, python_gc_* and python_info series come with it (none in multiprocess mode)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._multiprocess_dir = multiprocess_dir
        self._get_stats = lambda: get_stats() if engine_up() else None
        reg, lbl = self.registry, ["model_name"]
        per_engine = ["model_name", "engine"]
        self._model_name = model_name
        families: dict[str, Counter | Histogram] = {}

        def counter(name: str, doc: str, *extra: str) -> None:
            families[name] = Counter(metric_name(prefix, name), doc, [*per_engine, *extra], registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[int]) -> None:
            families[name] = Histogram(
                metric_name(prefix, name), doc, per_engine, buckets=buckets, registry=reg
            )

        counter(
            "prompt_tokens", "Prompt tokens of the requests whose prefill is done (prefix-cached included)."
        )
        counter("prompt_tokens_by_source", "Prompt tokens by source (vLLM's labels).", "source")
        counter("prompt_tokens_cached", "Prompt tokens served by the prefix cache.")
        counter("generation_tokens", "Generated tokens.")
        counter("request_success", "Finished requests by finish reason.", "finished_reason")
        histogram("time_to_first_token_seconds", "Time to first token (s).", _TTFT_BUCKETS)
        histogram("inter_token_latency_seconds", "Time between tokens (s).", _ITL_BUCKETS)
        histogram("e2e_request_latency_seconds", "End-to-end request latency (s).", _REQUEST_LATENCY_BUCKETS)
        histogram(
            "request_queue_time_seconds",
            "Time from the engine's queueing to the first schedule (s).",
            _REQUEST_LATENCY_BUCKETS,
        )
        histogram(
            "request_prefill_time_seconds",
            "Time from the first schedule to the first token (s).",
            _REQUEST_LATENCY_BUCKETS,
        )
        histogram(
            "request_decode_time_seconds",
            "Time from the first token to the last (s).",
            _REQUEST_LATENCY_BUCKETS,
        )
        histogram(
            "request_inference_time_seconds",
            "Time from the first schedule to the last token (s).",
            _REQUEST_LATENCY_BUCKETS,
        )
        histogram(
            "request_time_per_output_token_seconds",
            "Decode time over the tokens after the first, per request (s).",
            _ITL_BUCKETS,
        )
        token_buckets = build_1_2_5_buckets(max_model_len)
        histogram("request_prompt_tokens", "Prompt tokens per finished request.", token_buckets)
        histogram("request_generation_tokens", "Generated tokens per finished request.", token_buckets)
        histogram(
            "request_prefill_kv_computed_tokens",
            "Prompt tokens computed per finished request (prefix-cache hits excluded).",
            token_buckets,
        )
        histogram("request_params_max_tokens", "The max_tokens of each finished request.", token_buckets)
        histogram(
            "request_max_num_generation_tokens",
            "Most tokens generated by one choice of a prompt whose n choices all finished.",
            token_buckets,
        )
        histogram("request_params_n", "The n of each prompt whose n choices all finished.", _N_BUCKETS)
        histogram(
            "iteration_tokens_total",
            "Tokens per engine step: generated, plus computed prompt tokens of the prefills it completed.",
            _ITERATION_TOKENS_BUCKETS,
        )
        self._families = families
        self.grammar_compile_time = Histogram(
            metric_name(prefix, "grammar_compile_time_seconds"),
            "Time to compile one structured-output grammar in the engine (s).",
            lbl,
            buckets=_GRAMMAR_BUCKETS,
            registry=reg,
        ).labels(model_name)
        self._structured = Counter(
            metric_name(prefix, "structured_output_requests"),
            "Requests constrained by a grammar, by kind (json, regex, choice, grammar, json_object, structural_tag).",
            [*lbl, "kind"],
            registry=reg,
        )
        self._engine_collector = _EngineStatsCollector(
            get_stats, model_name, get_replica_stats, engine_up, prefix
        )
        self.registry.register(self._engine_collector)
        num_engines = len(get_replica_stats()) if get_replica_stats is not None else 1
        self.stats_line = StatsLine(self._get_stats, num_engines)
        self._engines: dict[int, EngineMetrics] = {}
        for d in range(num_engines):  # every engine's series exist from the start, as vLLM's
            self.engine(d)

    def engine(self, index: int = 0) -> EngineMetrics:
        """The request metrics of engine ``index`` (0, or a data-parallel replica's index)."""
        metrics = self._engines.get(index)
        if metrics is None:
            labels = [self._model_name, str(index)]
            metrics = self._engines[index] = EngineMetrics(self._families, labels, self.stats_line)
        return metrics

    def structured_request(self, kind: str, n: int = 1) -> None:
        """Count ``n`` engine requests constrained by a grammar of ``kind``."""
        self._structured.labels(self._model_name, kind).inc(n)

    @property
    def shared(self) -> bool:
        """Whether this is one of several API processes (prometheus_client's multiprocess mode):
        its own requests are then only part of the server's."""
        return self._multiprocess_dir is not None

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
        """Log the periodic stats line of the interval since the previous call (vLLM 0.26's
        figures, see :mod:`surge.server.stats_line`)."""
        self.stats_line.log()
