"""The `surge` command line: every user mistake is one line with exit code 2, found before torch
is imported; bare `surge` prints the help; every --help shows the defaults."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STORIES = REPO / "surge" / "assets" / "stories260K"

PROBE = (
    "import sys; from surge.cli import main; rc = main(sys.argv[1:]); "
    "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(rc)"
)


def _surge(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``surge ARGS`` in a fresh interpreter that reports whether torch got imported."""
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _one_line_error(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.startswith("surge: error: ") and p.stderr.count("\n") == 1, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr
    assert "NO-TORCH" in p.stdout, "the model folder must be checked before torch is imported"


@pytest.mark.parametrize("command", [["serve"], ["generate", "--prompt", "x"]])
def test_bad_model_folders(command: list[str], tmp_path: Path) -> None:
    _one_line_error(_surge(*command, "--model", str(tmp_path / "nope")), "--model", "no such folder")
    _one_line_error(_surge(*command, "--model", "Qwen/Qwen3-8B"), "local folders only", "--model DIR")
    f = tmp_path / "file"
    f.write_text("x")
    _one_line_error(_surge(*command, "--model", str(f)), "not a folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(_surge(*command, "--model", str(empty)), "no config.json")
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    shutil.copy(STORIES / "config.json", no_tok)
    shutil.copy(STORIES / "model.safetensors", no_tok)
    _one_line_error(_surge(*command, "--model", str(no_tok)), "has no tokenizer")
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(STORIES / name, no_weights)
    _one_line_error(_surge(*command, "--model", str(no_weights)), "--load-format dummy")


def test_bare_surge_prints_help() -> None:
    p = _surge()
    assert p.returncode == 0 and "usage: surge" in p.stdout and "serve" in p.stdout


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from surge.cli import build_parser

    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{name} {sub_name}", sub)

    walk("surge", build_parser())
    return out


def test_every_help_shows_defaults() -> None:
    parsers = _parsers()
    assert {"surge serve", "surge generate", "surge bench matrix", "surge bench roofline"} <= {
        n for n, _ in parsers
    }
    for name, parser in parsers:
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or action.default is argparse.SUPPRESS:
                continue
            text = formatter._get_help_string(action) or ""  # type: ignore[attr-defined]
            assert "default" in text.lower(), f"{name} {action.option_strings[0]}: {text!r}"


def test_roofline_help_names_the_hardware_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from surge.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "roofline", "--help"])
    out = capsys.readouterr().out
    assert "--gpu" in out and "--hbm-bandwidth" in out and "--peak-flops" in out
    assert "required: --gpu, or both --hbm-bandwidth and --peak-flops" in out
