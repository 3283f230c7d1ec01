"""benchmarks/greedy_tokens.py: a run on the bundled model writes every request's tokens and top-5
log-probabilities, the same tree compares equal with itself (exit 0), and a changed token or
log-probability is reported with its position (exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "benchmarks" / "greedy_tokens.py"
STORIES = REPO / "surge" / "assets" / "stories260K"


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--model",
            str(STORIES),
            "--wave",
            "3:6:4",
            "--wave",
            "2:9:3",
            "--json",
            str(out),
        ]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_a_tree_equals_itself_and_a_change_is_reported(tmp_path: Path) -> None:
    first = _run(tmp_path / "a.json")
    assert first.returncode == 0, first.stderr[-3000:]
    run = json.loads((tmp_path / "a.json").read_text())
    assert sorted(run) == ["w0-0", "w0-1", "w0-2", "w1-0", "w1-1"]
    assert [len(r["tokens"]) for r in run.values()] == [4, 4, 4, 3, 3]
    assert all(len(r["logprobs"]) == len(r["tokens"]) and len(r["logprobs"][0]) == 6 for r in run.values())

    same = _run(tmp_path / "b.json", "--compare", str(tmp_path / "a.json"))
    assert same.returncode == 0 and "5 requests, 0 differ" in same.stdout

    run["w1-0"]["logprobs"][2][0] += 1e-6
    run["w0-2"]["tokens"][1] += 1
    (tmp_path / "changed.json").write_text(json.dumps(run))
    diff = _run(tmp_path / "c.json", "--compare", str(tmp_path / "changed.json"))
    assert diff.returncode == 1
    assert "w1-0: logprobs differ from position 2 of 3" in diff.stdout
    assert "w0-2: tokens differ from position 1 of 4" in diff.stdout
    assert "5 requests, 2 differ" in diff.stdout


def test_a_bad_model_folder_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--model",
            str(tmp_path / "nope"),
            "--wave",
            "1:2:3",
            "--json",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("greedy_tokens.py: error: ")
