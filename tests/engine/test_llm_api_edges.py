"""The offline API's edges that a vLLM user hits: prompt types that are not prompts, ``bad_words``
next to ``bad_words_token_ids``, and an ``LLM`` used after ``close()``."""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest
from tqdm import tqdm

from surge import LLM, SamplingParams
from surge.config import DEFAULT_MODEL_DIR as STORIES
from surge.core.outputs import RequestOutput

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    with LLM(device="cpu") as model:
        yield model


@pytest.mark.parametrize("prompts", [b"Once", bytearray(b"Once"), 5, None])
def test_prompts_that_are_not_prompts_are_refused(llm: LLM, prompts: object) -> None:
    """``b"Once"`` iterated as ints and ran as the token ids 79, 110, 99, 101; an int or None
    raised "'int' object is not iterable"."""
    with pytest.raises(ValueError, match="prompts must be a string, a list of token ids"):
        llm.generate(prompts, GREEDY)  # type: ignore[arg-type]


def test_bad_words_apply_next_to_bad_word_ids(llm: LLM) -> None:
    """``bad_words`` were dropped when ``bad_words_token_ids`` were given too."""
    text = llm.generate("Once upon a time", GREEDY)[0].outputs[0].text
    word = text.split()[1]  # a word greedy decoding generates
    ids = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, bad_words_token_ids=[[5]])
    both = SamplingParams(
        temperature=0.0, max_tokens=8, ignore_eos=True, bad_words=[word], bad_words_token_ids=[[5]]
    )
    assert word in llm.generate("Once upon a time", ids)[0].outputs[0].text
    out = llm.generate("Once upon a time", both)[0].outputs[0]
    assert word not in out.text.split() and 5 not in out.token_ids


def test_repetition_detection_offline(llm: LLM) -> None:
    """vLLM 0.26's ``repetition_detection`` offline: a two-token loop (allowed_token_ids, greedy
    picks by the model) ends once its pattern stands min_count times, with vLLM's finish and stop
    reasons; the same request without it runs to max_tokens."""
    from surge.sampling_params import RepetitionDetectionParams

    allowed = [5, 6]
    base = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, allowed_token_ids=allowed)
    free = llm.generate("Once upon a time", base)[0].outputs[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 48
    detect = RepetitionDetectionParams(max_pattern_size=4, min_count=3)
    # where the scheduler must stop: the first prefix of the free run that ends in a repeat
    ends = [n for n in range(1, 49) if detect.detects(free.token_ids[:n])]
    assert ends, free.token_ids  # greedy decoding over two tokens loops (checked, not assumed)
    params = msgspec.structs.replace(base, repetition_detection=detect)
    out = llm.generate("Once upon a time", params)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("repetition", "repetition_detected")
    assert out.token_ids == free.token_ids[: ends[0]]
    as_dict = SamplingParams(
        temperature=0.0,
        max_tokens=48,
        ignore_eos=True,
        allowed_token_ids=allowed,
        repetition_detection={"max_pattern_size": 4, "min_count": 3},
    )
    assert llm.generate("Once upon a time", as_dict)[0].outputs[0].token_ids == out.token_ids


def test_logprob_token_ids_offline(llm: LLM) -> None:
    """vLLM 0.26's logprob_token_ids offline: each position's dict holds the sampled token (its
    logprob and rank as with top-k) then the listed ids, with the same values top-k gives."""
    listed = [9, 5, 300]
    base = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    wide = llm.generate("Once upon a time", msgspec.structs.replace(base, logprobs=20))[0].outputs[0]
    out = llm.generate("Once upon a time", msgspec.structs.replace(base, logprob_token_ids=listed))[
        0
    ].outputs[0]
    assert out.token_ids == wide.token_ids and out.logprobs is not None and wide.logprobs is not None
    for token, got, ref in zip(out.token_ids, out.logprobs, wide.logprobs, strict=True):
        assert list(got)[0] == token and set(got) == {token, *listed}
        assert (got[token].logprob, got[token].rank) == pytest.approx((ref[token].logprob, ref[token].rank))
        for t in listed:
            if t in ref:
                assert got[t].logprob == pytest.approx(ref[t].logprob, abs=1e-5)
    # the sampled token among the listed ids keeps its first place and takes the rank of its
    # position in the list, as vLLM 0.26's dict (the same entry written twice)
    first = out.token_ids[0]
    again = msgspec.structs.replace(base, max_tokens=1, logprob_token_ids=[9, first, 5])
    got = llm.generate("Once upon a time", again)[0].outputs[0].logprobs
    assert got is not None and list(got[0]) == [first, 9, 5]
    assert got[0][first].rank == 2 and got[0][first].logprob == pytest.approx(out.logprobs[0][first].logprob)
    with pytest.raises(ValueError, match="logprob_token_ids: token ids must be in"):
        llm.generate("Once", msgspec.structs.replace(base, logprob_token_ids=[10**6]))


def test_assigned_sampling_params_as_vllm_examples(llm: LLM) -> None:
    """vLLM's examples assign to the default params; an assignment after enqueue() does not
    reach the queued request (vLLM clones the params on submission)."""
    sp = llm.get_default_sampling_params()
    sp.max_tokens = 5
    sp.ignore_eos = True
    assert len(llm.generate("Once upon a time", sp)[0].outputs[0].token_ids) == 5
    # every model-default field explicit: the engine keeps the object it is given
    own = SamplingParams(
        max_tokens=5, ignore_eos=True, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0
    )
    llm.enqueue("Once upon a time", own)
    own.max_tokens = 9
    [queued] = llm.wait_for_completion()
    assert len(queued.outputs[0].token_ids) == 5
    assert len(llm.generate("Once upon a time", own)[0].outputs[0].token_ids) == 9


def test_a_closed_llm_refuses_work() -> None:
    """Without workers, generate() after close() still ran; with tensor-parallel workers it
    raised WorkerDiedError. Both now refuse the same way."""
    model = LLM(device="cpu")
    model.close()
    model.close()  # idempotent
    for call in (
        lambda: model.generate("Once", GREEDY),
        lambda: model.chat([{"role": "user", "content": "hi"}]),
        model.reset_prefix_cache,
        lambda: model.enqueue("Once", GREEDY),
        model.wait_for_completion,
    ):
        with pytest.raises(RuntimeError, match="this LLM is closed"):
            call()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"seed": "1"}, "seed must be an integer, got '1'"),
        ({"block_size": 16.0}, "block_size must be an integer, got 16.0"),
        ({"max_model_len": "64"}, "max_model_len must be an integer, got '64'"),
        ({"max_num_seqs": True}, "max_num_seqs must be an integer, got True"),
        ({"enable_prefix_caching": "no"}, "enable_prefix_caching must be true or false, got 'no'"),
        ({"gpu_memory_utilization": "0.9"}, "gpu_memory_utilization must be a number, got '0.9'"),
        ({"gpu_memory_utilization": True}, "gpu_memory_utilization must be a number, got True"),
        ({"tensor_parallel_size": None}, "tensor_parallel_size must be an integer, got None"),
    ],
)
def test_llm_arguments_of_the_wrong_type_are_named(kwargs: dict[str, object], match: str) -> None:
    """They failed deep inside (torch's manual_seed, a comparison of str and int), and
    ``enable_prefix_caching="no"`` turned caching on."""
    with pytest.raises(ValueError, match=match):
        LLM(device="cpu", **kwargs)  # type: ignore[arg-type]


