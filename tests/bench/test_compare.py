"""`surge bench compare` of two hand-made summaries with a hand-checkable geometric mean."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import bench_main

from surge.bench.compare import compare_points, load_points


def _pt(
    c: int, i: int, o: int, thr: float | None, success: bool = True, ttft: float = 100.0
) -> dict[str, Any]:
    return {
        "concurrency": c,
        "input_len": i,
        "output_len": o,
        "success": success,
        "output_throughput": thr,
        "mean_ttft_ms": ttft,
    }


def _write(path: Path, points: list[dict[str, Any]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(json.dumps({"points": points}))
    return path


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    base = _write(
        tmp_path / "base",
        [
            _pt(1, 32, 256, 100.0),
            _pt(1, 32, 1024, 100.0, ttft=50.0),
            _pt(4, 32, 256, 400.0),
            _pt(4, 32, 1024, 400.0),
            _pt(16, 32, 256, 1000.0),  # valid only in BASE
            _pt(64, 32, 256, 5000.0, success=False),  # valid only in NEW
            _pt(64, 32, 1024, None, success=False),  # neither
        ],
    )
    new = _write(
        tmp_path / "new",
        [
            _pt(1, 32, 256, 200.0),  # x2
            _pt(1, 32, 1024, 50.0, ttft=25.0),  # x0.5
            _pt(4, 32, 256, 800.0),  # x2
            _pt(4, 32, 1024, 400.0),  # x1 (tie)
            _pt(16, 32, 256, 900.0, success=False),
            _pt(64, 32, 256, 6000.0),
            _pt(64, 32, 1024, 1.0, success=False),
        ],
    )
    return base, new


def test_geomean_by_hand(runs: tuple[Path, Path]) -> None:
    base, new = runs
    cmp = compare_points(load_points(base), load_points(new / "summary.json"))
    # ratios 2, 0.5, 2, 1 -> geometric mean (2 * 0.5 * 2 * 1) ** (1/4) = 2 ** 0.25
    assert cmp.geomean == pytest.approx(2**0.25)
    assert cmp.grouped(0) == {1: (2, pytest.approx(1.0)), 4: (2, pytest.approx(math.sqrt(2)))}
    assert cmp.grouped(2) == {256: (2, pytest.approx(2.0)), 1024: (2, pytest.approx(math.sqrt(0.5)))}
    assert cmp.wins_losses() == (2, 1, 1)
    assert (
        cmp.only_base == [(16, 32, 256)]
        and cmp.only_new == [(64, 32, 256)]
        and cmp.neither == [(64, 32, 1024)]
    )


def test_lower_is_better_metric(runs: tuple[Path, Path]) -> None:
    cmp = compare_points(load_points(runs[0]), load_points(runs[1]), "mean_ttft_ms")
    assert cmp.lower_is_better and cmp.wins_losses() == (1, 0, 3)
    assert cmp.geomean == pytest.approx(0.5**0.25)


def test_cli_markdown_and_plot(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "cmp.png"
    rc = bench_main(["bench", "compare", str(runs[0]), str(runs[1]), "--plot", str(png)])
    out = capsys.readouterr().out
    assert rc == 0 and png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "| 1 | 32 | 256 | 100.00 | 200.00 | +100.0% |" in out
    assert "| 1 | 32 | 1024 | 100.00 | 50.00 | -50.0% |" in out
    assert "valid in both: +18.9%" in out  # 2 ** 0.25 = 1.1892
    assert "| 4 | 2 | +41.4% |" in out and "| 1024 | 2 | -29.3% |" in out
    assert "Wins: 2, losses: 1, ties: 1" in out
    assert "Valid only in BASE (1): C16/I32/O256" in out and "Valid only in NEW (1): C64/I32/O256" in out


def test_single_result_files_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    common = {
        "num_prompts": 4,
        "max_concurrency": 4,
        "input_len": 32,
        "output_len": 256,
        "completed": 4,
        "failed": 0,
    }
    a.write_text(json.dumps({**common, "output_throughput": 100.0}))
    b.write_text(json.dumps({**common, "output_throughput": 121.0}))
    assert compare_points(load_points(a), load_points(b)).geomean == pytest.approx(1.21)
    # ShareGPT results: prompts and (with reply lengths) outputs of many lengths, stored as null
    sharegpt = {**common, "dataset": "sharegpt", "input_len": None, "output_len": None}
    a.write_text(json.dumps({**sharegpt, "output_throughput": 100.0}))
    b.write_text(json.dumps({**sharegpt, "output_throughput": 90.0}))
    assert compare_points(load_points(a), load_points(b)).geomean == pytest.approx(0.9)
    assert bench_main(["bench", "compare", str(a), str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("surge: error:") and err.count("\n") == 1


def test_gzipped_result_files_and_read_errors_name_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench serve --result-file X.json.gz`` writes gzipped JSON: compare reads it (by its name
    or its magic bytes), and a file it cannot read is named in the one-line error."""
    import gzip

    common = {"num_prompts": 4, "max_concurrency": 4, "input_len": 32, "output_len": 256}
    common |= {"completed": 4, "failed": 0}
    a = tmp_path / "a.json"
    a.write_text(json.dumps({**common, "output_throughput": 100.0}))
    b = tmp_path / "b.json.gz"
    b.write_bytes(gzip.compress(json.dumps({**common, "output_throughput": 121.0}).encode(), mtime=0))
    assert compare_points(load_points(a), load_points(b)).geomean == pytest.approx(1.21)
    assert bench_main(["bench", "compare", str(a), str(b)]) == 0
    assert "+21.0%" in capsys.readouterr().out
    misnamed = tmp_path / "c.json"  # gzipped under a plain name
    misnamed.write_bytes(b.read_bytes())
    assert compare_points(load_points(misnamed), load_points(a)).geomean == pytest.approx(1 / 1.21)
    bad = {
        "binary.json": b"\x8b\xff\x00 not text",
        "cut.json.gz": b.read_bytes()[:20],
        "plain.json.gz": b"not gzip",
        "text.json": b"{not json",
    }
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
        assert bench_main(["bench", "compare", str(a), str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"surge: error: {tmp_path / name}: ") and err.count("\n") == 1, err
        assert "codec" not in err, err


def test_a_json_lines_file_of_runs_loads_run_by_run(tmp_path: Path) -> None:
    """``bench serve --append-result`` writes one run a line: load_points said "not JSON (Extra
    data ...)"; each run is now the point of its (C, I, O), the last run of a point counting, and
    the caller gets one note."""
    base = {"num_prompts": 4, "input_len": 32, "output_len": 256, "completed": 4, "failed": 0}
    runs = [
        {**base, "max_concurrency": 1, "output_throughput": 100.0},
        {**base, "max_concurrency": 4, "output_throughput": 300.0},
        {**base, "max_concurrency": 4, "output_throughput": 400.0},
    ]
    path = tmp_path / "runs.json"
    path.write_text("\n".join(json.dumps(r) for r in runs) + "\n")
    notes: list[str] = []
    points = load_points(path, notes)
    assert {k: v["output_throughput"] for k, v in points.items()} == {
        (1, 32, 256): 100.0,
        (4, 32, 256): 400.0,
    }
    assert notes == [
        f"{path}: a JSON-lines file of 3 runs (--append-result), read as 2 points; where runs share a point "
        "the last one counts (1 earlier left out)"
    ]
    path.write_text(json.dumps(runs[0]) + "\n\n")  # one run, a trailing blank line: no note
    assert list(load_points(path, notes)) == [(1, 32, 256)] and len(notes) == 1
    path.write_text(json.dumps(runs[0]) + "\n{broken\n")
    with pytest.raises(ValueError, match=r"runs.json: not JSON \(Extra data"):
        load_points(path)


def test_runs_with_no_common_point_are_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"num_prompts": 1, "max_concurrency": 1, "input_len": 32, "completed": 1, "failed": 0}
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps({**base, "output_len": 256, "output_throughput": 100.0}))
    b.write_text(json.dumps({**base, "output_len": 1024, "output_throughput": 100.0}))
    assert bench_main(["bench", "compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "nothing to compare" in err and err.count("\n") == 1


def test_committed_h200_results_still_load(capsys: pytest.CaptureFixture[str]) -> None:
    """The committed matrices (per-request lists gzipped) load point by point and compare."""
    from conftest import REPO

    from surge.bench.results import load_result

    root = REPO / "benchmarks" / "results" / "h200-qwen3-8b"
    r = load_result(root / "stream-interval-1" / "C4_I256_O1024.json")
    assert (
        len(r["itls"]) == 4
        and all(900 < len(x) <= 1023 for x in r["itls"])
        and r["output_lens"] == [1024] * 4
    )
    rc = bench_main(["bench", "compare", str(root / "stream-interval-1"), str(root / "stream-interval-16")])
    assert rc == 0 and "points valid in both" in capsys.readouterr().out


def _rep(c: int, thr: list[float]) -> dict[str, Any]:
    runs = [{"success": True, "output_throughput": t} for t in thr]
    return {**_pt(c, 32, 256, sum(thr) / len(thr)), "repeats": len(thr), "runs": runs}


def test_ties_inside_the_noise_and_bootstrap_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _write(tmp_path / "b", [_rep(1, [100, 110, 90, 105, 95]), _rep(4, [400, 402, 398, 401, 399])])
    new = _write(tmp_path / "n", [_rep(1, [105, 115, 95, 110, 100]), _rep(4, [500, 502, 498, 501, 499])])
    cmp = compare_points(load_points(base), load_points(new))
    assert cmp.ties == {(1, 32, 256)}  # +5 % inside a +-10 % spread; +25 % at C4 is far outside
    assert cmp.wins_losses() == (1, 0, 1)
    lo, hi, method = cmp.geomean_interval()
    assert method == "bootstrap over repeats" and lo < cmp.geomean < hi
    assert hi / lo < 1.2  # the C4 point is tight, C1's noise widens it a little
    assert bench_main(["bench", "compare", str(base), str(new)]) == 0
    out = capsys.readouterr().out
    assert "tie (in noise)" in out and "bootstrap over repeats" in out and "95% CI" in out


def test_few_repeats_get_a_welch_interval_not_a_bootstrap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two repeats a point: the bootstrap said "-41.2 % to -8.8 %" while each point was a tie by
    Welch's test (resampling two values understates their noise). Under 5 repeats a point the
    interval is Welch's t-interval over the repeats, computed here by hand."""
    b = {1: [548.1, 477.1], 4: [581.0, 633.6]}
    n = {1: [233.3, 485.6], 4: [496.2, 493.4]}
    base = _write(tmp_path / "b", [_rep(c, v) for c, v in b.items()])
    new = _write(tmp_path / "n", [_rep(c, v) for c, v in n.items()])
    cmp = compare_points(load_points(base), load_points(new))
    assert cmp.ties == {(1, 32, 256), (4, 32, 256)}
    lo, hi, method = cmp.geomean_interval()
    assert method.startswith("Welch t-interval over repeats")

    def var(xs: list[float]) -> float:  # sample variance of the logs
        logs = [math.log(x) for x in xs]
        m = sum(logs) / len(logs)
        return sum((x - m) ** 2 for x in logs) / (len(logs) - 1)

    se2 = [var(v) / 2 for c in (1, 4) for v in (b[c], n[c])]  # 4 sampling variances of means
    df = sum(se2) ** 2 / sum(x**2 / 1 for x in se2)  # Welch-Satterthwaite: each has 1 degree of freedom
    assert 1 <= df < 2  # one sample dominates: t975(1) = 12.706
    center = math.log(math.sqrt((sum(n[1]) / sum(b[1])) * (sum(n[4]) / sum(b[4]))))
    half = 12.706 * math.sqrt(sum(se2)) / 2
    assert lo == pytest.approx(math.exp(center - half)) and hi == pytest.approx(math.exp(center + half))
    assert lo < 1.0 < hi  # as the ties say: no change shown
    assert bench_main(["bench", "compare", str(base), str(new)]) == 0
    assert "a point has fewer than 5, too few to bootstrap" in capsys.readouterr().out
    # three repeats on one side, five on the other: still too few for a bootstrap
    five = _write(tmp_path / "b5", [_rep(1, [100, 110, 90, 105, 95]), _rep(4, [400, 402, 398, 401, 399])])
    three = _write(tmp_path / "n3", [_rep(1, [105, 115, 95]), _rep(4, [500, 502, 498])])
    assert compare_points(load_points(five), load_points(three)).geomean_interval()[2].startswith("Welch")


def test_tie_band_without_repeats_and_t_interval(runs: tuple[Path, Path]) -> None:
    cmp = compare_points(load_points(runs[0]), load_points(runs[1]), tie_pct=60.0)
    assert cmp.wins_losses() == (2, 0, 2)  # x2, x2 win; x0.5 (-50 %) and x1 are inside 60 %
    lo, hi, method = cmp.geomean_interval()
    assert method == "t-interval over points"
    logs = [math.log(2), math.log(0.5), math.log(2), 0.0]
    m = sum(logs) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 3)
    assert lo == pytest.approx(math.exp(m - 3.182 * sd / 2)) and hi == pytest.approx(
        math.exp(m + 3.182 * sd / 2)
    )


def test_unknown_metric_lists_the_valid_ones(
    runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_main(["bench", "compare", str(runs[0]), str(runs[1]), "--metric", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown --metric 'nope'" in err and "output_throughput" in err


def test_plot_into_a_missing_folder(runs: tuple[Path, Path], tmp_path: Path) -> None:
    png = tmp_path / "new" / "dir" / "cmp.png"
    assert bench_main(["bench", "compare", str(runs[0]), str(runs[1]), "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_extension_is_a_png_named_so(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_main(["bench", "compare", str(runs[0]), str(runs[1]), "--plot", str(tmp_path / "cmp")]) == 0
    png = tmp_path / "cmp.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "cmp").exists()
    assert f"plot written to {png}" in capsys.readouterr().err


def test_bad_plot_tie_and_metric_are_one_line(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --plot path that is a folder or sits under a file (was a traceback after the table), a
    negative --tie-pct and a count as --metric are one-line errors before any output."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for extra, words in (
        (["--plot", str(tmp_path)], "--plot"),
        (["--plot", str(blocker / "x.png")], "--plot"),
        (["--plot", str(tmp_path / "out.txt")], ".txt is not an image format"),
        (["--tie-pct", "-1"], "--tie-pct must be >= 0"),
        (["--metric", "failed"], "unknown --metric 'failed'"),
    ):
        rc = bench_main(["bench", "compare", str(runs[0]), str(runs[1]), *extra])
        captured = capsys.readouterr()
        assert rc == 2 and captured.out == "", captured.out
        assert captured.err.startswith("surge: error:") and words in captured.err
        assert captured.err.count("\n") == 1, captured.err


def test_duration_is_lower_is_better(runs: tuple[Path, Path]) -> None:
    base = {(1, 8, 4): {**_pt(1, 8, 4, 10.0), "duration": 10.0}}
    new = {(1, 8, 4): {**_pt(1, 8, 4, 10.0), "duration": 5.0}}
    cmp = compare_points(base, new, "duration")
    assert cmp.lower_is_better and cmp.wins_losses() == (1, 0, 0)


def test_runs_measured_differently_are_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A burst run against a --request-rate 4 run (or chat against completions) is a comparison
    of unlike things: the report and stderr say so, naming the setting."""
    common = {"num_prompts": 16, "input_len": 16, "output_len": 32, "completed": 16, "failed": 0}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({**common, "request_rate": "inf", "output_throughput": 100.0}))
    b.write_text(json.dumps({**common, "request_rate": 4.0, "output_throughput": 10.0}))
    assert bench_main(["bench", "compare", str(a), str(b)]) == 0
    cap = capsys.readouterr()
    assert (
        "**Warning: the runs were measured differently:** C16/I16/O32 request_rate 'inf' vs 4.0." in cap.out
    )
    assert (
        cap.err
        == "surge: warning: the runs differ in request_rate: 'inf' in BASE, 4.0 in NEW (at C16/I16/O32)\n"
    )
    # two settings that differ at one point are one point (it counted the settings: "at 2 point(s)")
    a.write_text(json.dumps({**common, "request_rate": "inf", "burstiness": 1.0, "output_throughput": 100.0}))
    b.write_text(json.dumps({**common, "request_rate": 4.0, "burstiness": 0.5, "output_throughput": 10.0}))
    assert bench_main(["bench", "compare", str(a), str(b)]) == 0
    cap = capsys.readouterr()
    assert "C16/I16/O32 request_rate 'inf' vs 4.0; C16/I16/O32 burstiness" in cap.out
    assert cap.err.count("\n") == 2 and "differ in burstiness: 1.0 in BASE, 0.5 in NEW" in cap.err, cap.err
    # matrix summaries carry the endpoint; a matrix row's num_prompts (points x repeats) is not compared
    x = _write(tmp_path / "x", [{**_pt(1, 8, 4, 1.0), "num_prompts": 1, "repeats": 1}])
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "summary.json").write_text(
        json.dumps(
            {"endpoint": "/v1/completions", "points": [{**_pt(1, 8, 4, 1.0), "num_prompts": 3, "repeats": 3}]}
        )
    )
    data = json.loads((x / "summary.json").read_text())
    (x / "summary.json").write_text(json.dumps({**data, "endpoint": "/v1/chat/completions"}))
    cmp = compare_points(load_points(x), load_points(tmp_path / "y"))
    assert cmp.mismatches == [((1, 8, 4), "endpoint", "/v1/chat/completions", "/v1/completions")]
    same = compare_points(load_points(x), load_points(x))
    assert same.mismatches == []
    # against a bench serve run, the prompts of one run are compared (a matrix row skipped it:
    # a 2-request burst was scored against a 4-request run without a warning)
    serve = tmp_path / "serve.json"
    run = {"max_concurrency": 1, "input_len": 8, "output_len": 4, "failed": 0, "output_throughput": 1.0}
    run |= {"endpoint": "/v1/completions"}
    serve.write_text(json.dumps({**run, "num_prompts": 4, "completed": 4}))
    cmp = compare_points(load_points(tmp_path / "y"), load_points(serve))
    assert cmp.mismatches == [((1, 8, 4), "num_prompts", 1, 4)]
    serve.write_text(json.dumps({**run, "num_prompts": 1, "completed": 1}))
    assert compare_points(load_points(tmp_path / "y"), load_points(serve)).mismatches == []


def test_results_without_ramp_up_keys_and_older_files_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A result without a ramp-up has no ramp_up_* keys (as vLLM's): its absence reads as null, so
    a ramp-up run against it is flagged, and an older file (the keys null, tokenizer_id the
    server's /tokenize URL, no token_counter) still loads and compares with a new one unflagged."""
    common = {"num_prompts": 16, "input_len": 16, "output_len": 32, "completed": 16, "failed": 0}
    common |= {"request_rate": "inf", "model_id": "m"}
    old = {**common, "tokenizer_id": "http://127.0.0.1:8661/tokenize", "output_throughput": 100.0}
    old |= dict.fromkeys(("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps"))
    new = {**common, "tokenizer_id": "m", "token_counter": "http://127.0.0.1:8661/tokenize"}
    new |= {"output_throughput": 110.0}
    ramp = {**new, "ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 20}
    files = {}
    for name, data in (("old", old), ("new", new), ("ramp", ramp)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(data))
    assert bench_main(["bench", "compare", str(files["old"]), str(files["new"])]) == 0
    cap = capsys.readouterr()
    assert "+10.0" in cap.out and "warning" not in cap.err.lower(), cap
    cmp = compare_points(load_points(files["new"]), load_points(files["ramp"]))
    assert cmp.mismatches == [
        ((16, 16, 32), "ramp_up_strategy", None, "linear"),
        ((16, 16, 32), "ramp_up_start_rps", None, 1),
        ((16, 16, 32), "ramp_up_end_rps", None, 20),
    ]
    matrix = _write(tmp_path / "x", [{**_pt(16, 16, 32, 1.0), "num_prompts": 16, "repeats": 1}])
    assert (
        compare_points(load_points(matrix), load_points(files["ramp"])).mismatches[0][1] == "ramp_up_strategy"
    )


@pytest.mark.parametrize(
    ("dataset", "warned"),
    [
        ("sharegpt", True),
        ("custom", True),
        ("burstgpt", True),
        ("hf", True),
        ("random", False),  # fresh random tokens of the same lengths (a matrix point's seed is its own)
        ("prefix_repetition", False),
        ("sonnet", False),  # the file's lines drawn under the same instruction and prefix
        ("timed_trace", False),  # the blocks' random tokens, same lengths and sharing
        ("spec_bench", False),  # vLLM's seed 0 whatever --seed says
    ],
)
def test_a_seed_that_picks_other_rows_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str, warned: bool
) -> None:
    """Two runs of a dataset whose --seed picks which rows of the file are sent, with other seeds,
    sent other prompts: the report and stderr say so (nothing did); where the seed only draws fresh
    content of the same shape, or is unused, the comparison stays quiet."""
    common = {"dataset": dataset, "num_prompts": 16, "completed": 16, "failed": 0, "output_throughput": 10.0}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({**common, "seed": 0}))
    b.write_text(json.dumps({**common, "seed": 1}))
    assert bench_main(["bench", "compare", str(a), str(b)]) == 0
    cap = capsys.readouterr()
    assert (f"C16/{dataset} seed 0 vs 1 (other prompts)." in cap.out) == warned, cap.out
    assert (
        "surge: warning: the runs differ in seed (other prompts): 0 in BASE, 1 in NEW" in cap.err
    ) == warned
    assert cap.err.count("\n") == warned, cap.err
    same = load_points(a)
    assert compare_points(same, same).mismatches == []


def test_matrix_runs_of_other_seeds_are_not_flagged(tmp_path: Path) -> None:
    """Matrix points draw per-point seeds by design (random prompts of the point's lengths): two
    matrix runs with another --seed compare without a warning."""
    x = _write(tmp_path / "x", [{**_pt(1, 8, 4, 1.0), "repeats": 1}])
    data = json.loads((x / "summary.json").read_text())
    (x / "summary.json").write_text(json.dumps({**data, "seed": 0}))
    y = _write(tmp_path / "y", [])
    (y / "summary.json").write_text(json.dumps({**data, "seed": 1}))
    assert compare_points(load_points(x), load_points(y)).mismatches == []


def test_runs_of_other_models_lengths_or_roofline_dtypes_warn_once_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs that served other models, sent other lengths at a point (another tokenizer or
    chat template) or whose rooflines assumed other dtypes compared without a word: each
    difference is one warning line on stderr (the comparison still runs, exit 0)."""
    roof = {"hardware": {"name": "NVIDIA H200"}, "roofline_tp": 1, "roofline_kv_cache_dtype": None}
    x = _write(tmp_path / "x", [_pt(1, 8, 4, 1.0), _pt(4, 8, 4, 1.0)])
    y = _write(tmp_path / "y", [_pt(1, 8, 4, 2.0), _pt(4, 8, 4, 2.0)])
    for path, model, dtype in ((x, "Qwen/Qwen3-8B", None), (y, "meta-llama/Llama-3.1-8B", "fp8")):
        data = json.loads((path / "summary.json").read_text())
        (path / "summary.json").write_text(
            json.dumps({**data, **roof, "model": model, "roofline_dtype": dtype})
        )
    assert bench_main(["bench", "compare", str(x), str(y)]) == 0
    cap = capsys.readouterr()
    assert cap.err.splitlines() == [
        "surge: warning: the runs differ in model: 'Qwen/Qwen3-8B' in BASE, 'meta-llama/Llama-3.1-8B' in NEW "
        "(at 2 points)",
        "surge: warning: the runs differ in roofline_dtype: None in BASE, 'fp8' in NEW (at 2 points)",
    ]
    assert "+100.0%" in cap.out and "**Warning: the runs were measured differently:**" in cap.out
    # a run without a roofline (no --gpu) assumed nothing: no roofline warning
    data = json.loads((x / "summary.json").read_text())
    (x / "summary.json").write_text(
        json.dumps({**data, "hardware": None, "model": "meta-llama/Llama-3.1-8B"})
    )
    assert bench_main(["bench", "compare", str(x), str(y)]) == 0
    assert capsys.readouterr().err == ""
    # bench serve results: the model is model_id, the roofline's dtypes are under roofline_model
    common = {"num_prompts": 4, "max_concurrency": 4, "input_len": 32, "output_len": 8, "completed": 4}
    common |= {"failed": 0, "total_output_tokens": 32, "hardware": {"name": "NVIDIA H200"}}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(
        json.dumps(
            {**common, "model_id": "m", "total_input_tokens": 128, "output_throughput": 10.0}
            | {"roofline_model": {"dtype": None, "kv_cache_dtype": None}}
        )
    )
    b.write_text(
        json.dumps(
            {**common, "model_id": "m", "total_input_tokens": 164, "output_throughput": 10.0}
            | {"roofline_model": {"dtype": None, "kv_cache_dtype": "fp8"}}
        )
    )
    assert bench_main(["bench", "compare", str(a), str(b)]) == 0
    assert capsys.readouterr().err == (  # the lengths' warning waits for runs of the same settings
        "surge: warning: the runs differ in roofline_kv_cache_dtype: None in BASE, 'fp8' in NEW (at C4/I32/O8)\n"
    )
    b.write_text(b.read_text().replace('"kv_cache_dtype": "fp8"', '"kv_cache_dtype": null'))
    assert bench_main(["bench", "compare", str(a), str(b)]) == 0
    assert capsys.readouterr().err == (
        "surge: warning: the runs differ in mean input tokens: 32.0 in BASE, 41.0 in NEW (at C4/I32/O8)\n"
    )
    # within 1 % the lengths are the same workload; the same model and roofline: quiet
    b.write_text(a.read_text().replace('"total_input_tokens": 128', '"total_input_tokens": 129'))
    assert bench_main(["bench", "compare", str(a), str(b)]) == 0
    assert capsys.readouterr().err == ""


def _serve_result(path: Path, **fields: Any) -> Path:
    """A minimal ``bench serve`` result file: C4, I32, O256, every request completed."""
    common = {"num_prompts": 4, "max_concurrency": 4, "input_len": 32, "output_len": 256, "completed": 4}
    path.write_text(json.dumps({**common, "failed": 0, "output_throughput": 100.0, **fields}))
    return path


def _compare_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert bench_main(["bench", "compare", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("surge: error: ") and captured.err.count("\n") == 1
    return captured.err


def test_goodput_of_runs_made_without_goodput_is_named_null(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--metric request_goodput` of runs made without --goodput said "no point is valid in both"
    (or "unknown --metric"): it now says the metric is null in those runs, naming them, and why."""
    a = _serve_result(tmp_path / "a.json", request_goodput=None)
    b = _serve_result(tmp_path / "b.json", request_goodput=None)
    g = _serve_result(tmp_path / "g.json", request_goodput=3.5)
    err = _compare_error([str(a), str(b), "--metric", "request_goodput"], capsys)
    assert f"--metric request_goodput is null or absent in every point of {a} and {b}" in err
    assert "(request_goodput is measured only with --goodput)" in err
    err = _compare_error([str(g), str(b), "--metric", "request_goodput"], capsys)
    assert f"in every point of {b} (" in err and str(g) not in err.split("point of")[1]
    assert bench_main(["bench", "compare", str(g), str(g), "--metric", "request_goodput"]) == 0


def test_a_metric_of_the_point_files_compares_matrix_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A matrix summary keeps its columns' metrics only: `--metric p50_ttft_ms` of two runs made
    with --percentiles 50 was refused though every point file had it. It is read from them (the
    mean of the successful repeats, each repeat's value for the noise)."""

    def matrix(name: str, p50s: list[float], success: list[bool]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        files = []
        for k, v in enumerate(p50s):
            files.append(f"C1_I8_O4_r{k + 1}.json")
            (folder / files[-1]).write_text(json.dumps({"p50_ttft_ms": v, "mean_ttft_ms": v}))
        runs = [
            {"success": ok, "result_file": f, "output_throughput": 1.0}
            for f, ok in zip(files, success, strict=True)
        ]
        row = {**_pt(1, 8, 4, 1.0), "repeats": len(files), "result_file": files[0], "result_files": files}
        (folder / "summary.json").write_text(json.dumps({"points": [{**row, "runs": runs}]}))
        return folder

    base = matrix("base", [10.0, 12.0, 50.0], [True, True, False])  # the failed repeat does not count
    new = matrix("new", [5.0, 6.0, 7.0], [True, True, True])
    pts = load_points(base, metric="p50_ttft_ms")
    assert pts[(1, 8, 4)]["p50_ttft_ms"] == 11.0
    assert [r["p50_ttft_ms"] for r in pts[(1, 8, 4)]["runs"]] == [10.0, 12.0, 50.0]
    assert bench_main(["bench", "compare", str(base), str(new), "--metric", "p50_ttft_ms"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 8 | 4 | 11.00 | 6.00 | -45.5% | win |" in out, out
    assert "Welch t-interval over repeats" in out  # the repeats' own values were read
    assert "p50_ttft_ms" not in load_points(base)[(1, 8, 4)]  # read only when asked for
    err = _compare_error([str(base), str(new), "--metric", "p90_ttft_ms"], capsys)  # no file has it
    assert "unknown --metric 'p90_ttft_ms'" in err


def test_the_valid_metrics_listed_are_measurements_of_both_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The list of valid metrics held settings (seed, burstiness, temperature, max_concurrency,
    warmup, random_prefix_len ...), and a setting was accepted as --metric."""
    settings = {"seed": 0, "burstiness": 1.0, "temperature": 0.0, "warmup": 1, "random_prefix_len": 0}
    named = {"backend": "openai", "dataset": "random"}  # fields that hold no number
    a = _serve_result(tmp_path / "a.json", p50_ttft_ms=5.0, **named, **settings)
    b = _serve_result(tmp_path / "b.json", **named, **settings)
    err = _compare_error([str(a), str(b), "--metric", "nope"], capsys)
    valid = err.split("valid (carried by both runs): ")[1].strip().split(", ")
    assert valid == ["output_throughput"], valid  # p50_ttft_ms is in one run only
    for setting in [*settings, *named]:
        assert f"unknown --metric {setting!r}" in _compare_error(
            [str(a), str(b), "--metric", setting], capsys
        )
    err = _compare_error([str(a), str(b), "--metric", "p50_ttft_ms"], capsys)
    assert f"--metric p50_ttft_ms is null or absent in every point of {b}" in err


def test_runs_whose_points_differ_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two results of other C/I/O said "no point is valid in both"; it now lists each run's
    points. Shared points that are not valid in both are counted per run."""
    a = _serve_result(tmp_path / "a.json")
    b = _serve_result(tmp_path / "b.json", num_prompts=20, max_concurrency=None, input_len=64, output_len=50)
    err = _compare_error([str(a), str(b)], capsys)
    assert f"{a} and {b} share no point, their C/I/O differ ({a}: C4/I32/O256; {b}: C20/I64/O50)" in err
    failed = _serve_result(tmp_path / "f.json", failed=1)
    err = _compare_error([str(a), str(failed)], capsys)
    assert f"no point is valid in both {a} and {failed}: of the 1 they share (C4/I32/O256)" in err
    assert f"0 failed or lack a positive output_throughput in {a} and 1 in {failed}" in err


def test_one_point_is_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _serve_result(tmp_path / "a.json")
    assert bench_main(["bench", "compare", str(a), str(a)]) == 0
    assert "**Geometric mean change over 1 point valid in both: +0.0%**" in capsys.readouterr().out


def test_points_of_a_dataset_with_its_own_lengths_are_named_by_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ShareGPT results (lengths recorded as null) showed as "I 0 / O 0" and made a "By output
    length: 0" group. They are named by their dataset and left out of the by-length groups, with
    a note; a custom run with a fixed --output-len keeps its O."""
    sg = {"dataset": "sharegpt", "input_len": None, "output_len": None}
    a = _serve_result(tmp_path / "a.json", **sg)
    b = _serve_result(tmp_path / "b.json", **sg, output_throughput=110.0)
    custom = {
        "dataset": "custom",
        "input_len": None,
        "output_len": 20,
        "num_prompts": 2,
        "max_concurrency": 2,
    }
    c = _serve_result(tmp_path / "c.json", **custom)
    assert bench_main(["bench", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| 4 | sharegpt | sharegpt | 100.00 | 110.00 | +10.0% | win |" in out, out
    by_length = out.split("### By output length")[1]
    assert "| 0 |" not in by_length and "| output length |" not in by_length
    assert "Left out: 1 point of a dataset's own output lengths (C4/sharegpt)." in by_length
    assert "| 4 | 1 | +10.0% |" in out.split("### By concurrency")[1]  # still grouped by C
    assert bench_main(["bench", "compare", str(c), str(c)]) == 0
    out = capsys.readouterr().out
    assert "| 2 | custom | 20 |" in out and "| 20 | 1 | +0.0% |" in out.split("### By output length")[1]
    err = _compare_error([str(a), str(c)], capsys)
    assert f"({a}: C4/sharegpt; {c}: C2/custom/O20)" in err


def _vllm_result(**fields: Any) -> dict[str, Any]:
    """A ``vllm bench serve --save-result`` file of vLLM 0.26 (its keys only: no input_len or
    output_len): 4 requests of a random run of 32 prompt and 256 output tokens at concurrency 4."""
    return {
        "date": "20261207-120000",
        "endpoint_type": "openai",
        "backend": "openai",
        "label": None,
        "model_id": "m",
        "tokenizer_id": "m",
        "num_prompts": 4,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 4,
        "duration": 2.0,
        "completed": 4,
        "failed": 0,
        "total_input_tokens": 129,  # the server's counts: one prompt of 33 tokens
        "total_output_tokens": 1024,
        "request_throughput": 2.0,
        "request_goodput": None,
        "output_throughput": 100.0,
        "total_token_throughput": 564.5,
        "max_output_tokens_per_s": 120.0,
        "max_concurrent_requests": 4,
        "rtfx": 0.0,
        "mean_ttft_ms": 20.0,
        **fields,
    }


def test_a_vllm_result_file_is_the_point_of_its_requests_lengths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's result records no input_len/output_len: its point's lengths are its requests' (the
    mean per completed request, rounded; with --save-detailed's lists, the one length of its
    successful requests, a dataset's own where they differ), said in a note, so that it compares
    with Surge's run of the same workload."""
    vllm = tmp_path / "vllm.json"
    vllm.write_text(json.dumps(_vllm_result()))
    surge = _serve_result(tmp_path / "surge.json", output_throughput=110.0, model_id="m")
    assert list(load_points(vllm)) == [(4, 32, 256)]
    assert bench_main(["bench", "compare", str(vllm), str(surge)]) == 0
    cap = capsys.readouterr()
    assert "+10.0%" in cap.out and "warning" not in cap.err, cap
    assert cap.err == (
        f"surge: note: {vllm}: a vLLM result (it records no input_len/output_len): read as C4/I32/O256, "
        "the lengths of its requests (their mean per request where the file has no per-request lists)\n"
    )
    # --save-detailed: the successful requests' lengths (a failed one's 0 output tokens left out)
    detailed = _vllm_result(
        num_prompts=5,
        failed=1,
        input_lens=[32, 32, 32, 32, 40],
        output_lens=[256, 256, 256, 256, 0],
        errors=["", "", "", "", "timeout"],
    )
    vllm.write_text(json.dumps(detailed))
    assert list(load_points(vllm)) == [(4, 32, 256)]
    # ShareGPT-like prompts of many lengths: the dataset's own, as a Surge sharegpt result
    vllm.write_text(json.dumps({**detailed, "input_lens": [30, 32, 35, 32, 40]}))
    assert list(load_points(vllm)) == [(4, 0, 256)]
    # nothing completed: no lengths to read, the point is the dataset's own
    vllm.write_text(
        json.dumps(_vllm_result(completed=0, failed=4, total_input_tokens=0, total_output_tokens=0))
    )
    assert list(load_points(vllm)) == [(4, 0, 0)]
