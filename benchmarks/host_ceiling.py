"""Host-side ceiling of streamed tokens/s, one component at a time, on CPU (issue 12).

At high concurrency every streamed token is one SSE event through three host processes: the
engine process (scheduler, outputs), the API server (ZMQ receive, detokenization, SSE JSON) and
the benchmark client (SSE parsing, timestamps). This tool measures each one alone, without a
model or a GPU, and reports the CPU time each spends per token: ``1e6 / (CPU us per token)``
is the tokens/s one core can carry, whatever else runs on the machine.

Modes (run from the repository root, ``.venv/bin/python benchmarks/host_ceiling.py MODE ...``):

``client``
    ``surge bench serve``'s request code (:func:`surge.bench.serve.run_requests`) against a
    minimal raw-socket SSE server that writes one chat chunk per stream every ``--itl-ms`` to
    ``--streams`` streams. Reports the events/s ingested, the client's CPU us per event, and its
    ITL median against the true interval (timestamps stay exact while the client keeps up).
``api``
    The real API server (``run_server``: FastAPI, uvicorn, detokenizers, SSE framing, the ZMQ
    engine client) in its own process, over an engine process whose engine is
    :class:`PacedEngine`: no model; every ``--step-ms`` it emits one token for each running
    request (ids of an English text, so detokenization does real work). The client above
    drives it with ``--streams`` concurrent chat streams. Reports delivered tokens/s, TPOT and
    CPU us per token of the API process(es), the engine process and the client.
    ``--api-server-count N`` runs N API processes (as ``surge serve --api-server-count N``).
``engine``
    The real ``LLMEngine`` with the bundled tiny model on CPU and ``--streams`` running
    decodes: host time per step in ``schedule`` and ``update`` (the per-row Python work) and
    the encoding of the step's ``EngineOutputs`` message; ``execute`` (the runner's input
    preparation and the model on CPU) is reported apart and left out of the host figure.

Each mode repeats ``--repeats`` times and prints the median with every run's figure, and one
JSON line per run (``--json``). Results measured on the development machine are in
``benchmarks/results/host_ceiling.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_MODEL = REPO.parent / "shared" / "assets" / "models" / "qwen3-8b"
TEXT = (
    "The quick brown fox jumps over the lazy dog while the old man reads a book about the history "
    "of the world, and the children play in the garden near the river until the sun goes down."
)


# --------------------------------------------------------------------------------------------
# The paced engine: what the engine process would send, without a model.
# --------------------------------------------------------------------------------------------


class PacedEngine:
    """An engine for the engine process that steps every ``step_ms`` with no model.

    Each step emits one token for every running request (at most ``max_num_seqs`` run; the
    rest wait, first come first served), cycling through the token ids of an English text in
    the model's tokenizer; a request finishes after ``max_tokens`` tokens. The engine process
    builds it through ``functools.partial(PacedEngine, step_us=...)`` (a picklable factory).

    Args:
        config: the engine configuration (``scheduler.max_num_seqs``, the model folder).
        step_us: the step period, in microseconds.
    """

    def __init__(self, config: Any, step_us: int) -> None:
        from surge.tokenizer import load_tokenizer

        self.config = config
        self.block_size = config.cache.block_size
        self.num_kv_blocks = 1 << 20
        self.max_model_len = config.scheduler.max_model_len
        self._max_running = config.scheduler.max_num_seqs
        self._step_s = step_us / 1e6
        self._ids = load_tokenizer(config.model.model).encode(" " + TEXT, add_special_tokens=False)
        self._waiting: dict[str, list[int]] = {}  # id -> [max_tokens, generated, prompt_len]
        self._running: dict[str, list[int]] = {}
        self._next = time.monotonic()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: Any,
        arrival: Any = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> None:
        self._waiting[request_id] = [params.max_tokens, 0, len(prompt_token_ids)]

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._waiting.pop(rid, None)
            self._running.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting or self._running)

    def reset_prefix_cache(self) -> int:
        return 0

    def get_stats(self) -> Any:
        from surge.core.outputs import SchedulerStats

        return SchedulerStats(
            len(self._running), len(self._waiting), 0.0, self.num_kv_blocks, self.num_kv_blocks, 0
        )

    def step(self) -> list[Any]:
        from surge.core.outputs import EngineOutput

        now = time.monotonic()
        if now < self._next:
            time.sleep(self._next - now)
        self._next = max(self._next + self._step_s, time.monotonic() - self._step_s)
        while self._waiting and len(self._running) < self._max_running:
            rid = next(iter(self._waiting))
            self._running[rid] = self._waiting.pop(rid)
        outs = []
        ids = self._ids
        done = []
        for rid, st in self._running.items():
            tok = ids[st[1] % len(ids)]
            st[1] += 1
            out = EngineOutput(rid, [tok], num_prompt_tokens=st[2])
            if st[1] >= st[0]:
                out.finish_reason = "length"
                done.append(rid)
            outs.append(out)
        for rid in done:
            del self._running[rid]
        return outs


# --------------------------------------------------------------------------------------------
# CPU accounting
# --------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc; 0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------------
# The client: surge bench's request code, driven with fixed prompts.
# --------------------------------------------------------------------------------------------


def drive(url: str, streams: int, tokens: int, model: str) -> dict[str, Any]:
    """Send ``streams`` concurrent chat streams of ``tokens`` tokens with surge bench's client.

    Returns: duration (s), output tokens, events, client CPU seconds, ITL median and P99, the
    share of ITLs over 4/3 of the median (delivery jitter: late events followed by early ones),
    TPOT and TTFT (ms), errors.
    """
    from surge.bench.client import RequestInput
    from surge.bench.serve import run_requests

    try:
        from surge.bench.serve import run_async
    except ImportError:  # a checkout from before uvloop in the client (to measure "before")
        run_async = asyncio.run  # type: ignore[assignment]

    inputs = [
        RequestInput(f"{url}/v1/chat/completions", model, f"{i} {TEXT}", 256, tokens) for i in range(streams)
    ]
    warm = [RequestInput(f"{url}/v1/chat/completions", model, "warm up", 4, 4)]
    cpu0 = time.process_time()
    results, duration, _ = run_async(
        run_requests(inputs, warm, streams, float("inf"), 1.0, 0, 3600.0, disable_tqdm=True)
    )
    cpu = time.process_time() - cpu0
    itls = [x for r in results for x in r.itl]
    itl_median = statistics.median(itls) if itls else 0.0
    events = sum(len(r.itl) + (1 if r.success else 0) for r in results)
    errors = [r.error for r in results if not r.success]
    out_tokens = sum(r.output_len for r in results if r.success)
    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in results if r.success and r.output_len > 1]
    ttfts = [r.ttft for r in results if r.success]
    return {
        "duration_s": duration,
        "output_tokens": out_tokens,
        "events": events,
        "client_cpu_s": cpu,
        "itl_median_ms": 1e3 * itl_median if itls else None,
        "itl_p99_ms": 1e3 * statistics.quantiles(itls, n=100)[98] if len(itls) > 1 else None,
        "itl_late_share": sum(x > 4 / 3 * itl_median for x in itls) / len(itls) if itls else None,
        "tpot_mean_ms": 1e3 * statistics.fmean(tpots) if tpots else None,
        "ttft_mean_ms": 1e3 * statistics.fmean(ttfts) if ttfts else None,
        "ttft_max_ms": 1e3 * max(ttfts) if ttfts else None,
        "errors": errors[:3],
        "num_errors": len(errors),
    }


# --------------------------------------------------------------------------------------------
# (a) a raw SSE server that costs (almost) nothing per event
# --------------------------------------------------------------------------------------------


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _chat_event(
    i: int, content: str | None, finish: str | None = None, usage: dict[str, int] | None = None
) -> bytes:
    delta: dict[str, Any] = {} if content is None else {"content": content}
    if i == 0:
        delta = {"role": "assistant", "content": content}
    obj: dict[str, Any] = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake",
        "choices": [] if usage else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if usage:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _RawSSE(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection of :func:`serve_raw_sse`."""

    def __init__(self, streams: set[_RawSSE], tokens: int) -> None:
        self.buf = b""
        self.streams = streams
        self.tokens = tokens
        self.transport: asyncio.Transport | None = None
        self.sent = -1  # tokens sent on the open stream; -1: none open
        self.max_tokens = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            m = re.search(r"(?i)content-length:\s*(\d+)", head)
            n = int(m.group(1)) if m else 0
            if len(self.buf) < head_end + 4 + n:
                return
            body, self.buf = self.buf[head_end + 4 : head_end + 4 + n], self.buf[head_end + 4 + n :]
            self._start(head, body)

    def _start(self, head: str, body: bytes) -> None:
        assert self.transport is not None
        if head.startswith("GET"):
            payload = b'{"object":"list","data":[{"id":"fake","object":"model"}]}'
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(payload), payload)
            )
            return
        self.max_tokens = int(json.loads(body).get("max_completion_tokens") or self.tokens)
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        self.sent = 0
        self.streams.add(self)

    def tick(self) -> None:
        assert self.transport is not None
        word = TEXT.split()[self.sent % 30]
        last = self.sent + 1 == self.max_tokens
        ev = _chat_event(self.sent, " " + word, "length" if last else None)
        self.sent += 1
        if last:
            usage = {
                "prompt_tokens": 256,
                "completion_tokens": self.max_tokens,
                "total_tokens": 256 + self.max_tokens,
            }
            ev += _chat_event(1, None, usage=usage) + b"data: [DONE]\n\n"
            self.transport.write(_chunk(ev) + b"0\r\n\r\n")
            self.streams.discard(self)
            self.sent = -1
        else:
            self.transport.write(_chunk(ev))

    def connection_lost(self, exc: Exception | None) -> None:
        self.streams.discard(self)


