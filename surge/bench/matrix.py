"""``surge bench matrix``: a grid of burst points run one after another, with artifacts.

Each point (C, I, O) is a ``bench serve`` run with ``num_prompts = max_concurrency = C``,
``request_rate = inf``, ``--ignore-eos`` and exact-length validation.

Fresh prompts: each run of a point draws its prompts (and its warm-up prompt) from its own seed,
derived from (``--seed``, C, I, O, repeat) by :func:`point_seed`, so no two points or repeats
share a prompt; and before each run the matrix calls the server's ``POST /reset_prefix_cache``
when it has one (Surge; vLLM with ``VLLM_SERVER_DEV_MODE=1``), so no run finds the prompts of an
earlier run (or an earlier matrix on the same server) in the prefix cache. ``--keep-prefix-cache``
skips the reset.

Repeats: ``--repeats R`` runs each point R times (fresh prompts each time); the summary row holds
the mean over the runs and the spread (population std, min, max) of the main metrics, and the
per-run values under ``runs`` (``surge bench compare`` uses them as the noise of the point).

Percentiles: each run reports those of ``--percentiles`` and always P99, which the summary's
columns show (with the means and medians, whatever ``--percentiles`` asks).

Written to ``--output-dir``: per run ``C{C}_I{I}_O{O}.json`` (``..._r{k}.json`` with repeats; the
aggregates) and ``*.requests.json.gz`` (the per-request lists, see :mod:`surge.bench.results`),
``summary.json``, ``summary.md``, ``throughput.png`` and ``latency.png`` (and ``server.log`` with
``--launch``). The summary is rewritten after every point; ``--resume`` keeps the successful
points of an earlier run into the same folder (those outside this run's grid too, listed after
its points) and runs only the others, and ``--stop-after S``
starts no new point after S seconds, so a long matrix can be split over several calls. A
``--resume`` with another setting that changes what a point measures (:data:`_RESUME_SAME`: the
server, seed, ``--repeats``, ``--warmup``...) is refused in one line; another ``--percentiles``
is taken (the summary's columns do not depend on it; the kept points' files keep the earlier
run's percentiles, the new points' files have the new ones). The summary's ``earlier_runs`` keeps
the date, command and server restarts of the calls whose points were kept. A run into a folder
that holds an earlier run, without ``--resume``, first moves that run's files to
``earlier-DATE/`` inside it (:func:`set_aside_earlier_run`), so the folder holds one run.
With ``--launch CMD`` the server is started here, restarted when it dies (that point fails, the
matrix goes on) and stopped at the end.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from surge.bench.launcher import ServerLauncher, check_port_free, sigterm_raises
from surge.bench.report import plot_matrix, summary_markdown
from surge.bench.results import cannot_make_folder, cannot_write, file_in_the_way, write_result
from surge.bench.serve import (
    ServeConfig,
    fetch_models,
    make_counter,
    model_entry,
    roofline_unused_reason,
    run_serve,
)
from surge.bench.tokens import TokenCounter, request_headers, tls_context


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
    """``"1,4,16"`` -> ``[1, 4, 16]``. Raises ValueError naming ``flag`` on a bad, non-positive or
    repeated value."""
    items = text.split(",")
    if len(items) > 1 and not all(x.strip() for x in items):
        raise ValueError(f"{flag} has an empty item in {text!r} (give comma-separated integers, e.g. 1,4,16)")
    try:
        vals = [int(x) for x in items if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} expects comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{flag} expects positive integers, got {text!r}")
    twice = sorted({v for v in vals if vals.count(v) > 1})
    if twice:  # each run of the point overwrote its one result file, and the summary listed it again
        raise ValueError(
            f"{flag} gives {', '.join(map(str, twice))} more than once in {text!r} (each point runs once: "
            "--repeats measures the points again)"
        )
    return vals


def point_seed(seed: int, pt: MatrixPoint, repeat: int = 0) -> int:
    """The prompt seed of one run of a point: a hash of (seed, C, I, O, repeat) by numpy's
    ``SeedSequence`` (well mixed; equal inputs give equal seeds on every machine).

    Raises:
        ValueError: a negative ``seed``.
    """
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    ss = np.random.SeedSequence([seed, pt.concurrency, pt.input_len, pt.output_len, repeat])
    return int(ss.generate_state(1, dtype=np.uint32)[0])


def reset_prefix_cache(
    base_url: str,
    api_key: str | None,
    timeout_s: float = 30.0,
    insecure: bool = False,
    headers: tuple[tuple[str, str], ...] = (),
) -> bool | None:
    """``POST {base_url}/reset_prefix_cache``: True when the server reset its prefix cache,
    False when it answered but refused (vLLM's ``{"success": false}``, or an error status),
    None when it has no such endpoint (404 or 405) or cannot be reached. ``insecure``: no TLS
    certificate check (``--insecure``); ``headers``: vLLM's ``--header`` pairs."""
    sent = request_headers(api_key, headers)
    req = urllib.request.Request(f"{base_url.rstrip('/')}/reset_prefix_cache", data=b"", headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=tls_context(insecure)) as resp:
            body = resp.read()
    except urllib.error.HTTPError as e:
        return None if e.code in (404, 405) else False
    except (OSError, ValueError):
        return None
    try:
        ans = json.loads(body) if body.strip() else None
    except json.JSONDecodeError:
        ans = None
    return not (isinstance(ans, dict) and ans.get("success") is False)


@dataclass(frozen=True)
class MatrixConfig:
    """A matrix run: the points, the per-point settings, where to write, and how to launch the server.

    ``repeats`` runs per point; ``reset_prefix_cache`` before each run; ``resume`` keeps the
    successful points already in ``output_dir``; ``stop_after_s`` starts no new point after
    that many seconds (None: no limit).
    """

    points: tuple[MatrixPoint, ...]
    serve: ServeConfig
    output_dir: Path
    launch: str | None = None
    server_timeout_s: float = 600.0
    repeats: int = 1
    reset_prefix_cache: bool = True
    resume: bool = False
    stop_after_s: float | None = None  # the first point always runs, so every call makes progress


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
    "median_e2el_ms",
    "p99_e2el_ms",
    "request_goodput",
    "roofline_output_throughput",
    "pct_of_roofline",
)
_SUMMED_KEYS = ("completed", "failed")
SPREAD_KEYS = (
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
)
"""Metrics whose spread over repeats the summary reports (``{key}_std``, ``_min``, ``_max``)."""


