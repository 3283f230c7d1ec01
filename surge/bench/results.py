"""Result files of a matrix point: small JSON for the aggregates, gzip for the per-request lists.

A point's ``C4_I256_O1024.json`` holds every scalar field of the ``bench serve`` result (metrics,
settings, roofline); the per-request lists (``ttfts``, ``itls``, ``latencies``, ...) go to
``C4_I256_O1024.requests.json.gz`` next to it, named by the ``requests_file`` field. Per-token ITL
lists of a large point are megabytes of JSON; gzipped they are a few times smaller, and the
aggregate file stays readable. Times in the lists are stored rounded to 1 microsecond. :func:`load_result` reads either layout (and plain single files).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any

PER_REQUEST_KEYS: tuple[str, ...] = (
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "e2els",
    "start_times",
    "queue_times",
    "errors",
    "generated_texts",
)
"""Fields of a result that hold one entry per request."""

REQUESTS_SUFFIX = ".requests.json.gz"
_GZIP_MAGIC = b"\x1f\x8b"
TIME_KEYS = frozenset({"ttfts", "itls", "latencies", "e2els", "start_times", "queue_times"})
"""Per-request lists of times in seconds; stored rounded to 1 microsecond (far below the noise)."""


def _round_times(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, list):
        return [_round_times(v) for v in value]
    return value


def file_in_the_way(folder: Path) -> Path | None:
    """The first of ``folder`` and its parents that exists as something other than a folder
    (so that ``folder`` cannot be made), or None."""
    for p in (folder, *folder.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def cannot_make_folder(folder: Path) -> str | None:
    """Why ``folder`` (absent) could not be made (the system's reason, e.g. ``Permission
    denied``), or None when it can: a folder is made in its nearest existing parent and removed
    again, so that nothing is left behind when a later check refuses the run. Assumes
    :func:`file_in_the_way` found nothing."""
    base = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".surge-check-", dir=base))
    except OSError as e:
        return e.strerror or str(e)
    return None


def cannot_write(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (the system's reason, e.g. ``Permission denied``,
    or ``Read-only file system``), or None when it can: an absent file is created and removed
    again, an existing one is opened for appending and left as it was. A real try, since
    ``os.access`` says yes to root on a read-only or virtual file system (``/proc``, ``/sys``)."""
    try:
        if path.exists():
            with path.open("ab"):
                pass
        else:
            with path.open("xb"):
                pass
            path.unlink()
    except OSError as e:
        return e.strerror or str(e)
    return None


def write_result(out_dir: Path, stem: str, result: dict[str, Any]) -> str:
    """Write ``stem.json`` (scalars) and, when the result has per-request lists,
    ``stem.requests.json.gz`` (times rounded to 1 us); returns the name of the JSON file."""
    per_request = {
        k: _round_times(result[k]) if k in TIME_KEYS else result[k] for k in PER_REQUEST_KEYS if k in result
    }
    small = {k: v for k, v in result.items() if k not in per_request}
    if per_request:
        name = stem + REQUESTS_SUFFIX
        small["requests_file"] = name
        # mtime=0: the same data gives the same bytes (stable diffs of committed results)
        with (out_dir / name).open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(json.dumps(per_request, separators=(",", ":")).encode())
    (out_dir / f"{stem}.json").write_text(json.dumps(small, indent=2))
    return f"{stem}.json"


def load_result(path: str | Path) -> dict[str, Any]:
    """A point's full result: ``path`` (a ``.json`` or ``.json.gz``) merged with its
    ``requests_file`` when it names one.

    Raises:
        ValueError: a missing or unreadable file.
    """
    p = Path(path)
    data = read_json_file(p)
    if not isinstance(data, dict):
        raise ValueError(f"{p}: not a JSON object")
    req_name = data.get("requests_file")
    if isinstance(req_name, str):
        extra = read_json_file(p.parent / req_name)
        if isinstance(extra, dict):
            data.update(extra)
    return data


def _read_bytes(p: Path) -> bytes:
    """The bytes of ``p``, gunzipped when it is gzip (by its name ending in ``.gz`` or by its
    first bytes; a file of several gzip members, as ``--append-result`` writes to ``X.json.gz``,
    reads as their concatenation).

    Raises:
        ValueError: one line naming the file: missing, unreadable or a broken gzip stream.
    """
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{p}: no such file") from None
    except OSError as e:
        raise ValueError(f"{p}: cannot read it ({e.strerror or e})") from None
    if p.name.endswith(".gz") or raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"{p}: not a readable gzip file ({e})") from None
    return raw


def read_json_file(path: str | Path) -> Any:
    """The JSON value of a file, gunzipped first when it is gzip (``--result-file X.json.gz``):
    by its name ending in ``.gz`` or by its first bytes, whatever its name.

    Raises:
        ValueError: one line naming the file: missing, unreadable, a broken gzip stream, not
            text, or not JSON.
    """
    p = Path(path)
    raw = _read_bytes(p)
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None


def read_json_records(path: str | Path) -> list[Any]:
    """The JSON values of a file: ``[value]`` for a JSON file, or one value a line for a JSON-lines
    file of several (``bench serve --append-result``'s, one run a line, blank lines skipped);
    gunzipped first as :func:`read_json_file`.

    Raises:
        ValueError: one line naming the file: missing, unreadable, a broken gzip stream, not
            text, or neither JSON nor JSON lines (the error of the file as one JSON value).
    """
    p = Path(path)
    raw = _read_bytes(p)
    try:
        return [json.loads(raw)]
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        if not e.msg.startswith("Extra data"):
            raise ValueError(f"{p}: not JSON ({e})") from None
        first_error = e
    try:
        return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    except json.JSONDecodeError:  # not one value a line either: the error of the whole file
        raise ValueError(f"{p}: not JSON ({first_error})") from None
