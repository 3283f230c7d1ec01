"""generation_config.json's ``max_new_tokens`` and vLLM's ``--override-generation-config`` on a
live `surge serve` (vLLM 0.26's ``get_diff_sampling_param`` and ``get_max_tokens``): the file's
value is the output length of a chat request that sends none (completions keep OpenAI's 16); the
override's ``max_new_tokens`` caps every request, ``max_tokens`` sent or not."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import REPO, Server, start_server
from tests.server.test_serve_options import model_copy

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_copy(
        tmp_path_factory.mktemp("max-new-tokens") / "model", {"eos_token_id": 2, "max_new_tokens": 7}
    )


@pytest.fixture(scope="module")
def srv(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("file-only"), model=model)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def capped(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(
        tmp_path_factory.mktemp("override"),
        "--override-generation-config",
        json.dumps({"max_new_tokens": 5, "temperature": 0}),
        model=model,
    )
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def _tokens(srv: Server, path: str, body: dict[str, Any]) -> int:
    r = httpx.post(srv.url + path, json={"ignore_eos": True, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["completion_tokens"])


def test_file_max_new_tokens_is_the_chat_default(srv: Server) -> None:
    assert _tokens(srv, "/v1/chat/completions", {"messages": MESSAGES}) == 7
    assert _tokens(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12}) == 12
    assert _tokens(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 9}) == 9
    assert _tokens(srv, "/v1/completions", {"prompt": "Lily"}) == 16  # OpenAI's default wins there
    assert _tokens(srv, "/v1/completions", {"prompt": "Lily", "max_tokens": 12}) == 12
    assert "max_tokens=7" in srv.log()


def test_override_max_new_tokens_caps_every_request(capped: Server) -> None:
    assert _tokens(capped, "/v1/chat/completions", {"messages": MESSAGES}) == 5
    assert _tokens(capped, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12}) == 5
    assert _tokens(capped, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3}) == 3
    assert _tokens(capped, "/v1/completions", {"prompt": "Lily"}) == 5
    assert _tokens(capped, "/v1/completions", {"prompt": "Lily", "max_tokens": 12}) == 5
    assert "every request's max_tokens is capped at 5" in capped.log()
    # as vLLM: the request's own max_tokens must fit the context, cap or not
    too_long = {"prompt": "Lily", "max_tokens": 10**6, "ignore_eos": True}
    r = httpx.post(capped.url + "/v1/completions", json=too_long, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ('{"max_new_tokens": 0}', "override_generation_config: max_new_tokens must be an integer"),
        ('{"top_p": 2}', "override_generation_config: top_p must be in"),
        ('{"do_sample": true}', "override_generation_config: unsupported key 'do_sample'"),
        ("[1]", "argument --override-generation-config: must be a JSON object"),
    ],
)
def test_bad_override_is_one_line_and_exit_2(value: str, needle: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "surge.cli", "serve", "--device", "cpu", "--port", "0"]
        + ["--override-generation-config", value],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert p.stderr.startswith("surge: error: ") and p.stderr.count("\n") == 1, p.stderr
    assert needle in p.stderr, p.stderr
