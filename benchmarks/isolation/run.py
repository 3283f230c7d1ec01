"""Isolation benchmark: a canary stream's gaps while a fixed mix of hostile requests runs.

Starts ``surge serve`` (bundled stories260K on CPU) from ``--repo``, runs a canary: back-to-back
streaming completions, recording the time between consecutive ``data:`` events of a stream.
First the canary runs alone (``idle``), then alongside the hostile mix (``hostile``), sent one
after another while two slow clients (headers trickled, body never finished) hold connections:

- a streaming and a non-streaming request with 100,000 stop strings;
- a 10 MB prompt, a 10 MB ``/tokenize``, a 3 MB prompt, a 3 MB ``/tokenize``, 1M prompt token ids;
- JSON nested 100,000 deep; lone surrogates in prompt, stop, model, a chat role, ``/tokenize``;
- ``2**70`` in every numeric field;
- a JSON schema whose ``pattern`` repeats 20,000 times (xgrammar needs about 30 s for it), a 3.6 MB
  bad word, 256 bad words of about 1,000 characters each, and those with ``n: 128``.

The result JSON has the canary's gap percentiles in each phase (milliseconds) and each hostile
request's status and duration. Usage (from the repository root)::

    python benchmarks/isolation/run.py --out benchmarks/isolation/results/after.json
    git worktree add /tmp/before 3983ef2
    python benchmarks/isolation/run.py --repo /tmp/before --out benchmarks/isolation/results/before.json

The CI test ``tests/server/test_isolation.py`` runs the same mix against a server it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

NUMERIC_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "min_tokens",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


@dataclass
class Canary:
    """Back-to-back streaming completions; ``gaps`` are seconds between data events of one stream."""

    url: str
    max_tokens: int = 400
    gaps: list[float] = field(default_factory=list)
    gap_times: list[float] = field(default_factory=list)  # time.monotonic() at each gap's end
    ttfts: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    streams: int = 0
    _stop: bool = False

    async def run(self, session: aiohttp.ClientSession) -> None:
        body = {
            "prompt": "Once upon a time",
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
        }
        while not self._stop:
            t0 = time.monotonic()
            last: float | None = None
            try:
                async with session.post(self.url + "/v1/completions", json=body) as resp:
                    if resp.status != 200:
                        self.errors.append(f"HTTP {resp.status}")
                        await asyncio.sleep(0.1)
                        continue
                    async for line in resp.content:
                        if not line.startswith(b"data:"):
                            continue  # blank lines and SSE comments
                        now = time.monotonic()
                        if last is None:
                            self.ttfts.append(now - t0)
                        else:
                            self.gaps.append(now - last)
                            self.gap_times.append(now)
                        last = now
                self.streams += 1
            except (TimeoutError, aiohttp.ClientError) as e:
                self.errors.append(f"{type(e).__name__}: {e}")

    def stop(self) -> None:
        self._stop = True

    def take(self) -> tuple[list[float], list[float]]:
        """The gaps and TTFTs recorded so far; the lists start empty again."""
        gaps, ttfts = self.gaps, self.ttfts
        self.gaps, self.ttfts, self.gap_times = [], [], []
        return gaps, ttfts

    def max_gap_during(self, start: float, end: float) -> float:
        """The largest gap (seconds) that overlaps ``[start, end]`` (time.monotonic() times, the same clock in every process)."""
        return max(
            (g for g, t in zip(self.gaps, self.gap_times, strict=True) if t >= start and t - g <= end),
            default=0.0,
        )


def summary(values: list[float]) -> dict[str, float | int]:
    """Count, median, P99 and max of ``values`` (seconds) in milliseconds."""
    if not values:
        return {"n": 0}
    a = np.asarray(values) * 1000.0
    return {
        "n": len(values),
        "p50_ms": round(float(np.percentile(a, 50)), 2),
        "p99_ms": round(float(np.percentile(a, 99)), 2),
        "max_ms": round(float(a.max()), 2),
    }


async def _post(session: aiohttp.ClientSession, url: str, data: bytes, stream: bool = False) -> int:
    async with session.post(url, data=data, headers={"content-type": "application/json"}) as resp:
        if stream:
            async for _ in resp.content:
                pass
        else:
            await resp.read()
        return resp.status


def hostile_mix(base: str) -> list[tuple[str, str, bytes, bool]]:
    """The fixed hostile requests as (name, url, body bytes, streamed), built before anything runs."""
    cmpl, chat, tok = base + "/v1/completions", base + "/v1/chat/completions", base + "/tokenize"
    stops = [f"stop-{i}" for i in range(100_000)]
    slow_schema = {"type": "string", "pattern": "[a-z]{1,20000}"}  # xgrammar: about 30 s to build
    long_words = [f"{i} " + "hello world " * 83 for i in range(256)]  # 256 words of about 1,000 characters

    def js(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    mix = [
        (
            "stop_list_100k_stream",
            cmpl,
            js({"prompt": "Once", "max_tokens": 64, "stop": stops, "stream": True}),
            True,
        ),
        ("stop_list_100k", cmpl, js({"prompt": "Once", "max_tokens": 64, "stop": stops}), False),
        ("prompt_10mb", cmpl, js({"prompt": "a " * 5_000_000, "max_tokens": 4}), False),
        ("tokenize_10mb", tok, js({"prompt": "a " * 5_000_000}), False),
        ("prompt_3mb", cmpl, js({"prompt": "hello world " * 250_000, "max_tokens": 4}), False),
        ("tokenize_3mb", tok, js({"prompt": "hello world " * 250_000}), False),
        ("prompt_1m_token_ids", cmpl, js({"prompt": [5] * 1_000_000, "max_tokens": 4}), False),
        ("nesting_100k", cmpl, b'{"prompt": "x", "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", False),
        ("surrogate_prompt", cmpl, b'{"prompt": "\\ud800", "max_tokens": 4}', False),
        ("surrogate_stop", cmpl, b'{"prompt": "x", "max_tokens": 4, "stop": ["\\udc00"]}', False),
        ("surrogate_model", cmpl, b'{"prompt": "x", "max_tokens": 4, "model": "\\ud800"}', False),
        (
            "surrogate_role",
            chat,
            b'{"messages": [{"role": "\\ud800", "content": "hi"}], "max_tokens": 4}',
            False,
        ),
        ("surrogate_tokenize", tok, b'{"prompt": "a\\udfff"}', False),
        (
            "schema_pattern_20k",
            cmpl,
            js({"prompt": "x", "max_tokens": 4, "structured_outputs": {"json": slow_schema}}),
            False,
        ),
        (
            "bad_words_3mb",
            cmpl,
            js({"prompt": "x", "max_tokens": 4, "bad_words": ["hello world " * 300_000]}),
            False,
        ),
        ("bad_words_256x1k", cmpl, js({"prompt": "x", "max_tokens": 4, "bad_words": long_words}), False),
        (
            "n128_bad_words_256x1k",
            cmpl,
            js({"prompt": "x", "max_tokens": 4, "n": 128, "bad_words": long_words}),
            False,
        ),
    ]
    for name in NUMERIC_FIELDS:
        mix.append((f"huge_{name}", cmpl, js({"prompt": "Once", "max_tokens": 4, name: 2**70}), False))
    return mix


async def _send_mix(mix: list[tuple[str, str, bytes, bool]]) -> list[dict[str, Any]]:
    """Send the mix one request after another; each result has the status and time.monotonic() times."""
    actions = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for name, url, data, stream in mix:
            t0 = time.monotonic()
            try:
                status: int | str = await _post(session, url, data, stream)
            except Exception as e:  # a dropped connection is a result too
                status = type(e).__name__
            actions.append({"name": name, "status": status, "start": t0, "end": time.monotonic()})
    return actions


async def slow_headers(host: str, port: int, seconds: float) -> str:
    """Trickle request headers one line per second; return how the server ended it."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < seconds:
            writer.write(b"X-Slow: 1\r\n")
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(64), 1.0)
            except TimeoutError:
                continue
            head = data.split(b"\r\n", 1)[0].decode(errors="replace")
            return f"{head or 'closed'} after {time.monotonic() - t0:.1f} s"
        return f"still open after {seconds:.0f} s"
    except OSError:
        return f"closed after {time.monotonic() - t0:.1f} s"
    finally:
        writer.close()


