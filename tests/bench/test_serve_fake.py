"""`surge bench serve` against a scripted fake SSE server with known delays.

Timing tolerances are generous: asyncio sleeps and wake-ups overshoot on a loaded 2-core machine.
A scripted delay is a hard lower bound of what the client can measure (the server cannot send a
token earlier), so TTFT and E2EL are checked from below tightly and from above with a margin; the
fake server keeps its chunks on a fixed timeline, so per-chunk gaps average out to the script.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import BUNDLED_MODEL, SHAREGPT, bench_main
from fake_server import CHAT_OVERHEAD, Behaviour, FakeServer, encode

from surge.bench.serve import ServeConfig, run_serve
from surge.bench.tokens import HFTokenCounter


def _serve(url: str, *extra: str) -> list[str]:
    return ["bench", "serve", "--base-url", url, "--disable-tqdm", *extra]


def test_measured_latencies_match_the_script(tmp_path: Path) -> None:
    # delays long enough that a loaded machine's wake-up lag (measured up to 150 ms) stays small
    b = Behaviour(ttft=0.5, itl=0.1)
    out = tmp_path / "r.json"
    with FakeServer(b) as s:
        rc = bench_main(
            _serve(s.url, "--input-len", "24", "--output-len", "10", "--num-prompts", "4", "--ignore-eos")
            + ["--result-file", str(out), "--percentiles", "50,90,99", "--goodput", "ttft:2000", "tpot:500"]
        )
    assert rc == 0
    r = json.loads(out.read_text())
    assert (r["completed"], r["failed"]) == (4, 0)
    # never below the script (a client timing from the wrong moment would be), late by at most 50 %
    assert min(r["ttfts"]) * 1000 >= 0.99 * 500.0 and r["mean_ttft_ms"] <= 1.5 * 500.0, r["ttfts"]
    assert r["mean_itl_ms"] == pytest.approx(100.0, rel=0.25)
    assert r["mean_tpot_ms"] == pytest.approx(100.0, rel=0.25)
    e2el = 500.0 + 9 * 100.0
    assert min(r["latencies"]) * 1000 >= 0.99 * e2el and r["mean_e2el_ms"] <= 1.25 * e2el, r["latencies"]
    assert all(len(itl) == 9 for itl in r["itls"])  # one gap per later chunk
    assert r["output_lens"] == [10] * 4 and r["total_output_tokens"] == 40
    # chat: the templated prompt has exactly 24 tokens as the server counts it
    assert r["input_lens"] == [24] * 4
    assert r["output_throughput"] == pytest.approx(40 / r["duration"])
    assert r["request_goodput"] == pytest.approx(4 / r["duration"])
    assert r["request_rate"] == "inf" and r["max_concurrency"] is None and r["num_prompts"] == 4
    # vLLM's model_id without --model: the first model's root (its id is the name sent)
    assert r["server_models"]["data"][0]["id"] == "fake-model" and r["model_id"] == "/nonexistent"
    assert len(r["date"]) == 15 and r["command"].startswith("surge")
    for k in (
        "p50_ttft_ms",
        "p90_itl_ms",
        "p99_e2el_ms",
        "std_tpot_ms",
        "median_itl_ms",
        "max_output_tokens_per_s",
    ):
        assert k in r
    assert r["roofline_output_throughput"] is None and r["pct_of_roofline"] is None
    # the warm-up request came first, with a different prompt; all asked for streaming usage and ignore_eos
    log = b.log
    assert len(log) == 5
    prompts = [e["body"]["messages"][0]["content"] for e in log]
    assert prompts[0] not in prompts[1:]
    for e in log:
        body = e["body"]
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True and body["max_completion_tokens"] == 10
        assert "temperature" not in body and "max_tokens" not in body  # vLLM's chat body
    for p in prompts[1:]:
        assert len(encode(p)) + CHAT_OVERHEAD == 24


def test_stream_interval_makes_itl_per_chunk() -> None:
    b = Behaviour(ttft=0.1, itl=0.05, tokens_per_chunk=4)
    with FakeServer(b) as s:
        cfg = ServeConfig(
            base_url=s.url,
            endpoint="/v1/completions",
            input_len=8,
            output_len=12,
            num_prompts=2,
            disable_tqdm=True,
        )
        r = run_serve(cfg)
    assert r["failed"] == 0
    assert all(len(itl) == 2 for itl in r["itls"])  # 3 chunks of 4 tokens
    assert r["mean_itl_ms"] == pytest.approx(50.0, rel=0.25)
    assert r["mean_tpot_ms"] == pytest.approx(2 * 50.0 / 11, rel=0.25)
    assert r["input_lens"] == [8, 8]


def test_a_usage_of_0_completion_tokens_is_re_counted(tmp_path: Path) -> None:
    """A server whose usage says completion_tokens 0 over a streamed text: the text is re-counted
    (vLLM 0.26's calculate_metrics), so the exact-length check and the totals see 10 tokens."""
    out = tmp_path / "r.json"
    with FakeServer(Behaviour(ttft=0.01, itl=0.01, default="zero_usage")) as s:
        argv = _serve(s.url, "--endpoint", "/v1/completions", "--input-len", "8", "--output-len", "10")
        argv += ["--num-prompts", "2", "--warmup", "0", "--ignore-eos", "--result-file", str(out)]
        assert bench_main(argv) == 0
    r = json.loads(out.read_text())
    assert (r["completed"], r["output_lens"], r["total_output_tokens"]) == (2, [10, 10], 20)


def test_failures_are_counted_with_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = Behaviour(ttft=0.05, itl=0.02, script=["ok", "short", "http500", "stream_error", "no_usage", "ok"])
    out = tmp_path / "r.json"
    with FakeServer(b) as s:
        rc = bench_main(
            _serve(s.url, "--endpoint", "/v1/completions", "--input-len", "8", "--output-len", "10")
            + [
                "--num-prompts",
                "6",
                "--max-concurrency",
                "1",
                "--warmup",
                "0",
                "--ignore-eos",
                "--result-file",
                str(out),
            ]
        )
    assert rc == 1
    r = json.loads(out.read_text())
    assert (r["completed"], r["failed"]) == (3, 3)
    errs = r["errors"]
    assert errs[0] == "" and errs[4] == "" and errs[5] == ""
    assert errs[1] == "completion_tokens 9 != requested 10"
    assert errs[2].startswith("HTTP 500") and "internal boom" in errs[2]
    assert errs[3] == "error in stream: engine died"
    assert r["output_lens"] == [10, 0, 0, 0, 10, 10]  # no_usage: re-tokenized text counts 10
    # the failed requests' time stays in the duration (concurrency 1: everything ran in sequence)
    e2e_ok = r["mean_e2el_ms"] * 3 / 1000.0
    assert r["duration"] > e2e_ok + 0.05 + 8 * 0.02
    assert "3 failed request(s)" in capsys.readouterr().out


def test_exact_length_off_accepts_short_streams() -> None:
    b = Behaviour(ttft=0.01, itl=0.005, script=["short"])
    with FakeServer(b) as s:
        cfg = ServeConfig(
            base_url=s.url,
            input_len=8,
            output_len=6,
            num_prompts=1,
            warmup=0,
            exact_length=False,
            disable_tqdm=True,
            api_key="sk-test",
        )
        r = run_serve(cfg)
    assert r["failed"] == 0 and r["output_lens"] == [5]
    assert b.log[0]["auth"] == "Bearer sk-test"


def test_request_id_prefix_names_each_timed_request(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's --request-id-prefix: timed request i sends X-Request-Id PREFIX{i} (the warm-up none);
    by default a fresh bench-XXXXXXXX- as vLLM; an id the server would refuse is refused first."""
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        cfg = ServeConfig(
            base_url=s.url,
            input_len=8,
            output_len=3,
            num_prompts=3,
            disable_tqdm=True,
            request_id_prefix="run7-",
        )
        r = run_serve(cfg)
        assert r["failed"] == 0 and r["request_id_prefix"] == "run7-"
        posts = [e for e in b.log if e["path"].endswith("/completions")]
        assert posts[0]["request_id"] is None  # the warm-up
        assert sorted(e["request_id"] for e in posts[1:]) == ["run7-0", "run7-1", "run7-2"]
        b.log.clear()
        r = run_serve(replace(cfg, request_id_prefix=None, warmup=0))
        ids = sorted(e["request_id"] for e in b.log if e["path"].endswith("/completions"))
        prefix = r["request_id_prefix"]
        assert re.fullmatch(r"bench-[0-9a-f]{8}-", prefix) and ids == [f"{prefix}{i}" for i in range(3)]
        seen = b.seen
        for bad, words in (
            ("x" * 256, "over the 256"),
            (" lead", "printable ASCII"),
            ("é-", "printable ASCII"),
        ):
            rc = bench_main(_serve(s.url, "--num-prompts", "2", "--request-id-prefix", bad))
            err = capsys.readouterr().err
            assert rc == 2 and "--request-id-prefix" in err and words in err and err.count("\n") == 1, err
        assert b.seen == seen


def test_ignore_eos_is_on_by_default_for_random_prompts_as_vllm(tmp_path: Path) -> None:
    """vLLM 0.26's bench serve sets ignore_eos for its random dataset; without it a run of the same
    command stopped at EOS, with fewer output tokens than vLLM's. --no-ignore-eos turns it off, and
    other datasets keep it off unless asked."""
    out = tmp_path / "r.json"
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        base = _serve(s.url, "--output-len", "3", "--num-prompts", "2", "--warmup", "0")

        def sent(*extra: str) -> list[bool | None]:
            b.log.clear()
            assert bench_main([*base, *extra, "--result-file", str(out)]) == 0
            return [e["body"].get("ignore_eos") for e in b.log if e["path"].endswith("/completions")]

        assert sent("--input-len", "8") == [True, True]
        r = json.loads(out.read_text())
        assert (r["ignore_eos"], r["exact_length"]) == (True, True)  # held to the length, as with the flag
        assert sent("--input-len", "8", "--no-ignore-eos") == [None, None]
        assert json.loads(out.read_text())["exact_length"] is False
        assert sent("--dataset", "sharegpt", "--dataset-path", str(SHAREGPT)) == [None, None]
        assert sent("--dataset", "sharegpt", "--dataset-path", str(SHAREGPT), "--ignore-eos") == [True, True]


def test_percentile_metrics_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's --percentile-metrics (often copied with its command lines) selects the latencies of
    the table and the result, with --metric-percentiles; a bad name is one line, exit 2."""
    out = tmp_path / "r.json"
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        args = _serve(s.url, "--input-len", "8", "--output-len", "3", "--num-prompts", "2", "--ignore-eos")
        extra = [
            "--percentile-metrics",
            "ttft,itl",
            "--metric-percentiles",
            "50,90",
            "--result-file",
            str(out),
        ]
        assert bench_main(args + extra) == 0
        table = capsys.readouterr().out
        assert "Mean TTFT (ms):" in table and "P90 ITL (ms):" in table
        assert "TPOT" not in table and "E2EL" not in table
        assert bench_main(args + ["--percentile-metrics", "ttft,goodput"]) == 2
        err = capsys.readouterr().err
        assert "--percentile-metrics takes names from ttft,tpot,itl,e2el, got 'goodput'" in err
        assert err.count("\n") == 1
    r = json.loads(out.read_text())
    assert {k for k in r if k.endswith("_ms")} - {"goodput_slo_ms"} == {
        f"{stat}_{name}_ms" for stat in ("mean", "median", "std", "p50", "p90") for name in ("ttft", "itl")
    }
    assert len(r["latencies"]) == 2  # the per-request lists stay


def test_ramp_up_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's --ramp-up-strategy/--ramp-up-start-rps/--ramp-up-end-rps run and land in the result
    with vLLM's keys (ramp_up_*, rps_change_events); the requests leave in dataset order."""
    out = tmp_path / "r.json"
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        args = ["--input-len", "8", "--output-len", "2", "--num-prompts", "5", "--warmup", "0"]
        ramp = ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "50", "--ramp-up-end-rps", "52"]
        assert bench_main(_serve(s.url, *args, *ramp, "--result-file", str(out))) == 0
        assert f"{'Request rate ramp-up (RPS):':<40} linear 50 -> 52" in capsys.readouterr().out
        assert bench_main(_serve(s.url, *args, "--request-rate", "40")) == 0
        assert f"{'Request rate configured (RPS):':<40} 40.00" in capsys.readouterr().out  # as vLLM
    r = json.loads(out.read_text())
    assert (r["completed"], r["ramp_up_strategy"], r["ramp_up_start_rps"], r["ramp_up_end_rps"]) == (
        5,
        "linear",
        50,
        52,
    )
    assert [e["rps"] for e in r["rps_change_events"]] == [50, 51, 52]  # rates 50, 50.5, 51, 51.5, 52
    assert r["start_times"] == sorted(r["start_times"])


def test_poisson_arrivals_and_concurrency_limit() -> None:
    b = Behaviour(ttft=0.01, itl=0.005)
    with FakeServer(b) as s:
        cfg = ServeConfig(
            base_url=s.url,
            input_len=8,
            output_len=4,
            num_prompts=8,
            max_concurrency=2,
            request_rate=50.0,
            burstiness=0.5,
            warmup=0,
            disable_tqdm=True,
            save_detailed=True,
        )
        r = run_serve(cfg)
    assert r["completed"] == 8 and r["request_rate"] == 50.0 and r["max_concurrency"] == 2
    assert len(r["generated_texts"]) == 8 and len(r["latencies"]) == 8
    starts, ends = r["start_times"], [a + e for a, e in zip(r["start_times"], r["latencies"], strict=True)]
    for t in starts:  # never more than 2 requests in flight
        assert sum(1 for a, e in zip(starts, ends, strict=True) if a <= t < e) <= 2


def test_sharegpt_dataset_and_local_tokenizer(capsys: pytest.CaptureFixture[str]) -> None:
    """The shared ShareGPT file (first turns only, no replies) gives prompts from its first
    turns, each asking --output-len, and says so on stderr; a fixed length says nothing."""
    b = Behaviour(ttft=0.01, itl=0.001)
    with FakeServer(b) as s:
        cfg = ServeConfig(
            base_url=s.url,
            endpoint="/v1/completions",
            tokenizer=str(BUNDLED_MODEL),
            dataset="sharegpt",
            dataset_path=str(SHAREGPT),
            output_len=4,
            num_prompts=5,
            disable_tqdm=True,
        )
        r = run_serve(cfg)
    assert (
        r["completed"] == 5
        and r["dataset"] == "sharegpt"
        and r["tokenizer_id"] == r["token_counter"] == str(BUNDLED_MODEL)
    )
    sent = [e["body"]["prompt"] for e in b.log[1:]]
    data = json.loads(SHAREGPT.read_text())
    firsts = {c["conversations"][0]["value"] for c in data}
    assert all(p in firsts for p in sent)
    assert (
        f"surge: note: {SHAREGPT} has no replies; every request asks --output-len 4"
        in capsys.readouterr().err
    )
    with FakeServer(Behaviour()) as s:
        run_serve(
            ServeConfig(**{**cfg.__dict__, "base_url": s.url, "sharegpt_output_len": 4, "num_prompts": 1})
        )
    assert "no replies" not in capsys.readouterr().err


def test_a_file_datasets_warm_up_fits_a_long_chat_template() -> None:
    """A file dataset's warm-up prompt was 32 tokens whatever the template: on the chat endpoint of
    a model whose template alone is longer (Llama 3.1's 35 tokens), every such run stopped with
    "input length 32 is below the chat template's minimum", naming a length the user never gave.
    The warm-up now takes the template's least prompt when that is longer."""
    b = Behaviour(ttft=0.01, itl=0.001, chat_overhead=40)
    with FakeServer(b) as s:
        cfg = ServeConfig(
            base_url=s.url,
            dataset="sharegpt",
            dataset_path=str(SHAREGPT),
            output_len=4,
            num_prompts=2,
            disable_tqdm=True,
        )
        r = run_serve(cfg)
        assert r["completed"] == 2 and r["warmup"] == 1
        warm = b.log[0]["body"]["messages"][0]["content"]
        assert len(encode(warm)) + 40 == 42  # the least prompt: the template's 40 tokens, BOS and one word
        run_serve(ServeConfig(**{**cfg.__dict__, "endpoint": "/v1/completions"}))
        assert len(encode(b.log[3]["body"]["prompt"])) == 32  # no template: 32 tokens, as before


def test_sharegpt_replies_give_the_output_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's rule: each request asks its reply's token count; --output-len or vLLM's
    --sharegpt-output-len fixes one; the two disagreeing, or --sharegpt-output-len without
    --dataset sharegpt, are one-line errors before any request."""
    replies = [
        "one two three four five six",
        "a much longer reply than the first one with many more words in it",
    ]
    data = [
        {
            "id": str(i),
            "conversations": [{"from": "human", "value": f"tell me about topic number {i} please"}]
            + [{"from": "gpt", "value": r}],
        }
        for i, r in enumerate(replies)
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "r.json"
    b = Behaviour(ttft=0.01, itl=0.001)
    sg = (
        "--dataset",
        "sharegpt",
        "--dataset-path",
        str(path),
        "--num-prompts",
        "2",
        "--tokenizer",
        str(BUNDLED_MODEL),
    )
    with FakeServer(b) as s:
        assert bench_main(_serve(s.url, *sg, "--ignore-eos", "--result-file", str(out))) == 0
        counter = HFTokenCounter(str(BUNDLED_MODEL))
        want = sorted(len(counter.encode(r)) for r in replies)  # vLLM counts a BOS too
        sent = sorted(
            int(e["body"]["max_completion_tokens"]) for e in b.log[1:] if e["path"].endswith("completions")
        )
        r = json.loads(out.read_text())
        assert sent == want and sorted(r["output_lens"]) == want and r["output_len"] is None
        for flag in ("--output-len", "--sharegpt-output-len"):
            assert bench_main(_serve(s.url, *sg, flag, "5", "--result-file", str(out))) == 0
            r = json.loads(out.read_text())
            assert r["output_lens"] == [5, 5] and r["output_len"] == 5
        # the runs above warn (on stderr) that --tokenizer counts prompts otherwise than the server
        assert "surge: warning: the server counted" in capsys.readouterr().err
        seen = b.seen
        for extra, words in (
            (("--sharegpt-output-len", "5"), "--sharegpt-output-len applies to --dataset sharegpt"),
            ((*sg, "--output-len", "4", "--sharegpt-output-len", "5"), "disagree"),
        ):
            rc = bench_main(_serve(s.url, *extra))
            err = capsys.readouterr().err
            assert rc == 2 and words in err and err.count("\n") == 1, err
        assert b.seen == seen


def test_roofline_column_with_known_gpu() -> None:
    from surge.bench.roofline import lookup_gpu

    b = Behaviour(ttft=0.01, itl=0.001)
    with FakeServer(b) as s:
        cfg = ServeConfig(
            base_url=s.url,
            input_len=8,
            output_len=4,
            num_prompts=2,
            disable_tqdm=True,
            hardware=lookup_gpu("h200"),
            model_config=str(BUNDLED_MODEL),
        )
        r = run_serve(cfg)
    assert r["roofline_output_throughput"] > 0 and math.isfinite(r["pct_of_roofline"])
    assert r["pct_of_roofline"] == pytest.approx(
        100 * r["output_throughput"] / r["roofline_output_throughput"]
    )
    assert r["hardware"]["hbm_bandwidth"] == 4.24e12


def test_no_roofline_column_for_a_run_that_is_not_a_burst() -> None:
    """The ceiling is that of a burst (every request sent at t=0): a ``--request-rate 2`` or a
    ``--ramp-up-strategy`` run reported e.g. 1.45 % of it; its roofline fields are null now, as a
    ``--random-prefix-len`` run's."""
    from surge.bench.roofline import lookup_gpu

    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        base = ServeConfig(
            base_url=s.url,
            input_len=8,
            output_len=2,
            num_prompts=3,
            disable_tqdm=True,
            warmup=0,
            hardware=lookup_gpu("h200"),
            model_config=str(BUNDLED_MODEL),
        )
        ramp = dict(ramp_up_strategy="linear", ramp_up_start_rps=50, ramp_up_end_rps=60)
        for cfg in (replace(base, request_rate=40.0), replace(base, **ramp)):
            r = run_serve(cfg)
            assert r["completed"] == 3
            assert r["roofline_output_throughput"] is None and r["pct_of_roofline"] is None
            assert r["hardware"] is None and r["roofline_model"] is None
        burst = run_serve(replace(base, max_concurrency=2))  # a burst under a concurrency cap keeps it
    assert burst["pct_of_roofline"] > 0


def test_roofline_flags_that_give_no_column_are_said_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--gpu`` on a run that gets no roofline column (a finite rate, a ramp-up, a shared prefix,
    another dataset), or the roofline's model flags without a GPU, were taken silently: the result's
    roofline fields were null with no word why. Now one warning line on stderr says so before the
    run, which still runs; a burst of the random dataset with a GPU says nothing."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"hello {i}"}) + "\n" for i in range(2)))
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        base = _serve(s.url, "--warmup", "0", "--output-len", "2", "--num-prompts", "2")
        gpu = ["--gpu", "h200", "--model-config", str(BUNDLED_MODEL)]
        rand = ["--input-len", "8"]
        ramp = ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "50", "--ramp-up-end-rps", "60"]
        for extra, said in (
            ([*gpu, *rand, "--request-rate", "50"], "no roofline column with --request-rate 50 (the ceiling"),
            (
                [*gpu, *rand, *ramp],
                "no roofline column with --ramp-up-strategy (the ceiling",
            ),
            (
                [*gpu, *rand, "--random-prefix-len", "4"],
                "no roofline column with --random-prefix-len (the server",
            ),
            (
                [*gpu, "--dataset", "custom", "--dataset-path", str(prompts)],
                "no roofline column with --dataset custom (the ceiling",
            ),
            ([*rand, "--roofline-tp", "2"], "--roofline-tp changes nothing without the hardware (--gpu NAME"),
            (
                [*rand, "--model-config", str(BUNDLED_MODEL), "--roofline-dtype", "fp8"],
                "--model-config and --roofline-dtype change nothing without the hardware",
            ),
            ([*gpu, *rand], None),
            (rand, None),
        ):
            assert bench_main(base + extra) == 0, extra
            err = capsys.readouterr().err
            if said is None:
                assert "warning" not in err, extra
            else:
                warnings = [line for line in err.splitlines() if "warning" in line]
                assert len(warnings) == 1 and warnings[0].startswith(f"surge: warning: {said}"), err


