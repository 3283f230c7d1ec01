"""``surge bench compare BASE NEW``: per-point change between two matrix runs (or two serve results).

A point is *valid* in a run when it succeeded (every request completed at its exact length) and its
metric is a positive number. Over the points valid in both runs: the per-point ratio ``new / base``,
its geometric mean ``exp(mean(log(ratio)))`` reported as a change in %, the same grouped by
concurrency and by output length, and wins / losses / ties (for ``*_ms`` metrics lower is better).

Noise (method):

- *Per point, ties.* When both runs of a point have at least two repeats (``bench matrix --repeats``),
  the point is a tie when the 95 % Welch t-interval of ``mean(log new) - mean(log base)`` over the
  repeats contains 0 (sample variances; degrees of freedom by Welch-Satterthwaite, rounded down).
  Otherwise a change smaller than ``tie_pct`` % (default 2 %) is a tie.
- *Geometric mean, 95 % confidence interval.* When every compared point has at least
  :data:`MIN_BOOTSTRAP_REPEATS` (5) repeats in both runs: a percentile bootstrap over the repeats
  (2000 resamples with a fixed seed; each resample draws every point's base and new repeats with
  replacement and recomputes the geometric mean), i.e. the measurement noise. When every point has
  at least two but one has fewer than five on a side, a bootstrap is too narrow (resampling two
  values gives half their variance and a handful of distinct means), so the interval is Welch's
  t-interval of the mean over the K points of their log changes: half-width ``t975(df) *
  sqrt(sum_k (var_b,k / n_b,k + var_n,k / n_n,k)) / K`` around the log of the geometric mean, the
  per-point variances those of the log repeats and ``df`` by Welch-Satterthwaite over all of them
  (rounded down): with two repeats a point (one degree of freedom each) it is as wide as two
  values leave the noise unknown, as the per-point Welch test is. Without repeats at every point, a
  t-interval over the points' log ratios (mean ± t · sd / sqrt(n)), i.e. how consistent the change
  is across the grid; it needs at least two points.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from surge.bench.results import read_json_records

Key = tuple[int, int, int]  # (C, I, O)


def load_points(
    path: str | Path, notes: list[str] | None = None, metric: str | None = None
) -> dict[Key, dict[str, Any]]:
    """Points of a ``summary.json`` (or a folder holding one), or of a ``bench serve`` result file
    (``--result-file``: JSON, or gzipped JSON such as ``X.json.gz``), or of a JSON-lines file of
    several runs (``--append-result``'s, one run a line): each run is the point of its (C, I, O),
    and where several runs are of one point the last one counts, with a line added to ``notes``
    saying so. vLLM 0.26's result files load too: their I and O, which they do not record, are
    their requests' (:func:`_vllm_lengths`), with a line added to ``notes`` naming the point. A
    summary's rows keep its columns' metrics only: a ``metric`` they lack (``P50`` of
    ``--percentiles 50``, a ``std``) is read from each point's result files
    (:func:`_metric_from_point_files`).

    Raises:
        ValueError: one line naming the file: missing, unreadable, not JSON, or an unknown layout.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise ValueError(f"{path}: no summary.json or result file")
    records = read_json_records(p)
    data = records[0] if len(records) == 1 else None
    inferred: list[dict[str, Any]] = []  # the rows of vLLM results, whose lengths are inferred
    if isinstance(data, dict) and isinstance(data.get("points"), list):
        # the run's settings on each row, so that compare_points can see two runs differ
        run = {k: data[k] for k in ("endpoint", "temperature", "model") if k in data}
        run |= dict.fromkeys(_RAMP_UP_SETTINGS)  # a matrix never ramps its request rate up
        if data.get("hardware") is not None:  # the roofline columns' assumptions
            run |= {k: data[k] for k in _ROOFLINE_SETTINGS if k in data}
        rows = [{**run, **r} if isinstance(r, dict) else r for r in data["points"]]
        if metric is not None:
            for r in rows:
                if isinstance(r, dict) and metric not in r:
                    _metric_from_point_files(r, p.parent, metric)
    elif all(isinstance(d, dict) and "completed" in d for d in records):
        rows = [_serve_row(d) for d in records]
        inferred = [r for d, r in zip(records, rows, strict=True) if _is_vllm_result(d)]
    elif len(records) > 1:
        raise ValueError(
            f"{p}: a JSON-lines file of {len(records)} values that are not all bench serve results"
        )
    else:
        raise ValueError(f"{p}: neither a matrix summary nor a bench serve result")
    out: dict[Key, dict[str, Any]] = {}
    for r in rows:
        try:
            out[_key(r)] = r
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{p}: a point lacks concurrency/input_len/output_len") from None
    if inferred and notes is not None:
        points = ", ".join(sorted({_label(_key(r)) for r in inferred}))
        notes.append(
            f"{p}: a vLLM result (it records no input_len/output_len): read as {points}, the "
            "lengths of its requests (their mean per request where the file has no per-request lists)"
        )
    if len(records) > 1 and notes is not None:
        left_out = len(records) - len(out)
        notes.append(
            f"{p}: a JSON-lines file of {len(records)} runs (--append-result), read as {len(out)} "
            f"point{'s' if len(out) != 1 else ''}"
            + (
                f"; where runs share a point the last one counts ({left_out} earlier left out)"
                if left_out
                else ""
            )
        )
    return out


def _metric_from_point_files(row: dict[str, Any], folder: Path, metric: str) -> None:
    """Set ``row[metric]`` (and each repeat's in ``row["runs"]``) from the matrix point's result
    files in ``folder``, as the summary would have: the mean over the successful repeats. Left
    unset when no file has the key (an unknown metric stays unknown); a file that cannot be read,
    or holds no number, counts as a repeat without the value."""
    files = row.get("result_files") or [row.get("result_file")]
    values: list[float | None] = []
    found = False
    for name in files if isinstance(files, list) else []:
        data: Any = None
        if isinstance(name, str):
            try:
                data = read_json_records(folder / name)[0]
            except ValueError:
                data = None
        found = found or (isinstance(data, dict) and metric in data)
        v = data.get(metric) if isinstance(data, dict) else None
        values.append(float(v) if _number(v) else None)
    if not found:
        return
    runs = row.get("runs")
    if isinstance(runs, list) and len(runs) == len(values):
        for run, v in zip(runs, values, strict=True):
            if isinstance(run, dict):
                run[metric] = v
        ok = [v for run, v in zip(runs, values, strict=True) if isinstance(run, dict) and run.get("success")]
    else:
        ok = values
    numbers = [v for v in ok if v is not None]
    row[metric] = sum(numbers) / len(numbers) if numbers else None


def _key(row: dict[str, Any]) -> Key:
    """The (C, I, O) of a row. Raises KeyError, TypeError or ValueError where it lacks one."""
    return (int(row["concurrency"]), int(row["input_len"]), int(row["output_len"]))


def _is_vllm_result(data: dict[str, Any]) -> bool:
    """Is this ``bench serve`` result one of ``vllm bench serve --save-result``? Surge's always
    record ``dataset``, ``input_len`` and ``output_len`` (null for a dataset's own lengths);
    vLLM's none of them."""
    return not {"dataset", "input_len", "output_len"} & data.keys()


def _common_length(lens: Any, ok: list[bool]) -> int | None:
    """The one length of the successful requests in a per-request list, 0 where they differ
    (a dataset's own lengths), None where the list is unusable."""
    if not isinstance(lens, list) or len(lens) != len(ok):
        return None
    kept = {v for v, good in zip(lens, ok, strict=True) if good}
    if not kept or not all(type(v) is int and v >= 0 for v in kept):
        return None
    return kept.pop() if len(kept) == 1 else 0


def _vllm_lengths(data: dict[str, Any]) -> tuple[int, int]:
    """The (I, O) of a vLLM result file, which records no lengths: the one prompt and output length
    of its successful requests where it keeps the per-request lists (``--save-detailed``; 0 where
    they differ, a dataset's own lengths), else its mean tokens per completed request, rounded (a
    random run's lengths as the server counted them), and 0 without a completed request."""
    errors = data.get("errors")
    ok = [e == "" for e in errors] if isinstance(errors, list) else None
    lengths = []
    for lens, total in (("input_lens", "total_input_tokens"), ("output_lens", "total_output_tokens")):
        common = _common_length(data.get(lens), ok) if ok is not None else None
        if common is None:
            mean = _mean_tokens(data, total)
            common = round(mean) if mean is not None else 0
        lengths.append(common)
    return lengths[0], lengths[1]


def _serve_row(data: dict[str, Any]) -> dict[str, Any]:
    """The comparison row of one ``bench serve`` result: its fields, its point (C: the
    concurrency, else ``--max-concurrency``, else ``--num-prompts``; I and O: the result's, or a
    vLLM result's from its requests, :func:`_vllm_lengths`) and its settings."""
    conc = data.get("concurrency") or data.get("max_concurrency") or data.get("num_prompts")
    if _is_vllm_result(data):
        data = {**data, **dict(zip(("input_len", "output_len"), _vllm_lengths(data), strict=True))}
    roofline = data.get("roofline_model")
    return {
        **({"model": data["model_id"]} if "model_id" in data else {}),
        **(
            {
                "roofline_dtype": roofline.get("dtype"),
                "roofline_kv_cache_dtype": roofline.get("kv_cache_dtype"),
                "roofline_tp": (data.get("hardware") or {}).get("tensor_parallel_size", 1),
            }
            if isinstance(roofline, dict)
            else {}
        ),
        # vLLM writes them only with a ramp-up (older files: null)
        **dict.fromkeys(_RAMP_UP_SETTINGS),
        **data,
        "concurrency": conc,
        "input_len": data.get("input_len") or 0,  # ShareGPT: prompts of many lengths
        "output_len": data.get("output_len") or 0,  # ShareGPT with its replies' lengths
        "success": data.get("failed", 1) == 0 and not data.get("error"),
    }


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _positive(v: Any) -> bool:
    return _number(v) and v > 0


def _valid(row: dict[str, Any] | None, metric: str) -> bool:
    if row is None or not row.get("success"):
        return False
    return _positive(row.get(metric))


def run_values(row: dict[str, Any], metric: str) -> list[float]:
    """The metric of each successful repeat of a summary row (empty without repeats)."""
    runs = row.get("runs")
    if not isinstance(runs, list):
        return []
    return [
        float(r[metric])
        for r in runs
        if isinstance(r, dict) and r.get("success") and _positive(r.get(metric))
    ]


# the point's settings and request counts (a count of 0 has no ratio: failed is 0 on valid points)
_NOT_METRICS = frozenset(
    {"concurrency", "input_len", "output_len", "num_prompts", "repeats", "repeats_ok", "completed", "failed"}
)
# the numbers of a run's settings, not measurements (with _SETTINGS, and any *_len)
_SETTING_NUMBERS = frozenset(
    {
        "seed",
        "warmup",
        "num_warmups",
        "random_range_ratio",
        "random_output_range_ratio",
        "matrix_seed",
        "repeat",
    }
)


def _is_metric(name: str, value: Any) -> bool:
    """Whether a row's field is a metric ``--metric`` can compare: a number that is not a setting,
    a request count or a spread over repeats (``_std``, ``_min``, ``_max``)."""
    return _number(value) and _metric_name(name)


def _metric_name(name: str) -> bool:
    """Whether a field of this name is a measurement (see :func:`_is_metric`)."""
    return (
        name not in _NOT_METRICS
        and name not in _SETTINGS
        and name not in _SETTING_NUMBERS
        and not name.endswith(("_std", "_min", "_max", "_len"))
        and not name.startswith(("timed_trace_", "ramp_up_"))
    )


_NULL_WHY = {
    "request_goodput": "measured only with --goodput",
    "roofline_output_throughput": "measured only with --gpu (or --hbm-bandwidth and --peak-flops) on a burst",
    "pct_of_roofline": "measured only with --gpu (or --hbm-bandwidth and --peak-flops) on a burst",
}
"""Why a metric a result file always carries can be null in every point of a run."""


def check_metric(metric: str, *runs: dict[Key, dict[str, Any]], names: Sequence[str] = ()) -> None:
    """Refuse a ``metric`` that cannot be compared: unknown (no point of any run carries it: the
    message lists the metrics both runs carry), or null in every point of a run (e.g.
    ``request_goodput`` of a run made without ``--goodput``: the message names that run, from
    ``names``, and why).

    Raises:
        ValueError: one line, as above.
    """
    measured = [{k for row in pts.values() for k, v in row.items() if _is_metric(k, v)} for pts in runs]
    known = _metric_name(metric) and any(  # a number somewhere, or null (a string field is no metric)
        metric in row and (row[metric] is None or _number(row[metric]))
        for pts in runs
        for row in pts.values()
    )
    if not known:
        both = set.intersection(*measured) if measured else set()
        valid = ", ".join(sorted(both)) or "none (the runs carry no metric in common)"
        raise ValueError(f"unknown --metric {metric!r}; valid (carried by both runs): {valid}")
    labels = list(names) + [f"run {i + 1}" for i in range(len(names), len(runs))]
    empty = [label for label, have in zip(labels, measured, strict=False) if metric not in have]
    if empty:
        why = _NULL_WHY.get(metric)
        raise ValueError(
            f"--metric {metric} is null or absent in every point of {' and '.join(dict.fromkeys(empty))}"
            + (f" ({metric} is {why})" if why else "")
            + ": nothing to compare"
        )


_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)  # fmt: skip


