"""`surge serve -tp 2` and `-dp 2` on CPU: the tokens of one GPU's worth, routing, failures."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from surge import LLM, SamplingParams
from tests.engine.tiny_models import hf_greedy, make_tiny_model
from tests.server.conftest import pid_alive, start_server

PROMPTS = [[1, 17, 33, 250, 7, 91, 4, 300, 12, 18, 19, 20, 21, 22, 23, 24, 25, 26], [1, 400, 3], [1, 9]]


def _complete(url: str, prompt: list[int], max_tokens: int = 6) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _worker_pids(log: str) -> list[int]:
    m = re.search(r"tensor-parallel ranks ready \(pids ([\d, ]+)\)", log)
    assert m, "the engine logs its workers' pids"
    return [int(p) for p in m.group(1).split(", ")]


async def _stream_until_error(url: str, pid_to_kill: int) -> list[str]:
    body = {"prompt": [1, 5, 6], "max_tokens": 200, "ignore_eos": True, "stream": True}
    lines: list[str] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url + "/v1/completions", json=body) as resp,
    ):
        assert resp.status == 200
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line:
                continue
            lines.append(line)
            if len(lines) == 2:
                os.kill(pid_to_kill, signal.SIGKILL)
    return lines


def test_serve_tp2_tokens_then_a_killed_worker(tmp_path: Path) -> None:
    model_dir = make_tiny_model("qwen2", tmp_path / "qwen2")
    srv = start_server(  # start_server's --max-num-seqs 256 is over a budget of 16 (refused, as by vLLM)
        tmp_path,
        *("-tp", "2", "--max-num-batched-tokens", "16", "--max-num-seqs", "16", "--dtype", "float32"),
        model=model_dir,
    )
    try:
        pids = _worker_pids(srv.log())
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        tp1 = LLM(model_dir, device="cpu", dtype="float32").generate(PROMPTS, params)
        assert [o.outputs[0].token_ids for o in tp1] == hf_greedy(model_dir, PROMPTS, 6)
        for prompt, out in zip(PROMPTS, tp1, strict=True):
            assert _complete(srv.url, prompt) == out.outputs[0].text
        lines = asyncio.run(_stream_until_error(srv.url, pids[1]))
        assert lines[-1] == "data: [DONE]"  # after the error event, as vLLM ends such a stream
        err = json.loads(lines[-2][len("data: ") :])
        assert err["error"]["code"] == 503 and "rank 1" in err["error"]["message"]
        # then the server exits (code 1), as vLLM does when its engine dies
        code = srv.proc.wait(30)
    finally:
        if srv.proc.poll() is None:
            srv.stop()
    assert code == 1, srv.log()[-3000:]
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids), "a worker outlived the server"


def _metric(text: str, name: str, replica: str) -> float:
    m = re.search(rf'^{name}{{engine="{replica}",model_name="[^"]*"}} (\S+)$', text, re.M)
    assert m, f"{name} of replica {replica} missing:\n{text}"
    return float(m.group(1))


def test_serve_dp2_spreads_requests_and_matches_dp1(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "-dp", "2", "--keep-alive-on-engine-death")
    try:
        fresh = httpx.get(srv.url + "/metrics").text  # before any request: each replica's whole pool
        for replica in ("0", "1"):
            assert _metric(fresh, "surge:kv_cache_total_blocks", replica) == 4096
            assert _metric(fresh, "surge:kv_cache_free_blocks", replica) == 4096
        prompts = [f"Once upon a time {i}" for i in range(6)]

        async def run_all() -> list[str]:
            async with aiohttp.ClientSession() as session:

                async def one(p: str) -> str:
                    body = {"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
                    async with session.post(srv.url + "/v1/completions", json=body) as resp:
                        assert resp.status == 200
                        return (await resp.json())["choices"][0]["text"]

                return await asyncio.gather(*(one(p) for p in prompts))

        texts = asyncio.run(run_all())
        n2 = httpx.post(
            srv.url + "/v1/completions",
            json={"prompt": "Tom", "max_tokens": 8, "n": 3, "temperature": 1.0, "seed": 1},
            timeout=60,
        )
        assert n2.status_code == 200 and len(n2.json()["choices"]) == 3
        # a prompt list is spread over the replicas (prompt by prompt, as vLLM routes it), not
        # sent whole to one; each prompt's tokens as served alone
        before = httpx.get(srv.url + "/metrics").text
        body = {"prompt": prompts, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        listed = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert listed.status_code == 200, listed.text
        assert [c["text"] for c in listed.json()["choices"]] == texts
        metrics = httpx.get(srv.url + "/metrics").text
        name = "surge:generation_tokens_total"
        served = [_metric(metrics, name, d) - _metric(before, name, d) for d in ("0", "1")]
        assert served == [3 * 24, 3 * 24], served
        assert httpx.get(srv.url + "/health").status_code == 200
        m = re.search(r"2 replicas ready \(engine pids (\d+), (\d+)\)", srv.log())
        assert m, "the server logs its replicas' engine pids"
        os.kill(int(m.group(2)), signal.SIGKILL)  # one replica down: the server is not healthy
        deadline = time.monotonic() + 10
        while httpx.get(srv.url + "/health").status_code != 503:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert "replica 1" in httpx.get(srv.url + "/health").json()["error"]["message"]
    finally:
        code = srv.stop()
    assert code == 0, srv.log()[-3000:]
    for replica in ("0", "1"):
        assert _metric(metrics, "surge:prefix_cache_queries_total", replica) > 0
    llm = LLM(device="cpu")
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    assert texts == [o.outputs[0].text for o in llm.generate(prompts, params)]


def test_a_dead_replica_ends_every_stream_before_the_server_exits(tmp_path: Path) -> None:
    """One replica's death stops the server (code 1, as vLLM), and every open stream, on the
    healthy replica too, ends with an error event and ``[DONE]``: the server's stop used to cut
    the healthy replica's longer streams off after uvicorn's 3 s grace, with neither. Every
    error names the replica that died, the dead replica's own requests' too (streamed and not)."""
    srv = start_server(tmp_path, "-dp", "2")
    m = re.search(r"2 replicas ready \(engine pids (\d+), (\d+)\)", srv.log())
    assert m, "the server logs its replicas' engine pids"

    async def streams() -> tuple[list[list[str]], tuple[int, dict[str, Any]]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

            async def one(i: int) -> list[str]:
                body = {"prompt": f"Story {i}", "max_tokens": 480, "ignore_eos": True, "stream": True}
                async with session.post(srv.url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    return [line.decode().strip() async for line in resp.content if line.startswith(b"data:")]

            async def whole() -> tuple[int, dict[str, Any]]:
                # two prompts, routed one by one: one of them runs on replica 1 (replica 0 has
                # as many requests in flight as replica 1 or one more, ties going to replica 0)
                body = {"prompt": ["Once", "Upon"], "max_tokens": 480, "ignore_eos": True}
                async with session.post(srv.url + "/v1/completions", json=body) as resp:
                    return resp.status, await resp.json()

            tasks = [asyncio.create_task(one(i)) for i in range(8)]
            unstreamed = asyncio.create_task(whole())
            await asyncio.sleep(0.3)
            os.kill(int(m.group(2)), signal.SIGKILL)
            return await asyncio.gather(*tasks), await unstreamed

    try:
        results, (status, body) = asyncio.run(streams())
        code = srv.proc.wait(30)
    finally:
        if srv.proc.poll() is None:
            srv.stop()
    assert code == 1, srv.log()[-3000:]
    for events in results:
        assert events[-1] == "data: [DONE]", events[-3:]
        last = json.loads(events[-2][len("data: ") :])
        assert "error" in last or last["choices"][0]["finish_reason"] == "length", events[-3:]
    # the healthy replica's streams end now too (they would have run on to their 480 tokens)
    assert sum("error" in json.loads(e[-2][len("data: ") :]) for e in results) >= 6
    # their errors and the server's log line name the replica that died (they read "the engine
    # process died (exit code -9)", as if their own engine had)
    last_events = [json.loads(e[-2][len("data: ") :]) for e in results]
    healthy = [
        e["error"]["message"]
        for e in last_events
        if "the server exits" in e.get("error", {}).get("message", "")
    ]
    assert healthy and all("not available: replica 1: the engine process died" in msg for msg in healthy), (
        healthy
    )
    assert "replica 1: the engine process died (exit code -9): the server exits" in srv.log()
    # the dead replica's own requests name it too (they read "the engine process died (exit
    # code -9)", naming no replica): its streams' error events and the non-streamed 503 body
    died = "The engine is not available: replica 1: the engine process died (exit code -9)"
    own = [
        e["error"]["message"]
        for e in last_events
        if "error" in e and "the server exits" not in e["error"]["message"]
    ]
    assert own and all(msg == died for msg in own), own
    assert status == 503 and body["error"]["message"] == died, (status, body)
