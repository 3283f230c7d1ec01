"""Validation of SamplingParams and the engine config: clear ValueErrors that name the field."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
import pytest

from surge.config import ModelConfig, SchedulerConfig
from surge.engine.llm_engine import split_n
from surge.sampling_params import (
    _FIELD_CHECKS,
    RepetitionDetectionParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
from tests.conftest import QWEN3_8B_DIR


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", 2**40),
        ("max_tokens", 2**31),
        ("seed", 2**63),
        ("seed", -(2**63) - 1),
        ("temperature", math.inf),
        ("temperature", 2.01),  # vLLM 0.26's and OpenAI's bound: [0, 2]
        ("top_p", math.nan),
        ("presence_penalty", -math.inf),
        ("stop_token_ids", (2**31,)),
        ("n", 0),
        ("min_tokens", 17),
        ("repetition_penalty", 1e-300),  # 0 in float32: inf and NaN logits
        ("repetition_penalty", 0.0099),
        ("repetition_penalty", 100.5),
    ],
)
def test_out_of_range_sampling_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


_WRONG_TYPES: list[tuple[str, object]] = [
    # integers: no bool, no float (even integral), no None unless declared
    ("n", 1.5),
    ("n", 2.0),
    ("n", True),
    ("n", None),
    ("max_tokens", True),
    ("max_tokens", 16.0),
    ("max_tokens", "16"),
    ("min_tokens", False),
    ("top_k", True),
    ("top_k", 5.0),
    ("seed", 1.5),
    ("seed", True),
    ("logprobs", False),
    ("logprobs", 1.0),
    ("prompt_logprobs", False),
    ("prompt_logprobs", "5"),
    ("truncate_prompt_tokens", True),
    ("truncate_prompt_tokens", 2.0),
    # floats: int or float, no bool, no None unless declared
    ("temperature", True),
    ("temperature", "0.5"),
    ("top_p", False),
    ("min_p", [0.1]),
    ("presence_penalty", None),
    ("frequency_penalty", True),
    ("repetition_penalty", True),
    # bools
    ("ignore_eos", 1),
    ("include_stop_str_in_output", None),
    ("detokenize", 1),
    ("skip_special_tokens", "yes"),
    ("spaces_between_special_tokens", 0),
    # sequences
    ("stop", [1]),
    ("stop", b"x"),
    ("stop_token_ids", 5),
    ("stop_token_ids", [True]),
    ("stop_token_ids", (1.0,)),
    ("allowed_token_ids", [1, 2.5]),
    ("allowed_token_ids", {1, 2}),
    ("bad_words", [None]),
    ("bad_words_token_ids", [1, 2]),
    ("bad_words_token_ids", [[1, False]]),
    ("logit_bias", {"5": 1.0}),
    ("logit_bias", {True: 1.0}),
    ("logit_bias", {5: "1"}),
    ("logit_bias", [(5, 1.0)]),
    ("structured_outputs", {"regex": "a"}),
    ("model_default_fields", "temperature"),
    ("model_default_fields", ("temperature", "seed")),
    ("output_kind", 2),
    ("output_kind", "FINAL_ONLY"),
    ("extra_args", []),
    ("extra_args", {"my_plugin": 1}),
    ("skip_clone", 1),
    ("thinking_token_budget", True),
    ("thinking_token_budget", -1.0),
    ("thinking_token_budget", "5"),
    ("repetition_detection", 5),
    ("logprob_token_ids", [5, 7.0]),
    ("logprob_token_ids", 5),
    ("skip_reading_prefix_cache", True),
    ("skip_reading_prefix_cache", False),
    ("flat_logprobs", True),
    ("flat_logprobs", 0),
    ("flat_logprobs", None),
]


def test_vllm_fields_that_ask_for_nothing_are_taken() -> None:
    """vLLM 0.26's skip_clone (a hint), thinking_token_budget=-1 (unlimited) and the empty or
    None values of the others are taken, normalized to Surge's defaults."""
    p = SamplingParams(
        skip_clone=True,
        thinking_token_budget=-1,
        repetition_detection=None,
        logprob_token_ids=[],
        skip_reading_prefix_cache=None,
        flat_logprobs=False,
    )
    assert p.skip_clone is True
    assert p.flat_logprobs is False
    assert p.thinking_token_budget is None
    assert p.logprob_token_ids is None
    assert p.skip_reading_prefix_cache is None
    assert SamplingParams(thinking_token_budget=None).thinking_token_budget is None