def point_entry(
    pt: MatrixPoint,
    result: dict[str, Any] | None,
    error: str | None,
    file: str,
) -> dict[str, Any]:
    """The ``summary.json`` row of one run of a point; ``success`` means no error and every
    request valid. A run without a successful request has None (n/a) for every metric but its
    request counts, duration and roofline ceiling."""
    entry: dict[str, Any] = {
        "concurrency": pt.concurrency,
        "input_len": pt.input_len,
        "output_len": pt.output_len,
        "num_prompts": pt.concurrency,
        "result_file": file,
        "error": error,
    }
    # A run in which no request succeeded has no latency or throughput to report: n/a, as for a
    # point that never reached the server, not the zeros of empty lists.
    measured = bool(result) and bool(result.get("completed"))
    for k in _SUMMARY_KEYS:
        if k in _SUMMED_KEYS or k in ("duration", "roofline_output_throughput"):
            entry[k] = result.get(k) if result else None
        else:
            entry[k] = result.get(k) if measured else None
    if result is not None and error is None and result["failed"]:
        reasons = sorted({e for e in result.get("errors", []) if e})
        entry["error"] = f"{result['failed']} failed request(s): {'; '.join(reasons[:3])}"
    entry["success"] = bool(result) and entry["error"] is None and result["completed"] == pt.concurrency
    return entry


