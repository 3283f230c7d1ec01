"""Under ``--metrics-prefix vllm`` each metric that vLLM 0.26 also exports has vLLM's name, type
and histogram buckets (read from ``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``)."""

from __future__ import annotations

import re

from surge.core.outputs import SchedulerStats
from surge.server.metrics import ServerMetrics, build_1_2_5_buckets

MAX_MODEL_LEN = 2048
TOKENS_1_2_5 = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]  # build_1_2_5_buckets(2048)
LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
       20.0, 40.0, 80.0]  # fmt: skip
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip

VLLM = {  # vLLM 0.26 name (family) -> type, and a histogram's buckets
    "vllm:num_requests_running": ("gauge", None),
    "vllm:num_requests_waiting": ("gauge", None),
    "vllm:num_requests_waiting_by_reason": ("gauge", None),
    "vllm:kv_cache_usage_perc": ("gauge", None),
    "vllm:prefix_cache_queries": ("counter", None),
    "vllm:prefix_cache_hits": ("counter", None),
    "vllm:num_preemptions": ("counter", None),
    "vllm:prompt_tokens": ("counter", None),
    "vllm:prompt_tokens_by_source": ("counter", None),
    "vllm:prompt_tokens_cached": ("counter", None),
    "vllm:generation_tokens": ("counter", None),
    "vllm:request_success": ("counter", None),
    "vllm:request_prompt_tokens": ("histogram", TOKENS_1_2_5),
    "vllm:request_generation_tokens": ("histogram", TOKENS_1_2_5),
    "vllm:iteration_tokens_total": (
        "histogram",
        [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    ),
    "vllm:request_max_num_generation_tokens": ("histogram", TOKENS_1_2_5),
    "vllm:request_params_n": ("histogram", [1, 2, 5, 10, 20]),
    "vllm:request_params_max_tokens": ("histogram", TOKENS_1_2_5),
    "vllm:time_to_first_token_seconds": ("histogram", TTFT),
    "vllm:inter_token_latency_seconds": ("histogram", ITL),
    "vllm:request_time_per_output_token_seconds": ("histogram", ITL),
    "vllm:e2e_request_latency_seconds": ("histogram", LATENCY),
    "vllm:request_queue_time_seconds": ("histogram", LATENCY),
    "vllm:request_inference_time_seconds": ("histogram", LATENCY),
    "vllm:request_prefill_time_seconds": ("histogram", LATENCY),
    "vllm:request_decode_time_seconds": ("histogram", LATENCY),
    "vllm:request_prefill_kv_computed_tokens": ("histogram", TOKENS_1_2_5),
}


def test_build_1_2_5_buckets_is_vllms() -> None:
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]  # vLLM's docstring example
    assert build_1_2_5_buckets(MAX_MODEL_LEN) == TOKENS_1_2_5


def test_names_types_and_buckets_are_vllms() -> None:
    m = ServerMetrics(
        "m", lambda: SchedulerStats(1, 0, 0.1, 9, 10, 0), prefix="vllm", max_model_len=MAX_MODEL_LEN
    )
    text = m.render().decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name, (kind, buckets) in VLLM.items():
        family = name + "_total" if kind == "counter" else name  # the exposition's counter name
        assert types.get(family) == kind, (name, types.get(family))
        if buckets is not None:
            les = re.findall(rf'^{re.escape(name)}_bucket\{{[^}}]*le="([^"]+)"', text, re.M)
            assert [float(x) for x in les] == [*map(float, buckets), float("inf")], name
    reasons = set(re.findall(r'^vllm:request_success_total\{[^}]*finished_reason="(\w+)"', text, re.M))
    assert reasons == {"stop", "length", "abort", "error", "repetition"}  # vLLM's FinishReason, all from 0
    sources = set(re.findall(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="(\w+)"', text, re.M))
    assert sources == {"local_compute", "local_cache_hit", "external_kv_transfer"}


def test_waiting_by_reason_adds_up_to_waiting() -> None:
    stats = SchedulerStats(1, 3, 0.1, 9, 10, 0, num_waiting_deferred=1)
    text = ServerMetrics("m", lambda: stats, prefix="vllm", max_model_len=MAX_MODEL_LEN).render().decode()
    assert re.search(
        r'^vllm:num_requests_waiting_by_reason\{engine="0",model_name="m",reason="capacity"\} 2\.0$',
        text,
        re.M,
    )
    assert re.search(
        r'^vllm:num_requests_waiting_by_reason\{engine="0",model_name="m",reason="deferred"\} 1\.0$',
        text,
        re.M,
    )


def test_every_vllm_metric_has_the_model_name_and_engine_labels() -> None:
    """vLLM labels its per-engine metrics ``model_name`` and ``engine`` (``"0"``; each
    data-parallel engine's index): a selector or ``sum by (engine)`` written for vLLM works."""
    stats = SchedulerStats(1, 0, 0.1, 9, 10, 0)
    for replicas, engines in ((None, {"0"}), (lambda: [stats, stats], {"0", "1"})):
        m = ServerMetrics("m", lambda: stats, replicas, prefix="vllm", max_model_len=MAX_MODEL_LEN)
        text = m.render().decode()
        for name in VLLM:
            samples = re.findall(
                rf"^{re.escape(name)}(?:_total|_bucket|_count|_sum)?\{{([^}}]*)\}}", text, re.M
            )
            assert samples, name
            seen = set()
            for labels in samples:
                got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
                assert got.get("model_name") == "m" and "engine" in got, (name, labels)
                seen.add(got["engine"])
            assert seen == engines, (name, seen)
