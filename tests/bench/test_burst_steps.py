"""benchmarks/burst_steps.py on CPU: a tiny burst's steps account for every token, and each carries
the runner's prepare and launch times; ``--tail`` prints the burst's last steps; the collector's
full pass is timed before the bursts and the burst's end recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "benchmarks" / "burst_steps.py"
STORIES = REPO / "surge" / "assets" / "stories260K"


def test_burst_steps_records_every_token_and_the_launch_times(tmp_path: Path) -> None:
    out = tmp_path / "steps.jsonl"
    args = [
        "--model",
        str(STORIES),
        "--dtype",
        "float32",
        "--c",
        "3",
        "--input-len",
        "8",
        "--output-len",
        "5",
    ]
    args += [
        "--spacing-ms",
        "0",
        "--rounds",
        "1",
        "--show",
        "1",
        "--tail",
        "2",
        "--json",
        str(out),
        "--sync-debug",
    ]
    run = subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=240, cwd=REPO
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    steps = record["steps"]
    # 3 prompts of 8 tokens, then 4 more tokens each (the first comes with the prefill).
    assert sum(s["tokens"] for s in steps) == 3 * 8 + 3 * 4
    assert len(record["ttft_ms"]) == 3 and record["allocator"] == {}
    assert all(s["prepare_ms"] >= 0 and s["launch_ms"] >= 0 for s in steps if s["tokens"])
    shown = [line for line in run.stdout.splitlines() if line.startswith("  step at")]
    assert len(shown) == 3 and "  ..." in run.stdout.splitlines()  # the first step, then the last two
    assert "launch" in shown[0] and "synchronising PyTorch calls" in run.stdout
    assert "a full garbage collection over the engine took" in run.stdout
    assert record["end_ms"] >= record["last_first_token_ms"] > 0
