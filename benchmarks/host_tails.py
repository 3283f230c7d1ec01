"""Latency tails of streamed tokens on the host path, on CPU (session 40).

The real API server (FastAPI, uvicorn, detokenizers, SSE, the ZMQ engine client) runs over the
paced engine of :mod:`benchmarks.host_ceiling` (no model: every ``--step-ms`` one token for
each running request), driven by ``surge bench serve``'s request code with ``--streams``
concurrent streams on ``/v1/chat/completions`` or ``/v1/completions`` (``--stream-interval 1``).
Since the engine's steps are evenly spaced, every inter-token latency (ITL) above the step
period is host delay: the API process's, the client's, or the machine's.

Inside the API process two probes record what delays tokens there:

* **event-loop lag**: a thread asks the loop to run a callback every ``--probe-ms`` and records
  how long it waited (``call_soon_threadsafe`` to the callback): the time a token that became
  ready then waits for the loop;
* **garbage collections**: every collection's generation and pause (``gc.callbacks``).

Reported per run, over the client's timed window: the ITL median, P99, P99.9 and max (ms), the
loop lag P99 / P99.9 / max (ms), the API process's CPU per token, and per generation the
collections (and per 1,000 tokens) with their total and longest pause in CPU ms (thread time,
which leaves out preemption by other processes). One JSON line per run with ``--json``.

``--endpoint engine`` measures the engine loop's host side instead, without a server: the real
``LLMEngine`` with the bundled model on CPU, ``--streams`` rows that are replaced as they
finish, per step the host time (the step less the model's ``execute``, plus the encoding of
the ``EngineOutputs`` message) and the collections.

``--endpoint convoy`` measures the GIL convoy alone: how late a thread that sleeps 1 ms at a
time wakes while two threads render a ``--turns`` chat template (Jinja, pure Python).

Diagnosis flags: ``--stack-after-ms`` records the API main thread's stack whenever the loop
has not answered a probe for that long, ``--census`` the object types of generation 2 before
each full collection, ``--switch-interval-ms`` sets the API process's GIL switch interval.

Run from the repository root (ports 8850-8859 on the shared development machines)::

    .venv/bin/python benchmarks/host_tails.py --streams 64 --step-ms 10 --endpoint chat --port 8850

Results: ``benchmarks/results/host-tails-cpu-s40/``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import host_ceiling as hc  # noqa: E402

# --------------------------------------------------------------------------------------------
# The probes, in the API process
# --------------------------------------------------------------------------------------------


class Probe:
    """Event-loop lag and GC pauses of the process it runs in, with wall-clock stamps.

    Args:
        period_s: seconds between two loop-lag samples.
    """

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.lags: list[tuple[float, float]] = []  # (time.time(), seconds waited)
        self.gcs: list[tuple[float, int, float, float]] = []  # (time.time(), generation, wall s, CPU s)
        self._gc_t0 = self._gc_c0 = 0.0
        self._stop = threading.Event()
        self._pending: float | None = None  # perf_counter() of the sample the loop has not run yet
        self._main = threading.main_thread().ident
        self.stacks: list[tuple[float, float, str]] = []  # (time.time(), ms waited, main stack)
        self.stack_after_s = 0.0  # sample the main thread's stack once a sample waits this long
        self.census = False  # record the types in generation 2 before each full collection
        self.census_out: list[tuple[float, int, list[tuple[str, int]]]] = []

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if self.census and info["generation"] == 2:
                objs = gc.get_objects(2)
                top = collections.Counter(type(o).__name__ for o in objs).most_common(12)
                mods = collections.Counter(
                    getattr(o, "__module__", None) or "?" for o in objs if type(o).__name__ == "function"
                ).most_common(12)
                top += [("fn:" + str(m), c) for m, c in mods]
                self.census_out.append((time.time(), len(objs), top))
                del objs
            self._gc_t0 = time.perf_counter()
            self._gc_c0 = time.thread_time()
        else:
            wall, cpu = time.perf_counter() - self._gc_t0, time.thread_time() - self._gc_c0
            self.gcs.append((time.time(), int(info["generation"]), wall, cpu))

    def _hit(self, t0: float) -> None:
        self.lags.append((time.time(), time.perf_counter() - t0))
        self._pending = None

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while not self._stop.wait(self.period_s):
            now = time.perf_counter()
            pending = self._pending
            if pending is not None:  # the loop has not run the last sample yet: no new one
                if self.stack_after_s and now - pending > self.stack_after_s:
                    frame = sys._current_frames().get(self._main)  # noqa: SLF001
                    stack = "".join(traceback.format_stack(frame)[-25:]) if frame else ""
                    self.stacks.append((time.time(), 1e3 * (now - pending), stack))
                continue
            self._pending = now
            try:
                loop.call_soon_threadsafe(self._hit, now)
            except RuntimeError:  # the loop closed
                return

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start sampling ``loop``'s lag (a daemon thread) and recording collections."""
        gc.callbacks.append(self._on_gc)
        threading.Thread(target=self._run, args=(loop,), daemon=True, name="tails-probe").start()

    def stop(self, path: str) -> None:
        """Stop and write the records to ``path`` (JSON)."""
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        Path(path).write_text(
            json.dumps({"lags": self.lags, "gcs": self.gcs, "stacks": self.stacks, "census": self.census_out})
        )


