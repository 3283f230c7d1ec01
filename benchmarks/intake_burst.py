"""Intake cost of a burst in the API process: `surge bench matrix`'s C64/I32/O256 point on CPU.

The real API server (``run_server``: uvicorn, FastAPI, validation, chat template, tokenizer,
the ZMQ engine client) runs over an engine process whose engine is host_ceiling's
:class:`PacedEngine` (no model: one token per running request every ``--step-ms``), so the
engine is never the bottleneck. A client process sends what ``surge bench serve`` sends (its
``random_requests`` prompts of exactly ``--input-len`` templated tokens, ``build_payload``'s
body: chat, ``max_completion_tokens``, ``stream_options.include_usage``, ``ignore_eos``) as
``--bursts`` bursts of ``--concurrency`` requests at once, each burst on a fresh session as
each matrix point is.

The API process is instrumented from the outside (nothing in ``surge/`` changes): per request
it records (``time.monotonic``, one clock for every process of the host)

- ``asgi``: uvicorn hands the request to the app (headers parsed);
- ``handler``: ``create_chat_completion`` starts (body read, parsed and validated);
- ``added``: ``EngineClient.add_request`` has sent it to the engine;
- ``engine_first``: the engine's first token (``EngineOutput.first_token_time``);
- ``first_sent``: the first SSE ``data:`` chunk is handed to uvicorn.

and the client records each request's start and TTFT. Reported per burst: the spread of
``added`` over the burst and its mean gap (the per-request intake cost of the event loop),
``added - asgi`` per request, the forwarding delay ``first_sent - engine_first`` and the
client's TTFT. ``--cprofile FILE`` profiles the API process's event loop over the last burst
(cProfile, which slows it down: read the shares, not the times), from the burst's first
request reaching the app to its last one sent to the engine.

Run from the repository root::

    .venv/bin/python benchmarks/intake_burst.py --bursts 5 [--json] [--cprofile /tmp/intake.prof]
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.host_ceiling import DEFAULT_MODEL, cpu_seconds, free_port, stop, wait_port  # noqa: E402

_RECORD: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("intake", default=None)
_CHAT = "/v1/chat/completions"


class StampedPacedEngine:
    """host_ceiling's :class:`PacedEngine` whose first output of each request carries its
    ``first_scheduled_time`` and ``first_token_time`` (as the real engine's do)."""

    def __init__(self, config: Any, step_us: int) -> None:
        from benchmarks.host_ceiling import PacedEngine

        self._engine = PacedEngine(config, step_us)
        self._stamped: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def step(self) -> list[Any]:
        t = time.monotonic()
        outs = self._engine.step()
        now = time.monotonic()
        for out in outs:
            if out.request_id not in self._stamped:
                self._stamped.add(out.request_id)
                out.first_scheduled_time, out.first_token_time = t, now
            if out.finish_reason is not None:
                self._stamped.discard(out.request_id)
        return outs


# --------------------------------------------------------------------------------------------
# The server process: surge serve over a paced engine, with timestamps per request.
# --------------------------------------------------------------------------------------------


def _instrument(records: list[dict[str, Any]], profile_path: str | None, profile_burst: int) -> None:
    """Patch the API process's stages to stamp ``records`` (see the module docstring) and add
    ``GET /_intake`` (the records so far, then cleared) and ``POST /_intake/profile/{on,off}``."""
    import cProfile

    import surge.server.api_server as api_server
    from surge.engine.client import EngineClient
    from surge.server.generation import Generation

    profiler = cProfile.Profile() if profile_path else None
    # the profiled window: from the first request of the armed burst reaching the app to the
    # moment ``window["of"]`` of them have been sent to the engine
    window: dict[str, Any] = {"armed": False, "added": 0, "of": profile_burst}

    build_app = api_server.build_app

    def timed_build_app(*args: Any, **kwargs: Any) -> Any:
        app = build_app(*args, **kwargs)

        @app.get("/_intake")
        async def intake() -> list[dict[str, Any]]:
            out = list(records)
            records.clear()
            return out

        @app.post("/_intake/profile/{what}")
        async def profile(what: str) -> dict[str, bool]:
            window["armed"] = what == "on"
            if what == "off" and profiler is not None and profile_path is not None:
                profiler.disable()
                profiler.dump_stats(profile_path)
            return {"ok": True}

        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["path"] != _CHAT:
                await app(scope, receive, send)
                return
            if window["armed"] and profiler is not None:
                window["armed"] = False
                window["added"] = 0
                profiler.enable()
            rec: dict[str, Any] = {"asgi": time.monotonic()}
            records.append(rec)
            _RECORD.set(rec)

            async def timed_send(message: Any) -> None:
                if "first_sent" not in rec and message.get("body", b"").startswith(b"data: {"):
                    rec["first_sent"] = time.monotonic()
                await send(message)

            await app(scope, receive, timed_send)

        return asgi

    api_server.build_app = timed_build_app

    create = api_server.create_chat_completion

    async def timed_create(state: Any, body: Any, request: Any) -> Any:
        rec = _RECORD.get()
        if rec is not None:
            rec["handler"] = time.monotonic()
        return await create(state, body, request)

    api_server.create_chat_completion = timed_create

    add_request = EngineClient.add_request

    def timed_add(self: Any, request_id: str, *args: Any, **kwargs: Any) -> None:
        add_request(self, request_id, *args, **kwargs)
        window["added"] += 1
        if window["added"] == window["of"] and profiler is not None:
            profiler.disable()
        rec = _RECORD.get()
        if rec is not None:
            rec["added"] = time.monotonic()
            rec["id"] = request_id

    EngineClient.add_request = timed_add  # type: ignore[method-assign]

    on_output = Generation._on_output

    def timed_on_output(self: Any, choice: Any, out: Any, now: float) -> Any:
        rec = _RECORD.get()
        if rec is not None and "engine_first" not in rec and out.first_token_time is not None:
            rec["engine_first"] = out.first_token_time
            rec["first_out"] = now
        return on_output(self, choice, out, now)

    Generation._on_output = timed_on_output  # type: ignore[method-assign]


def serve(argv: list[str]) -> int:
    """``surge serve`` over a :class:`PacedEngine`, instrumented (argv: ``--step-us N
    [--cprofile FILE]`` then surge serve flags)."""
    import functools

    ap = argparse.ArgumentParser()
    ap.add_argument("--step-us", type=int, required=True)
    ap.add_argument("--cprofile")
    ap.add_argument("--concurrency", type=int, default=64)
    own, rest = ap.parse_known_args(argv)
    import surge.cli
    import surge.server.api_server as api_server

    _instrument([], own.cprofile, own.concurrency)
    factory = functools.partial(StampedPacedEngine, step_us=own.step_us)
    api_server.run_server = functools.partial(api_server.run_server, engine_factory=factory)  # type: ignore[assignment]
    return surge.cli.main(["serve", *rest])


# --------------------------------------------------------------------------------------------
# The client process: surge bench serve's requests, in bursts.
# --------------------------------------------------------------------------------------------


def client(url: str, model: str, concurrency: int, input_len: int, output_len: int, bursts: int) -> None:
    """Send ``bursts`` bursts; print one JSON line per burst (start and TTFT of each request)."""
    from surge.bench.client import RequestInput
    from surge.bench.datasets import random_requests
    from surge.bench.serve import run_async, run_requests
    from surge.bench.tokens import HFTokenCounter

    counter = HFTokenCounter(model)
    api_url = f"{url}{_CHAT}"
    warm = [RequestInput(api_url, model, "warm up", 4, 4)]
    for b in range(bursts):
        samples = random_requests(counter, concurrency, input_len, output_len, seed=b, chat=True)
        inputs = [
            RequestInput(api_url, model, s.prompt, s.prompt_len, s.expected_output_len) for s in samples
        ]
        results, duration, _ = run_async(
            run_requests(inputs, warm, concurrency, float("inf"), 1.0, 0, 600.0, disable_tqdm=True)
        )
        errors = [r.error for r in results if not r.success]
        print(
            json.dumps(
                {
                    "starts": [r.start_time for r in results],
                    "ttfts": [r.ttft for r in results],
                    "prompt_lens": [r.prompt_len for r in results],
                    "output_lens": [r.output_len for r in results],
                    "duration_s": duration,
                    "errors": errors[:3],
                }
            ),
            flush=True,
        )


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


def _get(url: str, method: str = "GET") -> Any:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _ms(x: float) -> float:
    return round(1e3 * x, 2)


def summarize(burst: dict[str, Any], recs: list[dict[str, Any]], api_cpu_s: float) -> dict[str, Any]:
    """One burst's figures (ms) from the client's and the server's timestamps."""
    starts, ttfts = burst["starts"], burst["ttfts"]
    t0 = min(starts)
    recs = [r for r in recs if "added" in r and r["asgi"] >= t0]  # not the warm-up request
    added = sorted(r["added"] for r in recs)
    intake = sorted(r["added"] - r["asgi"] for r in recs)
    to_handler = sorted(r["handler"] - r["asgi"] for r in recs)
    wake = sorted(r["first_out"] - r["engine_first"] for r in recs if "first_out" in r)
    fwd = sorted(
        r["first_sent"] - r["engine_first"] for r in recs if "first_sent" in r and "engine_first" in r
    )
    engine_ttft = sorted(r["engine_first"] - r["asgi"] for r in recs if "engine_first" in r)
    return {
        "requests": len(recs),
        "errors": burst["errors"],
        "client_send_spread_ms": _ms(max(starts) - t0),
        "asgi_first_ms": _ms(min(r["asgi"] for r in recs) - t0),
        "asgi_spread_ms": _ms(max(r["asgi"] for r in recs) - min(r["asgi"] for r in recs)),
        "added_first_ms": _ms(added[0] - t0),
        "added_last_ms": _ms(added[-1] - t0),
        "added_spread_ms": _ms(added[-1] - added[0]),
        "added_gap_ms": _ms((added[-1] - added[0]) / max(1, len(added) - 1)),
        "asgi_to_handler_median_ms": _ms(statistics.median(to_handler)),
        "asgi_to_added_median_ms": _ms(statistics.median(intake)),
        "asgi_to_added_max_ms": _ms(intake[-1]),
        "asgi_to_engine_first_token_median_ms": _ms(statistics.median(engine_ttft)) if engine_ttft else None,
        "engine_to_handler_median_ms": _ms(statistics.median(wake)) if wake else None,
        "forward_delay_median_ms": _ms(statistics.median(fwd)) if fwd else None,
        "forward_delay_max_ms": _ms(fwd[-1]) if fwd else None,
        "ttft_min_ms": _ms(min(ttfts)),
        "ttft_median_ms": _ms(statistics.median(ttfts)),
        "ttft_mean_ms": _ms(statistics.fmean(ttfts)),
        "ttft_max_ms": _ms(max(ttfts)),
        "api_cpu_s": round(api_cpu_s, 3),
        "burst_s": round(burst["duration_s"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="model folder (tokenizer + config)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--bursts", type=int, default=5, help="bursts per server (the first is a warm-up)")
    ap.add_argument("--step-ms", type=float, default=6.0, help="the paced engine's step period")
    ap.add_argument("--log", default="/tmp/intake_burst_server.log")
    ap.add_argument("--cprofile", help="cProfile the API process over the last burst into this file")
    ap.add_argument("--json", action="store_true", help="also print each burst's figures as JSON")
    ap.add_argument(
        "--serve-flags",
        default="",
        help="more `surge serve` flags, one string (e.g. '--enable-log-requests')",
    )
    args = ap.parse_args()

    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    flags = [
        "--model", args.model, "--device", "cpu", "--load-format", "dummy", "--port", str(port),
        "--max-num-seqs", str(args.concurrency), "--num-kv-blocks", "4096", "--log-interval", "3600",
        "--disable-web-ui", "--stream-interval", "1",
    ]  # fmt: skip
    flags += args.serve_flags.split()
    own = ["--step-us", str(int(args.step_ms * 1000)), "--concurrency", str(args.concurrency)]
    own += ["--cprofile", args.cprofile] if args.cprofile else []
    with open(args.log, "wb") as log:
        srv = subprocess.Popen(
            [sys.executable, __file__, "_serve", *own, *flags], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_port(port, srv)
        while True:
            try:
                _get(f"{url}/v1/models")
                break
            except OSError:
                time.sleep(0.2)
        cmd = [sys.executable, __file__, "_client", url, args.model, str(args.concurrency)]
        cmd += [str(args.input_len), str(args.output_len), str(args.bursts)]
        cli = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
        assert cli.stdout is not None
        rows = []
        cpu0 = cpu_seconds(srv.pid)
        for b in range(args.bursts):
            if args.cprofile and b == args.bursts - 1:
                _get(f"{url}/_intake/profile/on", "POST")  # armed before the last burst is sent
            line = cli.stdout.readline()
            if not line:
                raise RuntimeError("the client ended early")
            burst = json.loads(line)
            cpu1 = cpu_seconds(srv.pid)
            if args.cprofile and b == args.bursts - 1:
                _get(f"{url}/_intake/profile/off", "POST")
            recs = _get(f"{url}/_intake")
            row = summarize(burst, recs, cpu1 - cpu0)
            cpu0 = cpu_seconds(srv.pid)
            rows.append(row)
            print(
                f"burst {b}: sent over {row['client_send_spread_ms']} ms; first in app at {row['asgi_first_ms']} ms; reached the engine "
                f"{row['added_first_ms']}..{row['added_last_ms']} ms (one every {row['added_gap_ms']} ms); "
                f"asgi->engine median {row['asgi_to_added_median_ms']} ms; forward delay median "
                f"{row['forward_delay_median_ms']} max {row['forward_delay_max_ms']} ms; TTFT min "
                f"{row['ttft_min_ms']} median {row['ttft_median_ms']} max {row['ttft_max_ms']} ms",
                flush=True,
            )
            if args.json:
                print(json.dumps(row), flush=True)
        cli.wait(60)
    finally:
        stop(srv)
    measured = rows[1:] or rows
    keys = ("added_spread_ms", "added_gap_ms", "asgi_to_added_median_ms", "ttft_min_ms", "ttft_median_ms")
    keys += ("ttft_mean_ms", "ttft_max_ms", "forward_delay_median_ms", "api_cpu_s")
    print("median over bursts 1..:", {k: statistics.median(r[k] for r in measured) for k in keys})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        sys.exit(serve(sys.argv[2:]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_client":
        a = sys.argv[2:]
        client(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]))
    else:
        main()
