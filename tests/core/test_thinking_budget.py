"""The per-request state of vLLM's ``thinking_token_budget`` (surge/core/thinking_budget.py):
which token each next position must be, fed the outputs one token at a time as the scheduler
does, with one- and several-token delimiters."""

from __future__ import annotations

import pytest

from surge.core.thinking_budget import ReasoningTokens, ThinkingBudget

START, END = 900, 901  # one-token <think> / </think>, as Qwen3's
ONE = ReasoningTokens((START,), (END,))
MULTI = ReasoningTokens((7, 8), (5, 6, 4))  # a tokenizer without special tokens for them


def run(tokens: ReasoningTokens, budget: int, prompt: list[int], model: list[int]) -> list[int]:
    """The output when the model would write ``model`` (its next token at each position) and
    the budget overrides it where it forces a token."""
    state = ThinkingBudget(tokens, budget, prompt)
    out: list[int] = []
    for want in model:
        forced = state.forced_token(out)
        out.append(want if forced is None else forced)
    return out


def test_prompt_that_opens_think_counts_from_the_first_output_token() -> None:
    assert run(ONE, 3, [1, 2, START], [10, 11, 12, 13, 14, 15]) == [10, 11, 12, END, 14, 15]


def test_prompt_tokens_after_think_count_as_vllm_counts_them() -> None:
    # the "\n" of a prompt ending "<think>\n" (DeepSeek-R1, Qwen3 thinking templates) is one
    assert run(ONE, 3, [1, START, 198], [10, 11, 12, 13]) == [10, 11, END, 13]


def test_budget_zero_ends_the_reasoning_at_once() -> None:
    assert run(ONE, 0, [1, START], [10, 11, 12]) == [END, 11, 12]
    # spent inside the prompt already
    assert run(ONE, 1, [START, 198, 199], [10, 11]) == [END, 11]


def test_a_budget_larger_than_the_reasoning_forces_nothing() -> None:
    model = [10, 11, END, 12, 13, 14, 15, 16]
    assert run(ONE, 3, [1, START], model) == model  # the model ended it after 2 tokens


def test_no_reasoning_no_forcing() -> None:
    model = [10, 11, 12, 13]
    assert run(ONE, 0, [1, 2], model) == model  # the prompt opens nothing
    assert run(ONE, 0, [START, 5, END], model) == model  # the prompt's reasoning is closed


def test_reasoning_the_model_opens_gets_its_budget_and_a_later_one_another() -> None:
    model = [3, START, 10, 11, 12, 13, START, 20, 21, 22]
    assert run(ONE, 2, [1], model) == [3, START, 10, 11, END, 13, START, 20, 21, END]


def test_several_token_delimiters_are_forced_one_token_per_step() -> None:
    assert run(MULTI, 2, [1, 7, 8], [10, 11, 12, 13, 14, 15, 16]) == [10, 11, 5, 6, 4, 15, 16]
    # opened by the model across two tokens; budget 0
    assert run(MULTI, 0, [1], [7, 8, 12, 13, 14, 15]) == [7, 8, 5, 6, 4, 15]
    # the model closes it itself (its partial end tokens count as reasoning until complete)
    model = [10, 5, 6, 4, 11, 12]
    assert run(MULTI, 5, [7, 8], model) == model


def test_outputs_fed_again_from_the_start_give_the_same_answer() -> None:
    state = ThinkingBudget(ONE, 2, [START])
    assert state.forced_token([10, 11]) == END
    assert state.forced_token([10]) is None  # fewer outputs than seen: fed again
    assert state.forced_token([10, 11]) == END
    assert state.forced_token([10, 11, END]) is None and not state.in_reasoning


def test_a_pending_token_is_fed_ahead_and_checked_when_it_lands() -> None:
    """Asynchronous scheduling: the previous token is still in flight when the next one is
    decided; it is fed ahead, and outputs that disagree with it (preemption dropped it, another
    token took its place) are fed again from the start."""
    state = ThinkingBudget(ONE, 2, [START])
    assert state.forced_token([], pending=10) is None
    assert state.forced_token([10], pending=11) == END  # 10 landed; 11 is the second token
    assert state.forced_token([10, 11], pending=END) is None  # the forced end, in flight
    assert not state.in_reasoning
    # the token in flight was dropped and another sampled in its place
    state = ThinkingBudget(ONE, 2, [START])
    assert state.forced_token([10], pending=END) is None  # had the model ended it...
    assert state.forced_token([10, 11]) == END  # ...no: 11 landed there, the count is 2


def test_forced_tokens_read_the_step_in_flight_only_when_asked() -> None:
    from surge.core.thinking_budget import ForcedTokens
    from surge.request import Request
    from surge.sampling_params import SamplingParams

    done, flying = (Request(rid, [START], SamplingParams(thinking_token_budget=1)) for rid in ("a", "b"))
    for r in (done, flying):
        r.thinking = ThinkingBudget(ONE, 1, r.prompt_token_ids)
    done.output_token_ids = [10]
    flying.num_pending_outputs = 1
    calls: list[int] = []

    def pending_ids() -> dict[str, int]:
        calls.append(1)
        return {"b": 12}

    forced = ForcedTokens([done, flying])
    assert forced.needs_pending
    with pytest.raises(RuntimeError, match="in flight"):
        forced.resolve()
    forced.pending_ids = pending_ids
    assert not calls  # nothing waits before the sampler asks
    assert forced.resolve() == {"a": END, "b": END} and forced.resolve() == {"a": END, "b": END}
    assert calls == [1]
    assert not ForcedTokens([done]).needs_pending
    assert ForcedTokens.fixed({"x": 5}).resolve() == {"x": 5}


def test_empty_delimiters_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        ReasoningTokens((), (END,))
