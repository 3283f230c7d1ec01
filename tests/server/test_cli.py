"""`surge serve` start-up errors: one readable line and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.conftest import REPO, STORIES


def _serve(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "surge.cli", "serve", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )


def _no_tokenizer_model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text((STORIES / "config.json").read_text())
    return tmp_path


@pytest.mark.parametrize(
    ("args", "word"),
    [
        (["--port", "http"], "--port"),
        (["--stream-interval", "0"], "--stream-interval"),
        (["--dtype", "float8"], "--dtype"),
        (["--model", "/no/such/folder"], "no such folder"),
        (["--block-size", "12"], "block_size"),
        (["--chat-template", "/no/such/template.jinja"], "--chat-template"),
        (["--chat-template", "{% for m in messages %}{{ m.content }"], "does not parse"),
        (["--port", "99999"], "--port"),
        (["--api-key", "cl\u00e9"], "--api-key"),
        (["--max-request-body-bytes", "0"], "--max-request-body-bytes"),
        (["--engine-stall-timeout", "-1"], "--engine-stall-timeout"),
        (["--grammar-compile-timeout", "0"], "--grammar-compile-timeout"),
        (["--grammar-compile-timeout", "inf"], "--grammar-compile-timeout"),
        (["--served-model-name", ""], "--served-model-name"),
        (["--scheduling-policy", "lifo"], "--scheduling-policy"),
        # the bundled model has no <think> / </think> token: all its output read as reasoning and
        # a thinking_token_budget counted nothing (vLLM's reasoning parsers refuse to start)
        (
            ["--reasoning-parser", "qwen3"],
            "--reasoning-parser qwen3: the model's tokenizer has no <think> or </think>",
        ),
        (
            ["--reasoning-parser", "deepseek_r1"],
            "--reasoning-parser deepseek_r1: the model's tokenizer has no <think>",
        ),
    ],
)
def test_bad_flags_one_line(args: list[str], word: str) -> None:
    r = _serve(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("surge: error:") and word in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_model_without_tokenizer(tmp_path: Path) -> None:
    r = _serve("--model", str(_no_tokenizer_model(tmp_path)))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("surge: error:") and "tokenizer" in last


def test_a_model_the_engine_cannot_load_is_one_error_line() -> None:
    """A model the engine process refused was two timestamped ERROR lines (the engine's, then
    the server's), not the ``surge: error:`` line of every other start-up error (and of
    ``surge generate`` for the same folder): the engine leaves it to the server now."""
    r = _serve("--hf-overrides", '{"vocab_size": 10}', "--port", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if " INFO " not in line]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("surge: error: model: cannot load 'model.embed_tokens.weight'"), r.stderr
    assert "expected (10, 64)" in lines[0], r.stderr


def test_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _serve("--port", str(port))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"surge: error: cannot listen on 127.0.0.1:{port}")


def test_chat_template_flag_takes_long_inline_templates_and_refuses_broken_ones(tmp_path: Path) -> None:
    """An inline template longer than a file name may be is a template, not an OSError; a
    template file that does not parse is refused at start-up, naming the line."""
    import json

    from surge.server.cli import _read_chat_template

    qwen3 = json.loads((REPO.parent / "shared/assets/models/qwen3-8b/tokenizer_config.json").read_text())
    inline = qwen3["chat_template"]
    assert len(inline) > 4096 and _read_chat_template(inline) == inline
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    with pytest.raises(ValueError, match=r"--chat-template: the template does not parse \(line 2\)"):
        _read_chat_template(str(broken))


def test_a_chat_template_file_that_is_not_utf8_names_the_flag(tmp_path: Path) -> None:
    """A binary file given as ``--chat-template`` was "surge: error: 'utf-8' codec can't decode
    byte 0xff ...", naming neither the flag nor the file."""
    from surge.server.cli import _read_chat_template

    binary = tmp_path / "template.bin"
    binary.write_bytes(b"\xff\xfe{{ messages }}")
    with pytest.raises(ValueError, match=r"^--chat-template: '.*template\.bin' is not UTF-8 text \(byte 0: "):
        _read_chat_template(str(binary))


