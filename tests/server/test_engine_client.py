"""EngineClient + engine process with a torch-free fake engine: routing, rejections, crashes, idling."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from surge.config import EngineConfig, ModelConfig, SchedulerConfig
from surge.core.outputs import EngineOutput
from surge.engine.client import EngineClient, EngineDeadError, EngineStartError
from surge.engine.core_proc import RequestError
from surge.sampling_params import SamplingParams
from tests.server.conftest import REPO, pid_alive
from tests.server.fake_engine import BrokenEngine, FakeEngine, OutOfMemoryEngine


def _config() -> EngineConfig:
    return EngineConfig(model=ModelConfig.from_pretrained(None), scheduler=SchedulerConfig(max_model_len=512))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().split(")")[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drain(queue: asyncio.Queue) -> list:
    items = []
    while True:
        index, item = await asyncio.wait_for(queue.get(), 10)
        items.append((index, item))
        if not isinstance(item, EngineOutput) or item.finish_reason is not None:
            return items


def test_routing_rejection_abort_and_idle() -> None:
    async def main() -> None:
        client = EngineClient(_config(), engine_factory=FakeEngine)
        info = await client.start()
        assert info.pid == client.pid and info.num_kv_blocks == 64 and client.is_ready
        try:
            q1: asyncio.Queue = asyncio.Queue()
            q2: asyncio.Queue = asyncio.Queue()
            client.add_request("a", [5, 7], SamplingParams(max_tokens=5), q1, index=0)
            client.add_request("b", [5, 999], SamplingParams(max_tokens=5), q2, index=3)
            client.add_request("c", [5, 9], SamplingParams(max_tokens=3), q2, index=4)
            got_a = await _drain(q1)
            assert [item.new_token_ids[0] for _, item in got_a] == [10, 11, 12, 13, 14]
            assert got_a[-1][1].finish_reason == "length"
            first = await asyncio.wait_for(q2.get(), 10)
            rest = await _drain(q2) if isinstance(first[1], RequestError) else [first, *await _drain(q2)]
            items = [first, *rest] if isinstance(first[1], RequestError) else rest
            errors = [(i, x) for i, x in items if isinstance(x, RequestError)]
            assert errors and errors[0][0] == 3 and "999" in errors[0][1].message
            # abort: nothing more arrives for the aborted request
            q3: asyncio.Queue = asyncio.Queue()
            client.add_request("d", [1], SamplingParams(max_tokens=10**6), q3)
            await asyncio.wait_for(q3.get(), 10)
            client.abort_requests(["d"])
            await asyncio.sleep(0.3)
            while not q3.empty():
                q3.get_nowait()
            await asyncio.sleep(0.3)
            assert q3.empty() and client.num_inflight == 0
            assert client.stats is not None and client.stats.num_running == 0
            # an idle engine blocks on its socket instead of spinning
            before = _cpu_seconds(info.pid)
            await asyncio.sleep(1.5)
            assert _cpu_seconds(info.pid) - before < 0.5
        finally:
            await client.shutdown()
        assert not pid_alive(info.pid)

    asyncio.run(main())


def test_n_choices_cross_the_socket_once() -> None:
    """A request of n choices is one message; the engine fans it out into split_n's ids and
    seeds, and each choice's outputs come back tagged with its own index."""

    async def main() -> None:
        client = EngineClient(_config(), engine_factory=FakeEngine)
        await client.start()
        sent: list[bytes] = []
        send = client._send
        client._send = lambda buf: (sent.append(bytes(buf)), send(buf))[1]  # type: ignore[method-assign]
        try:
            q: asyncio.Queue = asyncio.Queue()
            params = SamplingParams(n=3, max_tokens=2, seed=10, bad_words_token_ids=[[4, 5]])
            client.add_request("p", [5, 7], params, q, index=2)
            assert len(sent) == 1 and client.num_inflight == 3
            got: dict[int, list[int]] = {}
            while len(got) < 3 or any(len(v) < 2 for v in got.values()):
                index, item = await asyncio.wait_for(q.get(), 10)
                assert isinstance(item, EngineOutput), item
                assert item.request_id == f"p-{index - 2}"
                got.setdefault(index, []).extend(item.new_token_ids)
            # choice i has seed 10 + i: its tokens are shifted by i
            assert got == {2 + i: [(7 + k + 10 + i) % 500 + 3 for k in range(2)] for i in range(3)}
            assert client.num_inflight == 0
            # an id in flight is refused before anything is sent
            client.add_request("busy", [1], SamplingParams(max_tokens=10**6), asyncio.Queue())
            with pytest.raises(ValueError, match="'busy' is already in use"):
                client.add_request("busy", [1], SamplingParams(max_tokens=1), asyncio.Queue())
            # a rejection reaches every choice
            q2: asyncio.Queue = asyncio.Queue()
            client.add_request("bad", [999], SamplingParams(n=2, max_tokens=2), q2)
            errors = [await asyncio.wait_for(q2.get(), 10) for _ in range(2)]
            assert sorted(i for i, _ in errors) == [0, 1]
            assert all(isinstance(e, RequestError) and "999" in e.message for _, e in errors)
        finally:
            await client.shutdown()

    asyncio.run(main())


