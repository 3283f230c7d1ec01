"""vLLM 0.26 offline scripts ported by changing ``from vllm import LLM, SamplingParams`` to ``from
surge import ...``: the calls of vLLM's ``entrypoints/llm.py`` and the ``SamplingParams`` fields a
script sets, on the bundled stories260K model. Each test is a script's usage that either works as
in vLLM (checked on what it returns) or is one error that names the feature Surge lacks."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from surge import LLM, SamplingParams, TokensPrompt
from surge.config import DEFAULT_MODEL_DIR as STORIES
from surge.sampling_params import StructuredOutputsParams

PROMPT = "Once upon a time"
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
LONG_PROMPT = "Once upon a time, there was a little girl named Lily. She liked to play outside in the sun."


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    """The ``LLM(...)`` line of a typical vLLM script, unchanged but for the model folder."""
    with LLM(
        model=str(STORIES),
        dtype="float32",
        seed=0,
        max_model_len=256,
        gpu_memory_utilization=0.9,
        enforce_eager=True,
        tensor_parallel_size=1,
        tokenizer=str(STORIES),
        max_num_seqs=8,
        enable_prefix_caching=True,
    ) as model:
        yield model


def test_constructor_arguments_reach_the_engine(llm: LLM) -> None:
    config = llm.engine.config
    assert config.model.max_model_len == 256 and llm.engine.max_model_len == 256
    assert config.scheduler.max_num_seqs == 8
    assert config.cache.enable_prefix_caching is True
    assert llm.get_world_size() == 1


def test_vllm_default_arguments_scripts_spell_out_are_taken() -> None:
    """``LLM(model, trust_remote_code=False, tokenizer_mode="auto", ...)``: vLLM's defaults, which
    ask for nothing Surge lacks, were a TypeError ("does not take vLLM's 'trust_remote_code'")."""
    with LLM(
        str(STORIES),
        trust_remote_code=False,
        tokenizer_mode="auto",
        skip_tokenizer_init=False,
        enable_chunked_prefill=True,
        max_logprobs=20,
        logits_processors=None,
        num_kv_blocks=8,
    ) as model:
        assert len(model.generate(PROMPT, GREEDY)[0].outputs[0].token_ids) == 8


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"trust_remote_code": True},
            r"'trust_remote_code' only as False, got True: Surge runs its own code",
        ),
        ({"tokenizer_mode": "slow"}, r"'tokenizer_mode' only as 'auto' or 'hf', got 'slow'"),
        ({"skip_tokenizer_init": True}, r"'skip_tokenizer_init' only as False, .*token-id prompts"),
        ({"enable_chunked_prefill": False}, r"'enable_chunked_prefill' only as None or True, .*always on"),
        (
            {"max_logprobs": -1},
            r"'max_logprobs' only as 20, got -1: logprobs and prompt_logprobs take up to 20",
        ),
        ({"logits_processors": ["my.Proc"]}, r"'logits_processors' only as None or \[\], .*logit_bias"),
    ],
)
def test_vllm_arguments_that_ask_for_more_name_it(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLM(str(STORIES), **kwargs)


def test_generate_takes_each_vllm_prompt_form(llm: LLM) -> None:
    ids = llm.get_tokenizer().encode(PROMPT)
    one = llm.generate(PROMPT, GREEDY)
    assert len(one) == 1 and one[0].prompt == PROMPT and one[0].prompt_token_ids == ids
    expected = one[0].outputs[0].token_ids
    forms: list[object] = [
        [PROMPT, "The cat"],
        TokensPrompt(prompt_token_ids=ids),
        [{"prompt_token_ids": ids}, {"prompt": PROMPT}],
        ids,
    ]
    for prompts in forms:
        outs = llm.generate(prompts, sampling_params=GREEDY, use_tqdm=False, lora_request=None)  # type: ignore[arg-type]
        assert outs[0].outputs[0].token_ids == expected
        assert outs[0].prompt_token_ids == ids
    assert llm.generate(TokensPrompt(prompt_token_ids=ids), GREEDY)[0].prompt is None


def test_one_sampling_params_per_prompt(llm: LLM) -> None:
    params = [SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True) for k in (2, 5, 3)]
    outs = llm.generate(["a", "b", "c"], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 5, 3]
    with pytest.raises(ValueError, match="one object or one per prompt"):
        llm.generate(["a", "b"], params)


def test_generate_without_sampling_params_uses_the_defaults(llm: LLM) -> None:
    out = llm.generate(PROMPT)[0].outputs[0]
    assert 1 <= len(out.token_ids) <= llm.get_default_sampling_params().max_tokens


def test_request_output_fields_scripts_read(llm: LLM) -> None:
    out = llm.generate(PROMPT, GREEDY)[0]
    assert isinstance(out.request_id, str) and out.finished and out.metrics is None
    # vLLM's offline ids count the LLM's prompts in decimal: scripts sort by int(request_id)
    batch = llm.generate([PROMPT, {"prompt_token_ids": [1, 2]}], SamplingParams(max_tokens=1, n=2))
    assert [int(o.request_id) for o in batch] == [int(out.request_id) + 1, int(out.request_id) + 2]
    assert all(o.request_id == str(int(o.request_id)) for o in batch)
    assert out.prompt_logprobs is None
    c = out.outputs[0]
    assert c.index == 0 and c.finish_reason == "length" and c.stop_reason is None and c.finished()
    assert c.text == llm.get_tokenizer().decode(c.token_ids)
    assert c.logprobs is None and c.cumulative_logprob is None
    llm.generate(LONG_PROMPT, GREEDY)
    again = llm.generate(LONG_PROMPT, GREEDY)[0]
    assert len(again.prompt_token_ids) > 16 and again.num_cached_tokens >= 16  # one full block cached


def test_logprobs_entries(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)
    c = llm.generate(PROMPT, params)[0].outputs[0]
    tok = llm.get_tokenizer()
    assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
    for token_id, entry in zip(c.token_ids, c.logprobs, strict=True):
        assert token_id in entry and 2 <= len(entry) <= 3
        assert entry[token_id].rank == 1  # greedy: the sampled token is the most likely
        for other_id, lp in entry.items():
            assert lp.logprob <= 0.0 and lp.rank >= 1
            assert lp.decoded_token is not None and lp.decoded_token.strip() == tok.decode([other_id])
    # as vLLM's, a word piece keeps its leading space: the sampled tokens' strings spell the text
    assert "".join(e[t].decoded_token or "" for t, e in zip(c.token_ids, c.logprobs, strict=True)) == c.text
    assert c.cumulative_logprob == pytest.approx(
        sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs, strict=True))
    )
    zero = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0))
    assert [len(e) for e in zero[0].outputs[0].logprobs or []] == [1, 1, 1, 1]


def test_prompt_logprobs(llm: LLM) -> None:
    out = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1))[0]
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for token_id, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:], strict=True):
        assert entry is not None and token_id in entry and math.isfinite(entry[token_id].logprob)


def test_n_choices_are_indexed_and_seeded(llm: LLM) -> None:
    params = SamplingParams(n=3, temperature=1.0, max_tokens=6, ignore_eos=True, seed=7)
    first = llm.generate(PROMPT, params)[0].outputs
    assert [c.index for c in first] == [0, 1, 2]
    assert [c.token_ids for c in llm.generate(PROMPT, params)[0].outputs] == [c.token_ids for c in first]


def test_stop_strings_and_stop_token_ids(llm: LLM) -> None:
    free = llm.generate(PROMPT, GREEDY)[0].outputs[0]
    word = free.text.split()[2]  # a word greedy decoding reaches
    base = {"temperature": 0.0, "max_tokens": 8, "ignore_eos": True}
    cut = llm.generate(PROMPT, SamplingParams(**base, stop=[word]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == word and word not in cut.text
    assert free.text.startswith(cut.text)
    kept = llm.generate(PROMPT, SamplingParams(**base, stop=word, include_stop_str_in_output=True))[0]
    assert kept.outputs[0].text == cut.text + word
    stop_id = free.token_ids[3]
    by_id = llm.generate(PROMPT, SamplingParams(**base, stop_token_ids=[stop_id]))[0].outputs[0]
    assert by_id.token_ids == free.token_ids[:4] and by_id.stop_reason == stop_id
    assert by_id.finish_reason == "stop"


def test_special_tokens_in_the_text(llm: LLM) -> None:
    """``skip_special_tokens=False`` keeps an EOS in the text (forced here with
    ``allowed_token_ids`` and ``ignore_eos``); ``spaces_between_special_tokens`` is taken."""
    tok = llm.get_tokenizer()
    eos = tok.eos_token_id
    base = {"temperature": 0.0, "max_tokens": 2, "ignore_eos": True, "allowed_token_ids": [eos]}
    kept = llm.generate(PROMPT, SamplingParams(**base, skip_special_tokens=False))[0].outputs[0]
    assert kept.token_ids == [eos, eos] and tok.eos_token in kept.text
    skipped = llm.generate(PROMPT, SamplingParams(**base, spaces_between_special_tokens=False))[0]
    assert skipped.outputs[0].text == ""


def test_truncate_prompt_tokens(llm: LLM) -> None:
    ids = llm.get_tokenizer().encode(LONG_PROMPT)
    out = llm.generate(LONG_PROMPT, SamplingParams(temperature=0.0, max_tokens=2, truncate_prompt_tokens=5))[
        0
    ]
    assert out.prompt_token_ids == ids[-5:]


def test_tokenization_kwargs_truncate_as_vllm_026(llm: LLM) -> None:
    """vLLM 0.26 truncates with ``generate(..., tokenization_kwargs={"truncate_prompt_tokens": k})``
    (its ``SamplingParams`` lost the field), keeping the last k tokens (vLLM's tokenizers truncate
    on the left for generative models) unless ``truncation_side="right"``; it was a ValueError
    ("takes only 'add_special_tokens'")."""
    ids = llm.get_tokenizer().encode(LONG_PROMPT)

    def prompt_ids(prompt: object, **kwargs: object) -> list[int]:
        out = llm.generate(prompt, GREEDY, tokenization_kwargs=kwargs)  # type: ignore[arg-type]
        return out[0].prompt_token_ids

    assert prompt_ids(LONG_PROMPT, truncate_prompt_tokens=5) == ids[-5:]
    assert prompt_ids(LONG_PROMPT, truncate_prompt_tokens=5, truncation_side="right") == ids[:5]
    assert prompt_ids({"prompt_token_ids": ids}, truncate_prompt_tokens=4, truncation_side="right") == ids[:4]
    assert prompt_ids(LONG_PROMPT, truncate_prompt_tokens=-1) == ids  # max_model_len: all of it
    assert prompt_ids(LONG_PROMPT, truncate_prompt_tokens=None, add_special_tokens=False) == ids[1:]
    chat = llm.chat(
        [{"role": "user", "content": LONG_PROMPT}],
        GREEDY,
        tokenization_kwargs={"truncate_prompt_tokens": 6},
    )[0]
    assert len(chat.prompt_token_ids) == 6 and chat.prompt is not None and LONG_PROMPT in chat.prompt
    for kwargs, message in [
        ({"truncate_prompt_tokens": 257}, r"\(257\) cannot be greater than max_model_len \(256\)"),
        ({"truncate_prompt_tokens": -2}, r"must be an integer >= -1 or None, got -2"),
        ({"truncate_prompt_tokens": 4.0}, r"must be an integer >= -1 or None, got 4.0"),
        (
            {"truncate_prompt_tokens": 4, "truncation_side": "middle"},
            r"'left', 'right' or None, got 'middle'",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            llm.generate(LONG_PROMPT, GREEDY, tokenization_kwargs=kwargs)


def test_structured_outputs_bad_words_and_allowed_token_ids(llm: LLM) -> None:
    choice = SamplingParams(
        temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["yes", "no"])
    )
    assert llm.generate(PROMPT, choice)[0].outputs[0].text in {"yes", "no"}
    word = llm.generate(PROMPT, GREEDY)[0].outputs[0].text.split()[2]
    banned = llm.generate(
        PROMPT, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, bad_words=[word])
    )
    assert word not in banned[0].outputs[0].text.split()
    allowed = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, allowed_token_ids=[5, 261])
    assert set(llm.generate(PROMPT, allowed)[0].outputs[0].token_ids) <= {5, 261}


def test_structured_json_schema(llm: LLM) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    params = SamplingParams(
        temperature=0.0, max_tokens=64, structured_outputs=StructuredOutputsParams(json=schema)
    )
    out = llm.generate(PROMPT, params)[0].outputs[0]
    assert out.finish_reason == "stop" and isinstance(json.loads(out.text)["name"], str)


def test_empty_prompt_list_gives_no_outputs(llm: LLM) -> None:
    assert llm.generate([], GREEDY) == []


def test_beam_search_hint_recipe_works(llm: LLM) -> None:
    """``beam_search``'s AttributeError says to sample ``n=k`` candidates with ``logprobs=0`` and keep
    the one of highest ``cumulative_logprob``: every candidate has one, the sum of its tokens'."""
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6, ignore_eos=True, logprobs=0, seed=1)
    candidates = llm.generate(PROMPT, params)[0].outputs
    for c in candidates:
        assert c.logprobs is not None and c.cumulative_logprob is not None
        assert c.cumulative_logprob == pytest.approx(
            sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs, strict=True))
        )
    best = max(candidates, key=lambda c: c.cumulative_logprob or -math.inf)
    assert best.cumulative_logprob == max(c.cumulative_logprob or -math.inf for c in candidates)


