"""Human-readable reports: vLLM-style summary table, matrix ``summary.md`` and PNG plots (matplotlib Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

_SECTIONS = (
    ("ttft", "Time to First Token", "TTFT"),
    ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
    ("itl", "Inter-token Latency", "ITL"),
    ("e2el", "End-to-end Latency", "E2EL"),
)


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def format_result_table(result: dict[str, Any]) -> str:
    """The summary block ``vllm bench serve`` prints, from a result dict of :func:`run_serve`."""
    lines = ["{s:{c}^50}".format(s=" Serving Benchmark Result ", c="=")]

    def row(label: str, value: Any, spec: str = ".2f") -> None:
        text = _fmt(value, spec) if isinstance(value, float) or value is None else str(value)
        lines.append(f"{label:<40} {text:<10}")

    row("Successful requests:", result["completed"])
    row("Failed requests:", result["failed"])
    if result.get("max_concurrency") is not None:
        row("Maximum request concurrency:", result["max_concurrency"])
    if result.get("ramp_up_strategy") is not None:
        ramp = f"{result['ramp_up_strategy']} {result['ramp_up_start_rps']} -> {result['ramp_up_end_rps']}"
        row("Request rate ramp-up (RPS):", ramp)
    elif result.get("request_rate") not in (None, "inf"):
        row("Request rate configured (RPS):", float(result["request_rate"]))
    row("Benchmark duration (s):", float(result["duration"]))
    row("Total input tokens:", result["total_input_tokens"])
    row("Total generated tokens:", result["total_output_tokens"])
    row("Request throughput (req/s):", float(result["request_throughput"]))
    if result.get("request_goodput") is not None:
        row("Request goodput (req/s):", float(result["request_goodput"]))
    row("Output token throughput (tok/s):", float(result["output_throughput"]))
    row("Peak output token throughput (tok/s):", float(result["max_output_tokens_per_s"]))
    if result.get("max_concurrent_requests") is not None:
        row("Peak concurrent requests:", float(result["max_concurrent_requests"]))
    row("Total token throughput (tok/s):", float(result["total_token_throughput"]))
    if result.get("roofline_output_throughput") is not None:
        row("Roofline output throughput (tok/s):", float(result["roofline_output_throughput"]))
        row("Percent of roofline (%):", float(result["pct_of_roofline"]))
    for key, title, short in _SECTIONS:
        if f"mean_{key}_ms" not in result:
            continue
        if not result["completed"]:
            continue  # no successful request: latencies are undefined, not 0.00
        lines.append("{s:{c}^50}".format(s=title, c="-"))
        row(f"Mean {short} (ms):", float(result[f"mean_{key}_ms"]))
        row(f"Median {short} (ms):", float(result[f"median_{key}_ms"]))
        # in --percentiles' order, as vLLM prints them (the result keeps that order)
        for k in (k for k in result if k.startswith("p") and k.endswith(f"_{key}_ms")):
            row(f"P{k[1 : -len(f'_{key}_ms')]} {short} (ms):", float(result[k]))
    lines.append("=" * 50)
    errors = [e for e in result.get("errors", []) if e]
    if errors:
        lines.append(f"{len(errors)} failed request(s); first reasons:")
        for e in sorted(set(errors))[:5]:
            lines.append(f"  - {e}")
    return "\n".join(lines)


SUMMARY_COLUMNS = (
    "| C | I | O | success | output tok/s | total tok/s | mean TTFT ms | P99 TTFT ms | mean TPOT ms "
    "| mean ITL ms | P99 ITL ms | roofline tok/s | % of roofline |"
)


GOODPUT_COLUMN = "goodput req/s"
"""The column :func:`summary_markdown` adds after ``total tok/s`` for a matrix run with
``--goodput``: the point's ``request_goodput`` (requests/s that met every SLO; with repeats, the
mean over the runs)."""


def summary_markdown(
    points: Sequence[dict[str, Any]], header: str = "", planned: int | None = None, goodput: bool = False
) -> str:
    """``summary.md``: one row per matrix point (see :data:`SUMMARY_COLUMNS`; with ``goodput``,
    the run's ``--goodput`` SLOs, a :data:`GOODPUT_COLUMN` too), then the line
    ``N/P points successful.`` over the ``planned`` points (default: those given), saying how
    many were not run. With repeats the metrics are means over the runs and the output
    throughput shows ``± std``. A point that failed before any request completed (a dead
    server, a failed warm-up) shows ``0/C (error)``."""
    planned = len(points) if planned is None else planned
    lines = [header, ""] if header else []
    columns = SUMMARY_COLUMNS
    if goodput:
        columns = columns.replace(" total tok/s |", f" total tok/s | {GOODPUT_COLUMN} |")
    lines += [columns, "|" + "---:|" * (columns.count("|") - 1)]
    for p in points:
        ok = f"{p.get('completed') or 0}/{p['num_prompts']}"
        if p.get("error"):
            ok += " (error)"
        thr = _fmt(p.get("output_throughput"), ",.1f")
        if p.get("repeats", 1) > 1 and p.get("output_throughput_std") is not None:
            thr += f" ± {p['output_throughput_std']:,.1f}"
        good = f" | {_fmt(p.get('request_goodput'))}" if goodput else ""
        lines.append(
            f"| {p['concurrency']} | {p['input_len']} | {p['output_len']} | {ok} "
            f"| {thr} | {_fmt(p.get('total_token_throughput'), ',.1f')}{good} "
            f"| {_fmt(p.get('mean_ttft_ms'))} | {_fmt(p.get('p99_ttft_ms'))} | {_fmt(p.get('mean_tpot_ms'))} "
            f"| {_fmt(p.get('mean_itl_ms'))} | {_fmt(p.get('p99_itl_ms'))} "
            f"| {_fmt(p.get('roofline_output_throughput'), ',.1f')} | {_fmt(p.get('pct_of_roofline'), '.1f')} |"
        )
    n_ok = sum(1 for p in points if p.get("success"))
    not_run = f" ({planned - len(points)} not run)" if planned > len(points) else ""
    lines += ["", f"{n_ok}/{planned} points successful{not_run}."]
    errs = [p for p in points if p.get("error")]
    for p in errs:
        lines.append(f"- C{p['concurrency']}/I{p['input_len']}/O{p['output_len']}: {p['error']}")
    return "\n".join(lines) + "\n"


def point_label(p: dict[str, Any]) -> str:
    """``C4/I256/O1024``."""
    return f"C{p['concurrency']}/I{p['input_len']}/O{p['output_len']}"


def plot_labels(points: Sequence[dict[str, Any]]) -> tuple[list[str], list[bool]]:
    """The x-axis labels of :func:`plot_matrix` (``C4/I256/O1024``, with `` (failed)`` for a point
    whose ``success`` is false) and which points failed."""
    failed = [not p.get("success", True) for p in points]
    return [
        point_label(p) + (" (failed)" if bad else "") for p, bad in zip(points, failed, strict=True)
    ], failed


NO_POINT_SUCCEEDED = "no point succeeded: summary.md says why"
"""What :func:`plot_matrix` writes across a plot whose every point failed."""


def plot_matrix(points: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write ``throughput.png`` (output tok/s vs roofline per point) and ``latency.png`` (TTFT, TPOT).

    A point that did not succeed (``success`` false) is labelled ``(failed)`` in red, so that its
    missing or partial bars are not read as measurements; when none succeeded, a panel with no
    value to draw says so (:data:`NO_POINT_SUCCEEDED`) on an axis without ticks. Returns the paths written. Uses the
    non-interactive Agg backend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, failed = plot_labels(points)
    none_ok = bool(points) and all(failed)

    def unmeasured(*keys: str) -> bool:
        """Every point failed and none has a value of ``keys`` to draw (a failed point with a
        request short keeps its measured metrics, a roofline its ceiling)."""
        return none_ok and not any(num(p, k) > 0 for p in points for k in keys)

    def mark_failed(ax: Any) -> None:
        for tick, bad in zip(ax.get_xticklabels(), failed, strict=True):
            if bad:
                tick.set_color("tab:red")

    def say_none_succeeded(*axes: Any) -> None:
        """Every point failed: its empty axis (a scale of +-0.04) says so instead of a value."""
        for ax in axes:
            ax.set_yticks([])
            ax.text(
                0.5,
                0.5,
                NO_POINT_SUCCEEDED,
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="tab:red",
            )

    x = list(range(len(points)))
    width = max(8.0, 0.45 * len(points))
    paths: list[Path] = []

    def num(p: dict[str, Any], k: str) -> float:
        v = p.get(k)
        return float(v) if isinstance(v, int | float) else 0.0

    def values(ax: Any, ys: list[float], **style: Any) -> None:
        """Bars on a linear axis; on a log one dots on a grid, since a bar's length there says
        nothing (61.5 against 118.9 tok/s drew as about 15x)."""
        if all(y > 0 for y in ys):
            ax.set_yscale("log")
            ax.scatter(x, ys, marker="o", s=36, zorder=3, **style)
            ax.grid(True, which="both", axis="y", alpha=0.3)
        else:
            ax.bar(x, ys, **style)

    fig, ax = plt.subplots(figsize=(width, 5))
    values(ax, [num(p, "output_throughput") for p in points], label="measured output tok/s", color="tab:blue")
    roof = [p.get("roofline_output_throughput") for p in points]
    if any(r is not None for r in roof):
        ax.scatter(
            x,
            [float(r) if r is not None else float("nan") for r in roof],
            marker="_",
            s=400,
            color="tab:red",
            label="roofline",
        )
    ax.set_ylabel("output tokens / s")
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
    mark_failed(ax)
    ax.set_title("Output throughput per point")
    ax.legend()
    if unmeasured("output_throughput", "roofline_output_throughput"):
        say_none_succeeded(ax)
    fig.tight_layout()
    paths.append(out_dir / "throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(width, 8), sharex=True)
    values(ax1, [num(p, "mean_ttft_ms") for p in points], color="tab:green", label="mean")
    ax1.scatter(x, [num(p, "p99_ttft_ms") for p in points], color="black", marker="x", label="P99", zorder=4)
    ax1.set_ylabel("TTFT ms")
    ax1.legend()
    ax2.bar(x, [num(p, "mean_tpot_ms") for p in points], color="tab:orange")
    ax2.set_ylabel("mean TPOT ms")
    ax2.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
    mark_failed(ax2)
    ax1.set_title("Latency per point")
    if unmeasured("mean_ttft_ms", "p99_ttft_ms"):
        say_none_succeeded(ax1)
    if unmeasured("mean_tpot_ms"):
        say_none_succeeded(ax2)
    fig.tight_layout()
    paths.append(out_dir / "latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
