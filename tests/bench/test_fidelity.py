"""Benchmark fidelity: vLLM's chunk rule, fresh prompts per point, prefix-cache resets, repeats,
resume, gzipped per-request files, exact chat prompt lengths, and a launcher that never measures
the wrong server."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import BUNDLED_MODEL, bench_main
from fake_server import Behaviour, FakeServer, free_port

from surge.bench.client import counts_as_output
from surge.bench.datasets import exact_length_prompt, random_requests
from surge.bench.matrix import MatrixPoint, combine_runs, point_seed
from surge.bench.results import load_result
from surge.bench.serve import ServeConfig, run_serve

FAKE = Path(__file__).with_name("fake_server.py")


def test_chunk_rule_unit() -> None:
    chat = [
        ({"delta": {"role": "assistant", "content": ""}}, False),  # leading role-only chunk
        ({"delta": {}}, False),  # separate finish chunk
        ({"delta": {"role": "assistant"}}, False),
        ({"delta": {"content": None}}, False),
        ({"delta": {"content": ""}}, True),  # a token whose text is empty
        ({"delta": {"role": "assistant", "content": "Hi"}}, True),
        ({"delta": {"content": "x"}}, True),
        ({"delta": {"reasoning_content": "think"}}, True),
        ({"delta": {"reasoning": "think"}}, True),
        ({"delta": {"tool_calls": [{"index": 0}]}}, True),
        ({"text": "x"}, False),
    ]
    for choice, want in chat:
        assert counts_as_output(choice, chat=True) is want, choice
    assert counts_as_output({"text": ""}, chat=False) is True  # completions: every choice chunk counts


def test_chunk_rule_leading_role_and_finish_chunks() -> None:
    """TTFT, ITL count, E2EL and TPOT by vLLM's definitions on known timings: the role-only chunk
    at t=0 and the finish-only chunk after the last token do not count."""
    ttft, itl, n = 0.25, 0.05, 8
    b = Behaviour(ttft=ttft, itl=itl, role_chunk=True, finish_chunk=True)
    with FakeServer(b) as s:
        cfg = ServeConfig(
            base_url=s.url, input_len=8, output_len=n, num_prompts=2, warmup=0, disable_tqdm=True
        )
        r = run_serve(cfg)
    assert r["failed"] == 0
    assert r["mean_ttft_ms"] == pytest.approx(ttft * 1000, rel=0.25)
    assert min(r["ttfts"]) > 0.8 * ttft  # not the ~1 ms of the role chunk
    assert all(len(x) == n - 1 for x in r["itls"])  # no gap for the finish chunk
    assert r["mean_itl_ms"] == pytest.approx(itl * 1000, rel=0.3)
    e2el = ttft + (n - 1) * itl  # ends at the last token, not at the finish chunk
    assert r["mean_e2el_ms"] == pytest.approx(e2el * 1000, rel=0.25)
    for t, lat, gaps in zip(r["ttfts"], r["latencies"], r["itls"], strict=True):
        assert lat == pytest.approx(t + sum(gaps), abs=1e-9)
    assert r["mean_tpot_ms"] == pytest.approx(
        1000 * np.mean([(lat - t) / (n - 1) for t, lat in zip(r["ttfts"], r["latencies"], strict=True)])
    )


def test_chunk_rule_multi_token_chunks() -> None:
    b = Behaviour(ttft=0.1, itl=0.05, tokens_per_chunk=3, role_chunk=True)
    with FakeServer(b) as s:
        cfg = ServeConfig(
            base_url=s.url, input_len=8, output_len=9, num_prompts=1, warmup=0, disable_tqdm=True
        )
        r = run_serve(cfg)
    assert r["output_lens"] == [9] and len(r["itls"][0]) == 2  # 3 chunks of 3 tokens: 2 gaps
    assert r["ttfts"][0] > 0.08
    assert r["mean_tpot_ms"] == pytest.approx(1000 * (r["latencies"][0] - r["ttfts"][0]) / 8)


def test_vllm_host_and_port_flags_name_the_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`vllm bench serve --host H --port P` was refused as unrecognized arguments; they make
    http://H:P (--base-url with either is refused: neither is dropped silently)."""
    argv = ["bench", "serve", "--disable-tqdm", "--input-len", "8", "--output-len", "4", "--num-prompts", "2"]
    out = tmp_path / "r.json"
    with FakeServer(Behaviour()) as s:
        assert (
            bench_main(argv + ["--host", "127.0.0.1", "--port", str(s.port), "--result-file", str(out)]) == 0
        )
        assert bench_main(argv + ["--port", str(s.port)]) == 0  # --host defaults to 127.0.0.1, as vLLM's
        assert len(s.behaviour.log) >= 4
        assert bench_main(argv + ["--base-url", s.url, "--port", str(s.port)]) == 2
    assert "give --base-url or --host/--port, not both" in capsys.readouterr().err
    assert load_result(out)["base_url"] == s.url


