"""vLLM's ``thinking_token_budget``: a cap on the tokens generated inside the reasoning
section, after which the reasoning-end token sequence (``</think>``) is forced.

The reasoning delimiters are the token ids of the server's ``--reasoning-parser`` (or the
offline ``LLM(reasoning_parser=...)``) strings, tokenized with the model's tokenizer
(:class:`ReasoningTokens`, carried by ``EngineConfig.reasoning_tokens``). Each request with a
budget gets a :class:`ThinkingBudget`; a step that samples such requests carries a
:class:`ForcedTokens` (``SchedulerOutput.forced_tokens``), which the sampler asks, after the
forward is launched, which token (if any) each row must be, and then overwrites those rows'
sampled ids. The decision needs the previous token: with asynchronous scheduling it is read
from the step in flight at that moment, as a grammar mask reads it (with tensor parallelism,
whose step message is built at launch, such a step is applied before the next one instead:
``SamplingParams.needs_previous_token``). No torch here.

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

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from surge.request import Request

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


def reasoning_ended(tokens: ReasoningTokens, prompt_token_ids: Sequence[int]) -> bool:
    """The prompt closes its reasoning: its last reasoning end comes after its last reasoning
    start (Qwen3's chat prompt with ``enable_thinking`` false ends in an empty ``<think>`` ...
    ``</think>``).
    A prompt without a reasoning end has not ended it, as vLLM's ``is_reasoning_end`` reads the
    prompt (``vllm/parser/engine/parser_engine.py``) to decide whether a grammar waits."""
    last_end = _rfind(prompt_token_ids, tokens.end)
    return last_end >= 0 and last_end > _rfind(prompt_token_ids, tokens.start)


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

    __slots__ = (
        "_tokens",
        "budget",
        "_initial",
        "_window",
        "_seen",
        "_ahead",
        "_recent",
        "_in_think",
        "_count",
        "_forced",
    )

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
        self._window = max(len(tokens.start), len(tokens.end))
        self._reset()

    def _reset(self) -> None:
        self._seen = 0  # output tokens fed (the one ahead included)
        self._ahead: int | None = None  # a pending token fed before it is in the outputs
        self._recent: tuple[int, ...] = ()  # the last tokens fed, to match the delimiters
        self._in_think, self._count = self._initial
        self._forced = -1  # -1: not forcing; else how many end tokens were forced so far
        if self._in_think and self._count >= self.budget:
            self._forced = 0

    def forced_token(self, output_token_ids: Sequence[int], pending: int | None = None) -> int | None:
        """The token the next sampled position must be (an end-sequence token), or None.

        ``output_token_ids`` are all the request's output tokens so far; ``pending`` the token
        after them that a step in flight sampled (asynchronous scheduling), if any. Each call
        feeds only the tokens not fed before; a pending token fed earlier is checked once it is
        in the outputs, and outputs that do not continue what was fed (fewer tokens, or another
        token where the pending one was: preemption dropped it) are fed again from the start.
        """
        n = len(output_token_ids)
        if n < self._seen or (self._ahead is not None and output_token_ids[self._seen - 1] != self._ahead):
            self._reset()
        self._ahead = None
        for i in range(self._seen, n):
            self._feed(output_token_ids[i])
        self._seen = n
        if pending is not None:
            self._feed(pending)
            self._seen += 1
            self._ahead = pending
        if self._forced < 0:
            return None
        return self._tokens.end[self._forced]

    @property
    def in_reasoning(self) -> bool:
        """Inside the reasoning after the tokens fed so far (forcing its end included)."""
        return self._in_think

    def _feed(self, token: int) -> None:
        end = self._tokens.end
        self._recent = (*self._recent[1 - self._window :], token) if self._window > 1 else (token,)
        if self._forced >= 0:  # the forced end token
            self._forced += 1
            if self._forced == len(end):
                self._forced = -1
                self._in_think, self._count = False, 0
            return
        if self._in_think:
            if self._recent[-len(end) :] == end:  # the model ended its reasoning itself
                self._in_think, self._count = False, 0
                return
            self._count += 1
        elif self._recent[-len(self._tokens.start) :] == self._tokens.start:
            self._in_think, self._count = True, 0
        if self._in_think and self._count >= self.budget:
            self._forced = 0


class ForcedTokens:
    """The reasoning-end tokens of one step's rows (``SchedulerOutput.forced_tokens``): built by
    the scheduler from the sampled requests that have a budget, decided when the sampler asks
    (:meth:`resolve`), after the step's forward is launched. A request whose previous token is
    still in flight (asynchronous scheduling) takes it from ``pending_ids`` (the step in
    flight's ``sampled_token_ids``, set by the engine), which waits for that step's ids then,
    as a grammar mask does; the others are decided from their outputs.

    Args:
        requests: the step's sampled requests whose ``thinking`` is set.
    """

    __slots__ = ("_requests", "_has_pending", "pending_ids", "_resolved")

    def __init__(self, requests: Sequence[Request]) -> None:
        self._requests = list(requests)
        self._has_pending = [r.num_pending_outputs > 0 for r in self._requests]
        self.pending_ids: Callable[[], Mapping[str, int]] | None = None
        self._resolved: dict[str, int] | None = None

    @classmethod
    def fixed(cls, forced: Mapping[str, int]) -> ForcedTokens:
        """Already decided tokens (a tensor-parallel worker's, from the step message)."""
        out = cls(())
        out._resolved = dict(forced)
        return out

    @property
    def needs_pending(self) -> bool:
        """Some request's previous token is in flight (``pending_ids`` must be set)."""
        return any(self._has_pending)

    def resolve(self) -> dict[str, int]:
        """request_id -> the token its row must be (empty when none is forced); decided once.

        Raises:
            RuntimeError: a request has a token in flight and no ``pending_ids`` to read it.
        """
        if self._resolved is not None:
            return self._resolved
        pending_ids = None
        if self.needs_pending:
            if self.pending_ids is None:
                raise RuntimeError(
                    "a thinking budget's previous token is in flight, but no step to read it from"
                )
            pending_ids = self.pending_ids()
        forced: dict[str, int] = {}
        for request, has_pending in zip(self._requests, self._has_pending, strict=True):
            thinking = request.thinking
            assert thinking is not None
            pending = pending_ids[request.request_id] if has_pending and pending_ids is not None else None
            token = thinking.forced_token(request.output_token_ids, pending)
            if token is not None:
                forced[request.request_id] = token
        self._resolved = forced
        return forced
