"""``surge bench compare BASE NEW``: per-point change between two matrix runs (or two serve results).

A point is *valid* in a run when it succeeded (every request completed at its exact length) and its
metric is a positive number. Over the points valid in both runs: the per-point ratio ``new / base``,
its geometric mean ``exp(mean(log(ratio)))`` reported as a change in %, the same grouped by
concurrency and by output length, and wins / losses (for ``*_ms`` metrics lower is better).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Key = tuple[int, int, int]  # (C, I, O)


def load_points(path: str | Path) -> dict[Key, dict[str, Any]]:
    """Points of a ``summary.json`` (or a folder holding one, or a single ``bench serve`` result JSON).

    Raises:
        ValueError: missing file, bad JSON, or an unknown layout.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise ValueError(f"{path}: no summary.json or result file")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("points"), list):
        rows = data["points"]
    elif isinstance(data, dict) and "completed" in data:
        conc = data.get("concurrency") or data.get("max_concurrency") or data.get("num_prompts")
        rows = [
            {
                **data,
                "concurrency": conc,
                "input_len": data.get("input_len") or 0,
                "success": data.get("failed", 1) == 0 and not data.get("error"),
            }
        ]
    else:
        raise ValueError(f"{p}: neither a matrix summary nor a bench serve result")
    out: dict[Key, dict[str, Any]] = {}
    for r in rows:
        try:
            out[(int(r["concurrency"]), int(r["input_len"]), int(r["output_len"]))] = r
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{p}: a point lacks concurrency/input_len/output_len") from None
    return out


def _valid(row: dict[str, Any] | None, metric: str) -> bool:
    if row is None or not row.get("success"):
        return False
    v = row.get(metric)
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


def geomean_ratio(ratios: Iterable[float]) -> float | None:
    """Geometric mean of positive ratios, or None for an empty input."""
    logs = [math.log(r) for r in ratios]
    return math.exp(sum(logs) / len(logs)) if logs else None


def pct(ratio: float | None) -> str:
    """``1.1 -> "+10.0%"``; None -> ``"n/a"``."""
    return "n/a" if ratio is None else f"{(ratio - 1.0) * 100.0:+.1f}%"


@dataclass
class Comparison:
    """The comparison of one metric; ``rows`` are (key, base value, new value, ratio) for valid-in-both."""

    metric: str
    lower_is_better: bool
    rows: list[tuple[Key, float, float, float]] = field(default_factory=list)
    only_base: list[Key] = field(default_factory=list)
    only_new: list[Key] = field(default_factory=list)
    neither: list[Key] = field(default_factory=list)

    @property
    def geomean(self) -> float | None:
        """Geometric mean of new/base over the points valid in both."""
        return geomean_ratio(r for *_, r in self.rows)

    def grouped(self, index: int) -> dict[int, tuple[int, float | None]]:
        """Geomean ratio per value of key element ``index`` (0 = C, 2 = O): ``{value: (n, ratio)}``."""
        groups: dict[int, list[float]] = {}
        for key, _, _, r in self.rows:
            groups.setdefault(key[index], []).append(r)
        return {k: (len(v), geomean_ratio(v)) for k, v in sorted(groups.items())}

    def wins_losses(self) -> tuple[int, int, int]:
        """(wins, losses, ties) of NEW against BASE."""
        wins = sum(1 for *_, r in self.rows if (r < 1.0 if self.lower_is_better else r > 1.0))
        ties = sum(1 for *_, r in self.rows if r == 1.0)
        return wins, len(self.rows) - wins - ties, ties


def compare_points(
    base: dict[Key, dict[str, Any]], new: dict[Key, dict[str, Any]], metric: str = "output_throughput"
) -> Comparison:
    """Compare ``metric`` point by point (keys are (C, I, O))."""
    cmp = Comparison(metric, lower_is_better=metric.endswith("_ms"))
    for key in sorted(set(base) | set(new)):
        b, n = base.get(key), new.get(key)
        vb, vn = _valid(b, metric), _valid(n, metric)
        if vb and vn:
            assert b is not None and n is not None
            cmp.rows.append((key, float(b[metric]), float(n[metric]), float(n[metric]) / float(b[metric])))
        elif vb:
            cmp.only_base.append(key)
        elif vn:
            cmp.only_new.append(key)
        else:
            cmp.neither.append(key)
    return cmp


def _label(k: Key) -> str:
    return f"C{k[0]}/I{k[1]}/O{k[2]}"


def comparison_markdown(cmp: Comparison, base_name: str, new_name: str) -> str:
    """The markdown report ``surge bench compare`` prints."""
    better = "lower" if cmp.lower_is_better else "higher"
    lines = [
        f"## `{cmp.metric}`: NEW `{new_name}` vs BASE `{base_name}` ({better} is better)",
        "",
        "| C | I | O | base | new | change |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for key, vb, vn, r in cmp.rows:
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {vb:,.2f} | {vn:,.2f} | {pct(r)} |")
    lines += [
        "",
        f"**Geometric mean change over {len(cmp.rows)} points valid in both: {pct(cmp.geomean)}**",
        "",
    ]
    for title, idx in (("concurrency", 0), ("output length", 2)):
        lines += [f"### By {title}", "", f"| {title} | points | geomean change |", "|---:|---:|---:|"]
        for value, (n, g) in cmp.grouped(idx).items():
            lines.append(f"| {value} | {n} | {pct(g)} |")
        lines.append("")
    w, lo, t = cmp.wins_losses()
    lines.append(f"Wins: {w}, losses: {lo}, ties: {t} (NEW against BASE).")
    for title, keys in (
        ("Valid only in BASE", cmp.only_base),
        ("Valid only in NEW", cmp.only_new),
        ("Valid in neither", cmp.neither),
    ):
        if keys:
            lines.append(f"{title} ({len(keys)}): {', '.join(_label(k) for k in keys)}")
    return "\n".join(lines) + "\n"


def plot_comparison(cmp: Comparison, path: Path) -> None:
    """Bar chart of the per-point change in % (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [_label(k) for k, *_ in cmp.rows]
    changes = [(r - 1.0) * 100.0 for *_, r in cmp.rows]
    good = [(c < 0) if cmp.lower_is_better else (c > 0) for c in changes]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(labels)), 5))
    ax.bar(range(len(labels)), changes, color=["tab:green" if g else "tab:red" for g in good])
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(f"{cmp.metric} change (%)")
    ax.set_title(f"NEW vs BASE, geometric mean {pct(cmp.geomean)}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