def test_late_errors_keep_their_status() -> None:
    """A request the engine ends with an error after accepting it (a grammar refused: 400; its
    compile worker dead: 500) reaches its queue as a RequestError with that status."""

    async def main() -> None:
        client = EngineClient(_config(), engine_factory=FakeEngine)
        await client.start()
        try:
            got = {}
            for rid, first in (("server", 777), ("client", 778)):
                q: asyncio.Queue = asyncio.Queue()
                client.add_request(rid, [first, 5], SamplingParams(max_tokens=3), q)
                got[rid] = (await asyncio.wait_for(q.get(), 10))[1]
            assert got["server"] == RequestError("server", "simulated late failure 500", 500)
            assert got["client"] == RequestError("client", "simulated late failure 400", 400)
            assert client.num_inflight == 0
        finally:
            await client.shutdown()

    asyncio.run(main())


def test_engine_crash_fails_inflight_requests() -> None:
    async def main() -> None:
        client = EngineClient(_config(), engine_factory=FakeEngine)
        info = await client.start()
        try:
            q: asyncio.Queue = asyncio.Queue()
            client.add_request("ok", [1], SamplingParams(max_tokens=10**6), q)
            await asyncio.wait_for(q.get(), 10)
            client.add_request("boom", [666], SamplingParams(max_tokens=5), asyncio.Queue())
            while True:
                _, item = await asyncio.wait_for(q.get(), 10)
                if not isinstance(item, EngineOutput):
                    break
            assert isinstance(item, EngineDeadError) and "simulated engine failure" in str(item), item
            assert not client.is_ready and client.dead_reason
            with pytest.raises(EngineDeadError):
                client.add_request("late", [1], SamplingParams(), asyncio.Queue())
        finally:
            await client.shutdown()
        assert not pid_alive(info.pid)

    asyncio.run(main())


def test_a_replicas_death_names_it_and_a_shutdown_names_no_replica() -> None:
    """A data-parallel replica's (``replica=1``) crash fails its requests with "replica 1: ...";
    a request still running when the server shuts down is failed with the bare shutdown reason,
    which no replica caused."""

    async def main() -> None:
        crashed = EngineClient(_config(), engine_factory=FakeEngine, replica=1)
        await crashed.start()
        try:
            q: asyncio.Queue = asyncio.Queue()
            crashed.add_request("ok", [1], SamplingParams(max_tokens=10**6), q)
            await asyncio.wait_for(q.get(), 10)
            crashed.add_request("boom", [666], SamplingParams(max_tokens=5), asyncio.Queue())
            item = (await _drain(q))[-1][1]
            assert isinstance(item, EngineDeadError) and str(item).startswith("replica 1: "), item
        finally:
            await crashed.shutdown()
        closed = EngineClient(_config(), engine_factory=FakeEngine, replica=1)
        await closed.start()
        q2: asyncio.Queue = asyncio.Queue()
        closed.add_request("running", [1], SamplingParams(max_tokens=10**6), q2)
        await asyncio.wait_for(q2.get(), 10)
        await closed.shutdown()
        item = (await _drain(q2))[-1][1]
        assert isinstance(item, EngineDeadError) and str(item) == "the server is shutting down", item

    asyncio.run(main())