def test_an_fp8_peak_for_a_bf16_model_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """``--peak-flops-fp8`` only bounds FP8 GEMMs: given where the roofline's weights are not FP8
    it changes no ceiling, and ``bench serve`` says so in one line on stderr before the run, as
    ``bench roofline`` does (it was accepted silently); with FP8 weights, or without the flag,
    stderr stays empty."""
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        base = _serve(s.url, "--warmup", "0", "--input-len", "8", "--output-len", "2", "--num-prompts", "2")
        base += ["--gpu", "h200", "--model-config", str(BUNDLED_MODEL)]
        peak = ["--peak-flops-fp8", "2e15"]
        for extra, said in (
            (peak, "(--roofline-dtype auto; give --roofline-dtype fp8 for FP8 weights)"),
            ([*peak, "--roofline-dtype", "bfloat16"], "(--roofline-dtype bfloat16; give"),
            ([*peak, "--roofline-dtype", "fp8"], None),
            ([], None),
        ):
            assert bench_main(base + extra) == 0, extra
            err = capsys.readouterr().err
            if said is None:
                assert err == "", extra
            else:
                assert err.startswith("surge: warning: --peak-flops-fp8 changes nothing here: no GEMM")
                assert said in err and err.count("\n") == 1, err


def test_roofline_fp8_weights_known_before_the_run() -> None:
    """What the warning above is decided from: --model-config, else a local folder the flags name
    (--tokenizer or the model), else --roofline-dtype alone; unknown (None, no warning) where only
    the server's /v1/models root could tell."""
    from surge.bench.serve import roofline_fp8_weights

    base = ServeConfig(base_url="http://127.0.0.1:1")
    assert roofline_fp8_weights(base) is None
    assert roofline_fp8_weights(replace(base, roofline_dtype="auto")) is None
    assert roofline_fp8_weights(replace(base, roofline_dtype="bfloat16")) is False
    assert roofline_fp8_weights(replace(base, roofline_dtype="fp8")) is True
    for found in (dict(model_config=str(BUNDLED_MODEL)), dict(tokenizer=str(BUNDLED_MODEL))):
        assert roofline_fp8_weights(replace(base, **found)) is False
        assert roofline_fp8_weights(replace(base, roofline_dtype="fp8", **found)) is True