def t975(df: float) -> float:
    """Two-sided 95 % quantile of Student's t with ``floor(df)`` degrees of freedom (table; >= 1)."""
    d = max(int(df), 1)
    if d <= len(_T975):
        return _T975[d - 1]
    return 2.000 if d <= 60 else 1.980 if d <= 120 else 1.960


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def welch_interval(base: Sequence[float], new: Sequence[float]) -> tuple[float, float]:
    """95 % Welch t-interval of ``mean(log new) - mean(log base)`` (each needs >= 2 values)."""
    mb, vb = _mean_var([math.log(x) for x in base])
    mn, vn = _mean_var([math.log(x) for x in new])
    sb, sn = vb / len(base), vn / len(new)
    se2 = sb + sn
    diff = mn - mb
    if se2 <= 0:
        return diff, diff
    df = se2**2 / ((sb**2 / (len(base) - 1) if sb else 0.0) + (sn**2 / (len(new) - 1) if sn else 0.0))
    half = t975(df) * math.sqrt(se2)
    return diff - half, diff + half


def geomean_ratio(ratios: Iterable[float]) -> float | None:
    """Geometric mean of positive ratios, or None for an empty input."""
    logs = [math.log(r) for r in ratios]
    return math.exp(sum(logs) / len(logs)) if logs else None