def test_vllm_none_block_size_and_prefix_caching_are_the_defaults() -> None:
    """vLLM's ``LLM(block_size=None, max_num_seqs=None, ..., enable_prefix_caching=None)`` (its
    defaults, left to its engine) failed comparing None with an int, and None turned caching off."""
    nones = dict(block_size=None, max_num_seqs=None, max_num_batched_tokens=None, enable_prefix_caching=None)
    with LLM(device="cpu", num_kv_blocks=16, **nones) as model:  # type: ignore[arg-type]
        assert model.engine.config.cache.block_size == 16
        assert model.engine.config.scheduler.max_num_seqs == 256
        assert model.engine.config.scheduler.max_num_batched_tokens == 8192
    with pytest.raises(ValueError, match="device must be auto, cpu or cuda, got None"):
        LLM(device=None)  # type: ignore[arg-type]
        prompt = list(range(10, 50))
        model.generate([prompt], GREEDY)
        assert model.generate([prompt], GREEDY)[0].num_cached_tokens == 32


def test_seed_none_is_an_unseeded_engine() -> None:
    """As vLLM's ``seed=None`` (it raised in torch.manual_seed)."""
    with LLM(device="cpu", seed=None) as model:
        assert len(model.generate("Once", GREEDY)[0].outputs[0].token_ids) == 8


def test_max_tokens_past_the_context_ends_there(llm: LLM) -> None:
    """As vLLM's offline LLM: the output stops at max_model_len with "length" (it raised "This
    model's maximum context length is 512 tokens"); the server still refuses such a request."""
    limit = llm.engine.config.scheduler.max_model_len
    params = SamplingParams(temperature=0.0, max_tokens=limit + 100, ignore_eos=True)
    out = llm.generate("Once upon a time", params)[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == limit


def test_chat_takes_use_tqdm(llm: LLM, capsys: pytest.CaptureFixture[str]) -> None:
    """As vLLM's LLM.chat (it was an unexpected keyword argument)."""
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    out = llm.chat([{"role": "user", "content": "hi"}], params, use_tqdm=True)
    assert len(out[0].outputs[0].token_ids) == 3
    assert "100%" in capsys.readouterr().err


def test_use_tqdm_takes_a_callable(llm: LLM, capsys: pytest.CaptureFixture[str]) -> None:
    """As vLLM: a callable makes the bar, with the caller's own keywords (it was taken as True)."""
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate(["Once", "upon"], params, use_tqdm=functools.partial(tqdm, desc="mine"))
    err = capsys.readouterr().err
    assert "mine" in err and "2/2" in err and "generate" not in err


def test_token_id_prompts_as_tuples_and_numpy_integers(llm: LLM) -> None:
    """Token ids in a tuple or as NumPy integers are token ids (both were refused as "each prompt
    must be ..." or "got keys ['prompt_token_ids']"); wrong values name what is wrong."""
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    ids = llm.generate({"prompt_token_ids": [1, 400]}, params)[0].outputs[0].token_ids
    for prompt in ({"prompt_token_ids": (1, 400)}, [[np.int64(1), 400]], np.array([1, 400])):
        out = llm.generate(prompt, params)[0]
        assert out.prompt_token_ids == [1, 400] and out.outputs[0].token_ids == ids
    with pytest.raises(ValueError, match="'prompt_token_ids' must be a list of integers"):
        llm.generate({"prompt_token_ids": "1 400"}, params)
    with pytest.raises(ValueError, match="'prompt' must be a string, got int"):
        llm.generate({"prompt": 5}, params)


def test_clipping_respects_min_tokens_and_the_kv_pool() -> None:
    """min_tokens past the room is refused with the context message (it said "min_tokens (80)
    must not exceed max_tokens (59)", a max_tokens the user never set); a pool smaller than the
    context ends the output where the pool is full, as an unset max_tokens does."""
    small = LLM(device="cpu", max_model_len=64)
    with pytest.raises(
        ValueError, match="maximum context length is 64 tokens.*less than min_tokens \\(80\\)"
    ):
        small.generate("Once upon a time", SamplingParams(max_tokens=100, min_tokens=80))
    # the prompt alone: the message names the prompt, not a max_tokens that would be cut anyway
    with pytest.raises(ValueError, match="the prompt has 70 tokens: .* leaves no room for output") as err:
        small.generate({"prompt_token_ids": [1] * 70}, SamplingParams(max_tokens=4))
    # only the limit that binds: the KV pool (far larger here) was named too
    assert str(err.value) == (
        "the prompt has 70 tokens: this model's maximum context length is 64 tokens, which leaves no room for output"
    )
    small.close()
    with LLM(device="cpu", num_kv_blocks=8) as pool:  # 128 tokens of KV, context 512
        with pytest.raises(ValueError) as err:
            pool.generate({"prompt_token_ids": [1] * 130}, SamplingParams(max_tokens=4))
        assert str(err.value) == (
            "the prompt has 130 tokens: the KV cache holds 128 tokens (the model's maximum context length "
            "is 512), which leaves no room for output"
        )
        params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
        out = pool.generate("Once upon a time", params)[0]
        assert out.outputs[0].finish_reason == "length"
        assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 8 * 16


@pytest.mark.parametrize("seed", [-1, 2**62, 2**70])
def test_any_integer_seed_starts_an_engine(seed: int) -> None:
    """Negative seeds worked before the type checks and must still (vLLM takes them); large ones
    overflowed torch's generator while seeding dummy weights."""
    with LLM(device="cpu", seed=seed, load_format="dummy") as model:
        assert len(model.generate("Once", GREEDY)[0].outputs[0].token_ids) == 8


def test_numpy_integers_are_integers() -> None:
    """As SamplingParams normalizes them (the type checks first refused np.int64)."""
    import numpy as np

    with LLM(device="cpu", block_size=np.int64(16), seed=np.int64(1)) as model:
        assert (
            model.engine.config.cache.block_size == 16 and type(model.engine.config.cache.block_size) is int
        )


def test_trust_remote_code_is_refused_by_name() -> None:
    """Surge runs no model folder's code: vLLM's permission would change nothing, so it is refused
    (naming it) rather than taken and ignored; vLLM's default False asks for nothing and is taken
    (tests/engine/test_vllm_offline_scripts.py)."""
    with pytest.raises(ValueError, match="'trust_remote_code' only as False, got True"):
        LLM(device="cpu", trust_remote_code=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"swap_space": 4}, r"vLLM's 'swap_space': leave it out \(preempted requests are recomputed"),
        ({"tokenizer_mod": "auto"}, "^LLM\\(\\) got an unexpected keyword argument 'tokenizer_mod'$"),
        # the command line's hint for this spoke of the benchmark and its flags
        (
            {"served_model_name": "m"},
            r"vLLM's 'served_model_name': leave it out \(the offline API names no model",
        ),
        ({"top_k": 5}, "^LLM\\(\\) got an unexpected keyword argument 'top_k'$"),
        (
            {"enable_log_requests": True},
            "^LLM\\(\\) got an unexpected keyword argument 'enable_log_requests'$",
        ),
        ({"task": "generate"}, r"vLLM's 'task': leave it out \(Surge's LLM generates text, and vLLM 0.26"),
    ],
)
def test_vllm_arguments_surge_does_without_say_what_to_use(kwargs: dict[str, object], message: str) -> None:
    """A ported script's ``LLM(model, swap_space=4)`` got Python's bare "unexpected keyword
    argument"; vLLM's arguments now say what to do instead, as the CLI's flags do."""
    with pytest.raises(TypeError, match=message):
        LLM(device="cpu", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"runner": "pooling"},
            r"'runner' only as 'auto' or 'generate', got 'pooling': Surge's LLM generates",
        ),
        ({"convert": "embed"}, r"'convert' only as 'auto' or 'none', got 'embed'"),
        (
            {"pipeline_parallel_size": 2},
            r"'pipeline_parallel_size' only as 1, got 2: .* shard the model with tensor_parallel_size",
        ),
        ({"pipeline_parallel_size": True}, r"'pipeline_parallel_size' only as 1, got True"),
        ({"data_parallel_size": 2}, r"'data_parallel_size' only as 1, got 2: .*surge serve -dp N"),
        ({"revision": "main"}, r"'revision' only as None, got 'main': Surge loads a local model folder only"),
        ({"tokenizer_revision": "v1"}, r"'tokenizer_revision' only as None, got 'v1'"),
        (
            {"compilation_config": 3},
            r"'compilation_config' only as None, 0 or \{\}, got 3: Surge runs no torch.compile: .*enforce_eager",
        ),
        ({"compilation_config": {"cudagraph_capture_sizes": [1]}}, r"'compilation_config' only as None"),
        ({"enable_lora": True}, r"'enable_lora' only as False, got True: Surge serves no LoRA adapters"),
        ({"speculative_config": {"method": "ngram"}}, r"'speculative_config' only as None, .*no speculative"),
        ({"kv_cache_memory_bytes": 2**30}, r"'kv_cache_memory_bytes' only as None, .*num_kv_blocks=N"),
        ({"cpu_offload_gb": 4}, r"'cpu_offload_gb' only as 0 or 0.0, got 4"),
        ({"disable_custom_all_reduce": False}, r"'disable_custom_all_reduce' only as True, .*tp_all_reduce"),
        ({"distributed_executor_backend": "ray"}, r"'distributed_executor_backend' only as None or 'mp'"),
        (
            {"max_logprobs": 5},
            r"'max_logprobs' only as 20, got 5: logprobs and prompt_logprobs take up to 20",
        ),
        ({"tokenizer_mode": "mistral"}, r"'tokenizer_mode' only as 'auto' or 'hf', .*AutoTokenizer"),
    ],
)
def test_vllm_arguments_taken_at_their_default_only(kwargs: dict[str, object], message: str) -> None:
    """A ported script's ``LLM(model, runner="generate", pipeline_parallel_size=1, revision=None,
    compilation_config=0)`` was Python's bare "unexpected keyword argument": the values that ask
    for nothing Surge lacks are taken, any other is refused with what to use instead."""
    with pytest.raises(ValueError, match=message):
        LLM(device="cpu", **kwargs)


