"""benchmarks/host_ceiling.py: each mode runs at a tiny size and reports consistent figures; it and
benchmarks/host_tails.py answer a bad --model in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from surge.bench.client import SSEParser, counts_as_output, parse_event

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "benchmarks" / "host_ceiling.py"
STORIES = REPO / "surge" / "assets" / "stories260K"


def _runs(*args: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, str(TOOL), *args, "--repeats", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_client_mode_counts_every_event() -> None:
    (run,) = _runs("client", "--streams", "8", "--tokens", "20", "--itl-ms", "5")
    assert run["num_errors"] == 0
    assert run["output_tokens"] == 8 * 20 and run["events"] == 8 * 20  # one token per event
    assert run["client_cpu_us_per_event"] > 0 and run["events_per_s"] > 0
    assert run["itl_p99_ms"] >= run["itl_median_ms"] > 0
    assert 0 <= run["itl_late_share"] < 1


def test_api_mode_delivers_every_token(tmp_path: Path) -> None:
    (run,) = _runs(
        "api", "--model", str(STORIES), "--streams", "8", "--tokens", "12", "--step-ms", "2",
        "--log-dir", str(tmp_path),
    )  # fmt: skip
    assert run["num_errors"] == 0, run["errors"]
    assert run["output_tokens"] == 8 * 12 and run["events"] == 8 * 12
    assert run["api_cpu_us_per_token"] > 0 and run["engine_cpu_us_per_token"] >= 0  # 10 ms clock ticks


def test_engine_mode_splits_host_time() -> None:
    (run,) = _runs("engine", "--streams", "4", "--steps", "3")
    assert run["rows_per_step"] == 4
    assert run["schedule_ms"] > 0 and run["update_ms"] > 0 and run["execute_ms"] > 0


def test_parse_event_accepts_what_python_json_accepts() -> None:
    assert parse_event('{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    assert parse_event('{"v": NaN}')["v"] != parse_event('{"v": NaN}')["v"]  # NaN, as json.loads
    with pytest.raises(ValueError):
        parse_event("{not json")


def test_parser_keeps_a_partial_line_across_many_events() -> None:
    stream = b"".join(b'data: {"i": %d}\n\n' % i for i in range(100))
    p = SSEParser()
    got = p.feed(stream[:-7]) + p.feed(stream[-7:])
    assert got == [f'{{"i": {i}}}' for i in range(100)]


@pytest.mark.parametrize(
    ("delta", "counts"),
    [
        ({"content": "x"}, True),
        ({"role": "assistant", "content": ""}, False),
        ({"content": ""}, True),
        ({}, False),
        ({"reasoning_content": "r"}, True),
        ({"tool_calls": [{"id": "a"}]}, True),
        ({"content": None, "reasoning": "r"}, True),
    ],
)
def test_counts_as_output_rule(delta: dict, counts: bool) -> None:
    assert counts_as_output({"delta": delta}, chat=True) is counts


TAILS = REPO / "benchmarks" / "host_tails.py"


@pytest.mark.parametrize(
    "argv",
    [
        [str(TOOL), "api"],
        [str(TAILS), "--endpoint", "chat", "--port", "8922"],
        [str(TAILS), "--endpoint", "convoy"],
    ],
)
def test_a_bad_model_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    """A bad --model is `surge`'s one line and exit 2 (it was a traceback once the server had died,
    or from the tokenizer): a missing folder and one without tokenizer files before any server
    starts, a config the server cannot load with the server's own line."""
    (tmp_path / "no_tokenizer").mkdir()
    (tmp_path / "no_tokenizer" / "config.json").write_text("{}")
    bad_config = tmp_path / "bad_config"
    bad_config.mkdir()
    for f in STORIES.glob("tokenizer*"):
        (bad_config / f.name).write_bytes(f.read_bytes())
    (bad_config / "config.json").write_text('{"model_type": "gpt2"}')
    cases = [
        (tmp_path / "nope", "no such folder"),
        (tmp_path / "no_tokenizer", "the folder has no tokenizer"),
    ]
    if "convoy" not in argv:
        cases.append((bad_config, "the server did not start: model: "))
    prog = Path(argv[0]).name
    for model, words in cases:
        out = subprocess.run(
            [sys.executable, *argv, "--model", str(model), "--log-dir", str(tmp_path), "--repeats", "1"],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=REPO,
        )
        assert out.returncode == 2, out.stderr[-3000:]
        assert out.stderr.startswith(f"{prog}: error: ") and out.stderr.count("\n") == 1, out.stderr
        assert words in out.stderr, out.stderr