def serve_probed(argv: list[str]) -> int:
    """``host_ceiling``'s fake ``surge serve`` with the probes (argv: its flags, then
    ``--probe-out FILE --probe-ms MS``)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe-out", required=True)
    ap.add_argument("--probe-ms", type=float, default=2.0)
    ap.add_argument("--stack-after-ms", type=float, default=0.0)
    ap.add_argument("--switch-interval-ms", type=float, default=0.0)
    ap.add_argument("--census", action="store_true")
    own, rest = ap.parse_known_args(argv)
    if own.switch_interval_ms:
        sys.setswitchinterval(own.switch_interval_ms / 1e3)
    import surge.server.api_server as api_server

    probe = Probe(own.probe_ms / 1e3)
    probe.stack_after_s = own.stack_after_ms / 1e3
    probe.census = own.census
    run_server = api_server.run_server

    async def probed(*a: Any, **kw: Any) -> int:
        probe.start(asyncio.get_running_loop())
        try:
            return await run_server(*a, **kw)
        finally:
            probe.stop(own.probe_out)

    api_server.run_server = probed  # type: ignore[assignment]
    return hc.serve_fake(rest)


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


def conversation(i: int, turns: int) -> list[dict[str, str]]:
    """A chat of ``turns`` earlier user/assistant exchanges (each a copy of the English text),
    then a user message: ``turns`` sets the chat template's work (Jinja, Python) per request."""
    messages = []
    for k in range(turns):
        messages += [
            {"role": "user", "content": f"{i}.{k} {hc.TEXT}"},
            {"role": "assistant", "content": hc.TEXT},
        ]
    return [*messages, {"role": "user", "content": f"{i} {hc.TEXT}"}]


def drive(
    url: str,
    streams: int,
    tokens: int,
    model: str,
    endpoint: str,
    requests: int,
    rate: float,
    turns: int = 0,
) -> dict[str, Any]:
    """``requests`` streams of ``tokens`` tokens, at most ``streams`` at a time, sent at ``rate``
    per second (Poisson; ``inf``: all at once) with surge bench's client; ITL figures and the
    timed window (``time.time()`` at its start and end)."""
    from surge.bench.client import RequestInput
    from surge.bench.serve import run_async, run_requests

    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    inputs = [
        RequestInput(
            f"{url}{path}",
            model,
            f"{i} {hc.TEXT}",
            256,
            tokens,
            extra_body={"messages": conversation(i, turns)} if turns and endpoint == "chat" else None,
        )
        for i in range(requests)
    ]
    warm = [RequestInput(f"{url}{path}", model, "warm up", 4, 4)]
    t_start = time.time()
    results, duration, _ = run_async(
        run_requests(inputs, warm, streams, rate, 1.0, 0, 3600.0, disable_tqdm=True)
    )
    t_end = time.time()
    itls = sorted(x for r in results for x in r.itl)
    errors = [r.error for r in results if not r.success]
    bad_len = sum(1 for r in results if r.success and r.output_len != tokens)
    return {
        "t_start": t_start,
        "t_end": t_end,
        "duration_s": duration,
        "output_tokens": sum(r.output_len for r in results if r.success),
        "itl_ms": quantiles_ms(itls),
        "num_errors": len(errors),
        "errors": errors[:3],
        "wrong_lengths": bad_len,
    }