def test_vllm_arguments_at_their_default_are_taken() -> None:
    """The other half of :func:`test_vllm_arguments_taken_at_their_default_only`."""
    defaults = dict(
        runner="generate",
        convert="none",
        pipeline_parallel_size=1,
        data_parallel_size=1,
        enable_lora=False,
        speculative_config=None,
        kv_cache_memory_bytes=None,
        cpu_offload_gb=0,
        hf_token=None,
        limit_mm_per_prompt={},
        mm_processor_kwargs=None,
        disable_custom_all_reduce=True,
        distributed_executor_backend="mp",
    )
    with LLM(device="cpu", revision=None, tokenizer_revision=None, compilation_config=0, **defaults) as model:
        assert len(model.generate("Once", GREEDY)[0].outputs[0].token_ids) == 8
    with LLM(device="cpu", runner="auto", convert="auto", compilation_config={}) as model:
        assert len(model.generate("Once", GREEDY)[0].outputs[0].token_ids) == 8


def test_tokenization_kwargs_add_special_tokens(llm: LLM) -> None:
    """vLLM's ``generate(..., tokenization_kwargs={"add_special_tokens": False})`` (a prompt that
    holds its BOS already) was a TypeError: the text is encoded without the BOS, as the ids show;
    vLLM's other keys are refused by name rather than ignored."""
    ids = llm.tokenizer.encode("Once upon", add_special_tokens=False)
    plain = llm.generate("Once upon", GREEDY, tokenization_kwargs={"add_special_tokens": True})[0]
    assert plain.prompt_token_ids == [llm.tokenizer.bos_token_id, *ids]
    bare = llm.generate(["Once upon"], GREEDY, tokenization_kwargs={"add_special_tokens": False})[0]
    assert bare.prompt_token_ids == ids and bare.prompt == "Once upon"
    assert bare.outputs[0].token_ids == llm.generate([ids], GREEDY)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match=r"'truncation_side', got \['truncation'\] \(truncate a prompt with"):
        llm.generate("Once", GREEDY, tokenization_kwargs={"truncation": True})
    with pytest.raises(ValueError, match=r"\['add_special_tokens'\] must be a bool, got 0"):
        llm.generate("Once", GREEDY, tokenization_kwargs={"add_special_tokens": 0})


