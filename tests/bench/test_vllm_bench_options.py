"""vLLM 0.26 ``bench serve`` options: --metadata, --plot-timeline, --plot-dataset-stats, and the
one-line hints of the options Surge does without."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED, SHAREGPT, bench_main, serve_argv
from fake_server import Behaviour, FakeServer

from surge.bench.matrix import reset_prefix_cache
from surge.bench.plots import parse_itl_thresholds, plot_path, plot_timeline, timeline_spans
from surge.bench.serve import apply_metadata


def test_metadata_lands_in_the_result_as_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM records --metadata KEY=VALUE as top-level string fields of the result JSON; Surge does
    too (and under 'metadata'), keeps its own field where a key names one (with a warning), and
    refuses a bad item before any request."""
    out = tmp_path / "r.json"
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        argv = serve_argv(s.url, "--input-len", "8", "--output-len", "2", "--num-prompts", "2")
        rc = bench_main(
            [*argv, "--result-file", str(out), "--metadata", "version=0.3.3", " tp = 1 ", "seed=9"]
        )
        assert rc == 0
        r = json.loads(out.read_text())
        assert (r["version"], r["tp"], r["seed"]) == ("0.3.3", "1", 0)
        assert r["metadata"] == {"version": "0.3.3", "tp": "1", "seed": "9"}
        captured = capsys.readouterr()  # a warning on stderr, as every other, not amid the result table
        line = "surge: warning: --metadata seed: the result's own 'seed' field is kept (the value is under 'metadata')"
        assert line in captured.err.splitlines() and "--metadata seed" not in captured.out
        seen = b.seen
        for bad in ("noequals", "=x"):
            rc = bench_main([*argv, "--result-file", str(out), "--metadata", bad])
            err = capsys.readouterr().err
            assert rc == 2 and "--metadata" in err and "KEY=VALUE" in err and err.count("\n") == 1, err
        rc = bench_main([*argv, "--result-file", str(out), "--metadata", "a=1", "a=2"])
        assert rc == 2 and "given twice" in capsys.readouterr().err
        rc = bench_main([*argv, "--metadata", "a=1"])  # nowhere to record it: not dropped silently
        assert rc == 2 and "--metadata is recorded in the result file" in capsys.readouterr().err
        assert b.seen == seen  # refused before any request


def test_save_detailed_without_a_result_file_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--save-detailed only adds generated_texts to a result file: without one it would do nothing
    (vLLM ignores it), so it is refused in one line before any request, as --metadata is."""
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        argv = serve_argv(s.url, "--input-len", "8", "--output-len", "2", "--num-prompts", "2")
        rc = bench_main([*argv, "--save-detailed"])
        err = capsys.readouterr().err
        assert rc == 2 and "--save-detailed" in err and "--result-file" in err and err.count("\n") == 1, err
        assert b.seen == 0  # refused before any request


def test_apply_metadata_without_pairs_adds_nothing() -> None:
    r: dict[str, object] = {"seed": 0}
    assert apply_metadata(r, ()) == [] and r == {"seed": 0}
    assert apply_metadata(r, (("metadata", "x"),)) == ["metadata"] and r["metadata"] == {"metadata": "x"}


def test_plot_timeline_and_dataset_stats_write_pngs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's --plot-timeline (HTML there, a matplotlib PNG here) and --plot-dataset-stats write
    next to the result file; --timeline-itl-thresholds sets the colours' bounds."""
    out = tmp_path / "run.json.gz"
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        argv = serve_argv(s.url, "--input-len", "8", "--output-len", "4", "--num-prompts", "3")
        rc = bench_main(
            [*argv, "--result-file", str(out), "--plot-timeline", "--timeline-itl-thresholds", "1,5"]
            + ["--plot-dataset-stats"]
        )
        assert rc == 0, capsys.readouterr().err
        for name in ("run.timeline.png", "run.dataset_stats.png"):
            png = tmp_path / name
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        stdout = capsys.readouterr().out
        assert f"timeline plot written to {tmp_path / 'run.timeline.png'}" in stdout
        seen = b.seen
        for extra, words in (
            (["--plot-timeline"], "--plot-timeline writes its PNG next to --result-file"),
            (["--plot-dataset-stats"], "--plot-dataset-stats writes its PNG next to --result-file"),
            (["--timeline-itl-thresholds", "1,2"], "--timeline-itl-thresholds applies with --plot-timeline"),
            (
                ["--plot-timeline", "--timeline-itl-thresholds", "50,25", "--result-file", str(out)],
                "LOW,HIGH",
            ),
            (["--plot-timeline", "--result-file", str(tmp_path / "d.json")], "is a directory"),
        ):
            (tmp_path / "d.timeline.png").mkdir(exist_ok=True)
            rc = bench_main([*argv, *extra])
            err = capsys.readouterr().err
            assert rc == 2 and words in err and err.count("\n") == 1, (extra, err)
        assert b.seen == seen  # refused before any request