def combine_runs(pt: MatrixPoint, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary row of a point run ``len(runs)`` times (rows of :func:`point_entry`).

    Metrics are the mean over the successful runs (``completed``/``failed`` are sums); the
    point succeeds when every run did. With more than one run, ``runs`` keeps each run's
    main metrics and ``{key}_std`` (population std), ``{key}_min``, ``{key}_max`` give the
    spread of :data:`SPREAD_KEYS`.
    """
    if len(runs) == 1:
        return {**runs[0], "repeats": 1}
    ok = [r for r in runs if r["success"]]
    row: dict[str, Any] = {
        "concurrency": pt.concurrency,
        "input_len": pt.input_len,
        "output_len": pt.output_len,
        "num_prompts": pt.concurrency * len(runs),
        "repeats": len(runs),
        "repeats_ok": len(ok),
        "result_file": runs[0]["result_file"],
        "result_files": [r["result_file"] for r in runs],
    }
    for k in _SUMMARY_KEYS:
        if k in _SUMMED_KEYS:
            row[k] = sum(int(r[k] or 0) for r in runs)
            continue
        vals = [float(r[k]) for r in ok if isinstance(r.get(k), int | float)]
        row[k] = float(np.mean(vals)) if vals else None
    for k in SPREAD_KEYS:
        vals = [float(r[k]) for r in ok if isinstance(r.get(k), int | float)]
        row[f"{k}_std"] = float(np.std(vals)) if vals else None
        row[f"{k}_min"] = min(vals) if vals else None
        row[f"{k}_max"] = max(vals) if vals else None
    row["runs"] = [
        {"success": r["success"], "result_file": r["result_file"], **{k: r.get(k) for k in SPREAD_KEYS}}
        for r in runs
    ]
    errors = [f"run {i + 1}: {r['error']}" for i, r in enumerate(runs) if r.get("error")]
    row["error"] = "; ".join(errors) if errors else None
    row["success"] = len(ok) == len(runs)
    return row


_DEATH_GRACE_S = 5.0
"""How long a failed point waits for a launched server that may be dying to exit (seconds)."""


def _run_point(
    mcfg: MatrixConfig,
    pt: MatrixPoint,
    repeat: int,
    launcher: ServerLauncher | None,
    counter: TokenCounter | None,
    command: str,
    said: set[str],
) -> tuple[dict[str, Any] | None, str | None, TokenCounter | None]:
    """Run one point once; returns (result or None, error or None, the token counter to reuse).
    ``said`` holds the warnings the earlier points said, each said once for the matrix."""
    result: dict[str, Any] | None = None
    error: str | None = None
    try:
        seed = point_seed(mcfg.serve.seed, pt, repeat)
        reset: bool | None = None
        if mcfg.reset_prefix_cache:
            reset = reset_prefix_cache(
                mcfg.serve.base_url,
                mcfg.serve.api_key,
                insecure=mcfg.serve.insecure,
                headers=mcfg.serve.headers,
            )
        cfg = replace(
            mcfg.serve,
            input_len=pt.input_len,
            output_len=pt.output_len,
            num_prompts=pt.concurrency,
            max_concurrency=pt.concurrency,
            request_rate=math.inf,
            seed=seed,
            # the summary's P99 columns need P99 whatever --percentiles asks (the file keeps all)
            percentiles=tuple(sorted({*mcfg.serve.percentiles, 99.0})),
            extra={
                "concurrency": pt.concurrency,
                "matrix_point": pt.stem,
                "matrix_seed": mcfg.serve.seed,
                "repeat": repeat,
                "prefix_cache_reset": reset,
            },
        )
        if counter is None:
            counter = make_counter(cfg)
        result = run_serve(cfg, command, counter, said)
    except (ValueError, OSError) as e:
        error = str(e)
    # A failed point may be the server dying: give its exit a moment to show before blaming it.
    if launcher is not None and launcher.exits_within(_DEATH_GRACE_S if error else 0.0):
        error = (error + "; " if error else "") + "server died during the point"
    return result, error, counter


def _summary_hardware(serve: ServeConfig) -> dict[str, Any] | None:
    """The roofline's GPU as ``summary.json`` names it (None without one)."""
    hw = serve.hardware
    if hw is None:
        return None
    return {
        "name": hw.name,
        "hbm_bandwidth": hw.hbm_bandwidth,
        "peak_flops": hw.peak_flops,
        "peak_flops_fp8": hw.peak_flops_fp8,
    }


def _write_summary(
    mcfg: MatrixConfig, rows: list[dict[str, Any]], info: dict[str, Any], command: str
) -> dict[str, Any]:
    """Write ``summary.json`` and ``summary.md`` for the rows so far (called after every point)."""
    summary: dict[str, Any] = {
        "date": info["date"],
        "command": command,
        "base_url": mcfg.serve.base_url,
        "endpoint": mcfg.serve.endpoint,
        "model": info["model"],
        "launch": mcfg.launch,
        # this run's restarts and those of the earlier runs whose points it kept (--resume)
        "server_restarts": info["restarts"] + sum(r["server_restarts"] for r in info["earlier_runs"]),
        "earlier_runs": info["earlier_runs"],
        "seed": mcfg.serve.seed,
        "temperature": mcfg.serve.temperature,
        "extra_body": mcfg.serve.extra_body,
        "repeats": mcfg.repeats,
        "warmup": mcfg.serve.warmup,
        "goodput_slo_ms": _resume_value(mcfg, "goodput_slo_ms"),
        "prefix_cache_reset": mcfg.reset_prefix_cache,
        "hardware": _summary_hardware(mcfg.serve),
        "roofline_tp": mcfg.serve.roofline_tp,
        "roofline_dtype": mcfg.serve.roofline_dtype,
        "roofline_kv_cache_dtype": mcfg.serve.roofline_kv_cache_dtype,
        "num_points": len(rows),
        "num_planned_points": len(mcfg.points) + info["kept_outside"],  # the grid and earlier points kept
        "num_successful": sum(1 for r in rows if r["success"]),
        "points": rows,
    }
    out = mcfg.output_dir
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    header = f"# Benchmark matrix {summary['date']}" + (f"\n\n`{command}`" if command else "")
    goodput = bool(mcfg.serve.goodput)
    (out / "summary.md").write_text(summary_markdown(rows, header, planned=len(mcfg.points), goodput=goodput))
    return summary


_RESUME_SAME = (
    "base_url",
    "endpoint",
    "model",
    "seed",
    "temperature",
    "extra_body",
    "repeats",
    "warmup",
    "goodput_slo_ms",
    "prefix_cache_reset",
    "hardware",
    "roofline_tp",
    "roofline_dtype",
    "roofline_kv_cache_dtype",
)
"""Summary fields a ``--resume`` must share with the earlier run (a field the earlier summary
lacks is not compared; ``prefix_cache_reset`` is ``--keep-prefix-cache``'s opposite, as the summary
records it; ``model``, when this run takes the server's, is compared with the model
the server serves once it answers, :func:`_check_served_model`): the roofline's settings
too, else the kept points' roofline columns would be another GPU's or dtype's than the new ones'.
``repeats`` and ``warmup`` too: a point's row is the mean of its repeats, measured after its
warm-up requests, and another count would either re-run every kept point (the rows of another
repeat count are not kept) or mix points measured after other warm-ups. ``goodput_slo_ms`` (the
``--goodput`` SLOs in ms, null without): the goodput column would mix points of other SLOs.
``--percentiles`` is not compared: it changes what each new point's file reports, not the
summary's columns."""


def _resume_value(mcfg: MatrixConfig, name: str) -> Any:
    """This run's value of the summary field ``name`` of :data:`_RESUME_SAME`, as
    :func:`run_matrix`'s summary writes it."""
    if name == "hardware":
        return _summary_hardware(mcfg.serve)
    if name == "prefix_cache_reset":
        return mcfg.reset_prefix_cache
    if name == "repeats":
        return mcfg.repeats
    if name == "goodput_slo_ms":
        return dict(mcfg.serve.goodput) or None
    return getattr(mcfg.serve, name)


def _previous_rows(
    mcfg: MatrixConfig,
) -> tuple[dict[tuple[int, int, int], dict[str, Any]], str | None, list[dict[str, Any]]]:
    """Successful rows of an earlier run in ``output_dir`` whose result files still exist
    (and that ran as many repeats as asked now), by (C, I, O), the earlier run's ``model``
    (None when its summary names none), and the runs that wrote that summary (its
    ``earlier_runs`` and itself: ``date``, ``command``, ``server_restarts``), oldest first.

    Raises:
        ValueError: the earlier run was measured against another server, endpoint, model, seed,
            temperature or extra body, with another ``--repeats``, ``--warmup`` or ``--goodput``,
            with the prefix cache reset where this run keeps it (or the other way round), or with
            another roofline GPU, TP size or dtype (:data:`_RESUME_SAME`): its points would be
            mixed with this run's under this run's settings.
    """
    path = mcfg.output_dir / "summary.json"
    if not path.is_file():
        return {}, None, []
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}, None, []
    now = {name: _resume_value(mcfg, name) for name in _RESUME_SAME}
    for name in _RESUME_SAME if isinstance(old, dict) else ():
        if name == "model" and now[name] is None:
            continue  # this run takes the server's model
        if name in old and old[name] != now[name]:
            raise ValueError(
                f"--resume: {path} was measured with {name} {old[name]!r}, this run has {now[name]!r}; "
                "resume with the same settings or write to another --output-dir"
            )
    rows: dict[tuple[int, int, int], dict[str, Any]] = {}
    for r in old.get("points", []) if isinstance(old, dict) else []:
        try:
            key = (int(r["concurrency"]), int(r["input_len"]), int(r["output_len"]))
        except (KeyError, TypeError, ValueError):
            continue
        files = r.get("result_files") or [r.get("result_file")]
        if (
            r.get("success")
            and int(r.get("repeats", 1)) == mcfg.repeats
            and all(isinstance(f, str) and (mcfg.output_dir / f).is_file() for f in files)
        ):
            rows[key] = r
    model = old.get("model") if isinstance(old, dict) else None
    history: list[dict[str, Any]] = []
    if isinstance(old, dict):
        earlier = old.get("earlier_runs")
        for r in earlier if isinstance(earlier, list) else []:
            if isinstance(r, dict):
                history.append(_run_record(r.get("date"), r.get("command"), r.get("server_restarts")))
        total = _restarts(old.get("server_restarts"))
        own = total - sum(r["server_restarts"] for r in history)
        history.append(_run_record(old.get("date"), old.get("command"), max(own, 0)))
    return rows, model if isinstance(model, str) else None, history


