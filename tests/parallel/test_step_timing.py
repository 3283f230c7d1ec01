"""benchmarks/tp_step_timing.py on CPU (gloo): TP=1 and TP=2 per-step records are complete and
consistent; the worker's StepClock writes nothing unless asked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from surge.parallel.step_clock import StepClock
from surge.parallel.worker import WorkerSpec

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "benchmarks" / "tp_step_timing.py"
STORIES = REPO / "surge" / "assets" / "stories260K"


def test_step_clock_orders_its_marks(tmp_path: Path) -> None:
    clock = StepClock(rank=1, cuda=False)
    for step in (0, 1):
        clock.received(step)
        clock.launching()
        clock.launched(object())  # no launch_times: those marks are left out
        clock.resolving(step)
        clock.resolved(step)
    clock.sent(1)
    path = tmp_path / "t.jsonl"
    clock.write(str(path))
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in recs] == [0, 1] and all(r["rank"] == 1 for r in recs)
    for r in recs:
        assert r["t_recv"] <= r["t_decoded"] <= r["t_returned"] <= r["t_resolve"] <= r["t_ids"]
        assert "gpu_ms" not in r and "t_prepared" not in r
    assert "t_sent" in recs[1] and "t_sent" not in recs[0]


def test_worker_spec_has_no_timing_by_default() -> None:
    spec = WorkerSpec(0, 2, "cpu", "tcp://127.0.0.1:1", "ipc://a", "ipc://b", None)
    assert spec.step_timing_path is None


def test_tp_step_timing_cpu(tmp_path: Path) -> None:
    out_path = tmp_path / "steps.jsonl"
    steps = 6
    proc = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            str(STORIES),
            "--tp",
            "1,2",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--max-model-len",
            "512",
            "--steps",
            str(steps),
            "--warmup",
            "2",
            "--async-scheduling",
            "on",
            "--json",
            str(out_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(line) for line in out_path.read_text().splitlines()]
    summaries = {r["tp"]: r for r in recs if r["kind"] == "summary"}
    assert set(summaries) == {1, 2}
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [p["tp"] for p in printed] == [1, 2]
    for tp, s in summaries.items():
        assert s["async_scheduling"] is True and s["device"] == "cpu"
        assert s["steps"] >= steps - 1
        for key in ("wall_ms", "schedule_ms", "result_wait_ms", "update_ms"):
            assert s["engine"][key]["median"] >= 0, (tp, key)
        for rank in range(tp):
            for key in ("prepare_ms", "launch_ms"):
                assert s[f"rank{rank}"][key]["median"] >= 0, (tp, rank, key)
    two = summaries[2]
    assert "encode_ms" in two["engine"] and "publish_ms" in two["engine"]
    assert "bcast_ms" in two["rank0"] and "bcast_ms" in two["rank1"]
    assert "result_ms" in two["rank0"] and "result_ms" not in two["rank1"]  # rank 0 answers
    assert "launch_skew_ms" in two["rank1"] and "launch_skew_ms" not in two["rank0"]
    workers = [r for r in recs if r["kind"] == "worker" and r["tp"] == 2]
    assert {r["rank"] for r in workers} == {0, 1}
    assert all(r["gpu_ms"] is None for r in workers)  # CPU: no CUDA events
