"""The request's log line splits its time to first token: to the engine, in the engine, back."""

from __future__ import annotations

import re
import time

import httpx

from tests.server.conftest import Server

_SPLIT = re.compile(
    r"request cmpl-ttft-split-(\d) done: .*; first token at ([\d.]+) ms = ([\d.]+) to the engine's "
    r"first schedule \+ ([\d.]+) in the engine \+ ([\d.]+) back"
)


def test_first_token_split_is_logged_and_adds_up(server: Server) -> None:
    for i, stream in enumerate((False, True)):
        r = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": [5, 6, 7, 8] * 10, "max_tokens": 3, "ignore_eos": True, "stream": stream},
            headers={"X-Request-Id": f"ttft-split-{i}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while len(_SPLIT.findall(server.log())) < 2:
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.05)
    for _, total, to_engine, in_engine, back in _SPLIT.findall(server.log()):
        parts = [float(to_engine), float(in_engine), float(back)]
        assert all(p >= 0 for p in parts) and float(in_engine) > 0
        assert abs(sum(parts) - float(total)) < 0.25  # each part rounded to 0.1 ms
