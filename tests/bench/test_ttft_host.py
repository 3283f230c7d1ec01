"""benchmarks/ttft_host.py runs at a small size on CPU and reports every stage, fresh and cached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ttft_host_small(tmp_path: Path) -> None:
    out = tmp_path / "ttft_host.json"
    run = subprocess.run(
        [sys.executable, "benchmarks/ttft_host.py", "--input-len", "200", "--rounds", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "prefix-cache hits of each repeat: expected 192 tokens, as expected" in run.stdout
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["input_len"] == 200
    stages = result["us"]
    for name in ("api: check_prompt", "engine: add_request", "engine: schedule()", "engine: input prepare"):
        assert stages[name]["fresh"] > 0 and stages[name]["cached"] > 0
    assert stages["= host total (sum of medians)"]["cached"] > 0