def pct(ratio: float | None) -> str:
    """``1.1 -> "+10.0%"``; None -> ``"n/a"``."""
    return "n/a" if ratio is None else f"{(ratio - 1.0) * 100.0:+.1f}%"


DEFAULT_TIE_PCT = 2.0
BOOTSTRAP_RESAMPLES = 2000
MIN_BOOTSTRAP_REPEATS = 5
"""Repeats a point needs in both runs for the geometric mean's interval to be a bootstrap; with
fewer a percentile bootstrap understates the noise (see the module docstring)."""


def welch_mean_interval(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]], center: float
) -> tuple[float, float]:
    """95 % Welch t-interval, around ``center`` (a log ratio), of the mean over the K points of
    ``mean(log new) - mean(log base)``: half-width ``t975(df) * sqrt(sum of the points' squared
    standard errors) / K``, ``df`` by Welch-Satterthwaite over every sample variance (each pair's
    base and new need >= 2 positive values). Returns log ratios."""
    se2, denom = 0.0, 0.0
    for base, new in pairs:
        for values in (base, new):
            _, v = _mean_var([math.log(x) for x in values])
            s = v / len(values)
            se2 += s
            denom += s**2 / (len(values) - 1)
    if se2 <= 0:
        return center, center
    half = t975(se2**2 / denom) * math.sqrt(se2) / len(pairs)
    return center - half, center + half