def test_unreachable_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from fake_server import free_port

    rc = bench_main(_serve(f"http://127.0.0.1:{free_port()}", "--num-prompts", "1"))
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("surge: error: cannot reach") and err.count("\n") == 1
    # a new user's likeliest mistake: the server is not started (yet); the line says what to do
    assert "Connection refused" in err and "no server listens there: start one, e.g. `surge serve" in err


def test_unknown_model_and_too_long_points_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(Behaviour()) as s:
        rc = bench_main(_serve(s.url, "--model", "no-such-model", "--num-prompts", "1"))
        err = capsys.readouterr().err
        assert rc == 2 and "does not serve model 'no-such-model'" in err and err.count("\n") == 1
        rc = bench_main(_serve(s.url, "--input-len", "100000", "--output-len", "8", "--num-prompts", "1"))
        err = capsys.readouterr().err
        assert rc == 2 and "max_model_len" in err and err.count("\n") == 1


def test_roofline_column_per_gpu_under_tensor_parallelism() -> None:
    from surge.bench.roofline import Hardware, load_config, lookup_gpu, model_shape, point_roofline

    b = Behaviour(ttft=0.01, itl=0.001)
    with FakeServer(b) as s:
        base = dict(base_url=s.url, input_len=8, output_len=4, num_prompts=2, disable_tqdm=True)
        cfg = ServeConfig(**base, hardware=lookup_gpu("h200"), model_config=str(BUNDLED_MODEL), roofline_tp=2)
        r = run_serve(cfg)
        with pytest.raises(ValueError, match="link bandwidth"):
            ServeConfig(**base, hardware=Hardware("x", 1e12, 1e14), roofline_tp=2).validate()
    shape = model_shape(load_config(BUNDLED_MODEL), tensor_parallel_size=2)
    roof = point_roofline(shape, lookup_gpu("h200"), 2, 8, 4)
    assert r["roofline_output_throughput"] == pytest.approx(roof.output_throughput)
    assert r["hardware"]["tensor_parallel_size"] == 2 and r["hardware"]["link_bandwidth"] == 4.5e11