def test_tokenizer_may_name_the_model_folder(tmp_path: Path) -> None:
    """A ported script's ``LLM(path, tokenizer=path)`` was a TypeError: the model folder, however
    spelled, is taken; another folder is refused, saying that the model folder's tokenizer is read."""
    with LLM(STORIES, tokenizer=f"{STORIES}/.", device="cpu", num_kv_blocks=8) as model:
        assert model.generate("Once", GREEDY)[0].outputs[0].token_ids
    with LLM(tokenizer=STORIES, device="cpu", num_kv_blocks=8) as model:  # the bundled model's folder
        assert model.generate("Once", GREEDY)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match=r"is not the model folder .*: Surge reads the model folder's own"):
        LLM(STORIES, tokenizer=tmp_path, device="cpu")
    with pytest.raises(ValueError, match="tokenizer must be a folder path or None, got int"):
        LLM(STORIES, tokenizer=5, device="cpu")  # type: ignore[arg-type]


def test_vllm_prompt_dicts_and_output_fields(llm: LLM) -> None:
    """vLLM's TokensPrompt may carry its text; the multimodal keys may be there empty; outputs have
    ``metrics`` and ``CompletionOutput.finished()`` as in vLLM."""
    ids = [1, 400, 3]
    plain = llm.generate([ids], GREEDY)[0]
    for prompt in (
        {"prompt_token_ids": ids, "prompt": "whatever"},
        {"prompt_token_ids": ids, "multi_modal_data": None, "mm_processor_kwargs": {}},
        {"prompt_token_ids": ids, "cache_salt": None},
    ):
        out = llm.generate(prompt, GREEDY)[0]
        assert out.prompt_token_ids == ids and out.outputs[0].token_ids == plain.outputs[0].token_ids
    assert llm.generate({"prompt": "Once", "multi_modal_data": None}, GREEDY)[0].prompt == "Once"
    assert llm.generate({"prompt_token_ids": ids, "prompt": "its text"}, GREEDY)[0].prompt == "its text"
    with pytest.raises(ValueError, match="'multi_modal_data' is not supported: Surge serves text-only"):
        llm.generate({"prompt": "Once", "multi_modal_data": {"image": object()}}, GREEDY)
    with pytest.raises(ValueError, match="'prompt' must be a string"):
        llm.generate({"prompt": 5, "prompt_token_ids": ids}, GREEDY)
    assert plain.metrics is None and plain.finished and plain.outputs[0].finished()


def test_detokenize_false_gives_token_ids_without_text(llm: LLM) -> None:
    """vLLM's ``SamplingParams(detokenize=False)`` was a TypeError: the same tokens and logprobs,
    no text and no decoded tokens; ``stop`` strings need the text, so they are refused with it."""
    fields = dict(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1, prompt_logprobs=1, n=2)
    decoded = llm.generate("Once upon", SamplingParams(**fields))[0]  # type: ignore[arg-type]
    raw = llm.generate("Once upon", SamplingParams(detokenize=False, **fields))[0]  # type: ignore[arg-type]
    assert decoded.outputs[0].text and [o.text for o in raw.outputs] == ["", ""]
    for got, want in zip(raw.outputs, decoded.outputs, strict=True):
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason == "length"
        assert got.logprobs is not None and want.logprobs is not None
        assert [{t: lp.logprob for t, lp in pos.items()} for pos in got.logprobs] == [
            {t: lp.logprob for t, lp in pos.items()} for pos in want.logprobs
        ]
        assert {lp.decoded_token for pos in got.logprobs for lp in pos.values()} == {None}
    assert raw.prompt_logprobs is not None and decoded.prompt_logprobs is not None
    assert raw.prompt_logprobs[0] is None and len(raw.prompt_logprobs) == len(decoded.prompt_logprobs)
    assert {lp.decoded_token for pos in raw.prompt_logprobs[1:] if pos for lp in pos.values()} == {None}
    with pytest.raises(ValueError, match="stop strings need the decoded text: leave detokenize at True"):
        SamplingParams(detokenize=False, stop=["."])


def test_torch_dtypes_are_taken_as_in_vllm() -> None:
    """A ported script's ``LLM(model, dtype=torch.bfloat16)`` (vLLM takes a ``torch.dtype``) was
    refused as not one of the dtype names; another torch dtype is refused naming the choices."""
    import torch

    for given, name in ((torch.bfloat16, "bfloat16"), (torch.half, "float16"), (torch.float32, "float32")):
        with LLM(device="cpu", dtype=given, num_kv_blocks=8) as model:
            assert model.engine.config.model.dtype == name
            assert model.generate("Once", GREEDY)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match=r"dtype must be one of auto, .*, got torch\.float64$"):
        LLM(device="cpu", dtype=torch.float64)


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm: LLM) -> None:
    """vLLM's ``SamplingParams.truncate_prompt_tokens``: the last k prompt tokens (-1: the last
    ``max_model_len``), the same output as the truncated prompt itself."""
    ids = list(range(10, 40))
    keep = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, truncate_prompt_tokens=5)
    out = llm.generate([ids], keep)[0]
    assert out.prompt_token_ids == ids[-5:]
    out_tokens = llm.generate([ids[-5:]], GREEDY)[0].outputs[0].token_ids[:4]
    assert out.outputs[0].token_ids == out_tokens
    whole = SamplingParams(max_tokens=1, truncate_prompt_tokens=-1)
    assert llm.generate([ids], whole)[0].prompt_token_ids == ids
    # -1 leaves max_tokens of room (vLLM 0.26's max_model_len - max_tokens), so that it runs
    over = [10 + i % 400 for i in range(llm.engine.max_model_len + 50)]
    room = SamplingParams(max_tokens=4, ignore_eos=True, truncate_prompt_tokens=-1)
    cut = llm.generate([over], room)[0]
    assert (
        cut.prompt_token_ids == over[-(llm.engine.max_model_len - 4) :] and len(cut.outputs[0].token_ids) == 4
    )
    with pytest.raises(
        ValueError, match=r"truncate_prompt_tokens \(513\) must not exceed max_model_len \(512\)"
    ):
        llm.generate([ids], SamplingParams(max_tokens=1, truncate_prompt_tokens=llm.engine.max_model_len + 1))
    with pytest.raises(ValueError, match="truncate_prompt_tokens must be -1 or in"):
        SamplingParams(truncate_prompt_tokens=0)
    # the engine honours the field itself (a caller of LLMEngine, not only LLM)
    engine = llm.engine
    engine.add_choices(["t-0", "t-1"], ids, msgspec.structs.replace(keep, n=2))
    engine.add_request("t", ids[-5:], msgspec.structs.replace(keep, truncate_prompt_tokens=None))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert tokens["t-0"] == tokens["t"] == out_tokens


