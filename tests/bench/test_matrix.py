"""`surge bench matrix`: presets, grids, artifacts, server launch and restart (fake server), live mini matrix."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import BUNDLED_MODEL, REPO, bench_main
from fake_server import free_port

from surge.bench.launcher import LAST_LINE_CHARS, last_log_line
from surge.bench.matrix import grid_points, official_8b_points, parse_int_list
from surge.bench.results import load_result

FAKE = Path(__file__).with_name("fake_server.py")
POINT_FILES = {f"C{c}_I{i}_O{o}.json" for c in (1, 2) for i in (8, 16) for o in (4, 8)}


def test_official_preset() -> None:
    pts = official_8b_points()
    assert len(pts) == 30 and len(set(pts)) == 30
    keys = {(p.concurrency, p.input_len, p.output_len) for p in pts}
    for c in (1, 4):
        for i in (32, 256, 4096):
            for o in (256, 1024, 4096):
                assert (c, i, o) in keys
    for c in (16, 64):
        for i in (32, 256):
            for o in (256, 1024, 4096):
                assert (c, i, o) in keys
    assert grid_points([1, 2], [3], [4, 5])[1].stem == "C1_I3_O5"
    assert parse_int_list("1, 4,16", "--c") == [1, 4, 16]
    for bad in ("", "a", "0", "1,-2", "1,,2", "1,2,"):
        with pytest.raises(ValueError):
            parse_int_list(bad, "--c")
    # a repeated value ran the point again into the same result file, listed twice in the summary
    with pytest.raises(
        ValueError, match=r"^--c gives 2 more than once in '2,4, 2' \(each point runs once: --repeats"
    ):
        parse_int_list("2,4, 2", "--c")


def _check_artifacts(out: Path, summary: dict[str, Any], n_points: int) -> None:
    assert summary["num_points"] == n_points == len(summary["points"])
    for p in summary["points"]:
        r = load_result(out / p["result_file"])
        if p["success"]:
            assert r["completed"] == r["num_prompts"] == r["max_concurrency"] == p["concurrency"]
            assert (
                r["request_rate"] == "inf" and r["ignore_eos"] and r["exact_length"] and r["matrix_seed"] == 0
            )
            assert r["output_lens"] == [p["output_len"]] * p["concurrency"]
            assert p["output_throughput"] == r["output_throughput"] > 0
    md = (out / "summary.md").read_text()
    for col in (
        "| C | I | O | success | output tok/s | total tok/s | mean TTFT ms | P99 TTFT ms | mean TPOT ms",
        "| mean ITL ms | P99 ITL ms | roofline tok/s | % of roofline |",
    ):
        assert col in md
    assert md.count("\n| ") == n_points + 1
    for png in ("throughput.png", "latency.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_matrix_with_launched_fake_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    out = tmp_path / "m"
    rc = bench_main(
        [
            "bench",
            "matrix",
            "--base-url",
            f"http://127.0.0.1:{port}",
            "--launch",
            f"{sys.executable} {FAKE} --port {port}",
        ]
        + [
            "--concurrency",
            "1,2",
            "--input-len",
            "8,16",
            "--output-len",
            "4,8",
            "--output-dir",
            str(out),
            "--disable-tqdm",
        ]
        + ["--gpu", "h200", "--model-config", str(BUNDLED_MODEL), "--server-timeout", "60"]
    )
    assert rc == 0, capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    _check_artifacts(out, summary, 8)
    assert {p["result_file"] for p in summary["points"]} == POINT_FILES
    assert all(p["success"] for p in summary["points"]) and summary["num_successful"] == 8
    assert all(p["roofline_output_throughput"] > 0 and p["pct_of_roofline"] > 0 for p in summary["points"])
    assert summary["server_restarts"] == 0 and summary["model"] == "fake-model"
    assert "8/8 points successful" in capsys.readouterr().out
    assert (out / "server.log").exists()


def test_matrix_restarts_a_dead_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    out = tmp_path / "m"
    # the server dies on its 4th completion request: point 1 = warm-up + 2, point 2's warm-up kills it;
    # it drops the connection 1 s before it exits (a loaded machine, or a slow teardown, has that
    # window too): the point must still be blamed on the death
    launch = f"{sys.executable} {FAKE} --port {port} --die-after 3 --die-delay 1"
    rc = bench_main(
        ["bench", "matrix", "--base-url", f"http://127.0.0.1:{port}", "--launch", launch, "--disable-tqdm"]
        + ["--concurrency", "2", "--input-len", "8", "--output-len", "4,8,16", "--output-dir", str(out)]
    )
    assert rc == 1
    summary = json.loads((out / "summary.json").read_text())
    ok = [p["success"] for p in summary["points"]]
    assert ok == [True, False, True] and summary["server_restarts"] == 1
    assert "server died during the point" in summary["points"][1]["error"]
    _check_artifacts(out, summary, 3)
    assert "2/3 points successful" in (out / "summary.md").read_text()
    capsys.readouterr()


def test_failed_point_row_and_one_success_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A point that failed before any request completed reads 0/C (error), never None/C; the
    N/P line is printed once (summary.md's), and says how many points were not run."""
    from fake_server import Behaviour, FakeServer

    b = Behaviour(ttft=0.005, itl=0.001, script=["http500"])  # point 1's warm-up fails
    argv = ["bench", "matrix", "--disable-tqdm", "--input-len", "8", "--output-len", "4"]
    with FakeServer(b) as s:
        rc = bench_main(
            argv + ["--base-url", s.url, "--concurrency", "1,2", "--output-dir", str(tmp_path / "a")]
        )
        out = capsys.readouterr().out
        assert rc == 1
        assert "| 1 | 8 | 4 | 0/1 (error) |" in out and "| 2 | 8 | 4 | 2/2 |" in out and "None" not in out
        assert out.count("points successful") == 1 and "\n1/2 points successful.\n" in out
        assert out.rstrip().endswith(f"artifacts in {tmp_path / 'a'}")
        assert (tmp_path / "a" / "summary.md").read_text().count("0/1 (error)") == 1
        stop = ["--concurrency", "1,2,3", "--stop-after", "0", "--output-dir", str(tmp_path / "b")]
        assert bench_main(argv + ["--base-url", s.url, *stop]) == 1  # one point, then stop
        out = capsys.readouterr().out
        assert out.count("points successful") == 1 and "1/3 points successful (2 not run)." in out