def serve_raw_sse(port: int, itl_ms: float, tokens: int) -> None:
    """Serve chat streams on ``port``: every ``itl_ms`` one chunk to every open stream."""

    async def main() -> None:
        streams: set[_RawSSE] = set()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _RawSSE(streams, tokens), "127.0.0.1", port, backlog=1024)
        period = itl_ms / 1e3
        nxt = loop.time()
        async with server:
            while True:
                for s in list(streams):
                    s.tick()
                nxt = max(nxt + period, loop.time() - period)
                await asyncio.sleep(max(0.0, nxt - loop.time()))

    asyncio.run(main())


class ServerRefused(RuntimeError):
    """The probed server exited at start with `surge`'s one-line error (e.g. a model folder whose
    config it cannot load); the message is that line, without its ``surge: error:``."""


def wait_port(
    port: int, proc: subprocess.Popen[bytes], timeout: float = 300.0, log: Path | None = None
) -> None:
    """Wait until ``port`` takes connections from the server ``proc`` (its output in ``log``).

    Raises:
        ServerRefused: the server exited with `surge`'s one-line error (found in ``log``).
        RuntimeError: the server exited otherwise, or did not listen within ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace") if log is not None and log.is_file() else ""
            errors = [line for line in text.splitlines() if line.startswith("surge: error: ")]
            if errors:
                raise ServerRefused(errors[-1].removeprefix("surge: error: "))
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start")


def run_child(args: list[str], log: Path | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args], stdout=out, stderr=subprocess.STDOUT, env=env
    )


def drive_child(url: str, streams: int, tokens: int, model: str) -> dict[str, Any]:
    """:func:`drive` in a process of its own (so that its CPU is its own); its JSON result."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(Path(__file__).resolve()), "_drive", url, str(streams), str(tokens), model]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the client failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def mode_client(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for _ in range(args.repeats):
        port = free_port()
        srv = run_child(["_raw_sse", str(port), str(args.itl_ms), str(args.tokens)])
        try:
            wait_port(port, srv)
            srv_cpu0 = cpu_seconds(srv.pid)
            res = drive_child(f"http://127.0.0.1:{port}", args.streams, args.tokens, "fake")
            srv_cpu = cpu_seconds(srv.pid) - srv_cpu0
        finally:
            stop(srv)
        ideal = args.tokens * args.itl_ms / 1e3
        run = {
            "mode": "client",
            "streams": args.streams,
            "itl_ms": args.itl_ms,
            "events_per_s": res["events"] / res["duration_s"],
            "offered_events_per_s": args.streams / (args.itl_ms / 1e3),
            "client_cpu_us_per_event": 1e6 * res["client_cpu_s"] / res["events"],
            "server_cpu_us_per_event": 1e6 * srv_cpu / res["events"],
            "duration_over_ideal": res["duration_s"] / ideal,
            **res,
        }
        runs.append(run)
        report_run(run, args.json)
    return runs