def test_roofline_column_with_fp8_weights_and_kv_cache() -> None:
    """``--roofline-dtype fp8`` / ``--roofline-kv-cache-dtype fp8``: the ceiling counts the bytes an
    FP8 server reads (``--quantization fp8``, ``--kv-cache-dtype fp8``) and the result says so."""
    from surge.bench.roofline import load_config, lookup_gpu, model_shape, point_roofline

    h200 = lookup_gpu("h200")
    cfg = load_config(BUNDLED_MODEL)
    b = Behaviour(ttft=0.01, itl=0.001)
    with FakeServer(b) as s:
        base = dict(base_url=s.url, input_len=8, output_len=4, num_prompts=2, disable_tqdm=True)
        base |= dict(hardware=h200, model_config=str(BUNDLED_MODEL))
        plain = run_serve(ServeConfig(**base))
        w8 = run_serve(ServeConfig(**base, roofline_dtype="fp8"))
        w8kv8 = run_serve(ServeConfig(**base, roofline_dtype="fp8", roofline_kv_cache_dtype="fp8"))
        for bad in (dict(roofline_dtype="int4"), dict(roofline_kv_cache_dtype="fp16")):
            with pytest.raises(ValueError, match="--roofline-"):
                ServeConfig(**base, **bad).validate()
        # serve's --dtype default and vLLM's KV name, as bench roofline takes them (they were refused)
        ServeConfig(**base, roofline_dtype="auto", roofline_kv_cache_dtype="fp8_e4m3").validate()
    for r, dt, kv in ((plain, None, None), (w8, "fp8", None), (w8kv8, "fp8", "fp8")):
        shape = model_shape(cfg, dt, 1, kv)
        assert r["roofline_output_throughput"] == pytest.approx(
            point_roofline(shape, h200, 2, 8, 4).output_throughput
        )
        assert r["roofline_model"] == {
            "weight_bytes": shape.weight_bytes,
            "kv_bytes_per_token": shape.kv_bytes_per_token,
            "dtype": dt,
            "kv_cache_dtype": kv,
        }
    assert w8["roofline_model"]["weight_bytes"] < plain["roofline_model"]["weight_bytes"]
    # 1 byte per K/V value (this float32 config is held in bf16 on a GPU: 2 bytes each otherwise)
    assert w8kv8["roofline_model"]["kv_bytes_per_token"] * 2 == w8["roofline_model"]["kv_bytes_per_token"]
    assert (
        plain["roofline_output_throughput"]
        < w8["roofline_output_throughput"]
        < w8kv8["roofline_output_throughput"]
    )