def test_a_one_line_inline_chat_template_is_taken_as_typed() -> None:
    """vLLM 0.26 takes an inline ``--chat-template`` literally (its ``_load_chat_template`` with
    ``is_literal=True`` returns the value unchanged): backslash escapes stay Jinja's own."""
    from surge.server.cli import _read_chat_template

    value = '{% for m in messages %}{{ m.content }}\\n{% endfor %}{{ "a\\"b" }}'
    assert "\\n" in value and _read_chat_template(value) == value


def test_stream_attention_flag_reaches_the_engine_config() -> None:
    """``--stream-attention`` is tri-state (default: wherever it can run), and refused in one line
    where it is asked for and could do nothing."""
    from surge.cli import build_parser
    from surge.engine.llm_engine import build_engine_config

    parser = build_parser()
    assert parser.parse_args(["serve", "--model", "m"]).stream_attention is None
    assert parser.parse_args(["serve", "--model", "m", "--stream-attention"]).stream_attention is True
    assert parser.parse_args(["serve", "--model", "m", "--no-stream-attention"]).stream_attention is False
    bundled = Path(__file__).resolve().parents[2] / "surge" / "assets" / "stories260K"
    assert (
        build_engine_config(str(bundled), device="cpu").stream_attention is None
    )  # a bf16 model: not refused
    assert build_engine_config(str(bundled), device="cpu", stream_attention=False).stream_attention is False
    # never silently ignored: without FP8 weights on a GPU there is nothing for it to act on
    with pytest.raises(ValueError, match="stream_attention .* needs FP8 weights"):
        build_engine_config(str(bundled), device="cpu", stream_attention=True)
    r = _serve("--model", str(bundled), "--stream-attention")
    assert r.returncode != 0 and "--stream-attention" in r.stderr and "Traceback" not in r.stderr


def test_api_key_help_names_every_open_route() -> None:
    """``--api-key``'s help lists the routes served without the key; it named /health, /version
    and /metrics but not /ping, /load or /tokenizer_info, which are open too (docs/server-limits.md)."""
    from surge.cli import build_parser
    from surge.server.auth import OPEN_PATHS

    serve = next(a for a in build_parser()._actions if a.dest == "command").choices["serve"]  # type: ignore[union-attr]
    text = " ".join(next(a for a in serve._actions if a.dest == "api_key").help.split())
    api_docs = {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}  # "the API docs"
    missing = sorted(p for p in OPEN_PATHS - api_docs if not re.search(re.escape(p) + r"\b", text))
    assert not missing and "the API docs" in text, (missing, text)


def test_tokenizer_flag_naming_the_model_folder_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's ``--tokenizer`` (often written as ``vllm serve M --tokenizer M``) was refused as
    unknown, so such a launch line stopped; it is taken when it names the model folder however
    spelled, as ``LLM(tokenizer=...)``, and another folder is one line and exit 2."""
    from surge.cli import build_parser
    from surge.server.cli import check_tokenizer_flag

    assert build_parser().parse_args(["serve", "m", "--tokenizer", "m"]).tokenizer == "m"
    monkeypatch.chdir(STORIES.parent)
    for same in (str(STORIES), str(STORIES) + "/", STORIES.name, f"./{STORIES.name}/../{STORIES.name}"):
        check_tokenizer_flag(same, str(STORIES))
    check_tokenizer_flag(None, str(STORIES))
    with pytest.raises(ValueError, match="--tokenizer .* is not the model folder"):
        check_tokenizer_flag(str(tmp_path), str(STORIES))
    r = _serve("--model", str(STORIES), "--tokenizer", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("surge: error: --tokenizer ") and "leave --tokenizer out" in last, r.stderr