def test_model_folder_mistakes_get_the_command_line_messages(tmp_path: Path) -> None:
    """``LLM("Qwen/Qwen3-0.6B")``, a vLLM user's first call, said only "is not a directory"; a
    folder without tokenizer files ended on transformers' cut-off "from one of: ". The offline API
    now runs the command line's checks: a hub id is told to download the model first."""
    with pytest.raises(
        ValueError, match=r"^model Qwen/Qwen3-0\.6B: no such folder\. Surge loads local folders only"
    ) as e:
        LLM("Qwen/Qwen3-0.6B", device="cpu")
    assert "huggingface-cli download Qwen/Qwen3-0.6B --local-dir DIR`) and pass model=DIR" in str(e.value)
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(STORIES / name, no_tokenizer / name)
    with pytest.raises(
        ValueError, match=r"the folder has no tokenizer \(tokenizer\.json, .*copy the model's tokenizer"
    ):
        LLM(no_tokenizer, device="cpu")
    truncated = tmp_path / "truncated"
    shutil.copytree(STORIES, truncated)
    weights = truncated / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors cannot be read: .*\(truncated\)"):
        LLM(truncated, device="cpu")
    with LLM(truncated, device="cpu", load_format="dummy", max_model_len=32) as dummy:  # weights not read
        assert len(dummy.generate("Once", GREEDY)[0].outputs[0].token_ids) == 8
    # the messages spell LLM's arguments, not the command line's flags
    weights.unlink()
    with pytest.raises(
        ValueError,
        match=r"no \*\.safetensors or PyTorch \*\.bin weights; pass load_format=\"dummy\" for random",
    ):
        LLM(truncated, device="cpu")


@pytest.mark.parametrize("kwargs", ["enable_thinking", ["enable_thinking"], {1: True}])
def test_chat_template_kwargs_that_are_not_a_dict_of_names_are_named(llm: LLM, kwargs: object) -> None:
    """A string failed as "dictionary update sequence element #0 has length 1; 2 is required", a
    non-string key deep inside the template call."""
    with pytest.raises(ValueError, match="chat_template_kwargs must be a dict of template variable names"):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY, chat_template_kwargs=kwargs)  # type: ignore[arg-type]
    out = llm.chat(
        [{"role": "user", "content": "hi"}], GREEDY, chat_template_kwargs={"enable_thinking": False}
    )
    assert len(out[0].outputs[0].token_ids) == 8


def test_reset_prefix_cache_as_vllm(llm: LLM) -> None:
    """vLLM's ``LLM.reset_prefix_cache()`` raised AttributeError: a repeated prompt hits the cache,
    and after a reset it is computed again."""
    prompt = "Once upon a time there was a little girl named Lily who loved to play in the park"
    llm.generate(prompt, GREEDY)
    assert llm.generate(prompt, GREEDY)[0].num_cached_tokens > 0
    assert llm.reset_prefix_cache() is True
    assert llm.generate(prompt, GREEDY)[0].num_cached_tokens == 0


def test_reset_prefix_cache_takes_vllms_arguments(llm: LLM) -> None:
    """vLLM 0.26's ``reset_prefix_cache(reset_running_requests=..., reset_connector=...)`` was a
    TypeError (unexpected keyword argument): both are taken, and the cache is still reset."""
    prompt = "Once upon a time there was a little girl named Lily who loved to play in the park"
    for kwargs in (
        {"reset_running_requests": True},
        {"reset_running_requests": False, "reset_connector": True},
    ):
        llm.generate(prompt, GREEDY)
        assert llm.generate(prompt, GREEDY)[0].num_cached_tokens > 0
        assert llm.reset_prefix_cache(**kwargs) is True
        assert llm.generate(prompt, GREEDY)[0].num_cached_tokens == 0
    assert llm.reset_prefix_cache(True, False) is True  # vLLM's positional order
    with pytest.raises(TypeError, match="reset_running_requests must be a bool, got 'yes'"):
        llm.reset_prefix_cache(reset_running_requests="yes")  # type: ignore[arg-type]


def test_hf_overrides_with_yarn_serves_past_the_configs_context(llm: LLM) -> None:
    """``LLM(hf_overrides=...)`` as in vLLM: a YaRN ``rope_scaling`` doubles the bundled model's
    512-token context, so a 600-token prompt runs where the plain model refuses it."""
    prompt = {"prompt_token_ids": [1] + [300 + i % 200 for i in range(599)]}
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    with pytest.raises(ValueError, match="512"):
        llm.generate(prompt, params, use_tqdm=False)
    yarn = {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}
    with LLM(device="cpu", hf_overrides=yarn) as long:
        assert long.engine.config.model.max_model_len == 1024
        (out,) = long.generate(prompt, params, use_tqdm=False)
        assert len(out.outputs[0].token_ids) == 4


def test_cache_salt_isolates_prefix_cache_hits(llm: LLM) -> None:
    """vLLM's ``cache_salt`` of a ``TextPrompt`` / ``TokensPrompt`` (refused before): the same
    prompt hits the prefix cache only under the same salt; ``None`` and ``""`` are no salt (as in
    vLLM's offline API); a salt that is not a string is refused."""
    text = "Once upon a time there was a little girl named Lily who loved to play in the park"
    ids = llm.generate(text, GREEDY)[0].prompt_token_ids
    assert len(ids) > llm.engine.block_size  # a full block to share
    llm.reset_prefix_cache()

    def cached(prompt: object) -> int:
        return llm.generate(prompt, GREEDY)[0].num_cached_tokens  # type: ignore[arg-type]

    assert cached({"prompt": text, "cache_salt": "tenant-a"}) == 0
    assert cached({"prompt": text, "cache_salt": "tenant-a"}) > 0
    assert cached({"prompt_token_ids": ids, "cache_salt": "tenant-a"}) > 0  # the same tokens
    assert cached({"prompt_token_ids": ids, "prompt": text, "cache_salt": "tenant-b"}) == 0
    assert cached(text) == 0  # no salt: none of the salted blocks
    assert cached({"prompt": text, "cache_salt": ""}) > 0 and cached({"prompt": text, "cache_salt": None}) > 0
    same = llm.generate([{"prompt": text, "cache_salt": "tenant-c"}] * 2, GREEDY)  # one batch
    assert [o.outputs[0].token_ids for o in same] == [llm.generate(text, GREEDY)[0].outputs[0].token_ids] * 2
    with pytest.raises(ValueError, match="'cache_salt' must be a string, got int"):
        llm.generate({"prompt": text, "cache_salt": 5}, GREEDY)