def test_bad_result_file_and_timeout_are_one_line_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --result-file that names a folder, or sits under a file, and a --request-timeout that is
    not positive, are refused in one line before any request is sent (no results lost after a run)."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b'[{"id": "\xff"}]')
    behaviour = Behaviour()
    with FakeServer(behaviour) as s:
        for extra, words in (
            (("--result-file", str(tmp_path)), "is a directory"),
            (("--result-file", str(blocker / "r.json")), f"{blocker} is a file, not a folder"),
            (("--request-timeout", "0"), "--request-timeout must be > 0"),
            (("--request-timeout", "-1"), "--request-timeout must be > 0"),
            (("--request-timeout", "inf"), "--request-timeout must be > 0 and finite"),
            (("--gpu", "h200", "--model-config", str(tmp_path / "nope")), "no such folder or file"),
            (("--output-len", "0"), "--output-len must be >= 1"),  # was run at 256 tokens
            (("--extra-body", '{"max_tokens": 3}'), "--extra-body sets 'max_tokens'"),  # had no effect
            (("--extra-body", '{"stream": false}'), "--extra-body sets 'stream'"),
            (("--seed", "-5"), "--seed must be >= 0"),
            # vLLM asserts a positive burstiness (inf is its evenly spaced limit: tests/bench/test_arrivals.py)
            (
                ("--request-rate", "5", "--burstiness", "0"),
                "--burstiness must be > 0 (or inf: evenly spaced)",
            ),
            (
                ("--request-rate", "5", "--burstiness", "nan"),
                "--burstiness must be > 0 (or inf: evenly spaced)",
            ),
            # vLLM ignores it without a rate: the run was a burst all the same
            (("--burstiness", "0.5"), "--burstiness shapes the gaps of --request-rate R"),
            (("--dataset-path", str(SHAREGPT)), "--dataset-path applies to --dataset sharegpt"),
            (
                ("--dataset", "sharegpt", "--dataset-path", str(SHAREGPT), "--input-len", "64"),
                "--input-len applies",
            ),
            (("--dataset", "sharegpt", "--dataset-path", str(tmp_path)), "is a directory"),
            (("--dataset", "sharegpt", "--dataset-path", str(blocker)), "not JSON"),
            (("--dataset", "sharegpt", "--dataset-path", str(binary)), "not UTF-8"),
        ):
            rc = bench_main(_serve(s.url, "--num-prompts", "1", *extra))
            err = capsys.readouterr().err
            assert rc == 2 and err.startswith("surge: error:") and words in err and err.count("\n") == 1, err
        assert behaviour.seen == 0  # refused before the first request
        rc = bench_main(
            _serve(s.url, "--num-prompts", "1", "--result-file", str(tmp_path / "new" / "r.json"))
        )
        assert rc == 0 and (tmp_path / "new" / "r.json").is_file()