@pytest.mark.parametrize(
    ("field", "value", "advice"),
    [
        ("skip_reading_prefix_cache", True, "enable_prefix_caching=False"),
        ("flat_logprobs", True, "list of dicts"),
    ],
)
def test_vllm_fields_that_ask_for_more_say_what_to_use(field: str, value: object, advice: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be (None|False)") as e:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert advice in str(e.value)


def _repeats_reference(tokens: list[int], max_size: int, min_size: int, count: int) -> bool:
    """The definition, spelled out: some pattern length L in [max(1, min_size), max_size] whose
    last L * count tokens are count copies of the last L."""
    for size in range(max(1, min_size), max_size + 1):
        if size * count <= len(tokens) and tokens[len(tokens) - size * count :] == tokens[-size:] * count:
            return True
    return False


def test_repetition_detection_matches_its_definition() -> None:
    rng = np.random.default_rng(0)
    hits = 0
    for trial in range(3000):
        max_size = int(rng.integers(1, 7))
        min_size = int(rng.integers(0, max_size + 1))
        count = int(rng.integers(2, 5))
        # few distinct tokens and pasted patterns, so that repeats are common
        tokens = [int(t) for t in rng.integers(0, 3, size=int(rng.integers(0, 12)))]
        if trial % 2:
            tokens += [int(t) for t in rng.integers(0, 3, size=int(rng.integers(1, 5)))] * count
        params = RepetitionDetectionParams(
            max_pattern_size=max_size, min_pattern_size=min_size, min_count=count
        )
        expected = _repeats_reference(tokens, max_size, min_size, count)
        assert params.detects(tokens) == expected, (tokens, params)
        hits += expected
    assert 300 < hits < 2700  # both outcomes exercised


def test_repetition_detection_fields_and_vllm_checks() -> None:
    p = SamplingParams(repetition_detection={"max_pattern_size": 8, "min_pattern_size": 2, "min_count": 3})
    assert p.repetition_detection == RepetitionDetectionParams(
        max_pattern_size=8, min_pattern_size=2, min_count=3
    )
    # vLLM's "disabled" form is None; it survives the engine's msgpack boundary
    assert SamplingParams(repetition_detection=RepetitionDetectionParams()).repetition_detection is None
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams)
    assert wire.repetition_detection == p.repetition_detection
    for bad, match in [
        ({"max_pattern_size": -1}, "must be >= 0"),
        (
            {"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2},
            "min_pattern_size <= max_pattern_size",
        ),
        ({"max_pattern_size": 2, "min_count": 1}, "min_count must be at least 2"),
        ({"max_pattern_size": 2**31, "min_count": 2}, "at most"),
        (
            {"max_pattern_size": 257, "min_count": 2},
            r"^repetition_detection.max_pattern_size must be at most 256",
        ),
        ({"max_pattern_size": 4}, r"^repetition_detection.min_count must be at least 2"),
        ({"max_pattern_size": 4, "min_count": 3.0}, r"^repetition_detection.min_count must be an integer"),
        (
            {"max_pattern_size": True, "min_count": 3},
            r"^repetition_detection.max_pattern_size must be an integer",
        ),
        ({"max_pattern_size": 4, "min_count": 3, "window": 9}, r"unknown keys \['window'\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            SamplingParams(repetition_detection=bad)


def test_logprob_token_ids_checks_and_count() -> None:
    """vLLM 0.26's logprob_token_ids: a tuple of ids counted by num_logprobs; logprobs, when set
    too, must equal their number; at most 128, each a token id."""
    p = SamplingParams(logprob_token_ids=[5, 7])
    assert p.logprob_token_ids == (5, 7) and p.num_logprobs == 2 and p.logprobs is None
    assert SamplingParams(logprobs=3).num_logprobs == 3 and SamplingParams().num_logprobs is None
    assert SamplingParams(logprobs=2, logprob_token_ids=(5, 7)).num_logprobs == 2
    assert SamplingParams(logprob_token_ids=[]).logprob_token_ids is None
    with pytest.raises(ValueError, match="must equal their number"):
        SamplingParams(logprobs=1, logprob_token_ids=[5, 7])
    with pytest.raises(ValueError, match="at most 128"):
        SamplingParams(logprob_token_ids=list(range(129)))
    with pytest.raises(ValueError, match="^logprob_token_ids must"):
        SamplingParams(logprob_token_ids=[-1])
    assert SamplingParams(logprob_token_ids=[5, 60]).token_ids_in_vocab(50) == "logprob_token_ids"


def test_thinking_token_budget_is_a_count_or_minus_one() -> None:
    """vLLM 0.26's ``thinking_token_budget`` (was refused unless None/-1): a count >= 0 is kept
    (the engine forces the reasoning end once it is spent), -1 is unlimited (None), below -1
    is refused by name; it crosses the process boundary as it is."""
    for budget in (0, 1, 100, np.int64(7)):
        p = SamplingParams(thinking_token_budget=budget)  # type: ignore[arg-type]
        assert p.thinking_token_budget == budget and type(p.thinking_token_budget) is int
        assert p.needs_previous_token and not p.needs_token_history  # the last token, not all
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p
    assert SamplingParams(thinking_token_budget=-1).thinking_token_budget is None
    assert not SamplingParams(thinking_token_budget=-1).needs_previous_token
    with pytest.raises(ValueError, match=r"^thinking_token_budget must be a non-negative integer or -1"):
        SamplingParams(thinking_token_budget=-2)


def test_assignment_is_checked_as_construction() -> None:
    """vLLM scripts assign (``sp = llm.get_default_sampling_params(); sp.max_tokens = 256``): an
    assignment is checked and normalized as on construction, a bad one leaves the params as they
    were, a model-default field set explicitly stops taking the model's default (None asks for
    it again), and an unknown name is an AttributeError."""
    p = SamplingParams()
    p.max_tokens = 256
    p.stop_token_ids = [5, np.int64(7)]  # type: ignore[assignment]
    assert p.max_tokens == 256 and p.stop_token_ids == (5, 7)
    assert "temperature" in p.model_default_fields
    p.temperature = 0.5
    assert p.temperature == 0.5 and "temperature" not in p.model_default_fields
    p.temperature = None  # type: ignore[assignment]
    assert "temperature" in p.model_default_fields and p.temperature == 1.0
    before = msgspec.structs.asdict(p)
    for name, bad in (("top_p", 2.0), ("max_tokens", -1), ("min_tokens", 300), ("n", True)):
        with pytest.raises(ValueError, match=name):
            setattr(p, name, bad)
        assert msgspec.structs.asdict(p) == before, name
    with pytest.raises(AttributeError, match="no field 'max_new_tokens'"):
        p.max_new_tokens = 5  # type: ignore[attr-defined]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p


def test_every_field_has_a_type_check() -> None:
    assert tuple(_FIELD_CHECKS) == SamplingParams.__struct_fields__
    assert {name for name, _ in _WRONG_TYPES} == set(SamplingParams.__struct_fields__)


@pytest.mark.parametrize(("field", "value"), _WRONG_TYPES)
def test_wrong_types_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be "):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_logprobs_true_is_one_as_in_vllm() -> None:
    """vLLM's ``SamplingParams.__post_init__`` reads ``logprobs=True`` and ``prompt_logprobs=True``
    as 1 (a script's ``SamplingParams(logprobs=True)``, which was a ValueError here); ``False``,
    which vLLM keeps and treats as 0 (logprobs returned), is refused, naming what to use."""
    p = SamplingParams(logprobs=True, prompt_logprobs=True)
    assert (p.logprobs, p.prompt_logprobs) == (1, 1)
    assert type(p.logprobs) is int and type(p.prompt_logprobs) is int
    assert p == SamplingParams(logprobs=1, prompt_logprobs=1)
    p.logprobs = True  # vLLM-style assignment, checked as on construction
    assert p.logprobs == 1 and type(p.logprobs) is int
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=rf"^{field} must be an integer or None, got bool False: None "):
            SamplingParams(**{field: False})


def test_from_optional_as_vllms() -> None:
    """vLLM's ``SamplingParams.from_optional`` (scripts pass their optional arguments through it)
    was an AttributeError: None is vLLM's default for the sampling knobs, every value is explicit
    (no model default replaces it, as in vLLM), ``logit_bias`` takes integer-string keys and
    clamps each bias to [-100, 100]."""
    p = SamplingParams.from_optional(temperature=None, top_p=None, top_k=None, n=None, max_tokens=5, stop="x")
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty) == (1, 1.0, 1.0, 0, 0.0, 1.0)
    assert (p.max_tokens, p.stop, p.model_default_fields) == (5, ("x",), ())
    assert p.with_model_defaults({"temperature": 0.6, "top_k": 20}) == p
    assert SamplingParams.from_optional(max_tokens=None).max_tokens is None
    assert SamplingParams.from_optional(temperature=0.5, seed=3) == SamplingParams(
        temperature=0.5, seed=3, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0
    )
    bias = SamplingParams.from_optional(logit_bias={"50": 200, 7: -1e9, np.int64(9): 1}).logit_bias
    assert bias == {50: 100.0, 7: -100.0, 9: 1.0} and [type(k) for k in bias] == [int] * 3
    with pytest.raises(ValueError, match=r"^logit_bias keys must be integer token ids, got str 'a'"):
        SamplingParams.from_optional(logit_bias={"a": 1.0})
    with pytest.raises(ValueError, match=r"^temperature must be in \[0, 2\]"):
        SamplingParams.from_optional(temperature=-1.0)
    with pytest.raises(TypeError, match="foo"):
        SamplingParams.from_optional(foo=1)


def test_vllm_output_kind_and_extra_args() -> None:
    """``SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, extra_args={})`` of a ported
    script was msgspec's "Unexpected keyword argument": the kinds that give the final output are
    taken (DELTA too, as vLLM's ``LLM`` runs every request as FINAL_ONLY), and an empty
    ``extra_args`` is None; plugin arguments are refused by name."""
    assert SamplingParams().output_kind is RequestOutputKind.CUMULATIVE
    final = SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, extra_args={})
    assert final.output_kind is RequestOutputKind.FINAL_ONLY and final.extra_args is None
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(final), type=SamplingParams) == final
    assert SamplingParams(output_kind=RequestOutputKind.DELTA).output_kind is RequestOutputKind.DELTA
    with pytest.raises(ValueError, match=r"extra_args must be None or empty: .* \(got keys \['a'\]\)"):
        SamplingParams(extra_args={"a": 1})


