"""Where the time of one decode step goes, at TP=1 and under tensor parallelism.

``--batch`` requests (default 1) decode ``--steps`` tokens after ``--warmup`` steps (each prompt is
``--prompt-len`` tokens; ``ignore_eos``; all prefilled in the first step when the token budget
allows); each configuration of ``--tp`` (e.g. ``1,2``) runs in a fresh child
process, one after the other. Per decode step it records:

- engine side (one ``LLMEngine.step()`` call; with asynchronous scheduling it launches step k
  and applies step k-1): ``wall_ms`` (the step period), ``schedule_ms``, ``encode_ms`` and
  ``publish_ms`` (TP: the step message and its ZMQ broadcast), ``launch_ms`` (TP=1: the
  runner's ``execute_async``), ``advance_ms``, ``result_wait_ms`` (waiting for the previous
  step's sampled ids), ``update_ms`` (the scheduler's update and the rest of the call);
- the model side (TP: every worker rank, from the files its
  :class:`surge.parallel.step_clock.StepClock` writes when the executor is built with
  ``step_timing_path``; TP=1: the same marks taken in process): ``bcast_ms`` (the engine starts
  the publish -> the worker has read the message), ``decode_ms`` (message -> SchedulerOutput),
  ``prepare_ms`` and ``launch_ms`` (the runner's input preparation and kernel / graph launch),
  ``ids_wait_ms`` (blocked on the sampled ids), ``result_ms`` (rank 0 has the ids -> the engine
  has its StepResult), ``launch_skew_ms`` (rank r > 0: how much later than rank 0 it finished
  launching the step; a rank that launches late holds the others in the step's first
  collective), and on CUDA ``gpu_ms`` and ``gpu_gap_ms``: CUDA events just before and just
  after ``execute_async`` give the device span of the step (its input copies to the copy of its
  sampled ids) and the device's idle time before it (from the previous step's end event). When
  the host keeps ahead (``gpu_gap_ms`` near 0), ``gpu_ms`` is the step's device time; when the
  device waits on the host, the wait shows in ``gpu_gap_ms`` and, for launches that trail the
  device within the step, in ``gpu_ms``.

Output: JSON lines (``kind`` = ``engine``, ``worker`` or ``summary``; the summary holds the
medians and p90s of every field) to ``--json`` and the summaries to stdout.

GPU (two GPUs, Qwen3-8B dummy weights, about 40 s; TP=1 runs on GPU 0):

    python3 benchmarks/tp_step_timing.py .assets/models/qwen3-8b --tp 1,2 --steps 200 --json OUT.jsonl

CPU (gloo, tiny model; timings there say little about the GPU host):

    python3 benchmarks/tp_step_timing.py surge/assets/stories260K --tp 1,2 --device cpu \\
        --dtype float32 --max-model-len 512 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.sampling_params import SamplingParams


class _TimedHandle:
    """Wraps a step handle: times the wait in ``result()``."""

    def __init__(self, inner: Any, rec: dict[str, Any]) -> None:
        self._inner = inner
        self._rec = rec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def result(self) -> Any:
        self._rec["t_wait"] = time.perf_counter()
        out = self._inner.result()
        self._rec["t_result"] = time.perf_counter()
        return out


class _TimedRunner:
    """Wraps the engine's runner (a ModelRunner or a TPExecutor) and marks each launch.

    TP: the step message is encoded and published here as ``TPExecutor.execute_async`` does,
    so the two are timed apart. TP=1: the in-process runner gets the worker's marks
    (:class:`~surge.parallel.step_clock.StepClock`) and its CUDA events.
    """

    def __init__(self, inner: Any, tp: int, clock: Any | None) -> None:
        self._inner = inner
        self._tp = tp
        self._clock = clock
        self.launches: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute_async(self, so: Any) -> Any:
        rec: dict[str, Any] = {"t_exec": time.perf_counter()}
        self.launches.append(rec)
        if self._tp > 1:
            from surge.parallel.executor import _RemoteStep

            ex = self._inner
            msg = ex._steps.encode(so)
            rec["step"] = msg.step
            rec["t_encoded"] = time.perf_counter()
            ex._publish(msg)
            rec["t_published"] = time.perf_counter()
            ids = [s.request.request_id for s in so.scheduled if s.sample]
            handle: Any = _RemoteStep(ex, msg.step, ids, bool(ids) or msg.any_prompt_logprobs)
        else:
            step = len(self.launches) - 1
            rec["step"] = step
            clock = self._clock
            assert clock is not None
            clock.received(step)
            clock.launching()
            handle = self._inner.execute_async(so)
            clock.launched(handle)
            rec["t_published"] = time.perf_counter()
        return _TimedHandle(handle, rec)

    def execute(self, so: Any) -> Any:
        """Synchronous scheduling: launch and wait, timed as the two halves."""
        return self.execute_async(so).result()


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round((b - a) * 1e3, 4)


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keys = sorted({k for r in rows for k, v in r.items() if k.endswith("_ms") and v is not None})
    for k in keys:
        vals = sorted(r[k] for r in rows if r.get(k) is not None)
        if vals:
            out[k] = {
                "median": round(statistics.median(vals), 4),
                "p90": round(vals[int(0.9 * (len(vals) - 1))], 4),
                "mean": round(statistics.fmean(vals), 4),
            }
    return out


def run_one(args: argparse.Namespace, tp: int) -> list[dict[str, Any]]:
    """Run one configuration in this process; returns its JSON records."""
    config = build_engine_config(
        args.model,
        dtype=args.dtype,
        load_format=args.load_format,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        enforce_eager=args.enforce_eager,
        async_scheduling={"auto": None, "on": True, "off": False}[args.async_scheduling],
        tensor_parallel_size=tp,
        tp_all_reduce=args.tp_all_reduce,
        num_kv_blocks=args.num_kv_blocks,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        stream_decode=args.stream_decode,
        stream_attention=args.stream_attention,
    )
    cuda = config.device.startswith("cuda")
    tmp = tempfile.mkdtemp(prefix="surge-tp-timing-")
    timing_path = os.path.join(tmp, "steps")
    t0 = time.perf_counter()
    if tp > 1:
        from surge.parallel.executor import TPExecutor

        inner: Any = TPExecutor(config, step_timing_path=timing_path)
        clock = None
    else:
        from surge.parallel.step_clock import StepClock
        from surge.worker.model_runner import ModelRunner

        inner = ModelRunner(config)
        clock = StepClock(0, cuda)
    runner = _TimedRunner(inner, tp, clock)
    engine = LLMEngine(config, runner=runner)
    start_s = time.perf_counter() - t0
    total = args.warmup + args.steps
    if args.sample:  # Qwen3's generation-config sampling, as the serving benchmarks see it
        params = SamplingParams(temperature=0.6, top_k=20, top_p=0.95, max_tokens=total, ignore_eos=True)
    else:
        params = SamplingParams(temperature=0.0, max_tokens=total, ignore_eos=True)
    for b in range(args.batch):
        engine.add_request(f"r{b}", [(7 * i + 3 * b + 3) % 200 + 10 for i in range(args.prompt_len)], params)
    calls: list[dict[str, Any]] = []
    t_run = time.perf_counter()
    while engine.has_unfinished_requests():
        n = len(runner.launches)
        t_a = time.perf_counter()
        engine.step()
        t_b = time.perf_counter()
        calls.append(
            {"t_call": t_a, "t_end": t_b, "launch": runner.launches[n] if len(runner.launches) > n else None}
        )
    run_s = time.perf_counter() - t_run
    engine.close()
    worker_recs: list[dict[str, Any]] = []
    if tp > 1:
        for rank in range(tp):
            path = f"{timing_path}.rank{rank}.jsonl"
            if os.path.exists(path):
                with open(path) as f:
                    worker_recs += [json.loads(line) for line in f]
    else:
        assert clock is not None
        worker_recs = clock.records()
    by_step = {lr["step"]: lr for lr in runner.launches}
    records: list[dict[str, Any]] = []
    engine_rows: list[dict[str, Any]] = []
    # Call i launches step i (after the prefill, one decode step per call) and, with async
    # scheduling, waits for step i-1; without it, for step i.
    for i, c in enumerate(calls):
        lr = c["launch"]
        if lr is None or i < 1 + args.warmup:
            continue
        waited = by_step.get(lr["step"] - 1) if config.async_scheduling else lr
        row = {
            "kind": "engine",
            "tp": tp,
            "call": i,
            "step": lr["step"],
            "wall_ms": _ms(calls[i - 1]["t_call"], c["t_call"]) if i else None,
            "schedule_ms": _ms(c["t_call"], lr["t_exec"]),
            "encode_ms": _ms(lr["t_exec"], lr.get("t_encoded")),
            "publish_ms": _ms(lr.get("t_encoded"), lr["t_published"]),
            "launch_ms": _ms(lr["t_exec"], lr["t_published"]) if tp == 1 else None,
            "advance_ms": _ms(lr["t_published"], waited.get("t_wait") if waited else None),
            "result_wait_ms": _ms(waited.get("t_wait"), waited.get("t_result")) if waited else None,
            "update_ms": _ms(waited.get("t_result"), c["t_end"]) if waited else None,
        }
        engine_rows.append(row)
    first_step = calls[1 + args.warmup]["launch"]["step"] if len(calls) > 1 + args.warmup else 0
    worker_rows: list[dict[str, Any]] = []
    rank0_launched = {w["step"]: w.get("t_returned") for w in worker_recs if w["rank"] == 0}
    for w in worker_recs:
        if w["step"] < first_step:
            continue
        lr = by_step.get(w["step"])
        row = {
            "kind": "worker",
            "tp": tp,
            "rank": w["rank"],
            "step": w["step"],
            "bcast_ms": _ms(lr["t_encoded"], w["t_recv"]) if lr and tp > 1 else None,
            "decode_ms": _ms(w["t_recv"], w.get("t_decoded")) if tp > 1 else None,
            "prepare_ms": _ms(w.get("t_start"), w.get("t_prepared")),
            "launch_ms": _ms(w.get("t_prepared"), w.get("t_launched")),
            "ids_wait_ms": _ms(w.get("t_resolve"), w.get("t_ids")),
            "result_ms": _ms(w.get("t_ids"), lr.get("t_result")) if lr and w.get("t_sent") else None,
            "gpu_ms": round(w["gpu_ms"], 4) if "gpu_ms" in w else None,
            "gpu_gap_ms": round(w["gpu_gap_ms"], 4) if "gpu_gap_ms" in w else None,
            "launch_skew_ms": _ms(rank0_launched.get(w["step"]), w.get("t_returned")) if w["rank"] else None,
        }
        worker_rows.append(row)
    records += engine_rows + worker_rows
    summary: dict[str, Any] = {
        "kind": "summary",
        "tp": tp,
        "model": args.model,
        "device": config.device,
        "async_scheduling": config.async_scheduling,
        "enforce_eager": config.enforce_eager,
        "stream_decode": config.stream_decode,
        "stream_attention": config.stream_attention,
        "tp_all_reduce": args.tp_all_reduce,
        "steps": len(engine_rows),
        "batch": args.batch,
        "start_s": round(start_s, 1),
        "run_s": round(run_s, 2),
        "engine": _summary(engine_rows),
    }
    for rank in range(tp):
        summary[f"rank{rank}"] = _summary([r for r in worker_rows if r["rank"] == rank])
    records.append(summary)
    return records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--tp", default="1,2", help="comma-separated tensor-parallel sizes, each run in turn")
    p.add_argument("--steps", type=int, default=200, help="decode steps measured")
    p.add_argument("--warmup", type=int, default=20, help="decode steps run first and not reported")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument(
        "--batch", type=int, default=1, help="requests decoding together (--max-num-seqs at least)"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=8, help="fewer CUDA graphs to capture")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="TP=1: skip the profiling run")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--async-scheduling", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--tp-all-reduce", choices=("auto", "nccl"), default="auto")
    p.add_argument("--quantization", choices=("fp8",), default=None, help="FP8 weights (quantized at load)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    p.add_argument(
        "--stream-decode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="FP8: one-token steps through the persistent stream kernel (the engine's default)",
    )
    p.add_argument(
        "--stream-attention",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="FP8 stream kernel: attention inside it too (EngineConfig.stream_attention; default: the "
        "engine's, wherever it can)",
    )
    p.add_argument(
        "--sample", action="store_true", help="temperature 0.6, top-k 20, top-p 0.95 instead of greedy"
    )
    p.add_argument("--json", default=None, help="write every record here (JSON lines)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="longest run of one configuration")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child: run --tp here
    args = p.parse_args()
    if args.batch < 1 or args.batch > args.max_num_seqs:
        sys.exit(f"error: --batch must be in 1..--max-num-seqs ({args.max_num_seqs}), got {args.batch}")
    try:
        sizes = [int(x) for x in args.tp.split(",") if x]
    except ValueError:
        sys.exit(f"error: --tp: expected comma-separated integers, got {args.tp!r}")
    if not sizes or min(sizes) < 1 or args.steps < 1 or args.warmup < 0:
        sys.exit("error: --tp sizes and --steps must be positive, --warmup non-negative")
    if args.one:
        for rec in run_one(args, sizes[0]):
            print(json.dumps(rec))
        return
    lines: list[str] = []
    for tp in sizes:
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--tp", str(tp), "--one"]
        cmd = [c for i, c in enumerate(cmd) if not (c == "--json" or (i and cmd[i - 1] == "--json"))]
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            sys.exit(f"error: the TP={tp} run did not finish within {args.timeout_s:.0f} s")
        if proc.returncode != 0:
            sys.exit(f"error: the TP={tp} run failed (exit code {proc.returncode})")
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                lines.append(line)
                if json.loads(line).get("kind") == "summary":
                    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
