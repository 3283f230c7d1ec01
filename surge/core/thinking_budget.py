"""vLLM's ``thinking_token_budget``: a cap on the tokens generated inside the reasoning
section, after which the reasoning-end token sequence (``</think>``) is forced.

The reasoning delimiters are the token ids of the server's ``--reasoning-parser`` (or the
offline ``LLM(reasoning_parser=...)``) strings, tokenized with the model's tokenizer
(:class:`ReasoningTokens`, carried by ``EngineConfig.reasoning_tokens``). Each request with a
budget gets a :class:`ThinkingBudget`; the scheduler asks it, when it schedules a step that
samples the request, which token (if any) the step must produce, and the sampler overwrites
that row's sampled id (``SchedulerOutput.forced_tokens``). The decision needs every output
token, so such a request's step is applied before the next is scheduled
(``SamplingParams.needs_host_outputs``), as penalties are. No torch here.

Semantics (vLLM 0.26's ``ThinkingBudgetStateHolder``, without speculative decoding):

- Inside the reasoning: after the last reasoning-start sequence of the prompt that no end
  sequence follows (Qwen3 templates with thinking, DeepSeek-R1: the prompt ends with
  ``<think>\\n``), from the first output token; or after a start sequence the model writes.
  The prompt's tokens after that ``<think>`` count against the budget, as in vLLM.
- Each output token written inside the reasoning counts one. Once the count reaches the
  budget, the next tokens are the end sequence, one forced token per step; then the request
  is outside the reasoning again (a later start sequence opens a new budget).
- A budget of 0 ends a reasoning at once: its first token is the end sequence.
- When the model writes the end sequence itself within the budget, nothing is forced.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

THINKING_BUDGET_NEEDS_REASONING = (
    "thinking_token_budget is set but no reasoning parser is configured: start the server with "
    "--reasoning-parser (qwen3 or deepseek_r1), or give LLM(reasoning_parser=...) offline, to use "
    "thinking_token_budget"
)
"""The refusal of a budget where the engine has no :class:`ReasoningTokens` (vLLM refuses it too)."""


THINKING_BUDGET_BREAKS_GRAMMAR = (
    "thinking_token_budget cannot be combined with a grammar that applies from the first token when "
    "the prompt opens the reasoning (a <think> it does not close): the forced reasoning end would break "
    "the grammar; let the grammar wait for </think> (chat with include_reasoning true) or leave the budget out"
)
"""The refusal of a budget whose forced end a grammar would reject (vLLM forces it over the
grammar, which then fails mid-output)."""


class ReasoningTokens(msgspec.Struct, frozen=True, array_like=True):
    """The token ids that open and close the reasoning section.

    Attributes:
        start: the ids of the reasoning-start string (Qwen3's ``<think>``: one id).
        end: the ids of the reasoning-end string (Qwen3's ``</think>``: one id); these are
            the tokens a spent budget forces.
    """

    start: tuple[int, ...]
    end: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.start or not self.end:
            raise ValueError("ReasoningTokens: the start and end token sequences must not be empty")


def reasoning_tokens_of(tokenizer: object, start: str, end: str) -> ReasoningTokens:
    """The ids of the reasoning delimiters ``start`` / ``end`` in ``tokenizer``'s vocabulary
    (``encode`` without special tokens, as vLLM's ``ReasoningConfig``).

    Raises:
        ValueError: a delimiter tokenizes to no token.
    """
    ids = [tuple(tokenizer.encode(s, add_special_tokens=False)) for s in (start, end)]  # type: ignore[attr-defined]
    if not ids[0] or not ids[1]:
        raise ValueError(f"the reasoning delimiters {start!r} / {end!r} tokenize to no token")
    return ReasoningTokens(ids[0], ids[1])


def opens_reasoning(tokens: ReasoningTokens, prompt_token_ids: Sequence[int]) -> bool:
    """The prompt's last reasoning start is not closed: the output starts inside the reasoning."""
    last_start = _rfind(prompt_token_ids, tokens.start)
    return last_start >= 0 and last_start > _rfind(prompt_token_ids, tokens.end)


def _ends_with(tokens: Sequence[int], end: int, seq: tuple[int, ...]) -> bool:
    """``tokens[:end]`` ends with ``seq``."""
    n = len(seq)
    return end >= n and tuple(tokens[end - n : end]) == seq


def _rfind(tokens: Sequence[int], seq: tuple[int, ...]) -> int:
    """Index of the last occurrence of ``seq`` in ``tokens``, or -1."""
    n = len(seq)
    for i in range(len(tokens) - n, -1, -1):
        if tokens[i] == seq[0] and tuple(tokens[i : i + n]) == seq:
            return i
    return -1


class ThinkingBudget:
    """One request's reasoning state, advanced over its output tokens.

    Args:
        tokens: the reasoning delimiters.
        budget: ``thinking_token_budget`` (>= 0).
        prompt_token_ids: the request's prompt (an open ``<think>`` there starts inside the
            reasoning).
    """

    __slots__ = ("_tokens", "budget", "_initial", "_seen", "_in_think", "_count", "_forced")

    def __init__(self, tokens: ReasoningTokens, budget: int, prompt_token_ids: Sequence[int]) -> None:
        self._tokens = tokens
        self.budget = budget
        in_think = opens_reasoning(tokens, prompt_token_ids)
        count = (
            len(prompt_token_ids) - _rfind(prompt_token_ids, tokens.start) - len(tokens.start)
            if in_think
            else 0
        )
        self._initial = (in_think, count)
        self._reset()

    def _reset(self) -> None:
        self._seen = 0
        self._in_think, self._count = self._initial
        self._forced = -1  # -1: not forcing; else how many end tokens were forced so far
        if self._in_think and self._count >= self.budget:
            self._forced = 0

    def forced_token(self, output_token_ids: Sequence[int]) -> int | None:
        """The token the next sampled position must be (an end-sequence token), or None.

        ``output_token_ids`` are all the request's output tokens so far; each call feeds
        only those not seen before (outputs that shrank are fed again from the start).
        """
        if len(output_token_ids) < self._seen:
            self._reset()
        for i in range(self._seen, len(output_token_ids)):
            self._feed(output_token_ids, i)
        self._seen = len(output_token_ids)
        if self._forced < 0:
            return None
        return self._tokens.end[self._forced]

    @property
    def in_reasoning(self) -> bool:
        """Inside the reasoning after the tokens fed so far (forcing its end included)."""
        return self._in_think

    def _feed(self, outputs: Sequence[int], i: int) -> None:
        end = self._tokens.end
        if self._forced >= 0:  # outputs[i] is the forced end token
            self._forced += 1
            if self._forced == len(end):
                self._forced = -1
                self._in_think, self._count = False, 0
            return
        if self._in_think:
            if _ends_with(outputs, i + 1, end):  # the model ended its reasoning itself
                self._in_think, self._count = False, 0
                return
            self._count += 1
        elif _ends_with(outputs, i + 1, self._tokens.start):
            self._in_think, self._count = True, 0
        if self._in_think and self._count >= self.budget:
            self._forced = 0