@pytest.mark.parametrize(
    ("field", "value"),
    [("json_object", 1), ("reasoning_end_token_id", True), ("reasoning_end_token_id", -1)],
)
def test_structured_outputs_wrong_types_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^structured_outputs\.{field} must be "):
        StructuredOutputsParams(regex="a", **{field: value})  # type: ignore[arg-type]


def test_accepted_values_are_normalized_to_the_declared_types() -> None:
    p = SamplingParams(
        n=np.int64(2),
        max_tokens=np.int32(8),
        seed=np.uint8(3),
        top_k=-1,
        temperature=1,
        top_p=np.float32(0.5),
        presence_penalty=1,
        stop="x",
        stop_token_ids=[np.int64(7)],
        allowed_token_ids=[1, 2],
        bad_words=["a"],
        bad_words_token_ids=[[1, 2]],
        logit_bias={np.int64(3): 1},
        logprobs=np.int16(2),
        structured_outputs=StructuredOutputsParams(regex="a", reasoning_end_token_id=np.int64(4)),
    )
    for name in ("n", "max_tokens", "seed", "top_k", "logprobs"):
        assert type(getattr(p, name)) is int, name
    for name in ("temperature", "top_p", "presence_penalty", "min_p", "repetition_penalty"):
        assert type(getattr(p, name)) is float, name
    assert (p.n, p.max_tokens, p.seed, p.top_k, p.logprobs) == (2, 8, 3, 0, 2)
    assert p.stop == ("x",) and p.stop_token_ids == (7,) and type(p.stop_token_ids[0]) is int
    assert p.allowed_token_ids == (1, 2) and p.bad_words == ("a",) and p.bad_words_token_ids == ((1, 2),)
    assert p.logit_bias == {3: 1.0} and [type(k) for k in p.logit_bias] == [int]
    assert type(p.structured_outputs.reasoning_end_token_id) is int  # type: ignore[union-attr]
    assert p.model_default_fields == ("min_p", "repetition_penalty")
    # What the engine sends to its workers (tensor parallelism) decodes back unchanged.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p


