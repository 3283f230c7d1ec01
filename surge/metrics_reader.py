"""The metric objects of :meth:`surge.LLM.get_metrics`, shaped as vLLM's
(``vllm.v1.metrics.reader``: ``Metric``, ``Counter``, ``Gauge``, ``Vector``, ``Histogram``), so
that a script that reads vLLM's offline metrics runs on Surge with its import changed to
``from surge.metrics_reader import Counter, Gauge, Histogram, Vector``. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Counter", "Gauge", "Histogram", "Metric", "Vector"]


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric's sample: its vLLM name (``vllm:...``) and labels (``model_name``, ``engine``,
    and e.g. ``finished_reason``)."""

    name: str
    labels: dict[str, str]


@dataclass(frozen=True, slots=True)
class Counter(Metric):
    """A count that only grows (since the ``LLM`` started)."""

    value: int


@dataclass(frozen=True, slots=True)
class Gauge(Metric):
    """A value that goes up and down (its value now)."""

    value: float


@dataclass(frozen=True, slots=True)
class Vector(Metric):
    """vLLM's array of counters (its speculative decoding's per position; Surge gives none)."""

    values: list[int]


@dataclass(frozen=True, slots=True)
class Histogram(Metric):
    """vLLM's observations in buckets (upper limit -> count, ``+Inf`` included); Surge's
    offline ``LLM`` gives none (it keeps no per-request timings)."""

    count: int
    sum: float
    buckets: dict[str, int]
