"""Where a grammar starts under a reasoning parser: after the reasoning, as vLLM 0.26's
structured-output manager decides it (``vllm/v1/structured_output/__init__.py``,
``should_fill_bitmask`` / ``should_advance``), for every request that reaches its engine (the
offline ``LLM``'s and the server's ``/v1/completions``; its chat route decides up front, from
``include_reasoning``). No torch here."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from surge.core.thinking_budget import ReasoningTokens, reasoning_ended
from surge.sampling_params import SamplingParams


def wait_for_reasoning_end(
    params: SamplingParams, tokens: ReasoningTokens | None, prompt_token_ids: Sequence[int]
) -> SamplingParams:
    """``params`` whose grammar waits for the reasoning's end: with reasoning delimiters
    ``tokens`` (a reasoning parser), a grammar whose ``reasoning_end_token_id`` is unset applies
    after the first reasoning-end token (``</think>``) the output generates, unless the prompt
    has closed the reasoning (its last ``</think>`` comes after its last ``<think>``, as in
    Qwen3's chat prompt with ``enable_thinking`` false), which is how vLLM reads the prompt
    (``is_reasoning_end``). A prompt without either delimiter has not ended it: the grammar
    waits. Unchanged without ``tokens``, without a grammar, with the gate already set, or with a
    reasoning end of more than one token (the gate is one token).

    Args:
        params: the request's sampling parameters.
        tokens: the reasoning delimiters of the parser (``EngineConfig.reasoning_tokens``), or None.
        prompt_token_ids: the request's prompt.
    """
    grammar = params.structured_outputs
    if (
        grammar is None
        or tokens is None
        or grammar.reasoning_end_token_id is not None
        or len(tokens.end) != 1
        or reasoning_ended(tokens, prompt_token_ids)
    ):
        return params
    gated = msgspec.structs.replace(grammar, reasoning_end_token_id=tokens.end[0])
    return msgspec.structs.replace(params, structured_outputs=gated)
