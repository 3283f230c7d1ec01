"""The request field ``priority`` (vLLM's): a 400 naming it under the default fcfs policy, honoured
under ``surge serve --scheduling-policy priority`` (any 64-bit integer, lower first)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
INT64 = 2**63


def _body(path: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "Once upon a time"}]}
        if path == CHAT
        else {"prompt": "Once upon a time"}
    )
    return base | {"max_tokens": 3} | fields


def _post(srv: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


@pytest.fixture(scope="module")
def priority_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("priority"), "--scheduling-policy", "priority")
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.mark.parametrize("path", [CHAT, CMPL])
@pytest.mark.parametrize("priority", [1, -1, INT64 - 1])
def test_fcfs_server_refuses_a_priority_naming_the_flag(server: Server, path: str, priority: int) -> None:
    r = _post(server, path, _body(path, priority=priority))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "priority" and err["type"] == "invalid_request_error"
    assert err["message"] == (
        f"priority {priority} needs priority scheduling: this server schedules first come, first served "
        "(start it with --scheduling-policy priority), so priority must be 0"
    )
    assert _post(server, path, _body(path, priority=0)).status_code == 200


@pytest.mark.parametrize("path", [CHAT, CMPL])
@pytest.mark.parametrize("stream", [False, True])
def test_priority_server_honours_any_64_bit_priority(
    priority_server: Server, path: str, stream: bool
) -> None:
    for priority in (-(INT64), -3, 0, 7, INT64 - 1):
        r = _post(priority_server, path, _body(path, priority=priority, stream=stream))
        assert r.status_code == 200, (priority, r.text)
        if stream:
            assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text
        else:
            assert r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("path", [CHAT, CMPL])
@pytest.mark.parametrize("priority", [True, 1.5, "1", None, INT64, -(INT64) - 1])
def test_priority_must_be_a_64_bit_integer(priority_server: Server, path: str, priority: Any) -> None:
    """As vLLM's ``int`` field bounded to int64 (no bool, fraction, string or null; ``1.0`` is
    1, as for every count of the request: surge.server.protocol.JsonInt)."""
    r = _post(priority_server, path, _body(path, priority=priority))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "priority"


def test_priority_server_reports_the_policy_in_its_start_up_log(priority_server: Server) -> None:
    assert "scheduling policy priority" in priority_server.log()


def _waiting(srv: Server) -> float:
    """The engine's waiting requests, from /metrics (``surge:num_requests_waiting``)."""
    for line in httpx.get(srv.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("surge:num_requests_waiting{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no surge:num_requests_waiting in /metrics")


def _both_waited(srv: Server, tag: str) -> bool:
    """One round: a streamed blocker runs alone (``--max-num-seqs 1``, priority -100); ``A``
    (priority 5) then ``B`` (priority 1) are sent; once /metrics shows both waiting behind the
    blocker, the blocker is dropped (the client goes away: aborted). Returns False when the
    blocker ended before both were queued (the round proves nothing), else True once A and B
    are answered."""
    blocker = {"prompt": "The dog", "max_tokens": 480, "ignore_eos": True, "stream": True, "priority": -100}
    answers: dict[str, httpx.Response] = {}
    with httpx.stream("POST", srv.url + CMPL, json=blocker, timeout=120) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # the blocker runs
        threads = []
        for name, priority in (("A", 5), ("B", 1)):
            body = {"prompt": "Once upon a time", "max_tokens": 3, "priority": priority}
            headers = {"X-Request-Id": f"{tag}-{name}"}
            t = threading.Thread(
                target=lambda n=name, b=body, h=headers: answers.__setitem__(
                    n, httpx.post(srv.url + CMPL, json=b, headers=h, timeout=120)
                )
            )
            t.start()
            threads.append(t)
        both = False
        for line in lines:  # the blocker's events pace the polls; it ends by itself otherwise
            if line == "data: [DONE]":
                break
            if _waiting(srv) == 2:
                both = True
                break
    for t in threads:
        t.join(120)
    assert {n: r.status_code for n, r in answers.items()} == {"A": 200, "B": 200}
    return both


def test_priority_orders_requests_waiting_in_the_engine(tmp_path_factory: pytest.TempPathFactory) -> None:
    """End to end: the request field reaches the engine's queue. With one sequence at a time,
    B (priority 1) sent after A (priority 5) is served first once both wait."""
    srv = start_server(
        tmp_path_factory.mktemp("priority-order"), "--scheduling-policy", "priority", "--max-num-seqs", "1"
    )
    try:
        for attempt in range(5):
            tag = f"order{attempt}"
            if _both_waited(srv, tag):
                break
        else:
            raise AssertionError("the blocker never outlasted the sending of A and B")
        log = srv.log()
        done_a, done_b = log.index(f"request cmpl-{tag}-A done"), log.index(f"request cmpl-{tag}-B done")
        assert done_b < done_a, log[-3000:]
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]
