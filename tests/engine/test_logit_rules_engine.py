"""logit_bias, allowed_token_ids and bad_words through the offline LLM: the same tokens with
asynchronous scheduling as without (a bad word of several tokens needs the token just sampled),
under preemption, with n > 1, and the errors of bad token ids."""

from __future__ import annotations

from typing import Any

import pytest

from surge import LLM, SamplingParams
from surge.engine.llm_engine import LLMEngine, build_engine_config, choice_params
from surge.tokenizer import bad_words_token_ids

PROMPT = "Once upon a time"


def _contains(ids: list[int], word: tuple[int, ...]) -> bool:
    return any(tuple(ids[i : i + len(word)]) == word for i in range(len(ids)))


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(device="cpu", dtype="float32", async_scheduling=False)


def test_bad_words_ban_the_last_token_only_after_its_prefix(llm: LLM) -> None:
    base = llm.generate(PROMPT, SamplingParams(max_tokens=30, temperature=0))[0].outputs[0]
    girl = bad_words_token_ids(llm.tokenizer, ["girl"])
    assert len(girl[0]) == 3 and _contains(base.token_ids, girl[0])  # "▁g" "ir" "l"
    bad = llm.generate(PROMPT, SamplingParams(max_tokens=30, temperature=0, bad_words=["girl"]))[0].outputs[0]
    start = next(i for i in range(len(base.token_ids)) if tuple(base.token_ids[i : i + 3]) == girl[0])
    # Up to the word's prefix nothing changes; then its last token is banned ("giraffe").
    assert bad.token_ids[: start + 2] == base.token_ids[: start + 2]
    assert bad.token_ids[start + 2] != girl[0][2]
    assert "girl" not in bad.text and not any(_contains(bad.token_ids, w) for w in girl)
    lily = bad_words_token_ids(llm.tokenizer, ["Lily"])
    assert len(lily[0]) == 1 and lily[0][0] in base.token_ids
    both = llm.generate(PROMPT, SamplingParams(max_tokens=30, temperature=0, bad_words=["Lily", "girl"]))
    assert lily[0][0] not in both[0].outputs[0].token_ids and "girl" not in both[0].outputs[0].text


@pytest.mark.parametrize(
    "engine_args",
    [{}, {"num_kv_blocks": 8, "enable_prefix_caching": False}],
    ids=["defaults", "preemption"],
)
def test_rules_async_matches_sync(engine_args: dict[str, object]) -> None:
    tok = LLM(device="cpu").tokenizer
    x = tok.encode("x", add_special_tokens=False)[-1]
    ab = tuple(tok.encode("ab", add_special_tokens=False))
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, bad_words=["girl", "park"], ignore_eos=True),
        SamplingParams(temperature=0.9, seed=3, max_tokens=20, bad_words=["Lily", "little girl"]),
        SamplingParams(temperature=0.0, max_tokens=12, logit_bias={x: 100.0}, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=4, max_tokens=16, allowed_token_ids=ab, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.8, max_tokens=20, n=2, seed=9, bad_words=["girl"], logit_bias={x: -5.0}),
    ]
    prompts = [PROMPT, "The dog", "Lily and Tim", PROMPT, "Once upon a time there was", PROMPT]
    results = []
    for mode in (False, True):
        llm = LLM(device="cpu", dtype="float32", async_scheduling=mode, **engine_args)  # type: ignore[arg-type]
        outs = llm.generate(prompts, params)
        results.append([[(c.token_ids, c.finish_reason) for c in o.outputs] for o in outs])
        if "num_kv_blocks" in engine_args:
            assert llm.engine.get_stats().num_preemptions_total > 0
        girl = bad_words_token_ids(llm.tokenizer, ["girl"])
        for o in (outs[0], outs[5]):
            for c in o.outputs:
                assert not any(_contains(c.token_ids, w) for w in girl), c.text
        assert outs[2].outputs[0].token_ids == [x] * 12
        assert set(outs[3].outputs[0].token_ids) <= set(ab)
        assert len(outs[5].outputs) == 2
    assert results[1] == results[0]


