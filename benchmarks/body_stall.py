"""How long one client's large, valid request body freezes every other client's SSE stream.

Starts ``surge serve`` on CPU (a tiny random Qwen3 with the real Qwen3 tokenizer and chat
template from ``../shared/assets/models/qwen3-8b``, dummy weights), then for each body shape:

1. a streaming client (one long greedy completion, ``ignore_eos``) reads its ``data:`` events on
   one connection;
2. once it streams, another process sends ``--count`` bodies of that shape at once, each on its
   own connection (built before the clock starts, about ``--body-mb`` MB each, under the
   server's 4 MiB default body limit);
3. reported: the streaming client's largest gap between two events while the bodies were in
   flight (``max_gap_ms``; its idle gaps are a few ms), the bodies' status codes and durations.

Shapes (chat bodies to ``/v1/chat/completions``, the prompt to ``/v1/completions``):
``messages`` (many short chat messages), ``logit_bias`` (many keys), ``stop`` (a long stop
list), ``prompt`` (one huge prompt string), ``tools`` (many function tools with parameters),
``json_schema`` (a ``response_format`` schema with many properties). Each big request ends in a
4xx or 200; the measure is what its intake costs the others.

``--cprofile DIR`` runs the API process under cProfile (its event-loop thread only) and writes
one ``<shape>.prof`` per shape, from the first big body reaching the app to the last one's
answer (cProfile slows the process: read the shares, not the times).

Run from the repository root::

    .venv/bin/python benchmarks/body_stall.py --out /tmp/body_stall.json [--shapes messages,stop]
    .venv/bin/python benchmarks/body_stall.py --repo /tmp/before ...   # another checkout's server
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from surge.bench.launcher import ServerLauncher

REPO = Path(__file__).resolve().parents[1]
QWEN3 = REPO.parent / "shared" / "assets" / "models" / "qwen3-8b"
SHAPES = ("messages", "logit_bias", "stop", "prompt", "tools", "json_schema")
CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"


def _sized(build: Any, target: int) -> dict[str, Any]:
    """``build(n)`` with the ``n`` that makes its JSON about ``target`` bytes (two passes)."""
    n = 1000
    for _ in range(2):
        n = max(1, int(n * target / len(json.dumps(build(n)))))
    return build(n)


def body_of(shape: str, target: int) -> tuple[str, dict[str, Any]]:
    """The route and body of ``shape`` (see the module docstring), about ``target`` bytes."""
    user = [{"role": "user", "content": "Tell me a story."}]
    base = {"max_tokens": 16}
    if shape == "messages":
        roles = ("user", "assistant")
        return CHAT, _sized(
            lambda n: {**base, "messages": [{"role": roles[i % 2], "content": f"hi {i}"} for i in range(n)]},
            target,
        )
    if shape == "logit_bias":
        return CHAT, _sized(
            lambda n: {**base, "messages": user, "logit_bias": {str(i): 1.0 for i in range(n)}}, target
        )
    if shape == "stop":
        return CHAT, _sized(lambda n: {**base, "messages": user, "stop": [f"s{i}" for i in range(n)]}, target)
    if shape == "prompt":
        return CMPL, {**base, "prompt": "hello world " * (target // 12)}
    if shape == "tools":

        def tool(i: int) -> dict[str, Any]:
            props = {f"arg{j}": {"type": "string", "description": f"argument {j}"} for j in range(8)}
            params = {"type": "object", "properties": props, "required": ["arg0"]}
            return {
                "type": "function",
                "function": {"name": f"tool_{i}", "description": "a tool", "parameters": params},
            }

        return CHAT, _sized(
            lambda n: {**base, "messages": user, "tools": [tool(i) for i in range(n)]}, target
        )
    if shape == "json_schema":

        def with_schema(n: int) -> dict[str, Any]:
            schema = {"type": "object", "properties": {f"field_{i}": {"type": "integer"} for i in range(n)}}
            fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
            return {**base, "messages": user, "response_format": fmt}

        return CHAT, _sized(with_schema, target)
    raise ValueError(f"unknown shape {shape!r}")


# --------------------------------------------------------------------------------------------
# The big bodies' sender: its own process, so that building and sending them never delays the
# streaming client's reads.
# --------------------------------------------------------------------------------------------


def sender(base: str, shape: str, count: int, target: int) -> None:
    """Build ``count`` bodies of ``shape``, print "ready", wait for a line on stdin, send them at
    once (one connection each), print each one's status and time.monotonic() span as JSON."""
    import aiohttp

    route, body = body_of(shape, target)
    data = json.dumps(body).encode()
    print("ready", len(data), flush=True)
    sys.stdin.readline()

    async def one(session: aiohttp.ClientSession) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            async with session.post(
                base + route, data=data, headers={"content-type": "application/json"}
            ) as r:
                text = await r.read()
                status: int | str = r.status
        except Exception as e:  # a dropped connection is a result too
            status, text = type(e).__name__, b""
        msg = ""
        if status != 200:
            try:
                msg = json.loads(text)["error"]["message"][:160]
            except (ValueError, KeyError, TypeError):
                msg = text[:160].decode(errors="replace")
        return {"status": status, "start": t0, "end": time.monotonic(), "message": msg}

    async def all_of() -> list[dict[str, Any]]:
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=300)) as s:
            return await asyncio.gather(*(one(s) for _ in range(count)))

    print(json.dumps({"bytes": len(data), "results": asyncio.run(all_of())}), flush=True)


