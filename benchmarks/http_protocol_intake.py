"""CPU per request of the guarded httptools protocol's intake, against uvicorn's own protocol.

A request's HTTP intake in the API process is one ``data_received`` (llhttp parses the head and
the body, the protocol's callbacks build the ASGI scope and the request/response cycle) and, once
answered, one ``on_response_complete``. This tool times exactly that, on a mock transport, with
the app's task not started (so nothing else runs): per request, the CPU microseconds of
``data_received`` plus ``on_response_complete`` for a chat completion POST as ``surge bench
serve`` sends it (5 headers) or with the ``openai`` SDK's ``X-Stainless-*`` and ``Authorization``
headers too (``--openai-headers``: 13). The end-to-end benchmarks (``host_ceiling.py api``,
``intake_burst.py``) spend 0.5 s of API CPU per burst of 64 requests, so a per-request
difference of a microsecond is far below their noise; this one sees it.

Run from the repository root::

    .venv/bin/python benchmarks/http_protocol_intake.py [--compare OTHER/surge/server/http_protocol.py]

``--compare`` also times another checkout's ``http_protocol.py`` (e.g. a worktree at an older
commit), interleaved with this one's, run after run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BODY = (
    b'{"model":"m","messages":[{"role":"user","content":"' + b"hello " * 30 + b'"}],'
    b'"max_completion_tokens":256,"stream":true,"stream_options":{"include_usage":true}}'
)
HEADERS = b"Host: 127.0.0.1:8000\r\nUser-Agent: aiohttp\r\nAccept: */*\r\nContent-Type: application/json\r\n"
OPENAI_HEADERS = HEADERS + (
    b"X-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.0\r\nX-Stainless-OS: Linux\r\n"
    b"X-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\nX-Stainless-Runtime-Version: 3.11\r\n"
    b"Authorization: Bearer x\r\nX-Stainless-Retry-Count: 0\r\n"
)


class _Transport(asyncio.Transport):
    """A transport that drops what is written and reports a fixed pair of addresses."""

    def __init__(self) -> None:
        super().__init__()
        self._closing = False

    def write(self, data: Any) -> None:
        pass

    def close(self) -> None:
        self._closing = True

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)


async def _app(scope: Any, receive: Any, send: Any) -> None:
    pass


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def us_per_request(protocol_class: type[Any], request: bytes, requests: int) -> float:
    """CPU microseconds per request of ``data_received(request)`` and ``on_response_complete``
    on one keep-alive connection of ``protocol_class``, over ``requests`` requests."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    loop = asyncio.new_event_loop()
    config = Config(_app, lifespan="off", log_config=None)
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    protocol._start_asgi_task = lambda cycle, app: None  # the app never runs: intake alone
    protocol.connection_made(_Transport())
    start = time.process_time()
    for _ in range(requests):
        protocol.data_received(request)
        protocol.cycle.response_complete = True
        protocol.on_response_complete()
    elapsed = time.process_time() - start
    protocol._unset_keepalive_if_required()
    if hasattr(protocol, "_cancel_header_timer"):  # the guarded protocols' header clock
        protocol._cancel_header_timer()
    loop.close()
    return elapsed / requests * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--compare", type=Path, help="another checkout's surge/server/http_protocol.py, timed too"
    )
    ap.add_argument(
        "--openai-headers", action="store_true", help="13 headers, as the openai SDK sends (default: 5)"
    )
    ap.add_argument("--requests", type=int, default=20000, help="requests per run (default 20000)")
    ap.add_argument("--runs", type=int, default=9, help="runs of each protocol, interleaved (default 9)")
    args = ap.parse_args()
    if args.compare is not None and not args.compare.is_file():
        ap.error(f"--compare {args.compare}: no such file")
    if args.requests < 1 or args.runs < 1:
        ap.error("--requests and --runs must be at least 1")
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from surge.server.http_protocol import guarded_httptools_protocol

    head = OPENAI_HEADERS if args.openai_headers else HEADERS
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\n" + head + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
    )
    protocols: dict[str, type[Any]] = {
        "uvicorn": HttpToolsProtocol,
        "this checkout": guarded_httptools_protocol(10.0, 4096, 60.0),
    }
    if args.compare is not None:
        other = _load(args.compare, "compared_http_protocol")
        try:
            protocols[str(args.compare)] = other.guarded_httptools_protocol(10.0, 4096, 60.0)
        except TypeError:  # a checkout from before the body drain timeout
            protocols[str(args.compare)] = other.guarded_httptools_protocol(10.0, 4096)
    runs: dict[str, list[float]] = {name: [] for name in protocols}
    for _ in range(args.runs):
        for name, protocol_class in protocols.items():
            runs[name].append(us_per_request(protocol_class, request, args.requests))
    print(
        f"{len(request)}-byte request, {request.count(b': ')} headers; CPU us per request, median of {args.runs}:"
    )
    for name, values in runs.items():
        print(f"  {statistics.median(values):7.2f}  {name}  ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
