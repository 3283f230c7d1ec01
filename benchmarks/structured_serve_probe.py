"""Probe of the host's time while `surge serve` streams (issue 11: json_schema serving loses
more than the engine step alone): per engine step, where the engine process's main thread
spends its time, and how late the API process takes each engine message.

Runs `surge serve` with timers patched into it (this file is also imported, as
``__mp_main__``, by the spawned engine process, so the patches hold there too):

- engine process, per step: the step's start (``time.time()``), ``LLMEngine.step`` wall,
  ``_schedule``, ``runner.execute_async`` and inside it the grammar mask's wait for the
  previous step's tokens (``previous()``) and the rest of ``StructuredOutputManager.fill``
  (matcher catch-up + batch fill), ``StepHandle.result`` (the wait for a step's ids where the
  mask did not wait already), ``Scheduler.update``, the number
  of mask rows, and the time of each message sent to the API process (the ``get_stats``
  call that precedes every send);
- API process: the time at which the dispatch task's event loop takes each engine message.

Message ``k`` of the engine and message ``k`` of the API are the same message (one API
process, PUSH/PULL keeps the order), so ``api_recv[k] - engine_send[k]`` is how late the API
process takes it up. The records go to ``OUT/engine-<pid>.json`` and ``OUT/api-<pid>.json``
(rewritten every 500 steps / messages; the engine process exits without atexit handlers);
``--summarize OUT`` prints per-step means and percentiles, split at output token 128.
``--max-fill-threads N`` overrides ``surge.structured.manager.MAX_FILL_THREADS`` (to compare).

``--measure NAME --server-pid PID -- BENCH ARGS`` runs ``surge bench serve BENCH ARGS`` and
writes ``NAME.cpu.json``: CPU seconds and involuntary context switches per output token of
the API process, of the engine process (its main thread and its other threads apart) and of
the bench client, the CPUs the process may use, and the cgroup's throttling counters.

Usage (repository root; the GPU commands are in benchmarks/structured_serve_probe.sh)::

    python3 benchmarks/structured_serve_probe.py --out OUT [--max-fill-threads N] -- --model M --port P [serve flags]
    python3 benchmarks/structured_serve_probe.py --measure OUT/NAME --server-pid PID -- --base-url ... [bench flags]
    python3 benchmarks/structured_serve_probe.py --summarize OUT
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import sys
import time
from typing import Any

import numpy as np

_FLUSH_EVERY = 500


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _out_dir() -> str | None:
    argv = sys.argv
    if "--out" in argv:
        i = argv.index("--out")
        if i + 1 < len(argv):
            return argv[i + 1]
    return None


class _Recorder:
    """Lists of floats by name, dumped as JSON to ``OUT/<kind>-<pid>.json``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.data: dict[str, list[float]] = {}
        self.count = 0

    def add(self, name: str, value: float) -> None:
        self.data.setdefault(name, []).append(value)

    def tick(self) -> None:
        self.count += 1
        if self.count % _FLUSH_EVERY == 0:
            self.flush()

    def flush(self) -> None:
        out = _out_dir()
        if out is None or not self.data:
            return
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"{self.kind}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.data, f)
        os.replace(path + ".tmp", path)


def _max_fill_threads() -> int | None:
    argv = sys.argv
    if "--max-fill-threads" in argv:
        return int(argv[argv.index("--max-fill-threads") + 1])
    return None