def test_timeline_spans_classify_and_merge_gaps(tmp_path: Path) -> None:
    result = {
        "start_times": [10.0, 10.5, 11.0],
        "ttfts": [0.2, 0.1, 0.0],
        "itls": [[0.01, 0.01, 0.03, 0.1], [0.06], []],
        "errors": ["", "", "HTTP 500: boom"],
    }
    rows, failed = timeline_spans(result, parse_itl_thresholds("25,50"))
    assert failed == 1
    assert [i for i, _ in rows] == [0, 1]
    assert rows[0][1] == [
        (0.0, 0.2, -1),
        (0.2, pytest.approx(0.02), 0),  # two green gaps merged into one span
        (pytest.approx(0.22), 0.03, 1),
        (pytest.approx(0.25), 0.1, 2),
    ]
    assert rows[1][1] == [(0.5, 0.1, -1), (pytest.approx(0.6), 0.06, 2)]
    failed = {**result, "errors": ["boom"] * 3}
    plot_timeline(failed, tmp_path / "t.png", (0.025, 0.05))  # every request failed: an empty plot
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert plot_path(Path("a/r.json"), "timeline") == Path("a/r.timeline.png")
    assert plot_path(Path("r"), "dataset_stats") == Path("r.dataset_stats.png")


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--use-beam-search"], "--use-beam-search: use nothing: Surge has no beam search"),
        (["--lora-modules", "a", "b", "--lora-assignment", "random"], "Surge serves no LoRA adapters"),
        (["--profile"], "--profile: use nothing"),
        (["--skip-tokenizer-init"], "--skip-tokenizer-init: use nothing"),
        (["--no-stream"], "--no-stream: use nothing"),
        (["--enable-multimodal-chat"], "text prompts only"),
        (["--custom-ensure-client-side-data"], "text prompts only"),
        (["--random-batch-size", "4"], "no embeddings or reranker benchmark"),
        (["--insecure-nothing-such"], None),
        (
            ["--blazedit-min-distance", "1"],
            "blazedit (hf) dataset options: Surge's bench serve has the random",
        ),
        (["--random-mm-limit-mm-per-prompt", "{}"], "random-mm dataset options"),
        (["--speed-bench-output-len", "3", "--bfcl-x", "2"], "bfcl (hf), speed_bench dataset options"),
        (["--dataset-name", "speed_bench"], "(no hub downloads, and no multimodal or ASR datasets)"),
    ],
)
def test_vllm_options_surge_lacks_get_a_one_line_hint(flags: list[str], words: str | None) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "surge", "bench", "serve", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    if words is None:
        assert "vLLM" not in p.stderr, p.stderr
    else:
        assert words in p.stderr, p.stderr