def test_a_run_refused_after_the_path_checks_leaves_no_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The result's folder (``--result-file D/x.json``, ``--result-dir D``) was made while its path
    was checked, so a run refused by a later check (the chat endpoint's least ``--input-len``,
    known once the server's model is) left an empty D behind. The path is checked without making
    it; the folder is made when the result is written."""
    chat = ("--endpoint", "/v1/chat/completions", "--input-len", "1", "--output-len", "4")
    with FakeServer(Behaviour()) as s:
        for out in (
            ("--result-file", str(tmp_path / "d1" / "sub" / "x.json")),
            ("--save-result", "--result-dir", str(tmp_path / "d2")),
            ("--save-result", "--result-dir", str(tmp_path / "d3"), "--result-filename", "x.json"),
        ):
            rc = bench_main(_serve(s.url, "--num-prompts", "1", *chat, *out))
            err = capsys.readouterr().err
            assert rc == 2 and "below the chat template's minimum" in err and err.count("\n") == 1, err
        assert sorted(p.name for p in tmp_path.iterdir()) == []
        rc = bench_main(
            _serve(s.url, "--num-prompts", "1", "--save-result", "--result-dir", str(tmp_path / "d2"))
        )
        assert rc == 0 and len(list((tmp_path / "d2").glob("*.json"))) == 1


def test_matrix_refuses_a_negative_stop_after(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    behaviour = Behaviour()
    with FakeServer(behaviour) as s:
        grid = (
            "--concurrency",
            "1",
            "--input-len",
            "8",
            "--output-len",
            "8",
            "--output-dir",
            str(tmp_path / "m"),
        )
        rc = bench_main(
            ["bench", "matrix", "--base-url", s.url, "--disable-tqdm", *grid, "--stop-after", "-5"]
        )
        err = capsys.readouterr().err
    assert rc == 2 and "--stop-after must be >= 0 seconds, got -5" in err and err.count("\n") == 1
    assert behaviour.seen == 0


def test_a_401_hint_says_whether_a_key_was_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    import surge.bench.serve as bs

    def refuse(url: str, api_key: str | None, insecure: bool = False, headers: object = ()) -> object:
        raise OSError("HTTP Error 401: Unauthorized")

    monkeypatch.setattr(bs, "get_json", refuse)
    with pytest.raises(ValueError, match=r"401: Unauthorized \(pass --api-key or set \$OPENAI_API_KEY\)$"):
        bs.fetch_models("http://127.0.0.1:1", None)
    with pytest.raises(ValueError, match=r"401: Unauthorized \(check --api-key or \$OPENAI_API_KEY\)$"):
        bs.fetch_models("http://127.0.0.1:1", "wrong-key")


def test_a_401_hint_names_the_header_that_replaced_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's --header Authorization=... replaces --api-key's header (any case of the name): a 401
    then comes of that header, and the hint said "pass --api-key" or "check --api-key"."""
    import surge.bench.serve as bs

    def refuse(url: str, api_key: str | None, insecure: bool = False, headers: object = ()) -> object:
        raise OSError("HTTP Error 401: Unauthorized")

    monkeypatch.setattr(bs, "get_json", refuse)
    for key in (None, "a-key"):
        with pytest.raises(ValueError, match=r"401: Unauthorized \(check --header authorization=\.\.\.\)$"):
            bs.fetch_models("http://127.0.0.1:1", key, headers=(("x-a", "1"), ("authorization", "Bearer x")))
    with pytest.raises(ValueError, match=r"401: Unauthorized \(pass --api-key or set \$OPENAI_API_KEY\)$"):
        bs.fetch_models("http://127.0.0.1:1", None, headers=(("x-a", "1"),))


def test_a_request_timeout_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(Behaviour(ttft=2.0)) as s:
        rc = bench_main(_serve(s.url, "--num-prompts", "1", "--request-timeout", "0.3"))
    err = capsys.readouterr().err
    assert rc == 2 and "the request timed out (--request-timeout 0.3 s)" in err and err.count("\n") == 1, err


def test_a_result_file_that_cannot_be_written_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """/proc passes the writability pre-check as root, then the write fails: one line, not a traceback
    (a non-root run is refused by the pre-check, also in one line)."""
    with FakeServer(Behaviour()) as s:
        rc = bench_main(_serve(s.url, "--num-prompts", "1", "--result-file", "/proc/surge-result.json"))
    err = capsys.readouterr().err
    assert (
        rc == 2
        and err.startswith("surge: error: --result-file /proc/surge-result.json")
        and err.count("\n") == 1
    ), err


@pytest.mark.parametrize(
    ("env", "flag", "want"),
    [("sk-env", None, "Bearer sk-env"), ("sk-env", "sk-flag", "Bearer sk-flag"), ("", None, None)],
)
def test_api_key_from_openai_api_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str, flag: str | None, want: str | None
) -> None:
    """As vLLM's bench: ``$OPENAI_API_KEY`` is the key unless ``--api-key`` is given; an empty
    variable sends no header. The key reaches every request, /v1/models included, and never
    the result file."""
    monkeypatch.setenv("OPENAI_API_KEY", env)
    b = Behaviour(ttft=0.01, itl=0.005)
    out = tmp_path / "r.json"
    with FakeServer(b) as s:
        argv = _serve(s.url, "--input-len", "8", "--output-len", "3", "--num-prompts", "2", "--ignore-eos")
        argv += ["--result-file", str(out), "--disable-tqdm"] + (["--api-key", flag] if flag else [])
        assert bench_main(argv) == 0
    assert b.log and all(entry["auth"] == want for entry in b.log), b.log
    assert "sk-" not in out.read_text()


