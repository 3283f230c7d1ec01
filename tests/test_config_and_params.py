"""Validation of SamplingParams and the engine config: clear ValueErrors that name the field."""

from __future__ import annotations

import math

import pytest

from surge.config import ModelConfig
from surge.engine.llm_engine import split_n
from surge.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", 2**40),
        ("max_tokens", 2**31),
        ("seed", 2**63),
        ("seed", -(2**63) - 1),
        ("temperature", math.inf),
        ("top_p", math.nan),
        ("presence_penalty", -math.inf),
        ("stop_token_ids", (2**31,)),
        ("n", 0),
        ("min_tokens", 17),
    ],
)
def test_out_of_range_sampling_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_split_n_keeps_seeds_in_range() -> None:
    children = split_n("r", SamplingParams(n=3, seed=2**63 - 2))
    assert [cid for cid, _ in children] == ["r-0", "r-1", "r-2"]
    seeds = [p.seed for _, p in children]
    assert seeds == [2**63 - 2, 2**63 - 1, -(2**63)]
    assert all(p.n == 1 for _, p in children)
    assert split_n("r", SamplingParams(n=1, seed=5)) == [("r", SamplingParams(n=1, seed=5))]


def test_max_model_len_cannot_exceed_the_model() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        ModelConfig.from_pretrained(None, max_model_len=10**6)
    assert ModelConfig.from_pretrained(None).max_model_len == 512


@pytest.mark.parametrize("path", ["/nonexistent/dir", __file__])
def test_bad_model_folder_is_a_value_error(path: str) -> None:
    with pytest.raises(ValueError, match="model"):
        ModelConfig.from_pretrained(path)
