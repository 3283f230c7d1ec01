"""Several API processes over shared engines (`surge serve --api-server-count N`)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import httpx
import pytest

from surge.config import EngineConfig, ModelConfig, SchedulerConfig
from surge.core.outputs import EngineOutput
from surge.engine.client import EngineAttachment, EngineClient, EngineDeadError
from surge.engine.core_proc import run_engine_core
from surge.sampling_params import SamplingParams
from tests.server.conftest import Server, pid_alive, start_server
from tests.server.fake_engine import FakeEngine


def _config() -> EngineConfig:
    return EngineConfig(model=ModelConfig.from_pretrained(None), scheduler=SchedulerConfig(max_model_len=512))


async def _tokens(queue: asyncio.Queue) -> list[int]:
    ids: list[int] = []
    while True:
        _, item = await asyncio.wait_for(queue.get(), 10)
        assert isinstance(item, EngineOutput), item
        ids += item.new_token_ids
        if item.finish_reason is not None:
            return ids


async def _until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_one_engine_two_attached_clients(tmp_path: Path) -> None:
    """Each API process gets its own requests' outputs (even under the same id), every step's
    stats, and a count of its requests the engine has received; both see the engine die."""
    addrs = [(f"ipc://{tmp_path}/in-{c}", f"ipc://{tmp_path}/out-{c}") for c in range(2)]
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(
        target=run_engine_core,
        args=(_config(), [a[0] for a in addrs], [a[1] for a in addrs], os.getpid(), FakeEngine, 30),
    )
    proc.start()
    try:

        async def main() -> None:
            assert proc.pid is not None
            clients = [
                EngineClient(_config(), attach=EngineAttachment(a[0], a[1], c, proc.pid))
                for c, a in enumerate(addrs)
            ]
            infos = await asyncio.gather(*(c.start() for c in clients))
            assert all(i.pid == proc.pid for i in infos)
            queues = [asyncio.Queue(), asyncio.Queue()]
            # the same request id from both processes: two requests in the engine
            clients[0].add_request("same", [5, 7], SamplingParams(max_tokens=4), queues[0])
            clients[1].add_request("same", [5, 20], SamplingParams(max_tokens=6), queues[1])
            assert clients[0].load >= 1 and clients[1].load >= 1
            got = await asyncio.gather(_tokens(queues[0]), _tokens(queues[1]))
            assert got == [[10, 11, 12, 13], [23, 24, 25, 26, 27, 28]]  # FakeEngine: prompt[-1] + 3 + k
            assert all(c._num_added == 1 for c in clients)
            # each process's dispatcher reads the last batch (running 0) in its own time
            await _until(lambda: clients[0].load == 0 and clients[1].load == 0)
            long_q: asyncio.Queue = asyncio.Queue()
            clients[1].add_request("long", [5, 9], SamplingParams(max_tokens=100_000), long_q)
            await asyncio.wait_for(long_q.get(), 10)
            await _until(lambda: clients[0].load == 1)  # the other process's request, from the stats
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(5)  # reaped here (the supervisor's job), so the pid is gone
            while True:
                _, item = await asyncio.wait_for(long_q.get(), 10)
                if isinstance(item, EngineDeadError):
                    break
            for c in clients:  # each notices on its own pid poll
                await _until(lambda c=c: not c.is_ready)
                assert "gone" in (c.dead_reason or ""), c.dead_reason
                await c.shutdown()

        asyncio.run(main())
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)


def _wait_for_api_processes(srv: Server, count: int) -> tuple[list[int], list[int]]:
    """(API pids, engine pids) once every API process listens."""
    deadline = time.monotonic() + 120
    while srv.log().count(" serving on http://") < count:
        assert time.monotonic() < deadline, srv.log()[-3000:]
        time.sleep(0.1)
    m = re.search(
        r"(\d+) API server processes \(pids ([\d, ]+)\) over \d+ engine process\(es\) \(pids ([\d, ]+)\)",
        srv.log(),
    )
    assert m and int(m.group(1)) == count, srv.log()[-3000:]
    return [int(p) for p in m.group(2).split(", ")], [int(p) for p in m.group(3).split(", ")]


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of ``name`` whose labels include ``labels`` (in any order: the multiprocess
    collector sorts them)."""
    for m in re.finditer(rf"^{re.escape(name)}{{([^}}]*)}} (\S+)$", text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(2))
    raise AssertionError(f"{name} {labels} missing:\n{text}")


