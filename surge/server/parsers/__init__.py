"""Output parsers of chat completions: tool calls (``--tool-call-parser``) and reasoning
(``--reasoning-parser``), one file each, composed per choice by :class:`ChatOutputParser`."""

from __future__ import annotations

from typing import Any

from surge.core.thinking_budget import ReasoningTokens, reasoning_tokens_of
from surge.server.parsers.base import DeltaMessage, ToolCallDelta, ToolParser, new_tool_call_id
from surge.server.parsers.hermes import HermesToolParser
from surge.server.parsers.llama3_json import Llama3JsonToolParser
from surge.server.parsers.pythonic import PythonicToolParser
from surge.server.parsers.reasoning import (
    THINK_START,
    DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser,
    ReasoningParser,
)

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "pythonic": PythonicToolParser,
}
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
}


def reasoning_tokens(
    tokenizer: Any, reasoning_parser: str, flag: str = "--reasoning-parser"
) -> ReasoningTokens:
    """The token ids of ``reasoning_parser``'s delimiters (``<think>`` / ``</think>``) in
    ``tokenizer``'s vocabulary: what a request's ``thinking_token_budget`` counts and forces
    (``EngineConfig.reasoning_tokens``).

    Each delimiter must be one token of the vocabulary, as vLLM's reasoning parsers require
    (``BaseThinkingReasoningParser``: "could not locate think start/end tokens in the
    tokenizer"): a model without them never writes them as such, so its whole output would read
    as reasoning and a ``thinking_token_budget`` would count nothing.

    Args:
        tokenizer: the model's tokenizer.
        reasoning_parser: a name of :data:`REASONING_PARSERS`.
        flag: how the caller spells the option in an error (``--reasoning-parser``, or
            ``reasoning_parser`` for ``LLM(...)``).

    Raises:
        ValueError: an unknown parser name, or a delimiter that is not a token of the vocabulary
            (the message names ``flag`` and the missing tokens).
    """
    check_reasoning_parser(reasoning_parser)
    end = REASONING_PARSERS[reasoning_parser].end_tag
    vocab = tokenizer.get_vocab()
    missing = [tag for tag in (THINK_START, end) if tag not in vocab]
    if missing:
        option = f"{flag} {reasoning_parser}" if flag.startswith("--") else f"{flag}={reasoning_parser!r}"
        raise ValueError(
            f"{option}: the model's tokenizer has no {' or '.join(missing)} token (a reasoning "
            f"parser needs {THINK_START} and {end} as tokens of the vocabulary, as vLLM's do); "
            f"leave {flag} out for this model"
        )
    return reasoning_tokens_of(tokenizer, THINK_START, end)


def check_reasoning_parser(reasoning_parser: object) -> None:
    """Raise ValueError unless ``reasoning_parser`` names a reasoning parser."""
    if not isinstance(reasoning_parser, str) or reasoning_parser not in REASONING_PARSERS:
        raise ValueError(
            f"reasoning_parser must be one of {', '.join(sorted(REASONING_PARSERS))}, got {reasoning_parser!r}"
        )


class ChatOutputParser:
    """One choice's text through an optional reasoning parser, then an optional tool parser.

    The tool parser sees only the answer: nothing while the output is (or may still be) the
    reasoning, so a forced call's arguments are exactly the text the grammar constrained after
    ``</think>``; an output whose reasoning never ends has no tool calls.

    Args:
        reasoning: splits reasoning from the answer, or None.
        tools: finds tool calls in the answer, or None (the answer is all content).
    """

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolParser | None) -> None:
        self.reasoning = reasoning
        self.tools = tools

    @property
    def has_tool_calls(self) -> bool:
        return self.tools is not None and self.tools.has_tool_calls

    @property
    def in_reasoning(self) -> bool:
        """The output is inside its reasoning (after :meth:`finish`: it never left it), so it
        has no answer yet (``content`` is null)."""
        return self.reasoning is not None and self.reasoning.in_reasoning

    def _answering(self) -> bool:
        return self.reasoning is None or self.reasoning.reasoning_ended

    def feed(self, text: str) -> DeltaMessage:
        """The next piece of generated text -> what can be sent now."""
        reasoning, content = ("", text) if self.reasoning is None else self.reasoning.feed(text)
        if self.tools is None or not self._answering():
            return DeltaMessage(content=content, reasoning=reasoning)
        out = self.tools.feed(content)
        out.reasoning = reasoning
        return out

    def finish(self) -> DeltaMessage:
        """The end of the text -> the rest."""
        reasoning, content = ("", "") if self.reasoning is None else self.reasoning.finish()
        if self.tools is None or not self._answering():
            return DeltaMessage(content=content, reasoning=reasoning)
        out = self.tools.feed(content).extend(self.tools.finish())
        out.reasoning = reasoning
        return out

    def parse(self, text: str, as_streamed: bool = False) -> DeltaMessage:
        """The whole text at once (non-streamed responses). When the tool parser finds a
        malformed call (JSON cut by ``max_tokens``, or invalid), the answer is its raw text as
        content with no tool calls, as vLLM's non-streamed parsers answer (a stream has already
        sent the call's deltas); a forced ``tool_choice``'s parser finds none malformed (its cut
        calls stay, as streamed). ``as_streamed``: the answer is what the stream sends, malformed
        calls included (the Responses API, whose stream sends them as items)."""
        out = self.feed(text).extend(self.finish())
        raw = None if self.tools is None or as_streamed else self.tools.malformed_text()
        if raw is not None:
            out = DeltaMessage(content=raw, reasoning=out.reasoning)
        return out


__all__ = [
    "REASONING_PARSERS",
    "check_reasoning_parser",
    "reasoning_tokens",
    "TOOL_PARSERS",
    "ChatOutputParser",
    "DeltaMessage",
    "ToolCallDelta",
    "ToolParser",
    "new_tool_call_id",
]