def test_an_fp8_peak_for_a_bf16_model_is_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--peak-flops-fp8`` with bf16 weights changes no point's ceiling: ``bench matrix`` says so
    once on stderr (not once per point), as ``bench roofline`` does; with ``--roofline-dtype fp8``
    it says nothing."""
    from fake_server import Behaviour, FakeServer

    argv = [
        "bench",
        "matrix",
        "--disable-tqdm",
        "--concurrency",
        "1,2",
        "--input-len",
        "8",
        "--output-len",
        "4",
    ]
    argv += ["--gpu", "h200", "--model-config", str(BUNDLED_MODEL), "--peak-flops-fp8", "2e15"]
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        assert bench_main([*argv, "--base-url", s.url, "--output-dir", str(tmp_path / "a")]) == 0
        err = capsys.readouterr().err
        assert err.startswith("surge: warning: --peak-flops-fp8 changes nothing here: no GEMM") and (
            err.count("--peak-flops-fp8") == 1
        ), err
        assert "(--roofline-dtype auto; give --roofline-dtype fp8 for FP8 weights)" in err
        fp8 = [*argv, "--roofline-dtype", "fp8", "--base-url", s.url, "--output-dir", str(tmp_path / "b")]
        assert bench_main(fp8) == 0
        assert "--peak-flops-fp8" not in capsys.readouterr().err


def test_a_point_longer_than_the_roofline_context_warns_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The roofline column of a point whose I + O exceeds the model config's context (512 for the
    bundled model) was given without a word: that point's run says in one line that its figure
    assumes a context the model does not support; the point that fits says nothing."""
    from fake_server import Behaviour, FakeServer

    argv = ["bench", "matrix", "--disable-tqdm", "--concurrency", "1", "--input-len", "8,500"]
    argv += ["--output-len", "16", "--gpu", "h200", "--model-config", str(BUNDLED_MODEL)]
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        assert bench_main([*argv, "--base-url", s.url, "--output-dir", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert err.count("surge: warning: ") == 1 and err.count("needs more than the model's context") == 1, err
    assert "roofline column: C1/I500/O16 needs more than the model's context (512 tokens" in err
    assert "its figure assumes a context the model does not support" in err and "C1/I8/" not in err
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert all(p["pct_of_roofline"] is not None for p in summary["points"])


def test_roofline_flags_without_a_gpu_are_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--roofline-tp 2`` (or ``--model-config``...) without ``--gpu`` gives no roofline column and was
    taken silently: ``bench matrix`` now says so once on stderr, not once per point, and runs."""
    from fake_server import Behaviour, FakeServer

    argv = [
        "bench",
        "matrix",
        "--disable-tqdm",
        "--concurrency",
        "1,2",
        "--input-len",
        "8",
        "--output-len",
        "4",
    ]
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        argv += ["--base-url", s.url, "--output-dir", str(tmp_path / "a"), "--roofline-tp", "2"]
        assert bench_main(argv) == 0
    err = capsys.readouterr().err
    assert err == (
        "surge: warning: --roofline-tp changes nothing without the hardware (--gpu NAME, or --hbm-bandwidth "
        "and --peak-flops): no roofline column is computed\n"
    ), err


def test_matrix_flag_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["bench", "matrix", "--output-dir", str(tmp_path)]
    for argv in (
        base,
        base + ["--preset", "official-8b", "--concurrency", "1"],
        base + ["--concurrency", "1,x", "--input-len", "8", "--output-len", "8"],
        base + ["--preset", "official-8b", "--gpu", "nope"],
        base + ["--preset", "official-8b", "--goodput", "ttft"],
        base + ["--preset", "official-8b", "--roofline-dtype", "int4"],
    ):
        assert bench_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("surge: error:") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("flags", "hint"),
    [
        (["--num-prompts", "64"], "--num-prompts: use --concurrency"),
        (["--max-concurrency", "64"], "--max-concurrency: use --concurrency"),
        (["--request-rate", "4"], "--request-rate: use nothing: a matrix point is a burst"),
        (["--burstiness", "2"], "--burstiness: use nothing: a matrix point is a burst"),
        (["--ramp-up-strategy", "linear"], "--ramp-up-strategy: use nothing: a matrix point is a burst"),
        (["--dataset-name", "random"], "--dataset-name: use nothing: every matrix point is a random one"),
        (["--random-input-len", "256"], "--random-input-len: use --input-len"),
        (["--random-output-len", "256"], "--random-output-len: use --output-len"),
        (["--random-range-ratio", "0.5"], "--random-range-ratio: use nothing: a matrix point's prompts"),
        (["--random-prefix-len", "64"], "--random-prefix-len: use nothing: a matrix point's prompts"),
        (["--ignore-eos"], "--ignore-eos: use nothing: every matrix point asks the server to ignore EOS"),
        (["--metadata", "a=b"], "--metadata: use --label"),
        (["--save-detailed"], "--save-detailed: use nothing: each point's"),
    ],
)
def test_vllm_serve_flags_in_a_matrix_are_hinted(
    flags: list[str], hint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's bench serve flags that a matrix point sets itself or does without were refused as bare
    unrecognized arguments: each now says what the matrix does instead, in one line."""
    from surge.cli import main

    argv = ["bench", "matrix", "--concurrency", "1", "--input-len", "8", "--output-len", "8"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--output-dir", str(tmp_path), *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"surge: error: unrecognized arguments: {flags[0]} (vLLM's {hint}"), err
    assert err.count("\n") == 1, err


def test_matrix_server_that_cannot_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The one error line quotes what the server said last (its own one-line error), so the user
    need not open the log to learn why it did not start; a server that said nothing is told so."""
    said = "surge: error: MODEL /models/x: no such folder"
    script = f"import sys; print('starting'); print({said!r}, file=sys.stderr); sys.exit(3)"
    (tmp_path / "server.log").write_text("an earlier run's last line\n")
    for code, expected in (
        (script, f"its last line: {said!r}; see"),
        ("import sys; sys.exit(3)", "without a line"),
    ):
        launch = f"{sys.executable} -c {shlex.quote(code)}"
        argv = ["bench", "matrix", "--base-url", f"http://127.0.0.1:{free_port()}", "--launch", launch]
        rc = bench_main(
            argv
            + ["--concurrency", "1", "--input-len", "8", "--output-len", "4", "--output-dir", str(tmp_path)]
        )
        err = capsys.readouterr().err
        assert rc == 2 and "server exited with code 3 during start-up" in err and err.count("\n") == 1, err
        assert expected in err and "earlier run" not in err, err


def test_last_log_line_is_this_starts_and_cut(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("old line\n")
    start = log.stat().st_size
    assert last_log_line(log, start) == ""
    log.write_text("old line\nnew one\n  \n")
    assert last_log_line(log, start) == "new one"
    log.write_text("old line\n" + "x" * 1000 + "\n")
    line = last_log_line(log, start)
    assert len(line) == LAST_LINE_CHARS and line.endswith("...")
    assert last_log_line(tmp_path / "missing.log", 0) == ""


def test_mini_matrix_against_live_surge_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """2x2x2 matrix against `surge serve` of the bundled model: every artifact, every point successful."""
    monkeypatch.chdir(REPO)
    port = free_port()
    out = tmp_path / "live"
    launch = f"{sys.executable} -m surge.cli serve --port {port} --max-num-seqs 64"
    rc = bench_main(
        ["bench", "matrix", "--base-url", f"http://127.0.0.1:{port}", "--launch", launch, "--disable-tqdm"]
        + ["--concurrency", "1,2", "--input-len", "16,24", "--output-len", "4,8", "--output-dir", str(out)]
        + ["--hbm-bandwidth", "1e11", "--peak-flops", "1e12", "--server-timeout", "240"]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 0, [p["error"] for p in summary["points"]]
    _check_artifacts(out, summary, 8)
    assert summary["num_successful"] == 8 and summary["server_restarts"] == 0
    for p in summary["points"]:
        r = load_result(out / p["result_file"])
        assert r["token_counter"].endswith("/tokenize")  # prompt lengths counted by the server itself
        assert r["server_models"]["data"][0]["root"].endswith("stories260K")
        assert p["roofline_output_throughput"] > 0  # config found through /v1/models root
        # chat: the server saw exactly --input-len prompt tokens, chat template included
        assert r["input_lens"] == [p["input_len"]] * p["concurrency"]
        assert r["prefix_cache_reset"] is True
    # the launched server and its engine are gone (a SIGKILLed process takes a moment to die)
    deadline = time.monotonic() + 10
    while _processes_with(f"--port {port}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(f"--port {port}")
    # comparing a run with itself: every point valid in both, geometric mean change 0
    rc = bench_main(["bench", "compare", str(out), str(out / "summary.json")])
    assert rc == 0
    assert "valid in both: +0.0%" in capsys.readouterr().out


def _processes_with(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``text``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def test_surge_cli_entry_point() -> None:
    """`python -m surge.cli bench ...` through the lead's top-level parser: output and one-line errors."""
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "surge.cli",
            "bench",
            "roofline",
            "--model",
            str(BUNDLED_MODEL),
            "--gpu",
            "h200",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and "| 64 | 256 | 4096 |" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "surge.cli", "bench", "serve", "--percentiles", "x"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("surge: error:") and bad.stderr.count("\n") == 1


def test_matrix_roofline_in_fp8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The matrix passes ``--roofline-dtype``/``--roofline-kv-cache-dtype`` to every point's
    ceiling and records them in the summary (benchmarks/h200.sh --quantization fp8 uses them)."""
    from surge.bench.roofline import load_config, lookup_gpu, model_shape, point_roofline

    port = free_port()
    out = tmp_path / "m"
    rc = bench_main(
        ["bench", "matrix", "--base-url", f"http://127.0.0.1:{port}", "--disable-tqdm"]
        + ["--launch", f"{sys.executable} {FAKE} --port {port}", "--server-timeout", "60"]
        + ["--concurrency", "2", "--input-len", "8", "--output-len", "4", "--output-dir", str(out)]
        + ["--gpu", "h200", "--model-config", str(BUNDLED_MODEL)]
        + ["--roofline-dtype", "fp8", "--roofline-kv-cache-dtype", "fp8"]
    )
    assert rc == 0, capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["roofline_dtype"] == "fp8" and summary["roofline_kv_cache_dtype"] == "fp8"
    shape = model_shape(load_config(BUNDLED_MODEL), "fp8", 1, "fp8")
    roof = point_roofline(shape, lookup_gpu("h200"), 2, 8, 4).output_throughput
    assert summary["points"][0]["roofline_output_throughput"] == pytest.approx(roof)
    capsys.readouterr()


def test_sigterm_stops_the_launched_server(tmp_path: Path) -> None:
    """SIGTERM to `surge bench matrix --launch` exits 143 and takes the server it launched down
    with it (before, the server outlived the bench and kept its port)."""
    import signal
    import subprocess
    import time
    import urllib.request

    port = free_port()
    out = tmp_path / "m"
    launch = f"{sys.executable} {FAKE} --port {port} --itl 0.05"
    argv = [sys.executable, "-m", "surge.cli", "bench", "matrix", "--base-url", f"http://127.0.0.1:{port}"]
    argv += ["--launch", launch, "--disable-tqdm", "--concurrency", "1", "--input-len", "8"]
    argv += ["--output-len", "400", "--repeats", "5", "--output-dir", str(out), "--server-timeout", "60"]
    bench = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    healthy = False
    while time.monotonic() < deadline and not healthy:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                healthy = r.status == 200
        except OSError:
            time.sleep(0.2)
    assert healthy, bench.communicate(timeout=5)[0]
    time.sleep(1.0)  # a point is running
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=60) == 143
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)


def test_output_dir_under_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    argv = ["bench", "matrix", "--base-url", "http://127.0.0.1:1", "--concurrency", "1", "--input-len", "8"]
    rc = bench_main([*argv, "--output-len", "4", "--output-dir", str(blocker / "sub")])
    err = capsys.readouterr().err
    assert rc == 2 and f"--output-dir {blocker / 'sub'}: {blocker} is a file, not a folder" in err, err


def test_launch_and_server_timeout_mistakes_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "bench",
        "matrix",
        "--base-url",
        "http://127.0.0.1:18125",
        "--concurrency",
        "1",
        "--input-len",
        "8",
    ]
    argv += ["--output-len", "4", "--output-dir", str(tmp_path / "m")]
    for extra, words in (
        (
            ["--launch", "surge serve --port '18125"],
            '--launch "surge serve --port \'18125": No closing quotation',
        ),
        (["--launch", "surge serve --port 18125", "--server-timeout", "0"], "--server-timeout must be > 0"),
    ):
        rc = bench_main([*argv, *extra])
        err = capsys.readouterr().err
        assert rc == 2 and words in err and err.count("\n") == 1, err


def test_a_points_warning_is_said_once_per_matrix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A warning that each point of a matrix would give (the server counting other prompt tokens
    than a local ``--tokenizer``; a ``--gpu`` whose served model is no model folder here) is said
    once for the matrix, not once per point; a lone ``bench serve`` still says it."""
    from fake_server import Behaviour, FakeServer

    argv = ["bench", "matrix", "--disable-tqdm", "--concurrency", "1,2", "--input-len", "20,24"]
    argv += ["--output-len", "4"]
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:  # word-level tokens; root /nonexistent
        argv += ["--base-url", s.url]
        counted = ["--tokenizer", str(BUNDLED_MODEL), "--output-dir", str(tmp_path / "a")]
        assert bench_main([*argv, *counted]) == 0
        err = capsys.readouterr().err
        assert err.count("surge: warning: the server counted") == 1, err
        assert "(the first point's counts; said once for the matrix)" in err
        assert bench_main([*argv, "--gpu", "h200", "--output-dir", str(tmp_path / "b")]) == 0
        err = capsys.readouterr().err
        assert err.count("surge: warning: no roofline column: the served model 'fake-model'") == 1, err
        serve = ["bench", "serve", "--disable-tqdm", "--input-len", "20", "--output-len", "4"]
        assert bench_main([*serve, "--tokenizer", str(BUNDLED_MODEL), "--base-url", s.url]) == 0
        err = capsys.readouterr().err
        assert err.count("surge: warning: the server counted") == 1 and "said once" not in err, err


def test_a_model_the_server_does_not_serve_is_refused_before_any_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--model foo`` against a server that serves another model failed every point with the
    same error (30 lines and exit 1 for the official preset); it is now refused in one line
    before any point, as an unreachable server is, and leaves no folder."""
    from fake_server import Behaviour, FakeServer

    argv = ["bench", "matrix", "--disable-tqdm", "--concurrency", "1,2", "--input-len", "20"]
    argv += ["--output-len", "4", "--model", "foo", "--output-dir", str(tmp_path / "m")]
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        assert bench_main([*argv, "--base-url", s.url]) == 2
        assert not s.behaviour.log  # no request was sent
    captured = capsys.readouterr()
    assert captured.err == (
        "surge: error: the server does not serve model 'foo'; it serves 'fake-model'\n"
    ), captured.err
    assert "[matrix" not in captured.out and not (tmp_path / "m").exists()


def test_launch_of_surge_or_vllm_serve_without_port_must_match_the_base_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench matrix --port 8625 --launch "surge serve --device cpu"` started the server on its
    default port 8000 and waited --server-timeout (600 s) for port 8625, saying nothing; a
    ``surge serve`` or ``vllm serve`` command without --port is on port 8000, and any other port
    is one line at once."""
    from surge.bench.launcher import check_launch_port

    argv = [
        "bench",
        "matrix",
        "--port",
        "18126",
        "--concurrency",
        "1",
        "--input-len",
        "8",
        "--output-len",
        "4",
    ]
    argv += [
        "--output-dir",
        str(tmp_path / "m"),
        "--server-timeout",
        "5",
        "--launch",
        "surge serve --device cpu",
    ]
    rc = bench_main(argv)
    err = capsys.readouterr().err
    words = "--launch starts surge serve without --port, on its default port 8000, but --base-url"
    assert rc == 2 and words in err and "add --port 18126 to the command" in err and err.count("\n") == 1, err
    assert not (tmp_path / "m").exists()
    url = "http://127.0.0.1:18126"
    for command, serve in (
        ("/opt/venv/bin/surge serve /models/m", "surge serve"),
        (f"{sys.executable} -m surge serve", "surge serve"),
        ("python3 -m surge.cli serve --max-num-seqs 8", "surge serve"),
        ("env CUDA_VISIBLE_DEVICES=0 vllm serve /models/m", "vllm serve"),
        ("python -m vllm.entrypoints.cli.main serve m", "vllm serve"),
    ):
        with pytest.raises(ValueError, match=f"starts {serve} without --port, on its default port 8000"):
            check_launch_port(command, url)
    for command in (
        "surge serve --port 18126",
        "surge serve --port=18126",
        "surge serve --uds /tmp/s.sock",
        "surge serve --config serve.yaml",
        f"{sys.executable} fake_server.py",  # another program: its default port is not known
    ):
        check_launch_port(command, url)
    check_launch_port("surge serve", "http://127.0.0.1:8000")