def _restarts(value: Any) -> int:
    """A summary's server restart count, 0 when absent or not a non-negative integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _run_record(date: Any, command: Any, restarts: Any) -> dict[str, Any]:
    """One ``earlier_runs`` entry of a summary, its fields checked (a hand-edited summary may
    hold anything): ``date`` and ``command`` strings or None, ``server_restarts`` an int >= 0."""
    return {
        "date": date if isinstance(date, str) else None,
        "command": command if isinstance(command, str) else None,
        "server_restarts": _restarts(restarts),
    }


def _served_model(result: dict[str, Any]) -> str | None:
    """The model name a point's requests carried when ``--model`` was left out: the ``id`` of the
    first model of the server's ``/v1/models`` (the result's ``model_id`` is that model's ``root``,
    as vLLM's); None when the result lacks it."""
    try:
        name = result["server_models"]["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        return None
    return name if isinstance(name, str) else None


def _check_served_model(
    mcfg: MatrixConfig, previous_model: str | None, models: dict[str, Any] | None = None
) -> None:
    """The server must serve ``--model`` (else every point would fail with the same error), and,
    for a ``--resume`` without ``--model``, the model it serves (the first of its
    ``/v1/models``, the one this run measures) must be the earlier run's. ``models`` is the
    server's ``/v1/models`` answer when the caller has it, else it is fetched.

    Raises:
        ValueError: the server does not serve ``--model``, or serves another model than the
            earlier run's (one line, as the other resume checks).
    """
    if mcfg.serve.model is None and previous_model is None:
        return
    if models is None:
        models = fetch_models(
            mcfg.serve.base_url, mcfg.serve.api_key, mcfg.serve.insecure, headers=mcfg.serve.headers
        )
    if mcfg.serve.model is not None:
        model_entry(models, mcfg.serve.model)
        return
    served = models["data"][0].get("id")
    if served != previous_model:
        raise ValueError(
            f"--resume: {mcfg.output_dir / 'summary.json'} was measured with model {previous_model!r}, "
            f"the server at {mcfg.serve.base_url} serves {served!r}; resume with the same settings or "
            "write to another --output-dir"
        )


_RUN_FILE = re.compile(
    r"C\d+_I\d+_O\d+(_r\d+)?(\.requests)?\.json(\.gz)?|summary\.(json|md)|(throughput|latency)\.png|server\.log"
)
"""The names of the files a matrix run writes into its folder (:func:`set_aside_earlier_run`)."""


def set_aside_earlier_run(out: Path) -> tuple[Path, int] | None:
    """Move an earlier run's files out of the way of a new run into the same folder (not a
    ``--resume``): the new summary would replace the earlier one, and the earlier points outside
    the new grid would stay as files that no summary lists. They go to ``out/earlier-DATE``
    (DATE: the earlier summary's ``date``; ``-2``, ``-3``... when taken). Returns that folder and
    the number of files moved, or None when ``out`` holds no ``summary.json``.

    Raises:
        ValueError: the folder cannot be made or a file cannot be moved (the message names it);
            the files moved before it stay in ``out/earlier-DATE``.
    """
    summary = out / "summary.json"
    if not summary.is_file():
        return None
    try:
        date = json.loads(summary.read_text()).get("date")
    except (OSError, ValueError, AttributeError):
        date = None
    if not (isinstance(date, str) and re.fullmatch(r"[\w.-]{1,64}", date)):
        date = datetime.fromtimestamp(summary.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
    dest, k = out / f"earlier-{date}", 1
    while dest.exists():
        k += 1
        dest = out / f"earlier-{date}-{k}"
    files = sorted(f for f in out.iterdir() if f.is_file() and _RUN_FILE.fullmatch(f.name))
    try:
        dest.mkdir()
    except OSError as e:
        raise ValueError(
            f"--output-dir {out}: cannot make {dest} for the earlier run ({e.strerror or e})"
        ) from None
    for f in files:
        try:
            f.rename(dest / f.name)
        except OSError as e:
            raise ValueError(
                f"--output-dir {out}: cannot move {f.name} to {dest} ({e.strerror or e})"
            ) from None
    return dest, len(files)


def run_matrix(mcfg: MatrixConfig, command: str = "") -> dict[str, Any]:
    """Run every point, write the artifacts, return the summary dict (``points`` holds the rows).

    The summary files are rewritten after every point, so an interrupted run keeps what it measured.
    Raises:
        ValueError: the output folder cannot be created or written, the server (without ``--launch``) cannot
            be reached, the first server start fails, a ``--resume`` finds a folder measured
            with other settings or against another model, or an earlier run's files cannot be
            moved aside (:func:`set_aside_earlier_run`).
    """
    out = mcfg.output_dir
    if mcfg.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {mcfg.repeats}")
    if not (mcfg.server_timeout_s > 0 and math.isfinite(mcfg.server_timeout_s)):
        raise ValueError(f"--server-timeout must be > 0 and finite (seconds), got {mcfg.server_timeout_s}")
    if mcfg.points:
        point_seed(mcfg.serve.seed, mcfg.points[0])  # a bad seed fails here, before any server start
    blocker = file_in_the_way(out)
    if blocker is not None:
        raise ValueError(f"--output-dir {out}: {blocker} is a file, not a folder")
    # checked now, made after the server checks below: a refused run leaves no empty folder
    why = cannot_write(out / "summary.json") if out.is_dir() else cannot_make_folder(out)
    if why is not None:  # before any request: an existing summary is left as it is
        raise ValueError(f"--output-dir {out}: cannot write files there ({why})")
    previous, previous_model, earlier_runs = _previous_rows(mcfg) if mcfg.resume else ({}, None, [])
    if not previous:
        previous_model, earlier_runs = None, []
    grid = {(pt.concurrency, pt.input_len, pt.output_len) for pt in mcfg.points}
    todo = [pt for pt in mcfg.points if (pt.concurrency, pt.input_len, pt.output_len) not in previous]
    # an earlier run's points outside this grid stay in the summary, after the grid's (--resume keeps them)
    kept_outside = [row for key, row in previous.items() if key not in grid]
    if previous:
        outside = f"; {len(kept_outside)} point(s) outside this grid kept" if kept_outside else ""
        print(
            f"[matrix] resuming: {len(mcfg.points) - len(todo)} point(s) already done in {out}{outside}",
            flush=True,
        )
    if not mcfg.launch and todo:
        models = fetch_models(
            mcfg.serve.base_url, mcfg.serve.api_key, mcfg.serve.insecure, headers=mcfg.serve.headers
        )  # fail once, up front, if unreachable
        _check_served_model(mcfg, previous_model, models)
    if mcfg.launch and todo:
        check_port_free(mcfg.serve.base_url)  # ServerLauncher.start checks it again, at each start
    unused = roofline_unused_reason(mcfg.serve)
    if unused and todo:  # once, after the checks that refuse the run (a point's run_serve says nothing)
        print(f"surge: warning: {unused}", file=sys.stderr)
    if not mcfg.resume:
        moved = set_aside_earlier_run(out)
        if moved is not None:
            print(
                f"[matrix] {out} held an earlier run: its {moved[1]} file(s) moved to {moved[0]} "
                "(--resume continues a run instead)",
                flush=True,
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--output-dir {out}: {e.strerror or e}") from None
    launcher = (
        ServerLauncher(mcfg.launch, mcfg.serve.base_url, mcfg.server_timeout_s, out / "server.log")
        if mcfg.launch and todo
        else None
    )
    new_rows: dict[tuple[int, int, int], dict[str, Any]] = {}
    info: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "model": mcfg.serve.model or previous_model,  # the kept points' model, also when none is left to run
        "restarts": 0,
        "earlier_runs": earlier_runs,  # the runs whose points --resume keeps
        "kept_outside": len(kept_outside),  # earlier points outside this grid, in the summary too
    }

    def ordered_rows() -> list[dict[str, Any]]:
        rows = []
        for pt in mcfg.points:
            key = (pt.concurrency, pt.input_len, pt.output_len)
            row = new_rows.get(key) or previous.get(key)
            if row is not None:
                rows.append(row)
        return rows + kept_outside

    counter: TokenCounter | None = None
    summary: dict[str, Any] = {}
    total = len(todo)
    t_start = time.monotonic()
    no_reset_said = False
    said: set[str] = set()  # the points' warnings said so far: each kind once for the matrix
    stack = contextlib.ExitStack()
    if launcher is not None:  # a SIGTERM stops the launched server too
        stack.enter_context(sigterm_raises())
    try:
        if launcher is not None:
            launcher.start()
            _check_served_model(mcfg, previous_model)
        for n, pt in enumerate(todo, 1):
            if n > 1 and mcfg.stop_after_s is not None and time.monotonic() - t_start > mcfg.stop_after_s:
                print(f"[matrix] --stop-after {mcfg.stop_after_s:g} s reached: {total - n + 1} point(s) left")
                break
            runs: list[dict[str, Any]] = []
            for rep in range(mcfg.repeats):
                tag = f" run {rep + 1}/{mcfg.repeats}" if mcfg.repeats > 1 else ""
                print(f"[matrix {n}/{total}] {pt.stem}{tag}", flush=True)
                restart_error: str | None = None
                try:
                    if launcher is not None and launcher.ensure_running():
                        info["restarts"] += 1
                except ValueError as e:
                    restart_error = str(e)
                if restart_error is None:
                    result, error, counter = _run_point(mcfg, pt, rep, launcher, counter, command, said)
                else:
                    result, error = None, restart_error
                if result is not None:
                    info["model"] = info["model"] or _served_model(result)
                    reset = result.get("prefix_cache_reset")
                    if mcfg.reset_prefix_cache and reset is None and not no_reset_said:
                        no_reset_said = True
                        print(
                            "[matrix] the server has no /reset_prefix_cache: prompts are fresh, cache not reset"
                        )
                    elif mcfg.reset_prefix_cache and reset is False:
                        print(
                            "surge: warning: the server refused /reset_prefix_cache before this run",
                            file=sys.stderr,
                            flush=True,
                        )
                stem = pt.stem + (f"_r{rep + 1}" if mcfg.repeats > 1 else "")
                payload: dict[str, Any] = (
                    {"error": error, "matrix_point": pt.stem} if result is None else dict(result)
                )
                if result is not None and error is not None:
                    payload["error"] = error
                file = write_result(out, stem, payload)
                runs.append(point_entry(pt, result, error, file))
            row = combine_runs(pt, runs)
            new_rows[(pt.concurrency, pt.input_len, pt.output_len)] = row
            summary = _write_summary(mcfg, ordered_rows(), info, command)
            thr = row["output_throughput"]
            status = "ok" if row["success"] else f"FAILED: {row['error']}"
            spread = ""
            if mcfg.repeats > 1 and thr and row.get("output_throughput_std") is not None:
                spread = f" ± {row['output_throughput_std']:,.1f}"
            print(
                f"[matrix {n}/{total}] {pt.stem}: {status}"
                + (f", {thr:,.1f}{spread} output tok/s" if thr else "")
            )
    finally:
        if launcher is not None:
            launcher.stop()
        stack.close()
    rows = ordered_rows()
    if not summary:
        summary = _write_summary(mcfg, rows, info, command)
    if rows:
        plot_matrix(rows, out)
    return summary
