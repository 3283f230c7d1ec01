"""Shared helpers for the benchmark tests."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.conftest import QWEN3_8B_DIR

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the bench sends $OPENAI_API_KEY when --api-key is absent: a developer's key must not reach the
# test servers (tests that want it set it themselves)
os.environ.pop("OPENAI_API_KEY", None)

REPO = Path(__file__).resolve().parents[2]
BUNDLED_MODEL = REPO / "surge" / "assets" / "stories260K"
SHARED = REPO.parent / "shared" / "assets"
QWEN3_8B = QWEN3_8B_DIR  # the one path of tests/conftest.py (the name the bench tests import)
SHAREGPT = SHARED / "datasets" / "sharegpt" / "ShareGPT_V3_filtered_500.json"


def serve_argv(url: str, *extra: str) -> list[str]:
    """``surge bench serve`` against ``url`` with no progress bar and no warm-up request, then ``extra``."""
    return ["bench", "serve", "--base-url", url, "--disable-tqdm", "--warmup", "0", *extra]


def bench_main(argv: Sequence[str]) -> int:
    """Run ``surge bench ...`` in-process like ``surge.cli.main`` does (same error handling)."""
    from surge.bench.cli import add_bench_parser
    from surge.cli import CliError, _Parser

    parser = _Parser(prog="surge")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_bench_parser(sub)
    args: argparse.Namespace = parser.parse_args(list(argv))
    try:
        return int(args.func(args) or 0)
    except (CliError, ValueError) as e:
        print(f"surge: error: {e}", file=sys.stderr)
        return 2
