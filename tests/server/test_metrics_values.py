"""Each ``/metrics`` value against known requests on a live server, with vLLM 0.26's semantics
(``vllm/v1/metrics/loggers.py`` ``PrometheusStatLogger.record``, ``stats.py``): per finished
choice the success counter and the e2e, queue, prefill, decode, inference, time-per-output-token,
prompt, generation, computed-prompt and max_tokens histograms; per prompt whose n choices all
finished ``request_params_n`` and ``request_max_num_generation_tokens``; per engine step
``iteration_tokens_total``; at each prefill's end the prompt token counters by source. An aborted
choice (a client's hang-up) and a refused request count in none of the per-request ones."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server, hang_up_after, metric, start_server, wait_engine_idle

P = "surge:"
FINISHED_HISTOGRAMS = (
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_inference_time_seconds",
    "request_time_per_output_token_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_prefill_kv_computed_tokens",
    "request_params_max_tokens",
)
PROMPT_HISTOGRAMS = ("request_params_n", "request_max_num_generation_tokens")
COUNTERS = (
    "prompt_tokens_total",
    "prompt_tokens_cached_total",
    "generation_tokens_total",
    "prefix_cache_hits_total",
    "prefix_cache_queries_total",
    "num_preemptions_total",
)


def _snapshot(text: str) -> dict[str, float]:
    """Every figure the tests compare: counters, each histogram's _count and _sum, the success
    counter by reason and the prompt tokens by source."""
    snap = {name: metric(text, P + name) for name in COUNTERS}
    for h in (
        *FINISHED_HISTOGRAMS,
        *PROMPT_HISTOGRAMS,
        "iteration_tokens_total",
        "time_to_first_token_seconds",
    ):
        snap[h + "_count"] = metric(text, f"{P}{h}_count")
        snap[h + "_sum"] = metric(text, f"{P}{h}_sum")
    for reason in ("stop", "length", "abort", "error", "repetition"):
        snap["success_" + reason] = metric(text, P + "request_success_total", finished_reason=reason)
    for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        snap["source_" + source] = metric(text, P + "prompt_tokens_by_source_total", source=source)
    return snap


def _delta(url: str, before: dict[str, float]) -> dict[str, float]:
    after = _snapshot(wait_engine_idle(url, "the engine did not go idle"))
    return {k: after[k] - before[k] for k in after}


def _complete(url: str, body: dict) -> dict:
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("serve-metrics"), "--enable-prompt-tokens-details")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def test_one_request_observes_every_histogram_once(srv: Server) -> None:
    before = _snapshot(httpx.get(srv.url + "/metrics").text)
    out = _complete(srv.url, {"prompt": "A fox ran past the old mill", "max_tokens": 5, "ignore_eos": True})
    p = out["usage"]["prompt_tokens"]
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    d = _delta(srv.url, before)
    for h in FINISHED_HISTOGRAMS + PROMPT_HISTOGRAMS:
        assert d[h + "_count"] == 1, h
    assert d["success_length"] == 1 and d["success_stop"] == 0
    assert d["request_prompt_tokens_sum"] == p
    assert d["request_generation_tokens_sum"] == 5
    assert d["request_params_max_tokens_sum"] == 5
    assert d["request_params_n_sum"] == 1
    assert d["request_max_num_generation_tokens_sum"] == 5
    assert d["request_prefill_kv_computed_tokens_sum"] == p - cached
    assert (d["prompt_tokens_total"], d["generation_tokens_total"]) == (p, 5)
    assert d["prompt_tokens_cached_total"] == d["source_local_cache_hit"] == cached
    assert d["source_local_compute"] == p - cached and d["source_external_kv_transfer"] == 0
    # one token per engine step: 5 steps; they hold the computed prompt and the 5 tokens
    assert d["iteration_tokens_total_count"] == 5
    assert d["iteration_tokens_total_sum"] == p - cached + 5
    # vLLM's intervals: inference = prefill + decode; tpot = decode / (tokens - 1)
    assert d["request_queue_time_seconds_sum"] >= 0
    assert d["request_prefill_time_seconds_sum"] > 0 and d["request_decode_time_seconds_sum"] > 0
    assert d["request_inference_time_seconds_sum"] == pytest.approx(
        d["request_prefill_time_seconds_sum"] + d["request_decode_time_seconds_sum"], abs=1e-6
    )
    assert d["request_time_per_output_token_seconds_sum"] == pytest.approx(
        d["request_decode_time_seconds_sum"] / 4, abs=1e-6
    )
    assert d["request_inference_time_seconds_sum"] <= d["e2e_request_latency_seconds_sum"]


def test_n_choices_count_as_n_requests_and_one_prompt(srv: Server) -> None:
    before = _snapshot(httpx.get(srv.url + "/metrics").text)
    body = {"prompt": "The moon rose over a quiet lake", "max_tokens": 4, "ignore_eos": True, "n": 3}
    p = _complete(srv.url, body)["usage"]["prompt_tokens"]
    d = _delta(srv.url, before)
    assert d["success_length"] == 3
    for h in FINISHED_HISTOGRAMS:
        assert d[h + "_count"] == 3, h
    assert d["request_generation_tokens_sum"] == 12 and d["request_prompt_tokens_sum"] == 3 * p
    # vLLM observes n and the most tokens of one choice once, when the parent's n children are done
    assert (d["request_params_n_count"], d["request_params_n_sum"]) == (1, 3)
    assert (d["request_max_num_generation_tokens_count"], d["request_max_num_generation_tokens_sum"]) == (
        1,
        4,
    )
    assert d["prompt_tokens_total"] == 3 * p and d["time_to_first_token_seconds_count"] == 3


def test_a_prefix_cache_hit_counts_by_source(srv: Server) -> None:
    prompt = "Once upon a time there was a little girl who lived in a village near the forest. " * 2
    _complete(srv.url, {"prompt": prompt, "max_tokens": 2})
    before = _snapshot(wait_engine_idle(srv.url, "the engine did not go idle"))
    out = _complete(srv.url, {"prompt": prompt, "max_tokens": 3, "ignore_eos": True})
    p = out["usage"]["prompt_tokens"]
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16, "the second request should find the first's blocks"
    d = _delta(srv.url, before)
    assert d["prefix_cache_hits_total"] == d["prompt_tokens_cached_total"] == cached
    assert d["prefix_cache_queries_total"] == p
    assert (d["source_local_cache_hit"], d["source_local_compute"]) == (cached, p - cached)
    assert d["prompt_tokens_total"] == p  # vLLM's total counts the cached tokens too
    assert d["request_prefill_kv_computed_tokens_sum"] == p - cached
    assert d["iteration_tokens_total_sum"] == p - cached + 3


def test_a_hang_up_and_a_refused_request_finish_nothing(srv: Server) -> None:
    before = _snapshot(httpx.get(srv.url + "/metrics").text)
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 100000}, timeout=30)
    assert r.status_code == 400
    body = {"prompt": "A long story begins", "max_tokens": 400, "ignore_eos": True, "n": 2, "stream": True}
    hang_up_after(srv.url, body, chunks=6)
    d = _delta(srv.url, before)
    for h in FINISHED_HISTOGRAMS + PROMPT_HISTOGRAMS:
        assert d[h + "_count"] == 0, h
    assert all(d["success_" + r] == 0 for r in ("stop", "length", "abort", "error", "repetition"))
    # what the aborted choices did before the hang-up is counted, as in vLLM
    assert d["time_to_first_token_seconds_count"] == 2
    assert d["generation_tokens_total"] >= 6
    p = httpx.post(srv.url + "/tokenize", json={"prompt": body["prompt"]}).json()["count"]
    assert d["prompt_tokens_total"] == 2 * p  # both prefills were done


def test_preemptions_are_counted_and_each_request_once(tmp_path: Path) -> None:
    """A pool of 12 blocks of 16 tokens for four requests of 5 blocks each: some are preempted
    and recomputed; each still finishes once, and the prefix cache counters count each prompt's
    first admission only."""
    s = start_server(tmp_path, "--num-kv-blocks", "12")
    try:
        before = _snapshot(httpx.get(s.url + "/metrics").text)

        async def run() -> list[dict]:
            async with httpx.AsyncClient(timeout=120) as c:
                bodies = [
                    {"prompt": f"Story {i}: a cat", "max_tokens": 64, "ignore_eos": True} for i in range(4)
                ]
                rs = await asyncio.gather(*(c.post(s.url + "/v1/completions", json=b) for b in bodies))
            assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
            return [r.json() for r in rs]

        outs = asyncio.run(run())
        d = _delta(s.url, before)
    finally:
        assert s.stop() == 0, s.log()[-3000:]
    prompts = sum(o["usage"]["prompt_tokens"] for o in outs)
    assert d["num_preemptions_total"] > 0, "the pool was meant to force a preemption"
    assert d["success_length"] == 4 and d["request_generation_tokens_sum"] == 4 * 64
    assert d["prefix_cache_queries_total"] == prompts  # re-admissions are not queries
    assert d["prompt_tokens_total"] == prompts  # a recompute is no second prefill of the prompt
    for h in FINISHED_HISTOGRAMS:
        assert d[h + "_count"] == 4, h


def test_a_stop_string_finish_observes_every_histogram_once(srv: Server) -> None:
    """A stop string ends the choice in the API (the engine request is aborted there): it is a
    finished request with reason ``stop``, its times taken from the engine's first output."""
    before = _snapshot(httpx.get(srv.url + "/metrics").text)
    body = {"prompt": "Once upon a time", "max_tokens": 60, "ignore_eos": True, "stop": [" "]}
    out = _complete(srv.url, body)
    assert out["choices"][0]["finish_reason"] == "stop", out
    n = out["usage"]["completion_tokens"]
    d = _delta(srv.url, before)
    assert (d["success_stop"], d["success_length"]) == (1, 0)
    for h in FINISHED_HISTOGRAMS + PROMPT_HISTOGRAMS:
        assert d[h + "_count"] == 1, h
    assert d["request_generation_tokens_sum"] == n and d["request_params_max_tokens_sum"] == 60
    assert d["request_prefill_time_seconds_sum"] > 0 and d["request_decode_time_seconds_sum"] >= 0
    assert d["request_inference_time_seconds_sum"] <= d["e2e_request_latency_seconds_sum"]