# --------------------------------------------------------------------------------------------
# The streaming client and one measurement.
# --------------------------------------------------------------------------------------------


async def measure(base: str, shape: str, count: int, target: int, idle_s: float) -> dict[str, Any]:
    """One shape: the streaming client's gaps alone (``idle_s``) and while ``count`` bodies run."""
    import aiohttp

    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "_send", base, shape, str(count), str(target),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    ready = (await proc.stdout.readline()).split()
    if not ready or ready[0] != b"ready":
        raise RuntimeError("the sender failed to start")
    events: list[float] = []
    body = {
        "prompt": "Once upon a time",
        "max_tokens": 3000,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def stream() -> None:
            async with session.post(base + CMPL, json=body) as resp:
                assert resp.status == 200, await resp.text()
                async for line in resp.content:
                    if line.startswith(b"data:"):
                        events.append(time.monotonic())

        task = asyncio.create_task(stream())
        while len(events) < 5:
            await asyncio.sleep(0.01)
        await asyncio.sleep(idle_s)
        idle = list(events)
        await asyncio.sleep(0.01)
        urllib_post(base + "/_stall/profile/on")  # with --cprofile only
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        out, _ = await proc.communicate()
        urllib_post(base + "/_stall/profile/off?shape=" + shape)
        await asyncio.sleep(0.3)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await task
    sent = json.loads(out)
    results = sent["results"]
    start = min(r["start"] for r in results)
    end = max(r["end"] for r in results)
    idle_gaps = [b - a for a, b in zip(idle, idle[1:], strict=False)]
    gaps = [(b - a, b) for a, b in zip(events, events[1:], strict=False) if b >= start and a <= end]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    return {
        "shape": shape,
        "count": count,
        "body_bytes": sent["bytes"],
        "idle_max_gap_ms": round(1000 * max(idle_gaps, default=0.0), 1),
        "max_gap_ms": round(1000 * max((g for g, _ in gaps), default=0.0), 1),
        "events_during": len(gaps),
        "statuses": statuses,
        "seconds": round(end - start, 3),
        "message": next((r["message"] for r in results if r["message"]), ""),
    }


def urllib_post(url: str) -> bool:
    """POST to the profiling hook of a server started with ``--cprofile`` (False when absent)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30) as r:
            return r.status == 200
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# The server.
# --------------------------------------------------------------------------------------------


def tiny_qwen3(path: Path) -> Path:
    """A 2-layer Qwen3 of hidden size 32 with the real Qwen3 tokenizer and chat template."""
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "bos_token_id": 151643,
        "eos_token_id": 151645, "torch_dtype": "float32",
    }  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    for f in QWEN3.iterdir():
        if f.name != "config.json":
            shutil.copy(f, path / f.name)
    return path


def serve_profiled(argv: list[str]) -> int:
    """``surge serve`` (argv: ``PROFILE_DIR`` then its flags) with ``POST /_stall/profile/on``
    and ``/off?shape=NAME``: cProfile of the event-loop thread in between, into ``NAME.prof``."""
    import cProfile

    out_dir, rest = Path(argv[0]), argv[1:]
    sys.path.insert(0, os.environ.get("PYTHONPATH", ""))
    import surge.cli
    import surge.server.api_server as api_server

    build_app = api_server.build_app
    profiler = cProfile.Profile()

    def profiled_build_app(*args: Any, **kwargs: Any) -> Any:
        app = build_app(*args, **kwargs)

        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and path.startswith("/_stall/profile/"):
                if path.endswith("/on"):
                    profiler.enable()
                else:
                    profiler.disable()
                    shape = scope["query_string"].decode().removeprefix("shape=")
                    profiler.dump_stats(out_dir / f"{shape}.prof")
                    profiler.clear()
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"{}"})
                return
            await app(scope, receive, send)

        return asgi

    api_server.build_app = profiled_build_app
    return surge.cli.main(["serve", *rest])


def start_server(repo: Path, model: Path, port: int, log: Path, profile: Path | None) -> ServerLauncher:
    """``surge serve`` of ``repo`` (the working directory is changed to it, so that its ``surge``
    is the one imported) on the tiny model, started and waited for by the benchmark's own
    :class:`~surge.bench.launcher.ServerLauncher`; with ``profile``, the API process's event loop
    is profiled into that folder.

    Raises:
        ValueError: the server exits during start-up or is not healthy within 300 s.
    """
    flags = [
        "--model", str(model), "--device", "cpu", "--load-format", "dummy", "--port", str(port),
        "--max-model-len", "8192", "--num-kv-blocks", "1024", "--log-interval", "3600", "--disable-web-ui",
        "--tool-call-parser", "hermes",
    ]  # fmt: skip
    os.environ.update(PYTHONPATH=str(repo), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    os.chdir(repo)
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "_serve", str(profile.resolve()), *flags]
    else:
        cmd = [sys.executable, "-m", "surge.cli", "serve", *flags]
    server = ServerLauncher(shlex.join(cmd), f"http://127.0.0.1:{port}", 300.0, log)
    server.start()
    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_send":
        sender(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        return serve_profiled(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout to serve from (default: this one)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--count", type=int, default=1, help="bodies sent at once per shape")
    ap.add_argument("--body-mb", type=float, default=3.9, help="each body's size in MB (10^6 bytes)")
    ap.add_argument("--repeats", type=int, default=1, help="measurements per shape")
    ap.add_argument("--idle-s", type=float, default=1.0, help="seconds streamed alone before the bodies")
    ap.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    ap.add_argument("--cprofile", type=Path, help="folder for one cProfile file per shape (API process)")
    ap.add_argument("--out", type=Path, help="result JSON")
    ap.add_argument("--label", default=None, help="label stored in the result (default: the commit)")
    args = ap.parse_args()
    repo = args.repo.resolve()
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r} (choose from {', '.join(SHAPES)})")
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    port = args.port or _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="body-stall-"))
    model = tiny_qwen3(tmp / "model")
    log = tmp / "serve.log"
    out = args.out.resolve() if args.out is not None else None
    cprofile = args.cprofile.resolve() if args.cprofile is not None else None
    server = start_server(repo, model, port, log, cprofile)
    rows = []
    try:
        base = f"http://127.0.0.1:{port}"
        for shape in shapes:
            for _ in range(args.repeats):
                row = asyncio.run(measure(base, shape, args.count, int(args.body_mb * 1e6), args.idle_s))
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        server.stop(grace_s=30.0)
        shutil.rmtree(tmp / "model", ignore_errors=True)
    result = {"label": args.label or commit, "commit": commit, "cpu_count": os.cpu_count(), "rows": rows}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
