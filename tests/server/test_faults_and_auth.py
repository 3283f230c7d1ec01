"""Health, metrics and streams around a stopped engine; the API key's scope; start-up hygiene (issue 16)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server, start_server

KEY = "sekret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _metric(text: str, name: str) -> tuple[str, float]:
    m = re.search(rf"^{re.escape(name)}{{([^}}]*)}} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return m.group(1), float(m.group(2))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """A server with an API key, /metrics behind it, a 2 s stall timeout, ': queued' every 0.5 s.

    Before it starts, a stale IPC folder of a dead API process is planted in the temp directory.
    """
    stale = Path(tempfile.gettempdir()) / f"surge-ipc-{_dead_pid()}-planted"
    stale.mkdir()
    (stale / "input").write_text("")
    srv = start_server(
        tmp_path_factory.mktemp("keyed"),
        "--api-key",
        KEY,
        "--metrics-require-key",
        "--engine-stall-timeout",
        "2",
        "--sse-queued-interval",
        "0.5",
    )
    yield srv, stale
    assert srv.stop() == 0, srv.log()[-3000:]


def test_stale_ipc_folder_removed(keyed: tuple[Server, Path]) -> None:
    _, stale = keyed
    assert not stale.exists()


def test_kv_gauges_before_any_request(keyed: tuple[Server, Path]) -> None:
    """A fresh server's KV gauges show the pool from start-up (the engine's ready message), not
    0 / 0 until the first request (this module's first request comes later)."""
    srv, _ = keyed
    text = httpx.get(srv.url + "/metrics", headers=AUTH).text
    assert _metric(text, "surge:kv_cache_total_blocks")[1] == 4096  # start_server's --num-kv-blocks
    assert _metric(text, "surge:kv_cache_free_blocks")[1] == 4096
    assert _metric(text, "surge:kv_cache_usage_perc")[1] == 0
    assert _metric(text, "surge:num_requests_running")[1] == 0


def test_key_scope_and_checked_before_the_body(keyed: tuple[Server, Path]) -> None:
    srv, _ = keyed
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 2]})):
        assert httpx.post(srv.url + path, json=body).status_code == 401
        assert httpx.post(srv.url + path, json=body, headers=AUTH).status_code == 200
    # the key is checked before the body is read: bad JSON or a huge body is still a 401
    r = httpx.post(
        srv.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(srv.url + "/v1/completions", content=b"x" * 6_000_000)
    assert r.status_code == 401
    # open routes; /metrics only with the key (--metrics-require-key)
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.get(srv.url + "/version").status_code == 200
    assert httpx.get(srv.url + "/metrics").status_code == 401
    text = httpx.get(srv.url + "/metrics", headers=AUTH).text
    labels, _ = _metric(text, "surge:engine_up")
    served = httpx.get(srv.url + "/v1/models", headers=AUTH).json()["data"][0]["id"]
    assert served.endswith("stories260K") and served != "stories260K"  # the model path
    assert labels == f'model_name="{served}"', "the label is the served model name, as in vLLM"


def test_stopped_engine(keyed: tuple[Server, Path]) -> None:
    """SIGSTOP the engine: a new stream gets its headers and ': queued' comments at once, its
    prompt tokens are not counted before their prefill, and /health turns 503 after the stall
    timeout; SIGCONT: everything completes and /health is 200 again."""
    srv, _ = keyed

    def prompt_tokens() -> float:
        return _metric(httpx.get(srv.url + "/metrics", headers=AUTH).text, "surge:prompt_tokens_total")[1]

    before = prompt_tokens()
    os.kill(srv.engine_pid, signal.SIGSTOP)
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as r:
            assert r.status_code == 200  # headers at accept, while the engine cannot answer
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = r.iter_lines()
            assert next(lines) == ": queued"
            assert prompt_tokens() == before, "prompt tokens are counted at prefill, not on arrival"
            deadline = time.monotonic() + 15
            while (h := httpx.get(srv.url + "/health")).status_code == 200:
                assert time.monotonic() < deadline, "/health never noticed the stalled engine"
                time.sleep(0.2)
            assert h.status_code == 503 and "--engine-stall-timeout" in h.json()["error"]["message"]
            os.kill(srv.engine_pid, signal.SIGCONT)
            data = [line for line in lines if line.startswith("data: ")]
        assert data[-1] == "data: [DONE]" and len(data) == 6
    finally:
        os.kill(srv.engine_pid, signal.SIGCONT)
    assert prompt_tokens() > before
    assert httpx.get(srv.url + "/health").status_code == 200


def test_openai_sdk_ignores_queued_comments(keyed: tuple[Server, Path]) -> None:
    """The openai SDK reads a stream that starts with ': queued' comments like any other."""
    import threading

    import openai

    srv, _ = keyed
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, timeout=60)
    os.kill(srv.engine_pid, signal.SIGSTOP)
    resume = threading.Timer(1.6, os.kill, (srv.engine_pid, signal.SIGCONT))  # 3 comments first
    resume.start()
    try:
        stream = client.completions.create(
            model=client.models.list().data[0].id,
            prompt="Once",
            max_tokens=4,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
    finally:
        resume.join()
        os.kill(srv.engine_pid, signal.SIGCONT)
    assert len(chunks) == 4 and chunks[-1].choices[0].finish_reason == "length"
