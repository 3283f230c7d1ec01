"""vLLM's ``--save-result`` / ``--append-result`` result files of ``bench serve``.

``vllm bench serve --save-result`` names its file from the run (vLLM 0.26's
``compute_result_filename``): ``{label}-{request_rate}qps[-concurrency{N}]-{model}-{date}.json``, or with
a ramp-up ``{label}-ramp-up-{strategy}-{start}qps-{end}qps[-concurrency{N}]-{model}-{date}.json``,
where ``label`` is ``--label`` or the backend (the result's ``label`` field stays null without
``--label``, as vLLM's), ``model`` the last part of the model id and ``date``
the run's ``%Y%m%d-%H%M%S``; ``--result-filename`` replaces the name and ``--result-dir`` is the folder
(made when missing). ``--append-result`` adds the result to that file as one line of JSON, after a
newline when the file is not empty, so that a file of several runs holds one run a line. A name
ending in ``.gz`` is gzipped (as ``--result-file``'s).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

GZIP_MAGIC = b"\x1f\x8b"


def vllm_result_filename(
    result: dict[str, Any], result_dir: str | None = None, result_filename: str | None = None
) -> Path:
    """The path vLLM's ``--save-result`` writes ``result`` to (see the module docstring).

    ``result`` is a ``bench serve`` result: its ``label`` (null without ``--label``: then its
    ``backend``, as vLLM's name), ``request_rate`` (a number or
    ``"inf"``), ``max_concurrency``, ``ramp_up_strategy``, ``ramp_up_start_rps``,
    ``ramp_up_end_rps``, ``model_id`` and ``date`` fields name the file.
    """
    if result_filename:
        name = result_filename
    else:
        conc = result.get("max_concurrency")
        conc_part = f"-concurrency{conc}" if conc is not None else ""
        model = str(result["model_id"]).rstrip("/").split("/")[-1]
        label = result.get("label") or result["backend"]  # vLLM: label or args.backend
        if result.get("ramp_up_strategy") is not None:
            rates = f"ramp-up-{result['ramp_up_strategy']}-{result['ramp_up_start_rps']}qps-{result['ramp_up_end_rps']}qps"
        else:
            rate = result["request_rate"]
            rates = f"{math.inf if rate == 'inf' else float(rate)}qps"  # vLLM prints its float: inf, 4.0
        name = f"{label}-{rates}{conc_part}-{model}-{result['date']}.json"
    return Path(result_dir) / name if result_dir else Path(name)


def save_vllm_result(path: Path, result: dict[str, Any], append: bool) -> None:
    """Write ``result`` to ``path`` as vLLM does: the file replaced by the JSON (``--save-result``),
    or (``append``, ``--append-result``) the JSON added as one line, after a newline when the file
    is not empty. The folder is made when missing. A name ending in ``.gz`` is gzipped, as
    ``--result-file``'s (vLLM writes plain JSON under any name): appending adds a gzip member, so
    that the file reads as the runs' lines once gunzipped.

    Raises:
        OSError: the file cannot be written.
        ValueError: appending to a ``.gz`` file that is not empty and not gzip (the run would
            make it unreadable).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result)
    if not path.name.endswith(".gz"):
        with open(path, "a+" if append else "w", encoding="utf-8") as f:
            if append and f.tell() != 0:
                f.write("\n")
            f.write(text)
        return
    if not append:
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
        return
    check_appendable(path)
    with open(path, "ab") as f:
        if f.tell() != 0:
            text = "\n" + text
        f.write(gzip.compress(text.encode(), mtime=0))


def check_appendable(path: Path) -> None:
    """Raise ValueError when ``--append-result`` cannot add a gzipped run to ``path`` (a name
    ending in ``.gz``): the file exists, is not empty and is not gzip (a run gzipped after plain
    text would leave neither readable). Nothing to check for another name or a missing file."""
    if not path.name.endswith(".gz") or not path.is_file():
        return
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return  # writing it will say why
    if head and head != GZIP_MAGIC:
        raise ValueError(
            f"--append-result {path}: the file is not gzip, so a gzipped run cannot be added to it "
            "(name another file, or one without .gz)"
        )
