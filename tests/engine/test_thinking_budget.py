"""vLLM's ``thinking_token_budget`` through the offline API and the engine, on a tiny random
Qwen3 with the real Qwen3 tokenizer (``<think>`` 151667, ``</think>`` 151668, one token each):
a prompt that opens ``<think>`` puts the output inside the reasoning (random weights never write
``</think>`` themselves), and a spent budget forces ``</think>`` as the next token, with
asynchronous scheduling or without, after preemption, and for ``n`` choices, while requests
without a budget in the same batch sample what they sample alone."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from surge import LLM, SamplingParams
from surge.core.outputs import SchedulerOutput
from surge.parallel.step_codec import StepDecoder, StepEncoder
from surge.sampling_params import StructuredOutputsParams
from tests.structured.conftest import make_qwen3_vocab_model

THINK, END = 151667, 151668


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_8b_dir: Path) -> Path:
    return make_qwen3_vocab_model(tmp_path_factory.mktemp("qwen3-thinking"))


def _llm(model_dir: Path, **kwargs: object) -> LLM:
    return LLM(str(model_dir), load_format="dummy", device="cpu", max_model_len=256, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    return _llm(model_dir, reasoning_parser="qwen3")


@pytest.fixture(scope="module")
def prompt(llm: LLM) -> dict[str, list[int]]:
    ids = llm.get_tokenizer().encode("Question: why?\n<think>")
    assert ids[-1] == THINK
    return {"prompt_token_ids": ids}


def _ids(llm: LLM, prompts: list[dict[str, list[int]]], params: list[SamplingParams]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]


def greedy(budget: int | None, max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, thinking_token_budget=budget
    )


def test_budget_n_gives_n_reasoning_tokens_then_the_end(llm: LLM, prompt: dict[str, list[int]]) -> None:
    free = _ids(llm, [prompt], [greedy(None)])[0]
    assert END not in free  # the random model never ends its reasoning itself
    for n in (1, 3, 7):
        out = _ids(llm, [prompt], [greedy(n)])[0]
        assert out[:n] == free[:n] and out[n] == END, (n, out)


def test_budget_zero_ends_the_reasoning_at_once(llm: LLM, prompt: dict[str, list[int]]) -> None:
    assert _ids(llm, [prompt], [greedy(0)])[0][0] == END


def test_budget_past_the_output_forces_nothing(llm: LLM, prompt: dict[str, list[int]]) -> None:
    assert _ids(llm, [prompt], [greedy(12)]) == _ids(llm, [prompt], [greedy(None)])
    assert _ids(llm, [prompt], [greedy(-1)]) == _ids(llm, [prompt], [greedy(None)])


def test_a_prompt_without_open_reasoning_is_not_counted(llm: LLM) -> None:
    plain = {"prompt_token_ids": llm.get_tokenizer().encode("Question: why?\n<think>x</think>")}
    assert _ids(llm, [plain], [greedy(0)]) == _ids(llm, [plain], [greedy(None)])


def test_requests_without_budget_in_the_batch_are_unaffected(llm: LLM, prompt: dict[str, list[int]]) -> None:
    other = {"prompt_token_ids": llm.get_tokenizer().encode("Tell me a story")}
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    alone = _ids(llm, [other, prompt], [sampled, sampled])
    mixed = _ids(llm, [other, prompt, prompt], [sampled, sampled, greedy(2)])
    assert mixed[:2] == alone
    assert mixed[2][2] == END


def test_async_scheduling_gives_the_same_tokens(
    model_dir: Path, llm: LLM, prompt: dict[str, list[int]]
) -> None:
    other = {"prompt_token_ids": llm.get_tokenizer().encode("Tell me a story")}
    params = [
        greedy(4),
        greedy(None),
        SamplingParams(max_tokens=12, temperature=1.0, seed=9, thinking_token_budget=2),
    ]
    prompts = [prompt, other, prompt]
    sync = _ids(llm, prompts, params)
    assert sync[0][4] == END and sync[2][2] == END
    # the seeded request makes every step of its batch exact (applied before the next); the greedy
    # pair alone runs on the fast asynchronous path, where the budget reads the step in flight
    fast = _ids(llm, prompts[:2], params[:2])
    with _llm(model_dir, reasoning_parser="qwen3", async_scheduling=True) as async_llm:
        assert async_llm.engine.async_scheduling
        assert _ids(async_llm, prompts, params) == sync
        assert _ids(async_llm, prompts[:2], params[:2]) == fast


def test_async_steps_with_a_budget_are_not_applied_first(
    model_dir: Path, prompt: dict[str, list[int]]
) -> None:
    """With asynchronous scheduling a request with a budget does not make its step exact (applied
    before the next is scheduled): the sampler reads its previous token from the step in flight,
    as a grammar mask does, so the host keeps scheduling ahead of the device."""
    from surge.engine.llm_engine import LLMEngine

    with _llm(model_dir, reasoning_parser="qwen3", async_scheduling=True) as async_llm:
        engine: LLMEngine = async_llm.engine
        engine.add_request("a", prompt["prompt_token_ids"], greedy(3, 8))
        tokens: list[int] = []
        exact: list[bool] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens += out.new_token_ids
            if engine._in_flight is not None:
                exact.append(engine._in_flight.exact)
        assert tokens[3] == END and len(tokens) == 8
        assert exact and not any(exact)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_preempted_requests_keep_their_budget(
    model_dir: Path, llm: LLM, prompt: dict[str, list[int]], async_scheduling: bool
) -> None:
    params = [greedy(b, max_tokens=40) for b in (5, 9, 20, 30)]
    expected = _ids(llm, [prompt] * 4, params)
    # 4 requests of up to 3 blocks each in 7 blocks: some are preempted and recomputed (with
    # asynchronous scheduling, dropping a token in flight that a budget may have read ahead)
    with _llm(
        model_dir, reasoning_parser="qwen3", num_kv_blocks=7, async_scheduling=async_scheduling
    ) as small:
        assert _ids(small, [prompt] * 4, params) == expected
        assert small.engine.scheduler.num_preemptions_total > 0
    for out, b in zip(expected, (5, 9, 20, 30), strict=True):
        assert out[b] == END


def test_every_choice_has_its_budget(llm: LLM, prompt: dict[str, list[int]]) -> None:
    params = SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=1, thinking_token_budget=3)
    (out,) = llm.generate([prompt], params)
    assert [c.token_ids[3] for c in out.outputs] == [END] * 3


def test_a_budget_needs_a_reasoning_parser(model_dir: Path, prompt: dict[str, list[int]]) -> None:
    with _llm(model_dir) as plain:
        with pytest.raises(ValueError, match="thinking_token_budget is set but no reasoning parser"):
            plain.generate([prompt], greedy(3))
        assert _ids(plain, [prompt], [greedy(-1)])[0]  # unlimited asks for nothing
    for bad in ("r1", ["qwen3"]):  # refused before the model loads
        with pytest.raises(ValueError, match=r"^reasoning_parser must be one of deepseek_r1, qwen3, got "):
            LLM("/nonexistent", reasoning_parser=bad)  # type: ignore[arg-type]


def test_a_reasoning_parser_needs_the_think_tokens() -> None:
    """The bundled model's tokenizer has no ``<think>`` / ``</think>`` token: ``LLM(...,
    reasoning_parser=...)`` took it, then read no reasoning end and counted no budget; it is
    refused now, naming the argument and the missing tokens, as vLLM's reasoning parsers refuse
    to start."""
    for name in ("qwen3", "deepseek_r1"):
        with pytest.raises(
            ValueError,
            match=rf"^reasoning_parser='{name}': the model's tokenizer has no <think> or </think> token",
        ):
            LLM(device="cpu", reasoning_parser=name)


def test_a_grammar_from_the_first_token_inside_the_reasoning_is_refused(
    llm: LLM, prompt: dict[str, list[int]]
) -> None:
    """The forced </think> would break a grammar that constrains the output from its first token
    (it failed mid-output as "no token can continue the grammar"): the engine refuses it up front;
    the offline LLM gates a grammar on </think> (as vLLM's, see
    tests/structured/test_offline_reasoning_gate.py), which starts right after the forced end; a
    prompt that closed the reasoning is constrained from its first token."""
    schema = '{"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}'
    params = SamplingParams(max_tokens=40, temperature=0.0, thinking_token_budget=2)
    free = StructuredOutputsParams(json=schema)
    with pytest.raises(ValueError, match="thinking_token_budget cannot be combined with a grammar"):
        llm.engine.add_request(
            "ungated", prompt["prompt_token_ids"], msgspec.structs.replace(params, structured_outputs=free)
        )
    gated = StructuredOutputsParams(json=schema, reasoning_end_token_id=END)
    for grammar in (free, gated):
        (out,) = llm.generate([prompt], msgspec.structs.replace(params, structured_outputs=grammar))
        ids = list(out.outputs[0].token_ids)
        assert ids[2] == END and out.outputs[0].finish_reason == "stop"
        answer = json.loads(llm.get_tokenizer().decode(ids[3:], skip_special_tokens=True))
        assert answer["zone"] in ("UTC", "CET")
    closed = {"prompt_token_ids": llm.get_tokenizer().encode("Question: why?\n<think>\n</think>\n")}
    (out,) = llm.generate([closed], msgspec.structs.replace(params, structured_outputs=free))
    assert json.loads(out.outputs[0].text)


def test_the_forced_token_has_its_own_logprob(llm: LLM, prompt: dict[str, list[int]]) -> None:
    (out,) = llm.generate(
        [prompt], SamplingParams(max_tokens=4, temperature=0.0, thinking_token_budget=1, logprobs=2)
    )
    assert out.outputs[0].token_ids[1] == END
    assert END in out.outputs[0].logprobs[1]  # the sampled token's entry is the forced one's


def test_tensor_parallel_ranks_force_the_same_end(model_dir: Path) -> None:
    """TP=2 on CPU (gloo) with asynchronous scheduling: the engine's forced tokens reach both
    ranks in the step message (dummy weights differ from TP=1's, so only the positions are checked)."""
    with _llm(model_dir, reasoning_parser="qwen3", tensor_parallel_size=2, async_scheduling=True) as tp:
        p = {"prompt_token_ids": tp.get_tokenizer().encode("Question: why?\n<think>")}
        outs = _ids(tp, [p] * 3, [greedy(0, 8), greedy(3, 8), greedy(None, 8)])
    assert outs[0][0] == END and outs[1][3] == END and END not in outs[2]
    assert outs[1][:3] == outs[2][:3]


def test_forced_tokens_reach_every_rank() -> None:
    """The tensor-parallel step message carries the engine's forced tokens to the workers."""
    from surge.core.outputs import ScheduledRequest
    from surge.core.thinking_budget import ForcedTokens
    from surge.request import Request

    req = Request("a", [1, 2], SamplingParams(max_tokens=4))
    so = SchedulerOutput([ScheduledRequest(req, 2, True)], 2, forced_tokens=ForcedTokens.fixed({"a": END}))
    msg = StepEncoder().encode(so)
    assert msg.forced_tokens == {"a": END}
    assert StepDecoder(frozenset()).decode(msg).forced_tokens.resolve() == {"a": END}
    for none in (None, ForcedTokens.fixed({})):  # nothing forced: nothing sent
        so.forced_tokens = none
        assert StepDecoder(frozenset()).decode(StepEncoder().encode(so)).forced_tokens is None
