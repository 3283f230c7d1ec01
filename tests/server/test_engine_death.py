"""Killing the engine process: open requests end with an error within seconds; the server then exits
with code 1 (as vLLM), or, with --keep-alive-on-engine-death, stays up with /health at 503."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time

import aiohttp
import httpx

from tests.server.conftest import start_server

NUM_STREAMS = 6


async def _scenario(url: str, engine_pid: int) -> tuple[list[dict], dict, float]:
    first_chunk = [asyncio.Event() for _ in range(NUM_STREAMS)]
    timeout = aiohttp.ClientTimeout(total=60)

    async def streamer(session: aiohttp.ClientSession, i: int) -> dict:
        body = {"prompt": f"Story {i}", "max_tokens": 480, "ignore_eos": True, "stream": True}
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            events = []
            async for line in resp.content:
                line = line.strip()
                if not line or line.startswith(b":"):  # blank, or an SSE comment (": queued")
                    continue
                payload = line[len(b"data: ") :]
                events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
                first_chunk[i].set()
            return {"events": events, "ended": time.monotonic()}

    async def non_streamer(session: aiohttp.ClientSession) -> dict:
        body = {"prompt": "Tom", "max_tokens": 480, "ignore_eos": True}
        async with session.post(url + "/v1/completions", json=body) as resp:
            return {"status": resp.status, "body": await resp.json(), "ended": time.monotonic()}

    async with aiohttp.ClientSession(timeout=timeout) as session:
        streams = [asyncio.create_task(streamer(session, i)) for i in range(NUM_STREAMS)]
        plain = asyncio.create_task(non_streamer(session))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first_chunk)), 60)
        assert not any(t.done() for t in streams), "the streams are still open when the engine dies"
        killed_at = time.monotonic()
        os.kill(engine_pid, signal.SIGKILL)
        results = await asyncio.gather(*streams)
        plain_result = await plain
    return results, plain_result, killed_at


def _check_failed_requests(results: list[dict], plain: dict, killed_at: float) -> None:
    for r in results:
        events = r["events"]
        assert r["ended"] - killed_at < 5.0
        assert events[-1] == "[DONE]", "a failed stream ends with the error, then [DONE] (as vLLM)"
        assert "error" in events[-2] and events[-2]["error"]["code"] == 503
        assert all("error" not in e for e in events[:-2])
    assert plain["status"] == 503 and "engine" in plain["body"]["error"]["message"]
    assert plain["ended"] - killed_at < 5.0


def test_engine_death_ends_requests_then_the_server(tmp_path) -> None:
    """As vLLM: the server exits (code 1) once its requests have their error, so that a restart
    policy brings it back; it used to stay up answering 503 forever."""
    srv = start_server(tmp_path)
    results, plain, killed_at = asyncio.run(_scenario(srv.url, srv.engine_pid))
    _check_failed_requests(results, plain, killed_at)
    try:
        code = srv.proc.wait(20)
    except subprocess.TimeoutExpired:
        srv.stop()
        raise AssertionError("the server outlived its engine") from None
    assert code == 1, srv.log()[-3000:]
    assert "the server exits (exit code 1" in srv.log()


def test_engine_death_kept_alive_fails_requests_and_health(tmp_path) -> None:
    srv = start_server(tmp_path, "--keep-alive-on-engine-death")
    try:
        results, plain, killed_at = asyncio.run(_scenario(srv.url, srv.engine_pid))
        _check_failed_requests(results, plain, killed_at)
        deadline = time.monotonic() + 5
        while httpx.get(srv.url + "/health").status_code != 503:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["message"]
        # the engine's gauges no longer describe a live engine: zeroed, and engine_up says why
        metrics = httpx.get(srv.url + "/metrics").text
        for name, value in (
            ("surge:engine_up", 0.0),
            ("surge:num_requests_running", 0.0),
            ("surge:num_requests_waiting", 0.0),
            ("surge:kv_cache_usage_perc", 0.0),
        ):
            m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", metrics, re.M)
            assert m is not None and float(m.group(1)) == value, (name, m and m.group(0))
        # its counters keep their last values: a drop to 0 would read as a counter reset
        m = re.search(r"^surge:prefix_cache_queries_total{[^}]*} (\S+)$", metrics, re.M)
        assert m is not None and float(m.group(1)) > 0, m and m.group(0)
    finally:
        code = srv.stop()
    assert code == 0, srv.log()[-3000:]