def _install() -> None:
    """Patch the timers into the engine and the API client classes (both processes)."""
    from surge.engine import client as client_mod
    from surge.engine.llm_engine import LLMEngine
    from surge.structured import manager as manager_mod

    threads = _max_fill_threads()
    if threads is not None:
        manager_mod.MAX_FILL_THREADS = threads

    eng = _Recorder("engine")
    api = _Recorder("api")
    step_state: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                step_state[name] = step_state.get(name, 0.0) + time.perf_counter() - t

        return wrapper

    orig_step = LLMEngine.step

    @functools.wraps(orig_step)
    def step(self: Any) -> Any:
        step_state.clear()
        wall = time.time()
        t = time.perf_counter()
        out = orig_step(self)
        dt = time.perf_counter() - t
        eng.add("start", wall)
        eng.add("step_s", dt)
        for k in ("schedule_s", "execute_s", "fill_wait_s", "fill_s", "result_s", "update_s"):
            eng.add(k, step_state.get(k, 0.0))
        eng.add("mask_rows", step_state.get("mask_rows", 0.0))
        eng.add("num_outputs", float(len(out)))
        eng.tick()
        return out

    LLMEngine.step = step  # type: ignore[method-assign]
    LLMEngine._schedule = timed("schedule_s", LLMEngine._schedule)  # type: ignore[method-assign]
    from surge.core.scheduler import Scheduler
    from surge.worker.model_runner import StepHandle

    Scheduler.update = timed("update_s", Scheduler.update)  # type: ignore[method-assign]
    StepHandle.result = timed("result_s", StepHandle.result)  # type: ignore[method-assign]
    orig_stats = LLMEngine.get_stats

    @functools.wraps(orig_stats)
    def get_stats(self: Any) -> Any:
        eng.add("send", time.time())  # _busy_loop sends right after this call
        return orig_stats(self)

    LLMEngine.get_stats = get_stats  # type: ignore[method-assign]

    orig_init = LLMEngine.__init__

    @functools.wraps(orig_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        runner = self.runner
        runner.execute_async = timed("execute_s", runner.execute_async)

    LLMEngine.__init__ = init  # type: ignore[method-assign]

    orig_fill = manager_mod.StructuredOutputManager.fill

    @functools.wraps(orig_fill)
    def fill(self: Any, requests: Any, grammars: Any, previous: Any = None) -> int:
        waited = [0.0]
        wrapped = None
        if previous is not None:

            def wrapped() -> Any:
                t = time.perf_counter()
                try:
                    return previous()
                finally:
                    waited[0] += time.perf_counter() - t

        t = time.perf_counter()
        n = orig_fill(self, requests, grammars, wrapped)
        dt = time.perf_counter() - t
        step_state["fill_wait_s"] = step_state.get("fill_wait_s", 0.0) + waited[0]
        step_state["fill_s"] = step_state.get("fill_s", 0.0) + dt - waited[0]
        step_state["mask_rows"] = step_state.get("mask_rows", 0.0) + n
        return n

    manager_mod.StructuredOutputManager.fill = fill  # type: ignore[method-assign]

    import zmq
    import zmq.asyncio

    orig_recv = zmq.asyncio.Socket.recv

    def recv(self: Any, *args: Any, **kwargs: Any) -> Any:
        future = orig_recv(self, *args, **kwargs)
        if self.socket_type == zmq.PULL:

            def taken(_: Any) -> None:  # runs on the event loop once the message is there
                api.add("recv", time.time())
                api.tick()

            future.add_done_callback(taken)
        return future

    zmq.asyncio.Socket.recv = recv  # type: ignore[method-assign]
    del client_mod  # imported so the API's socket class is the patched one

    import atexit

    atexit.register(api.flush)
    atexit.register(eng.flush)


def _pct(a: np.ndarray) -> dict[str, float]:
    if a.size == 0:
        return {}
    return {
        "mean": round(float(a.mean()) * 1e3, 3),
        "p50": round(float(np.percentile(a, 50)) * 1e3, 3),
        "p99": round(float(np.percentile(a, 99)) * 1e3, 3),
        "max": round(float(a.max()) * 1e3, 3),
    }


def summarize(out: str) -> dict[str, Any]:
    """Per-step figures (ms) of the engine records in ``out`` and the API's lag per message."""
    result: dict[str, Any] = {}
    for path in sorted(glob.glob(os.path.join(out, "engine-*.json"))):
        d = {k: np.array(v) for k, v in json.loads(_read(path)).items()}
        if "step_s" not in d:
            continue
        busy = d["num_outputs"] > 0
        start = d["start"]
        cycle = np.diff(start)
        steps: dict[str, Any] = {"steps": int(busy.sum())}
        # the decode part: steps with outputs, after the first 128 (whitespace) and before
        decode = np.flatnonzero(busy)
        halves = {"first_128_steps": decode[:128], "after_128_steps": decode[128:]}
        for label, idx in halves.items():
            idx = idx[idx < cycle.size]
            part: dict[str, Any] = {"cycle_ms": _pct(cycle[idx])}
            for k in ("step_s", "schedule_s", "execute_s", "fill_wait_s", "fill_s", "result_s", "update_s"):
                part[k.replace("_s", "_ms")] = _pct(d[k][idx])
            outside = cycle[idx] - d["step_s"][idx]
            part["outside_step_ms"] = _pct(outside)  # receive inputs, encode + send outputs
            part["mask_rows_mean"] = round(float(d["mask_rows"][idx].mean()), 1) if idx.size else 0.0
            steps[label] = part
        result[os.path.basename(path)] = steps
        api_paths = sorted(glob.glob(os.path.join(out, "api-*.json")))
        if api_paths and "send" in d:
            recv = np.array(json.loads(_read(api_paths[0]))["recv"])
            send = d["send"]
            # the API's first recv() waits for EngineReady; each later one takes one message
            recv = recv[1:]
            n = min(recv.size, send.size)
            lag = recv[:n] - send[:n]
            result["api_lag_ms"] = _pct(lag)
            result["api_lag_over_5ms_fraction"] = round(float((lag > 0.005).mean()), 4) if n else 0.0
    return result


def _proc_stats(pid: int) -> dict[str, Any]:
    """CPU seconds and involuntary context switches of ``pid``: main thread and other threads."""
    tck = os.sysconf("SC_CLK_TCK")
    out = {"main_cpu_s": 0.0, "threads_cpu_s": 0.0, "main_nvcsw": 0, "threads_nvcsw": 0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = _read(f"/proc/{pid}/task/{tid}/stat")
            status = _read(f"/proc/{pid}/task/{tid}/status")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / tck
        nv = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("nonvoluntary"))
        key = "main" if int(tid) == pid else "threads"
        out[f"{key}_cpu_s"] += cpu
        out[f"{key}_nvcsw"] += nv
    return out


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _cgroup_stat() -> dict[str, int]:
    try:
        with open("/sys/fs/cgroup/cpu.stat") as f:
            return {k: int(v) for k, v in (line.split() for line in f if line.strip())}
    except (OSError, ValueError):
        return {}


def measure(name: str, server_pid: int, bench_args: list[str]) -> dict[str, Any]:
    """Run ``surge bench serve bench_args`` and account the CPU of every process per output token."""
    import resource
    import subprocess

    from surge.structured.cpus import available_cpus

    engine_pids = [c for c in _children(server_pid) if "spawn_main" in _read(f"/proc/{c}/cmdline")]
    procs = {"api": server_pid, **{f"engine-{p}": p for p in engine_pids}}
    before = {k: _proc_stats(p) for k, p in procs.items()}
    cg0 = _cgroup_stat()
    result_file = name + ".json"
    cmd = [sys.executable, "-m", "surge.cli", "bench", "serve", *bench_args, "--result-file", result_file]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = {k: _proc_stats(p) for k, p in procs.items()}
    cg1 = _cgroup_stat()
    with open(result_file) as f:
        bench = json.load(f)
    tokens = max(1, int(bench["total_output_tokens"]))
    per_tok: dict[str, Any] = {}
    for k in procs:
        for field in before[k]:
            d = after[k][field] - before[k][field]
            per_tok[f"{k}.{field}"] = round(d / tokens * 1e6, 2) if field.endswith("_s") else d
    per_tok["client.cpu_s"] = round(
        (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / tokens * 1e6, 2
    )
    per_tok["client.nvcsw"] = ru1.ru_nivcsw - ru0.ru_nivcsw
    summary = {
        "cpu_us_per_output_token_and_nvcsw": per_tok,
        "output_throughput": bench["output_throughput"],
        "mean_tpot_ms": bench["mean_tpot_ms"],
        "p99_itl_ms": bench.get("p99_itl_ms"),
        "cpu_count": os.cpu_count(),
        "available_cpus": available_cpus(),
        "cgroup_cpu_max": _read("/sys/fs/cgroup/cpu.max").strip()
        if os.path.exists("/sys/fs/cgroup/cpu.max")
        else None,
        "cgroup_cpu_stat_delta": {k: cg1[k] - cg0.get(k, 0) for k in cg1},
        "loadavg": _read("/proc/loadavg").split()[:3],
    }
    with open(name + ".cpu.json", "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", help="folder of the records")
    parser.add_argument("--summarize", metavar="OUT", help="print the summary of OUT's records and exit")
    parser.add_argument("--max-fill-threads", type=int, help="override MAX_FILL_THREADS in the engine")
    parser.add_argument("--measure", metavar="NAME", help="run `surge bench serve` and account the CPU")
    parser.add_argument("--server-pid", type=int, help="with --measure: the `surge serve` process")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then `surge serve` (or bench) flags")
    args = parser.parse_args()
    if args.measure:
        if args.server_pid is None:
            parser.error("--measure needs --server-pid")
        measure(args.measure, args.server_pid, [a for a in args.serve_args if a != "--"])
        return
    if args.summarize:
        summary = summarize(args.summarize)
        print(json.dumps(summary, indent=1))
        with open(os.path.join(args.summarize, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        return
    if not args.out:
        parser.error("--out is required to serve")
    serve_args = [a for a in args.serve_args if a != "--"]
    from surge.cli import main as surge_main

    sys.exit(surge_main(["serve", *serve_args]))


if _out_dir() is not None and "--summarize" not in sys.argv and "--measure" not in sys.argv:
    _install()

if __name__ == "__main__":
    main()