@dataclass
class Comparison:
    """The comparison of one metric; ``rows`` are (key, base value, new value, ratio) for valid-in-both.

    ``ties`` holds the keys whose change is inside the noise (see the module docstring);
    ``repeats`` the per-repeat values (base, new) of points that have at least two in both.
    """

    metric: str
    lower_is_better: bool
    tie_pct: float = DEFAULT_TIE_PCT
    rows: list[tuple[Key, float, float, float]] = field(default_factory=list)
    mismatches: list[tuple[Key, str, Any, Any]] = field(default_factory=list)
    """(point, setting, base value, new value) where the runs were measured differently."""
    only_base: list[Key] = field(default_factory=list)
    only_new: list[Key] = field(default_factory=list)
    neither: list[Key] = field(default_factory=list)
    ties: set[Key] = field(default_factory=set)
    repeats: dict[Key, tuple[list[float], list[float]]] = field(default_factory=dict)
    datasets: dict[Key, str] = field(default_factory=dict)
    """The dataset of each point whose I or O is 0: a run of a dataset with its own lengths
    (ShareGPT, custom, ...), shown by the dataset's name (:meth:`label`, :meth:`length_cells`)."""

    def label(self, key: Key) -> str:
        """``C4/I256/O1024``; a length of 0 (the dataset's own) is the dataset's name:
        ``C10/sharegpt``, ``C8/sharegpt/O256``."""
        if key[1] and key[2]:
            return _label(key)
        ds = self.datasets.get(key, "dataset's own")
        if key[1] == key[2] == 0:
            return f"C{key[0]}/{ds}"
        return f"C{key[0]}/" + (f"I{key[1]}/{ds}" if key[1] else f"{ds}/O{key[2]}")

    def length_cells(self, key: Key) -> tuple[str, str]:
        """The I and O of ``key`` as the table shows them: the numbers, or the dataset's name for
        a 0 (a dataset with its own lengths)."""
        ds = self.datasets.get(key, "dataset's own")
        return (str(key[1]) if key[1] else ds), (str(key[2]) if key[2] else ds)

    @property
    def geomean(self) -> float | None:
        """Geometric mean of new/base over the points valid in both."""
        return geomean_ratio(r for *_, r in self.rows)

    def geomean_interval(self) -> tuple[float, float, str] | None:
        """95 % confidence interval of :attr:`geomean` as ratios, with the method's name (see the
        module docstring): a bootstrap over repeats when every point has at least
        :data:`MIN_BOOTSTRAP_REPEATS` in both runs, Welch's t-interval over repeats when every point
        has at least two, else a t-interval over points; None with fewer than two points and no
        repeats."""
        repeated = bool(self.rows) and all(key in self.repeats for key, *_ in self.rows)
        if repeated and any(
            min(len(b), len(n)) < MIN_BOOTSTRAP_REPEATS for b, n in (self.repeats[k] for k, *_ in self.rows)
        ):
            geomean = self.geomean
            assert geomean is not None
            pairs = [self.repeats[key] for key, *_ in self.rows]
            lo, hi = welch_mean_interval(pairs, math.log(geomean))
            return (
                math.exp(lo),
                math.exp(hi),
                f"Welch t-interval over repeats; a point has fewer than {MIN_BOOTSTRAP_REPEATS}, too few to bootstrap",
            )
        if repeated:
            rng = random.Random(0)
            samples = []
            for _ in range(BOOTSTRAP_RESAMPLES):
                logs = []
                for key, *_ in self.rows:
                    b, n = self.repeats[key]
                    mb = sum(rng.choice(b) for _ in b) / len(b)
                    mn = sum(rng.choice(n) for _ in n) / len(n)
                    logs.append(math.log(mn / mb))
                samples.append(sum(logs) / len(logs))
            samples.sort()
            lo = samples[int(0.025 * (len(samples) - 1))]
            hi = samples[int(math.ceil(0.975 * (len(samples) - 1)))]
            return math.exp(lo), math.exp(hi), "bootstrap over repeats"
        if len(self.rows) < 2:
            return None
        m, v = _mean_var([math.log(r) for *_, r in self.rows])
        half = t975(len(self.rows) - 1) * math.sqrt(v / len(self.rows))
        return math.exp(m - half), math.exp(m + half), "t-interval over points"

    def grouped(self, index: int) -> dict[int, tuple[int, float | None]]:
        """Geomean ratio per value of key element ``index`` (0 = C, 2 = O): ``{value: (n, ratio)}``.
        By length (index 1 or 2), points whose length is 0 (a dataset's own lengths, see
        :attr:`datasets`) are left out: they share no length (:meth:`ungrouped` lists them)."""
        groups: dict[int, list[float]] = {}
        for key, _, _, r in self.rows:
            if index in (1, 2) and key[index] == 0:
                continue
            groups.setdefault(key[index], []).append(r)
        return {k: (len(v), geomean_ratio(v)) for k, v in sorted(groups.items())}

    def ungrouped(self, index: int) -> list[Key]:
        """The compared points :meth:`grouped` leaves out of the groups of key element ``index``."""
        return [key for key, *_ in self.rows if index in (1, 2) and key[index] == 0]

    def verdict(self, key: Key, ratio: float) -> str:
        """``"win"``, ``"loss"`` or ``"tie"`` of NEW against BASE at one point."""
        if key in self.ties:
            return "tie"
        better = ratio < 1.0 if self.lower_is_better else ratio > 1.0
        return "win" if better else "loss"

    def wins_losses(self) -> tuple[int, int, int]:
        """(wins, losses, ties) of NEW against BASE; changes inside the noise are ties."""
        verdicts = [self.verdict(key, r) for key, *_, r in self.rows]
        return verdicts.count("win"), verdicts.count("loss"), verdicts.count("tie")