def test_a_scored_prompt_counts_its_prefill(srv: Server) -> None:
    """``echo`` with ``max_tokens: 0`` computes the prompt and samples nothing: its prompt counts
    in the prompt token counters (and the stats line) as a prefill that is done, consistent with
    the per-request histograms and ``iteration_tokens_total``, which count it too."""
    prompt = "A scored prompt about a red kite over the hills"
    _complete(srv.url, {"prompt": prompt, "max_tokens": 1})  # its blocks are cached for the second
    before = _snapshot(wait_engine_idle(srv.url, "the engine did not go idle"))
    out = _complete(srv.url, {"prompt": prompt, "echo": True, "max_tokens": 0})
    p = out["usage"]["prompt_tokens"]
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert out["usage"]["completion_tokens"] == 0 and cached > 0, out["usage"]
    d = _delta(srv.url, before)
    assert d["success_length"] == 1 and d["request_prompt_tokens_sum"] == p
    assert d["prompt_tokens_total"] == p and d["prompt_tokens_cached_total"] == cached
    assert (d["source_local_compute"], d["source_local_cache_hit"]) == (p - cached, cached)
    assert d["request_prefill_kv_computed_tokens_sum"] == d["iteration_tokens_total_sum"] == p - cached
    assert d["generation_tokens_total"] == 0