def test_split_n_keeps_seeds_in_range() -> None:
    children = split_n("r", SamplingParams(n=3, seed=2**63 - 2))
    assert [cid for cid, _ in children] == ["r-0", "r-1", "r-2"]
    seeds = [p.seed for _, p in children]
    assert seeds == [2**63 - 2, 2**63 - 1, -(2**63)]
    assert all(p.n == 1 for _, p in children)
    assert split_n("r", SamplingParams(n=1, seed=5)) == [("r", SamplingParams(n=1, seed=5))]


def test_seed_minus_one_is_no_seed_as_in_vllm() -> None:
    """A request's seed -1 is vLLM's "no seed" (its SamplingParams turns -1 into None): each
    choice draws fresh random numbers. It was a seed like any other, so a client sending -1 for
    "random" (as vLLM reads it) got the same text on every request. A choice's ``seed + i``
    that lands on -1 stays a seed."""
    assert [p.seed for _, p in split_n("r", SamplingParams(seed=-1, temperature=1.0))] == [None]
    assert [p.seed for _, p in split_n("r", SamplingParams(n=3, seed=-1))] == [None, None, None]
    assert [p.seed for _, p in split_n("r", SamplingParams(n=3, seed=-2))] == [-2, -1, 0]
    assert [p.seed for _, p in split_n("r", SamplingParams(n=2, seed=0))] == [0, 1]


def test_temperature_two_is_the_largest_accepted() -> None:
    assert SamplingParams(temperature=2.0).temperature == 2.0
    with pytest.raises(ValueError, match=r"^temperature must be in \[0, 2\], got 2.5"):
        SamplingParams(temperature=2.5)


