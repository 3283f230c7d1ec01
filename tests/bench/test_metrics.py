"""Metric math on hand-built timestamp series, checked against values computed by hand."""

from __future__ import annotations

import pytest

from surge.bench.metrics import (
    RequestResult,
    compute_metrics,
    max_output_tokens_per_second,
    metrics_to_json,
    parse_goodput,
    parse_percentile_metrics,
    parse_percentiles,
)


def _results() -> list[RequestResult]:
    # A: 4 tokens, TTFT 0.5 s, ITLs 0.1/0.2/0.3, E2EL 1.1 -> TPOT (1.1 - 0.5) / 3 = 0.2 s
    a = RequestResult(True, 10, 4, 4, ttft=0.5, itl=[0.1, 0.2, 0.3], latency=1.1, start_time=10.0)
    # B: 2 tokens, TTFT 0.3, ITL 0.4, E2EL 0.7 -> TPOT 0.4 / 1 = 0.4 s
    b = RequestResult(True, 20, 2, 2, ttft=0.3, itl=[0.4], latency=0.7, start_time=10.2)
    # C: failed; must not appear in any latency list or token sum
    c = RequestResult(False, 999, 4, 3, ttft=9.0, itl=[9.0, 9.0], latency=30.0, start_time=10.1, error="boom")
    # D: 1 token: no TPOT (but TPOT 0 for goodput, as vLLM)
    d = RequestResult(True, 5, 1, 1, ttft=0.2, itl=[], latency=0.2, start_time=10.0)
    return [a, b, c, d]


def test_counts_and_throughputs() -> None:
    m = compute_metrics(_results(), duration=2.0)
    assert (m.completed, m.failed) == (3, 1)
    assert m.total_input == 35  # 10 + 20 + 5, the failed request's 999 left out
    assert m.total_output == 7
    assert m.output_lens == [4, 2, 0, 1]
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(3.5)
    assert m.total_token_throughput == pytest.approx(21.0)


def test_latency_stats_by_hand() -> None:
    s = compute_metrics(_results(), duration=2.0, percentiles=[50, 99]).latency_stats
    # TTFT over successful requests: [500, 300, 200] ms
    assert s["mean_ttft_ms"] == pytest.approx(1000.0 / 3)
    assert s["median_ttft_ms"] == pytest.approx(300.0)
    assert s["std_ttft_ms"] == pytest.approx(124.7219, abs=1e-3)  # population std
    assert s["p99_ttft_ms"] == pytest.approx(496.0)  # 300 + 0.98 * 200 (linear interpolation)
    assert s["p50_ttft_ms"] == pytest.approx(300.0)
    # TPOT excludes the first token and requests with one token: [200, 400] ms
    assert s["mean_tpot_ms"] == pytest.approx(300.0)
    assert s["p99_tpot_ms"] == pytest.approx(398.0)
    # ITL is per chunk, flattened over requests: [100, 200, 300, 400] ms
    assert s["mean_itl_ms"] == pytest.approx(250.0)
    assert s["median_itl_ms"] == pytest.approx(250.0)
    assert s["p99_itl_ms"] == pytest.approx(397.0)
    # E2EL: [1100, 700, 200] ms
    assert s["mean_e2el_ms"] == pytest.approx(2000.0 / 3)
    assert s["median_e2el_ms"] == pytest.approx(700.0)


def test_failed_requests_stay_in_duration_only() -> None:
    with_failed = compute_metrics(_results(), duration=2.0)
    without = compute_metrics([r for r in _results() if r.success], duration=2.0)
    assert with_failed.latency_stats == without.latency_stats
    assert with_failed.output_throughput == without.output_throughput
    # a longer duration (the failed request kept the run going) lowers every throughput
    longer = compute_metrics(_results(), duration=4.0)
    assert longer.output_throughput == pytest.approx(1.75)


def test_goodput() -> None:
    # SLOs ttft <= 400 ms and tpot <= 300 ms: A fails TTFT, B fails TPOT, D passes (TPOT 0) -> 1 good
    m = compute_metrics(_results(), duration=2.0, goodput={"ttft": 400.0, "tpot": 300.0})
    assert m.request_goodput == pytest.approx(0.5)
    m = compute_metrics(_results(), duration=2.0, goodput={"e2el": 800.0})  # B and D
    assert m.request_goodput == pytest.approx(1.0)
    assert compute_metrics(_results(), duration=2.0).request_goodput is None