_ROOFLINE_SETTINGS = ("roofline_dtype", "roofline_kv_cache_dtype", "roofline_tp")
"""What a roofline column assumed the server runs (weight and KV cache dtypes, tensor-parallel
size): two runs whose rooflines assumed others have ``pct_of_roofline`` of unlike ceilings."""

_RAMP_UP_SETTINGS = ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps")
"""A ``bench serve --ramp-up-strategy`` run's settings, which its result has only with a ramp-up
(as vLLM's; older Surge files have them as null without one): :func:`load_points`
reads their absence as null, so that a run without a ramp-up and one with it are flagged."""

_SETTINGS = (
    "model",
    "endpoint",
    "num_prompts",
    "request_rate",
    "burstiness",
    *_RAMP_UP_SETTINGS,
    "max_concurrency",
    "temperature",
    "dataset",
    "dataset_path",
    "random_prefix_len",
    "custom_output_len",
    "skip_chat_template",
    "chat_template_kwargs",
    "disable_shuffle",
    "no_oversample",
    "prefix_repetition_prefix_len",
    "prefix_repetition_suffix_len",
    "prefix_repetition_num_prefixes",
    "sonnet_input_len",
    "sonnet_prefix_len",
    "self_timed",
    "timed_trace_chunk_hash_size",
    "timed_trace_sec_multiplier",
    "spec_bench_category",
    "hf_name",
    "hf_split",
    "hf_subset",
    *_ROOFLINE_SETTINGS,
)
"""Settings two runs should share at a point for its comparison to mean anything (a run's
dataset and its settings: ``bench serve`` results record them; matrix points are random), and
the ``seed`` of a dataset of :data:`SEEDED_ROW_DATASETS`."""