def test_split_n_children_share_the_parents_checked_fields() -> None:
    """Children are not checked again: with 256 long bad words and n=128 that took 2 s on the
    API's event loop. Each equals the parent checked anew with n=1 and its seed."""
    words = tuple(tuple(range(i, i + 400)) for i in range(512))
    parent = SamplingParams(n=4, seed=7, bad_words_token_ids=words, stop=("x",), logit_bias={3: 1.0})
    for i, (_, child) in enumerate(split_n("r", parent)):
        assert child.bad_words_token_ids is parent.bad_words_token_ids
        assert child == msgspec.structs.replace(parent, n=1, seed=7 + i)
    assert parent.n == 4 and parent.seed == 7


def test_max_model_len_cannot_exceed_the_model() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        ModelConfig.from_pretrained(None, max_model_len=10**6)
    assert ModelConfig.from_pretrained(None).max_model_len == 512


@pytest.mark.parametrize("path", ["/nonexistent/dir", __file__])
def test_bad_model_folder_is_a_value_error(path: str) -> None:
    with pytest.raises(ValueError, match="model"):
        ModelConfig.from_pretrained(path)


def test_a_number_beyond_float_range_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"^temperature must be a number within float range"):
        SamplingParams(temperature=10**400)


def test_long_exact_type_lists_take_the_fast_path_with_the_same_result() -> None:
    ids = list(range(100_000))
    p = SamplingParams(allowed_token_ids=ids, bad_words_token_ids=[ids[:3]], logit_bias={5: 1.5, 6: -2.0})
    assert p.allowed_token_ids == tuple(ids) and p.bad_words_token_ids == ((0, 1, 2),)
    assert p.logit_bias == {5: 1.5, 6: -2.0}
    with pytest.raises(ValueError, match=r"^allowed_token_ids must be "):
        SamplingParams(allowed_token_ids=[*ids, True])


def test_a_token_budget_no_step_can_use_is_lowered() -> None:
    """``max_num_batched_tokens`` above ``max_num_seqs x max_model_len`` is lowered to it (a huge
    value was allocated by the start-up profile until the kernel killed the engine); below, kept."""
    from surge.engine.llm_engine import build_engine_config

    huge = build_engine_config(None, max_num_batched_tokens=10**9, device="cpu")
    sc = huge.scheduler
    assert sc.max_num_batched_tokens == sc.max_num_seqs * sc.max_model_len
    small = build_engine_config(None, max_num_seqs=2, max_num_batched_tokens=300, device="cpu")
    assert small.scheduler.max_num_batched_tokens == 300


BUDGET_BELOW_SEQS = r"^max_num_batched_tokens \(16\) must be greater than or equal to max_num_seqs \(32\)\.$"


def test_a_token_budget_below_max_num_seqs_is_refused_as_vllm_does() -> None:
    """``max_num_batched_tokens`` below ``max_num_seqs`` is refused with vLLM's words (it was taken,
    and the budget then capped the running requests); ``build_engine_config`` and ``LLM()``, whose
    errors are the CLI's one line, refuse it before the model loads."""
    from surge.engine.llm import LLM
    from surge.engine.llm_engine import build_engine_config

    with pytest.raises(ValueError, match=BUDGET_BELOW_SEQS):
        SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match=BUDGET_BELOW_SEQS):
        build_engine_config(None, max_num_seqs=32, max_num_batched_tokens=16, device="cpu")
    with pytest.raises(ValueError, match=BUDGET_BELOW_SEQS):
        LLM(device="cpu", max_num_seqs=32, max_num_batched_tokens=16)
    # max_num_seqs given, the budget left to its default (8192): refused, as vLLM's
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8192\) .* max_num_seqs \(10000\)"):
        build_engine_config(None, max_num_seqs=10_000, device="cpu")
    assert SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=16).max_num_batched_tokens == 16