def test_max_output_tokens_per_second() -> None:
    # token times since t0 = 10.0: A 0.5, 0.6, 0.8, 1.1; B 0.5, 0.9; D 0.2 -> bucket 0 holds 6
    assert max_output_tokens_per_second(_results()) == (6.0, 3)
    assert max_output_tokens_per_second([RequestResult()]) == (0.0, 0)


def test_empty_and_errors() -> None:
    m = compute_metrics([RequestResult(error="x")], duration=1.0)
    assert m.completed == 0 and m.latency_stats["mean_ttft_ms"] == 0.0
    with pytest.raises(ValueError):
        compute_metrics([], duration=0.0)
    with pytest.raises(ValueError):
        compute_metrics([RequestResult(success=True)], duration=1.0)  # no output_len


def test_json_field_names() -> None:
    j = metrics_to_json(compute_metrics(_results(), duration=2.0, percentiles=[90, 99.9]), 2.0)
    names = (
        "duration completed failed total_input_tokens total_output_tokens request_throughput output_throughput "
        "total_token_throughput max_output_tokens_per_s mean_ttft_ms median_ttft_ms std_ttft_ms p90_ttft_ms "
        "p99.9_ttft_ms mean_tpot_ms p99.9_itl_ms mean_e2el_ms"
    )
    for k in names.split():
        assert k in j, k


def test_percentile_metrics_select_the_reported_latencies() -> None:
    """vLLM's --percentile-metrics: only the named latencies get mean, median, std and percentiles."""
    m = compute_metrics(_results(), duration=2.0, percentiles=[50, 99.9])
    j = metrics_to_json(m, 2.0, parse_percentile_metrics("TTFT, e2el,ttft"))
    latency = sorted(k for k in j if k.endswith("_ms"))
    assert latency == sorted(
        f"{stat}_{name}_ms" for stat in ("mean", "median", "std", "p50", "p99.9") for name in ("ttft", "e2el")
    )
    assert j["mean_ttft_ms"] == m.latency_stats["mean_ttft_ms"] and j["completed"] == 3
    assert parse_percentile_metrics("ttft,tpot,itl,e2el") == ("ttft", "tpot", "itl", "e2el")
    for bad, words in (("ttft,latency", "got 'latency'"), (" , ", "is empty")):
        with pytest.raises(ValueError, match=words):
            parse_percentile_metrics(bad)