SEEDED_ROW_DATASETS = frozenset({"sharegpt", "custom", "burstgpt", "hf"})
"""Datasets whose ``--seed`` picks which rows of a file are sent (each with its own prompt and
lengths): two runs with other seeds sent another workload, and ``compare_points`` says so. The
seed of the others draws fresh content of the same shape (``random`` and ``prefix_repetition``:
random tokens of the same lengths, and a matrix point's seed is its own by design; ``sonnet``: the
file's lines drawn under the same instruction and prefix; ``timed_trace``: the blocks' random
tokens, same lengths and sharing) or is unused (``spec_bench``: vLLM's fixed seed 0)."""


LENGTH_TOLERANCE_PCT = 1.0
"""Two runs' mean prompt (or output) tokens per request at a point that differ by more than this
(in %) are flagged: the same point sent other lengths (another tokenizer or chat template, another
dataset file, a server that stopped outputs early)."""


def _mean_tokens(row: dict[str, Any], total: str) -> float | None:
    """``row[total]`` (``total_input_tokens`` / ``total_output_tokens`` of a ``bench serve``
    result) per completed request, or None where the row lacks them."""
    tokens, completed = row.get(total), row.get("completed")
    if not _positive(tokens) or not _positive(completed):
        return None
    return float(tokens) / float(completed)


