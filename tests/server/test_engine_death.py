"""Killing the engine process: /health turns 503 and open requests end with an error within seconds."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
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


def test_engine_death_fails_requests_and_health(tmp_path) -> None:
    srv = start_server(tmp_path)
    try:
        results, plain, killed_at = asyncio.run(_scenario(srv.url, srv.engine_pid))
        for r in results:
            events = r["events"]
            assert r["ended"] - killed_at < 5.0
            assert events[-1] == "[DONE]", "a failed stream ends with the error, then [DONE] (as vLLM)"
            assert "error" in events[-2] and events[-2]["error"]["code"] == 503
            assert all("error" not in e for e in events[:-2])
        assert plain["status"] == 503 and "engine" in plain["body"]["error"]["message"]
        assert plain["ended"] - killed_at < 5.0
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
    finally:
        code = srv.stop()
    assert code == 0, srv.log()[-3000:]
