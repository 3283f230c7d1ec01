"""The periodic stats line: prefix cache hit rate per interval, idle time not averaged in."""

from __future__ import annotations

import logging
import time

import pytest

from surge.core.outputs import SchedulerStats
from surge.server.metrics import ServerMetrics


def test_stats_line_hit_rate_and_idle_intervals(caplog: pytest.LogCaptureFixture) -> None:
    stats = SchedulerStats(1, 0, 0.5, 10, 20, 0, prefix_cache_hit_tokens=0, prefix_cache_query_tokens=0)
    m = ServerMetrics("m", lambda: stats)
    m.skip_interval()
    stats = SchedulerStats(1, 0, 0.5, 10, 20, 0, prefix_cache_hit_tokens=30, prefix_cache_query_tokens=120)
    m.add_generation_tokens(100)
    with caplog.at_level(logging.INFO, logger="surge.server"):
        m.log_stats()
    assert "Prefix cache hit rate: 25.0%" in caplog.text
    time.sleep(0.3)  # an idle interval...
    m.skip_interval()  # ...that the log loop skips
    m.add_generation_tokens(10)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="surge.server"):
        m.log_stats()
    rate = float(caplog.text.split("Avg generation throughput: ")[1].split(" ")[0])
    assert rate > 10 / 0.3  # 10 tokens over the short busy time, not over the idle 0.3 s
    assert "Prefix cache hit rate: 0.0%" in caplog.text  # no prompt looked up in this interval