def length_mismatches(b: dict[str, Any], n: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(name, base, new) of the mean input and output tokens per request of two runs of a point
    that differ by more than :data:`LENGTH_TOLERANCE_PCT` (rounded to 0.1 token); empty where a
    row lacks the totals (matrix rows: their lengths are the point's, output lengths exact).
    :func:`compare_points` flags them where no setting of the point differs (a setting that
    differs, e.g. ``random_prefix_len`` or ``model``, is the reason, and its warning says so)."""
    out = []
    for name, total in (
        ("mean input tokens", "total_input_tokens"),
        ("mean output tokens", "total_output_tokens"),
    ):
        mb, mn = _mean_tokens(b, total), _mean_tokens(n, total)
        if mb is not None and mn is not None and abs(mn - mb) * 100.0 > LENGTH_TOLERANCE_PCT * mb:
            out.append((name, round(mb, 1), round(mn, 1)))
    return out


def _prompts_per_run(row: dict[str, Any]) -> int | None:
    """The prompts one run of ``row`` sent: a matrix row's ``num_prompts`` (summed over its
    ``repeats``) over its repeats, a ``bench serve`` result's own; None when it has none."""
    total = row.get("num_prompts")
    if type(total) is not int:
        return None
    repeats = row.get("repeats", 1)
    return total // repeats if type(repeats) is int and repeats > 0 else total


def compare_points(
    base: dict[Key, dict[str, Any]],
    new: dict[Key, dict[str, Any]],
    metric: str = "output_throughput",
    tie_pct: float | None = None,
) -> Comparison:
    """Compare ``metric`` point by point (keys are (C, I, O)); ``tie_pct`` is the tie band of
    points without repeats (default :data:`DEFAULT_TIE_PCT`)."""
    cmp = Comparison(
        metric,
        lower_is_better=metric.endswith("_ms") or metric == "duration",
        tie_pct=DEFAULT_TIE_PCT if tie_pct is None else tie_pct,
    )
    for key in sorted(set(base) | set(new)):
        b, n = base.get(key), new.get(key)
        if not (key[1] and key[2]):  # a dataset's own lengths: named by the dataset
            ds = next((r.get("dataset") for r in (b, n) if r is not None and r.get("dataset")), None)
            cmp.datasets[key] = str(ds) if ds else "dataset's own"
        vb, vn = _valid(b, metric), _valid(n, metric)
        if vb and vn:
            assert b is not None and n is not None
            for name in _SETTINGS:
                if name == "num_prompts" and ("repeats" in b or "repeats" in n):
                    # a matrix row's count is per run x repeats: compare what one run sent
                    pb, pn = _prompts_per_run(b), _prompts_per_run(n)
                    if pb is not None and pn is not None and pb != pn:
                        cmp.mismatches.append((key, name, pb, pn))
                    continue
                if name == "model" and (b.get(name) is None or n.get(name) is None):
                    continue  # a run that does not know its model's name
                if name in b and name in n and b[name] != n[name]:
                    cmp.mismatches.append((key, name, b[name], n[name]))
            same_rows_dataset = b.get("dataset") in SEEDED_ROW_DATASETS and b.get("dataset") == n.get(
                "dataset"
            )
            if same_rows_dataset and "seed" in b and "seed" in n and b["seed"] != n["seed"]:
                cmp.mismatches.append((key, "seed", b["seed"], n["seed"]))
            if not any(k == key for k, *_ in cmp.mismatches):  # else that setting explains them
                cmp.mismatches += [(key, name, vb_, vn_) for name, vb_, vn_ in length_mismatches(b, n)]
            ratio = float(n[metric]) / float(b[metric])
            cmp.rows.append((key, float(b[metric]), float(n[metric]), ratio))
            rb, rn = run_values(b, metric), run_values(n, metric)
            if len(rb) >= 2 and len(rn) >= 2:
                cmp.repeats[key] = (rb, rn)
                lo, hi = welch_interval(rb, rn)
                if lo <= 0.0 <= hi:
                    cmp.ties.add(key)
            elif abs(ratio - 1.0) * 100.0 < cmp.tie_pct:
                cmp.ties.add(key)
        elif vb:
            cmp.only_base.append(key)
        elif vn:
            cmp.only_new.append(key)
        else:
            cmp.neither.append(key)
    return cmp


def _label(k: Key) -> str:
    return f"C{k[0]}/I{k[1]}/O{k[2]}"


def _listed(cmp: Comparison, keys: Iterable[Key], most: int = 6) -> str:
    """The labels of ``keys`` (see :meth:`Comparison.label`), the first ``most`` of them."""
    keys = sorted(keys)
    shown = ", ".join(cmp.label(k) for k in keys[:most])
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "")


def nothing_to_compare(
    cmp: Comparison,
    base: dict[Key, dict[str, Any]],
    new: dict[Key, dict[str, Any]],
    base_name: str,
    new_name: str,
) -> str:
    """Why ``cmp`` (of ``base`` and ``new``) has no point valid in both, in one line: the runs'
    points differ (each run's C/I/O listed), or the points they share are not valid in both (how
    many in each run are not: failed, or without a positive metric)."""
    shared = sorted(set(base) & set(new))
    if not shared:
        return (
            f"{base_name} and {new_name} share no point, their C/I/O differ ({base_name}: "
            f"{_listed(cmp, base)}; {new_name}: {_listed(cmp, new)}): nothing to compare"
        )
    bad_b = sum(1 for k in shared if not _valid(base[k], cmp.metric))
    bad_n = sum(1 for k in shared if not _valid(new[k], cmp.metric))
    return (
        f"no point is valid in both {base_name} and {new_name}: of the {len(shared)} they share "
        f"({_listed(cmp, shared)}), {bad_b} failed or lack a positive {cmp.metric} in {base_name} and "
        f"{bad_n} in {new_name}: nothing to compare"
    )


