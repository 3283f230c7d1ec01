"""``surge bench matrix``: a grid of burst points run one after another, with artifacts.

Each point (C, I, O) is a ``bench serve`` run with ``num_prompts = max_concurrency = C``,
``request_rate = inf``, ``--ignore-eos``, exact-length validation and the matrix seed. Written to
``--output-dir``: ``C{C}_I{I}_O{O}.json`` per point, ``summary.json``, ``summary.md``,
``throughput.png`` and ``latency.png`` (and ``server.log`` with ``--launch``).
With ``--launch CMD`` the server is started here, restarted when it dies (that point fails, the
matrix goes on) and stopped at the end.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from surge.bench.launcher import ServerLauncher
from surge.bench.report import plot_matrix, summary_markdown
from surge.bench.serve import ServeConfig, fetch_models, make_counter, run_serve
from surge.bench.tokens import TokenCounter


@dataclass(frozen=True)
class MatrixPoint:
    """One burst point: C concurrent requests of I prompt tokens and O output tokens."""

    concurrency: int
    input_len: int
    output_len: int

    @property
    def stem(self) -> str:
        """File stem ``C4_I256_O1024``."""
        return f"C{self.concurrency}_I{self.input_len}_O{self.output_len}"


def grid_points(concurrency: list[int], input_lens: list[int], output_lens: list[int]) -> list[MatrixPoint]:
    """The cartesian grid C x I x O, in that nesting order."""
    return [MatrixPoint(c, i, o) for c in concurrency for i in input_lens for o in output_lens]


def official_8b_points() -> list[MatrixPoint]:
    """The 30-point reference matrix: C 1,4 x I 32,256,4096 x O 256,1024,4096, then C 16,64 x I 32,256 x same O."""
    outs = [256, 1024, 4096]
    return grid_points([1, 4], [32, 256, 4096], outs) + grid_points([16, 64], [32, 256], outs)


PRESETS = {"official-8b": official_8b_points}


def parse_int_list(text: str, flag: str) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]``. Raises ValueError naming ``flag`` on a bad or non-positive value."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} expects comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{flag} expects positive integers, got {text!r}")
    return vals


@dataclass(frozen=True)
class MatrixConfig:
    """A matrix run: the points, the per-point settings, where to write, and how to launch the server."""

    points: tuple[MatrixPoint, ...]
    serve: ServeConfig
    output_dir: Path
    launch: str | None = None
    server_timeout_s: float = 600.0


_SUMMARY_KEYS = (
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
    "roofline_output_throughput",
    "pct_of_roofline",
)


def point_entry(
    pt: MatrixPoint, result: dict[str, Any] | None, error: str | None, file: str
) -> dict[str, Any]:
    """The ``summary.json`` row of a point; ``success`` means no error and every request valid."""
    entry: dict[str, Any] = {
        "concurrency": pt.concurrency,
        "input_len": pt.input_len,
        "output_len": pt.output_len,
        "num_prompts": pt.concurrency,
        "result_file": file,
        "error": error,
    }
    for k in _SUMMARY_KEYS:
        entry[k] = result.get(k) if result else None
    if result is not None and error is None and result["failed"]:
        reasons = sorted({e for e in result.get("errors", []) if e})
        entry["error"] = f"{result['failed']} failed request(s): {'; '.join(reasons[:3])}"
    entry["success"] = bool(result) and entry["error"] is None and result["completed"] == pt.concurrency
    return entry


def _run_point(
    mcfg: MatrixConfig,
    pt: MatrixPoint,
    launcher: ServerLauncher | None,
    counter: TokenCounter | None,
    command: str,
) -> tuple[dict[str, Any] | None, str | None, TokenCounter | None]:
    """Run one point; returns (result or None, error or None, the token counter to reuse)."""
    result: dict[str, Any] | None = None
    error: str | None = None
    try:
        cfg = replace(
            mcfg.serve,
            input_len=pt.input_len,
            output_len=pt.output_len,
            num_prompts=pt.concurrency,
            max_concurrency=pt.concurrency,
            request_rate=math.inf,
            extra={"concurrency": pt.concurrency, "matrix_point": pt.stem},
        )
        if counter is None:
            counter = make_counter(cfg)
        result = run_serve(cfg, command, counter)
    except (ValueError, OSError) as e:
        error = str(e)
    if launcher is not None and not launcher.alive():
        error = (error + "; " if error else "") + "server died during the point"
    return result, error, counter


def _write_summary(
    mcfg: MatrixConfig, rows: list[dict[str, Any]], info: dict[str, Any], command: str
) -> dict[str, Any]:
    """Write ``summary.json`` and ``summary.md`` for the rows so far (called after every point)."""
    hw = mcfg.serve.hardware
    summary: dict[str, Any] = {
        "date": info["date"],
        "command": command,
        "base_url": mcfg.serve.base_url,
        "endpoint": mcfg.serve.endpoint,
        "model": info["model"],
        "launch": mcfg.launch,
        "server_restarts": info["restarts"],
        "hardware": None
        if hw is None
        else {"name": hw.name, "hbm_bandwidth": hw.hbm_bandwidth, "peak_flops": hw.peak_flops},
        "num_points": len(rows),
        "num_planned_points": len(mcfg.points),
        "num_successful": sum(1 for r in rows if r["success"]),
        "points": rows,
    }
    out = mcfg.output_dir
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    header = f"# Benchmark matrix {summary['date']}" + (f"\n\n`{command}`" if command else "")
    (out / "summary.md").write_text(summary_markdown(rows, header))
    return summary


def run_matrix(mcfg: MatrixConfig, command: str = "") -> dict[str, Any]:
    """Run every point, write the artifacts, return the summary dict (``points`` holds the rows).

    The summary files are rewritten after every point, so an interrupted run keeps what it measured.
    Raises:
        ValueError: the output folder cannot be created, the server (without ``--launch``) cannot
            be reached, or the first server start fails.
    """
    out = mcfg.output_dir
    if not mcfg.launch:
        fetch_models(mcfg.serve.base_url, mcfg.serve.api_key)  # fail once, up front, if unreachable
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--output-dir {out}: {e}") from None
    launcher = (
        ServerLauncher(mcfg.launch, mcfg.serve.base_url, mcfg.server_timeout_s, out / "server.log")
        if mcfg.launch
        else None
    )
    rows: list[dict[str, Any]] = []
    info: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "model": mcfg.serve.model,
        "restarts": 0,
    }
    counter: TokenCounter | None = None
    summary: dict[str, Any] = {}
    total = len(mcfg.points)
    try:
        if launcher is not None:
            launcher.start()
        for n, pt in enumerate(mcfg.points, 1):
            print(f"[matrix {n}/{total}] {pt.stem}", flush=True)
            restart_error: str | None = None
            try:
                if launcher is not None and launcher.ensure_running():
                    info["restarts"] += 1
            except ValueError as e:
                restart_error = str(e)
            if restart_error is None:
                result, error, counter = _run_point(mcfg, pt, launcher, counter, command)
            else:
                result, error = None, restart_error
            if result is not None:
                info["model"] = info["model"] or result.get("model_id")
            file = f"{pt.stem}.json"
            payload: dict[str, Any] = (
                {"error": error, "matrix_point": pt.stem} if result is None else dict(result)
            )
            if result is not None and error is not None:
                payload["error"] = error
            (out / file).write_text(json.dumps(payload, indent=2))
            row = point_entry(pt, result, error, file)
            rows.append(row)
            summary = _write_summary(mcfg, rows, info, command)
            thr = row["output_throughput"]
            status = "ok" if row["success"] else f"FAILED: {row['error']}"
            print(f"[matrix {n}/{total}] {pt.stem}: {status}" + (f", {thr:,.1f} output tok/s" if thr else ""))
    finally:
        if launcher is not None:
            launcher.stop()
    if not summary:
        summary = _write_summary(mcfg, rows, info, command)
    if rows:
        plot_matrix(rows, out)
    return summary