def test_random_input_and_output_len_are_the_random_datasets_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.26 has --input-len/--output-len (every dataset's) and --random-input-len/
    --random-output-len (the random dataset's only): with --dataset random they are the same
    lengths; with another dataset vLLM ignores the random ones, Surge refuses them in one line
    (they used to be aliases, so --dataset sonnet --random-input-len changed the sonnet length)."""
    sonnet = tmp_path / "sonnet.txt"
    sonnet.write_text("".join(f"w{i} w{i + 1} w{i + 2}\n" for i in range(20)))
    out = tmp_path / "r.json"
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        argv = serve_argv(s.url, "--num-prompts", "2", "--result-file", str(out))
        assert bench_main([*argv, "--random-input-len", "12", "--random-output-len", "3"]) == 0
        r = json.loads(out.read_text())
        assert (r["input_len"], r["output_len"], r["input_lens"], r["output_lens"]) == (
            12,
            3,
            [12, 12],
            [3, 3],
        )
        assert bench_main([*argv, "--input-len", "10", "--random-input-len", "10"]) == 0
        assert json.loads(out.read_text())["input_lens"] == [10, 10]
        seen = b.seen
        sonnet_argv = [*argv, "--dataset", "sonnet", "--dataset-path", str(sonnet)]
        for extra, words in (
            (
                [*sonnet_argv, "--random-input-len", "100"],
                "--random-input-len applies to --dataset random (use --input-len or --sonnet-input-len)",
            ),
            ([*sonnet_argv, "--random-output-len", "5"], "--random-output-len applies to --dataset random"),
            ([*argv, "--input-len", "12", "--random-input-len", "10"], "disagree"),
            ([*argv, "--output-len", "4", "--random-output-len", "3"], "disagree"),
        ):
            rc = bench_main(extra)
            err = capsys.readouterr().err
            assert rc == 2 and words in err and err.count("\n") == 1, (extra, err)
        assert b.seen == seen


def _self_signed_server_context(tmp_path: Path) -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate (the openssl command line)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a self-signed certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=surge-test"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def test_insecure_benchmarks_an_https_server_with_a_self_signed_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's --insecure skips the TLS certificate check of every call (/v1/models, /tokenize, the
    timed requests, bench matrix's /reset_prefix_cache); without it such a server is refused in
    one line before the run."""
    b = Behaviour(ttft=0.001, itl=0.001, reset_route=True)
    out = tmp_path / "r.json"
    with FakeServer(b, _self_signed_server_context(tmp_path)) as s:
        assert s.url.startswith("https://")
        argv = serve_argv(s.url, "--input-len", "8", "--output-len", "2", "--num-prompts", "2")
        rc = bench_main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and "CERTIFICATE_VERIFY_FAILED" in err and err.count("\n") == 1, err
        assert b.seen == 0
        assert bench_main([*argv, "--insecure", "--result-file", str(out)]) == 0
        r = json.loads(out.read_text())
        assert (r["completed"], r["failed"], r["input_lens"]) == (2, 0, [8, 8])  # counted by its /tokenize
        assert b.seen == 2
        assert reset_prefix_cache(s.url, None, insecure=True) is True and b.resets == 1
        assert reset_prefix_cache(s.url, None) is None  # unverified: cannot be reached


def test_output_len_help_names_the_datasets_that_refuse_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--output-len is refused with --dataset timed_trace and burstgpt (their rows give the
    lengths): its help says so (it listed the datasets it sets only)."""
    from surge.cli import build_parser

    monkeypatch.setenv("COLUMNS", "1000")  # no word broken at a hyphen
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "serve", "--help"])
    out = capsys.readouterr().out
    text = " ".join(
        out.rsplit("--output-len OUTPUT_LEN", 1)[1].split("--random-input-len RANDOM_INPUT_LEN")[0].split()
    )
    assert "refused with --dataset timed_trace and burstgpt, whose rows give" in text, text


def _dataset_flags(tmp_path: Path) -> dict[str, list[str]]:
    """Each dataset with a file it reads (the tests' own, or ../shared's)."""
    (tmp_path / "c.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "s.txt").write_text("a line\nanother line\n")
    (tmp_path / "b.csv").write_text("Model,Request tokens,Response tokens\nGPT-4,3,4\n")
    mt_bench = str(SHARED / "datasets" / "mt_bench" / "question.jsonl")
    return {
        "random": [],
        "prefix_repetition": [],
        "sharegpt": ["--dataset-path", str(SHAREGPT)],
        "custom": ["--dataset-path", str(tmp_path / "c.jsonl")],
        "sonnet": ["--dataset-path", str(tmp_path / "s.txt")],
        "burstgpt": ["--dataset-path", str(tmp_path / "b.csv")],
        "spec_bench": ["--dataset-path", mt_bench],
        "hf": ["--dataset-path", mt_bench, "--hf-name", "philschmid/mt-bench"],
        "timed_trace": ["--dataset-path", str(Path(__file__).parent / "data" / "timed_trace_example.jsonl")],
    }


def test_bad_counts_and_lengths_name_their_own_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--num-prompts 0 is one line naming --num-prompts alone with every dataset but custom and
    spec_bench, where it sends every prompt of the file as vLLM (test_vllm_spec_bench) (it named
    --input-len and --output-len too, which most datasets do not take, and prefix_repetition said
    it was below --prefix-repetition-num-prefixes); an input length below 1 names the flag given
    (random's --input-len 0 was "--sonnet-input-len must be >= 1", --random-input-len 0 was
    "--input-len ...")."""
    flags = _dataset_flags(tmp_path)
    behaviour = Behaviour()
    with FakeServer(behaviour) as s:
        for dataset, extra in flags.items():
            if dataset in ("custom", "spec_bench"):
                continue
            for n in ("0", "-3"):
                rc = bench_main(serve_argv(s.url, "--dataset", dataset, *extra, "--num-prompts", n))
                err = capsys.readouterr().err
                assert rc == 2 and err == f"surge: error: --num-prompts must be >= 1, got {n}\n", (
                    dataset,
                    err,
                )
        for extra, words in (
            (["--input-len", "0"], "--input-len must be >= 1, got 0"),
            (["--random-input-len", "0"], "--random-input-len must be >= 1, got 0"),
            (
                [*flags["sonnet"], "--dataset", "sonnet", "--input-len", "0"],
                "--input-len must be >= 1, got 0",
            ),
            (
                [*flags["sonnet"], "--dataset", "sonnet", "--sonnet-input-len", "0"],
                "--sonnet-input-len must be",
            ),
        ):
            assert bench_main(serve_argv(s.url, *extra)) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"surge: error: {words}") and err.count("\n") == 1, err
    assert behaviour.seen == 0


def test_ready_check_timeout_waits_for_a_server_that_is_not_up_yet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's --ready-check-timeout-sec S: a server that starts listening within S seconds is
    waited for (a note on stderr) and benchmarked; without the flag the run stops at once; past S
    it stops in one line that names the flag."""
    import threading
    import time
    import urllib.error

    from surge.bench import serve

    monkeypatch.setattr(serve, "READY_CHECK_INTERVAL_S", 0.1)
    server = FakeServer(Behaviour())
    args = ["bench", "serve", "--base-url", server.url, "--input-len", "8", "--output-len", "3"]
    args += ["--num-prompts", "2", "--ignore-eos", "--disable-tqdm"]
    assert bench_main(args) == 2  # nothing listens yet, no waiting
    assert "cannot reach" in capsys.readouterr().err
    started = threading.Timer(1.0, server.__enter__)
    t0 = time.monotonic()
    started.start()
    try:
        assert bench_main([*args, "--ready-check-timeout-sec", "30"]) == 0
        assert time.monotonic() - t0 >= 1.0
        err = capsys.readouterr().err
        assert "is not up yet" in err and "--ready-check-timeout-sec" in err, err
    finally:
        started.join()
        server.__exit__(None, None, None)
    t0 = time.monotonic()
    assert bench_main([*args, "--ready-check-timeout-sec", "0.5"]) == 2  # it stopped again
    err = capsys.readouterr().err.splitlines()
    assert 0.5 <= time.monotonic() - t0 < 10
    assert err[-1].startswith("surge: error: cannot reach") and err[-1].endswith(
        "(still after --ready-check-timeout-sec 0.5)"
    ), err
    assert bench_main([*args, "--ready-check-timeout-sec", "-1"]) == 2
    assert "--ready-check-timeout-sec must be >= 0 and finite (seconds), got -1" in capsys.readouterr().err
    # asked again only while the server is not up: nothing listening, a reset, a 502/503/504
    not_up = serve.server_not_up_yet
    assert not_up(urllib.error.URLError(ConnectionRefusedError())) and not_up(ConnectionResetError())
    assert not_up(urllib.error.HTTPError("u", 503, "unavailable", {}, None))  # type: ignore[arg-type]
    assert not not_up(urllib.error.HTTPError("u", 401, "unauthorized", {}, None))  # type: ignore[arg-type]
    assert not not_up(ValueError("not JSON"))


def test_save_result_names_and_appends_the_file_as_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's --save-result writes LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json (--result-dir its
    folder, made when missing; --result-filename its name) and --append-result adds one JSON line
    a run; with --result-file, or --result-dir alone, it is one line of refusal before any request."""
    from surge.bench.vllm_results import vllm_result_filename

    monkeypatch.chdir(tmp_path)
    with FakeServer(Behaviour()) as s:
        argv = ["bench", "serve", "--base-url", s.url, "--input-len", "8", "--output-len", "3"]
        argv += ["--num-prompts", "2", "--ignore-eos", "--disable-tqdm"]
        assert bench_main([*argv, "--save-result"]) == 0, capsys.readouterr().err
        [saved] = list(tmp_path.glob("*.json"))
        r = json.loads(saved.read_text())
        assert saved.name == f"openai-chat-infqps-nonexistent-{r['date']}.json" and r["completed"] == 2
        assert r["label"] is None  # vLLM records args.label, null without --label; the name uses the backend
        out = tmp_path / "runs" / "new"
        more = ["--result-dir", str(out), "--max-concurrency", "2", "--request-rate", "50", "--label", "mine"]
        assert bench_main([*argv, "--save-result", *more]) == 0
        [saved] = list(out.glob("*.json"))
        r = json.loads(saved.read_text())
        assert (
            saved.name == f"mine-50.0qps-concurrency2-nonexistent-{r['date']}.json" and r["label"] == "mine"
        )
        for _ in range(2):
            assert (
                bench_main(
                    [*argv, "--append-result", "--result-dir", str(out), "--result-filename", "a.json"]
                )
                == 0
            )
        lines = (out / "a.json").read_text().split("\n")
        assert len(lines) == 2 and all(json.loads(line)["completed"] == 2 for line in lines)
        seen = s.behaviour.seen
        for extra, words in (
            (["--save-result", "--result-file", "x.json"], "give --result-file FILE or vLLM's --save-result"),
            (["--result-dir", str(out)], "--result-dir applies with --save-result or --append-result"),
            (
                ["--result-filename", "b.json"],
                "--result-filename applies with --save-result or --append-result",
            ),
        ):
            assert bench_main([*argv, *extra]) == 2
            err = capsys.readouterr().err
            assert words in err and err.count("\n") == 1, err
            assert "--result-file" in extra or "without them vLLM ignores it" in err, err  # not "as vLLM"
        assert s.behaviour.seen == seen
    ramp = {"label": None, "backend": "openai", "ramp_up_strategy": "linear", "ramp_up_start_rps": 1}
    ramp |= {
        "ramp_up_end_rps": 8,
        "max_concurrency": None,
        "model_id": "/models/Qwen3-8B/",
        "date": "20260101-000000",
    }
    assert (
        str(vllm_result_filename(ramp, "d"))
        == "d/openai-ramp-up-linear-1qps-8qps-Qwen3-8B-20260101-000000.json"
    )


def test_save_and_append_result_files_are_gzipped_by_name_and_compare_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--save-result --result-filename sv.json.gz`` wrote plain JSON under a .gz name, which
    ``bench compare`` refused ("not a readable gzip file"), and an ``--append-result`` file (one
    run a line) was "not JSON (Extra data ...)" to it. A .gz name is gzipped now (appending adds a
    gzip member), and compare reads a JSON-lines file run by run, each run its point, the last of
    a point counting, with one note on stderr."""
    import gzip

    with FakeServer(Behaviour()) as s:
        argv = serve_argv(
            s.url, "--input-len", "8", "--output-len", "3", "--num-prompts", "2", "--ignore-eos"
        )
        out = ["--result-dir", str(tmp_path)]
        assert bench_main([*argv, "--save-result", *out, "--result-filename", "sv.json.gz"]) == 0
        assert json.loads(gzip.decompress((tmp_path / "sv.json.gz").read_bytes()))["completed"] == 2
        for name in ("runs.jsonl", "runs.json.gz"):
            for conc in ("1", "2", "2"):  # two runs of C2: the last one counts
                more = ["--append-result", *out, "--result-filename", name, "--max-concurrency", conc]
                assert bench_main([*argv, *more]) == 0
        capsys.readouterr()
        text = gzip.decompress((tmp_path / "runs.json.gz").read_bytes()).decode()
        assert [json.loads(line)["max_concurrency"] for line in text.split("\n")] == [1, 2, 2]
        assert len((tmp_path / "runs.jsonl").read_text().split("\n")) == 3
        # a .gz file that is not gzip: refused before any request, rather than made unreadable
        (tmp_path / "plain.json.gz").write_text("{}")
        seen = s.behaviour.seen
        assert bench_main([*argv, "--append-result", *out, "--result-filename", "plain.json.gz"]) == 2
        err = capsys.readouterr().err
        assert "the file is not gzip, so a gzipped run cannot be added" in err and err.count("\n") == 1, err
        assert s.behaviour.seen == seen and (tmp_path / "plain.json.gz").read_text() == "{}"
    for base, new in (("sv.json.gz", "runs.jsonl"), ("runs.jsonl", "runs.json.gz")):
        assert bench_main(["bench", "compare", str(tmp_path / base), str(tmp_path / new)]) == 0
        captured = capsys.readouterr()
        assert re.search(r"Geometric mean change over (1 point|[2-9] points) valid in both: ", captured.out)
        for name in {base, new} - {"sv.json.gz"}:
            note = (
                f"surge: note: {tmp_path / name}: a JSON-lines file of 3 runs (--append-result), read as 2 "
                "points; where runs share a point the last one counts (1 earlier left out)\n"
            )
            assert note in captured.err, captured.err
    lines = (tmp_path / "runs.jsonl").read_text().split("\n")
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n[1]\n")
    assert bench_main(["bench", "compare", str(tmp_path / "bad.jsonl"), str(tmp_path / "runs.jsonl")]) == 2
    err = capsys.readouterr().err
    assert (
        "a JSON-lines file of 2 values that are not all bench serve results" in err and err.count("\n") == 1
    )


def _serve_parser(command: str = "serve") -> argparse.ArgumentParser:
    from surge.cli import build_parser

    parser = build_parser()
    bench = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    return next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction)).choices[command]


def test_matrix_warmup_help_names_no_num_warmups() -> None:
    """``bench matrix --help`` said --warmup defaults to "0 with --num-warmups", a flag matrix refuses."""
    helps = {
        c: next(a.help or "" for a in _serve_parser(c)._actions if "--warmup" in a.option_strings)
        for c in ("serve", "matrix")
    }
    assert (
        "--num-warmups" not in helps["matrix"] and "before each run of a point (default 1)" in helps["matrix"]
    )
    assert "(default 1; 0 with --num-warmups)" in helps["serve"]


def test_result_dir_and_filename_help_say_they_need_save_result() -> None:
    """--result-dir and --result-filename do something only with --save-result or --append-result
    (a refusal otherwise): their help says so before a user meets the refusal."""
    helps = {a.option_strings[0]: a.help or "" for a in _serve_parser()._actions if a.option_strings}
    for flag in ("--result-dir", "--result-filename"):
        assert "needs one of them" in helps[flag] and "--save-result" in helps[flag], helps[flag]


def test_sampling_flags_are_sent_as_vllm_sends_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.26's --top-p, --top-k, --min-p, --frequency-penalty, --presence-penalty and
    --repetition-penalty go into every request body (the warm-up's too) under their field names,
    --extra-body's field of the same name wins, and a flag not given sends nothing; on
    /v1/completions --repetition-penalty replaces the 1.0 the client sends by default."""
    b = Behaviour(ttft=0.001, itl=0.001)
    sampling = ["--top-p", "0.9", "--top-k", "20", "--min-p", "0.05", "--frequency-penalty", "0.5"]
    sampling += ["--presence-penalty", "0.25", "--repetition-penalty", "1.1"]
    lengths = ["--num-prompts", "2", "--input-len", "8", "--output-len", "3"]
    with FakeServer(b) as s:
        argv = ["bench", "serve", "--base-url", s.url, "--disable-tqdm", *lengths]
        assert bench_main([*argv, *sampling, "--extra-body", '{"top_k": 5}']) == 0
        assert len(b.log) == 3  # the warm-up and the two timed requests
        for entry in b.log:
            body = entry["body"]
            assert (body["top_p"], body["top_k"], body["min_p"]) == (0.9, 5, 0.05)
            assert (body["frequency_penalty"], body["presence_penalty"], body["repetition_penalty"]) == (
                0.5,
                0.25,
                1.1,
            )
        b.log.clear()
        assert bench_main([*argv, "--endpoint", "/v1/completions", "--top-k", "3"]) == 0
        assert all(e["body"]["top_k"] == 3 and e["body"]["repetition_penalty"] == 1.0 for e in b.log)
        assert all("top_p" not in e["body"] and "min_p" not in e["body"] for e in b.log)
        b.log.clear()
        assert bench_main([*argv, "--endpoint", "/v1/completions", "--repetition-penalty", "1.2"]) == 0
        assert all(e["body"]["repetition_penalty"] == 1.2 for e in b.log)
        capsys.readouterr()
        assert bench_main([*argv, "--top-p", "nan"]) == 2
    assert capsys.readouterr().err == "surge: error: --top-p must be a finite number, got nan\n"


def test_header_is_sent_with_every_call_as_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.26's --header KEY=VALUE ...: split at the first '=', both sides stripped, sent with
    every request (the warm-up's too) and with /v1/models; a pair replaces the Authorization of
    --api-key (names compare case-insensitively), the request id replaces an X-Request-Id pair;
    Surge's own calls (/tokenize) carry them too. An item without '=' is one line."""
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        argv = ["bench", "serve", "--base-url", s.url, "--disable-tqdm", "--num-prompts", "2"]
        argv += ["--input-len", "8", "--output-len", "3", "--api-key", "k1", "--request-id-prefix", "r-"]
        headers = ["--header", " x-tenant = a=b ", "authorization=Bearer k2", "X-Request-Id=mine"]
        assert bench_main([*argv, *headers]) == 0
        assert len(b.log) == 3
        for entry in b.log:
            assert entry["headers"]["x-tenant"] == "a=b" and entry["auth"] == "Bearer k2"
        assert sorted(e["request_id"] for e in b.log) == ["mine", "r-0", "r-1"]  # the warm-up has no id
        paths = {path for path, _ in b.calls}
        assert {"/v1/models", "/tokenize"} <= paths
        bad = [
            (p, h) for p, h in b.calls if h.get("x-tenant") != "a=b" or h.get("authorization") != "Bearer k2"
        ]
        assert not bad, bad
        capsys.readouterr()
        assert bench_main([*argv, "--header", "x-tenant"]) == 2
    err = capsys.readouterr().err
    assert err == "surge: error: --header 'x-tenant': give KEY=VALUE, e.g. --header x-tenant=a\n", err


def test_backend_picks_the_request_format_as_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.26's --backend: openai and vllm send completions requests (to /v1/completions, vLLM's
    default route), openai-chat chat requests; the result's backend (and --save-result's file name
    without --label) is the one given. A backend that does not fit --endpoint, or one Surge's
    client does not speak, is one line before any request."""
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        argv = serve_argv(s.url, "--num-prompts", "2")
        argv += ["--input-len", "8", "--output-len", "3"]
        assert bench_main([*argv, "--backend", "vllm", "--save-result", "--result-dir", str(tmp_path)]) == 0
        assert {e["path"] for e in b.log} == {"/v1/completions"} and all("prompt" in e["body"] for e in b.log)
        (saved,) = tmp_path.glob("*.json")
        assert saved.name.startswith("vllm-infqps-nonexistent-")
        result = json.loads(saved.read_text())
        assert result["backend"] == result["endpoint_type"] == "vllm"
        b.log.clear()
        out = tmp_path / "chat.json"
        assert bench_main([*argv, "--backend", "openai-chat", "--result-file", str(out)]) == 0
        assert {e["path"] for e in b.log} == {"/v1/chat/completions"}
        assert json.loads(out.read_text())["backend"] == "openai-chat"
        b.log.clear()
        capsys.readouterr()
        assert bench_main([*argv, "--backend", "openai-chat", "--endpoint", "/v1/completions"]) == 2
        assert bench_main([*argv, "--backend", "openai-embeddings"]) == 2
        assert b.log == []
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "surge: error: --backend openai-chat sends chat requests: give --endpoint /v1/chat/completions (or "
        "leave it out), not /v1/completions",
        "surge: error: --backend openai-embeddings: Surge's bench sends text generation requests only: openai "
        "or vllm (completions) or openai-chat (chat); vLLM's audio, embeddings, pooling and rerank backends are "
        "not supported",
    ], err


def test_logprobs_is_sent_on_completions_and_refused_on_chat(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.26's --logprobs N: its completions client sends logprobs N (--extra-body's wins);
    its chat client drops it, so Surge refuses it there in one line naming what to use."""
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        argv = ["bench", "serve", "--base-url", s.url, "--disable-tqdm", "--num-prompts", "2"]
        argv += ["--input-len", "8", "--output-len", "3", "--logprobs", "2"]
        assert bench_main([*argv, "--endpoint", "/v1/completions"]) == 0
        assert len(b.log) == 3 and all(e["body"]["logprobs"] == 2 for e in b.log)
        b.log.clear()
        assert bench_main([*argv, "--backend", "vllm", "--extra-body", '{"logprobs": 1}']) == 0
        assert all(e["body"]["logprobs"] == 1 for e in b.log)
        b.log.clear()
        capsys.readouterr()
        assert bench_main(argv) == 2 and b.log == []
    err = capsys.readouterr().err
    assert err.startswith(
        "surge: error: --logprobs applies to --endpoint /v1/completions (vLLM's chat client"
    )
    assert err.count("\n") == 1