def test_sampling_params_clone(llm: LLM) -> None:
    """vLLM's ``sp.clone()`` (a script's per-prompt variant of shared params) was an AttributeError."""
    shared = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logit_bias={5: 0.5})
    longer = shared.clone()
    longer.max_tokens = 6
    assert longer.logit_bias == shared.logit_bias and longer.logit_bias is not shared.logit_bias
    assert shared.max_tokens == 3 and shared.clone() == shared
    outs = llm.generate([PROMPT, PROMPT], [shared, longer])
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 6]
    quick = SamplingParams(max_tokens=3, logit_bias={5: 0.5}, skip_clone=True).clone()
    assert quick.max_tokens == 3 and quick.skip_clone


@pytest.mark.parametrize("field", ["best_of", "guided_decoding", "logits_processors", "use_beam_search"])
def test_sampling_fields_vllm_026_lacks_too_are_refused_by_name(field: str) -> None:
    """Fields of older vLLM releases that vLLM 0.26's ``SamplingParams`` refuses too (``best_of``,
    ``guided_decoding``, now ``structured_outputs``; per-request ``logits_processors``): a
    TypeError naming the field, never silently ignored."""
    with pytest.raises(TypeError, match=field):
        SamplingParams(**{field: None})


def test_chat_one_conversation_and_a_batch(llm: LLM) -> None:
    conversation = [{"role": "user", "content": "Tell me a story"}]
    one = llm.chat(conversation, GREEDY, use_tqdm=False, lora_request=None)
    assert len(one) == 1 and "Tell me a story" in (one[0].prompt or "")
    batch = llm.chat([conversation, [{"role": "user", "content": "Hello"}]], GREEDY, use_tqdm=False)
    assert len(batch) == 2 and batch[0].outputs[0].token_ids == one[0].outputs[0].token_ids
    assert "Hello" in (batch[1].prompt or "")


TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if tools %}[tools:{% for t in tools %}{{ t['function']['name'] }}{% endfor %}]{% endif %}"
    "{% if shout %}!{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_chat_template_arguments(llm: LLM) -> None:
    """``chat_template``, ``chat_template_kwargs``, ``add_generation_prompt``,
    ``continue_final_message`` and ``tools`` reach the template as in vLLM's ``LLM.chat``."""
    user = [{"role": "user", "content": "Hi"}]
    params = SamplingParams(temperature=0.0, max_tokens=1)

    def prompt(messages: list[dict[str, str]], **kwargs: object) -> str | None:
        return llm.chat(messages, params, chat_template=TEMPLATE, **kwargs)[0].prompt  # type: ignore[arg-type]

    assert prompt(user) == "<user>Hi<assistant>"
    assert prompt(user, add_generation_prompt=False) == "<user>Hi"
    assert prompt(user, chat_template_kwargs={"shout": True}) == "<user>Hi!<assistant>"
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert prompt(user, tools=tools) == "<user>Hi[tools:get_weather]<assistant>"
    partial = [*user, {"role": "assistant", "content": "Once upon"}]
    assert prompt(partial, add_generation_prompt=False, continue_final_message=True) == (
        "<user>Hi<assistant>Once upon"
    )
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt"):
        prompt(partial, continue_final_message=True)  # vLLM's default add_generation_prompt=True


