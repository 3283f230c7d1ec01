"""API-process CPU per output as the output grows: per-token work that grows with the output
makes the total quadratic in its length and starves every other stream of the shared API
process. A benchmark, not part of the server: it prints the time at each size, so that linear
(time x4 when the size is x4) and quadratic (x16) show.

- ``tools``: a tool call of N characters (one string argument) streamed in 4-character pieces
  through the hermes, llama3_json and pythonic tool parsers;
- ``space``: an output of N characters of white space alone, in 4-character pieces, through the
  qwen3 and deepseek_r1 reasoning parsers, the pythonic and llama3_json tool parsers (which
  decide on the first character that is not white space) and a named ``tool_choice``'s parser
  (``f``: whose call opens there);
- ``generation``: one request of ``n: 16`` choices with logprobs, N one-token engine outputs
  per choice through :class:`surge.server.generation.Generation` with the non-streamed path's
  ``stream_interval`` (one delta at the end), Qwen3 tokenizer;
- ``detok``: N output tokens through ``IncrementalDetokenizer.update``, one at a time: plain
  text, and lone UTF-8 continuation bytes (which never complete a character), Qwen3 tokenizer.

Run from the repository root::

    .venv/bin/python benchmarks/api_output_costs.py tools 8000 32000 128000
    .venv/bin/python benchmarks/api_output_costs.py space 32000 128000
    .venv/bin/python benchmarks/api_output_costs.py generation 2000 8000 32000
    .venv/bin/python benchmarks/api_output_costs.py detok 2000 8000 32000
"""

from __future__ import annotations

import sys
import time
from typing import Any

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
    from surge.server.parsers.forced import NamedToolParser

    names = [
        ("reasoning", "qwen3"),
        ("reasoning", "deepseek_r1"),
        ("tools", "pythonic"),
        ("tools", "llama3_json"),
        ("named", "f"),
    ]
    for n in sizes:
        row = []
        for kind, name in names:
            if kind == "named":
                parser: Any = NamedToolParser(name)
            else:
                parser = REASONING_PARSERS[name]() if kind == "reasoning" else TOOL_PARSERS[name]()
            t0 = time.process_time()
            for _ in range(n // 4):
                parser.feed(" \n \n")
            parser.finish()
            row.append(f"{'named ' if kind == 'named' else ''}{name} {time.process_time() - t0:.3f} s")
        print(f"{n} characters: " + ", ".join(row), flush=True)


class _SilentClient:
    """An engine client that takes every request and sends nothing (the benchmark does)."""

    def add_request(self, *_: object, **__: object) -> int:
        return 0

    def abort_requests(self, ids: list[str]) -> None:
        pass


def generation(sizes: list[int]) -> None:
    """Print, per size, the CPU seconds of ``Generation.deltas`` over 16 choices of N tokens."""
    import asyncio
    from typing import cast

    from transformers import AutoTokenizer

    from surge.core.logprobs import LogprobsLists
    from surge.core.outputs import EngineOutput, SchedulerStats
    from surge.engine.client import EngineClient
    from surge.sampling_params import SamplingParams
    from surge.server.generation import Generation
    from surge.server.metrics import ServerMetrics

    tok = AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)
    word = tok.encode(" hello")[0]
    n_choices = 16

    async def run(n: int) -> float:
        metrics = ServerMetrics("m", lambda: SchedulerStats(0, 0, 0.0, 10, 10, 0), max_model_len=n + 16)
        gen = Generation(cast(EngineClient, _SilentClient()), tok, metrics, 2**31, 0.0, eos_token_ids=(0,))
        params = SamplingParams(max_tokens=n, n=n_choices, logprobs=2)
        gen.add_prompt("r", [1, 2, 3], params)
        row = LogprobsLists([[word, 1, 2]], [[-0.1, -2.0, -3.0]], [1])
        for c in gen.choices:
            for i in range(n):
                last = "length" if i == n - 1 else None
                gen._queue.put_nowait((c.index, EngineOutput(c.request_id, [word], last, logprobs=row)))
        t0, chars = time.process_time(), 0
        async for deltas in gen.deltas():
            chars += sum(len(d.text) for d in deltas)
        assert chars == n_choices * n * len(" hello"), chars
        return time.process_time() - t0

    for n in sizes:
        print(f"{n} tokens x {n_choices} choices: {asyncio.run(run(n)):.3f} s", flush=True)


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
    """``api_output_costs.py tools|space|generation|detok SIZE...``."""
    what, sizes = sys.argv[1], [int(x) for x in sys.argv[2:]]
    {"tools": tools, "space": space, "generation": generation, "detok": detok}[what](sizes)


if __name__ == "__main__":
    main()