def test_client_settings_and_result_fields(tmp_path: Path) -> None:
    b = Behaviour(ttft=0.01, itl=0.002)
    out = tmp_path / "r.json.gz"
    with FakeServer(b) as s:
        rc = bench_main(
            ["bench", "serve", "--base-url", s.url, "--disable-tqdm", "--input-len", "8", "--output-len", "4"]
            + ["--num-prompts", "4", "--max-concurrency", "2", "--temperature", "0.5", "--label", "mine"]
            + ["--extra-body", '{"top_k": 3, "temperature": 0.7}', "--result-file", str(out)]
        )
    assert rc == 0
    r = load_result(out)
    assert r["label"] == "mine" and r["endpoint_type"] == "openai-chat" and r["temperature"] == 0.5
    for k in ("latencies", "queue_times", "start_times", "ttfts", "itls", "input_lens", "output_lens"):
        assert len(r[k]) == 4, k
    assert r["max_concurrent_requests"] >= 1
    assert max(r["queue_times"]) > 0  # concurrency 2 of 4 requests: two waited on the semaphore
    bodies = [e["body"] for e in b.log]
    assert all(x["top_k"] == 3 and x["temperature"] == 0.7 for x in bodies)  # --extra-body wins


def test_prompt_fields_of_extra_body_keep_input_len_exact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server's usage.prompt_tokens equals --input-len when --extra-body changes the prompt:
    chat_template_kwargs (counted through /tokenize with them), add_special_tokens on the
    completions endpoint. A /tokenize that refuses a prompt field stops the run with one line."""
    no_think = '{"chat_template_kwargs": {"enable_thinking": false}, "top_k": 1}'
    argv = [
        "bench",
        "serve",
        "--disable-tqdm",
        "--input-len",
        "20",
        "--output-len",
        "4",
        "--num-prompts",
        "3",
    ]
    b = Behaviour(ttft=0.005, itl=0.001)
    with FakeServer(b) as s:
        out = tmp_path / "chat.json"
        assert (
            bench_main(argv + ["--base-url", s.url, "--extra-body", no_think, "--result-file", str(out)]) == 0
        )
        assert load_result(out)["input_lens"] == [20] * 3  # the server's own count (usage)
        assert all(e["body"]["chat_template_kwargs"] == {"enable_thinking": False} for e in b.log)
        out = tmp_path / "completions.json"
        no_bos = ["--endpoint", "/v1/completions", "--extra-body", '{"add_special_tokens": false}']
        assert bench_main(argv + ["--base-url", s.url, *no_bos, "--result-file", str(out)]) == 0
        assert load_result(out)["input_lens"] == [20] * 3
        capsys.readouterr()
        tools = '{"tools": [{"type": "function", "function": {"name": "f"}}]}'
        n = len(b.log)
        assert bench_main(argv + ["--base-url", s.url, "--extra-body", tools]) == 2
        err = capsys.readouterr().err
        assert err.startswith(
            "surge: error: the server's /tokenize refused the prompt fields of --extra-body"
        )
        assert "(tools)" in err and "--tokenizer DIR" in err and err.count("\n") == 1, err
        assert len(b.log) == n  # nothing was measured


def test_a_server_that_counts_prompts_otherwise_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local --tokenizer that is not the server's (here the bundled model's, against the fake
    word-level server): the run completes, reports the server's counts, and says so in one line."""
    b = Behaviour(ttft=0.005, itl=0.001)
    out = tmp_path / "r.json"
    with FakeServer(b) as s:
        rc = bench_main(
            [
                "bench",
                "serve",
                "--base-url",
                s.url,
                "--disable-tqdm",
                "--input-len",
                "20",
                "--output-len",
                "4",
            ]
            + ["--num-prompts", "2", "--tokenizer", str(BUNDLED_MODEL), "--result-file", str(out)]
        )
    captured = capsys.readouterr()
    assert rc == 0 and load_result(out)["input_lens"] != [20, 20]
    # on stderr as "surge: warning:", as every other warning (it was on stdout, amid the result)
    line = next(x for x in captured.err.splitlines() if x.startswith("surge: warning: "))
    assert "where the benchmark counted 20 (2 of 2 requests differ)" in line
    assert "warning" not in captured.out


def test_bad_extra_body_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("{", "[1]"):
        rc = bench_main(["bench", "serve", "--extra-body", bad])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("surge: error: --extra-body") and err.count("\n") == 1


def test_point_seeds_differ_and_are_stable() -> None:
    pts = [MatrixPoint(c, i, o) for c in (1, 4) for i in (32, 256) for o in (256, 1024)]
    seeds = {point_seed(0, p, r) for p in pts for r in range(3)}
    assert len(seeds) == len(pts) * 3
    assert point_seed(0, pts[0]) == point_seed(0, pts[0]) != point_seed(1, pts[0])
    with pytest.raises(ValueError):
        point_seed(-1, pts[0])