def test_vllm_generate_and_chat_arguments_that_ask_for_nothing(llm: LLM) -> None:
    """A ported script's ``generate(..., lora_request=None)`` and ``chat(..., lora_request=None,
    chat_template_content_format="string", tokenization_kwargs=...)`` were Python's bare
    "unexpected keyword argument": vLLM's defaults are taken (the same tokens as without them),
    ``chat``'s ``tokenization_kwargs`` encodes the rendered text as vLLM's (here, without a chat
    template, the fallback's BOS goes), and what Surge cannot do is refused by name."""
    messages = [{"role": "user", "content": "hi"}]
    plain = llm.generate("Once upon", GREEDY)[0]
    same = llm.generate("Once upon", GREEDY, lora_request=None, mm_processor_kwargs={})[0]
    assert same.outputs[0].token_ids == plain.outputs[0].token_ids
    assert llm.generate(["Once", "upon"], GREEDY, lora_request=[None, None])[1].outputs[0].token_ids
    chat = llm.chat(messages, GREEDY)[0]
    for content_format in ("auto", "string"):
        again = llm.chat(
            messages,
            GREEDY,
            lora_request=None,
            chat_template_content_format=content_format,
            tokenization_kwargs={"add_special_tokens": True},
            mm_processor_kwargs=None,
        )[0]
        assert again.prompt_token_ids == chat.prompt_token_ids
        assert again.outputs[0].token_ids == chat.outputs[0].token_ids
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert llm.chat(parts, GREEDY, chat_template_content_format="string")[0].prompt == chat.prompt
    bare = llm.chat(messages, GREEDY, tokenization_kwargs={"add_special_tokens": False})[0]
    assert chat.prompt_token_ids[0] == llm.tokenizer.bos_token_id
    assert bare.prompt_token_ids == chat.prompt_token_ids[1:]
    template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"  # writes no BOS
    templated = llm.chat(messages, GREEDY, chat_template=template)[0]
    assert templated.prompt_token_ids[0] != llm.tokenizer.bos_token_id
    with_bos = llm.chat(
        messages, GREEDY, chat_template=template, tokenization_kwargs={"add_special_tokens": True}
    )[0]
    assert with_bos.prompt_token_ids == [llm.tokenizer.bos_token_id, *templated.prompt_token_ids]
    refused = [
        (lambda: llm.generate("Once", GREEDY, lora_request=object()), "lora_request is not supported: Surge"),
        (lambda: llm.chat(messages, GREEDY, lora_request=object()), "lora_request is not supported"),
        (
            lambda: llm.generate("Once", GREEDY, mm_processor_kwargs={"fps": 1}),
            "mm_processor_kwargs is not supported: Surge serves text-only models",
        ),
        (
            lambda: llm.chat(messages, GREEDY, chat_template_content_format="text"),
            "chat_template_content_format must be 'auto', 'string' or 'openai', got 'text'",
        ),
        (
            lambda: llm.chat(messages, GREEDY, tokenization_kwargs={"truncation": True}),
            r"tokenization_kwargs takes only 'add_special_tokens', 'truncate_prompt_tokens' and "
            r"'truncation_side', got \['truncation'\]",
        ),
    ]
    for call, message in refused:
        with pytest.raises(ValueError, match=message):
            call()


def test_output_kind_final_only_gives_the_final_output(llm: LLM) -> None:
    """vLLM's ``SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY)`` (msgspec's "Unexpected
    keyword argument" before): vLLM's LLM runs every request so, and so does Surge's."""
    from surge.sampling_params import RequestOutputKind

    final = msgspec.structs.replace(GREEDY, output_kind=RequestOutputKind.FINAL_ONLY, extra_args=None)
    out = llm.generate("Once upon", final)[0].outputs[0]
    assert out.token_ids == llm.generate("Once upon", GREEDY)[0].outputs[0].token_ids
    assert out.finish_reason == "length" and len(out.token_ids) == 8


def test_disable_custom_all_reduce_contradicting_tp_all_reduce_is_refused() -> None:
    """``LLM(disable_custom_all_reduce=True, tp_all_reduce="auto")`` was taken, the vLLM flag
    silently having no effect; both are named now (NCCL-only ``tp_all_reduce`` agrees with it)."""
    with pytest.raises(ValueError, match=r"disable_custom_all_reduce=True and tp_all_reduce='auto'"):
        LLM(device="cpu", disable_custom_all_reduce=True, tp_all_reduce="auto")


def test_llm_chat_template_is_chats_default(tmp_path: Path) -> None:
    """vLLM's ``LLM(chat_template=...)`` was a TypeError: a template file or its text is read
    and parsed at once, and applies to ``chat`` unless the call gives its own."""
    messages = [{"role": "user", "content": "hi"}]
    template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    other = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    path = tmp_path / "template.jinja"
    path.write_text(template)
    for given in (template, path, str(path)):
        with LLM(device="cpu", chat_template=given) as model:
            assert model.chat_template == template
            assert model.chat(messages, GREEDY)[0].prompt == "hi|"
            assert model.chat(messages, GREEDY, chat_template=other)[0].prompt == "[hi]"
    refused = [
        (
            str(tmp_path / "missing.jinja"),
            r"^chat_template: '.*missing.jinja' is neither a file nor a template",
        ),
        ("{% for m in messages %}", "^chat_template: the template does not parse"),
        (5, "^chat_template must be a template file's path, the template text or None, got int"),
    ]
    for value, match in refused:
        with pytest.raises(ValueError, match=match):
            LLM(device="cpu", chat_template=value)


def test_vllm_world_size_and_mm_cache_calls(llm: LLM) -> None:
    """vLLM's ``get_world_size()`` and ``reset_mm_cache()`` were AttributeErrors: the first is
    the tensor-parallel size (one engine: ``include_dp`` changes nothing), the second has no
    cache to forget in a text-only engine and does nothing."""
    assert llm.get_world_size() == 1 and llm.get_world_size(include_dp=False) == 1
    with pytest.raises(TypeError, match="include_dp must be a bool"):
        llm.get_world_size(include_dp="no")  # type: ignore[arg-type]
    assert llm.reset_mm_cache() is None
    assert llm.generate("Once", GREEDY)[0].outputs[0].token_ids