async def slow_body(host: str, port: int, seconds: float) -> str:
    """Send headers announcing 1,000 body bytes, then only 10; return how the server ended it."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"prompt":'
    )
    t0 = time.monotonic()
    try:
        data = await asyncio.wait_for(reader.read(64), seconds)
        head = data.split(b"\r\n", 1)[0].decode(errors="replace")
        return f"{head or 'closed'} after {time.monotonic() - t0:.1f} s"
    except TimeoutError:
        return f"no answer after {seconds:.0f} s"
    except OSError:
        return f"closed after {time.monotonic() - t0:.1f} s"
    finally:
        writer.close()


async def run_mix(base: str, *, idle_seconds: float = 5.0, slow_seconds: float = 20.0) -> dict[str, Any]:
    """Run the canary alone, then with the hostile mix; return the measurements."""
    host, port = base.removeprefix("http://").split(":")
    hostile = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).resolve()),
        "--hostile-client",
        base,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert hostile.stdin is not None and hostile.stdout is not None
    if await hostile.stdout.readline() != b"ready\n":
        raise RuntimeError("the hostile client failed to start")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        canary = Canary(base)
        canary_task = asyncio.create_task(canary.run(session))
        await asyncio.sleep(idle_seconds)
        idle_gaps, idle_ttfts = canary.take()
        slow = [
            asyncio.create_task(slow_headers(host, int(port), slow_seconds)),
            asyncio.create_task(slow_body(host, int(port), slow_seconds)),
        ]
        # the hostile client is another process, its bodies built beforehand, so that its work
        # never delays the canary's reads here
        hostile.stdin.write(b"go\n")
        await hostile.stdin.drain()
        out, _ = await hostile.communicate()
        actions = json.loads(out)
        slow_results = await asyncio.gather(*slow)
        await asyncio.sleep(1.0)  # the canary's next gaps show whether the server recovered
        for a in actions:
            start, end = a.pop("start"), a.pop("end")
            a["seconds"] = round(end - start, 3)
            a["canary_max_gap_ms"] = round(1000 * canary.max_gap_during(start, end), 1)
        canary.stop()
        await canary_task
        hostile_gaps, hostile_ttfts = canary.take()
    return {
        "idle": {"gaps": summary(idle_gaps), "ttft": summary(idle_ttfts)},
        "hostile": {"gaps": summary(hostile_gaps), "ttft": summary(hostile_ttfts)},
        "canary_streams": canary.streams,
        "canary_errors": canary.errors[:10],
        "actions": actions,
        "slow_headers": slow_results[0],
        "slow_body": slow_results[1],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(repo: Path, python: str, port: int, log_path: Path, extra: list[str]) -> subprocess.Popen:
    """Start ``surge serve`` from ``repo`` on ``port`` and wait for /health (raises on failure)."""
    import urllib.request

    cmd = [python, "-m", "surge.cli", "serve", "--device", "cpu", "--port", str(port), "--log-interval", "60"]
    env = dict(os.environ, PYTHONPATH=str(repo), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*cmd, *extra], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"surge serve exited: {log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("surge serve did not become healthy")
        time.sleep(0.3)


def hostile_client(base: str) -> None:
    """The hostile side, in its own process: build the mix, say "ready", wait for "go", send it,
    print the results as JSON."""
    mix = hostile_mix(base)
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(asyncio.run(_send_mix(mix))), flush=True)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--hostile-client":
        hostile_client(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, default=REPO, help="checkout to serve from (default: this one)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with Surge's dependencies")
    ap.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    ap.add_argument("--out", type=Path, required=True, help="result JSON")
    ap.add_argument("--label", default=None, help="label stored in the result (default: the commit)")
    ap.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        help="extra `surge serve` argument (repeat; e.g. --serve-arg=--body-read-timeout --serve-arg=10)",
    )
    args = ap.parse_args()
    repo = args.repo.resolve()
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    port = args.port or _free_port()
    log_path = Path(tempfile.gettempdir()) / f"surge-isolation-{port}.log"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    proc = start_server(repo, args.python, port, log_path, args.serve_arg)
    try:
        result = asyncio.run(run_mix(f"http://127.0.0.1:{port}"))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    result = {
        "label": args.label or commit,
        "commit": commit,
        "serve_args": args.serve_arg,
        "cpu_count": os.cpu_count(),
        **result,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("label", "idle", "hostile")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