def _matrix(url: str, out: Path, *extra: str) -> int:
    return bench_main(
        ["bench", "matrix", "--base-url", url, "--disable-tqdm", "--output-dir", str(out), *extra]
        + ["--input-len", "8", "--output-len", "4"]
    )


def test_matrix_fresh_prompts_per_point_and_reset(tmp_path: Path) -> None:
    b = Behaviour(ttft=0.005, itl=0.001, reset_route=True)
    with FakeServer(b) as s:
        assert _matrix(s.url, tmp_path / "a", "--concurrency", "1,2,3") == 0
        first = [e["body"]["messages"][0]["content"] for e in b.log]
        assert b.resets == 3  # one reset before each point
        assert _matrix(s.url, tmp_path / "b", "--concurrency", "1,2,3", "--keep-prefix-cache") == 0
        assert b.resets == 3
        second = [e["body"]["messages"][0]["content"] for e in b.log[len(first) :]]
    # 3 points: 1+1, 1+2, 1+3 requests (warm-up + timed), every prompt different within a run
    assert len(first) == 9 and len(set(first)) == 9
    assert sorted(first) == sorted(second)  # the same (seed, point) gives the same prompts
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    for p in summary["points"]:
        r = load_result(tmp_path / "a" / p["result_file"])
        assert r["prefix_cache_reset"] is True and r["matrix_seed"] == 0
        assert r["seed"] == point_seed(0, MatrixPoint(p["concurrency"], 8, 4))
    assert load_result(tmp_path / "b" / "C1_I8_O4.json")["prefix_cache_reset"] is None


def test_matrix_repeats_statistics_and_gzip(tmp_path: Path) -> None:
    b = Behaviour(ttft=0.005, itl=0.002)
    out = tmp_path / "m"
    with FakeServer(b) as s:
        assert _matrix(s.url, out, "--concurrency", "2", "--repeats", "3") == 0
    prompts = [e["body"]["messages"][0]["content"] for e in b.log]
    assert len(prompts) == 9 and len(set(prompts)) == 9  # fresh prompts for every repeat
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["points"]
    assert row["repeats"] == 3 and row["repeats_ok"] == 3 and row["success"]
    assert row["completed"] == 6 and row["num_prompts"] == 6
    files = row["result_files"]
    assert files == ["C2_I8_O4_r1.json", "C2_I8_O4_r2.json", "C2_I8_O4_r3.json"]
    thr = [load_result(out / f)["output_throughput"] for f in files]
    assert row["output_throughput"] == pytest.approx(np.mean(thr))
    assert row["output_throughput_std"] == pytest.approx(np.std(thr))
    assert (row["output_throughput_min"], row["output_throughput_max"]) == (min(thr), max(thr))
    assert [r["output_throughput"] for r in row["runs"]] == thr
    for f in files:  # per-request lists live in a gzip file next to the small JSON
        small = json.loads((out / f).read_text())
        assert "itls" not in small and small["requests_file"].endswith(".requests.json.gz")
        assert (out / small["requests_file"]).read_bytes()[:2] == b"\x1f\x8b"
        assert len(load_result(out / f)["itls"]) == 2
    assert "±" in (out / "summary.md").read_text()


