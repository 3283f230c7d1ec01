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


def test_completion_top_logprobs_keep_the_sampled_tokens_value() -> None:
    """Two ids that decode alike (a letter and its byte token): the legacy completions dict keeps
    the sampled token's own logprob under its text, as ``token_logprobs`` says, where vLLM lets
    the alternative overwrite it; two alternatives of one text keep the last value, as vLLM."""
    from surge.core.logprobs import LogprobsLists
    from surge.server.logprobs import CompletionLogprobs

    class Strings:
        names = {414: "o", 114: "o", 7: "x", 8: "y", 9: "y"}

        def text(self, token_id: int) -> str:
            return self.names[token_id]

    rows = LogprobsLists(
        token_ids=[[414, 414, 114, 7], [7, 8, 9, 7]],
        logprobs=[[-0.5, -0.5, -17.0, -3.0], [-2.0, -0.1, -1.5, -2.0]],
        ranks=[1, 3],
    )
    built = CompletionLogprobs(3, Strings()).build(rows)  # type: ignore[arg-type]
    assert built["tokens"] == ["o", "x"]
    assert built["token_logprobs"] == [-0.5, -2.0]
    assert built["top_logprobs"] == [{"o": -0.5, "x": -3.0}, {"x": -2.0, "y": -1.5}]
    for i, token in enumerate(built["tokens"]):
        assert built["top_logprobs"][i][token] == built["token_logprobs"][i]