def test_engine_start_failure_is_one_line() -> None:
    async def main() -> None:
        client = EngineClient(_config(), engine_factory=BrokenEngine, log_level=40)
        # the first line of the refusal, as the user reads it (no "ValueError: ", as a TP rank sends it)
        with pytest.raises(EngineStartError, match="^weights file is corrupt$") as info:
            await client.start()
        assert info.value.user_error

    asyncio.run(main())


def test_engine_out_of_memory_at_start_up_is_a_user_error() -> None:
    """An allocation that fails at start-up (a huge --num-kv-blocks or --max-num-seqs) is one line
    naming the sizing flags, a user error (exit code 2 for the CLI), not a traceback."""

    async def main() -> None:
        client = EngineClient(_config(), engine_factory=OutOfMemoryEngine, log_level=40)
        with pytest.raises(EngineStartError, match="^out of memory at start-up .*--num-kv-blocks") as info:
            await client.start()
        assert info.value.user_error and "\n" not in str(info.value)

    asyncio.run(main())


def test_engine_exits_when_parent_dies() -> None:
    script = textwrap.dedent(
        """
        import asyncio, os
        from surge.engine.client import EngineClient
        from tests.server.fake_engine import FakeEngine
        from tests.server.test_engine_client import _config

        async def main():
            client = EngineClient(_config(), engine_factory=FakeEngine)
            info = await client.start()
            print(info.pid, flush=True)
            os._exit(0)

        if __name__ == "__main__":
            asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    engine_pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while pid_alive(engine_pid):
        assert time.monotonic() < deadline, "the engine process outlived its parent"
        time.sleep(0.05)


def test_add_request_refuses_ids_that_do_not_match_n() -> None:
    """The engine loop's fan-out: n ids for n choices, else every id gets an error (never a guess);
    each id is routed back to the API process that sent it."""
    from surge.engine.core_proc import AddRequest, _add_request

    engine = FakeEngine(_config())
    errors: list[RequestError] = []
    client_of: dict[str, int] = {}
    _add_request(
        engine, AddRequest("p", [1], SamplingParams(n=3), None, 1, ["p-0", "p-1"]), errors, client_of
    )
    assert [e.request_id for e in errors] == ["p-0", "p-1"] and "n=3" in errors[0].message
    assert client_of == {"p-0": 1, "p-1": 1} and not engine.has_unfinished_requests()
    errors.clear()
    _add_request(
        engine, AddRequest("q", [1], SamplingParams(n=2, seed=5), None, 0, ["q-0", "q-1"]), errors, None
    )
    assert not errors and {rid: p.seed for rid, (_, p, _) in engine._reqs.items()} == {"q-0": 5, "q-1": 6}
    _add_request(engine, AddRequest("r", [1], SamplingParams(n=2)), errors, None)  # n=2 without ids
    assert [e.request_id for e in errors] == ["r"]


def test_engine_killed_is_reported_with_its_exit_code_when_a_send_finds_it_gone() -> None:
    """A request sent (or aborted) after the engine was killed (the kernel's OOM killer) fails
    with the engine's exit code, as the process watch reports it, not with the socket's
    "Resource temporarily unavailable" that the failed send saw first."""

    async def main() -> None:
        client = EngineClient(_config(), engine_factory=FakeEngine)
        info = await client.start()
        try:
            q: asyncio.Queue = asyncio.Queue()
            client.add_request("ok", [1], SamplingParams(max_tokens=10**6), q)
            await asyncio.wait_for(q.get(), 10)
            os.kill(info.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while pid_alive(info.pid) and time.monotonic() < deadline:
                time.sleep(0.01)  # not yielding: the process watch has not run yet
            time.sleep(0.2)  # the socket's I/O thread sees the peer gone
            late: asyncio.Queue = asyncio.Queue()
            client.add_request("late", [1], SamplingParams(max_tokens=5), late)
            _, item = await asyncio.wait_for(late.get(), 10)
            assert isinstance(item, EngineDeadError), item
            assert "exit code -9" in str(item) and "temporarily" not in str(item), item
            while True:
                _, item = await asyncio.wait_for(q.get(), 10)
                if not isinstance(item, EngineOutput):
                    break
            assert isinstance(item, EngineDeadError) and "exit code -9" in str(item), item
            assert client.dead_reason == "the engine process died (exit code -9)"
        finally:
            await client.shutdown()

    asyncio.run(main())
