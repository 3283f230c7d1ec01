"""Write ``vllm_metrics_golden.json``: synthetic per-request timings and the aggregates that vLLM
0.26's own ``calculate_metrics`` (``vllm/benchmarks/serve.py``) computes from them, for
``tests/bench/test_metrics_vs_vllm.py``.

vLLM's module imports packages Surge does not need, so this script reads its source, takes the
``BenchmarkMetrics`` class and the ``calculate_metrics`` function out of it with ``ast`` and runs
them as they are (nothing of vLLM's code is kept: the file holds inputs and vLLM's numbers only).

Usage: ``python tests/bench/data/make_vllm_metrics_golden.py VLLM_DIR`` where ``VLLM_DIR`` is the
``vllm`` package folder of an unpacked vLLM 0.26 wheel. Needs numpy only.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import io
import json
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np

PERCENTILES = [0.0, 25.0, 50.0, 90.0, 99.0, 99.9, 100.0]
GOODPUTS: list[dict[str, float]] = [
    {},
    {"ttft": 400.0},
    {"tpot": 30.0},
    {"e2el": 1500.0},
    {"ttft": 600.0, "tpot": 40.0, "e2el": 2000.0},
    {"tpot": 0.0},
]


def _vllm_calculate_metrics(vllm_dir: Path) -> Any:
    """vLLM's ``calculate_metrics``, compiled from its source with the names it uses."""
    tree = ast.parse((vllm_dir / "benchmarks" / "serve.py").read_text())
    wanted = {"BenchmarkMetrics", "calculate_metrics", "MILLISECONDS_TO_SECONDS_CONVERSION"}
    ns: dict[str, Any] = {
        "np": np,
        "warnings": warnings,
        "dataclass": dataclasses.dataclass,
        "field": dataclasses.field,
        "Any": Any,
        "TERM_PLOTLIB_AVAILABLE": False,
        "RequestFuncOutput": object,
        "SampleRequest": object,
        "TokenizerLike": object,
    }
    for node in tree.body:
        names = {getattr(node, "name", None)} | {getattr(t, "id", None) for t in getattr(node, "targets", [])}
        if names & wanted:
            exec(compile(ast.Module(body=[node], type_ignores=[]), "vllm-serve", "exec"), ns)
    return ns["calculate_metrics"]


def _runs(rng: random.Random) -> list[dict[str, Any]]:
    """Runs of 1 to 25 requests: failures, one-token answers, chunks of several tokens (fewer ITL
    gaps than tokens), starts spread over a few seconds (the peak buckets)."""
    runs = []
    for k in range(12):
        requests = []
        for _ in range(rng.randint(1, 25)):
            n = rng.choice([1, 2, 3, 8, 17, 33])
            chunks = n if rng.random() < 0.6 else max(1, (n + 3) // 4)  # --stream-interval 4
            ttft = round(rng.uniform(0.001, 0.9), 6)
            itl = [round(rng.uniform(0.0, 0.08), 6) for _ in range(chunks - 1)]
            requests.append(
                {
                    "success": rng.random() > 0.1,
                    "prompt_len": rng.randint(1, 300),
                    "output_len": n,
                    "ttft": ttft,
                    "itl": itl,
                    "latency": ttft + sum(itl),
                    "start_time": round(1000.0 + rng.uniform(0.0, 4.0), 6),
                }
            )
        runs.append(
            {
                "duration": round(rng.uniform(1.0, 8.0), 3),
                "goodput": GOODPUTS[k % len(GOODPUTS)],
                "requests": requests,
            }
        )
    return runs


def main() -> None:
    """Compute vLLM's aggregates for the synthetic runs and write them next to this script."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vllm_dir", type=Path, help="the vllm package folder of an unpacked vLLM 0.26 wheel")
    args = ap.parse_args()
    calculate_metrics = _vllm_calculate_metrics(args.vllm_dir)
    runs = _runs(random.Random(26))
    for run in runs:
        outputs = [
            argparse.Namespace(
                success=r["success"],
                output_tokens=r["output_len"],
                generated_text="",
                prompt_len=r["prompt_len"],
                ttft=r["ttft"],
                itl=r["itl"],
                latency=r["latency"],
                start_time=r["start_time"],
                input_audio_duration=0.0,
                error="" if r["success"] else "failed",
            )
            for r in run["requests"]
        ]
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m, lens = calculate_metrics(None, outputs, run["duration"], None, PERCENTILES, run["goodput"])
        vllm: dict[str, Any] = {
            "output_lens": [int(x) for x in lens],
            "request_goodput": float(m.request_goodput) if run["goodput"] else None,
        }
        for f in dataclasses.fields(m):
            v = getattr(m, f.name)
            if f.name.startswith("percentiles_"):
                name = f.name.removeprefix("percentiles_").removesuffix("_ms")
                vllm.update({f"p{p:g}_{name}_ms": float(x) for p, x in v})
            elif f.name != "request_goodput" and isinstance(v, int | float | np.floating | np.integer):
                vllm[f.name] = float(v) if isinstance(v, float | np.floating) else int(v)
        run["vllm"] = vllm
    out = Path(__file__).with_name("vllm_metrics_golden.json")
    out.write_text(json.dumps({"percentiles": PERCENTILES, "runs": runs}, separators=(",", ":")) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