@pytest.mark.parametrize(
    "name,message",
    [
        ("beam_search", r"no beam search; sample candidates with SamplingParams\(n=k, logprobs=0\)"),
        ("embed", "Surge serves generative models only"),
        ("encode", "Surge serves generative models only"),
        ("classify", "Surge serves generative models only"),
        ("score", "Surge serves generative models only"),
        ("sleep", r"close\(\) it, drop it \(del llm\) and make a new one"),
        ("wake_up", "Surge has no sleep mode"),
        ("start_profile", r"torch.profiler.profile\(\)"),
        ("collective_rpc", "runs no caller's function"),
        ("apply_model", "runs no caller's function"),
        ("update_weights", "make a new LLM on it"),
        ("llm_engine", r"Surge's engine is llm.engine .*llm.engine.config.model.max_model_len"),
        ("set_tokenizer", "copy the tokenizer files into the model folder"),
    ],
)
def test_vllm_members_surge_lacks_say_what_to_use(llm: LLM, name: str, message: str) -> None:
    """vLLM ``LLM`` methods Surge does without gave Python's bare "'LLM' object has no attribute":
    the AttributeError now names vLLM's member, why, and what to use; ``hasattr`` stays False
    (code that probes vLLM's features takes the path without them)."""
    with pytest.raises(
        AttributeError, match=rf"Surge's LLM has no '{name}' \(vLLM's LLM.{name}\): .*{message}"
    ):
        getattr(llm, name)
    assert not hasattr(llm, name)
    with pytest.raises(AttributeError, match="^'LLM' object has no attribute 'no_such_member'$"):
        llm.no_such_member  # type: ignore[attr-defined]  # noqa: B018


def test_vllm_output_fields_surge_has_no_use_for_are_none(llm: LLM) -> None:
    """vLLM's ``RequestOutput.lora_request``, ``encoder_prompt``, ``encoder_prompt_token_ids``,
    ``kv_transfer_params``, ``ec_transfer_params`` and ``CompletionOutput.lora_request`` were
    AttributeErrors for a script that reads or prints them: they are None (no LoRA adapters,
    decoder-only models, no KV connector), as in vLLM for such a request."""
    out = llm.generate("Once", GREEDY)[0]
    for name in (
        "lora_request",
        "encoder_prompt",
        "encoder_prompt_token_ids",
        "kv_transfer_params",
        "ec_transfer_params",
    ):
        assert getattr(out, name) is None, name
    assert out.outputs[0].lora_request is None


def test_enqueue_and_wait_for_completion_as_vllm(llm: LLM) -> None:
    """vLLM 0.26's ``enqueue()`` / ``wait_for_completion()`` were AttributeErrors: prompts of
    several ``enqueue`` calls run together and come back in the order enqueued, with the ids
    ``enqueue`` returned and the outputs ``generate`` gives; nothing stays queued after."""
    prompts = ["Once upon a time", [1, 400, 3], {"prompt": "The cat"}]
    expected = llm.generate(prompts, GREEDY)
    two = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, n=2)
    ids = llm.enqueue(prompts[:2], GREEDY) + llm.enqueue(prompts[2:], [two])
    assert len(set(ids)) == 3
    outs = llm.wait_for_completion()
    assert [o.request_id for o in outs] == ids
    assert [o.prompt_token_ids for o in outs] == [e.prompt_token_ids for e in expected]
    assert [o.outputs[0].text for o in outs[:2]] == [e.outputs[0].text for e in expected[:2]]
    assert [c.index for c in outs[2].outputs] == [0, 1]
    assert outs[2].outputs[0].token_ids == expected[2].outputs[0].token_ids[:4]
    assert llm.wait_for_completion(RequestOutput) == []
    assert llm.wait_for_completion((RequestOutput,)) == []


def test_enqueue_edges(llm: LLM) -> None:
    """A prompt that ``enqueue`` refuses leaves nothing queued; ``generate`` with prompts queued
    is refused (their outputs would be lost) until ``wait_for_completion``; an ``output_type``
    other than ``RequestOutput`` is named."""
    with pytest.raises(ValueError, match="each prompt must be a string"):
        llm.enqueue(["Once", 5], GREEDY)  # type: ignore[list-item]
    assert llm.wait_for_completion() == []
    ids = llm.enqueue("Once upon a time", GREEDY)
    with pytest.raises(
        RuntimeError, match=r"1 prompts were enqueued .* wait_for_completion\(\) before generate\(\)"
    ):
        llm.generate("Once", GREEDY)
    with pytest.raises(RuntimeError, match="wait_for_completion"):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY)
    with pytest.raises(ValueError, match="output_type must be None or RequestOutput"):
        llm.wait_for_completion(dict)
    assert [o.request_id for o in llm.wait_for_completion(use_tqdm=False)] == ids
    assert llm.generate("Once", GREEDY)[0].outputs[0].token_ids


def test_vllm_top_level_names_import(llm: LLM) -> None:
    """``from vllm import TokensPrompt, TextPrompt, RequestOutput, CompletionOutput`` ported as
    ``from surge import ...`` was an ImportError: the prompt dicts build the dicts ``generate``
    takes, and the outputs are of the exported types."""
    import surge
    from surge import CompletionOutput, TextPrompt, TokensPrompt
    from surge import RequestOutput as Exported

    ids = [1, 400, 3]
    assert TokensPrompt(prompt_token_ids=ids) == {"prompt_token_ids": ids}
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=ids, prompt="its text"), TextPrompt(prompt="Once")], GREEDY
    )
    assert outs[0].prompt == "its text" and outs[0].prompt_token_ids == ids and outs[1].prompt == "Once"
    assert all(isinstance(o, Exported) and isinstance(o.outputs[0], CompletionOutput) for o in outs)
    assert {"RequestOutput", "CompletionOutput", "TextPrompt", "TokensPrompt"} <= set(surge.__all__)


def test_chat_content_format_as_vllm(llm: LLM, caplog: pytest.LogCaptureFixture) -> None:
    """``chat_template_content_format="openai"`` was refused and "auto" always passed strings, so
    a template that loops over content parts rendered none of the text: "auto" now detects the
    template's format (logged once per template), "openai" passes the parts, "string" the joined
    text (tests/test_chat_content_format.py has the rules)."""
    from tests.test_chat_content_format import PARTS_TEMPLATE, STRING_TEMPLATE

    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Once"}, {"type": "text", "text": "upon"}]}
    ]
    with caplog.at_level(logging.INFO, logger="surge.llm"):
        auto = llm.chat(messages, GREEDY, chat_template=PARTS_TEMPLATE)[0]
        llm.chat(messages, GREEDY, chat_template=PARTS_TEMPLATE)
    assert auto.prompt == "user:[Once][upon];"
    logged = [r.getMessage() for r in caplog.records if "content format" in r.getMessage()]
    assert logged == [
        "chat template content format: 'openai', detected in the chat template (a message's content "
        "reaches it as a list of text parts; --chat-template-content-format sets another)"
    ]
    forced = llm.chat(messages, GREEDY, chat_template=PARTS_TEMPLATE, chat_template_content_format="openai")[
        0
    ]
    assert (forced.prompt, forced.prompt_token_ids) == (auto.prompt, auto.prompt_token_ids)
    as_string = llm.chat(
        messages, GREEDY, chat_template=PARTS_TEMPLATE, chat_template_content_format="string"
    )
    assert "Once" not in as_string[0].prompt
    plain = llm.chat(messages, GREEDY, chat_template=STRING_TEMPLATE)[0]
    assert plain.prompt == "user:Once\nupon\n"
    ids = llm.enqueue_chat(
        messages, GREEDY, chat_template=PARTS_TEMPLATE, chat_template_content_format="openai"
    )
    assert [o.prompt for o in llm.wait_for_completion() if o.request_id in ids] == [auto.prompt]