def test_multi_token_bad_word_alone_is_exact_under_async_scheduling() -> None:
    """Nothing else in the batch needs the token history: the bad word alone must make the
    async engine apply each step before it schedules the next (else the ban comes a step late)."""
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, bad_words=["girl"]),
        SamplingParams(temperature=0.0, max_tokens=30),
    ]
    results = []
    for mode in (False, True):
        llm = LLM(device="cpu", dtype="float32", async_scheduling=mode)
        outs = llm.generate([PROMPT, PROMPT], params)
        girl = bad_words_token_ids(llm.tokenizer, ["girl"])
        assert not any(_contains(outs[0].outputs[0].token_ids, w) for w in girl)
        assert _contains(outs[1].outputs[0].token_ids, girl[0])
        results.append([o.outputs[0].token_ids for o in outs])
    assert results[1] == results[0]


def test_allowed_token_ids_with_n(llm: LLM) -> None:
    allowed = tuple(llm.tokenizer.encode("ab", add_special_tokens=False))
    out = llm.generate(
        PROMPT,
        SamplingParams(
            n=4, max_tokens=8, seed=1, temperature=1.0, allowed_token_ids=allowed, ignore_eos=True
        ),
    )[0]
    assert len(out.outputs) == 4
    assert all(set(c.token_ids) <= set(allowed) and len(c.token_ids) == 8 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # the children still sample


def test_bad_token_ids_are_value_errors(llm: LLM) -> None:
    vocab = llm.engine.config.model.vocab_size
    for params, field in [
        (SamplingParams(allowed_token_ids=(vocab,)), "allowed_token_ids"),
        (SamplingParams(logit_bias={vocab + 5: 1.0}), "logit_bias"),
        (SamplingParams(bad_words_token_ids=((1, vocab),)), "bad_words"),
    ]:
        with pytest.raises(ValueError, match=field):
            llm.generate(PROMPT, params)
    for kwargs, field in [
        ({"logit_bias": {1: 100.5}}, "logit_bias"),
        ({"allowed_token_ids": ()}, "allowed_token_ids"),
        ({"bad_words": [" "]}, "bad_words"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)  # type: ignore[arg-type]
    engine = LLMEngine(build_engine_config(None, device="cpu"))
    with pytest.raises(ValueError, match="bad_words"):  # the engine has no tokenizer
        engine.add_request("r", [1, 2], SamplingParams(bad_words=["girl"]))


def test_add_choices_checks_the_request_once_and_fans_it_out() -> None:
    """LLMEngine.add_choices (the engine process's n > 1 path): a request refused is refused for
    every choice; the choices get seeds seed + i, the model's defaults and the parent's token
    lists (the same objects: nothing is copied or checked again per choice); an id in use is
    refused for that choice only."""
    engine = LLMEngine(build_engine_config(None, device="cpu"))
    vocab = engine.config.model.vocab_size
    words = ((1, 2, 3), (4,))
    refused = engine.add_choices(
        ["a-0", "a-1"], [1, 2], SamplingParams(n=2, bad_words_token_ids=((1, vocab),))
    )
    assert [rid for rid, _ in refused] == ["a-0", "a-1"] and "bad_words" in refused[0][1]
    assert not engine.has_unfinished_requests()
    parent = SamplingParams(n=3, seed=7, max_tokens=4, bad_words_token_ids=words)
    assert engine.add_choices(["b-0", "b-1", "b-2"], [1, 2], parent) == []
    reqs = [engine.scheduler.requests[f"b-{i}"] for i in range(3)]
    assert [r.sampling_params.seed for r in reqs] == [7, 8, 9]
    assert all(r.sampling_params.n == 1 for r in reqs)
    assert all(
        r.sampling_params.bad_words_token_ids is reqs[0].sampling_params.bad_words_token_ids for r in reqs
    )
    assert engine.add_choices(["c-0", "b-1"], [1, 2], SamplingParams(n=2, max_tokens=4)) == [
        ("b-1", "request id 'b-1' is already in use")
    ]
    with pytest.raises(ValueError, match="n=3"):
        engine.add_choices(["d-0"], [1], SamplingParams(n=3))
    while engine.has_unfinished_requests():
        engine.step()


def test_add_choices_computes_prompt_logprobs_once_when_asked() -> None:
    """prompt_logprobs_once: only the first choice asks for the prompt's logprobs (its outputs
    carry them); without it every choice computes them (a streamed answer needs each)."""
    engine = LLMEngine(build_engine_config(None, device="cpu"))
    params = SamplingParams(n=3, max_tokens=2, prompt_logprobs=1)
    engine.add_choices(["a-0", "a-1", "a-2"], [1, 2, 3], params, prompt_logprobs_once=True)
    engine.add_choices(["b-0", "b-1"], [1, 2, 3], SamplingParams(n=2, max_tokens=2, prompt_logprobs=1))
    assert [engine.scheduler.requests[f"a-{i}"].sampling_params.prompt_logprobs for i in range(3)] == [
        1,
        None,
        None,
    ]
    assert params.prompt_logprobs == 1  # the caller's params are not changed
    with_rows: set[str] = set()
    while engine.has_unfinished_requests():
        with_rows |= {o.request_id for o in engine.step() if o.prompt_logprobs is not None}
    assert with_rows == {"a-0", "b-0", "b-1"}


def test_add_choices_shares_one_stop_token_set_and_stops_on_it() -> None:
    """The scheduler checks every sampled token against a set built once for all of a request's
    choices: it scanned the ``stop_token_ids`` tuple, 0.13 s of the engine loop per step for
    ``n: 128`` choices of 150,000 ids."""
    engine = LLMEngine(build_engine_config(None, device="cpu"))
    vocab = engine.config.model.vocab_size
    params = SamplingParams(n=4, max_tokens=8, temperature=0, stop_token_ids=tuple(range(vocab)))
    assert engine.add_choices([f"s-{i}" for i in range(4)], [1, 2], params) == []
    reqs = [engine.scheduler.requests[f"s-{i}"] for i in range(4)]
    assert all(r.stop_token_set is reqs[0].stop_token_set for r in reqs)
    assert isinstance(reqs[0].stop_token_set, frozenset) and len(reqs[0].stop_token_set) == vocab
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: o for o in engine.step() if o.finished}
    # every token is a stop token: each choice ends on its first, reported as a stop
    assert sorted(done) == [f"s-{i}" for i in range(4)]
    assert all(len(o.new_token_ids) == 1 and o.finish_reason == "stop" for o in done.values())
    # choices added one by one (the offline LLM's way) share it too
    for i, child in enumerate(choice_params(params)):
        engine.add_request(f"t-{i}", [1, 2], child)
    assert all(engine.scheduler.requests[f"t-{i}"].stop_token_set is reqs[0].stop_token_set for i in range(4))


def test_llm_works_out_the_reported_stop_ids_once_per_prompt(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offline LLM's ``n`` children share one set of reported stop ids: a set per child of
    150,000 ``stop_token_ids`` took 1.5 s for ``n: 128``."""
    import surge.engine.llm as llm_module

    calls: list[int] = []
    real = llm_module.reported_stop_ids

    def counted(*args: Any, **kwargs: Any) -> frozenset[int]:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(llm_module, "reported_stop_ids", counted)
    params = SamplingParams(n=8, max_tokens=3, stop_token_ids=[5, 6])
    out = llm.generate([PROMPT, "The cat"], params)
    assert [len(o.outputs) for o in out] == [8, 8]
    assert len(calls) == 2