def quantiles_ms(xs: list[float]) -> dict[str, float]:
    """Median, P99, P99.9 and max of seconds ``xs``, in ms (zeros when empty)."""
    if not xs:
        return {"p50": 0.0, "p99": 0.0, "p99.9": 0.0, "max": 0.0}
    xs = sorted(xs)

    def q(p: float) -> float:
        return 1e3 * xs[min(len(xs) - 1, int(p * len(xs)))]

    return {"p50": q(0.5), "p99": q(0.99), "p99.9": q(0.999), "max": 1e3 * xs[-1]}


# --------------------------------------------------------------------------------------------


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    """One server run on ``--port``: start the probed server, drive it, stop it; the run's figures.

    Raises:
        RuntimeError: the server or the client failed (the end of its output in the message).
    """
    port = args.port
    log = Path(args.log_dir) / f"host_tails_{port}.log"
    probe_out = Path(args.log_dir) / f"host_tails_probe_{port}.json"
    probe_out.unlink(missing_ok=True)
    flags = [
        "--probe-out", str(probe_out), "--probe-ms", str(args.probe_ms),
        "--stack-after-ms", str(args.stack_after_ms),
        "--switch-interval-ms", str(args.switch_interval_ms),
        *(["--census"] if args.census else []),
        "--step-us", str(int(args.step_ms * 1000)),
        "--model", str(args.model), "--device", "cpu", "--load-format", "dummy",
        "--port", str(port), "--max-num-seqs", str(args.streams), "--num-kv-blocks", "64",
        "--log-interval", "3600", "--disable-web-ui", "--stream-interval", "1",
        "--disable-log-requests",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log, "wb") as out:
        srv = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "_serve", *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        hc.wait_port(port, srv, log=log)
        while " serving on http://" not in log.read_text(errors="replace"):
            if srv.poll() is not None:
                raise RuntimeError(f"the server exited:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        api_cpu0 = hc.cpu_seconds(srv.pid)
        cmd = [sys.executable, str(Path(__file__).resolve()), "_drive", f"http://127.0.0.1:{port}"]
        cmd += [str(args.streams), str(args.tokens), str(args.model), args.endpoint]
        cmd += [str(args.requests or args.streams), str(args.rate), str(args.turns)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the client failed:\n{done.stderr[-2000:]}")
        res = json.loads(done.stdout.strip().splitlines()[-1])
        api_cpu = hc.cpu_seconds(srv.pid) - api_cpu0
    finally:
        hc.stop(srv)
    rec = json.loads(probe_out.read_text())
    t0, t1 = res["t_start"], res["t_end"]
    lags = [v for t, v in rec["lags"] if t0 <= t <= t1]
    gcs = [(g, s, c) for t, g, s, c in rec["gcs"] if t0 <= t <= t1]
    run: dict[str, Any] = {
        "endpoint": args.endpoint,
        "streams": args.streams,
        "requests": args.requests or args.streams,
        "rate": args.rate,
        "turns": args.turns,
        "step_ms": args.step_ms,
        "tokens_per_s": res["output_tokens"] / res["duration_s"],
        "api_cpu_us_per_token": 1e6 * api_cpu / max(res["output_tokens"], 1),
        "itl_ms": res["itl_ms"],
        "loop_lag_ms": quantiles_ms(lags),
        "num_errors": res["num_errors"],
        "wrong_lengths": res["wrong_lengths"],
    }
    run.update(gc_summary(gcs, res["output_tokens"]))
    if res["errors"]:
        run["errors"] = res["errors"]
    return run


def gc_summary(gcs: list[tuple[int, float, float]], units: int) -> dict[str, Any]:
    """Per generation: collections, collections per 1,000 ``units`` (tokens or steps), and the
    total and longest pause in wall-clock and CPU ms (CPU time leaves out preemption)."""
    out = {}
    for g in range(3):
        wall = [s for gg, s, _ in gcs if gg == g]
        cpu = [c for gg, _, c in gcs if gg == g]
        out[f"gc{g}"] = {
            "count": len(wall),
            "per_1k": 1e3 * len(wall) / max(units, 1),
            "total_ms": 1e3 * sum(wall),
            "max_ms": 1e3 * max(wall, default=0.0),
            "cpu_total_ms": 1e3 * sum(cpu),
            "cpu_max_ms": 1e3 * max(cpu, default=0.0),
        }
    return out


def report(run: dict[str, Any]) -> None:
    """Print one run as one line."""
    if run["endpoint"] == "convoy":
        w = run["wake_lag_ms"]
        print(
            f"convoy: {run['turns']} turns, switch interval {run['switch_interval_ms']:.1f} ms: wake lag ms "
            f"p50 {w['p50']:.2f} p99 {w['p99']:.2f} max {w['max']:.2f}",
            flush=True,
        )
        return
    if run["endpoint"] == "engine":
        h = run["host_ms"]
        print(
            f"engine C{run['streams']}: {run['steps']} steps, host ms/step p50 {h['p50']:.3f} p99 {h['p99']:.3f} "
            f"p99.9 {h['p99.9']:.3f} max {h['max']:.3f} | " + gc_text(run),
            flush=True,
        )
        return
    itl, lag = run["itl_ms"], run["loop_lag_ms"]
    gcs = gc_text(run)
    print(
        f"{run['endpoint']} C{run['streams']} N{run['requests']} rate {run['rate']} turns {run['turns']} step {run['step_ms']} ms: {run['tokens_per_s']:.0f} tok/s, "
        f"API {run['api_cpu_us_per_token']:.1f} us/tok | ITL p50 {itl['p50']:.2f} p99 {itl['p99']:.2f} "
        f"p99.9 {itl['p99.9']:.2f} max {itl['max']:.2f} | lag p99 {lag['p99']:.2f} p99.9 "
        f"{lag['p99.9']:.2f} max {lag['max']:.2f} | {gcs} | errors {run['num_errors']} "
        f"wrong lengths {run['wrong_lengths']}",
        flush=True,
    )


def gc_text(run: dict[str, Any]) -> str:
    """The collections of a run, one generation after another."""
    return "  ".join(
        f"gc{g} {run[f'gc{g}']['count']}x ({run[f'gc{g}']['per_1k']:.2f}/1k) cpu {run[f'gc{g}']['cpu_total_ms']:.1f} "
        f"max {run[f'gc{g}']['cpu_max_ms']:.2f} ms"
        for g in range(3)
    )


def engine_run(args: argparse.Namespace) -> dict[str, Any]:
    """The real ``LLMEngine`` (bundled stories260K on CPU) with ``--streams`` rows, each request
    replaced by a new one when it finishes (40 to 199 output tokens): per step, the host time (the step less the runner's ``execute``) plus the encoding of its
    ``EngineOutputs`` message, and the collections of the garbage collector."""
    import msgspec

    from surge.engine.core_proc import EngineOutputs
    from surge.engine.llm_engine import LLMEngine, build_engine_config
    from surge.sampling_params import SamplingParams

    model = REPO / "surge" / "assets" / "stories260K"
    steps = args.steps
    config = build_engine_config(
        str(model), device="cpu", max_num_seqs=args.streams, num_kv_blocks=args.streams * 16 + 64
    )
    engine = LLMEngine(config)
    runner = engine.runner
    spent = [0.0]
    execute = runner.execute

    def timed(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return execute(*a, **kw)
        finally:
            spent[0] += time.perf_counter() - t

    runner.execute = timed  # type: ignore[method-assign]

    def add(i: int) -> None:  # 40 to 199 tokens: requests finish and new ones arrive every step
        params = SamplingParams(temperature=0.0, max_tokens=40 + (i * 37) % 160, ignore_eos=True)
        engine.add_request(f"r{i}", [1, 2 + i % 50, 3, 4], params)

    for i in range(args.streams):
        add(i)
    added = args.streams
    while engine.scheduler.num_waiting:
        engine.step()
    for _ in range(5):
        engine.step()
    gc.collect()
    gc.freeze()  # as the engine process does once ready
    probe = Probe(1.0)
    gc.callbacks.append(probe._on_gc)  # noqa: SLF001
    enc = msgspec.msgpack.Encoder()
    host = []
    try:
        for _ in range(steps):
            spent[0] = 0.0
            t = time.perf_counter()
            outs = engine.step()
            enc.encode(EngineOutputs(outs, [], engine.get_stats()))
            for out in outs:
                if out.finish_reason is not None:
                    add(added)
                    added += 1
            host.append(time.perf_counter() - t - spent[0])
    finally:
        gc.callbacks.remove(probe._on_gc)  # noqa: SLF001
        gc.unfreeze()
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    run: dict[str, Any] = {"endpoint": "engine", "streams": args.streams, "steps": steps}
    run["requests_added"] = added - args.streams
    run["host_ms"] = quantiles_ms(host)
    run.update(gc_summary([(g, s, c) for _, g, s, c in probe.gcs], steps))
    return run


def convoy_run(args: argparse.Namespace) -> dict[str, Any]:
    """The GIL convoy alone: two threads render a ``--turns`` chat with the model's template
    (Jinja: pure Python, as the API process's tokenizer threads do) for 4 s while this thread
    sleeps 1 ms at a time; how late each wake-up is (at ``--switch-interval-ms``, else
    Python's default 5 ms)."""
    from surge.tokenizer import load_tokenizer

    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    tok = load_tokenizer(str(args.model))
    messages = conversation(0, args.turns or 40)
    done = threading.Event()

    def render() -> None:
        while not done.is_set():
            tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    threads = [threading.Thread(target=render, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    lags = []
    end = time.perf_counter() + 4.0
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        time.sleep(0.001)
        lags.append(time.perf_counter() - t0 - 0.001)
    done.set()
    for t in threads:
        t.join()
    return {
        "endpoint": "convoy",
        "turns": args.turns or 40,
        "switch_interval_ms": 1e3 * sys.getswitchinterval(),
        "wake_lag_ms": quantiles_ms(lags),
    }


def main() -> None:
    """The command line (see the module docstring); ``_serve`` and ``_drive`` are its children."""
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        sys.exit(serve_probed(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "_drive":
        a = sys.argv[2:]
        print(json.dumps(drive(a[0], int(a[1]), int(a[2]), a[3], a[4], int(a[5]), float(a[6]), int(a[7]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=64, help="concurrent streams (default 64)")
    ap.add_argument(
        "--requests",
        type=int,
        default=0,
        help="requests in all, at most --streams at a time (default --streams)",
    )
    ap.add_argument(
        "--rate", type=float, default=float("inf"), help="requests/s, Poisson (default: all at once)"
    )
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per stream (default 256)")
    ap.add_argument("--step-ms", type=float, default=10.0, help="ms per engine step (default 10)")
    ap.add_argument(
        "--turns", type=int, default=0, help="chat: earlier user/assistant exchanges per request (default 0)"
    )
    ap.add_argument(
        "--endpoint",
        choices=("chat", "completions", "engine", "convoy"),
        default="chat",
        help="engine: the engine loop's host side alone (real LLMEngine, bundled model, no server); "
        "convoy: a thread's wake-up lag while two threads render chat templates (no server)",
    )
    ap.add_argument("--steps", type=int, default=2000, help="engine: timed steps (default 2000)")
    ap.add_argument("--probe-ms", type=float, default=2.0, help="ms between loop-lag samples (default 2)")
    ap.add_argument(
        "--stack-after-ms",
        type=float,
        default=0.0,
        help="record the API main thread's stack while the loop has not answered for this long (0: off)",
    )
    ap.add_argument(
        "--switch-interval-ms",
        type=float,
        default=0.0,
        help="experiment: the API process's GIL switch interval",
    )
    ap.add_argument(
        "--census", action="store_true", help="diagnosis: count the object types of each full collection"
    )
    ap.add_argument("--model", default=str(hc.DEFAULT_MODEL), help="model folder (tokenizer + config)")
    ap.add_argument("--port", type=int, default=8850)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--json", action="store_true", help="one JSON line per run")
    args = ap.parse_args()
    if args.endpoint != "engine":  # the engine mode runs the bundled model
        hc.check_model(ap.prog, args.model)
    for _ in range(args.repeats):
        modes = {"engine": engine_run, "convoy": convoy_run}
        try:
            run = modes.get(args.endpoint, one_run)(args)
        except hc.ServerRefused as e:
            print(f"{ap.prog}: error: the server did not start: {e}", file=sys.stderr)
            sys.exit(2)
        print(json.dumps(run), flush=True) if args.json else report(run)


if __name__ == "__main__":
    main()
