"""``surge bench serve | matrix | compare | roofline``: argument parsing and the four entry points.

Heavy modules (aiohttp, matplotlib, transformers) are imported inside the handlers so that
``surge --help`` stays fast. Each handler returns the exit code: 0 on success, 1 when a request or a
point failed; a bad flag raises ``ValueError`` with one readable line (``surge.cli`` prints it, exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


def _add_hardware_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("roofline")
    g.add_argument(
        "--gpu", default=None, help="known GPU name for default ceilings (h200, h100-sxm, a100-80gb, ...)"
    )
    g.add_argument(
        "--hbm-bandwidth", type=float, default=None, help="HBM read bandwidth in bytes/s (e.g. 4.24e12)"
    )
    g.add_argument("--peak-flops", type=float, default=None, help="dense bf16 peak in FLOP/s (e.g. 7.9e14)")
    g.add_argument(
        "--model-config",
        default=None,
        help="model folder or config.json for the roofline (default: a known local model folder)",
    )


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=DEFAULT_BASE_URL, help=f"server URL (default {DEFAULT_BASE_URL})")
    p.add_argument(
        "--endpoint", default="/v1/chat/completions", choices=["/v1/chat/completions", "/v1/completions"]
    )
    p.add_argument("--model", default=None, help="model name sent in requests (default: first of /v1/models)")
    p.add_argument(
        "--tokenizer", default=None, help="local tokenizer folder (default: the server's /tokenize)"
    )
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed warm-up requests with other prompts (default 1)"
    )
    p.add_argument("--percentiles", default="99", help="comma-separated percentiles to report (default 99)")
    p.add_argument(
        "--goodput", nargs="+", default=None, metavar="NAME:MS", help="SLOs, e.g. ttft:500 tpot:50 e2el:10000"
    )
    p.add_argument(
        "--request-timeout", type=float, default=6 * 3600.0, help="seconds per request (default 21600)"
    )
    p.add_argument("--disable-tqdm", action="store_true")
    _add_hardware_flags(p)


def _add_grid_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset", choices=["official-8b"], default=None, help="official-8b: the 30-point reference matrix"
    )
    p.add_argument("--concurrency", default=None, help="comma-separated, e.g. 1,4")
    p.add_argument("--input-len", default=None, help="comma-separated prompt lengths, e.g. 32,256")
    p.add_argument("--output-len", default=None, help="comma-separated output lengths, e.g. 256,1024")


def add_bench_parser(subparsers: Any) -> None:
    """Register ``surge bench`` and its sub-commands on the top-level ``subparsers``."""
    bench = subparsers.add_parser("bench", help="serving benchmark: serve, matrix, compare, roofline")
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="{serve,matrix,compare,roofline}")

    p = sub.add_parser("serve", help="benchmark one workload against an OpenAI-compatible server")
    _add_client_flags(p)
    p.add_argument("--dataset", choices=["random", "sharegpt"], default="random")
    p.add_argument("--dataset-path", default=None, help="ShareGPT JSON file (for --dataset sharegpt)")
    p.add_argument("--input-len", type=int, default=256, help="prompt tokens (random dataset)")
    p.add_argument("--output-len", type=int, default=256, help="max_tokens of every request")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s; inf (default) = burst")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps (1 = Poisson)")
    p.add_argument("--ignore-eos", action="store_true", help="ask the server to ignore EOS")
    p.add_argument(
        "--exact-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fail requests whose completion_tokens != --output-len (default: on with --ignore-eos)",
    )
    p.add_argument("--result-file", default=None, help="write the result JSON here")
    p.add_argument(
        "--save-detailed", action="store_true", help="also save texts, E2ELs and start times per request"
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("matrix", help="run a grid of burst points and write summary, tables and plots")
    _add_client_flags(p)
    _add_grid_flags(p)
    p.add_argument("--output-dir", default="bench-matrix", help="where to write the artifacts")
    p.add_argument(
        "--launch", default=None, help='start the server with this command, e.g. "surge serve --port 8000"'
    )
    p.add_argument(
        "--server-timeout", type=float, default=600.0, help="seconds to wait for /health (default 600)"
    )
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("compare", help="compare two matrix summaries (files or folders)")
    p.add_argument("base")
    p.add_argument("new")
    p.add_argument(
        "--metric", default="output_throughput", help="summary field to compare (default output_throughput)"
    )
    p.add_argument("--plot", default=None, help="write a PNG of the per-point change")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("roofline", help="print the per-point throughput ceilings of a model on a GPU")
    p.add_argument("--model", required=True, help="model folder or config.json")
    p.add_argument("--dtype", default=None, help="weight/KV dtype (default: the config's)")
    _add_grid_flags(p)
    g = p.add_argument_group("hardware")
    g.add_argument("--gpu", default=None)
    g.add_argument("--hbm-bandwidth", type=float, default=None)
    g.add_argument("--peak-flops", type=float, default=None)
    p.set_defaults(func=cmd_roofline)


def _command_line() -> str:
    return shlex.join(["surge", *sys.argv[1:]]) if sys.argv else "surge"


def _serve_config(args: argparse.Namespace, **over: Any) -> Any:
    from surge.bench.metrics import parse_goodput, parse_percentiles
    from surge.bench.roofline import resolve_hardware
    from surge.bench.serve import ServeConfig

    goodput = parse_goodput(args.goodput or [])
    fields: dict[str, Any] = {
        "base_url": args.base_url,
        "endpoint": args.endpoint,
        "model": args.model,
        "tokenizer": args.tokenizer,
        "seed": args.seed,
        "warmup": args.warmup,
        "percentiles": tuple(parse_percentiles(args.percentiles)),
        "goodput": tuple(goodput.items()),
        "api_key": args.api_key,
        "hardware": resolve_hardware(args.gpu, args.hbm_bandwidth, args.peak_flops),
        "model_config": args.model_config,
        "disable_tqdm": args.disable_tqdm,
        "request_timeout_s": args.request_timeout,
    }
    fields.update(over)
    cfg = ServeConfig(**fields)
    cfg.validate()
    return cfg


def cmd_serve(args: argparse.Namespace) -> int:
    """``surge bench serve``: exit 0 when every request succeeded, 1 otherwise."""
    from surge.bench.report import format_result_table
    from surge.bench.serve import run_serve

    cfg = _serve_config(
        args,
        dataset=args.dataset,
        dataset_path=args.dataset_path,
        input_len=args.input_len,
        output_len=args.output_len,
        num_prompts=args.num_prompts,
        max_concurrency=args.max_concurrency,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        ignore_eos=args.ignore_eos,
        exact_length=args.ignore_eos if args.exact_length is None else args.exact_length,
        save_detailed=args.save_detailed,
    )
    result = run_serve(cfg, _command_line())
    print(format_result_table(result))
    if args.result_file:
        path = Path(args.result_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"result written to {path}")
    return 0 if result["failed"] == 0 else 1


def _grid(args: argparse.Namespace) -> list[Any]:
    from surge.bench.matrix import PRESETS, grid_points, parse_int_list

    custom = [args.concurrency, args.input_len, args.output_len]
    if args.preset:
        if any(v is not None for v in custom):
            raise ValueError("use either --preset or --concurrency/--input-len/--output-len, not both")
        return PRESETS[args.preset]()
    if any(v is None for v in custom):
        raise ValueError("give --preset official-8b or all of --concurrency, --input-len and --output-len")
    return grid_points(
        parse_int_list(args.concurrency, "--concurrency"),
        parse_int_list(args.input_len, "--input-len"),
        parse_int_list(args.output_len, "--output-len"),
    )


def cmd_matrix(args: argparse.Namespace) -> int:
    """``surge bench matrix``: exit 0 when every point succeeded, 1 otherwise."""
    from surge.bench.matrix import MatrixConfig, run_matrix

    points = _grid(args)
    cfg = _serve_config(args, ignore_eos=True, exact_length=True)
    mcfg = MatrixConfig(tuple(points), cfg, Path(args.output_dir), args.launch, args.server_timeout)
    summary = run_matrix(mcfg, _command_line())
    print((Path(args.output_dir) / "summary.md").read_text())
    print(
        f"{summary['num_successful']}/{summary['num_points']} points successful; artifacts in {args.output_dir}"
    )
    return 0 if summary["num_successful"] == summary["num_points"] else 1


def cmd_compare(args: argparse.Namespace) -> int:
    """``surge bench compare BASE NEW``: markdown to stdout, optional PNG; exit 0.

    Raises:
        ValueError: no point is valid in both runs (nothing to compare).
    """
    from surge.bench.compare import compare_points, comparison_markdown, load_points, plot_comparison

    cmp = compare_points(load_points(args.base), load_points(args.new), args.metric)
    if not cmp.rows:
        raise ValueError(f"no point is valid in both {args.base} and {args.new}: nothing to compare")
    print(comparison_markdown(cmp, args.base, args.new), end="")
    if args.plot:
        plot_comparison(cmp, Path(args.plot))
    return 0


def cmd_roofline(args: argparse.Namespace) -> int:
    """``surge bench roofline``: print the per-point ceilings; needs --gpu or both numbers."""
    from surge.bench.matrix import official_8b_points
    from surge.bench.roofline import (
        format_roofline_table,
        load_config,
        model_shape,
        point_roofline,
        resolve_hardware,
    )

    hw = resolve_hardware(args.gpu, args.hbm_bandwidth, args.peak_flops)
    if hw is None:
        raise ValueError("the roofline needs --gpu NAME or both --hbm-bandwidth and --peak-flops")
    shape = model_shape(load_config(args.model), args.dtype)
    if args.preset or any(v is not None for v in (args.concurrency, args.input_len, args.output_len)):
        points = _grid(args)
    else:
        points = official_8b_points()
    rows = [point_roofline(shape, hw, p.concurrency, p.input_len, p.output_len) for p in points]
    print(format_roofline_table(shape, hw, rows))
    return 0
