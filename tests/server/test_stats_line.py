"""The periodic stats line with vLLM 0.26's figures (``LoggingStatLogger.log``): computed prompt
tokens, preemptions of the interval, GPU KV cache usage, the prefix cache hit rate of the latest
1000 requests, DEBUG when idle."""

from __future__ import annotations

import logging
import types

import pytest

from surge.core.outputs import SchedulerStats
from surge.server import stats_line
from surge.server.metrics import ServerMetrics


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(stats_line, "time", types.SimpleNamespace(monotonic=c.monotonic))
    return c


def _stats(preemptions: int = 0, requests: int = 0, queries: int = 0, hits: int = 0) -> SchedulerStats:
    return SchedulerStats(
        2,
        1,
        0.25,
        30,
        40,
        preemptions,
        prefix_cache_hit_tokens=hits,
        prefix_cache_query_tokens=queries,
        prefix_cache_requests=requests,
    )


def _line(caplog: pytest.LogCaptureFixture, m: ServerMetrics) -> tuple[int, str]:
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="surge.server"):
        m.log_stats()
    (record,) = [r for r in caplog.records if "Avg prompt throughput" in r.getMessage()]
    return record.levelno, record.getMessage()


def test_the_line_reads_as_vllms(clock: _Clock, caplog: pytest.LogCaptureFixture) -> None:
    stats = _stats()
    m = ServerMetrics("m", lambda: stats, max_model_len=2048)
    m.engine().add_prompt_tokens(100, num_cached=40)  # 60 prefilled: vLLM counts computed tokens only
    m.engine().add_prompt_tokens(20)
    m.engine().add_generation_tokens(50)
    stats = _stats(preemptions=2, requests=2, queries=120, hits=40)
    clock.now += 10
    level, text = _line(caplog, m)
    assert level == logging.INFO
    assert text == (
        "Engine 000: Avg prompt throughput: 8.0 tokens/s, Avg generation throughput: 5.0 tokens/s, "
        "Running: 2 reqs, Waiting: 1 reqs, Preemptions: 2, GPU KV cache usage: 25.0%, "
        "Prefix cache hit rate: 33.3%"
    )
    clock.now += 10  # no preemption in this interval: no Preemptions figure
    level, text = _line(caplog, m)
    assert level == logging.INFO  # the interval before had throughput
    assert "Preemptions" not in text
    assert "Avg prompt throughput: 0.0 tokens/s" in text
    assert "Prefix cache hit rate: 33.3%" in text  # the window outlives the interval
    clock.now += 10
    level, _ = _line(caplog, m)
    assert level == logging.DEBUG  # two idle intervals: vLLM avoids log noise


def test_the_hit_rate_spans_the_latest_1000_requests(clock: _Clock, caplog: pytest.LogCaptureFixture) -> None:
    stats = _stats()
    m = ServerMetrics("m", lambda: stats, max_model_len=2048)
    stats = _stats(requests=400, queries=4000, hits=4000)  # all hits
    clock.now += 1
    assert "Prefix cache hit rate: 100.0%" in _line(caplog, m)[1]
    stats = _stats(requests=800, queries=8000, hits=4000)  # 400 more, no hit
    clock.now += 1
    assert "Prefix cache hit rate: 50.0%" in _line(caplog, m)[1]
    stats = _stats(requests=1000, queries=10000, hits=4000)  # 200 more: 1000 in the window
    clock.now += 1
    assert "Prefix cache hit rate: 40.0%" in _line(caplog, m)[1]
    stats = _stats(requests=1100, queries=11000, hits=4000)  # the first 400 leave the window
    clock.now += 1
    assert "Prefix cache hit rate: 0.0%" in _line(caplog, m)[1]


def test_data_parallel_lines_name_the_engines(clock: _Clock, caplog: pytest.LogCaptureFixture) -> None:
    stats = _stats()
    m = ServerMetrics("m", lambda: stats, lambda: [stats, stats], max_model_len=2048)
    m.engine(1).add_generation_tokens(1)
    clock.now += 1
    assert _line(caplog, m)[1].startswith("2 Engines Aggregated: Avg prompt throughput: 0.0 tokens/s")
