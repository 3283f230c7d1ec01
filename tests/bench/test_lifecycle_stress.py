"""benchmarks/lifecycle_stress.py: a few seconds against a real server with a small KV pool end
with preemptions, hang-ups and no failed check; its checks fail on a wrong token count, a stop
string left in the text or a missing choice; an unreachable server is one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.conftest import start_server

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "benchmarks" / "lifecycle_stress.py"
sys.path.insert(0, str(REPO / "benchmarks"))

import lifecycle_stress as ls  # noqa: E402


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_a_short_run_preempts_hangs_up_and_passes(tmp_path: Path) -> None:
    srv = start_server(
        tmp_path,
        "--num-kv-blocks",
        "24",
        "--max-model-len",
        "256",
        "--engine-stall-timeout",
        "1",
        "--enable-server-load-tracking",
    )
    try:
        out = tmp_path / "run.json"
        run = _run(
            "--url",
            srv.url,
            "--waves",
            "2",
            "--wave-seconds",
            "4",
            "--concurrency",
            "16",
            "--max-tokens",
            "120",
            "--disconnect-fraction",
            "0.3",
            "--responses-fraction",
            "0.2",
            "--idle-health-wait",
            "1.5",
            "--idle-timeout",  # a run that fails (never idle) waits 5 s per wave, not 30 s
            "5",
            "--reset-prefix-cache-every",
            "1.5",
            "--server-log",
            str(srv.log_path),
            "--seed",
            "3",
            "--json",
            str(out),
        )
        assert run.returncode == 0, run.stderr[-3000:] + run.stdout
        summary = json.loads(out.read_text())
        assert summary["failures"] == []
        assert summary["finished"] > 0 and summary["preemptions"] > 0
        assert sum(summary["disconnects"].values()) > 0
        assert summary["greedy_checked"] + summary["seeded_checked"] > 0
        assert run.stdout.strip().splitlines()[-1].startswith("lifecycle_stress: sent ")
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


def _spec(max_tokens: int = 5, n: int = 2, stop: list[str] | None = None) -> ls.Spec:
    body = {"n": n, "max_tokens": max_tokens, "stream": False, **({"stop": stop} if stop else {})}
    return ls.Spec("/v1/completions", body, None, [5, 6, 7])


def _choice(reason: str = "length", ids: int | None = 5, text: str = "x") -> dict[str, object]:
    return {"finish_reason": reason, "ids": ids, "text": text}


@pytest.mark.parametrize(
    ("choices", "usage", "fails"),
    [
        ({0: _choice(), 1: _choice()}, {"completion_tokens": 10, "prompt_tokens": 3}, None),
        ({0: _choice(), 1: _choice(ids=4)}, None, "choice 1 has 4 ids for max_tokens=5"),
        (
            {0: _choice(), 1: _choice()},
            {"completion_tokens": 9, "prompt_tokens": 3},
            "usage.completion_tokens 9",
        ),
        (
            {0: _choice(), 1: _choice()},
            {"completion_tokens": 10, "prompt_tokens": 4},
            "usage.prompt_tokens 4",
        ),
        ({0: _choice()}, None, "choices [0] for n=2"),
        ({0: _choice(), 1: _choice(reason="stop")}, None, "finish_reason 'stop'"),
    ],
)
def test_the_checks_fail_on_a_wrong_answer(
    choices: dict[int, dict[str, object]], usage: dict[str, int] | None, fails: str | None
) -> None:
    tally = ls.Tally()
    ls.check_choices(tally, "r", _spec(), choices, usage)
    if fails is None:
        assert tally.failures == []
    else:
        assert len(tally.failures) == 1 and fails in tally.failures[0]


def test_a_stopped_choice_may_not_hold_its_stop_string() -> None:
    tally = ls.Tally()
    spec = _spec(stop=["dog"])
    ls.check_choices(tally, "r", spec, {0: _choice(), 1: _choice("stop", 3, "a dog")}, None)
    assert len(tally.failures) == 1 and "holds a stop string" in tally.failures[0]
    tally = ls.Tally()
    ls.check_choices(tally, "r", spec, {0: _choice(), 1: _choice("stop", 3, "a cat")}, None)
    assert tally.failures == []


def test_prompt_logprobs_must_follow_the_prompt() -> None:
    tally = ls.Tally()
    ls.check_prompt_logprobs(tally, "r", [5, 6, 7], [None, {"6": {}}, {"7": {}, "9": {}}])
    assert tally.failures == []
    ls.check_prompt_logprobs(tally, "r", [5, 6, 7], [None, {"6": {}}])
    ls.check_prompt_logprobs(tally, "r", [5, 6, 7], [None, {"6": {}}, {"9": {}}])
    assert len(tally.failures) == 2


def test_an_unreachable_server_is_one_line() -> None:
    run = _run("--url", "http://127.0.0.1:9", "--waves", "1", "--wave-seconds", "1", timeout=30)
    assert run.returncode == 2
    assert run.stderr.strip().startswith("lifecycle_stress: cannot reach http://127.0.0.1:9")
    assert len(run.stderr.strip().splitlines()) == 1
