"""A matrix's % of roofline recomputed with today's roofline (``surge.bench.roofline``): each point's
measured output throughput over its ceiling, and the geometric mean, beside the figures its
``summary.json`` recorded when it ran.

    PYTHONPATH=. python3 benchmarks/roofline_recompute.py \
        benchmarks/results/h200-qwen3-8b-fp8/session47/surge-fp8/summary.json \
        --model ../shared/assets/models/qwen3-8b --gpu h200 --dtype fp8
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from surge.bench.roofline import load_config, lookup_gpu, model_shape, point_roofline


def main() -> None:
    """Print the recorded and recomputed geometric means (%) of one summary."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("summary", help="a bench matrix summary.json")
    ap.add_argument("--model", required=True, help="the model folder or config.json")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--kv-cache-dtype", default=None)
    args = ap.parse_args()
    data = json.loads(Path(args.summary).read_text())
    points = data["points"] if isinstance(data, dict) else data
    shape = model_shape(load_config(args.model), args.dtype, 1, args.kv_cache_dtype)
    hw = lookup_gpu(args.gpu)
    old, new = [], []
    for p in points:
        ceiling = point_roofline(shape, hw, p["concurrency"], p["input_len"], p["output_len"])
        new.append(p["output_throughput"] / ceiling.output_throughput)
        old.append(p["output_throughput"] / p["roofline_output_throughput"])

    def geomean(values: list[float]) -> float:
        return 100 * math.exp(sum(map(math.log, values)) / len(values))

    print(f"{len(points)} points: recorded {geomean(old):.2f} %, recomputed {geomean(new):.2f} %")


if __name__ == "__main__":
    main()
