"""A `vllm serve ...` launch line run as `surge serve ...`: each vLLM 0.26 flag is taken where
Surge does what it asks, else refused with one line naming it (never ignored, never a traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STORIES = REPO / "surge" / "assets" / "stories260K"


def _serve_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of ``surge serve ARGV`` on CPU (exit code 2), refused before serving."""
    from surge.cli import main

    assert main(["serve", str(STORIES), "--device", "cpu", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("surge: error: ") and err.count("\n") == 1, err
    return err


def test_data_parallel_size_local_is_taken_when_it_equals_dp(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's `--data-parallel-size-local` (`-dpl`) was refused even at `-dp`'s value, what a
    one-host vLLM line spells out; it is taken then, and another value is one line naming both."""
    from surge.cli import build_parser
    from surge.parallel.cli_args import parallel_kwargs

    for argv in (["-dp", "2", "-dpl", "2"], ["-dp", "2", "--data-parallel-size-local", "2"], ["-dpl", "1"]):
        args = build_parser().parse_args(["serve", *argv])
        assert parallel_kwargs(args)["data_parallel_size"] == args.data_parallel_size
    err = _serve_error(["-dp", "2", "-dpl", "1"], capsys)
    assert "--data-parallel-size-local 1 with -dp 2: Surge runs every replica on this host" in err, err


def test_distributed_timeout_seconds_reaches_init_process_group(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's `--distributed-timeout-seconds N` was a bare "unrecognized arguments"; Surge's
    tensor-parallel ranks join with `torch.distributed.init_process_group`, which now waits N
    seconds (600 without the flag, as before), and a value that is no positive integer is one line."""
    import torch.distributed as dist

    from surge.cli import build_parser
    from surge.engine.llm_engine import build_engine_config
    from surge.parallel import worker
    from surge.parallel.cli_args import parallel_kwargs

    seen: list[float] = []

    class Joined(Exception):
        pass

    def fake_init_process_group(**kwargs: object) -> None:
        seen.append(kwargs["timeout"].total_seconds())  # type: ignore[attr-defined]
        raise Joined

    monkeypatch.setattr(dist, "init_process_group", fake_init_process_group)
    spec = worker.WorkerSpec(
        rank=0,
        world_size=2,
        local_device="cpu",
        dist_init_method="tcp://127.0.0.1:1",
        step_address="",
        result_address="",
        parent_pid=None,
        log_level=20,
    )
    for argv, expected in ((["--distributed-timeout-seconds", "1800"], 1800.0), ([], 600.0)):
        args = build_parser().parse_args(["serve", "-tp", "2", *argv])
        config = build_engine_config(str(STORIES), device="cpu", **parallel_kwargs(args))
        with pytest.raises(Joined):
            worker._start(config, spec)
        assert seen.pop() == expected
    for bad in ("0", "1.5", "x"):
        with pytest.raises(SystemExit, match="2"):
            build_parser().parse_args(["serve", "--distributed-timeout-seconds", bad])
        err = capsys.readouterr().err
        assert (
            err.startswith("surge: error: argument --distributed-timeout-seconds: ") and err.count("\n") == 1
        )


def test_device_ids_place_the_ranks_or_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.26's `--device-ids 2,3` (the GPUs to run on) was a bare "unrecognized arguments":
    consecutive indices now start the ranks at the first one (vLLM's logical GPU i is ids[i]), and
    what Surge cannot place (UUIDs, gaps, too few GPUs, CPU) is one line naming the flag."""
    from surge.cli import build_parser
    from surge.parallel.cli_args import serve_device

    def device(*argv: str) -> str:
        return serve_device(build_parser().parse_args(["serve", *argv]))

    assert device() == "auto"
    assert device("--device-ids", "2") == "cuda:2"
    assert device("-tp", "2", "-dp", "2", "--device-ids", "4,5,6,7") == "cuda:4"
    assert device("--device", "cuda", "--device_ids=0,1", "-tp", "2") == "cuda:0"
    for argv, needle in (
        (
            ["--device-ids", "2,5"],
            "--device-ids 2,5: Surge runs its ranks on consecutive GPUs; set CUDA_VISIBLE_DEVICES=2,5",
        ),
        (["--device-ids", "GPU-8f1e,GPU-77aa"], "Surge takes GPU indices, not UUIDs"),
        (["--device-ids", "2,2"], "a GPU is named twice"),
        (["-tp", "2", "--device-ids", "3"], "--device-ids 3: names 1 GPU(s), but -tp 2 -dp 1 run 2 rank(s)"),
        (["--device-ids", "0"], "--device-ids 0: not with --device cpu"),
    ):
        assert needle in _serve_error(argv, capsys)


@pytest.mark.parametrize(
    ("flag", "value", "hint"),
    [
        ("--numa-bind", None, "Surge binds no process to NUMA nodes; run it under numactl"),
        ("--numa-bind-nodes", "0", "Surge binds no process to NUMA nodes"),
        ("--numa-bind-cpus", "0-7", "Surge binds no process to NUMA nodes"),
        ("--cpu-distributed-timeout-seconds", "60", "use --distributed-timeout-seconds N"),
    ],
)
def test_vllm_numa_and_cpu_group_flags_are_refused_with_a_hint(
    flag: str, value: str | None, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.26's NUMA-binding flags and `--cpu-distributed-timeout-seconds` were bare
    "unrecognized arguments" (or "did you mean --distributed-timeout-seconds?")."""
    from surge.cli import build_parser

    with pytest.raises(SystemExit, match="2"):
        build_parser().parse_args(["serve", flag, *([value] if value else []), str(STORIES)])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unrecognized arguments: {flag} (vLLM's {flag}: " in err, err
    assert hint in err and "did you mean" not in err, err


def test_a_config_file_key_that_is_no_flag_names_the_file_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `--config FILE.yaml` key that names no flag was reported as "unrecognized arguments:
    --max-model-length", as if typed on the command line, without the file; the one line now names
    the file and each such key (with vLLM's hint or the closest flag)."""
    from surge.cli import build_parser

    config = tmp_path / "serve.yaml"
    for text, tail in (
        (
            "port: 8001\nmax_model_length: 256\n",
            "a key that is not a flag of surge serve: max_model_length (did you mean --max-model-len?)",
        ),
        (
            "swap-space: 4\nbogus: 1\nport: 8001\n",
            "keys that are not flags of surge serve: swap-space, bogus "
            "(vLLM's --swap-space: use nothing: preempted requests are recomputed, not swapped)",
        ),
    ):
        config.write_text(text)
        with pytest.raises(SystemExit, match="2"):
            build_parser().parse_args(["serve", "--config", str(config), str(STORIES)])
        err = capsys.readouterr().err
        assert err == f"surge: error: --config {config}: {tail}\n", err


def test_vllm_optimization_level_minus_o(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's `-O3` / `--optimization-level N` was a bare "unrecognized arguments" (-O3) or a hint
    that Surge runs no torch.compile; -O0 (vLLM: no compilation, no CUDA graphs) now runs
    without CUDA graphs as --enforce-eager does, -O1 to -O3 keep Surge's graphs, another level
    is one line naming the flag."""
    from surge.cli import build_parser
    from surge.engine.cli_args import enforce_eager

    def eager(*argv: str) -> bool:
        return enforce_eager(build_parser().parse_args(list(argv)))

    for argv in (["-O0"], ["-O", "0"], ["-O=0"], ["--optimization-level", "0"], ["--optimization_level=0"]):
        assert eager("serve", *argv) and eager("generate", "--prompt", "x", *argv), argv
    for argv in (["-O3"], ["-O", "1"], ["--optimization-level", "2"], []):
        assert not eager("serve", *argv), argv
    assert eager("serve", "-O3", "--enforce-eager")
    for bad in ("-O4", "-Odecode"):
        with pytest.raises(SystemExit, match="2"):
            build_parser().parse_args(["serve", bad])
        err = capsys.readouterr().err
        assert err.startswith("surge: error: argument -O/--optimization-level: ") and err.count("\n") == 1, (
            err
        )


def test_serve_help_groups_its_flags_as_vllm_does(capsys: pytest.CaptureFixture[str]) -> None:
    """`surge serve --help` listed some 90 flags under one "options:" heading; they are grouped
    now, after vLLM's groups (ModelConfig, CacheConfig, ParallelConfig, ...), every flag but
    --help in one group, and the flags parse as before."""
    import argparse

    from surge.cli import build_parser, main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    titles = (
        "model (vLLM's ModelConfig):",
        "cache (vLLM's CacheConfig):",
        "scheduler (vLLM's SchedulerConfig):",
        "parallel (vLLM's ParallelConfig):",
        "server: address, TLS, CORS and processes (vLLM's Frontend):",
        "logging and metrics (vLLM's ObservabilityConfig):",
    )
    assert all(f"\n{t}\n" in out for t in titles), out
    at = {t: out.index(t) for t in titles}
    listed = {flag: out.index(f"\n  {flag}") for flag in ("--kv-cache-dtype", "--max-num-seqs", "-dpl")}
    assert (
        at[titles[1]] < listed["--kv-cache-dtype"] < at[titles[2]] < listed["--max-num-seqs"] < at[titles[3]]
    )
    assert at[titles[3]] < listed["-dpl"] < at[titles[4]]
    serve = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "serve"
    ]
    ungrouped = [a.option_strings for a in serve._optionals._group_actions]
    assert ungrouped == [["-h", "--help"]], ungrouped
    args = serve.parse_args(["m", "--max-num-seqs", "8", "-tp", "2", "--no-enable-prefix-caching"])
    assert (args.model_tag, args.max_num_seqs, args.tensor_parallel_size, args.enable_prefix_caching) == (
        "m",
        8,
        2,
        False,
    )