def test_max_num_seqs_left_out_is_derived_from_a_smaller_budget() -> None:
    """``max_num_seqs`` left out is 256, or the budget when that is lower (vLLM's derived default),
    so a small budget alone is taken; the defaults, and a budget lowered to ``max_num_seqs x
    max_model_len`` on a short context, pass the check."""
    from surge.engine.llm_engine import build_engine_config

    sc = build_engine_config(None, max_num_batched_tokens=16, device="cpu").scheduler
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (16, 16)
    sc = build_engine_config(None, device="cpu").scheduler
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (256, 8192)
    sc = build_engine_config(None, max_num_seqs=None, max_num_batched_tokens=None, device="cpu").scheduler
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (256, 8192)
    sc = build_engine_config(None, max_model_len=2, device="cpu").scheduler
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (256, 512)
    with pytest.raises(ValueError, match=r"^max_num_batched_tokens must be positive, got 0$"):
        build_engine_config(None, max_num_batched_tokens=0, device="cpu")  # the flag given is named


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("num_attention_heads", 0, "num_attention_heads must be a positive integer, got 0"),
        ("num_hidden_layers", "five", "num_hidden_layers must be a positive integer, got 'five'"),
        ("hidden_size", None, "lacks hidden_size"),
        ("vocab_size", True, "vocab_size must be a positive integer"),
        # float() at model build: "could not convert string to float: 'x'", naming no field
        ("rms_norm_eps", "x", r"config\.json: rms_norm_eps must be a positive number, got 'x'"),
        ("rms_norm_eps", 0, "rms_norm_eps must be a positive number, got 0"),
        # bool() in the models: the string "false" tied the LM head to the embedding
        ("tie_word_embeddings", "false", "tie_word_embeddings must be true or false, got 'false'"),
        ("mlp_bias", 1, "mlp_bias must be true or false, got 1"),
        # another activation ran as SiLU, silently wrong (vLLM refuses it too)
        ("hidden_act", "gelu", r"hidden_act 'gelu' is not supported \(the MLP Surge runs is SiLU-gated"),
    ],
)
def test_config_fields_are_named_when_invalid(tmp_path: Any, field: str, value: Any, words: str) -> None:
    """A bad config.json field is named (a zero head count was blamed on the tokenizer, a string
    layer count said only "invalid literal for int()")."""
    import json
    import shutil

    from surge.config import DEFAULT_MODEL_DIR

    folder = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    cfg = json.loads((folder / "config.json").read_text())
    if value is None:
        cfg.pop(field)
    else:
        cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words):
        ModelConfig.from_pretrained(str(folder))


@pytest.mark.parametrize("act", ["silu", "swish", None])
def test_silu_hidden_acts_are_taken(tmp_path: Any, act: str | None) -> None:
    """``silu``, transformers' ``swish`` (the same function) and no ``hidden_act`` (its default)."""
    import json
    import shutil

    from surge.config import DEFAULT_MODEL_DIR

    folder = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("hidden_act")
    if act is not None:
        cfg["hidden_act"] = act
    (folder / "config.json").write_text(json.dumps(cfg))
    assert ModelConfig.from_pretrained(str(folder)).architecture == "LlamaForCausalLM"