def test_enqueue_chat_as_vllm(llm: LLM) -> None:
    """vLLM 0.26's ``enqueue_chat()`` was an AttributeError: conversations are rendered as
    ``chat()`` renders them and run by ``wait_for_completion()`` next to enqueued prompts, each
    output's ``prompt`` the templated text; a bad argument leaves nothing queued."""
    one = [{"role": "user", "content": "hi"}]
    two = [{"role": "user", "content": "tell me a story"}]
    expected = llm.chat([one, two], GREEDY)
    ids = llm.enqueue("Once upon a time", GREEDY) + llm.enqueue_chat([one, two], GREEDY, priority=[0, 0])
    outs = llm.wait_for_completion()
    assert [o.request_id for o in outs] == ids and outs[0].prompt == "Once upon a time"
    assert [(o.prompt, o.prompt_token_ids, o.outputs[0].text) for o in outs[1:]] == [
        (e.prompt, e.prompt_token_ids, e.outputs[0].text) for e in expected
    ]
    with pytest.raises(ValueError, match="chat_template_content_format must be 'auto', 'string' or 'openai'"):
        llm.enqueue_chat(one, GREEDY, chat_template_content_format="parts")
    with pytest.raises(ValueError, match="priority must be one integer per prompt: 1 for 2 prompts"):
        llm.enqueue_chat([one, two], GREEDY, priority=[0])
    assert llm.enqueue_chat([], GREEDY) == [] and llm.wait_for_completion() == []


def test_get_metrics_as_vllm() -> None:
    """vLLM's ``LLM(disable_log_stats=False)`` was a TypeError and ``get_metrics()`` an
    AttributeError: the metrics come back as vLLM's reader objects under vLLM's names, the
    counters grow by what a call did (each of n choices is one request)."""
    from surge.metrics_reader import Counter, Gauge

    with pytest.raises(ValueError, match="disable_log_stats must be true or false, got 'no'"):
        LLM(device="cpu", disable_log_stats="no")
    with LLM(device="cpu", disable_log_stats=False) as model:

        def values() -> dict[tuple[str, str], float]:
            metrics = model.get_metrics()
            assert all(m.labels["model_name"] == str(STORIES) and m.labels["engine"] == "0" for m in metrics)
            gauges = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
            assert all(isinstance(m, Gauge if m.name in gauges else Counter) for m in metrics)
            return {(m.name, m.labels.get("finished_reason", "")): m.value for m in metrics}

        before = values()
        assert before[("vllm:generation_tokens", "")] == 0 and before[("vllm:request_success", "length")] == 0
        prompt = "Once upon a time there was a little girl named Lily who loved to play in the park"
        two = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, n=2)
        out = model.generate(
            [prompt, prompt], [two, SamplingParams(temperature=0.0, max_tokens=3, stop_token_ids=[])]
        )
        after = values()
        reasons = [c.finish_reason for o in out for c in o.outputs]
        assert after[("vllm:generation_tokens", "")] == sum(len(c.token_ids) for o in out for c in o.outputs)
        assert after[("vllm:prompt_tokens", "")] == 3 * len(out[0].prompt_token_ids)
        assert sum(after[("vllm:request_success", r)] for r in ("stop", "length")) == 3
        assert after[("vllm:request_success", "length")] == reasons.count("length")
        assert after[("vllm:prefix_cache_queries", "")] == 3 * len(out[0].prompt_token_ids)
        assert after[("vllm:num_requests_running", "")] == 0 and after[("vllm:num_requests_waiting", "")] == 0
        again = model.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1))[0]
        assert again.num_cached_tokens > 0
        hits = values()[("vllm:prefix_cache_hits", "")] - after[("vllm:prefix_cache_hits", "")]
        assert hits == again.num_cached_tokens
    with LLM(device="cpu", disable_log_stats=True) as model:
        assert model.get_metrics()


def test_seed_minus_one_reaches_the_engine_as_no_seed(llm: LLM) -> None:
    """``seed=-1`` is vLLM's "no seed": the offline ``LLM`` (through ``split_n``) and the
    server's path (``LLMEngine.add_choices``) queue requests without a seed. It was queued as
    seed -1 (and its choices as -1, 0, 1), so every call gave the same text."""
    engine = llm.engine
    params = SamplingParams(temperature=1.0, seed=-1, max_tokens=2)
    llm.enqueue(["Once upon a time"], msgspec.structs.replace(params, n=2))
    engine.add_choices(["s-0", "s-1"], [1, 5, 9], msgspec.structs.replace(params, n=2))
    engine.add_request("s", [1, 5, 9], params)  # one choice added as is keeps its seed
    seeds = {rid: r.sampling_params.seed for rid, r in engine.scheduler.requests.items()}
    assert len(seeds) == 5 and seeds.pop("s") == -1 and set(seeds.values()) == {None}, seeds
    llm.wait_for_completion()
    while engine.has_unfinished_requests():
        engine.step()


def test_output_kind_delta_gives_the_final_output_as_vllms_llm(llm: LLM) -> None:
    """vLLM's ``LLM`` runs every request as FINAL_ONLY (``LLM._add_request`` overwrites the
    kind), so a script passing ``output_kind=RequestOutputKind.DELTA`` gets each request's final
    output; Surge's ``SamplingParams`` refused DELTA, ending such a script."""
    from surge.sampling_params import RequestOutputKind

    prompts = ["Once upon a time", "The dog"]
    plain = SamplingParams(temperature=0.0, max_tokens=12, n=2)
    delta = SamplingParams(temperature=0.0, max_tokens=12, n=2, output_kind=RequestOutputKind.DELTA)
    want = [[(c.text, c.token_ids, c.finish_reason) for c in o.outputs] for o in llm.generate(prompts, plain)]
    got = [[(c.text, c.token_ids, c.finish_reason) for c in o.outputs] for o in llm.generate(prompts, delta)]
    assert got == want and all(len(c[1]) == 12 for o in got for c in o)
    chat = llm.chat([{"role": "user", "content": "Hi"}], delta)[0]
    assert chat.finished and len(chat.outputs[0].token_ids) == 12