def test_matrix_summary_has_p99_whatever_percentiles_asks(tmp_path: Path) -> None:
    """--percentiles 50,90 adds P50/P90 to each point's file; the summary's P99 columns are
    still filled (they were n/a: the runs computed no P99)."""
    out = tmp_path / "m"
    with FakeServer(Behaviour(ttft=0.005, itl=0.002)) as s:
        assert _matrix(s.url, out, "--concurrency", "2", "--percentiles", "50,90") == 0
    (row,) = json.loads((out / "summary.json").read_text())["points"]
    for key in ("p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms", "median_e2el_ms"):
        assert isinstance(row[key], float) and row[key] > 0, (key, row[key])
    assert row["request_goodput"] is None  # no --goodput
    r = load_result(out / row["result_file"])
    assert r["median_e2el_ms"] == row["median_e2el_ms"]
    assert r["p50_ttft_ms"] > 0 and r["p90_itl_ms"] > 0 and r["p99_ttft_ms"] == row["p99_ttft_ms"]
    (line,) = [x for x in (out / "summary.md").read_text().splitlines() if x.startswith("| 2 | 8 | 4 |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert "n/a" not in cells[:11], line  # only the roofline columns (no --gpu) are n/a


def test_combine_runs_by_hand() -> None:
    pt = MatrixPoint(2, 8, 4)
    runs = [
        {"success": True, "result_file": f"r{i}.json", "error": None, "completed": 2, "failed": 0, **v}
        for i, v in enumerate(
            [
                {"output_throughput": 100.0, "mean_ttft_ms": 10.0},
                {"output_throughput": 120.0, "mean_ttft_ms": 14.0},
            ]
        )
    ]
    row = combine_runs(pt, runs)
    assert row["output_throughput"] == 110.0 and row["output_throughput_std"] == 10.0
    assert row["mean_ttft_ms"] == 12.0 and row["mean_ttft_ms_std"] == 2.0
    assert row["completed"] == 4 and row["success"]
    bad = combine_runs(pt, [runs[0], {**runs[1], "success": False, "error": "boom", "completed": 1}])
    assert not bad["success"] and bad["output_throughput"] == 100.0 and "run 2: boom" in bad["error"]


def test_matrix_resume_and_stop_after(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = Behaviour(ttft=0.005, itl=0.001)
    out = tmp_path / "m"
    with FakeServer(b) as s:
        assert _matrix(s.url, out, "--concurrency", "1,2,3", "--stop-after", "0") == 1  # one point, then stop
        first = json.loads((out / "summary.json").read_text())
        assert len(first["points"]) == 1 and first["earlier_runs"] == []
        first["server_restarts"] = 1  # as if a --launch-ed server had died during that run
        (out / "summary.json").write_text(json.dumps(first))
        n = len(b.log)
        assert _matrix(s.url, out, "--concurrency", "1,2,3", "--resume") == 0
        assert len(b.log) - n == (1 + 2) + (1 + 3)  # only points C2 and C3 ran
    summary = json.loads((out / "summary.json").read_text())
    assert [p["concurrency"] for p in summary["points"]] == [1, 2, 3] and summary["num_successful"] == 3
    # the run whose point was kept stays on record (its command and date were overwritten)
    assert summary["earlier_runs"] == [
        {"date": first["date"], "command": first["command"], "server_restarts": 1}
    ]
    assert summary["server_restarts"] == 1  # it was reset to this run's 0
    assert "resuming: 1 point(s) already done" in capsys.readouterr().out
    # points measured with other settings are not mixed in: a one-line error naming the setting,
    # nothing sent (on the same server: another one's URL would be refused before the setting)
    with FakeServer(b) as s:
        n = len(b.log)
        for flags, field in (
            (["--base-url", s.url], "base_url"),
            (["--base-url", summary["base_url"], "--seed", "7"], "seed"),
            (["--base-url", summary["base_url"], "--endpoint", "/v1/completions"], "endpoint"),
            (["--base-url", summary["base_url"], "--temperature", "0"], "temperature"),
            # its points were measured after a reset each
            (["--base-url", summary["base_url"], "--keep-prefix-cache"], "prefix_cache_reset"),
            # its rows are single runs (another count re-ran every kept point, silently)
            (["--base-url", summary["base_url"], "--repeats", "2"], "repeats"),
            # its points were measured after one warm-up request each
            (["--base-url", summary["base_url"], "--warmup", "0"], "warmup"),
        ):
            assert _matrix(s.url, out, "--concurrency", "1,2,3,4", "--resume", *flags) == 2
            err = capsys.readouterr().err
            assert err.startswith(
                f"surge: error: --resume: {out / 'summary.json'} was measured with {field} "
            )
            assert err.count("\n") == 1, err
        assert len(b.log) == n
        # --percentiles only changes what a new point's file reports: the kept points stay
        base = ["--base-url", summary["base_url"], "--concurrency", "1,2,3", "--resume"]
        assert _matrix(s.url, out, *base, "--percentiles", "50,90") == 0
        assert len(b.log) == n
        assert "resuming: 3 point(s) already done" in capsys.readouterr().out


def test_matrix_refused_reset_warns_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that refuses /reset_prefix_cache: "surge: warning:" on stderr, as every other
    warning (it was "[matrix] warning:" on stdout, among the progress lines)."""
    import surge.bench.matrix as matrix

    monkeypatch.setattr(matrix, "reset_prefix_cache", lambda *a, **k: False)
    with FakeServer(Behaviour(ttft=0.005, itl=0.001)) as s:
        assert _matrix(s.url, tmp_path / "m", "--concurrency", "1") == 0
    captured = capsys.readouterr()
    line = "surge: warning: the server refused /reset_prefix_cache before this run"
    assert line in captured.err.splitlines() and "/reset_prefix_cache before" not in captured.out


def test_matrix_goodput_has_a_summary_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench matrix --goodput`: summary.json stored each point's request_goodput but summary.md
    had no column for it. It now has one (only with --goodput), the SLOs are in summary.json,
    and a --resume with other SLOs is refused (the column would mix them)."""
    b = Behaviour(ttft=0.005, itl=0.001)
    with FakeServer(b) as s:
        assert _matrix(s.url, tmp_path / "g", "--concurrency", "1,2", "--goodput", "ttft:10000") == 0
        assert _matrix(s.url, tmp_path / "plain", "--concurrency", "1") == 0
        capsys.readouterr()
        assert _matrix(s.url, tmp_path / "g", "--concurrency", "1,2", "--resume", "--goodput", "ttft:1") == 2
        err = capsys.readouterr().err
        assert "was measured with goodput_slo_ms {'ttft': 10000.0}" in err and err.count("\n") == 1, err
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert summary["goodput_slo_ms"] == {"ttft": 10000.0}
    lines = (tmp_path / "g" / "summary.md").read_text().splitlines()
    header = next(x for x in lines if x.startswith("| C |"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    col = cells.index("goodput req/s")
    assert cells[col - 1] == "total tok/s" and lines[lines.index(header) + 1].count("|") == len(cells) + 1
    for point in summary["points"]:
        (row,) = [x for x in lines if x.startswith(f"| {point['concurrency']} | 8 | 4 |")]
        value = [c.strip() for c in row.strip("|").split("|")][col]
        assert value == f"{point['request_goodput']:.2f}" and point["request_goodput"] > 0
    plain = (tmp_path / "plain" / "summary.md").read_text().splitlines()
    assert "goodput" not in next(x for x in plain if x.startswith("| C |"))
    assert json.loads((tmp_path / "plain" / "summary.json").read_text())["goodput_slo_ms"] is None


def test_matrix_resume_with_another_grid_keeps_the_earlier_points(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --resume whose grid differs from the earlier run's adds its points: the earlier points
    outside the new grid stay in the summary (they were dropped from it while their files and
    ``earlier_runs`` stayed, so ``bench compare`` against the folder found no common point)."""
    b = Behaviour(ttft=0.005, itl=0.001)
    out = tmp_path / "m"
    with FakeServer(b) as s:
        assert _matrix(s.url, out, "--concurrency", "1,2") == 0
        first = json.loads((out / "summary.json").read_text())
        n = len(b.log)
        assert _matrix(s.url, out, "--concurrency", "2,3", "--resume") == 0
        assert len(b.log) - n == 1 + 3  # only C3 ran
    summary = json.loads((out / "summary.json").read_text())
    assert [p["concurrency"] for p in summary["points"]] == [2, 3, 1] and summary["num_successful"] == 3
    assert summary["points"][2] == first["points"][0]
    assert summary["earlier_runs"][-1]["command"] == first["command"]
    assert "resuming: 1 point(s) already done in" in capsys.readouterr().out
    assert "| 1 | 8 | 4 |" in (out / "summary.md").read_text()


def test_matrix_rerun_without_resume_moves_the_earlier_run_aside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new run into a folder holding an earlier one (no --resume) first moves the earlier run's
    files to ``earlier-DATE/``: they stayed beside the new ones, the earlier points outside the new
    grid listed by no summary. Files a matrix does not write stay where they are."""
    b = Behaviour(ttft=0.005, itl=0.001)
    out = tmp_path / "m"
    with FakeServer(b) as s:
        assert _matrix(s.url, out, "--concurrency", "1,2") == 0
        first = json.loads((out / "summary.json").read_text())
        (out / "notes.txt").write_text("mine")
        capsys.readouterr()
        assert _matrix(s.url, out, "--concurrency", "3") == 0
    said = capsys.readouterr().out
    earlier = out / f"earlier-{first['date']}"
    assert f"{out} held an earlier run: its " in said and str(earlier) in said
    assert json.loads((earlier / "summary.json").read_text()) == first
    assert {f.name for f in earlier.glob("C*.json")} == {"C1_I8_O4.json", "C2_I8_O4.json"}
    assert {f.name for f in out.glob("C*.json")} == {"C3_I8_O4.json"}
    assert [p["concurrency"] for p in json.loads((out / "summary.json").read_text())["points"]] == [3]
    assert (out / "notes.txt").read_text() == "mine"
    # a second rerun with the same earlier date takes the next free name
    (out / "summary.json").write_text(json.dumps({**first, "points": []}))
    from surge.bench.matrix import set_aside_earlier_run

    moved = set_aside_earlier_run(out)
    assert moved is not None and moved[0].name == f"earlier-{first['date']}-2"
    assert set_aside_earlier_run(out) is None  # no summary left


def test_matrix_resume_takes_a_malformed_earlier_runs_list(tmp_path: Path) -> None:
    """A hand-edited summary's ``earlier_runs`` (entries without keys, a non-number restart count,
    not a dict) does not crash ``--resume``: each entry is read with its fields checked."""
    b = Behaviour(ttft=0.005, itl=0.001)
    out = tmp_path / "m"
    with FakeServer(b) as s:
        assert _matrix(s.url, out, "--concurrency", "1,2", "--stop-after", "0") == 1
        first = json.loads((out / "summary.json").read_text())
        first["earlier_runs"] = [{"date": "d0"}, {"server_restarts": "two", "command": 5}, "junk"]
        first["server_restarts"] = True
        (out / "summary.json").write_text(json.dumps(first))
        assert _matrix(s.url, out, "--concurrency", "1,2", "--resume") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["earlier_runs"] == [
        {"date": "d0", "command": None, "server_restarts": 0},
        {"date": None, "command": None, "server_restarts": 0},
        {"date": first["date"], "command": first["command"], "server_restarts": 0},
    ]
    assert summary["server_restarts"] == 0 and summary["num_successful"] == 2


def test_matrix_resume_refuses_a_server_of_another_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --model the run measures the server's first model: a folder measured against
    another model is refused before any request, as one with another --model is."""
    b = Behaviour(ttft=0.005, itl=0.001)
    out = tmp_path / "m"
    with FakeServer(b) as s:
        assert _matrix(s.url, out, "--concurrency", "1,2", "--stop-after", "0") == 1
        summary_path = out / "summary.json"
        summary = json.loads(summary_path.read_text())
        assert summary["model"] == "fake-model"
        summary_path.write_text(json.dumps({**summary, "model": "other-model"}))  # measured elsewhere
        capsys.readouterr()
        n = len(b.log)
        assert _matrix(s.url, out, "--concurrency", "1,2", "--resume") == 2
        err = capsys.readouterr().err
        assert err.startswith("surge: error: --resume:") and err.count("\n") == 1, err
        assert "'other-model'" in err and "'fake-model'" in err
        assert len(b.log) == n  # nothing sent
        summary_path.write_text(json.dumps(summary))
        assert _matrix(s.url, out, "--concurrency", "1,2", "--resume") == 0


def test_matrix_resume_with_nothing_left_keeps_the_model(tmp_path: Path) -> None:
    """A --resume that finds every point done rewrites summary.json with the kept points'
    model (it wrote null, and a later --resume could no longer tell another model apart)."""
    out = tmp_path / "m"
    with FakeServer(Behaviour(ttft=0.005, itl=0.001)) as s:
        assert _matrix(s.url, out, "--concurrency", "1") == 0
        assert _matrix(s.url, out, "--concurrency", "1", "--resume") == 0
    assert json.loads((out / "summary.json").read_text())["model"] == "fake-model"


def test_matrix_resume_refuses_another_roofline_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The kept points' roofline columns would be another GPU's than the new points' (and than
    the summary's ``hardware``): --resume with another --gpu or --roofline-tp is refused."""
    b = Behaviour(ttft=0.005, itl=0.001)
    out = tmp_path / "m"
    cfg = tmp_path / "cfg" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text((BUNDLED_MODEL / "config.json").read_text())
    roof = ["--model-config", str(cfg), "--gpu", "h200"]
    with FakeServer(b) as s:
        assert _matrix(s.url, out, "--concurrency", "1,2", "--stop-after", "0", *roof) == 1
        capsys.readouterr()
        n = len(b.log)
        for flags in (["--gpu", "b200"], ["--gpu", "h200", "--roofline-tp", "2"], []):
            assert (
                _matrix(s.url, out, "--concurrency", "1,2", "--resume", "--model-config", str(cfg), *flags)
                == 2
            )
            err = capsys.readouterr().err
            assert err.startswith("surge: error: --resume:") and err.count("\n") == 1, err
            assert "hardware" in err or "roofline_tp" in err, err
        assert len(b.log) == n  # nothing sent
        assert _matrix(s.url, out, "--concurrency", "1,2", "--resume", *roof) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["hardware"]["name"] == "NVIDIA H200" and summary["roofline_tp"] == 1
    assert all(p["roofline_output_throughput"] for p in summary["points"])


def test_chat_prompt_length_is_exact_with_the_template() -> None:
    """On the bundled model, the templated chat prompt has exactly the asked number of tokens."""
    from surge.bench.tokens import HFTokenCounter
    from surge.tokenizer import apply_chat_template, load_tokenizer

    counter = HFTokenCounter(str(BUNDLED_MODEL))
    tok = load_tokenizer(str(BUNDLED_MODEL))
    rng = np.random.default_rng(0)
    overhead = len(counter.encode_chat(""))
    for n in (overhead + 1, 32, 100):
        text = exact_length_prompt(counter, rng, n, chat=True)
        ids = apply_chat_template(tok, [{"role": "user", "content": text}], add_generation_prompt=True)
        assert len(ids) == n
    with pytest.raises(ValueError, match="chat template"):
        exact_length_prompt(counter, rng, overhead, chat=True)


def test_a_chat_prompt_below_the_template_says_what_to_give() -> None:
    """A random prompt shorter than the chat template's own tokens (Llama 3.1's alone are 35, so
    the reference matrix's 32 fails on the chat endpoint) names the least --input-len and the
    completions endpoint, where no template counts."""
    from surge.bench.tokens import HFTokenCounter

    counter = HFTokenCounter(str(BUNDLED_MODEL))
    least = len(counter.encode_chat("")) + 1
    with pytest.raises(ValueError) as e:
        random_requests(counter, 1, least - 1, 4, seed=0, chat=True)
    assert str(e.value) == (
        f"--input-len {least - 1} is below the chat template's minimum of {least}: give --input-len {least} "
        "or more, or --endpoint /v1/completions (no chat template)"
    )
    with pytest.raises(ValueError, match=r"^--random-range-ratio 0.5 drew input length \d+ is below"):
        random_requests(counter, 8, least - 1, 4, seed=0, chat=True, range_ratio=0.5)


def test_launcher_refuses_a_busy_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    with FakeServer(Behaviour()) as s:
        t0 = time.monotonic()
        rc = bench_main(
            ["bench", "matrix", "--base-url", s.url, "--launch", f"{sys.executable} {FAKE} --port {s.port}"]
            + ["--concurrency", "1", "--input-len", "8", "--output-len", "4", "--output-dir", str(out)]
        )
        took = time.monotonic() - t0
        assert s.behaviour.seen == 0  # nothing was measured against the server already there
    err = capsys.readouterr().err
    assert rc == 2 and "already in use" in err and err.count("\n") == 1 and took < 10
    assert not out.exists()  # the refused run left an empty --output-dir behind


def test_an_unreachable_server_leaves_no_output_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    rc = bench_main(
        ["bench", "matrix", "--base-url", f"http://127.0.0.1:{free_port()}", "--concurrency", "1"]
        + ["--input-len", "8", "--output-len", "4", "--output-dir", str(out)]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and not out.exists()


def test_launch_and_base_url_ports_must_match(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    rc = bench_main(
        [
            "bench",
            "matrix",
            "--base-url",
            f"http://127.0.0.1:{port}",
            "--launch",
            f"surge serve --port {port + 1}",
        ]
        + ["--concurrency", "1", "--input-len", "8", "--output-len", "4", "--output-dir", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"port {port + 1}" in err and f"port {port}" in err and err.count("\n") == 1


def test_launcher_rejects_a_foreign_health_answer(tmp_path: Path) -> None:
    """A /health that names a process outside the started group is not our server."""
    from surge.bench.launcher import ServerLauncher

    launcher = ServerLauncher(
        f"{sys.executable} -c 'import time; time.sleep(30)'", "http://127.0.0.1:1", 5.0, tmp_path / "l"
    )
    launcher.start = lambda: None  # type: ignore[method-assign]
    import subprocess

    launcher.proc = subprocess.Popen(launcher.argv, start_new_session=True)
    try:
        assert launcher._is_ours(launcher.proc.pid)
        assert not launcher._is_ours(1)
    finally:
        launcher.stop()


@pytest.mark.parametrize("result_file", [False, True])
def test_serve_interrupted_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], result_file: bool
) -> None:
    """Ctrl-C in ``surge bench serve`` exits 130 with one line saying the run was cut short and
    that nothing was written (it exited silently), and leaves no result file behind."""
    import surge.bench.serve as serve

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    from surge.cli import main

    monkeypatch.setattr(serve, "run_serve", interrupted)
    out = tmp_path / "r.json"
    extra = ["--result-file", str(out)] if result_file else []
    with FakeServer(Behaviour(ttft=0.005, itl=0.001)) as s:
        argv = ["bench", "serve", "--base-url", s.url, "--num-prompts", "2", "--input-len", "8"]
        assert main([*argv, "--output-len", "4", *extra]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "cut short" in err, err
    assert ("no result file was written" in err) == result_file, err
    assert not out.exists()


def test_matrix_interrupted_names_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C in a matrix exits 130 with one line saying where the finished points are and that
    --resume runs the rest (it exited silently)."""
    import surge.bench.matrix as matrix

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    from surge.cli import main

    monkeypatch.setattr(matrix, "run_matrix", interrupted)
    out = tmp_path / "m"
    with FakeServer(Behaviour(ttft=0.005, itl=0.001)) as s:
        argv = ["bench", "matrix", "--base-url", s.url, "--output-dir", str(out), "--concurrency", "1"]
        assert main([*argv, "--input-len", "8", "--output-len", "4"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"finished points are in {out}" in err and "--resume" in err, err


def test_a_point_without_a_successful_request_reports_no_metrics() -> None:
    """A run whose every request failed (a server killed mid-point) gives n/a (None) metrics, as a
    point that never reached the server does, not the zeros of empty lists; its counts, duration
    and roofline ceiling stay."""
    from surge.bench.matrix import point_entry

    pt = MatrixPoint(1, 8, 4)
    zeros = {"completed": 0, "failed": 1, "duration": 2.5, "errors": ["the stream was cut off"]}
    zeros |= {"output_throughput": 0.0, "mean_ttft_ms": 0.0, "p99_itl_ms": 0.0, "median_e2el_ms": 0.0}
    zeros |= {"roofline_output_throughput": 250.0, "pct_of_roofline": 0.0}
    row = point_entry(pt, zeros, None, "p.json")
    assert (row["completed"], row["failed"], row["duration"]) == (0, 1, 2.5)
    assert row["roofline_output_throughput"] == 250.0
    for key in ("output_throughput", "mean_ttft_ms", "p99_itl_ms", "median_e2el_ms", "pct_of_roofline"):
        assert row[key] is None, key
    assert not row["success"] and "1 failed request(s): the stream was cut off" in row["error"]
    ok = point_entry(pt, zeros | {"completed": 1, "failed": 0, "mean_ttft_ms": 3.0}, None, "p.json")
    assert ok["mean_ttft_ms"] == 3.0 and ok["success"]


def test_matrix_plots_mark_a_failed_point(tmp_path: Path) -> None:
    """A failed point (n/a metrics) is labelled "(failed)" on the plots' x axis, which are still
    written, so that its empty bars are not read as a measurement of zero."""
    from surge.bench.report import plot_labels, plot_matrix

    good = {"concurrency": 1, "input_len": 8, "output_len": 4, "success": True}
    good |= {"output_throughput": 100.0, "mean_ttft_ms": 5.0, "p99_ttft_ms": 6.0, "mean_tpot_ms": 1.0}
    bad = {"concurrency": 2, "input_len": 8, "output_len": 4, "success": False, "output_throughput": None}
    labels, failed = plot_labels([good, bad])
    assert labels == ["C1/I8/O4", "C2/I8/O4 (failed)"] and failed == [False, True]
    paths = plot_matrix([good, bad], tmp_path)
    assert [p.name for p in paths] == ["throughput.png", "latency.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_matrix_plots_of_no_successful_point_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every point failed: each panel says so (they drew nothing on a -0.04..0.04 axis of
    "output tokens / s", a red "(failed)" tick the only hint); one success draws no such note."""
    import matplotlib.axes

    from surge.bench.report import NO_POINT_SUCCEEDED, plot_matrix

    texts: list[str] = []
    real_text = matplotlib.axes.Axes.text

    def recording_text(
        self: matplotlib.axes.Axes, x: float, y: float, s: str, *args: Any, **kwargs: Any
    ) -> Any:
        texts.append(s)
        return real_text(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "text", recording_text)
    bad = {"concurrency": 1, "input_len": 400, "output_len": 200, "success": False, "output_throughput": None}
    paths = plot_matrix([bad], tmp_path)
    assert texts == [NO_POINT_SUCCEEDED] * 3 and all(p.stat().st_size > 0 for p in paths)
    good = {"concurrency": 2, "input_len": 8, "output_len": 4, "success": True, "output_throughput": 9.0}
    plot_matrix([bad, good | {"mean_ttft_ms": 1.0, "p99_ttft_ms": 2.0, "mean_tpot_ms": 1.0}], tmp_path)
    assert texts == [NO_POINT_SUCCEEDED] * 3
    # failed points that were measured (a request short) keep their values, a roofline its ceiling
    short = bad | {"output_throughput": 100.0, "mean_ttft_ms": 3.0, "p99_ttft_ms": 4.0, "mean_tpot_ms": 1.0}
    plot_matrix([short], tmp_path)
    assert texts == [NO_POINT_SUCCEEDED] * 3
    plot_matrix([bad | {"roofline_output_throughput": 1000.0}], tmp_path)
    assert texts == [NO_POINT_SUCCEEDED] * 5  # the latency panels only


def test_matrix_plots_draw_dots_not_bars_on_a_log_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bars on a log axis whose bottom matplotlib picks made 61.5 against 118.9 tok/s look like
    15x: on a log axis the values are dots on a grid; bars stay where the axis is linear (a
    zero, e.g. a failed point, keeps it linear)."""
    import matplotlib.axes

    from surge.bench.report import plot_matrix

    bars: list[int] = []
    real_bar = matplotlib.axes.Axes.bar

    def counting_bar(self: matplotlib.axes.Axes, *args: Any, **kwargs: Any) -> Any:
        bars.append(1)
        return real_bar(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", counting_bar)
    point = {"concurrency": 1, "input_len": 8, "output_len": 4, "success": True, "mean_tpot_ms": 1.0}
    good = [
        point | {"output_throughput": v, "mean_ttft_ms": v / 10, "p99_ttft_ms": v / 5} for v in (61.5, 118.9)
    ]
    plot_matrix(good, tmp_path)
    assert len(bars) == 1  # the TPOT panel's, on its linear axis
    plot_matrix([good[0], point | {"output_throughput": 0.0, "mean_ttft_ms": 0.0}], tmp_path)
    assert len(bars) == 4