def test_an_unsupported_architecture_is_named_before_missing_fields(tmp_path: Any) -> None:
    """A folder of another kind of model (a Mamba config has no attention heads) is refused for
    its architecture, not with "lacks num_attention_heads", which sent its user to fix the config."""
    import json

    folder = tmp_path / "mamba"
    folder.mkdir()
    cfg = {"architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 64, "vocab_size": 100}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ValueError, match=r"architecture 'MambaForCausalLM' is not supported \(supported: Llama"
    ):
        ModelConfig.from_pretrained(str(folder))


@pytest.mark.parametrize(
    ("key", "name"), [("torch_dtype", "int8"), ("torch_dtype", "float64"), ("dtype", "int8")]
)
def test_a_config_dtype_surge_does_not_compute_in_is_warned_of(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, key: str, name: str
) -> None:
    """``torch_dtype`` (or the newer ``dtype``) int8 or float64 in config.json runs in float32, as
    before, with a warning that names the value and ``--dtype`` (it became float32 silently); a
    supported one, or vLLM's alias "half", warns of nothing."""
    import json
    import logging
    import shutil

    from surge.config import DEFAULT_MODEL_DIR

    folder = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("torch_dtype", None)
    cfg.pop("dtype", None)
    (folder / "config.json").write_text(json.dumps(cfg | {key: name}))
    with caplog.at_level(logging.WARNING, logger="surge.config"):
        assert ModelConfig.from_pretrained(str(folder)).dtype == "float32"
    assert f"gives the dtype '{name}', which Surge does not compute in" in caplog.text
    assert "--dtype sets another" in caplog.text
    for given, expected in (("bfloat16", "bfloat16"), ("half", "float16")):
        caplog.clear()
        (folder / "config.json").write_text(json.dumps(cfg | {key: given}))
        with caplog.at_level(logging.WARNING, logger="surge.config"):
            assert ModelConfig.from_pretrained(str(folder)).dtype == expected
        assert caplog.text == ""


def test_auto_dtype_serves_a_float32_checkpoint_in_bfloat16_on_a_gpu(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's ``--dtype auto`` downcasts a float32 config (or one with no dtype) to bfloat16; Surge
    does on CUDA (a float32 fine-tune of an 8B model took twice the GPU memory), keeps float32 on
    CPU, and serves float16 / bfloat16 configs as they are everywhere; ``--dtype float32`` wins.
    build_engine_config passes the resolved device on."""
    import json
    import shutil

    import torch

    import surge.engine.llm_engine as llm_engine
    from surge.config import DEFAULT_MODEL_DIR

    folder = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["torch_dtype"] == "float32"
    assert ModelConfig.from_pretrained(folder).dtype == "float32"
    assert ModelConfig.from_pretrained(folder, device="cuda").dtype == "bfloat16"
    assert ModelConfig.from_pretrained(folder, device="cuda:1", dtype="float32").dtype == "float32"
    for config, expected in (
        ({k: v for k, v in cfg.items() if k != "torch_dtype"}, "bfloat16"),
        (cfg | {"torch_dtype": "float16"}, "float16"),
        ({k: v for k, v in cfg.items() if k != "torch_dtype"} | {"dtype": "bfloat16"}, "bfloat16"),
    ):
        (folder / "config.json").write_text(json.dumps(config))
        assert ModelConfig.from_pretrained(folder, device="cuda").dtype == expected
    (folder / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(llm_engine, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # the visible-GPU check's count
    assert llm_engine.build_engine_config(str(folder), device="auto").model.dtype == "bfloat16"
    # surge bench roofline counts what surge serve holds on the GPU
    from surge.bench.roofline import model_shape

    assert model_shape(cfg).weight_bytes == model_shape(cfg, dtype="bfloat16").weight_bytes


def test_kv_cache_dtype_takes_vllms_e4m3_name() -> None:
    """vLLM's ``fp8_e4m3`` is Surge's ``fp8`` (its FP8 cache is e4m3); ``fp8_e5m2`` is refused with
    the names it takes (``--kv-cache-dtype fp8_e4m3`` was an invalid choice)."""
    import argparse

    from surge.config import CacheConfig
    from surge.engine.cli_args import add_load_args

    assert CacheConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8"
    with pytest.raises(ValueError, match=r"one of auto, fp8, fp8_e4m3 \(fp8 is e4m3\), got 'fp8_e5m2'"):
        CacheConfig(kv_cache_dtype="fp8_e5m2")
    p = argparse.ArgumentParser()
    add_load_args(p)
    assert p.parse_args(["--kv-cache-dtype", "fp8_e4m3"]).kv_cache_dtype == "fp8_e4m3"


QWEN3_YARN = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}


def test_yarn_rope_scaling_extends_the_context_as_in_vllm() -> None:
    """Qwen3's documented long-context mode (``--hf-overrides`` with a YaRN ``rope_scaling``): the
    default and largest ``max_model_len`` become original x factor (131,072 for Qwen3-8B, whose
    config says 40,960), as vLLM derives it; it used to be refused as an unsupported rope type."""
    plain = ModelConfig.from_pretrained(QWEN3_8B_DIR, load_format="dummy")
    assert plain.max_model_len == 40_960
    yarn = ModelConfig.from_pretrained(QWEN3_8B_DIR, load_format="dummy", hf_overrides=QWEN3_YARN)
    assert yarn.max_model_len == 131_072
    assert yarn.hf_config["rope_scaling"]["rope_type"] == "yarn"
    assert yarn.hf_config["num_hidden_layers"] == plain.num_hidden_layers  # the other keys kept
    with pytest.raises(
        ValueError,
        match=r"max_model_len \(131073\) exceeds the model's maximum \(131072: "
        r"original_max_position_embeddings 32768 x yarn factor 4\)",
    ):
        ModelConfig.from_pretrained(
            QWEN3_8B_DIR, load_format="dummy", hf_overrides=QWEN3_YARN, max_model_len=131_073
        )
    linear = {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert (
        ModelConfig.from_pretrained(QWEN3_8B_DIR, load_format="dummy", hf_overrides=linear).max_model_len
        == 81_920
    )
    flat = {"max_position_embeddings": 1024}  # a flat override replaces the key as it is
    assert (
        ModelConfig.from_pretrained(QWEN3_8B_DIR, load_format="dummy", hf_overrides=flat).max_model_len
        == 1024
    )


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": -4}}, "factor must be positive"),
        ([("rope_theta", 1.0)], "hf_overrides must be a JSON object"),
        ([], r"hf_overrides must be a JSON object, got \[\]"),  # was taken: an empty list is falsy
        (
            lambda config: config,
            "hf_overrides must be a dict of config.json keys .* pass the keys it sets as a dict",
        ),
    ],
)
def test_bad_rope_settings_and_overrides_are_named(overrides: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ModelConfig.from_pretrained(QWEN3_8B_DIR, load_format="dummy", hf_overrides=overrides)


def test_a_derived_context_past_int32_needs_an_explicit_max_model_len() -> None:
    """Surge's positions are int32: a context a scaling derives past 2**31 - 1 tokens is refused
    as the default ``max_model_len`` (it built a rotary table that long, or raised OverflowError),
    while an explicit, smaller ``max_model_len`` still runs the scaled model."""
    huge = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1e30}}
    with pytest.raises(ValueError, match=r"exceeds 2,147,483,647, the longest Surge runs"):
        ModelConfig.from_pretrained(QWEN3_8B_DIR, load_format="dummy", hf_overrides=huge)
    assert (
        ModelConfig.from_pretrained(
            QWEN3_8B_DIR, load_format="dummy", hf_overrides=huge, max_model_len=4096
        ).max_model_len
        == 4096
    )
    with pytest.raises(ValueError, match=r"max_model_len \(2,147,483,648\) exceeds 2,147,483,647"):
        ModelConfig.from_pretrained(QWEN3_8B_DIR, load_format="dummy", hf_overrides=huge, max_model_len=2**31)
    with pytest.raises(ValueError, match="x factor is not a finite number of tokens"):
        ModelConfig.from_pretrained(
            QWEN3_8B_DIR,
            load_format="dummy",
            hf_overrides={"rope_scaling": {"rope_type": "linear", "factor": 1e308}},
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": 2**63}, "seed must be in [-2**63, 2**63), got 9223372036854775808"),
        ({"n": 0}, "n must be at least 1, got 0"),
        ({"n": 10**6}, "n must be at most 65536, got 1000000"),
        ({"max_tokens": -1}, "max_tokens must be non-negative, got -1"),
        ({"min_tokens": -1}, "min_tokens must be non-negative, got -1"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens (5) must not exceed max_tokens (4)"),
        ({"temperature": 2.5}, "temperature must be in [0, 2], got 2.5"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_k": -2}, "top_k must be -1, 0 (disabled) or positive, got -2"),
        ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5"),
        ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2], got 2.5"),
        ({"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2], got -2.5"),
        ({"repetition_penalty": 0.001}, "repetition_penalty must be in [0.01, 100], got 0.001"),
        ({"stop": ["a", ""]}, "stop must not contain an empty string"),
        (
            {"detokenize": False, "stop": ["x"]},
            "stop strings need the decoded text: leave detokenize at True to use stop",
        ),
        ({"logprobs": -1}, "logprobs must be in [0, 20], got -1"),
        ({"prompt_logprobs": 10**6}, "prompt_logprobs must be in [0, 20], got 1000000"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens must be -1 or in [1, 2147483647], got 0"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must be in [0, 2147483647]"),
        (
            {"logit_bias": {5: 101.0}},
            "logit_bias must map token ids in [0, 2147483647] to values in [-100, 100]",
        ),
        (
            {"allowed_token_ids": []},
            "allowed_token_ids must be a non-empty list of token ids in [0, 2147483647]",
        ),
        (
            {"logprob_token_ids": list(range(10**4))},
            "logprob_token_ids must list at most 128 token ids in [0, 2147483647]",
        ),
        (
            {"logprob_token_ids": [1, 2], "logprobs": 3},
            "logprob_token_ids: when logprobs is set too it must equal their number, got logprobs=3 and 2 ids",
        ),
        ({"bad_words": ["ok", "  "]}, "bad_words must not contain an empty word"),
        (
            {"bad_words_token_ids": [[]]},
            "bad_words_token_ids must be non-empty sequences of token ids in [0, 2147483647]",
        ),
        (
            {"n": 0, "temperature": 2.5, "stop": [""]},
            "n must be at least 1, got 0",
        ),  # the first check that fails
        ({"max_tokens": -1, "min_tokens": 3}, "max_tokens must be non-negative, got -1"),
    ],
)
def test_each_range_check_fails_with_its_message(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert str(err.value) == message


def test_valid_params_format_no_error_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request builds a SamplingParams: a check's message is formatted only when it fails
    (formatting all of them cost half of the construction)."""
    import surge.sampling_params as sp

    class Unformattable(int):
        def __format__(self, spec: str) -> str:
            raise AssertionError("an error message was formatted")

    monkeypatch.setattr(sp, "_INT32_MAX", Unformattable(sp._INT32_MAX))
    monkeypatch.setattr(sp, "MAX_LOGPROBS", Unformattable(sp.MAX_LOGPROBS))
    monkeypatch.setattr(sp, "MAX_N", Unformattable(sp.MAX_N))
    p = SamplingParams(n=2, max_tokens=256, stop=["x"], logprobs=3, stop_token_ids=[7], seed=5)
    assert (p.n, p.max_tokens, p.stop, p.logprobs) == (2, 256, ("x",), 3)
    with pytest.raises(AssertionError, match="formatted"):
        SamplingParams(n=10**6)  # a failing check does format its message
