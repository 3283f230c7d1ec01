"""``bench serve``'s plots of one run, vLLM 0.26's ``--plot-timeline`` and ``--plot-dataset-stats``.

vLLM draws its timeline with plotly into an HTML page; Surge has no plotly and draws the same
segments with matplotlib into a PNG. Both plots are written next to ``--result-file``:
``R.json`` (or ``R.json.gz``) gives ``R.timeline.png`` and ``R.dataset_stats.png``. They read the
per-request lists of the result dict (:func:`surge.bench.serve.run_serve`): ``start_times``,
``ttfts``, ``itls`` (seconds), ``errors``, ``input_lens`` and ``output_lens`` (tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TTFT_COLOR = "#636EFA"
ITL_COLORS = ("#109618", "#FF7F0E", "#D62728")  # below, between, above the two thresholds (vLLM's)


def plot_path(result_file: Path, kind: str) -> Path:
    """``R.json`` / ``R.json.gz`` / ``R`` -> ``R.{kind}.png`` in the same folder."""
    name = result_file.name.removesuffix(".gz").removesuffix(".json")
    return result_file.with_name(f"{name}.{kind}.png")


def parse_itl_thresholds(text: str) -> tuple[float, float]:
    """``--timeline-itl-thresholds``: two comma-separated milliseconds, ``lo <= hi``.

    Returns:
        the two thresholds in seconds.
    Raises:
        ValueError: not two numbers, a negative one, or ``lo > hi`` (the message names the flag).
    """
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 2 or not all(0.0 <= v < float("inf") for v in values) or values[0] > values[1]:
        raise ValueError(
            f"--timeline-itl-thresholds takes two milliseconds LOW,HIGH with 0 <= LOW <= HIGH, e.g. 25,50; "
            f"got {text!r}"
        )
    return values[0] / 1000.0, values[1] / 1000.0


def _itl_class(gap: float, thresholds: tuple[float, float]) -> int:
    return 0 if gap < thresholds[0] else 1 if gap < thresholds[1] else 2


def timeline_spans(
    result: dict[str, Any], thresholds: tuple[float, float]
) -> tuple[list[tuple[int, list[tuple[float, float, int]]]], int]:
    """Per successful request, its index in the result and its spans ``(start, width, cls)`` in
    seconds from the first such request's start: class -1 is the TTFT, 0/1/2 an ITL gap below,
    between or above ``thresholds`` (seconds). Consecutive gaps of one class are merged into one
    span (the picture is the same; a long run has far fewer rectangles). Returns those and the
    number of failed requests left out (they have no token times)."""
    starts = result["start_times"]
    ok = [i for i, err in enumerate(result["errors"]) if not err]
    if not ok:
        return [], len(starts)
    t0 = min(starts[i] for i in ok)
    rows: list[tuple[int, list[tuple[float, float, int]]]] = []
    for i in ok:
        t = starts[i] - t0
        ttft = result["ttfts"][i]
        spans = [(t, ttft, -1)]
        t += ttft
        for gap in result["itls"][i]:
            cls = _itl_class(gap, thresholds)
            last = spans[-1]
            if last[2] == cls:
                spans[-1] = (last[0], last[1] + gap, cls)
            else:
                spans.append((t, gap, cls))
            t += gap
        rows.append((i, spans))
    return rows, len(starts) - len(ok)


def plot_timeline(result: dict[str, Any], path: Path, thresholds: tuple[float, float]) -> None:
    """One row per request (its index in the result, 0 on top), drawn for the successful ones:
    its TTFT, then its ITL gaps coloured by ``thresholds`` (seconds; green below the first,
    orange between, red above the second, as vLLM's). PNG (matplotlib, Agg backend). Raises
    OSError when ``path`` cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows, failed = timeline_spans(result, thresholds)
    lo, hi = (f"{t * 1000:g}" for t in thresholds)
    labels = ("TTFT", f"ITL < {lo} ms", f"{lo} ms <= ITL < {hi} ms", f"ITL >= {hi} ms")
    colors = (TTFT_COLOR, *ITL_COLORS)
    n = len(result["start_times"])
    fig, ax = plt.subplots(figsize=(12, min(max(3.0, 0.25 * n + 1.5), 40.0)))
    for y, spans in rows:
        for cls in range(-1, 3):
            bars = [(s, w) for s, w, c in spans if c == cls]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=colors[cls + 1], linewidth=0)
    ax.set_ylim(max(n, 1) - 0.5, -0.5)  # request 0 on top, as vLLM's
    ax.set_xlabel("time since the first request's start (s)")
    ax.set_ylabel("request")
    title = f"{len(rows)} requests" + (f" ({failed} failed, not shown)" if failed else "")
    ax.set_title(f"Timeline: {title}")
    ax.legend(handles=[Patch(color=c, label=label) for c, label in zip(colors, labels, strict=True)])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_dataset_stats(result: dict[str, Any], path: Path) -> None:
    """vLLM's four panels: histograms of the prompt, output and total tokens of every request
    (``input_lens``, ``output_lens``) and the tokens per request stacked. PNG (matplotlib, Agg).
    Raises OSError when ``path`` cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prompt = list(result["input_lens"])
    output = list(result["output_lens"])
    total = [p + o for p, o in zip(prompt, output, strict=True)]
    fig, ((a1, a2), (a3, a4)) = plt.subplots(2, 2, figsize=(14, 10))
    for ax, values, color, what in (
        (a1, prompt, "steelblue", "Prompt tokens"),
        (a2, output, "coral", "Output tokens"),
        (a3, total, "mediumseagreen", "Total tokens (prompt + output)"),
    ):
        ax.hist(values, bins=30, color=color, edgecolor="black", alpha=0.7)
        ax.set_xlabel(what)
        ax.set_ylabel("requests")
        ax.set_title(f"{what.split(' (')[0]} distribution")
        ax.grid(True, alpha=0.3)
    ids = list(range(len(prompt)))
    a4.bar(ids, prompt, label="Prompt tokens", color="steelblue", alpha=0.7)
    a4.bar(ids, output, bottom=prompt, label="Output tokens", color="coral", alpha=0.7)
    a4.set_xlabel("request")
    a4.set_ylabel("tokens")
    a4.set_title("Tokens per request (stacked)")
    a4.legend()
    a4.grid(True, alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