def test_parsers() -> None:
    assert parse_goodput(["ttft:500", "TPOT:50", "e2el:1e4"]) == {
        "ttft": 500.0,
        "tpot": 50.0,
        "e2el": 10000.0,
    }
    assert parse_percentiles("50, 90,99") == [50.0, 90.0, 99.0]
    for bad in (["itl:5"], ["ttft"], ["ttft:x"], ["ttft:-1"], ["tpot:nan"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
    # vLLM 0.26 takes an SLO of 0 ms (check_goodput_args refuses only negative values)
    assert parse_goodput(["ttft:0", "tpot:0"]) == {"ttft": 0.0, "tpot": 0.0}
    # an SLO given twice is refused (vLLM 0.26 keeps the last without a word), whatever its case
    for twice in (["ttft:500", "ttft:300"], ["ttft:500", "tpot:50", "TTFT:500"]):
        with pytest.raises(
            ValueError, match=r"^--goodput gives ttft twice \('ttft:500' and '(ttft:300|TTFT:500)'\)"
        ):
            parse_goodput(twice)
    for bad in ("", "abc", "-1", "101", "100.5"):
        with pytest.raises(ValueError):
            parse_percentiles(bad)


def test_goodput_given_twice_is_one_readable_cli_error(capsys: pytest.CaptureFixture[str]) -> None:
    """``surge bench serve --goodput ttft:500 ttft:300`` exits 2 with one line naming the flag,
    before any request (no server listens here)."""
    from conftest import bench_main

    assert bench_main(["bench", "serve", "--goodput", "ttft:500", "ttft:300"]) == 2
    err = capsys.readouterr().err
    assert err == "surge: error: --goodput gives ttft twice ('ttft:500' and 'ttft:300'): give each SLO once\n"


def test_percentiles_0_and_100_are_the_min_and_max_as_in_vllm() -> None:
    """vLLM's --metric-percentiles takes any number numpy.percentile takes, 0 and 100 included:
    p0 is the least value, p100 the largest, under vLLM's key spelling."""
    assert parse_percentiles("0,100") == [0.0, 100.0]
    j = metrics_to_json(
        compute_metrics(_results(), duration=2.0, percentiles=parse_percentiles("0,100")), 2.0
    )
    assert (j["p0_ttft_ms"], j["p100_ttft_ms"]) == (pytest.approx(200.0), pytest.approx(500.0))
    assert (j["p0_tpot_ms"], j["p100_tpot_ms"]) == (pytest.approx(200.0), pytest.approx(400.0))
    assert (j["p0_itl_ms"], j["p100_itl_ms"]) == (pytest.approx(100.0), pytest.approx(400.0))
    assert (j["p0_e2el_ms"], j["p100_e2el_ms"]) == (pytest.approx(200.0), pytest.approx(1100.0))


def test_result_table_omits_latencies_when_nothing_succeeded() -> None:
    from surge.bench.report import format_result_table

    result = {
        "completed": 0,
        "failed": 2,
        "duration": 1.0,
        "total_input_tokens": 0,
        "total_output_tokens": 0,
        "request_throughput": 0.0,
        "output_throughput": 0.0,
        "max_output_tokens_per_s": 0.0,
        "total_token_throughput": 0.0,
        "mean_ttft_ms": 0.0,
        "median_ttft_ms": 0.0,
        "p99_ttft_ms": 0.0,
        "errors": ["HTTP 400: too long", "HTTP 400: too long"],
    }
    table = format_result_table(result)
    assert "TTFT" not in table
    assert "Failed requests:" in table and "HTTP 400: too long" in table
    result["completed"] = 1
    assert "Mean TTFT (ms):" in format_result_table(result)


def test_a_wrong_re_tokenized_length_says_the_server_sent_no_usage() -> None:
    from surge.bench.serve import validate_results

    class Words:
        def encode(self, text: str) -> list[int]:
            return [0] * len(text.split())

    usage = RequestResult(True, 4, 3, 2)
    counted = RequestResult(True, 4, 3, None)
    counted.generated_text = "one two"
    right = RequestResult(True, 4, 2, None)
    right.generated_text = "one two"
    validate_results([usage, counted, right], Words(), exact_length=True)  # type: ignore[arg-type]
    assert usage.error == "completion_tokens 2 != requested 3"
    assert counted.error is not None and counted.error.startswith("re-tokenized output 2 != requested 3")
    assert "the server sent no usage" in counted.error
    assert right.success and right.output_len == 2


def test_completion_tokens_0_is_re_counted_from_the_text_as_vllm() -> None:
    """vLLM 0.26's calculate_metrics re-counts the text when output_tokens is falsy, a usage of
    completion_tokens 0 included; the exact-length check then tests the re-count and says why."""
    from surge.bench.serve import validate_results

    class Words:
        def encode(self, text: str) -> list[int]:
            return [1] + [0] * len(text.split())  # a BOS, not counted in the output

    said_0 = RequestResult(True, 4, 3, 0)
    said_0.generated_text = "one two three"
    wrong = RequestResult(True, 4, 3, 0)
    wrong.generated_text = "one two"
    empty = RequestResult(True, 4, 3, 0)
    validate_results([said_0, wrong, empty], Words(), exact_length=True)  # type: ignore[arg-type]
    assert said_0.success and said_0.output_len == 3
    assert wrong.error is not None and wrong.error.startswith("re-tokenized output 2 != requested 3")
    assert "the server said completion_tokens 0" in wrong.error
    assert not empty.success and empty.output_len == 0
    kept = RequestResult(True, 4, 3, 0)
    kept.generated_text = "one two three"
    validate_results([kept], None, exact_length=False)  # nothing to count with: the server's 0 stays
    assert kept.success and kept.output_len == 0


def test_vllm_edge_cases_by_hand() -> None:
    """The corners of vLLM 0.26's calculate_metrics, on hand-built timings: an SLO met exactly is
    met (its test is slo >= value); a success of 0 tokens counts as completed with no TPOT (and
    TPOT 0 for goodput); a chunk of several tokens is one ITL gap and one token of the peak
    buckets; buckets are whole seconds since the earliest successful start (a token at exactly
    1.0 s falls in bucket 1) and a request is active in every bucket from its start's to its end's."""
    # E: 5 tokens in 3 chunks (first chunk 1 token, then 2 + 2): ITLs 0.5, 0.5; TPOT (2.0 - 1.0) / 4
    e = RequestResult(True, 8, 5, 5, ttft=1.0, itl=[0.5, 0.5], latency=2.0, start_time=100.0)
    # F: success with 0 tokens (usage.completion_tokens 0): completed, no TPOT, TPOT 0 for goodput
    f = RequestResult(True, 4, 5, 0, ttft=0.25, itl=[], latency=0.25, start_time=100.5)
    # G: starts 2.5 s after E, one token at 3.0 s
    g = RequestResult(True, 6, 1, 1, ttft=0.5, itl=[], latency=0.5, start_time=102.5)
    m = compute_metrics([e, f, g], duration=4.0, percentiles=[50], goodput={"ttft": 1000.0, "tpot": 250.0})
    assert (m.completed, m.failed, m.total_input, m.total_output) == (3, 0, 18, 6)
    # TTFT 1000 ms = the SLO (good); TPOT 250 ms = the SLO (good); F and G TPOT 0 -> all 3 good
    assert m.request_goodput == pytest.approx(3 / 4.0)
    assert m.latency_stats["mean_tpot_ms"] == pytest.approx(250.0)  # E only
    assert m.latency_stats["mean_itl_ms"] == pytest.approx(500.0)  # per chunk, not per token
    assert m.latency_stats["mean_ttft_ms"] == pytest.approx(1750.0 / 3)
    # token times since 100.0: E 1.0, 1.5, 2.0; F 0.75; G 3.0 -> buckets [1, 2, 1, 1]
    # active: E seconds 0-2, F 0, G 2-3 -> [2, 1, 2, 1]
    assert max_output_tokens_per_second([e, f, g]) == (2.0, 2)
    assert m.max_output_tokens_per_s == 2.0 and m.max_concurrent_requests == 2
    # one SLO just missed: TTFT 999.9 ms fails E
    assert compute_metrics([e, f, g], 4.0, goodput={"ttft": 999.9}).request_goodput == pytest.approx(2 / 4.0)
    # an SLO of 0 ms (vLLM takes it): only a value of exactly 0 meets it, F's and G's one-token TPOT
    assert compute_metrics([e, f, g], 4.0, goodput={"tpot": 0.0}).request_goodput == pytest.approx(2 / 4.0)
    assert compute_metrics([e, f, g], 4.0, goodput={"ttft": 0.0}).request_goodput == 0.0


def test_result_table_labels_are_vllm_0_26s() -> None:
    """The summary block's lines carry vLLM 0.26's labels in its order (a script that reads vLLM's
    output reads Surge's): 'Total token throughput', not the older 'Total Token throughput'."""
    from surge.bench.report import format_result_table

    result = {
        "completed": 3,
        "failed": 1,
        "max_concurrency": 4,
        "request_rate": 2.0,
        "duration": 2.0,
        "total_input_tokens": 35,
        "total_output_tokens": 7,
        "request_throughput": 1.5,
        "request_goodput": 0.5,
        "output_throughput": 3.5,
        "max_output_tokens_per_s": 6.0,
        "max_concurrent_requests": 3,
        "total_token_throughput": 21.0,
    }
    labels = [line[:40].rstrip() for line in format_result_table(result).splitlines()[1:-1]]
    assert labels == [
        "Successful requests:",
        "Failed requests:",
        "Maximum request concurrency:",
        "Request rate configured (RPS):",
        "Benchmark duration (s):",
        "Total input tokens:",
        "Total generated tokens:",
        "Request throughput (req/s):",
        "Request goodput (req/s):",
        "Output token throughput (tok/s):",
        "Peak output token throughput (tok/s):",
        "Peak concurrent requests:",
        "Total token throughput (tok/s):",
    ]


def test_result_table_prints_percentiles_in_the_order_asked() -> None:
    """vLLM prints each latency's percentiles in --metric-percentiles' order (99,50: P99 first)."""
    from surge.bench.report import format_result_table

    m = compute_metrics(_results(), duration=2.0, percentiles=parse_percentiles("99,50"))
    result = {**metrics_to_json(m, 2.0), "max_concurrency": None}
    lines = [
        line.split(" (ms)")[0] for line in format_result_table(result).splitlines() if "TTFT (ms)" in line
    ]
    assert lines == ["Mean TTFT", "Median TTFT", "P99 TTFT", "P50 TTFT"]


@pytest.mark.parametrize("command", ["serve", "matrix"])
@pytest.mark.parametrize("flag", ["--percentiles", "--metric-percentiles"])
def test_a_bad_percentile_is_refused_naming_the_flag_as_typed(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's --metric-percentiles (an alias of --percentiles) copied from a vLLM command line: a
    bad value's one line names the spelling the user gave, before any request."""
    from conftest import bench_main

    grid = ["--concurrency", "1", "--input-len", "8", "--output-len", "4"] if command == "matrix" else []
    argv = ["bench", command, "--base-url", "http://127.0.0.1:9", *grid, flag]
    for value, words in (("101", ": a percentile must be in [0, 100], got 101"), (",", " is empty")):
        assert bench_main([*argv, value]) == 2
        assert capsys.readouterr().err == f"surge: error: {flag}{words}\n"
