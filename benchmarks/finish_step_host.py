"""Host time of an asynchronous engine step by the number of requests that finish in it.

Runs the real ``LLMEngine`` with asynchronous scheduling (on the CPU with the bundled
stories260K by default; ``--device cuda --model DIR --load-format dummy`` on a GPU, with CUDA
graphs) over ``--c`` requests of ``--input-len`` random token ids (prefilled in one step unless
``--max-num-batched-tokens`` is lower). For each count in ``--finishing`` a burst gives that many
requests ``--output-len`` tokens and the others ``--output-len + 8``, so that many reach
``max_tokens`` in one step. Each ``engine.step()`` call is split into the host pieces of the
finishing path, timed by wrapping them: ``schedule`` (``Scheduler.schedule``), ``drop`` (the
runner forgetting finished requests: ``StepSampler.drop`` + ``InputPreparer.drop``),
``prepare`` (``InputPreparer.prepare``), ``sampler_build`` (``StepSampler.metadata``: the
sampling tensors of a new batch composition), ``result`` (``StepHandle.result``: the wait for the
step in flight and its sampled ids) and ``update`` (``Scheduler.update``), next to ``call`` (the
whole ``step()`` call). The model's forward is left out: on the CPU it is the host's own work, on
a GPU it runs behind the host.

On CUDA each launched step also gets two timing events, recorded when ``execute_async`` starts
and when it returns (after the copy of the sampled ids is queued): ``gpu`` is the device time
between them and ``gap`` the device time from the previous launched step's end to this one's
start, which is idle time when the host launched late (0 when the host was ahead). Both are
shown on the row of the call that applied the step (the call after the one that launched it).

Prints the median over ``--rounds`` bursts (the first burst of each count warms up and is left
out) of each figure, in microseconds, for the calls around the one that applies the finishing
step (``N fin``).

Usage (from the repository root)::

    python benchmarks/finish_step_host.py --c 64 --input-len 256 --output-len 240 --finishing 0 1 32 64
    python3 benchmarks/finish_step_host.py --device cuda --model .assets/qwen3-8b --load-format dummy \\
        --quantization fp8 --c 64 --input-len 256 --output-len 256 --max-num-batched-tokens 8192 \\
        --finishing 0 64 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from surge.core.scheduler import Scheduler  # noqa: E402
from surge.engine.llm_engine import LLMEngine, build_engine_config  # noqa: E402
from surge.sampling_params import SamplingParams  # noqa: E402
from surge.worker.input_batch import InputPreparer  # noqa: E402
from surge.worker.model_runner import StepHandle  # noqa: E402
from surge.worker.sampling_state import StepSampler  # noqa: E402

PIECES = ("schedule", "drop", "prepare", "sampler_build", "result", "update", "call")
_WRAPPED = (
    (Scheduler, "schedule", "schedule"),
    (StepSampler, "drop", "drop"),
    (InputPreparer, "drop", "drop"),
    (InputPreparer, "prepare", "prepare"),
    (StepSampler, "metadata", "sampler_build"),
    (StepHandle, "result", "result"),
    (Scheduler, "update", "update"),
)


def _timed(fn: Callable[..., Any], key: str, acc: dict[str, float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0

    return wrapper


def burst(
    engine: LLMEngine, acc: dict[str, float], args: argparse.Namespace, finishing: int, seed: int
) -> list[dict[str, Any]]:
    """One burst; returns per ``step()`` call the seconds of each piece, the requests it
    launched, the outputs and finished requests it returned and, on CUDA, ``gpu`` / ``gap``
    seconds of the step it applied."""
    rng = np.random.default_rng(seed)
    vocab = engine.config.model.vocab_size
    for i in range(args.c):
        params = SamplingParams(
            temperature=0.6,
            top_p=0.95,
            top_k=20,
            max_tokens=args.output_len if i < finishing else args.output_len + 8,
            ignore_eos=True,
        )
        prompt = rng.integers(min(1000, vocab // 2), vocab, args.input_len).tolist()
        engine.add_request(f"s{seed}-f{finishing}-{i}", prompt, params)
    cuda = engine.runner.device.type == "cuda"
    launch = engine.runner.execute_async
    events: list[tuple[int, Any, Any]] = []  # (call index, start, end) per launched step
    calls: list[dict[str, Any]] = []

    def traced_launch(scheduler_output: Any) -> Any:
        calls[-1]["reqs"] = len(scheduler_output.scheduled)
        if not cuda:
            return launch(scheduler_output)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        handle = launch(scheduler_output)
        end.record()
        if not scheduler_output.is_empty:
            events.append((len(calls) - 1, start, end))
        return handle

    engine.runner.execute_async = traced_launch  # type: ignore[method-assign]
    try:
        while engine.has_unfinished_requests():
            acc.clear()
            calls.append({"reqs": 0})
            t0 = time.perf_counter()
            outs = engine.step()
            acc["call"] = time.perf_counter() - t0
            calls[-1].update(t=dict(acc), outs=len(outs), fin=sum(1 for o in outs if o.finish_reason))
    finally:
        del engine.runner.execute_async  # the class's method again
    if cuda:
        torch.cuda.synchronize()
        prev_end = None
        for k, start, end in events:
            if k + 1 < len(calls):
                t = calls[k + 1]["t"]
                t["gpu"] = start.elapsed_time(end) / 1e3
                t["gap"] = 0.0 if prev_end is None else prev_end.elapsed_time(start) / 1e3
            prev_end = end
    engine.reset_prefix_cache()
    return calls


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (default ``sys.argv[1:]``), build the engine and print, per ``--finishing``
    count, the median microseconds of each host piece around the finishing step (see the
    module docstring). A bad flag or model exits 2 with one line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "surge/assets/stories260K"))
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=240)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: c x input-len")
    ap.add_argument("--finishing", type=int, nargs="+", default=[0, 1, 32, 64])
    ap.add_argument("--rounds", type=int, default=3, help="measured bursts per count, after one warm-up")
    ap.add_argument("--around", type=int, default=3, help="calls shown before the finishing one")
    args = ap.parse_args(argv)
    for name in ("c", "input_len", "output_len", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if not all(0 <= f <= args.c for f in args.finishing):
        ap.error(f"--finishing counts must be in [0, --c={args.c}]")
    if args.device not in ("cpu", "cuda"):
        ap.error(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    if args.device == "cpu":
        torch.set_num_threads(1)
    try:
        engine = LLMEngine(
            build_engine_config(
                args.model,
                device=args.device,
                dtype=args.dtype,
                load_format=args.load_format,
                quantization=args.quantization,
                async_scheduling=True,
                max_num_seqs=args.c,
                max_num_batched_tokens=args.max_num_batched_tokens or args.c * args.input_len,
            )
        )
    except ValueError as e:
        ap.error(str(e).splitlines()[0])
    if args.input_len + args.output_len + 8 > engine.max_model_len:
        engine.close()
        ap.error(f"--input-len + --output-len + 8 must fit the model's max_model_len {engine.max_model_len}")
    acc: dict[str, float] = {}
    originals = [(cls, name, getattr(cls, name)) for cls, name, _ in _WRAPPED]
    for (cls, name, key), (_, _, fn) in zip(_WRAPPED, originals, strict=True):
        setattr(cls, name, _timed(fn, key, acc))
    columns = PIECES + (("gpu", "gap") if args.device == "cuda" else ())
    try:
        for finishing in args.finishing:
            burst(engine, acc, args, finishing, seed=1000 + finishing)  # warm-up
            runs = [burst(engine, acc, args, finishing, seed) for seed in range(args.rounds)]
            found = [k for k, c in enumerate(runs[-1]) if c["fin"]]
            end = found[0] if found else len(runs[-1]) - 1
            calls = min(len(r) for r in runs)
            print(
                f"{finishing} of {args.c} requests ask for {args.output_len} tokens (us, median of {args.rounds}):"
            )
            print("  call  launches applies          " + " ".join(f"{p:>13}" for p in columns))
            for k in range(max(0, end - args.around), min(calls, end + 4)):
                med = {p: statistics.median(r[k]["t"].get(p, 0.0) for r in runs) * 1e6 for p in columns}
                c = runs[-1][k]
                what = f"{c['reqs']:4d} reqs {c['outs']:3d} outs {c['fin']:3d} fin"
                print(f"  {k:4d}  {what}  " + " ".join(f"{med[p]:13.1f}" for p in columns))
    finally:
        for cls, name, fn in originals:
            setattr(cls, name, fn)
        engine.close()


if __name__ == "__main__":
    main()
