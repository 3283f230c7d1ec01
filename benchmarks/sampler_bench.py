"""Microbenchmark of top-k / top-p in the sampler: full sort against the ``torch.topk`` window.

For each batch size ``B`` (default 1, 16, 64, 256) at vocabulary ``V`` (default 151936, Qwen3)
with every row at ``--top-k`` / ``--top-p`` (default 20 / 0.95, Qwen3's generation defaults),
times per call, in ms:

* ``scatter``: the sampler's previous code (sort, masks in sorted order, scatter back);
* ``sort``: :func:`surge.layers.top_k_top_p.apply_top_k_top_p` (sort, cutoff compare; the
  fallback for top-p without top-k and ``k > TOP_K_WINDOW_MAX``);
* ``window``: :func:`surge.layers.top_k_top_p.apply_top_k_top_p_window` (the fast path);
* ``sampler_sort`` / ``sampler_window``: a whole :class:`surge.layers.sampler.Sampler` call
  (temperature 0.6, top-k, top-p, the exponential race over the full row) on either
  top-k/top-p path;
* ``sampler_fused``: a whole sampler call on the fused window path (CUDA only:
  ``torch.topk`` + :mod:`surge.kernels.window_sample`; what a batch of such rows takes in
  the engine). ``fused_in_support`` checks its tokens are all kept by the sort path's mask.

CUDA: eager launches timed with CUDA events (the sampler runs eagerly after the decode
graph), median of ``--reps`` calls after warm-up; ``*_graph`` columns replay a CUDA graph of
20 calls (GPU time without launch cost; "n/a" if capture fails); ``*_kernels`` columns count
the device operations (kernels, memsets, copies) of one call with ``torch.profiler``. CPU:
wall clock, median. ``--sweep-k`` also times ``window`` against ``sort`` at several ``k``
(to choose ``TOP_K_WINDOW_MAX``).

Run (repo root): ``PYTHONPATH=. python3 benchmarks/sampler_bench.py [--device cuda]
[--json OUT] [--batches 1,16,64,256] [--sweep-k] [--min-p P]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from surge.layers.sampler import Sampler, SamplingMetadata
from surge.layers.top_k_top_p import TOP_K_WINDOW_MAX, apply_top_k_top_p, apply_top_k_top_p_window
from surge.sampling_params import SamplingParams

SWEEP_KS = (20, 50, 100, 256, 512, 1024, 2048, 4096)


def _scatter_path(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The sampler's top-k/top-p before the window path (for comparison only)."""
    v = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k <= 0, v, top_k).clamp(1, v)
    kth = sorted_logits.gather(1, (k - 1)[:, None])
    sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs
    sorted_logits.masked_fill_(before > top_p[:, None], float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _time_ms(fn: Callable[[], object], device: str, reps: int, warmup: int) -> float:
    """Median ms per call: CUDA events around each eager call, or the wall clock on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _time_graph_ms(
    fn: Callable[[], object], reps: int, calls: int = 20, generator: torch.Generator | None = None
) -> float | None:
    """Median ms per call over replays of a CUDA graph holding ``calls`` calls; None when the
    capture fails. A ``generator`` that ``fn`` draws from is registered with the graph."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if generator is not None:
            graph.register_generator_state(generator)
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except (RuntimeError, AttributeError):
        torch.cuda.synchronize()
        return None
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(max(5, reps // 4)):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def _count_device_ops(fn: Callable[[], object]) -> int | None:
    """Device operations (kernels, memsets, copies) of one ``fn()`` call, by ``torch.profiler``;
    None when the profiler gives no device events."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    n = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return n or None


def _case(
    batch: int,
    vocab: int,
    k: int,
    p: float,
    device: str,
    reps: int,
    warmup: int,
    graph: bool,
    min_p: float = 0.0,
    count: bool = False,
) -> dict[str, Any]:
    g = torch.Generator(device=device).manual_seed(batch)
    # bf16-rounded logits as an LM head produces (ties are common at the k-th value).
    logits = (torch.randn(batch, vocab, device=device, generator=g) * 4).to(torch.bfloat16).float()
    top_k = torch.full((batch,), k, dtype=torch.int64, device=device)
    top_p = torch.full((batch,), p, dtype=torch.float32, device=device)
    params = [SamplingParams(temperature=0.6, top_k=k, top_p=p, min_p=min_p)] * batch
    md = SamplingMetadata.build(params, [[]] * batch, [[]] * batch, [()] * batch, vocab, device)
    md_window = dataclasses.replace(md, window_sample=False)
    md_sort = dataclasses.replace(md, window_sample=False, top_k_window=None)
    sampler = Sampler(seed=0, device=device)
    window = min(k, vocab)
    fns: dict[str, Callable[[], object]] = {
        "scatter": lambda: _scatter_path(logits, top_k, top_p),
        "sort": lambda: apply_top_k_top_p(logits, top_k, top_p),
        "window": lambda: apply_top_k_top_p_window(logits, top_k, top_p, window),
        "sampler_sort": lambda: sampler(logits, md_sort),
    }
    if md_window.top_k_window is not None:
        fns["sampler_window"] = lambda: sampler(logits, md_window)
    if md.window_sample and device == "cuda":
        fns["sampler_fused"] = lambda: sampler(logits, md)
    kept = torch.isfinite(fns["sort"]())  # type: ignore[arg-type]
    same = torch.equal(kept, torch.isfinite(fns["window"]()))  # type: ignore[arg-type]
    row: dict[str, Any] = {
        "batch": batch,
        "vocab": vocab,
        "top_k": k,
        "top_p": p,
        "min_p": min_p,
        "same_mask": same,
    }
    if "sampler_fused" in fns:
        toks = fns["sampler_fused"]()
        row["fused_in_support"] = bool(kept.gather(1, toks[:, None]).all())  # type: ignore[index]
    for name, fn in fns.items():
        row[name] = round(_time_ms(fn, device, reps, warmup), 4)
        if graph:
            gen = sampler.generator if name.startswith("sampler") else None
            t = _time_graph_ms(fn, reps, generator=gen)
            row[name + "_graph"] = None if t is None else round(t, 4)
        if count and device == "cuda":
            row[name + "_kernels"] = _count_device_ops(fn)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", default="1,16,64,256", help="comma-separated batch sizes")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--min-p", type=float, default=0.0, help="min_p of every row (default 0: off)")
    ap.add_argument("--no-count", action="store_true", help="CUDA: skip the *_kernels columns")
    ap.add_argument("--reps", type=int, default=0, help="timed calls per case (default 200 CUDA, 5 CPU)")
    ap.add_argument("--no-graph", action="store_true", help="CUDA: skip the CUDA-graph columns")
    ap.add_argument("--sweep-k", action="store_true", help=f"also time window vs sort at k in {SWEEP_KS}")
    ap.add_argument("--json", metavar="OUT", help="write the rows as JSON to OUT")
    args = ap.parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("sampler_bench: --device cuda but no CUDA GPU is visible")
    reps = args.reps or (200 if device == "cuda" else 5)
    warmup = 10 if device == "cuda" else 1
    graph = device == "cuda" and not args.no_graph
    batches = [int(b) for b in args.batches.split(",") if b]
    print(
        f"device={device} vocab={args.vocab} top_k={args.top_k} top_p={args.top_p} min_p={args.min_p} reps={reps} "
        f"TOP_K_WINDOW_MAX={TOP_K_WINDOW_MAX}  (ms per call, median)"
    )
    rows = []
    for b in batches:
        row = _case(
            b, args.vocab, args.top_k, args.top_p, device, reps, warmup, graph, args.min_p, not args.no_count
        )
        rows.append(row)
        print(json.dumps(row))
    sweep = []
    if args.sweep_k:
        for b in batches:
            for k in SWEEP_KS:
                row = _case(
                    b, args.vocab, k, args.top_p, device, max(5, reps // 4), warmup, graph, args.min_p
                )
                keep = ("batch", "top_k", "same_mask", "sort", "window", "sort_graph", "window_graph")
                row = {key: row[key] for key in keep if key in row}
                sweep.append(row)
                print(json.dumps(row))
    if args.json:
        meta = {"device": device, "torch": torch.__version__, "top_k_window_max": TOP_K_WINDOW_MAX}
        if device == "cuda":
            meta["gpu"] = torch.cuda.get_device_name()
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "sweep_k": sweep}, f, indent=1)


if __name__ == "__main__":
    main()