def test_tokenizer_access(llm: LLM) -> None:
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPT)
    assert tok.decode(ids, skip_special_tokens=True) == PROMPT
    assert llm.generate(PROMPT, GREEDY)[0].prompt_token_ids == ids


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("llm_engine", r"llm.engine .*the tokenizer is llm.get_tokenizer\(\)"),
        ("model_config", r"llm.engine.config.model .*max_model_len"),
        ("encode", "no pooling runner"),
        ("embed", "no pooling runner"),
        ("score", "no pooling runner"),
        ("classify", "no pooling runner"),
        ("beam_search", r"no beam search; sample candidates with SamplingParams\(n=k, logprobs=0\)"),
    ],
)
def test_vllm_members_surge_lacks_name_the_feature(llm: LLM, name: str, message: str) -> None:
    """``llm.llm_engine.get_tokenizer()``, ``llm.model_config.max_model_len``, the pooling calls and
    ``beam_search``: one AttributeError naming vLLM's member and what to use instead."""
    with pytest.raises(
        AttributeError, match=rf"Surge's LLM has no '{name}' \(vLLM's LLM.{name}\): .*{message}"
    ):
        getattr(llm, name)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory, qwen3_8b_dir: Path) -> Iterator[LLM]:
    """A one-layer Qwen3 with random weights and Qwen3's real tokenizer and chat template."""
    src = qwen3_8b_dir
    folder: Path = tmp_path_factory.mktemp("qwen3")
    config = json.loads((src / "config.json").read_text())
    config.update(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=512,
        torch_dtype="float32",
    )
    (folder / "config.json").write_text(json.dumps(config))
    for f in src.iterdir():
        if f.name != "config.json":
            shutil.copy(f, folder / f.name)
    with LLM(str(folder), load_format="dummy", max_model_len=512, num_kv_blocks=40) as model:
        yield model


def test_qwen3_chat_with_tools_and_enable_thinking(qwen3: LLM) -> None:
    """A Qwen3 script's ``llm.chat(messages, params, tools=..., chat_template_kwargs={"enable_thinking":
    False})``: the tools and the empty think block are in the prompt, as the model's template writes
    them."""
    params = SamplingParams(temperature=0.0, max_tokens=2)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    plain = qwen3.chat(messages, params)[0]
    assert plain.prompt == "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    assert plain.prompt_token_ids == qwen3.get_tokenizer().encode(plain.prompt)
    out = qwen3.chat(messages, params, tools=tools, chat_template_kwargs={"enable_thinking": False})[0]
    assert out.prompt is not None and '"name": "get_weather"' in out.prompt and "<tools>" in out.prompt
    assert out.prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert len(out.outputs[0].token_ids) == 2
