"""Serving-benchmark metric math, pure functions over per-request timings.

The definitions follow vLLM's ``bench serve`` (``vllm/benchmarks/serve.py``: ``calculate_metrics``)
exactly, as written down in ``shared/design.md`` §5:

- TTFT: first SSE chunk that carries output minus the request's start (seconds); on the chat
  endpoint a role-only chunk does not count, unlike vLLM's client
  (:func:`surge.bench.client.counts_as_output`).
- ITL: the gap before every later output chunk (per chunk, not per token).
- E2EL: the last output chunk minus the start.
- output_len: ``usage.completion_tokens``; the re-tokenized text when the server sent none or 0
  (vLLM re-counts a falsy ``output_tokens``; :func:`surge.bench.serve.validate_results`).
- TPOT = (E2EL - TTFT) / (output_len - 1), only for output_len > 1.
- Failed requests are left out of every latency list and of the token sums (their output_len
  counts as 0), but their time stays inside ``duration``.
- Percentiles use ``numpy.percentile`` (linear interpolation); ``std`` is the population std
  (``numpy.std``), as in vLLM.
- ``max_output_tokens_per_s``: tokens bucketed into whole seconds since the earliest successful
  start, one token per choices chunk (vLLM's convention), max over buckets.
- Goodput: completed requests meeting every SLO (``ttft``, ``tpot``, ``e2el`` in ms) per second;
  a request with output_len <= 1 has TPOT 0 for this test (vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2el")


@dataclass
class RequestResult:
    """What one benchmark request measured (vLLM's ``RequestFuncOutput``).

    Times are seconds from ``time.perf_counter()``; ``start_time`` is the absolute clock value taken
    right after the concurrency semaphore, the others are relative to it.
    """

    success: bool = False
    prompt_len: int = 0  # tokens as the server counted them (usage.prompt_tokens when reported)
    expected_output_len: int = 0  # requested max_tokens
    output_len: int | None = None  # usage.completion_tokens; None when the server sent no usage
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0  # E2EL
    start_time: float = 0.0
    queue_time: float = 0.0  # seconds waited on the client's concurrency semaphore (vLLM client_queue_time)
    generated_text: str = ""
    error: str = ""


@dataclass(frozen=True)
class BenchmarkMetrics:
    """Aggregates of one benchmark run. Latencies in ms, throughputs per second of ``duration``."""

    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    output_lens: list[int]
    latency_stats: dict[str, float]  # e.g. mean_ttft_ms, median_ttft_ms, std_ttft_ms, p99_ttft_ms


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """Parse ``["ttft:500", "tpot:50"]`` into ``{"ttft": 500.0, ...}`` (ms).

    Raises:
        ValueError: unknown metric name, missing ``:``, a negative / non-numeric value, or a name
            given twice (``ttft:500 ttft:300``: vLLM 0.26 keeps the last one without a word, which
            hides a typo). 0 is an SLO, as vLLM 0.26's ``check_goodput_args`` takes it (it refuses
            negative values): a request meets it only with a value of exactly 0 (a one-token
            request's TPOT).
    """
    out: dict[str, float] = {}
    given: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        name = name.strip().lower()
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(
                f"--goodput expects NAME:MS with NAME in {', '.join(GOODPUT_METRICS)}, got {item!r}"
            )
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput value must be a number of ms, got {item!r}") from None
        if not ms >= 0:
            raise ValueError(f"--goodput value must be >= 0 ms (vLLM's bound), got {item!r}")
        if name in given:
            raise ValueError(
                f"--goodput gives {name} twice ({given[name]!r} and {item!r}): give each SLO once"
            )
        given[name] = item
        out[name] = ms
    return out


def parse_percentiles(text: str, flag: str = "--percentiles") -> list[float]:
    """Parse ``"50,90,99"`` into ``[50.0, 90.0, 99.0]``: numbers in [0, 100], as vLLM's
    ``--metric-percentiles`` takes them for ``numpy.percentile`` (0 is the minimum, 100 the maximum).

    Args:
        flag: the spelling the user gave (``--percentiles`` or vLLM's ``--metric-percentiles``),
            which an error names.
    Raises:
        ValueError: a value that is not a number in [0, 100].
    """
    vals: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            p = float(part)
        except ValueError:
            raise ValueError(f"{flag} expects numbers like 50,90,99, got {text!r}") from None
        if not 0 <= p <= 100:
            raise ValueError(f"{flag}: a percentile must be in [0, 100], got {part}")
        vals.append(p)
    if not vals:
        raise ValueError(f"{flag} is empty")
    return vals


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    """Parse vLLM's ``--percentile-metrics`` (``"ttft,tpot,itl,e2el"``) into metric names.

    Raises:
        ValueError: a name outside ttft, tpot, itl, e2el, or no name at all.
    """
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    for name in names:
        if name not in LATENCY_METRICS:
            raise ValueError(
                f"--percentile-metrics takes names from {','.join(LATENCY_METRICS)}, got {name!r}"
            )
    if not names:
        raise ValueError("--percentile-metrics is empty")
    return tuple(dict.fromkeys(names))


def percentile_key(p: float) -> str:
    """vLLM's field-name spelling of a percentile: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if float(p).is_integer() else str(p)


def max_output_tokens_per_second(results: Sequence[RequestResult]) -> tuple[float, int]:
    """Peak tokens per wall-clock second and peak concurrent requests (vLLM's bucket method).

    Each successful request contributes one token at ``start + ttft`` and one at each cumulative
    ITL after it; tokens are counted in 1-second buckets since the earliest successful start.
    Returns:
        (max tokens in one bucket, max requests active in one bucket); (0.0, 0) with no success.
    """
    ok = [r for r in results if r.success]
    if not ok:
        return 0.0, 0
    t0 = min(r.start_time for r in ok)
    t_end = max(r.start_time + r.latency for r in ok)
    n_buckets = int(np.ceil(t_end - t0)) + 1
    tokens = np.zeros(n_buckets)
    active = np.zeros(n_buckets)
    for r in ok:
        t = r.start_time + r.ttft
        times = [t]
        for gap in r.itl:
            t += gap
            times.append(t)
        for tt in times:
            b = int(tt - t0)
            if b < n_buckets:
                tokens[b] += 1
        first = int(r.start_time - t0)
        last = min(int(r.start_time + r.latency - t0), n_buckets - 1)
        active[first : last + 1] += 1
    return float(tokens.max()), int(active.max())


def _stats(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values_s if len(values_s) else [0.0], dtype=np.float64) * 1000.0
    out = {
        f"mean_{name}_ms": float(np.mean(arr)),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(np.std(arr)),
    }
    for p in percentiles:
        out[f"p{percentile_key(p)}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def request_tpot(r: RequestResult, output_len: int) -> float | None:
    """TPOT in seconds = (E2EL - TTFT) / (output_len - 1), or None when output_len <= 1."""
    if output_len > 1:
        return (r.latency - r.ttft) / (output_len - 1)
    return None


def compute_metrics(
    results: Sequence[RequestResult],
    duration: float,
    percentiles: Sequence[float] = (99.0,),
    goodput: dict[str, float] | None = None,
) -> BenchmarkMetrics:
    """Aggregate per-request results into vLLM's benchmark metrics.

    Args:
        results: one entry per timed request; a successful one must have ``output_len`` set
            (the caller re-tokenizes the text when the server sent no count or 0).
        duration: seconds from just before the first request was sent to the end of the last.
        percentiles: which percentiles to report (e.g. ``[50, 90, 99]``).
        goodput: SLOs in ms by metric name (``ttft``, ``tpot``, ``e2el``), or None.
    Raises:
        ValueError: ``duration <= 0`` or a successful result without ``output_len``.
    """
    if not duration > 0:
        raise ValueError(f"duration must be > 0 s, got {duration}")
    ttfts: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    output_lens: list[int] = []
    total_input = 0
    completed = 0
    for r in results:
        if not r.success:
            output_lens.append(0)
            continue
        if r.output_len is None:
            raise ValueError("a successful request needs output_len (usage or re-tokenized text)")
        n = r.output_len
        output_lens.append(n)
        total_input += r.prompt_len
        tpot = request_tpot(r, n)
        if tpot is not None:
            tpots.append(tpot)
        all_tpots.append(tpot or 0.0)
        itls.extend(r.itl)
        ttfts.append(r.ttft)
        e2els.append(r.latency)
        completed += 1

    request_goodput: float | None = None
    if goodput:
        columns: list[list[float]] = []
        slos: list[float] = []
        for name, series in (("ttft", ttfts), ("tpot", all_tpots), ("e2el", e2els)):
            if name in goodput:
                columns.append(series)
                slos.append(goodput[name] / 1000.0)
        good = sum(
            1 for row in zip(*columns, strict=True) if all(v <= s for v, s in zip(row, slos, strict=True))
        )
        request_goodput = good / duration

    total_output = sum(output_lens)
    stats: dict[str, float] = {}
    for name, series in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        stats.update(_stats(name, series, percentiles))
    max_tok_s, max_conc = max_output_tokens_per_second(results)
    return BenchmarkMetrics(
        completed=completed,
        failed=len(results) - completed,
        total_input=total_input,
        total_output=total_output,
        request_throughput=completed / duration,
        request_goodput=request_goodput,
        output_throughput=total_output / duration,
        total_token_throughput=(total_input + total_output) / duration,
        max_output_tokens_per_s=max_tok_s,
        max_concurrent_requests=max_conc,
        output_lens=output_lens,
        latency_stats=stats,
    )


def metrics_to_json(
    m: BenchmarkMetrics, duration: float, latency_metrics: Sequence[str] = LATENCY_METRICS
) -> dict[str, Any]:
    """The vLLM result-JSON fields for ``m`` (``duration``, ``completed``, ``mean_ttft_ms``, ...),
    with the mean, median, std and percentiles of the ``latency_metrics`` only (vLLM's
    ``--percentile-metrics``), and vLLM's ``rtfx`` (0.0: no audio input)."""
    out: dict[str, Any] = {
        "duration": duration,
        "completed": m.completed,
        "failed": m.failed,
        "total_input_tokens": m.total_input,
        "total_output_tokens": m.total_output,
        "request_throughput": m.request_throughput,
        "request_goodput": m.request_goodput,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
        "max_output_tokens_per_s": m.max_output_tokens_per_s,
        "max_concurrent_requests": m.max_concurrent_requests,
        # vLLM's inverse real-time factor (seconds of input audio per second of the run), always in its
        # result: 0.0 for text, the only input Surge's benchmark sends
        "rtfx": 0.0,
    }
    out.update((k, v) for k, v in m.latency_stats.items() if k.rsplit("_", 2)[-2] in latency_metrics)
    return out