def test_random_range_ratio_per_request_lengths_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``--random-range-ratio`` every request asks its own drawn output length and is held
    to it (exact-length validation per request), and the result records the ratio and the
    per-request lengths; the option is refused with ShareGPT and outside [0, 1)."""
    out = tmp_path / "r.json"
    with FakeServer(Behaviour()) as s:
        args = _serve(s.url, "--input-len", "40", "--output-len", "12", "--num-prompts", "12", "--ignore-eos")
        rc = bench_main(args + ["--random-range-ratio", "0.5", "--result-file", str(out)])
        assert rc == 0
        r = json.loads(out.read_text())
        assert (r["completed"], r["failed"], r["random_range_ratio"]) == (12, 0, 0.5)
        assert all(20 <= n <= 60 for n in r["input_lens"]) and len(set(r["input_lens"])) > 3
        assert all(6 <= n <= 18 for n in r["output_lens"]) and len(set(r["output_lens"])) > 3
        assert r["total_output_tokens"] == sum(r["output_lens"])
        assert bench_main(args + ["--random-range-ratio", "1.0"]) == 2
        assert "--random-range-ratio must be in [0, 1), got 1.0" in capsys.readouterr().err
        sharegpt = _serve(
            s.url, "--dataset", "sharegpt", "--dataset-path", str(SHAREGPT), "--random-range-ratio", "0.2"
        )
        assert bench_main(sharegpt) == 2
        assert "--random-range-ratio applies to --dataset random" in capsys.readouterr().err
        # vLLM's other form: a ratio for the inputs and one for the outputs
        out2 = tmp_path / "r2.json"
        ratios = '{"input": 0, "output": 0.5}'
        assert bench_main(args + ["--random-range-ratio", ratios, "--result-file", str(out2)]) == 0
        r = json.loads(out2.read_text())
        assert r["random_range_ratio"] == {"input": 0.0, "output": 0.5} and r["input_lens"] == [40] * 12
        assert all(6 <= n <= 18 for n in r["output_lens"]) and len(set(r["output_lens"])) > 3
        for bad in ('{"input": 0.2}', '{"input": 0.2, "output": "x"}', "[0.2]", "wide"):
            assert bench_main(args + ["--random-range-ratio", bad]) == 2
            err = capsys.readouterr().err
            assert """--random-range-ratio takes a number or '{"input": R, "output": R}'""" in err, err
            assert err.count("\n") == 1
        assert bench_main(args + ["--random-range-ratio", '{"input": 0.2, "output": 1.5}']) == 2
        assert "--random-range-ratio must be in [0, 1), got 1.5" in capsys.readouterr().err


def test_a_base_url_ending_in_v1_gets_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    """``--base-url http://host:port/v1`` (the OpenAI client's base URL) reaches ``/v1/v1/models``:
    the one-line error says that ``--base-url`` is the server's root and gives it."""
    with FakeServer(Behaviour()) as s:
        assert bench_main(_serve(s.url + "/v1", "--num-prompts", "1")) == 2
    err = capsys.readouterr().err
    assert "404" in err and f"(--base-url is the server's root: {s.url})" in err, err
    assert "Traceback" not in err


def test_a_base_url_without_its_scheme_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """``--base-url 127.0.0.1:8000`` (host and port, as ``curl`` takes them) was "cannot reach
    127.0.0.1:8000/v1/models: unknown url type: 127.0.0.1"; the one line now gives the URL to pass,
    on ``bench serve`` and ``bench matrix``."""
    for given in ("127.0.0.1:8000", "localhost:8000", "ftp://localhost:8000"):
        assert bench_main(_serve(given, "--num-prompts", "1")) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        host = given.split("://")[-1]
        assert f"--base-url {given}: give the URL with its scheme, e.g. http://{host}" in err, err
    assert bench_main(["bench", "matrix", "--base-url", "localhost:8000", "--preset", "official-8b"]) == 2
    assert "give the URL with its scheme, e.g. http://localhost:8000" in capsys.readouterr().err


