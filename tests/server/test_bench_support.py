"""Server features the benchmark relies on, against a live `surge serve` of the bundled model:
a first content chunk with text after the role chunk, POST /reset_prefix_cache (and vLLM's query
parameters), HEAD /metrics and the pid on /health."""

from __future__ import annotations

import json

import httpx

from tests.server.conftest import Server


def _model(server: Server) -> str:
    return str(httpx.get(server.url + "/v1/models").json()["data"][0]["id"])


def _chunks(server: Server, body: dict) -> list[dict]:
    out = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def test_first_chunk_carries_text(server: Server) -> None:
    """The issue's example: the first token's text is held back as a possible prefix of the stop
    string. The role chunk comes first (``content: ""``, as vLLM: no token to vLLM's benchmark
    client); the first content chunk after it must carry text (an empty ``content`` without the
    role would count as the first token)."""
    body = {
        "model": _model(server),
        "messages": [{"role": "user", "content": "Once upon a time"}],
        "temperature": 0,
        "max_tokens": 8,
        "stop": [" Jx"],
        "stream": True,
    }
    chunks = [c for c in _chunks(server, body) if c["choices"]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    first = chunks[1]["choices"][0]["delta"]
    assert "role" not in first and first["content"] != ""
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    full = httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=120).json()
    assert text == full["choices"][0]["message"]["content"]


def test_reset_prefix_cache_head_metrics_and_health_pid(server: Server) -> None:
    r = httpx.post(server.url + "/reset_prefix_cache")
    assert r.status_code == 200 and r.json() == {"success": True}
    assert httpx.get(server.url + "/v1/models").status_code == 200  # the engine is still fine
    head = httpx.head(server.url + "/metrics")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == httpx.get(server.url + "/metrics").headers["content-type"]
    assert int(httpx.get(server.url + "/health").headers["x-surge-pid"]) == server.proc.pid


def test_reset_prefix_cache_takes_vllm_query_parameters(server: Server) -> None:
    """vLLM's ``reset_external`` is taken (no external KV connector here) and its
    ``reset_running_requests=true``, which Surge does not do, is a 400 naming it: it was ignored;
    a value that is not a boolean names the parameter, not ``query``."""
    url = server.url + "/reset_prefix_cache"
    r = httpx.post(url + "?reset_external=true&reset_running_requests=false")
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    for value in ("true", "maybe"):
        r = httpx.post(url + f"?reset_running_requests={value}")
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "reset_running_requests", error
        assert error["message"].startswith("reset_running_requests"), error


def test_rejected_requests_are_logged_at_info(server: Server) -> None:
    body = {"model": _model(server), "prompt": "x", "max_tokens": -1}
    r = httpx.post(server.url + "/v1/completions", json=body, headers={"X-Request-Id": "rej-42"})
    assert r.status_code == 400
    line = next(x for x in server.log().splitlines() if "(request id rej-42)" in x)
    assert " INFO " in line and "POST /v1/completions -> 400" in line and "max_tokens" in line
    # a rejection by the request guard, before the body is parsed, is logged the same way
    raw = b'{"model": "m", "prompt": "\\ud800"}'
    r = httpx.post(server.url + "/v1/completions", content=raw, headers={"X-Request-Id": "rej-43"})
    assert r.status_code == 400
    line = next(x for x in server.log().splitlines() if "(request id rej-43)" in x)
    assert " INFO " in line and "-> 400" in line and "surrogate" in line


def test_sigterm_to_the_process_group_logs_no_engine_death(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A normal stop (SIGTERM to the whole group, as a launcher or systemd sends) is no crash."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.server.conftest import REPO, free_port

    port = free_port()
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "surge.cli", "serve", "--device", "cpu", "--port", str(port)]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        for phase in ("start-up: model built", "start-up: KV pool"):
            assert phase in text, text
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert " ERROR " not in text and "died" not in text, text
