"""Request metrics count each choice of an ``n > 1`` request, as vLLM 0.26 counts each of its n
child requests (``OutputProcessor._update_stats_from_finished`` per child; a child's first output
brings its prefill's prompt tokens): ``request_success_total``, the e2e latency histogram and
``prompt_tokens_total`` alike; and, as vLLM's ``OutputProcessor.abort_requests``, a choice aborted
by a client's hang-up is in neither ``request_success_total`` nor the e2e histogram."""

from __future__ import annotations

import httpx

from tests.server.conftest import Server, hang_up_after, metric, wait_engine_idle


def _counts(url: str) -> tuple[float, float, float, float]:
    text = httpx.get(url + "/metrics").text
    return (
        metric(text, "surge:request_success_total", finished_reason="length"),
        metric(text, "surge:e2e_request_latency_seconds_count"),
        metric(text, "surge:prompt_tokens_total"),
        metric(text, "surge:generation_tokens_total"),
    )


def test_each_choice_counts_its_prompt_and_its_finish(server: Server) -> None:
    before = _counts(server.url)
    body = {"prompt": "Once upon a time", "max_tokens": 4, "ignore_eos": True, "n": 3}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    prompt_tokens = r.json()["usage"]["prompt_tokens"]
    after = _counts(server.url)
    success, e2e, prompt, generation = (a - b for a, b in zip(after, before, strict=True))
    assert (success, e2e, generation) == (3, 3, 12)
    assert prompt == 3 * prompt_tokens  # was once per prompt, whatever n


def test_a_hung_up_request_is_no_finished_one(server: Server) -> None:
    """Both choices of a stream the client hangs up are aborted in the engine; they were counted
    as finished (``finished_reason="abort"``) with an e2e latency, which vLLM does not do."""
    text = httpx.get(server.url + "/metrics").text
    reasons = ("stop", "length", "abort")
    before = [metric(text, "surge:request_success_total", finished_reason=r) for r in reasons]
    e2e_before = metric(text, "surge:e2e_request_latency_seconds_count")
    body = {"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True, "n": 2, "stream": True}
    hang_up_after(server.url, body, chunks=4)
    text = wait_engine_idle(server.url, "the engine still runs the choices of a gone client")
    assert [metric(text, "surge:request_success_total", finished_reason=r) for r in reasons] == before
    assert metric(text, "surge:e2e_request_latency_seconds_count") == e2e_before
