"""An exception that leaves ``LLM.generate()`` (an engine step that fails, a KeyboardInterrupt)
aborts the call's requests: the engine holds none of them and the next call gives the same
tokens as a fresh one, with synchronous and asynchronous scheduling."""

from __future__ import annotations

from typing import Any

import pytest

from surge import LLM, SamplingParams

PROMPTS = ["Once upon a time", "Lily and Tim", "The dog"]
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True, n=2)


class _Boom(Exception):
    """The failure the tests inject."""


class _FailingHandle:
    """A step handle whose :meth:`result` raises (waiting for a step in flight fails)."""

    def __init__(self, handle: Any, exc: BaseException) -> None:
        self._handle = handle
        self._exc = exc

    def result(self) -> Any:
        raise self._exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def _tokens(llm: LLM) -> list[list[list[int]]]:
    return [
        [c.token_ids for c in o.outputs]
        for o in llm.generate(PROMPTS, PARAMS) + llm.generate(PROMPTS, SEEDED)
    ]


@pytest.fixture(scope="module")
def expected() -> list[list[list[int]]]:
    return _tokens(LLM(device="cpu", async_scheduling=False))


def _fail_once(monkeypatch: pytest.MonkeyPatch, llm: LLM, exc: BaseException, where: str) -> list[Any]:
    """Make the engine's 4th step fail with ``exc``: the runner's launch raises ("launch"), or
    (asynchronous scheduling) the wait for a launched step does ("wait").

    Returns:
        The step handles the runner launched (asynchronous scheduling), but the failing one.
    """
    runner = llm.engine.runner
    name = "execute_async" if llm.engine.async_scheduling else "execute"
    real = getattr(runner, name)
    launched: list[Any] = []
    calls = 0

    def failing(scheduler_output: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 4 and where == "launch":
            raise exc
        out = real(scheduler_output)
        if calls == 4:
            return _FailingHandle(out, exc)
        if llm.engine.async_scheduling:
            launched.append(out)
        return out

    monkeypatch.setattr(runner, name, failing)
    return launched


@pytest.mark.parametrize(
    ("async_scheduling", "where"),
    [(False, "launch"), (True, "launch"), (True, "wait")],
    ids=["sync", "async-launch", "async-wait"],
)
@pytest.mark.parametrize("exc", [_Boom("step failed"), KeyboardInterrupt()], ids=["error", "interrupt"])
@pytest.mark.parametrize("params", [PARAMS, SEEDED], ids=["greedy", "seeded"])
def test_generate_that_raises_leaves_the_llm_usable(
    monkeypatch: pytest.MonkeyPatch,
    expected: list[list[list[int]]],
    async_scheduling: bool,
    where: str,
    exc: BaseException,
    params: SamplingParams,
) -> None:
    """Greedy steps stay in flight across the next launch; seeded ones (token history) are
    applied before it: a failed wait leaves a launched step behind only in the first case."""
    llm = LLM(device="cpu", async_scheduling=async_scheduling)
    launched = _fail_once(monkeypatch, llm, exc, where)
    with pytest.raises(type(exc)):
        llm.generate(PROMPTS, params)
    engine = llm.engine
    assert not engine.has_unfinished_requests()
    assert all(h._done for h in launched)  # no launched step is left unresolved
    stats = engine.get_stats()
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_free_blocks == stats.num_total_blocks
    monkeypatch.undo()
    assert _tokens(llm) == expected
    assert not engine.has_unfinished_requests()


def test_a_request_the_engine_refuses_aborts_the_ones_added_before() -> None:
    llm = LLM(device="cpu", async_scheduling=False)
    too_long = [1] * (llm.engine.max_model_len + 1)
    with pytest.raises(ValueError):
        llm.generate(["Once upon a time", too_long], PARAMS)
    assert not llm.engine.has_unfinished_requests()


def test_unset_max_tokens_fills_the_context() -> None:
    """``max_tokens=None`` is all the room the context leaves after the prompt (vLLM's rule);
    a prompt that leaves none, or less than ``min_tokens``, is refused with the lengths."""
    llm = LLM(device="cpu", async_scheduling=False)
    room = llm.engine.max_model_len - 3
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    out = llm.generate([[1, 300, 17]], params)[0].outputs[0]
    assert (len(out.token_ids), out.finish_reason) == (room, "length")
    with pytest.raises(ValueError, match="leaves 0 for the completion"):
        llm.generate([[1] * llm.engine.max_model_len], params)
    with pytest.raises(ValueError, match=f"leaves {room} for the completion"):
        llm.generate([[1, 300, 17]], SamplingParams(max_tokens=None, min_tokens=room + 1))
    assert not llm.engine.has_unfinished_requests()


def test_unset_max_tokens_stays_within_the_kv_pool(caplog: pytest.LogCaptureFixture) -> None:
    """A KV pool smaller than the context bounds the room as the server's unset max_tokens;
    start-up warns that longer requests will be refused."""
    with caplog.at_level("WARNING", logger="surge.engine"):
        llm = LLM(device="cpu", async_scheduling=False, num_kv_blocks=8)
    pool = 8 * llm.engine.block_size
    assert pool < llm.engine.max_model_len
    holds = f"the KV cache holds {pool} tokens, fewer than max_model_len {llm.engine.max_model_len}"
    assert holds in caplog.text
    assert "(raise --num-kv-blocks, or lower --max-model-len)" in caplog.text  # no GPU flag on CPU
    # true of both paths: the server refuses such a request, the offline LLM shortens its output
    assert (
        "is refused by the server, and cut there by the offline LLM when its prompt fits (finish_reason"
        in caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="surge.engine"):
        roomy = LLM(device="cpu", async_scheduling=False)
    assert roomy.engine.num_kv_blocks * roomy.engine.block_size >= roomy.engine.max_model_len
    assert "fewer than max_model_len" not in caplog.text
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    out = llm.generate([[1, 300, 17]], params)[0].outputs[0]
    assert (len(out.token_ids), out.finish_reason) == (pool - 3, "length")


def test_vllm_prompt_dicts_and_clear_errors_for_wrong_inputs(tmp_path: Any) -> None:
    """vLLM's ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}`` dicts are prompts (a single
    dict was read as the list of its keys); a wrong sampling_params type, a lone surrogate or
    another dict is a clear error before anything is added."""
    llm = LLM(device="cpu", async_scheduling=False)
    text = llm.generate("Once upon a time", PARAMS)[0]
    ids = text.prompt_token_ids
    for prompt in (
        {"prompt": "Once upon a time"},
        [{"prompt": "Once upon a time"}],
        {"prompt_token_ids": ids},
    ):
        out = llm.generate(prompt, PARAMS)  # type: ignore[arg-type]
        assert len(out) == 1 and out[0].prompt_token_ids == ids
        assert out[0].outputs[0].token_ids == text.outputs[0].token_ids
    with pytest.raises(ValueError, match="a dict prompt must be"):
        llm.generate({"text": "x"}, PARAMS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lone surrogate"):
        llm.generate("a\udcff", PARAMS)
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams"):
        llm.generate("Once", {"max_tokens": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got a NoneType"):
        llm.generate(["a", "b"], [PARAMS, None])  # type: ignore[list-item]
    assert not llm.engine.has_unfinished_requests()


def test_vllm_api_shapes() -> None:
    """``cumulative_logprob`` (the sum of the reported logprobs; None without them),
    ``get_tokenizer``, ``use_tqdm``, ``chat``'s template options and its templated ``prompt``,
    and None for vLLM's optional lists; ``n`` is bounded."""
    llm = LLM(device="cpu", async_scheduling=False)
    assert llm.get_tokenizer() is llm.tokenizer
    with_lp = llm.generate("Once", SamplingParams(temperature=0, max_tokens=4, logprobs=0), use_tqdm=True)[0]
    c = with_lp.outputs[0]
    assert c.logprobs is not None and c.cumulative_logprob is not None
    assert c.cumulative_logprob == pytest.approx(
        sum(p[t].logprob for t, p in zip(c.token_ids, c.logprobs, strict=True))
    )
    assert c.cumulative_logprob < 0
    assert llm.generate("Once", PARAMS)[0].outputs[0].cumulative_logprob is None
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    cont = llm.chat(msgs, PARAMS, add_generation_prompt=False, continue_final_message=True)[0]
    assert cont.prompt is not None and cont.prompt.rstrip().endswith("Hello")
    custom = llm.chat(
        msgs[:1], PARAMS, chat_template="{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    )[0]
    assert custom.prompt is not None and custom.prompt.endswith("Hi|")
    # the prompt is the rendered template, as vLLM's, not the decoded ids (which add a space here)
    spaced = "{{ bos_token }}{% for m in messages %}<|x|> {{ m['content'] }}\n\n{% endfor %}"
    assert llm.chat(msgs[:1], PARAMS, chat_template=spaced)[0].prompt == "<s><|x|> Hi\n\n"
    p = SamplingParams(stop=None, stop_token_ids=None, bad_words=None)
    assert p.stop == () and p.stop_token_ids == () and p.bad_words == ()
    with pytest.raises(ValueError, match="n must be at most 65536"):
        SamplingParams(n=10**9)


def test_a_folder_without_a_tokenizer_takes_token_ids_only(tmp_path: Any) -> None:
    """transformers builds an empty tokenizer for a folder without tokenizer files, and every text
    prompt encoded to nothing ("the prompt is empty"): text and chat are refused naming the
    cause, token ids still work."""
    from tests.models.helpers import make_hf_model

    model = make_hf_model("qwen3", tmp_path / "qwen3")
    llm = LLM(str(model), device="cpu", dtype="float32", async_scheduling=False)
    with pytest.raises(ValueError, match="has no tokenizer files"):
        llm.generate("Once upon a time", PARAMS)
    with pytest.raises(ValueError, match="has no tokenizer files"):
        llm.chat([{"role": "user", "content": "Hi"}], PARAMS)
    out = llm.generate([[1, 5, 7]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3
    # no tokenizer, no primary EOS: the model's EOS reports its id (vLLM without a tokenizer); the
    # empty tokenizer's own eos_token_id (an id it made up) is no EOS, listed it is a stop id
    (eos,) = llm.engine.config.model.eos_token_ids
    made_up = llm.tokenizer.eos_token_id
    assert made_up is not None and made_up != eos
    for bias, stops in ((eos, ()), (made_up, (made_up,))):
        params = SamplingParams(temperature=0, max_tokens=3, logit_bias={bias: 100.0}, stop_token_ids=stops)
        done = llm.generate([[1, 5, 7]], params)[0].outputs[0]
        assert (done.finish_reason, done.stop_reason, done.token_ids) == ("stop", bias, [bias])
