"""The sampler's top-k window: ``torch.topk`` against :func:`surge.kernels.topk.topk_rows`.

Times both inside CUDA graphs on ``[B, V]`` logits of ``--dtype`` (bf16 by default, as the sampler
gets them; Qwen3's vocabulary by default) and checks that the values are equal. ``topk_rows`` is
timed at every ``(chunk, group)`` pair of ``--chunk-group`` (default: ``default``, its own choice
for the row count); a pair that ``topk_rows``
refuses for a ``k`` (``chunk // group < k``), fails, or gives other values is reported in its
row and the sweep goes on (the exit status is 1 after a failure or a difference). Writes one
JSON line per (B, k, pair). Run on a GPU from the repository root::

    python3 benchmarks/topk_bench.py --rows 1 16 64 --k 32 64
    python3 benchmarks/topk_bench.py --rows 1 64 --k 32 --chunk-group 4096:16 8192:32 16384:64
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_bench import time_graph  # noqa: E402

from surge.kernels.topk import topk_rows  # noqa: E402


def chunk_group(text: str) -> tuple[int | None, int | None]:
    """``"C:G"`` -> ``(C, G)``: powers of two with ``C >= G`` (``C // G >= k`` is checked per
    ``k`` by ``topk_rows``); ``"default"`` -> ``(None, None)``, ``topk_rows``' own choice."""
    if text == "default":
        return None, None
    try:
        chunk, group = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CHUNK:GROUP, e.g. 4096:16, got {text!r}") from None
    if any(n < 1 or n & (n - 1) for n in (chunk, group)) or chunk < group:
        raise argparse.ArgumentTypeError(
            f"chunk and group must be powers of two, chunk >= group, got {text!r}"
        )
    return chunk, group


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--k", type=int, nargs="+", default=[32, 64])
    ap.add_argument(
        "--chunk-group",
        type=chunk_group,
        nargs="+",
        default=[(None, None)],
        metavar="C:G",
        help="topk_rows' (chunk, group) pairs to time; 'default' is its own choice (the default)",
    )
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", type=Path, help="append the results here")
    args = ap.parse_args()
    pairs = list(dict.fromkeys(args.chunk_group))
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__}; V = {args.vocab}; "
        f"{args.dtype}; chunk:group {' '.join(f'{c}:{g}' if c else 'default' for c, g in pairs)}"
    )
    bad = 0
    for b in args.rows:
        logits = (torch.randn(b, args.vocab, device="cuda") * 3).to(getattr(torch, args.dtype))
        for k in args.k:
            ref = torch.topk(logits, k).values
            t_torch = time_graph(lambda x=logits, k=k: torch.topk(x, k, dim=-1, sorted=True), args.reps)
            for chunk, group in pairs:
                row = {
                    "rows": b,
                    "k": k,
                    "dtype": args.dtype,
                    "chunk": chunk,
                    "group": group,
                    "torch_us": t_torch * 1e6,
                }
                pair = f"{chunk:5d}:{group:<3d}" if chunk else "default  "
                head = f"B={b:3d} k={k:3d} C:G={pair}  torch.topk {row['torch_us']:7.1f} us"
                try:
                    vals = topk_rows(logits, k, chunk=chunk, group=group)[0]
                    diff = int((vals != ref).sum())
                    t_ours = time_graph(
                        lambda x=logits, k=k, c=chunk, g=group: topk_rows(x, k, chunk=c, group=g), args.reps
                    )
                except ValueError as e:  # this pair does not fit this k (chunk // group < k)
                    row |= {"surge_us": None, "same_values": None, "refused": str(e)}
                    print(f"{head}  topk_rows refused: {e}")
                except Exception as e:  # a compile (resources) or launch failure: report it, go on
                    bad += 1
                    row |= {"surge_us": None, "same_values": None, "error": f"{type(e).__name__}: {e}"}
                    print(
                        f"{head}  topk_rows FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    )
                else:
                    bad += diff > 0
                    row |= {"surge_us": t_ours * 1e6, "same_values": diff == 0}
                    if diff:
                        row["values_differing"] = diff
                    print(
                        f"{head}  topk_rows {row['surge_us']:7.1f} us  x{t_torch / t_ours:.2f}  "
                        + ("same values" if diff == 0 else f"DIFFERENT VALUES ({diff} of {b * k} differ)")
                    )
                if args.json is not None:
                    with args.json.open("a") as f:
                        f.write(json.dumps(row) + "\n")
    if bad:
        print(f"{bad} (B, k, pair) result(s) failed or differed from torch.topk")
        sys.exit(1)


if __name__ == "__main__":
    main()
