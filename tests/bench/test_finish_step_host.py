"""benchmarks/finish_step_host.py runs at a small size on CPU and splits the finishing call's host time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "benchmarks/finish_step_host.py", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def test_finish_step_host_small() -> None:
    run = _run("--c", "4", "--input-len", "16", "--output-len", "6", "--finishing", "2", "--rounds", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2 of 4 requests ask for 6 tokens" in run.stdout
    rows = [line.split() for line in run.stdout.splitlines() if "outs" in line and "fin" in line]
    # the call that applies the step in which 2 requests reach max_tokens launches the 2 others
    finishing = [r for r in rows if r[1:7] == ["2", "reqs", "4", "outs", "2", "fin"]]
    assert len(finishing) == 1, run.stdout
    # schedule, drop, prepare, sampler_build, result, update, call: the launched batch's
    # composition changed (2 left) and the update finished 2 requests
    times = dict(
        zip(
            ("schedule", "drop", "prepare", "sampler_build", "result", "update", "call"),
            map(float, finishing[0][7:]),
            strict=True,
        )
    )
    assert times["sampler_build"] > 0 and times["update"] > 0
    assert times["call"] > times["update"] + times["prepare"]
    after = rows[rows.index(finishing[0]) + 1]
    assert after[1:7] == ["2", "reqs", "2", "outs", "0", "fin"], run.stdout


def test_finish_step_host_bad_flags_are_one_line() -> None:
    run = _run("--c", "4", "--finishing", "5")
    assert run.returncode == 2 and "--finishing counts must be in [0, --c=4]" in run.stderr
    assert "Traceback" not in run.stderr
    run = _run("--device", "tpu")
    assert run.returncode == 2 and "--device must be cpu or cuda, got 'tpu'" in run.stderr
    run = _run("--input-len", "400", "--output-len", "200", "--rounds", "1")
    assert run.returncode == 2 and "max_model_len 512" in run.stderr
    assert "Traceback" not in run.stderr
