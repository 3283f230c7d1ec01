"""The `surge` command line: `surge generate | serve | bench ...`.

Each sub-command lives with its feature and registers itself here:
``surge.engine.generate_cli`` (generate), ``surge.server.cli`` (serve), ``surge.bench.cli`` (bench).
A bad flag or a bad model folder exits non-zero with one readable line, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


class CliError(Exception):
    """A user mistake reported as one line on stderr with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"surge: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The full parser; each sub-command sets ``func`` (args -> exit code)."""
    from surge import __version__
    from surge.bench.cli import add_bench_parser
    from surge.engine.generate_cli import add_generate_parser
    from surge.server.cli import add_serve_parser

    parser = _Parser(prog="surge", description="Surge LLM serving engine")
    parser.add_argument("--version", action="version", version=f"surge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_generate_parser(sub)
    add_serve_parser(sub)
    add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `surge` console script. Returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return int(func(args) or 0)
    except CliError as e:
        print(f"surge: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"surge: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