async def _streams(url: str, prompts: list[list[int]], max_tokens: int) -> list[tuple[str, int]]:
    """(text, number of content events) of each streamed completion, each on its own connection."""

    async def one(p: list[int]) -> tuple[str, int]:
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as s:
            body = {
                "prompt": p,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            async with s.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                parts: list[str] = []
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if line.startswith("data: {"):
                        choice = json.loads(line[6:])["choices"][0]
                        parts.append(choice["text"])
                return "".join(parts), len(parts)

    return await asyncio.gather(*(one(p) for p in prompts))


def test_two_api_processes_two_replicas(tmp_path: Path, server: Server) -> None:
    """Outputs equal one API process's, one token per event, both API processes and both
    replicas used (each at least a quarter of the requests), metrics summed over the processes,
    a clean shutdown."""
    srv = start_server(tmp_path, "--api-server-count", "2", "-dp", "2")
    try:
        apis, engines = _wait_for_api_processes(srv, 2)
        assert len(engines) == 2 and all(pid_alive(p) for p in apis + engines)
        assert httpx.get(srv.url + "/health").headers["X-Surge-Pid"] == str(srv.proc.pid)
        prompts = [[1, 300 + i, 17, 33, 250, 7] for i in range(16)]  # one length: equal queries
        got = asyncio.run(_streams(srv.url, prompts, 12))
        want = asyncio.run(_streams(server.url, prompts, 12))
        assert got == want and all(n == 12 for _, n in got)  # one token per event
        log = srv.log()
        served = [len(re.findall(rf"api{c}\] request cmpl-\S+ done", log)) for c in range(2)]
        assert sum(served) == 16 and min(served) > 0, served
        for _ in range(4):  # each scrape may land on either process: all count every request
            text = httpx.get(srv.url + "/metrics").text
            # one series per replica (vLLM's engine label): their sum counts every request
            assert sum(_metric(text, "surge:generation_tokens_total", engine=d) for d in "01") == 16 * 12
            success = [
                _metric(text, "surge:request_success_total", finished_reason="length", engine=d) for d in "01"
            ]
            assert sum(success) == 16 and min(success) > 0, success
        queries = [_metric(text, "surge:prefix_cache_queries_total", engine=d) for d in "01"]
        per_request = sum(queries) / 16
        # Each API process routes by the replicas' loads as it last saw them (the engines'
        # counts arrive with their steps), so a burst can split 10/6 under a loaded machine;
        # a quarter of the requests each still proves both replicas take work.
        assert sum(queries) > 0 and min(queries) >= 4 * per_request, queries
        # as vLLM with --api-server-count above 1: no stats line of one process's share
        # (the server logs every 5 s and has served for longer)
        assert "no periodic stats line" in srv.log() and "Avg prompt throughput" not in srv.log()
    finally:
        code = srv.stop()
    assert code == 0, srv.log()[-3000:]
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in apis + engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in apis + engines), "a process outlived the server"


@pytest.mark.parametrize("which", ["API server", "engine"])
def test_a_dead_process_stops_the_server_and_is_named(tmp_path: Path, which: str) -> None:
    """An API process or an engine process that dies stops the server (code 1); the supervisor
    names it and its exit code once (for an engine, its API processes, which log an engine gone at
    start-up at DEBUG, only exited with code 1 before)."""
    srv = start_server(tmp_path, "--api-server-count", "2")
    apis, engines = _wait_for_api_processes(srv, 2)
    victim = apis[1] if which == "API server" else engines[0]
    os.kill(victim, signal.SIGKILL)
    try:
        srv.proc.wait(30)
    except Exception:
        srv.stop()
        raise
    assert srv.proc.returncode == 1
    assert f"{which} process {victim} exited (code -9): stopping the server" in srv.log(), srv.log()[-2000:]
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in apis + engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in apis + engines), "a process outlived the server"


@pytest.mark.parametrize("count", ["0", "-1"])
def test_bad_api_server_count_is_one_line(count: str) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "surge.cli", "serve", "--api-server-count", count],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert out.returncode != 0
    assert "--api-server-count must be at least 1" in out.stderr and "Traceback" not in out.stderr


def test_a_port_another_api_server_group_holds_is_busy(tmp_path: Path) -> None:
    """A second `surge serve --api-server-count 2` on the port of a running one: its
    SO_REUSEPORT bind succeeded next to the running server's SO_REUSEPORT sockets, so it started
    and the kernel gave it half of the other server's connections. Now it stops at once with one
    line, as on any busy port. (The running server here is what its API processes hold: a
    listening SO_REUSEPORT socket of this user.)"""
    import subprocess
    import sys

    from surge.server.listen import bind_reuseport

    held = bind_reuseport("127.0.0.1", 0)
    held.listen()
    port = held.getsockname()[1]
    cmd = [sys.executable, "-m", "surge.cli", "serve", "--api-server-count", "2", "--port", str(port)]
    proc = subprocess.Popen(
        cmd,
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its engine and API processes too, if it starts them
    )
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the second server started on the busy port") from None
    finally:
        held.close()
    assert proc.returncode == 2, err
    assert err == f"surge: error: cannot listen on 127.0.0.1:{port}: Address already in use\n", err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_during_start_up_is_a_clean_exit(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM or Ctrl-C while the API processes still start (importing, before their own
    handlers) ends the server with code 0 and no traceback, as with one API process: an API
    process the passed-on signal ended counted as a failure (code 1, no reason logged)."""
    import subprocess
    import sys

    from tests.server.conftest import REPO, free_port

    log_path = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "surge.cli", "serve", "--device", "cpu", "--port", str(free_port())]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--api-server-count", "2"], stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
    try:
        deadline = time.monotonic() + 60
        while "2 API server processes" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.01)
        proc.send_signal(sig)
        assert proc.wait(60) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log_path.read_text(), log_path.read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_whole_group_during_start_up_is_one_clean_stop(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C in a terminal, or a service manager's SIGTERM, reaches the whole process group,
    the API processes too while they still import (before they leave the group): each printed a
    KeyboardInterrupt traceback, or SIGTERM ended them before the supervisor knew of a stop and
    the server exited 1 as after a crash. They start with the signals blocked, so the group's
    signal is one clean stop: code 0, no traceback, no crash logged."""
    import subprocess
    import sys

    from tests.server.conftest import REPO, free_port

    log_path = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "surge.cli", "serve", "--device", "cpu", "--port", str(free_port())]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--api-server-count", "2"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,  # its own group, as a terminal's foreground job
        )
    try:
        deadline = time.monotonic() + 60
        while "2 API server processes" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.01)
        os.killpg(proc.pid, sig)  # the API processes are importing now
        assert proc.wait(60) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log_path.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and "exited (code" not in text, text