def test_a_bad_host_or_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A space in the host or a port that is not a number was a 45-line traceback ending in
    ``http.client.InvalidURL``; ``--host http://127.0.0.1`` became ``http://[http://127.0.0.1]:8000``.
    Each is now one ``surge: error:`` line (exit 2) before anything is sent, on serve and matrix."""
    cases = [
        (["--host", "a b", "--port", "8620"], "--host 'a b': not a host name or address"),
        (["--host", ""], "--host '': not a host name or address (it is empty)"),
        (["--base-url", "http://a b:8620"], "--base-url 'http://a b:8620': a URL cannot hold a space"),
        (["--base-url", "http://127.0.0.1:abc"], "the port must be a number in [1, 65535], got 'abc'"),
        (["--base-url", "http://[::1]:99999"], "the port must be a number in [1, 65535], got '99999'"),
        (["--base-url", "http://:8000"], "--base-url http://:8000: the URL names no host"),
        (["--base-url", "http://[::1"], "--base-url http://[::1: not a valid URL"),
        (
            ["--host", "http://127.0.0.1"],
            "--host http://127.0.0.1: give the host alone, e.g. --host 127.0.0.1 (or the whole URL: "
            "--base-url http://127.0.0.1)",
        ),
        (
            ["--host", "127.0.0.1:8620"],
            "--host 127.0.0.1:8620: give the host alone and the port with --port, e.g. --host 127.0.0.1 --port 8620",
        ),
    ]
    for flags, message in cases:
        assert bench_main(["bench", "serve", *flags, "--num-prompts", "1", "--disable-tqdm"]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith("surge: error: ") and err.count("\n") == 1 and message in err, err
    grid = ["--concurrency", "1", "--input-len", "16", "--output-len", "4"]
    assert bench_main(["bench", "matrix", "--base-url", "http://127.0.0.1:abc", *grid]) == 2
    err = capsys.readouterr().err
    assert "got 'abc'" in err and err.count("\n") == 1, err
    # an IPv6 address is still bracketed
    from surge.bench.cli import base_url_of

    url = base_url_of(argparse.Namespace(base_url=None, host="::1", port=9))
    assert url == "http://[::1]:9"


def test_fetch_models_names_a_url_http_client_refuses() -> None:
    """``http.client.InvalidURL`` is no OSError: it escaped ``fetch_models`` as a traceback."""
    from surge.bench.serve import fetch_models

    with pytest.raises(ValueError, match=r"cannot reach http://127\.0\.0\.1:abc/v1/models: nonnumeric port"):
        fetch_models("http://127.0.0.1:abc", None)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_unwritable_result_file_or_output_dir_is_refused_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--result-file /proc/x.json` failed only after the whole run (root passes os.access, then
    the write fails), and a matrix `--output-dir /proc` with a traceback after its first point.
    Both are now one line, rc 2, before any request (a real try: the file is created and removed;
    an existing result file is left as it was)."""
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        serve = ["bench", "serve", "--base-url", s.url, "--disable-tqdm", "--num-prompts", "2"]
        matrix = ["bench", "matrix", "--base-url", s.url, "--disable-tqdm", "--concurrency", "1"]
        for argv, words in (
            (
                [*serve, "--input-len", "8", "--output-len", "4", "--result-file", "/proc/x.json"],
                "--result-file /proc/x.json: ",
            ),
            (
                [*matrix, "--input-len", "8", "--output-len", "4", "--output-dir", "/proc"],
                "--output-dir /proc: ",
            ),
        ):
            assert bench_main(argv) == 2
            captured = capsys.readouterr()
            assert captured.err.startswith(f"surge: error: {words}") and captured.err.count("\n") == 1, (
                captured.err
            )
            assert "Traceback" not in captured.err and not b.log  # nothing was sent
    from surge.bench.results import cannot_write

    kept = tmp_path / "kept.json"
    kept.write_text("earlier")
    assert cannot_write(kept) is None and kept.read_text() == "earlier"  # opened to append, not changed
    assert cannot_write(tmp_path / "new.json") is None and not (tmp_path / "new.json").exists()
    assert cannot_write(Path("/proc/x.json")) is not None


def test_length_errors_name_the_flag_the_user_gave(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's --random-input-len / --random-output-len (and --input-len / --output-len with
    --dataset sonnet) set the same lengths: an error names the flag that was typed, in one line."""
    sonnet = tmp_path / "sonnet.txt"
    sonnet.write_text("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n")
    cases = (
        (
            ("--random-input-len", "100000", "--output-len", "8"),
            "--random-input-len 100000 + --output-len 8 exceeds",
        ),
        (
            ("--input-len", "100", "--random-output-len", "100000"),
            "--input-len 100 + --random-output-len 100000 exceeds",
        ),
        (
            ("--random-input-len", "1"),
            "--random-input-len 1 is below the chat template's minimum of 7: give --random-input-len 7",
        ),
        (
            ("--random-input-len", "1", "--random-prefix-len", "4", "--endpoint", "/v1/completions"),
            "--random-input-len 1 is below the minimum of 2 with --random-prefix-len 4",
        ),
        (
            ("--dataset", "sonnet", "--dataset-path", str(sonnet), "--input-len", "100000"),
            "--input-len 100000 + --sonnet-output-len 150 exceeds",
        ),
        (
            ("--dataset", "sonnet", "--dataset-path", str(sonnet), "--input-len", "3"),
            "--input-len 3 must be above the",
        ),
        (
            ("--dataset", "sonnet", "--dataset-path", str(sonnet), "--sonnet-output-len", "100000"),
            "--sonnet-input-len 550 + --sonnet-output-len 100000 exceeds",
        ),
    )
    with FakeServer(Behaviour()) as s:
        for args, words in cases:
            assert bench_main(_serve(s.url, "--num-prompts", "1", *args)) == 2, args
            err = capsys.readouterr().err
            assert words in err and err.count("\n") == 1, (args, err)
