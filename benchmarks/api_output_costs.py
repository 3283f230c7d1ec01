"""API-process CPU per output as the output grows: per-token work that grows with the output
makes the total quadratic in its length and starves every other stream of the shared API
process. A benchmark, not part of the server: it prints the time at each size, so that linear
(time x4 when the size is x4) and quadratic (x16) show.

- ``tools``: a tool call of N characters (one string argument) streamed in 4-character pieces
  through the hermes, llama3_json and pythonic tool parsers;
- ``space``: an output of N characters of white space alone, in 4-character pieces, through the
  qwen3 and deepseek_r1 reasoning parsers and the pythonic and llama3_json tool parsers (which
  decide on the first character that is not white space);
- ``detok``: N output tokens through ``IncrementalDetokenizer.update``, one at a time: plain
  text, and lone UTF-8 continuation bytes (which never complete a character), Qwen3 tokenizer.

Run from the repository root::

    .venv/bin/python benchmarks/api_output_costs.py tools 8000 32000 128000
    .venv/bin/python benchmarks/api_output_costs.py space 32000 128000
    .venv/bin/python benchmarks/api_output_costs.py detok 2000 8000 32000
"""

from __future__ import annotations

import sys
import time

from surge.server.parsers.base import ToolParser
from surge.server.parsers.hermes import HermesToolParser
from surge.server.parsers.llama3_json import Llama3JsonToolParser
from surge.server.parsers.pythonic import PythonicToolParser

QWEN3_TOKENIZER = "../shared/assets/models/qwen3-8b"


def _call_text(parser: str, n: int) -> str:
    """A call of ``parser``'s syntax with an ``n``-character string argument."""
    body = "x" * n
    if parser == "hermes":
        return '<tool_call>{"name": "f", "arguments": {"a": "' + body + '"}}</tool_call>'
    if parser == "llama3_json":
        return '{"name": "f", "parameters": {"a": "' + body + '"}}'
    return "[f(a='" + body + "', b=1)]"


def tools(sizes: list[int]) -> None:
    """Print, per size, each tool parser's CPU seconds for a call streamed in 4-character pieces."""
    parsers: dict[str, type[ToolParser]] = {
        "hermes": HermesToolParser,
        "llama3_json": Llama3JsonToolParser,
        "pythonic": PythonicToolParser,
    }
    for n in sizes:
        row = []
        for name, cls in parsers.items():
            text, parser, released = _call_text(name, n), cls(), 0
            t0 = time.process_time()
            for i in range(0, len(text), 4):
                released += sum(len(c.arguments) for c in parser.feed(text[i : i + 4]).tool_calls)
            released += sum(len(c.arguments) for c in parser.finish().tool_calls)
            row.append(f"{name} {time.process_time() - t0:.3f} s")
            assert released >= n, (name, released)
        print(f"{n} characters: " + ", ".join(row), flush=True)


def space(sizes: list[int]) -> None:
    """Print, per size, each parser's CPU seconds for an output of white space alone."""
    from surge.server.parsers import REASONING_PARSERS, TOOL_PARSERS

    names = [
        ("reasoning", "qwen3"),
        ("reasoning", "deepseek_r1"),
        ("tools", "pythonic"),
        ("tools", "llama3_json"),
    ]
    for n in sizes:
        row = []
        for kind, name in names:
            parser = REASONING_PARSERS[name]() if kind == "reasoning" else TOOL_PARSERS[name]()
            t0 = time.process_time()
            for _ in range(n // 4):
                parser.feed(" \n \n")
            parser.finish()
            row.append(f"{name} {time.process_time() - t0:.3f} s")
        print(f"{n} characters: " + ", ".join(row), flush=True)


def detok(sizes: list[int]) -> None:
    """Print, per size, the detokenizer's CPU seconds for plain text and for lone bytes."""
    from transformers import AutoTokenizer

    from surge.tokenizer import IncrementalDetokenizer

    tok = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)
    word = tok.encode(" hello")
    lone = next(i for i in range(len(tok)) if tok.decode([i]) == "\ufffd")  # byte 0x80's token
    for n in sizes:
        row = []
        for case, ids in (("plain", word * n), ("lone bytes", [lone] * n)):
            d = IncrementalDetokenizer(tok, [])
            t0 = time.process_time()
            text = "".join(d.update([t]) for t in ids) + d.flush()
            row.append(f"{case} {time.process_time() - t0:.3f} s ({len(text)} characters)")
        print(f"{n} tokens: " + ", ".join(row), flush=True)


def main() -> None:
    """``api_output_costs.py tools|space|detok SIZE...``."""
    what, sizes = sys.argv[1], [int(x) for x in sys.argv[2:]]
    {"tools": tools, "space": space, "detok": detok}[what](sizes)


if __name__ == "__main__":
    main()
