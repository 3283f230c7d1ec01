"""Isolation under hostile input (issue 16): a canary stream keeps flowing while each hostile
request gets its documented status.

The hostile mix is the one of ``benchmarks/isolation/run.py`` (a huge stop list, 10 MB bodies,
3 MB prompts, a million token ids, deep nesting, lone surrogates, ``2**70`` in every numeric
field, a client trickling its headers and one never finishing its body).
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import sys
import time
from types import ModuleType

import httpx

from tests.server.conftest import REPO, start_server

MAX_CANARY_GAP_MS = 500.0
MAX_CANARY_TTFT_MS = 1000.0
_SLOW_CLIENT_S = 8.0


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "isolation_bench", REPO / "benchmarks" / "isolation" / "run.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _expected(name: str) -> int:
    if name in ("prompt_10mb", "tokenize_10mb"):
        return 413  # --max-request-body-bytes, answered before parsing
    if name in ("tokenize_3mb", "bad_words_256x1k", "n128_bad_words_256x1k"):
        return 200  # /tokenize counts any text under the body limit; bad words are tokenized: both off the event loop
    return 400  # every other hostile request is a client mistake naming its field


def test_hostile_mix_keeps_the_canary_flowing(tmp_path) -> None:
    bench = _bench()
    srv = start_server(tmp_path, "--header-read-timeout", "2", "--body-read-timeout", "2")
    try:
        result = asyncio.run(bench.run_mix(srv.url, idle_seconds=2.0, slow_seconds=_SLOW_CLIENT_S))
        if (
            result["hostile"]["gaps"]["max_ms"] >= MAX_CANARY_GAP_MS
            or result["hostile"]["ttft"]["max_ms"] >= MAX_CANARY_TTFT_MS
        ):
            # The development machine is shared: one run may catch another process's burst.
            # Statuses are checked on both runs; the gap must hold on the second.
            first = result
            result = asyncio.run(bench.run_mix(srv.url, idle_seconds=2.0, slow_seconds=_SLOW_CLIENT_S))
            assert {a["name"]: a["status"] for a in first["actions"]} == {
                a["name"]: a["status"] for a in result["actions"]
            }
        statuses = {a["name"]: a["status"] for a in result["actions"]}
        assert statuses == {name: _expected(name) for name in statuses}, statuses
        assert len(statuses) >= 28
        assert result["slow_headers"].startswith("HTTP/1.1 408"), result["slow_headers"]
        assert result["slow_body"].startswith("HTTP/1.1 408"), result["slow_body"]
        assert not result["canary_errors"], result["canary_errors"]
        gaps = result["hostile"]["gaps"]
        assert gaps["n"] > 100, gaps
        assert gaps["max_ms"] < MAX_CANARY_GAP_MS, result
        # a new canary request is not queued behind a hostile one's tokenization either
        assert result["hostile"]["ttft"]["max_ms"] < MAX_CANARY_TTFT_MS, result
        assert httpx.get(srv.url + "/health").status_code == 200
        log = srv.log()
        assert "Traceback" not in log and "internal error" not in log
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


def test_connection_cap_refuses_clearly(tmp_path) -> None:
    srv = start_server(tmp_path, "--max-connections", "4", "--header-read-timeout", "5")
    try:
        socks = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(4)]
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", srv.port))
        extra.settimeout(5)
        answer = b""
        while chunk := extra.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"--max-connections" in answer
        for s in [*socks, extra]:
            s.close()
        time.sleep(0.3)
        assert httpx.get(srv.url + "/health").status_code == 200  # closed connections free their slots
        # an idle connection that never sends a request is closed after --header-read-timeout
        idle = socket.create_connection(("127.0.0.1", srv.port))
        idle.settimeout(15)
        t0 = time.monotonic()
        assert idle.recv(100) == b""
        assert 4.0 < time.monotonic() - t0 < 12.0
        idle.close()
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]
