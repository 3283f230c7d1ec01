"""Arrival times of ``bench serve --request-rate`` as vLLM's ``get_request`` releases requests,
checked on a fake clock (no real sleeping)."""

from __future__ import annotations

import asyncio
import math
from datetime import datetime
from types import SimpleNamespace

import numpy as np
import pytest

from surge.bench import serve
from surge.bench.serve import RampUp, ServeConfig, arrival_offsets, rps_change_events


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_the_last_request_leaves_at_num_prompts_over_rate(burstiness: float) -> None:
    """vLLM scales the cumulative gamma gaps so the last request is sent at exactly N / rate s:
    request throughput at a given rate does not swing by the seed's luck (about 10 % for 100
    Poisson arrivals)."""
    for seed in range(5):
        offsets = arrival_offsets(100, 10.0, burstiness, np.random.default_rng(seed))
        assert len(offsets) == 100
        assert offsets[-1] == pytest.approx(10.0, rel=1e-12)
        assert offsets[0] > 0  # the first request waits a gap too, inside the measured duration
        assert all(b >= a for a, b in zip(offsets, offsets[1:], strict=False))


def test_burst_releases_everything_at_once() -> None:
    assert arrival_offsets(4, math.inf, 1.0, np.random.default_rng(0)) == [0.0] * 4


def test_burstiness_shapes_the_gaps() -> None:
    """Gamma(shape k) gaps have a coefficient of variation 1 / sqrt(k): 1 for Poisson."""
    for k in (0.25, 1.0, 4.0):
        offsets = np.asarray(arrival_offsets(20000, 5.0, k, np.random.default_rng(1)))
        gaps = np.diff(offsets, prepend=0.0)
        assert gaps.mean() == pytest.approx(1 / 5.0, rel=1e-9)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(k), rel=0.05)


def test_requests_leave_on_the_schedule_and_nothing_waits_after_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each request leaves at t0 + its offset on the clock (a late wake-up does not push the
    later ones back), and no gap is slept after the last one: the old loop slept one more gamma
    gap after it, which ``duration`` counted whenever the last request ended sooner."""
    clock = SimpleNamespace(now=100.0, sleeps=[])

    async def fake_sleep(seconds: float) -> None:
        clock.sleeps.append(seconds)
        clock.now += seconds + 0.05  # every wake-up 50 ms late

    monkeypatch.setattr(serve, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(serve, "asyncio", SimpleNamespace(sleep=fake_sleep))

    async def collect() -> list[tuple[str, float]]:
        out = []
        async for item in serve._arrivals(["a", "b", "c", "d"], [0.5, 0.6, 2.0, 4.0], 100.0):
            out.append((item, round(clock.now - 100.0, 9)))
        return out

    sent = asyncio.run(collect())
    # b was due at 0.6 but a's wake-up came at 0.55: it waits 0.05 s, not another 0.1 s gap
    assert sent == [("a", 0.55), ("b", 0.65), ("c", 2.05), ("d", 4.05)]
    assert clock.sleeps == pytest.approx([0.5, 0.05, 1.35, 1.95])  # nothing after "d"


def test_no_request_leaves_before_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop's timers count whole milliseconds, so ``asyncio.sleep(w)`` can return up to half a
    millisecond before ``w`` has passed: the rest is slept again, and a request never leaves before
    ``t0 + offset`` (a trace's replay or a rate's schedule)."""
    clock = SimpleNamespace(now=100.0, sleeps=[])

    async def early_sleep(seconds: float) -> None:
        clock.sleeps.append(seconds)
        clock.now += max(seconds - 0.0004, seconds / 2)  # every wake-up early

    monkeypatch.setattr(serve, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(serve, "asyncio", SimpleNamespace(sleep=early_sleep))

    async def collect() -> list[tuple[str, float]]:
        out = []
        async for item in serve._arrivals(["a", "b", "c"], [0.0, 0.25, 1.0], 100.0):
            out.append((item, clock.now - 100.0))
        return out

    sent = asyncio.run(collect())
    assert [item for item, _ in sent] == ["a", "b", "c"]
    for (_, at), due in zip(sent, [0.0, 0.25, 1.0], strict=True):
        assert due <= at < due + 0.001
    assert clock.sleeps[0] == pytest.approx(0.25) and len(clock.sleeps) > 2


def test_ramp_up_rates_by_hand() -> None:
    """vLLM's ramp-up: request i of n gets start + (end - start) * i / (n - 1) (linear) or
    start * (end / start) ** (i / (n - 1)) (exponential) requests/s."""
    assert RampUp("linear", 1, 5).rates(5) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert RampUp("exponential", 1, 16).rates(5) == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0])
    assert RampUp("linear", 3, 9).rates(1) == [3.0]


