"""The periodic stats line of `surge serve`, with vLLM 0.26's figures and wording.

vLLM's ``LoggingStatLogger.log`` (``vllm/v1/metrics/loggers.py``) writes, every
``--log-interval`` seconds::

    Engine 000: Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 96.0 tokens/s,
    Running: 4 reqs, Waiting: 0 reqs, Preemptions: 1, GPU KV cache usage: 12.5%,
    Prefix cache hit rate: 40.0%

with these definitions, which this module keeps:

* prompt throughput: the prompt tokens *computed* (prefilled) in the interval over its length:
  a prompt counts when its prefill is done (its first output token), less the tokens the prefix
  cache served (vLLM's ``PromptTokenStats.computed``);
* generation throughput: tokens generated in the interval over its length;
* running / waiting: the engine's queues at the latest snapshot;
* preemptions: the preemptions of the interval, shown only when there were some;
* GPU KV cache usage: the fraction of KV blocks in use at the latest snapshot;
* prefix cache hit rate: hit tokens over looked-up tokens of the latest 1000 requests' first
  admissions (vLLM's ``CachingMetrics`` window; a re-admission after a preemption is left out).
  vLLM adds each engine step's lookups to the window; Surge adds each log interval's (the engine
  sends cumulative counters), so the window drops whole intervals, the oldest first, while the
  younger ones hold more than 1000 requests (the latest is always kept, as vLLM keeps its
  latest step).

The line is logged at INFO, or at DEBUG when this interval and the one before generated and
prefilled nothing (vLLM's "avoid log noise on an idle production system"). With data
parallelism the line sums the replicas and starts ``N Engines Aggregated:`` (vLLM's
``AggregatedLoggingStatLogger`` line).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from surge.core.outputs import SchedulerStats

logger = logging.getLogger("surge.server")

HIT_RATE_WINDOW_REQUESTS = 1000
"""Requests the prefix cache hit rate spans (vLLM's ``CachingMetrics(max_recent_requests)``)."""


class HitRateWindow:
    """Prefix cache hit rate over the most recent ``max_requests`` requests (vLLM's
    ``CachingMetrics``): entries of (requests, queried tokens, hit tokens); the oldest are
    dropped while more than one entry is kept and they hold more than ``max_requests`` requests."""

    def __init__(self, max_requests: int = HIT_RATE_WINDOW_REQUESTS) -> None:
        self.max_requests = max_requests
        self._entries: deque[tuple[int, int, int]] = deque()
        self._requests = self._queries = self._hits = 0

    def observe(self, requests: int, queries: int, hits: int) -> None:
        """Add the lookups of ``requests`` requests (``queries`` tokens looked up, ``hits`` of
        them found); an empty update is not added (it would push real ones out)."""
        if requests <= 0:
            return
        self._entries.append((requests, queries, hits))
        self._requests += requests
        self._queries += queries
        self._hits += hits
        while len(self._entries) > 1 and self._requests > self.max_requests:
            r, q, h = self._entries.popleft()
            self._requests -= r
            self._queries -= q
            self._hits -= h

    @property
    def hit_rate(self) -> float:
        """Hit tokens over looked-up tokens in the window (0..1; 0 when nothing was looked up)."""
        return self._hits / self._queries if self._queries else 0.0


class StatsLine:
    """Builds and logs the periodic stats line (see the module docstring).

    Args:
        get_stats: the engine's latest SchedulerStats (the replicas' sum with data parallelism),
            or None while there is none.
        num_engines: engine replicas (data parallelism); above 1 the line starts
            ``N Engines Aggregated:``, else ``Engine 000:``.
    """

    def __init__(self, get_stats: Callable[[], SchedulerStats | None], num_engines: int = 1) -> None:
        self._get_stats = get_stats
        self._prefix = f"{num_engines} Engines Aggregated: " if num_engines > 1 else "Engine 000: "
        self.window = HitRateWindow()
        self._last_time = time.monotonic()
        self._prompt = 0  # computed prompt tokens of the current interval
        self._gen = 0
        self._last_throughputs = (0.0, 0.0)
        s = get_stats()
        self._last_cumulative = _cumulative(s)

    def add_prompt_tokens(self, computed: int) -> None:
        """Count ``computed`` prompt tokens prefilled (a prompt whose prefill is done, less its
        prefix cache hits)."""
        self._prompt += computed

    def add_generation_tokens(self, n: int) -> None:
        """Count ``n`` generated tokens."""
        self._gen += n

    def log(self) -> None:
        """Log the line of the interval since the previous call and start the next interval."""
        now = time.monotonic()
        dt = now - self._last_time
        prompt_tp = self._prompt / dt if dt > 0 else 0.0
        gen_tp = self._gen / dt if dt > 0 else 0.0
        self._last_time, self._prompt, self._gen = now, 0, 0
        idle = not any((prompt_tp, gen_tp, *self._last_throughputs))
        self._last_throughputs = (prompt_tp, gen_tp)
        s = self._get_stats()
        cumulative = _cumulative(s) if s is not None else self._last_cumulative
        preemptions, requests, queries, hits = (
            a - b for a, b in zip(cumulative, self._last_cumulative, strict=True)
        )
        self._last_cumulative = cumulative
        self.window.observe(requests, queries, hits)
        parts = [
            "Avg prompt throughput: %.1f tokens/s",
            "Avg generation throughput: %.1f tokens/s",
            "Running: %d reqs",
            "Waiting: %d reqs",
        ]
        args: list[float] = [prompt_tp, gen_tp, s.num_running if s else 0, s.num_waiting if s else 0]
        if preemptions > 0:
            parts.append("Preemptions: %d")
            args.append(preemptions)
        parts += ["GPU KV cache usage: %.1f%%", "Prefix cache hit rate: %.1f%%"]
        args += [100.0 * (s.kv_cache_usage if s else 0.0), 100.0 * self.window.hit_rate]
        logger.log(logging.DEBUG if idle else logging.INFO, self._prefix + ", ".join(parts), *args)


def _cumulative(s: SchedulerStats | None) -> tuple[int, int, int, int]:
    """The engine's cumulative counters the line takes differences of: preemptions, prefix cache
    lookups (requests, queried tokens, hit tokens)."""
    if s is None:
        return (0, 0, 0, 0)
    return (
        s.num_preemptions_total,
        s.prefix_cache_requests,
        s.prefix_cache_query_tokens,
        s.prefix_cache_hit_tokens,
    )