def mismatch_warnings(cmp: Comparison) -> list[str]:
    """One line per difference between the runs (a setting and its two values), in the order
    first seen, with the points it holds at: what ``surge bench compare`` prints on stderr."""
    points: dict[tuple[str, str, str], list[Key]] = {}
    for key, name, b, n in cmp.mismatches:
        points.setdefault((name, repr(b), repr(n)), []).append(key)
    lines = []
    for (name, b, n), keys in points.items():
        where = cmp.label(keys[0]) if len(keys) == 1 else f"{len(keys)} points"
        other = " (other prompts)" if name == "seed" else ""
        lines.append(f"the runs differ in {name}{other}: {b} in BASE, {n} in NEW (at {where})")
    return lines


def comparison_markdown(cmp: Comparison, base_name: str, new_name: str) -> str:
    """The markdown report ``surge bench compare`` prints."""
    better = "lower" if cmp.lower_is_better else "higher"
    lines = [
        f"## `{cmp.metric}`: NEW `{new_name}` vs BASE `{base_name}` ({better} is better)",
        "",
        "| C | I | O | base | new | change | verdict |",
        "|---:|---:|---:|---:|---:|---:|:---|",
    ]
    if cmp.mismatches:
        shown = "; ".join(
            f"{cmp.label(k)} {name} {b!r} vs {n!r}" + (" (other prompts)" if name == "seed" else "")
            for k, name, b, n in cmp.mismatches[:5]
        )
        more = f" (and {len(cmp.mismatches) - 5} more)" if len(cmp.mismatches) > 5 else ""
        lines[1:1] = ["", f"**Warning: the runs were measured differently:** {shown}{more}."]
    for key, vb, vn, r in cmp.rows:
        noise = " (in noise)" if key in cmp.ties else ""
        i, o = cmp.length_cells(key)
        lines.append(
            f"| {key[0]} | {i} | {o} | {vb:,.2f} | {vn:,.2f} | {pct(r)} | {cmp.verdict(key, r)}{noise} |"
        )
    ci = cmp.geomean_interval()
    ci_text = "" if ci is None else f" (95% CI {pct(ci[0])} to {pct(ci[1])}, {ci[2]})"
    n_rows = len(cmp.rows)
    lines += [
        "",
        f"**Geometric mean change over {n_rows} point{'s' if n_rows != 1 else ''} valid in both: "
        f"{pct(cmp.geomean)}**{ci_text}",
        "",
    ]
    for title, idx in (("concurrency", 0), ("output length", 2)):
        groups, left_out = cmp.grouped(idx), cmp.ungrouped(idx)
        lines += [f"### By {title}", ""]
        if groups:
            lines += [f"| {title} | points | geomean change |", "|---:|---:|---:|"]
            lines += [f"| {value} | {n} | {pct(g)} |" for value, (n, g) in groups.items()]
            lines.append("")
        if left_out:
            lines += [
                f"Left out: {len(left_out)} point{'s' if len(left_out) != 1 else ''} of a dataset's own "
                f"{title}s ({', '.join(cmp.label(k) for k in left_out)}).",
                "",
            ]
    w, lo, t = cmp.wins_losses()
    n_rep = len(cmp.repeats)
    tie_rule = (
        f"ties: 95% Welch t-interval over repeats contains 0 ({n_rep} points)"
        + (f", else change < {cmp.tie_pct:g}%" if n_rep < len(cmp.rows) else "")
        if n_rep
        else f"ties: change < {cmp.tie_pct:g}% (no repeats to measure the noise)"
    )
    lines.append(f"Wins: {w}, losses: {lo}, ties: {t} (NEW against BASE; {tie_rule}).")
    for title, keys in (
        ("Valid only in BASE", cmp.only_base),
        ("Valid only in NEW", cmp.only_new),
        ("Valid in neither", cmp.neither),
    ):
        if keys:
            lines.append(f"{title} ({len(keys)}): {', '.join(cmp.label(k) for k in keys)}")
    return "\n".join(lines) + "\n"


def plot_comparison(cmp: Comparison, path: Path) -> None:
    """Bar chart of the per-point change in % (Agg backend): wins green, losses red, ties grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [cmp.label(k) for k, *_ in cmp.rows]
    changes = [(r - 1.0) * 100.0 for *_, r in cmp.rows]
    colors = {"win": "tab:green", "loss": "tab:red", "tie": "tab:gray"}
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(labels)), 5))
    ax.bar(range(len(labels)), changes, color=[colors[cmp.verdict(k, r)] for k, *_, r in cmp.rows])
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(f"{cmp.metric} change (%)")
    ax.set_title(f"NEW vs BASE, geometric mean {pct(cmp.geomean)}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