def test_ramp_up_gaps_follow_each_requests_rate_unscaled() -> None:
    ramp = RampUp("linear", 2, 8)
    offsets = np.asarray(arrival_offsets(30001, math.inf, 1.0, np.random.default_rng(2), ramp))
    gaps = np.diff(offsets, prepend=0.0)
    rates = np.asarray(ramp.rates(30001))
    assert gaps[:1000].mean() == pytest.approx(1 / rates[:1000].mean(), rel=0.1)
    assert gaps[-1000:].mean() == pytest.approx(1 / rates[-1000:].mean(), rel=0.1)
    # no scaling to n / rate with a ramp (vLLM): the span is the sum of the gaps as drawn
    assert offsets[-1] == pytest.approx(float(np.sum(1 / rates)), rel=0.02)


def test_rps_change_events_by_hand() -> None:
    """vLLM records the start rate, then each whole rate when the first request reaching it leaves."""
    released = [1_700_000_000.0 + i for i in range(7)]  # rates 1, 1.5, 2, 2.5, 3, 3.5, 4
    stamp = [datetime.fromtimestamp(t).isoformat() for t in released]
    events = rps_change_events(RampUp("linear", 1, 4), 7, released)
    assert events == [
        {"rps": 1, "timestamp": stamp[0]},
        {"rps": 2, "timestamp": stamp[2]},
        {"rps": 3, "timestamp": stamp[4]},
        {"rps": 4, "timestamp": stamp[6]},
    ]
    # a jump over several whole rates records each of them at once
    assert [e["rps"] for e in rps_change_events(RampUp("linear", 1, 7), 2, released[:2])] == list(range(1, 8))


@pytest.mark.parametrize(
    ("over", "words"),
    [
        (
            {"ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 4, "request_rate": 5.0},
            "give no --request-rate",
        ),
        (
            {"ramp_up_strategy": "linear", "ramp_up_start_rps": 1},
            "needs --ramp-up-start-rps and --ramp-up-end-rps",
        ),
        ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 0, "ramp_up_end_rps": 4}, "must be >= 1, got 0"),
        ({"ramp_up_strategy": "exponential", "ramp_up_start_rps": 5, "ramp_up_end_rps": 4}, "is below"),
        ({"ramp_up_start_rps": 1, "ramp_up_end_rps": 4}, "apply with --ramp-up-strategy"),
        ({"ramp_up_strategy": "cubic", "ramp_up_start_rps": 1, "ramp_up_end_rps": 4}, "must be one of"),
    ],
)
def test_ramp_up_settings_are_checked(over: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ServeConfig(**over).validate()  # type: ignore[arg-type]


def test_infinite_burstiness_spaces_the_requests_evenly_as_vllm() -> None:
    """vLLM 0.26 takes --burstiness inf as the gamma gaps' limit: every gap is 1 / rate (with a
    ramp-up, 1 / that request's rate), the first request's included; no random draw (the gamma
    of an infinite shape was NaN here, and the flag refused)."""
    offsets = arrival_offsets(4, 2.0, math.inf, np.random.default_rng(0))
    assert offsets == pytest.approx([0.5, 1.0, 1.5, 2.0])
    ramp = RampUp("linear", 1, 4)
    assert arrival_offsets(4, math.inf, math.inf, np.random.default_rng(0), ramp) == pytest.approx(
        [1.0, 1.5, 1.0 + 1 / 2 + 1 / 3, 1.0 + 1 / 2 + 1 / 3 + 1 / 4]
    )
    ServeConfig(request_rate=2.0, burstiness=math.inf).validate()
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match=r"--burstiness must be > 0 \(or inf: evenly spaced\)"):
            ServeConfig(request_rate=2.0, burstiness=bad).validate()
