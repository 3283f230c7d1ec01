"""The `surge` command line: every user mistake is one line with exit code 2, found before torch
is imported; bare `surge` prints the help; every --help shows the defaults."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
STORIES = REPO / "surge" / "assets" / "stories260K"

PROBE = (
    "import sys; from surge.cli import main; rc = main(sys.argv[1:]); "
    "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(rc)"
)


def _surge(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``surge ARGS`` in a fresh interpreter that reports whether torch got imported."""
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _one_line_error(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.startswith("surge: error: ") and p.stderr.count("\n") == 1, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr
    assert "NO-TORCH" in p.stdout, "the model folder must be checked before torch is imported"


def _hinted_in_one_line(p: subprocess.CompletedProcess[str], *hints: str) -> None:
    """Refused flags: exit 2, one line on stderr holding each of ``hints``."""
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    for hint in hints:
        assert hint in p.stderr, p.stderr


@pytest.mark.parametrize("command", [["serve"], ["generate", "--prompt", "x"]])
def test_bad_model_folders(command: list[str], tmp_path: Path) -> None:
    _one_line_error(_surge(*command, "--model", str(tmp_path / "nope")), "--model", "no such folder")
    _one_line_error(_surge(*command, "--model", ""), "--model is empty")
    _one_line_error(_surge(*command, "--model", "Qwen/Qwen3-8B"), "local folders only", "--model DIR")
    f = tmp_path / "file"
    f.write_text("x")
    _one_line_error(_surge(*command, "--model", str(f)), "not a folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(_surge(*command, "--model", str(empty)), "no config.json")
    # `huggingface-cli download ORG/NAME` without --local-dir: the cache folder names its snapshot
    hub = tmp_path / "models--Qwen--Qwen3-8B"
    for rev in ("1111", "2222"):
        (hub / "snapshots" / rev).mkdir(parents=True)
        shutil.copy(STORIES / "config.json", hub / "snapshots" / rev)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("2222")
    _one_line_error(
        _surge(*command, "--model", str(hub)),
        "hub cache folder",
        f"pass --model {hub / 'snapshots' / '2222'}",
    )
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    shutil.copy(STORIES / "config.json", no_tok)
    shutil.copy(STORIES / "model.safetensors", no_tok)
    _one_line_error(_surge(*command, "--model", str(no_tok)), "has no tokenizer")
    # tokenizer_config.json alone is no tokenizer: transformers built a 26-token one from it that
    # encoded every prompt to nothing, and the server started
    shutil.copy(STORIES / "tokenizer_config.json", no_tok)
    _one_line_error(_surge(*command, "--model", str(no_tok)), "has no tokenizer")
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(STORIES / name, no_weights)
    _one_line_error(_surge(*command, "--model", str(no_weights)), "--load-format dummy")
    # Meta's .pth (or GGUF) weights: said so, not "pass --load-format dummy" (random weights)
    (no_weights / "consolidated.00.pth").write_bytes(b"x")
    p = _surge(*command, "--model", str(no_weights))
    _one_line_error(p, "consolidated.00.pth but no *.safetensors or PyTorch *.bin", "pytorch_model*.bin")
    assert "dummy" not in p.stderr, p.stderr
    # a PyTorch .bin is loaded (vLLM's --load-format auto), so a broken one is named as unreadable
    (no_weights / "pytorch_model.bin").write_bytes(b"x")
    _one_line_error(
        _surge(*command, "--model", str(no_weights)), "the weights file pytorch_model.bin cannot be read"
    )
    only = _surge(*command, "--model", str(no_weights), "--load-format", "safetensors")
    _one_line_error(
        only, "PyTorch *.bin weights but no *.safetensors, which --load-format safetensors reads alone"
    )
    gguf = tmp_path / "model-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    _one_line_error(
        _surge(*command, "--model", str(gguf)), "a .gguf weights file, not a folder", "pytorch_model*.bin"
    )


def _copy_of_stories(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(STORIES, folder)
    return folder


def test_a_folder_without_read_permission_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model folder the user may not enter (``chmod 000``, another user's home) was a
    PermissionError traceback from ``Path.is_file``; it is one line naming the folder, for
    `surge serve` and ``LLM(model)`` alike. As root (whom modes do not stop) ``os.stat`` of the
    folder's files is made to fail as it does for another user."""
    from surge.cli import CliError, check_model_dir

    locked = _copy_of_stories(tmp_path, "locked")
    locked.chmod(0)
    try:
        if os.access(locked / "config.json", os.R_OK):  # root: make stat fail as for a plain user
            real_stat = os.stat

            def denied(path: object, *args: object, **kwargs: object) -> os.stat_result:
                if str(path).startswith(f"{locked}{os.sep}"):
                    raise PermissionError(13, "Permission denied", str(path))
                return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

            monkeypatch.setattr(os, "stat", denied)
        for flag, offline in (("--model", False), ("model", True)):
            with pytest.raises(CliError) as e:
                check_model_dir(str(locked), flag=flag, offline_api=offline)
            assert str(e.value).startswith(f"{flag} {locked}: cannot read ") and "Permission denied" in str(
                e.value
            ), e.value
            assert "\n" not in str(e.value)
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize("command", [["serve"], ["generate", "--prompt", "x"]])
def test_unreadable_weights_files(command: list[str], tmp_path: Path) -> None:
    """A truncated or corrupt weights file: one line naming it, exit 2, before torch (and so
    before any engine process) starts."""
    cut = _copy_of_stories(tmp_path, "cut")
    with (cut / "model.safetensors").open("r+b") as f:
        f.truncate(100)  # inside the header
    _one_line_error(
        _surge(*command, "--model", str(cut)), str(cut), "model.safetensors", "invalid header length"
    )
    cut_data = _copy_of_stories(tmp_path, "cut_data")
    size = (cut_data / "model.safetensors").stat().st_size
    with (cut_data / "model.safetensors").open("r+b") as f:
        f.truncate(size - 1000)  # inside the last tensor's data
    _one_line_error(_surge(*command, "--model", str(cut_data)), "model.safetensors", "(truncated)")
    garbage = _copy_of_stories(tmp_path, "garbage")
    (garbage / "model.safetensors").write_bytes(b"<html>not found</html>")
    _one_line_error(_surge(*command, "--model", str(garbage)), "model.safetensors", "invalid header length")
    # a sharded folder: the index's shards are checked, and a missing shard is named
    sharded = _copy_of_stories(tmp_path, "sharded")
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    _one_line_error(_surge(*command, "--model", str(sharded)), "names missing files", "00002-of-00002")
    (sharded / "model-00002-of-00002.safetensors").write_bytes(b"\x00" * 8)  # header length 0: not JSON
    _one_line_error(_surge(*command, "--model", str(sharded)), "model-00002-of-00002.safetensors", "not JSON")


def test_weights_header_check_accepts_good_files_and_reads_headers_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundled model passes, and so does a 40 GB (sparse) file, of which only the 8-byte
    length and the header are read (counted through ``Path.open``, not timed)."""
    import struct

    from surge.cli import check_model_dir
    from surge.model.weight_files import check_safetensors_header

    check_model_dir(str(STORIES))
    header = json.dumps({"w": {"dtype": "BF16", "shape": [5, 1 << 32], "data_offsets": [0, 5 << 33]}})
    big = tmp_path / "big.safetensors"
    with big.open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + (5 << 33))
    read: list[int] = []
    real_open = Path.open

    class Counting:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def read(self, n: int = -1) -> bytes:
            data = self.f.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(Path, "open", lambda self, *a, **k: Counting(real_open(self, *a, **k)))
    check_safetensors_header(big)
    monkeypatch.undo()
    assert sum(read) == 8 + len(header), read
    with big.open("r+b") as f:
        f.truncate(8 + len(header) + (5 << 33) - 1)
    with pytest.raises(ValueError, match="42,949,672,960 bytes of tensor data but the file holds"):
        check_safetensors_header(big)


def test_a_shifted_tensor_is_named_with_its_neighbour(tmp_path: Path) -> None:
    """A tensor whose data offsets are shifted leaves a gap before it and an overlap after it;
    the message names both tensors around the first break (it named only the second, which may
    be the intact one)."""
    import struct

    from surge.model.weight_files import check_safetensors_header

    def write(offsets: dict[str, list[int]]) -> Path:
        header = json.dumps({k: {"dtype": "U8", "shape": [4], "data_offsets": v} for k, v in offsets.items()})
        path = tmp_path / "w.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 8)
        return path

    check_safetensors_header(write({"a": [0, 4], "b": [4, 8]}))
    with pytest.raises(
        ValueError,
        match=r"tensor 'b': invalid data offsets \[6, 10\] in the header \(its data "
        r"should begin at 4, where tensor 'a' ends\)",
    ):
        check_safetensors_header(write({"a": [0, 4], "b": [6, 10]}))
    with pytest.raises(ValueError, match=r"tensor 'a': invalid data offsets \[2, 6\] .*should begin at 0\)"):
        check_safetensors_header(write({"a": [2, 6], "b": [6, 10]}))


def test_a_closed_stdout_pipe_is_not_a_traceback() -> None:
    """`surge bench roofline ... | head -1`: the reader is gone before the table is written."""
    p = subprocess.Popen(
        [sys.executable, "-m", "surge.cli", "bench", "roofline", "--model", str(STORIES), "--gpu", "h200"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert p.returncode == 141 and b"Traceback" not in err and b"BrokenPipe" not in err, err


def test_bare_surge_prints_help() -> None:
    p = _surge()
    assert p.returncode == 0 and "usage: surge" in p.stdout and "serve" in p.stdout


def test_a_missing_sub_command_is_named_by_its_choices() -> None:
    p = _surge("--bogus")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "required: {generate,serve,bench}" in p.stderr, p.stderr


def test_vllm_bench_flags_are_aliases_or_hinted() -> None:
    from surge.cli import build_parser

    args = build_parser().parse_args(
        [
            "bench",
            "serve",
            "--dataset-name",
            "random",
            "--random-input-len",
            "12",
            "--random-output-len",
            "7",
            "--metric-percentiles",
            "50,99",
        ]
    )
    # vLLM's --random-input-len/--random-output-len are the random dataset's own (cmd_serve: as
    # --input-len/--output-len there, refused with another dataset)
    assert (args.dataset, args.random_input_len, args.random_output_len, args.percentiles) == (
        "random",
        12,
        7,
        "50,99",
    )
    p = _surge("bench", "matrix", "--save-result", "--result-dir=/tmp")
    _hinted_in_one_line(
        p,
        "--save-result: use --output-dir DIR in bench matrix",
        "--result-dir: use --output-dir DIR in bench matrix (bench serve takes it with --save-result)",
    )
    p = _surge("bench", "matrix", "--ready-check-timeout-sec", "60", "--append-result")
    _hinted_in_one_line(
        p,
        "--ready-check-timeout-sec: use --launch CMD with --server-timeout SECONDS in bench matrix",
        "--append-result: use --output-dir DIR in bench matrix",
    )
    p = _surge("bench", "serve", "--bogus-flag")
    assert p.returncode == 2 and "vLLM" not in p.stderr, p.stderr  # no hint for a flag vLLM lacks too


def test_vllm_serve_only_bench_flags_keep_their_hint_in_bench_matrix() -> None:
    """vLLM's --num-warmups, --disable-shuffle and --no-oversample are `bench serve` flags now;
    `bench matrix`, which has none of them, lost their hints with that change and answered a bare
    "unrecognized arguments"."""
    p = _surge("bench", "matrix", "--num-warmups", "2", "--disable-shuffle", "--no-oversample")
    _hinted_in_one_line(
        p,
        "--num-warmups: use --warmup N in bench matrix",
        "--disable-shuffle: use nothing: bench matrix sends random prompts",
        "--no-oversample: use nothing: bench matrix sends random prompts",
        "bench serve takes it with",
    )
    # bench serve has the flags: no hint there, the flag is parsed (a bad value is argparse's line)
    p = _surge("bench", "serve", "--num-warmups", "x")
    assert p.returncode == 2 and "vLLM's" not in p.stderr and "--num-warmups" in p.stderr, p.stderr


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from surge.cli import build_parser

    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{name} {sub_name}", sub)

    walk("surge", build_parser())
    return out


def test_every_help_shows_defaults() -> None:
    parsers = _parsers()
    assert {"surge serve", "surge generate", "surge bench matrix", "surge bench roofline"} <= {
        n for n, _ in parsers
    }
    for name, parser in parsers:
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or action.default is argparse.SUPPRESS:
                continue
            text = formatter._get_help_string(action) or ""  # type: ignore[attr-defined]
            if action.required:  # no default to show: say it is required, never "(default: none)"
                assert text.endswith("(required)") and "default" not in text, f"{name}: {text!r}"
            else:
                assert "default" in text.lower(), f"{name} {action.option_strings[0]}: {text!r}"


def test_roofline_help_names_the_hardware_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from surge.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "roofline", "--help"])
    out = capsys.readouterr().out
    assert "--gpu" in out and "--hbm-bandwidth" in out and "--peak-flops" in out
    assert "required: --gpu, or both --hbm-bandwidth and --peak-flops" in out
    assert "model folder or config.json (required)" in out and "config.json (default: none)" not in out


def test_generate_help_says_when_it_samples(capsys: pytest.CaptureFixture[str]) -> None:
    """`surge generate` samples with the model's generation_config.json defaults (Qwen3's
    temperature 0.6): its description must not promise greedy output for every model."""
    from surge.cli import main

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "greedy by default" not in out
    assert "greedy unless --temperature or the model's generation_config.json" in out


@pytest.mark.parametrize("api_servers", ["1", "2"])
def test_serve_refused_model_is_one_line_and_exit_2(tmp_path: Path, api_servers: str) -> None:
    """A folder that passes the up-front checks but that the engine refuses while building (a
    tensor missing from the checkpoint): ``surge serve`` logs the reason on one line, no
    traceback, and exits 2 (a user error), not 1 (a crash); also with several API processes,
    whose supervisor reads the engine process's exit code."""
    from safetensors.torch import load_file, save_file

    folder = _copy_of_stories(tmp_path, "missing_tensor")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.embed_tokens.weight"]
    save_file(tensors, folder / "model.safetensors")
    cmd = [
        "serve",
        "--model",
        str(folder),
        "--device",
        "cpu",
        "--port",
        "0",
        "--api-server-count",
        api_servers,
    ]
    p = subprocess.run(
        [sys.executable, "-m", "surge.cli", *cmd],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr
    # once, as the CLI's line (several API processes each logged it, with the supervisor's line)
    errors = [line for line in p.stderr.splitlines() if " ERROR " in line or "error:" in line]
    assert errors == ["surge: error: model: the checkpoint lacks weights for model.embed_tokens.weight"], (
        p.stderr
    )


def test_generate_with_an_undecodable_prompt_is_one_line() -> None:
    """A prompt argument that is not UTF-8 reaches Python as lone surrogates: refused in one line."""
    p = subprocess.run(
        [sys.executable, "-c", PROBE, "generate", "--prompt", os.fsdecode(b"\xff\xfe"), "--max-tokens", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and p.stderr.startswith("surge: error:"), p.stderr
    assert "lone surrogate" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_vllm_serve_spellings() -> None:
    """`surge serve MODEL` as `vllm serve MODEL`; --enable-auto-tool-choice needs a parser (as in
    vLLM) instead of being an unknown flag; vLLM flags Surge does without (--trust-remote-code:
    it runs no model folder's code) are refused with a hint, never taken and ignored."""
    _one_line_error(_surge("serve", "/nonexistent/model"), "MODEL /nonexistent/model: no such folder")
    _one_line_error(_surge("serve", "/a", "--model", "/b"), "two models given: '/a' and --model '/b'")
    _one_line_error(
        _surge("serve", "--enable-auto-tool-choice"), "--enable-auto-tool-choice needs --tool-call-parser"
    )
    from surge.cli import build_parser

    args = build_parser().parse_args(
        ["serve", "/m", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    )
    assert (args.model_tag, args.enable_auto_tool_choice, args.tool_call_parser) == ("/m", True, "hermes")
    p = _surge("serve", "--trust-remote-code", "--swap-space", "4", "--enable-chunked-prefill")
    _hinted_in_one_line(
        p,
        "--trust-remote-code: use nothing",
        "--swap-space: use nothing",
        "--enable-chunked-prefill: use nothing",
    )


def test_vllm_underscore_flag_spellings() -> None:
    """Flags spelled with underscores are the dashed flags, as vLLM's FlexibleArgumentParser takes
    them (``--max_model_len 256``, ``--max_model_len=256``), on every sub-command; only a flag's
    name is rewritten, never a value (``my_model``, ``--prompt=--foo_bar``, a JSON value's keys)."""
    from surge.cli import build_parser, dashed_flag_names

    parser = build_parser()
    args = parser.parse_args(
        [
            "serve",
            "--max_model_len",
            "256",
            "--served_model_name",
            "my_model",
            "--hf_overrides",
            '{"rms_norm_eps": 1e-6}',
        ]
    )
    assert (args.max_model_len, args.served_model_name, args.hf_overrides) == (
        256,
        ["my_model"],
        {"rms_norm_eps": 1e-6},
    )
    args = parser.parse_args(["serve", "--max_model_len=256", "--served-model-name=my_model"])
    assert (args.max_model_len, args.served_model_name) == (256, ["my_model"])
    args = parser.parse_args(["generate", "--prompt=--foo_bar", "--max_tokens", "3", "--top_k=2"])
    assert (args.prompt, args.max_tokens, args.top_k) == ("--foo_bar", 3, 2)
    assert parser.parse_args(["bench", "serve", "--num_prompts", "3"]).num_prompts == 3
    assert parser.parse_args(["bench", "matrix", "--output_dir=o_d"]).output_dir == "o_d"
    # after a bare -- the arguments are positionals, kept as given
    assert dashed_flag_names(["--a_b=c_d", "x_y", "--", "--e_f"]) == ["--a-b=c_d", "x_y", "--", "--e_f"]
    # the hints and the closest-flag guess name the dashed spelling
    p = _surge("serve", "--enable_chunked_prefill")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "--enable-chunked-prefill: use nothing" in p.stderr, p.stderr
    p = _surge("serve", "--max_model_length", "8")
    assert p.returncode == 2 and "did you mean --max-model-len?" in p.stderr, p.stderr


def test_vllm_chunked_prefill_task_and_speculative_flags_are_hinted() -> None:
    """vLLM's --no-enable-chunked-prefill, --long-prefill-token-threshold, --task and
    --num-speculative-tokens are refused in one line that says what Surge does instead."""
    for command in (["serve"], ["generate", "--prompt", "x"]):
        p = _surge(
            *command,
            "--no-enable-chunked-prefill",
            "--long-prefill-token-threshold=64",
            "--task",
            "generate",
            "--num-speculative-tokens",
            "3",
        )
        _hinted_in_one_line(
            p,
            "--no-enable-chunked-prefill: use nothing: chunked prefill is always on",
            "--long-prefill-token-threshold: use --max-num-batched-tokens",
            "--task: use nothing: Surge runs text generation only",
            "--num-speculative-tokens: use nothing: Surge has no speculative decoding",
        )


def test_vllm_dtype_spellings() -> None:
    """vLLM's ``--dtype half`` and ``--dtype float`` (and ``LLM(dtype="half")``) are float16 and
    float32, on `surge serve` and `surge generate`; another spelling is refused naming the choices."""
    from surge.cli import build_parser
    from surge.engine.llm_engine import build_engine_config

    parser = build_parser()
    for command in (["serve"], ["generate", "--prompt", "x"]):
        for given, resolved in (("half", "float16"), ("float", "float32"), ("bfloat16", "bfloat16")):
            args = parser.parse_args([*command, "--dtype", given])
            config = build_engine_config(str(STORIES), dtype=args.dtype, device="cpu", num_kv_blocks=8)
            assert config.model.dtype == resolved
    with pytest.raises(
        ValueError, match=r"dtype must be one of auto, float32, bfloat16, float16, half, float"
    ):
        build_engine_config(str(STORIES), dtype="fp16", device="cpu")
    p = _surge("serve", "--dtype", "fp16")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "'half'" in p.stderr, p.stderr


def test_vllm_prefix_caching_switch_and_logging_hints() -> None:
    """``--enable-prefix-caching`` is vLLM's switch (on by default, as there), with its
    ``--no-enable-prefix-caching``; vLLM's logging and logprobs flags Surge does without name
    what to use instead."""
    from surge.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve"]).enable_prefix_caching is True
    assert parser.parse_args(["serve", "--enable-prefix-caching"]).enable_prefix_caching is True
    assert parser.parse_args(["serve", "--no-enable-prefix-caching"]).enable_prefix_caching is False
    p = _surge("serve", "--max-logprobs=5", "--log-config-file", "f.json")
    _hinted_in_one_line(p, "--max-logprobs: use nothing", "--log-config-file: use --log-level LEVEL")


def test_python_dash_m_surge_is_the_surge_command() -> None:
    """``python -m surge`` failed with "'surge' is a package and cannot be directly executed"."""
    p = subprocess.run(
        [sys.executable, "-m", "surge", "serve", "--dtype", "fp16"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stderr.startswith("surge: error: argument --dtype"), p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "surge", "--version"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0 and p.stdout.startswith("surge "), p.stdout


def test_vllm_human_readable_token_counts() -> None:
    """`vllm serve ... --max-model-len 32k` (decimal k/m/g, binary K/M/G) was refused as an invalid
    int; so was ``--max-num-batched-tokens 16K``."""
    from surge.cli import build_parser
    from surge.engine.cli_args import token_count

    cases = {
        "4096": 4096,
        "32k": 32_000,
        "25.6k": 25_600,
        "1.001k": 1_001,
        "32K": 32_768,
        "1M": 2**20,
        "2m": 2 * 10**6,
    }
    for text, value in cases.items():
        assert token_count(text) == value, text
    for bad in ("1.5K", "32kb", "auto", "", "k"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a token count"):
            token_count(bad)
    args = build_parser().parse_args(["serve", "--max-model-len", "32k", "--max-num-batched-tokens", "16K"])
    assert (args.max_model_len, args.max_num_batched_tokens) == (32_000, 16_384)
    p = _surge("serve", "--max-model-len", "32kb")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("surge: error: argument --max-model-len: '32kb' is not a token count"), (
        p.stderr
    )


def test_hf_overrides_is_a_json_object_and_reaches_the_config() -> None:
    """vLLM's ``--hf-overrides JSON`` (how Qwen3's YaRN long context is turned on) is parsed by
    `surge serve` and `surge generate`; text that is not a JSON object is one line, exit 2, and so
    is a rope setting Surge does not compute."""
    from surge.cli import build_parser

    yarn = '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}'
    for command in (["serve"], ["generate", "--prompt", "x"]):
        args = build_parser().parse_args([*command, "--hf-overrides", yarn])
        assert args.hf_overrides == json.loads(yarn)
    dynamic = '{"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}'
    for args, words in (
        (["serve", "--hf-overrides", "[1]"], "argument --hf-overrides: must be a JSON object, got list"),
        (["generate", "--prompt", "x", "--hf-overrides", "{bad"], "argument --hf-overrides: not JSON"),
        (
            ["serve", "--device", "cpu", "--port", "1", "--hf-overrides", dynamic],
            "config.json with hf_overrides: rope_type 'dynamic' is not supported",
        ),
    ):
        p = _surge(*args)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith("surge: error: ") and words in p.stderr, p.stderr


@pytest.mark.parametrize(
    "command", [["generate", "--prompt", "x"], ["serve", "--device", "cpu", "--port", "0"]]
)
def test_a_bad_field_from_hf_overrides_is_named(command: list[str]) -> None:
    """A field ``--hf-overrides`` sets to a bad value is named, with the overrides as its
    source: ``rms_norm_eps`` "x" said only "could not convert string to float: 'x'" (from the
    model's build), and a bad integer field blamed the config.json alone."""
    for overrides, words in (
        (
            '{"rms_norm_eps": "x"}',
            "config.json with hf_overrides: rms_norm_eps must be a positive number, got 'x'",
        ),
        (
            '{"vocab_size": "x"}',
            "config.json with hf_overrides: vocab_size must be a positive integer, got 'x'",
        ),
    ):
        p = _surge(*command, "--hf-overrides", overrides)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith("surge: error: model: ") and words in p.stderr, p.stderr


def test_a_context_past_int32_from_hf_overrides_is_one_line() -> None:
    """A rotary scaling (or ``max_position_embeddings``) given with ``--hf-overrides`` whose
    context is past 2**31 - 1 tokens, or not finite, is one line, exit 2: it was an
    ``OverflowError`` traceback while the rotary cache was built (or an allocation of the whole
    context's table)."""
    huge = '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1e30}}'
    infinite = '{"rope_scaling": {"rope_type": "linear", "factor": 1e308}, "max_position_embeddings": 100000}'
    for overrides, words in (
        (huge, "exceeds 2,147,483,647, the longest Surge runs (int32 positions): set max_model_len"),
        (infinite, "max_position_embeddings x factor is not a finite number of tokens"),
    ):
        p = _surge("generate", "--prompt", "x", "--device", "cpu", "--hf-overrides", overrides)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith("surge: error: ") and words in p.stderr, p.stderr


@pytest.mark.parametrize(
    "command", [["generate", "--prompt", "x"], ["serve", "--device", "cpu", "--port", "0"]]
)
def test_a_token_budget_below_max_num_seqs_is_one_line(command: list[str]) -> None:
    """``--max-num-batched-tokens`` below ``--max-num-seqs`` is refused at start-up in vLLM's
    words, one line, exit 2 (it was taken, and the budget then capped the running requests)."""
    p = _surge(*command, "--device", "cpu", "--max-num-seqs", "32", "--max-num-batched-tokens", "16")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    words = "max_num_batched_tokens (16) must be greater than or equal to max_num_seqs (32)."
    assert p.stderr == f"surge: error: {words}\n", p.stderr


def test_max_num_seqs_left_out_follows_a_smaller_budget() -> None:
    """``--max-num-seqs`` left out is None (256, or a lower ``--max-num-batched-tokens``, derived
    by the engine config), so ``--max-num-batched-tokens 16`` alone is taken, as by vLLM."""
    from surge.cli import build_parser

    for command in (["serve"], ["generate", "--prompt", "x"]):
        args = build_parser().parse_args([*command, "--max-num-batched-tokens", "16"])
        assert args.max_num_seqs is None and args.max_num_batched_tokens == 16
    p = _surge(
        "generate", "--prompt", "x", "--device", "cpu", "--max-num-batched-tokens", "16", "--max-tokens", "2"
    )
    assert p.returncode == 0, p.stderr


def _parse_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line ``surge ARGV`` prints while parsing its flags (exit code 2)."""
    from surge.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("surge: error: ") and err.count("\n") == 1, err
    return err


def test_vllm_serve_flags_surge_lacks_are_hinted(capsys: pytest.CaptureFixture[str]) -> None:
    """`vllm serve` flags such as -pp, --enable-lora and --kv-cache-memory-bytes were bare
    "unrecognized arguments", and serve's --tokenizer-mode got the benchmark's hint (about counting
    tokens); each now names what to use instead, per sub-command."""
    err = _parse_error(
        ["serve", "--enable-lora", "--kv-cache-memory-bytes=1000", "--tokenizer-mode", "auto"],
        capsys,
    )
    for hint in (
        "--enable-lora: use nothing: Surge serves no LoRA adapters",
        "--kv-cache-memory-bytes: use --num-kv-blocks N",
        "--tokenizer-mode: use nothing: Surge loads the model folder's tokenizer",
    ):
        assert hint in err, err
    err = _parse_error(["serve", "--speculative-config", "{}"], capsys)
    assert "--speculative-config: use nothing" in err, err
    err = _parse_error(["serve", "--enable-ssl-refresh"], capsys)
    assert "--enable-ssl-refresh: use nothing: Surge reads --ssl-certfile and --ssl-keyfile once" in err, err
    from surge.cli import build_parser  # bench serve takes vLLM's --tokenizer-mode (auto or hf)

    assert build_parser().parse_args(["bench", "serve", "--tokenizer-mode", "hf"]).tokenizer_mode == "hf"
    # a new user's vLLM command line: these were bare "unrecognized arguments"
    err = _parse_error(
        ["serve", "--enable-log-outputs", "--log-config-file", "/tmp/s"],
        capsys,
    )
    for hint in (
        "--enable-log-outputs: use nothing: Surge logs no prompt or output text",
        "--log-config-file: use --log-level LEVEL: Surge reads no logging config file",
    ):
        assert hint in err, err
    for flag in (
        "--otlp-traces-endpoint",
        "--attention-backend",
        "--disable-sliding-window",
        "--cudagraph-capture-sizes",
        "--max-cudagraph-capture-size",
        "--logprobs-mode",
    ):
        assert f"(vLLM's {flag}: use " in _parse_error(["serve", flag], capsys), flag


def test_a_refused_flags_value_is_not_taken_for_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    """`surge serve --uds /tmp/s MODEL` (then refused) took /tmp/s as the model folder and reported
    "unrecognized arguments: --uds MODEL"; a refused vLLM flag that takes a value is named
    alone, wherever it stands, and neither its value nor the model is blamed."""
    for argv in (
        ["serve", "--log-config-file", "/tmp/s", str(STORIES)],
        ["serve", str(STORIES), "--log-config-file", "/tmp/s"],
        ["serve", "--log-config-file=/tmp/s", str(STORIES)],
    ):
        err = _parse_error(argv, capsys)
        assert (
            "unrecognized arguments: --log-config-file (vLLM's --log-config-file: use --log-level" in err
        ), err
        assert "/tmp/s" not in err.split("(")[0] and str(STORIES) not in err, err
    err = _parse_error(["serve", "--hf-token", "abc", "--max-loras", "2", str(STORIES)], capsys)
    assert (
        "unrecognized arguments: --hf-token --max-loras (vLLM's " in err and "--hf-token: use nothing" in err
    ), err
    assert "abc" not in err and str(STORIES) not in err, err
    err = _parse_error(["generate", "--download-dir", "/d", str(STORIES), "--prompt", "x"], capsys)
    assert "unrecognized arguments: --download-dir (" in err and str(STORIES) not in err, err
    # a prefix of one of the sub-command's own flags stays argparse's abbreviation of it
    from surge.cli import build_parser

    assert build_parser().parse_args(["serve", str(STORIES), "--header", "7"]).header_read_timeout == 7


def test_a_mistyped_flag_names_the_closest_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """A typo was a bare "unrecognized arguments: --max-model-length"; the sub-command's flag of
    the closest spelling is now suggested (none for a flag like no other)."""
    err = _parse_error(["serve", "--max-model-length", "100"], capsys)
    assert err.rstrip().endswith(
        "unrecognized arguments: --max-model-length (did you mean --max-model-len?)"
    ), err
    err = _parse_error(["serve", "--dtpye", "half", "--max-modle-len=9"], capsys)
    assert "(did you mean --dtype for --dtpye, --max-model-len for --max-modle-len?)" in err, err
    err = _parse_error(["generate", "--prompt", "x", "--max-tokns", "3"], capsys)
    assert "(did you mean --max-tokens?)" in err, err
    err = _parse_error(["bench", "serve", "--num-promts", "3"], capsys)
    assert "(did you mean --num-prompts?)" in err, err
    err = _parse_error(["bench", "serve", "--bogus-flag"], capsys)
    assert "did you mean" not in err and "vLLM" not in err, err


def test_vllm_parallel_flags_at_the_values_surge_runs_are_taken(capsys: pytest.CaptureFixture[str]) -> None:
    """`--pipeline-parallel-size 1` and `--distributed-executor-backend mp` (what Surge does; a vLLM
    command line often spells them out) were refused as unrecognized, though `LLM()` takes them;
    both are taken now, and another size or backend is one line naming the flag. vLLM's `-r` is
    `--node-rank`."""
    from surge.cli import build_parser

    for cmd in (["serve"], ["generate", "--prompt", "x"]):
        args = build_parser().parse_args([*cmd, "-pp", "1", "--distributed-executor-backend", "mp"])
        assert args.pipeline_parallel_size == 1 and args.distributed_executor_backend == "mp"
    assert build_parser().parse_args(["serve", "--pipeline-parallel-size=1", "-r", "1"]).node_rank == 1
    err = _parse_error(["serve", "-pp", "2"], capsys)
    assert (
        "argument -pp/--pipeline-parallel-size: Surge has no pipeline parallelism, only 1 is taken (got 2): "
        in err
    )
    assert "shard the model with -tp N" in err, err
    err = _parse_error(["generate", "--prompt", "x", "--distributed-executor-backend", "ray"], capsys)
    assert "argument --distributed-executor-backend: only mp is taken (got 'ray')" in err, err


def test_vllm_multi_node_data_parallel_flags_are_hinted(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's multi-node data-parallel flags were bare "unrecognized arguments" (and
    --data-parallel-size-local only "did you mean --data-parallel-size?"); each now says that
    Surge's replicas run on one host, and --headless names the multi-host workers' flags."""
    err = _parse_error(
        ["serve", "-dp", "2", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345"],
        capsys,
    )
    assert "--data-parallel-address: use nothing: Surge's replicas (-dp N) all run on one host" in err, err
    assert "--data-parallel-rpc-port: use nothing: Surge's replicas" in err, err
    err = _parse_error(["serve", "--headless", "--data-parallel-size-local", "2"], capsys)
    assert "--headless: use --nnodes N --node-rank R (R > 0)" in err, err
    # vLLM's short forms and the flags left out were bare "unrecognized arguments" (and
    # --data-parallel-rank "did you mean --data-parallel-size?", another flag's meaning)
    for flag, use in (
        ("-dpa", "nothing: Surge's replicas (-dp N) all run on one host"),
        ("-dpn", "nothing: Surge's replicas"),
        ("--data-parallel-rank", "nothing: Surge's replicas"),
        ("-dpb", "nothing: Surge starts each -dp replica"),
        ("-dcp", "-tp N (--tensor-parallel-size): Surge has no context parallelism"),
        ("-ep", "nothing: Surge serves dense models"),
    ):
        err = _parse_error(["serve", flag, "1"], capsys)
        assert f"(vLLM's {flag}: use {use}" in err and "did you mean" not in err, err


def test_generate_hints_data_parallelism_at_serve(capsys: pytest.CaptureFixture[str]) -> None:
    """`surge generate --data-parallel-size 2` was asked "did you mean --tensor-parallel-size?" (a
    different parallelism) and `-dp 2` took 2 for the model folder; both point to `surge serve -dp`."""
    for argv in (["-dp", "2"], ["--data-parallel-size", "2"], ["--data-parallel-size=2"]):
        err = _parse_error(["generate", *argv, "--prompt", "x"], capsys)
        flag = argv[0].split("=")[0]
        assert f"unrecognized arguments: {flag} (vLLM's {flag}: use `surge serve -dp N`" in err, err
        assert "did you mean" not in err, err


def test_generate_takes_the_model_as_serve_does(tmp_path: Path) -> None:
    """`surge generate MODEL --prompt P` (as `surge serve MODEL`) was "unrecognized arguments:
    MODEL"; it is the same as --model, and two different models are one line."""
    from surge.cli import build_parser

    args = build_parser().parse_args(["generate", str(STORIES), "--prompt", "x"])
    assert (args.model_tag, args.model) == (str(STORIES), None)
    _one_line_error(_surge("generate", str(tmp_path / "nope"), "--prompt", "x"), "MODEL", "no such folder")
    _one_line_error(
        _surge("generate", "/a", "--model", "/b", "--prompt", "x"), "two models given: '/a' and --model '/b'"
    )


def test_ctrl_c_while_the_sub_commands_load_is_exit_130(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the first half second of `surge serve` (while build_parser imports the
    sub-commands' modules) printed a KeyboardInterrupt traceback; it is exit code 130, as later."""
    import surge.cli

    def interrupted() -> argparse.ArgumentParser:
        raise KeyboardInterrupt

    monkeypatch.setattr(surge.cli, "build_parser", interrupted)
    try:
        code = surge.cli.main(["serve"])
    except KeyboardInterrupt:  # caught here: escaping, it would stop the whole test run
        pytest.fail("Ctrl-C while building the parser escaped main() (a traceback for the user)")
    assert code == 130


def test_vllm_serve_flags_whose_effect_surge_has_are_taken() -> None:
    """``--enable-request-id-headers`` (Surge always sends X-Request-Id) and
    ``--chat-template-content-format`` were refused as unknown, so a vLLM launch script stopped;
    they are taken (all three content formats: tests/test_chat_content_format.py), and a value
    of neither flag's is one line and exit 2, as any bad flag."""
    from surge.cli import build_parser

    args = build_parser().parse_args(
        ["serve", "m", "--enable-request-id-headers", "--chat-template-content-format", "string"]
    )
    assert args.enable_request_id_headers and args.chat_template_content_format == "string"
    assert build_parser().parse_args(["serve", "m"]).chat_template_content_format == "auto"
    args = build_parser().parse_args(["serve", "m", "--chat-template-content-format", "openai"])
    assert args.chat_template_content_format == "openai"
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "m", "--chat-template-content-format", "parts"])
    assert exc.value.code == 2


def test_a_negative_number_in_scientific_notation_is_a_value() -> None:
    """``--hbm-bandwidth -4e12`` is the flag's (refused) value, as ``-4`` is; argparse took it
    for a flag and said only "expected one argument"."""
    for value in ("-4e12", "-1.5E-3", "-4", "-inf", "-Infinity"):
        p = _surge("bench", "roofline", "--model", str(STORIES), "--hbm-bandwidth", value)
        _one_line_error(p, "--hbm-bandwidth must be > 0 and finite, got -")


def test_vllm_short_spellings_quantization_and_nnodes() -> None:
    """vLLM's ``-q`` (``--quantization``) and ``-n`` (``--nnodes``) were "unrecognized arguments"."""
    from surge.cli import build_parser

    args = build_parser().parse_args(["serve", "m", "-q", "fp8", "-n", "2"])
    assert (args.quantization, args.nnodes) == ("fp8", 2)
    assert build_parser().parse_args(["generate", "-q", "fp8", "--prompt", "x"]).quantization == "fp8"


def test_an_unknown_flags_value_is_not_taken_for_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    """`surge serve --log-config-file f.json MODEL` (a vLLM flag without a hint, or any unknown
    flag) took f.json as the model folder and reported "unrecognized arguments: --log-config-file
    MODEL"; the flag is named alone, and a known flag's value that starts with -- is still left to
    argparse's own message."""
    for argv in (
        ["serve", "--bogus-flag", "x.json", str(STORIES)],
        ["serve", "--bogus-flag=x.json", str(STORIES)],
        ["serve", str(STORIES), "--bogus-flag", "x.json"],
    ):
        err = _parse_error(argv, capsys)
        assert err.rstrip().endswith("unrecognized arguments: --bogus-flag"), err
    err = _parse_error(["serve", "--max-model-length", "100", str(STORIES)], capsys)
    assert err.rstrip().endswith(
        "unrecognized arguments: --max-model-length (did you mean --max-model-len?)"
    ), err
    err = _parse_error(["generate", "--prompt", "--foo"], capsys)
    assert "argument --prompt: expected one argument" in err, err
    for flag, hint in (
        ("--log-config-file", "use --log-level LEVEL"),
        ("--disable-frontend-multiprocessing", "use nothing: Surge's API server always runs apart"),
        ("--enable-ssl-refresh", "use nothing: Surge reads --ssl-certfile and --ssl-keyfile once"),
        ("--middleware", "use nothing: Surge takes no ASGI middleware"),
        ("--disable-access-log-for-endpoints", "use nothing: the access log is off unless --access-log"),
    ):
        err = _parse_error(["serve", flag, "v", str(STORIES)], capsys)
        assert f"unrecognized arguments: {flag} (vLLM's {flag}: {hint}" in err, err


@pytest.mark.parametrize("value", ["-1", "auto", "AUTO"])
def test_vllm_auto_fit_max_model_len_is_refused_by_name(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.26's ``--max-model-len -1`` / ``auto`` (fit the context to the KV cache) was "must be
    positive, got -1" or "'auto' is not a token count"; it is named, with what to do instead, on the
    command line and in ``LLM(max_model_len=-1)``."""
    err = _parse_error(["serve", "--max-model-len", value], capsys)
    assert f"argument --max-model-len: '{value}': vLLM's auto-fit (-1 or auto) is not Surge's" in err, err
    assert "leave --max-model-len out for the model's maximum" in err, err
    from surge.engine.llm_engine import build_engine_config

    with pytest.raises(ValueError, match=r"^max_model_len -1: vLLM's auto-fit .* leave max_model_len out"):
        build_engine_config(str(STORIES), device="cpu", max_model_len=-1)


def test_every_vllm_serve_flag_surge_lacks_is_named_as_vllms(capsys: pytest.CaptureFixture[str]) -> None:
    """147 of vLLM 0.26's 273 ``vllm serve`` flags were a bare "unrecognized arguments" (or a "did
    you mean" naming a different Surge flag: ``--mamba-block-size``, ``--block-size``), against the
    README's promise that a vLLM flag Surge does without says what to use instead; a sample of each
    kind now does, with no "did you mean"."""
    for flag, use in (
        ("--kv-offloading-size", "nothing: Surge has no such setting (`surge serve --help` lists its flags)"),
        ("--max-parallel-loading-workers", "nothing: Surge has no such setting"),
        ("--mamba-block-size", "nothing: Surge serves dense models (Qwen3, Qwen2, Llama 3.x) only"),
        ("--moe-backend", "nothing: Surge serves dense models"),
        ("--mm-processor-cache-gb", "nothing: Surge serves text-only models"),
        ("--fully-sharded-loras", "nothing: Surge serves no LoRA adapters"),
        ("--quantization-config", "-q fp8 (--quantization fp8), which takes no settings"),
        ("--max-num-scheduled-tokens", "--max-num-batched-tokens N (with no speculative decoding"),
        ("--max-num-partial-prefills", "--max-num-batched-tokens N, the one token budget of a step"),
        ("--prefix-caching-hash-algo", "nothing: Surge's prefix cache hashes its blocks with SHA-256"),
        ("--disable-cascade-attn", "nothing: Surge has no cascade attention"),
        ("--spec-tokens", "nothing: Surge has no speculative decoding"),
        ("-cc", "nothing: Surge runs no torch.compile"),
        ("-sc", "nothing: Surge has no speculative decoding"),
        ("-ac", "nothing: Surge runs its own attention kernels"),
    ):
        err = _parse_error(["serve", str(STORIES), flag, "1"], capsys)
        assert f"unrecognized arguments: {flag} (vLLM's {flag}: use {use}" in err, err
        assert "did you mean" not in err, err
    # vLLM's -O0..-O3 (--optimization-level) are Surge's own flags: tests/test_vllm_serve_launch.py


def test_vllm_short_api_server_count_is_taken() -> None:
    """vLLM's ``-asc N`` (``--api-server-count``) was "unrecognized arguments: -asc 2" although Surge
    has the flag."""
    from surge.cli import build_parser

    assert build_parser().parse_args(["serve", "m", "-asc", "2"]).api_server_count == 2


def test_a_vllm_config_flag_given_one_field_is_named_as_vllms(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM sets one field of a JSON config flag with a dot (``-cc.mode=3``,
    ``--compilation-config.mode 3``, ``--speculative-config.method ngram``); these were a bare
    "unrecognized arguments" (or a "did you mean" for another flag) while the flag itself is hinted."""
    for args, flag, use in (
        (["-cc.mode=3"], "-cc", "nothing: Surge runs no torch.compile"),
        (["--compilation-config.mode", "3"], "--compilation-config", "nothing: Surge runs no torch.compile"),
        (
            ["--speculative-config.method", "ngram"],
            "--speculative-config",
            "nothing: Surge has no speculative",
        ),
        (
            ["--kv-transfer-config.kv_connector=X"],
            "--kv-transfer-config",
            "nothing: Surge has no KV connector",
        ),
    ):
        err = _parse_error(["serve", str(STORIES), *args], capsys)
        assert f"(vLLM's {flag}: use {use}" in err, err
        assert "did you mean" not in err, err
