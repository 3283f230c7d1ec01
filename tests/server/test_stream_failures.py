"""A bug of ours raised while a stream is produced (after its first events went out) ends the
stream with an OpenAI error event, as vLLM does, instead of cutting the connection: chat and
completions send ``data: {"error": ...}`` then ``data: [DONE]``; the Responses API sends its
``error`` event then ``response.failed``; the Messages API Anthropic's ``error`` event. The traceback is logged once by the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import REPO

_SCRIPT = """
import asyncio, logging, socket, sys
import surge.server.api_server as api
import surge.tokenizer
from surge.config import EngineConfig, ModelConfig, SchedulerConfig
from tests.server.fake_engine import FakeEngine

_update = surge.tokenizer.IncrementalDetokenizer.update


def update_then_fail(self, new_token_ids, stop_token_id=None):
    # the third token of every choice hits a bug (its first tokens are already streamed)
    self.calls = getattr(self, "calls", 0) + 1
    if self.calls == 3:
        raise KeyError("a bug in the detokenizer")
    return _update(self, new_token_ids, stop_token_id)


if __name__ == "__main__":  # the engine process is a spawned child: it imports this file
    logging.basicConfig(level=logging.INFO)
    surge.tokenizer.IncrementalDetokenizer.update = update_then_fail
    config = EngineConfig(model=ModelConfig.from_pretrained(None), scheduler=SchedulerConfig(max_model_len=512))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    print("port", sock.getsockname()[1], flush=True)
    sys.exit(asyncio.run(api.run_server(config, api.ServeOptions(), sock, engine_factory=FakeEngine)))
"""


@pytest.fixture(scope="module")
def failing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A server (fake engine) whose detokenizer raises at every choice's third token: its URL
    and its log file."""
    folder = tmp_path_factory.mktemp("stream-failures")
    script = folder / "failing_server.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    log = folder / "server.log"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(log, "wb") as err, open(folder / "stdout", "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=err, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while "engine ready" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        port = int((folder / "stdout").read_text().split()[1])
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _events(url: str, path: str, body: dict[str, Any]) -> list[tuple[str | None, str]]:
    """The (event name, data) pairs of a stream read to its end."""
    out: list[tuple[str | None, str]] = []
    name: str | None = None
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                out.append((name, line[len("data: ") :]))
                name = None
    return out


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}),
    ],
)
def test_a_bug_mid_stream_ends_with_an_error_event_and_done(
    failing_server: tuple[str, Path], path: str, body: dict[str, Any]
) -> None:
    url, log = failing_server
    events = _events(url, path, body)
    assert events[-1] == (None, "[DONE]")
    error = json.loads(events[-2][1])
    assert error == {
        "error": {
            "message": "Internal server error",
            "type": "internal_server_error",
            "param": None,
            "code": 500,
        }
    }
    assert "choices" in json.loads(events[0][1]), "the stream had started"
    assert f"internal error while streaming {path}" in log.read_text()
    assert "KeyError: 'a bug in the detokenizer'" in log.read_text()
    assert "Exception in ASGI application" not in log.read_text(), "uvicorn saw no exception"


def test_a_bug_mid_responses_stream_ends_with_error_and_response_failed(
    failing_server: tuple[str, Path],
) -> None:
    url, log = failing_server
    events = _events(url, "/v1/responses", {"input": "Hi", "max_output_tokens": 8})
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-2:] == ["error", "response.failed"]
    error = json.loads(events[-2][1])
    assert (error["code"], error["message"]) == ("500", "Internal server error")
    failed = json.loads(events[-1][1])["response"]
    assert failed["status"] == "failed" and failed["error"]["message"] == "Internal server error"
    assert "internal error while streaming /v1/responses" in log.read_text()


def test_a_bug_mid_messages_stream_ends_with_an_anthropic_error_event(
    failing_server: tuple[str, Path],
) -> None:
    url, log = failing_server
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    events = _events(url, "/v1/messages", body)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and "content_block_delta" in names, names
    assert names[-1] == "error" and "message_stop" not in names
    assert json.loads(events[-1][1]) == {
        "type": "error",
        "error": {"type": "api_error", "message": "Internal server error"},
    }
    assert "internal error while streaming /v1/messages" in log.read_text()