# --------------------------------------------------------------------------------------------
# (b) the real API server over a paced engine
# --------------------------------------------------------------------------------------------


def serve_fake(argv: list[str]) -> int:
    """``surge serve`` whose engine process runs a :class:`PacedEngine` (argv: surge serve flags
    plus ``--step-us N``)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-us", type=int, required=True)
    own, rest = ap.parse_known_args(argv)
    import surge.cli
    import surge.server.api_server as api_server

    run_server = api_server.run_server
    factory = functools.partial(PacedEngine, step_us=own.step_us)
    api_server.run_server = functools.partial(run_server, engine_factory=factory)  # type: ignore[assignment]
    try:
        import surge.server.api_workers as api_workers
    except ImportError:  # a checkout from before --api-server-count
        pass
    else:
        serve = api_workers.serve_with_api_workers
        api_workers.serve_with_api_workers = functools.partial(serve, engine_factory=factory)  # type: ignore[assignment]
    return surge.cli.main(["serve", *rest])


def _pids_of(log: Path) -> tuple[list[int], list[int]]:
    """(API process pids, engine pids) named in a server log (API pids only with several)."""
    text = log.read_text(errors="replace")
    m = re.search(
        r"API server processes \(pids ([\d, ]+)\) over \d+ engine process\(es\) \(pids ([\d, ]+)\)", text
    )
    if m:
        return [int(p) for p in m.group(1).split(", ")], [int(p) for p in m.group(2).split(", ")]
    engines = [int(p) for p in re.findall(r"engine ready \(pid (\d+)\)", text)]
    engines += [
        int(p) for m in re.findall(r"replicas ready \(engine pids ([\d, ]+)\)", text) for p in m.split(", ")
    ]
    return [], sorted(set(engines))


def mode_api(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for _ in range(args.repeats):
        port = free_port()
        log = Path(args.log_dir) / f"host_ceiling_api_{port}.log"
        flags = [
            "--step-us", str(int(args.step_ms * 1000)),
            "--model", str(args.model), "--device", "cpu", "--load-format", "dummy",
            "--port", str(port), "--max-num-seqs", str(args.streams), "--num-kv-blocks", "64",
            "--log-interval", "3600", "--disable-web-ui", "--stream-interval", "1",
        ]  # fmt: skip
        if not args.log_requests:
            flags.append("--disable-log-requests")
        if args.api_server_count > 1:
            flags += ["--api-server-count", str(args.api_server_count)]
        if args.data_parallel_size > 1:
            flags += ["-dp", str(args.data_parallel_size)]
        srv = run_child(["_serve_fake", *flags], log)
        try:
            wait_port(port, srv, log=log)
            deadline = time.monotonic() + 120
            while True:  # every process named in the log (engine(s), API processes)
                apis, engines = _pids_of(log)
                serving = log.read_text(errors="replace").count(" serving on http://")
                if engines and serving >= args.api_server_count:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no pids in the log:\n{log.read_text()[-2000:]}")
                time.sleep(0.2)
            api_pids = apis if args.api_server_count > 1 else [srv.pid]
            pids = {"api": api_pids, "engine": engines}
            cpu0 = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
            profiler = None
            if args.py_spy:
                profiler = subprocess.Popen(
                    ["py-spy", "record", "-p", str(api_pids[0]), "-o", args.py_spy, "-f", "raw", "-r", "200"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            res = drive_child(f"http://127.0.0.1:{port}", args.streams, args.tokens, str(args.model))
            cpu = {k: sum(cpu_seconds(p) for p in v) - cpu0[k] for k, v in pids.items()}
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(60)
        finally:
            stop(srv)
        tok = max(res["output_tokens"], 1)
        offered = args.streams / (args.step_ms / 1e3)
        run = {
            "mode": "api",
            "streams": args.streams,
            "step_ms": args.step_ms,
            "api_server_count": args.api_server_count,
            "data_parallel_size": args.data_parallel_size,
            "tokens_per_s": res["output_tokens"] / res["duration_s"],
            "offered_tokens_per_s": offered,
            "api_cpu_us_per_token": 1e6 * cpu["api"] / tok,
            "engine_cpu_us_per_token": 1e6 * cpu["engine"] / tok,
            "client_cpu_us_per_token": 1e6 * res["client_cpu_s"] / tok,
            **res,
        }
        runs.append(run)
        report_run(run, args.json)
    return runs


# --------------------------------------------------------------------------------------------
# (c) the engine's host time per step
# --------------------------------------------------------------------------------------------


def mode_engine(args: argparse.Namespace) -> list[dict[str, Any]]:
    import msgspec

    from surge.engine.core_proc import EngineOutputs
    from surge.engine.llm_engine import LLMEngine, build_engine_config
    from surge.sampling_params import SamplingParams

    runs = []
    model = REPO / "surge" / "assets" / "stories260K"
    for _ in range(args.repeats):
        config = build_engine_config(
            str(model), device="cpu", max_num_seqs=args.streams, num_kv_blocks=args.streams * 8 + 64
        )
        engine = LLMEngine(config)
        sched = engine.scheduler
        timers = {"schedule": 0.0, "update": 0.0, "execute": 0.0}

        def timed(name: str, fn: Any, timers: dict[str, float] = timers) -> Any:
            def wrapper(*a: Any, **kw: Any) -> Any:
                t = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    timers[name] += time.perf_counter() - t

            return wrapper

        sched.schedule = timed("schedule", sched.schedule)  # type: ignore[method-assign]
        sched.update = timed("update", sched.update)  # type: ignore[method-assign]
        runner = engine.runner  # synchronous on CPU: execute = input preparation + model
        runner.execute = timed("execute", runner.execute)  # type: ignore[method-assign]
        params = SamplingParams(temperature=0.0, max_tokens=args.steps + 50, ignore_eos=True)
        for i in range(args.streams):
            engine.add_request(f"r{i}", [1, 2 + i % 50, 3, 4], params)
        while sched.num_waiting:
            engine.step()
        for _ in range(5):  # every row decoding
            engine.step()
        enc = msgspec.msgpack.Encoder()
        for k in timers:
            timers[k] = 0.0
        encode_s = 0.0
        t0 = time.perf_counter()
        rows = 0
        for _ in range(args.steps):
            outs = engine.step()
            rows += len(outs)
            t = time.perf_counter()
            enc.encode(EngineOutputs(outs, [], engine.get_stats()))
            encode_s += time.perf_counter() - t
        wall = time.perf_counter() - t0
        steps = args.steps
        host = wall - timers["execute"]
        run = {
            "mode": "engine",
            "streams": args.streams,
            "rows_per_step": rows / steps,
            "step_ms": 1e3 * wall / steps,
            "schedule_ms": 1e3 * timers["schedule"] / steps,
            "update_ms": 1e3 * timers["update"] / steps,
            "execute_ms": 1e3 * timers["execute"] / steps,
            "encode_ms": 1e3 * encode_s / steps,
            "host_ms_excluding_model": 1e3 * host / steps,
            "host_us_per_row": 1e6 * host / max(rows, 1),
        }
        runs.append(run)
        report_run(run, args.json)
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    return runs


# --------------------------------------------------------------------------------------------


def report_run(run: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(run), flush=True)
        return
    keys = [k for k, v in run.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    print(
        "  ".join(f"{k}={run[k]:.4g}" if isinstance(run[k], float) else f"{k}={run[k]}" for k in keys),
        flush=True,
    )
    if run.get("num_errors"):
        print(f"  errors: {run['errors']}", flush=True)


def check_model(prog: str, model: str) -> None:
    """Exit 2 with one line ``PROG: error: ...`` unless ``model`` is a model folder the probed
    server can start on with dummy weights: `surge serve`'s own check
    (:func:`surge.cli.check_model_dir`), before any server or tokenizer starts (a bad folder was a
    traceback once the server had died)."""
    from surge.cli import CliError, check_model_dir

    try:
        check_model_dir(model, load_format="dummy")
    except CliError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(2)


def report_medians(runs: list[dict[str, Any]]) -> None:
    print(f"median of {len(runs)} runs:")
    for k, v in runs[0].items():
        if isinstance(v, float):
            vals = [r[k] for r in runs if isinstance(r.get(k), float)]
            print(f"  {k:28s} {statistics.median(vals):12.4g}   ({', '.join(f'{x:.4g}' for x in vals)})")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_raw_sse":
        serve_raw_sse(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_serve_fake":
        sys.exit(serve_fake(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "_drive":
        print(json.dumps(drive(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("client", "api", "engine"))
    ap.add_argument(
        "--streams", type=int, default=256, help="concurrent streams / running rows (default 256)"
    )
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per stream (default 256)")
    ap.add_argument(
        "--itl-ms", type=float, default=5.0, help="client mode: ms between a stream's events (default 5)"
    )
    ap.add_argument("--step-ms", type=float, default=5.0, help="api mode: ms per engine step (default 5)")
    ap.add_argument("--steps", type=int, default=50, help="engine mode: timed steps (default 50)")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="api mode: model folder (tokenizer + config)")
    ap.add_argument("--api-server-count", type=int, default=1, help="api mode: API processes (default 1)")
    ap.add_argument(
        "--data-parallel-size", type=int, default=1, help="api mode: paced engine replicas (default 1)"
    )
    ap.add_argument(
        "--py-spy", default=None, help="api mode: record the (first) API process with py-spy to FILE"
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs; the median is reported (default 3)")
    ap.add_argument(
        "--log-requests",
        action="store_true",
        help="api mode: log every request with its first-token split (as benchmarks/h200.sh's servers do)",
    )
    ap.add_argument("--log-dir", default="/tmp", help="api mode: where the server logs go (default /tmp)")
    ap.add_argument("--json", action="store_true", help="one JSON line per run")
    args = ap.parse_args()
    if args.mode == "api":
        check_model(ap.prog, args.model)
    try:
        runs = {"client": mode_client, "api": mode_api, "engine": mode_engine}[args.mode](args)
    except ServerRefused as e:
        print(f"{ap.prog}: error: the server did not start: {e}", file=sys.stderr)
        sys.exit(2)
    report_medians(runs)


if __name__ == "__main__":
    main()
