"""``LogprobOptions.engine_params``: the logprobs fields a chat or completions request asks the
engine for (no server)."""

from __future__ import annotations

from surge.sampling_params import SamplingParams
from surge.server.logprobs import LogprobOptions


def test_no_logprobs_leaves_the_params_as_they_are() -> None:
    params = SamplingParams(max_tokens=4)
    assert LogprobOptions().engine_params(params) is params


def test_top_k_and_prompt_rows() -> None:
    out = LogprobOptions(logprobs=3, prompt_logprobs=1).engine_params(SamplingParams(max_tokens=4))
    assert (out.logprobs, out.prompt_logprobs, out.logprob_token_ids, out.max_tokens) == (3, 1, None, 4)


def test_echo_asks_for_the_larger_prompt_top_k() -> None:
    """Completions' ``echo`` rows and ``prompt_logprobs`` share one engine ``prompt_logprobs``."""
    out = LogprobOptions(logprobs=2, prompt_logprobs=1, echo_logprobs=2).engine_params(SamplingParams())
    assert out.prompt_logprobs == 2
    echo_only = LogprobOptions(echo_logprobs=0).engine_params(SamplingParams())
    assert (echo_only.logprobs, echo_only.prompt_logprobs) == (None, 0)


def test_listed_ids_replace_the_top_k() -> None:
    out = LogprobOptions(logprobs=2, token_ids=(5, 7)).engine_params(SamplingParams())
    assert out.logprobs is None and list(out.logprob_token_ids or ()) == [5, 7]
