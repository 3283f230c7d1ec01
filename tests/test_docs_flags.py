"""Every command-line flag the docs name is one that ``surge`` has, or one it refuses by name.

A flag renamed or removed in code but still named in README.md or docs/*.md sends a user to an
"unrecognized arguments" error; a flag the docs say Surge refuses with a hint must still have
that hint. Flags of other tools the docs quote (pip, huggingface-cli, ruff, the benchmark
scripts) are listed here or found in those scripts' sources.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from surge.cli import VLLM_DATASET_FLAG_PREFIXES, build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    "README.md",
    "DEVELOPERS.md",
    "docs/architecture.md",
    "docs/fp8.md",
    "docs/openai-api.md",
    "docs/parallel.md",
    "docs/server-limits.md",
    "docs/structured-outputs.md",
]
_FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")

OTHER_TOOLS = {
    "--no-index": "pip (scripts/install.sh)",
    "--index-url": "pip (scripts/install.sh)",
    "--find-links": "pip",
    "--local-dir": "huggingface-cli download",
    "--repo-type": "huggingface-cli download",
    "--check": "ruff format --check",
    "--max-model-length": "README's example of a mistyped flag (did you mean --max-model-len?)",
}


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every sub-command's parser under it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found.extend(_parsers(sub))
    return found


def _known() -> tuple[set[str], set[str]]:
    """(the flags of every ``surge`` parser, the vLLM flags they refuse with a hint)."""
    flags: set[str] = set()
    hinted: set[str] = set()
    for p in _parsers(build_parser()):
        flags.update(s for s in p._option_string_actions if s.startswith("--"))
        hinted.update(getattr(p, "flag_hints", {}))
    return flags, hinted


def _script_flags() -> set[str]:
    """Flags the benchmark and helper scripts take or pass on (their sources name them)."""
    found: set[str] = set()
    for folder in ("benchmarks", "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".sh"):
                found.update(_FLAG.findall(path.read_text(encoding="utf-8", errors="replace")))
    return found


def test_every_flag_the_docs_name_exists() -> None:
    flags, hinted = _known()
    scripts = _script_flags()
    unknown = []
    for doc in DOCS:
        for flag in sorted(set(_FLAG.findall((ROOT / doc).read_text(encoding="utf-8")))):
            if flag.endswith("-"):  # a family, `--random-mm-*`: a prefix Surge refuses
                if flag in VLLM_DATASET_FLAG_PREFIXES or any(f.startswith(flag) for f in flags):
                    continue
            elif flag in flags or flag in hinted or flag in OTHER_TOOLS or flag in scripts:
                continue
            unknown.append(f"{doc}: {flag}")
    assert not unknown, f"flags the docs name that no surge parser, vLLM hint or script knows: {unknown}"
