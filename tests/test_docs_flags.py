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
    "docs/benchmarking.md",
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
    "--http2": "curl --http2 (docs/server-limits.md: an h2c upgrade served as HTTP/1.1)",
    "--unix-socket": "curl --unix-socket (docs/openai-api.md: --uds)",
    "--max-model-length": "README's example of a mistyped flag (did you mean --max-model-len?)",
    "--max_model_len": "the docs' example of a flag spelled with underscores (read as --max-model-len)",
    "--foo_bar": "README's example of a value after = that keeps its underscores (--prompt=--foo_bar)",
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


def test_the_limits_table_gives_the_parsers_defaults() -> None:
    """docs/server-limits.md's table of limits: each flag's default is ``surge serve``'s (a
    flag resolved at start-up, ``--max-connections``, by the default its help states)."""
    serve = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "serve"
    ]
    actions = {s: a for a in serve._actions for s in a.option_strings}
    text = (ROOT / "docs" / "server-limits.md").read_text(encoding="utf-8")
    table = text.split("\n## Limits\n", 1)[1].split("\n\n", 1)[0]
    checked, wrong = 0, []
    for row in table.splitlines():
        m = re.match(r"\| `(--[\w-]+)` \| ([\d,.]+) ?(MiB)?", row)
        if m is None:
            continue
        flag, number, unit = m.group(1), float(m.group(2).replace(",", "")), m.group(3)
        documented = number * (1 << 20 if unit == "MiB" else 1)
        action = actions[flag]
        default = action.default
        if default is None:  # resolved at start-up: the help's "(default N ...)"
            found = re.search(r"default ([\d,.]+)", " ".join(str(action.help).split()))
            assert found, f"{flag}'s help states no default"
            default = float(found.group(1).replace(",", ""))
        checked += 1
        if float(default) != documented:
            wrong.append(f"{flag}: docs {m.group(2)}{' ' + unit if unit else ''}, parser {default}")
    assert checked >= 8, f"only {checked} flag rows found in docs/server-limits.md's limits table"
    assert not wrong, f"docs/server-limits.md's limits table disagrees with surge serve: {wrong}"


def test_every_bench_serve_and_matrix_flag_is_documented() -> None:
    """The benchmark docs (README.md, docs/*.md) name every flag of ``surge bench serve`` and
    ``surge bench matrix``, not only ``--help`` (``--goodput``, ``--request-timeout``,
    ``--no-exact-length``...): a user comparing with vLLM's ``bench serve`` reads them there."""
    named: set[str] = set()
    for doc in DOCS:
        named.update(_FLAG.findall((ROOT / doc).read_text(encoding="utf-8")))
    bench = next(p for p in _parsers(build_parser()) if p.prog.endswith(" bench"))
    missing = {}
    for sub in _parsers(bench)[1:]:
        if sub.prog.split()[-1] not in ("serve", "matrix"):
            continue
        flags = {s for s in sub._option_string_actions if s.startswith("--") and s != "--help"}
        if gone := sorted(flags - named):
            missing[sub.prog] = gone
    assert not missing, missing