def test_num_warmups_sends_the_first_prompt_again_as_vllm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.26's --num-warmups N: the first timed request sent N times, untimed and without its
    request id, before the run (in place of Surge's --warmup, which it turns off); both together
    are one line."""
    b = Behaviour(ttft=0.001, itl=0.001)
    out = tmp_path / "r.json"
    with FakeServer(b) as s:
        argv = [
            "bench",
            "serve",
            "--base-url",
            s.url,
            "--disable-tqdm",
            "--num-prompts",
            "2",
            "--input-len",
            "8",
        ]
        argv += ["--output-len", "3", "--request-id-prefix", "r-", "--max-concurrency", "2"]
        assert bench_main([*argv, "--num-warmups", "3", "--result-file", str(out)]) == 0
        assert [e["request_id"] for e in b.log[:3]] == [None] * 3
        assert sorted(e["request_id"] for e in b.log[3:]) == ["r-0", "r-1"]
        first = next(e["body"] for e in b.log if e["request_id"] == "r-0")
        assert all(e["body"] == first for e in b.log[:3])
        result = json.loads(out.read_text())
        assert (result["warmup"], result["num_warmups"], result["completed"]) == (0, 3, 2)
        b.log.clear()
        capsys.readouterr()
        assert bench_main([*argv, "--num-warmups", "1", "--warmup", "2"]) == 2 and b.log == []
    err = capsys.readouterr().err
    assert err.startswith(
        "surge: error: give --warmup (Surge's warm-up, with other prompts) or --num-warmups"
    )


def test_served_model_name_is_sent_and_model_recorded_as_vllm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.26's --model M --served-model-name N: requests carry N (the name the server serves),
    the result's model_id and tokenizer_id are M, and --save-result's file name takes M's last
    part; --served-model-name without --model (which vLLM ignores) is one line."""
    b = Behaviour(ttft=0.001, itl=0.001)
    with FakeServer(b) as s:
        argv = serve_argv(s.url, "--num-prompts", "2")
        argv += ["--input-len", "8", "--output-len", "3"]
        names = ["--model", "org/Fake-Model-8B", "--served-model-name", "fake-model"]
        assert bench_main([*argv, *names, "--save-result", "--result-dir", str(tmp_path)]) == 0
        assert {e["body"]["model"] for e in b.log} == {"fake-model"}
        (saved,) = tmp_path.glob("*.json")
        assert saved.name.startswith("openai-chat-infqps-Fake-Model-8B-")
        result = json.loads(saved.read_text())
        assert result["model_id"] == result["tokenizer_id"] == "org/Fake-Model-8B"
        capsys.readouterr()
        assert bench_main([*argv, "--served-model-name", "fake-model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("surge: error: --served-model-name applies with --model (vLLM ignores it without")
    assert err.count("\n") == 1


def test_recorded_command_masks_keys_and_secret_headers() -> None:
    """The command a result records masks --api-key's value and each secret-looking --header
    value (Authorization, x-api-key, a token...); other headers and flags stay as given."""
    from surge.bench.cli import command_line

    argv = ["bench", "serve", "--api-key", "sk-1", "--header", "Authorization=Bearer sk-2", "x-tenant=a"]
    argv += ["X-Api-Key=sk-3", "--num-prompts", "2", "--api-key=sk-4", "--header=x-auth-token=sk-5"]
    line = command_line(argv)
    assert "sk-" not in line, line
    assert line == (
        "surge bench serve --api-key '***' --header 'Authorization=***' x-tenant=a 'X-Api-Key=***' "
        "--num-prompts 2 '--api-key=***' '--header=x-auth-token=***'"
    )


def test_result_file_records_no_api_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A result file is shared and committed: its ``command`` never holds the key the run sent."""
    b = Behaviour(ttft=0.001, itl=0.001)
    out = tmp_path / "r.json"
    with FakeServer(b) as s:
        argv = [*serve_argv(s.url, "--num-prompts", "1", "--input-len", "8", "--output-len", "2")]
        argv += [
            "--api-key",
            "sk-secret",
            "--header",
            "authorization=Bearer sk-other",
            "--result-file",
            str(out),
        ]
        monkeypatch.setattr(sys, "argv", ["surge", *argv])
        assert bench_main(argv) == 0
        assert b.log and b.log[0]["auth"] == "Bearer sk-other"  # the run itself sent it
    capsys.readouterr()
    text = out.read_text()
    assert "sk-secret" not in text and "sk-other" not in text
    assert "--api-key '***'" in json.loads(text)["command"]
