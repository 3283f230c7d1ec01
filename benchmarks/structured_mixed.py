"""Constrained requests with fresh JSON schemas, sent while other streams run: the load of the
"compile stall" check of issue 11 (P99 ITL of the unconstrained streams must not change when
constrained requests arrive and their grammars compile).

Every request carries a schema no request had before (random property names, nested objects,
enums, bounded arrays), so each one misses the grammar cache and compiles. One request is
sent every ``--interval`` seconds (with ``--same-schema``, every request carries one schema, so
only the first compiles: the control run, which keeps the arrivals and their prefills), each on its own thread, until ``--stop-file`` exists or
``--max-seconds`` pass; the answers are checked to be JSON objects.

Usage (run next to a `surge bench serve` of unconstrained streams; stdlib only)::

    python3 benchmarks/structured_mixed.py --base-url http://127.0.0.1:8000 \\
        --stop-file OUT/mixed.done --result-file OUT/mixed_constrained.json
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any


def fresh_schema(rng: random.Random) -> dict[str, Any]:
    """A schema of 6-10 properties with random names: strings, bounded integers, enums,
    arrays and one nested object."""

    def name() -> str:
        return "".join(rng.choices(string.ascii_lowercase, k=8))

    props: dict[str, Any] = {}
    for _ in range(rng.randint(6, 10)):
        kind = rng.randrange(5)
        if kind == 0:
            props[name()] = {"type": "string", "maxLength": rng.randint(8, 40)}
        elif kind == 1:
            props[name()] = {"type": "integer", "minimum": 0, "maximum": rng.randint(10, 10**6)}
        elif kind == 2:
            props[name()] = {"enum": [name() for _ in range(rng.randint(2, 6))]}
        elif kind == 3:
            props[name()] = {"type": "array", "items": {"type": "string"}, "maxItems": rng.randint(1, 5)}
        else:
            inner = {name(): {"type": "boolean"}, name(): {"type": "number"}}
            props[name()] = {"type": "object", "properties": inner, "required": list(inner)}
    return {"type": "object", "properties": props, "required": list(props)}


def _model(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=30) as r:
        return json.load(r)["data"][0]["id"]


def _send(
    base_url: str, model: str, schema: dict[str, Any], max_tokens: int, out: list[dict[str, Any]]
) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Fill in the record."}],
        "max_tokens": max_tokens,
        "response_format": {"type": "json_schema", "json_schema": {"name": "record", "schema": schema}},
    }
    req = urllib.request.Request(
        f"{base_url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"ok": False}
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            resp = json.load(r)
        choice = resp["choices"][0]
        rec["finish_reason"] = choice["finish_reason"]
        text = choice["message"]["content"] or ""
        rec["starts_as_object"] = text.startswith("{")
        if choice["finish_reason"] == "stop":
            rec["parses"] = isinstance(json.loads(text), dict)
        rec["ok"] = True
    except Exception as e:  # recorded, the run goes on
        rec["error"] = repr(e)[:300]
    rec["latency_s"] = time.perf_counter() - t0
    out.append(rec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between requests")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop-file", required=True, help="stop sending once this file exists")
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--same-schema",
        action="store_true",
        help="one schema for every request (compiled once): the arrivals without the compilations",
    )
    p.add_argument("--result-file", required=True)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    model = _model(args.base_url)
    records: list[dict[str, Any]] = []
    threads: list[threading.Thread] = []
    t_start = time.monotonic()
    first = fresh_schema(rng)
    while not Path(args.stop_file).exists() and time.monotonic() - t_start < args.max_seconds:
        t = threading.Thread(
            target=_send,
            args=(
                args.base_url,
                model,
                first if args.same_schema else fresh_schema(rng),
                args.max_tokens,
                records,
            ),
            daemon=True,
        )
        t.start()
        threads.append(t)
        time.sleep(args.interval)
    for t in threads:
        t.join(timeout=600)
    lat = sorted(r["latency_s"] for r in records if r["ok"])
    summary = {
        "sent": len(threads),
        "completed": sum(r["ok"] for r in records),
        "failed": sum(not r["ok"] for r in records),
        "stop_finishes_that_parse": sum(bool(r.get("parses")) for r in records),
        "stop_finishes": sum(r.get("finish_reason") == "stop" for r in records),
        "not_an_object": sum(r["ok"] and not r.get("starts_as_object") for r in records),
        "median_latency_s": lat[len(lat) // 2] if lat else None,
        "max_latency_s": lat[-1] if lat else None,
        "records": records,
    }
    Path(args.result_file).write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"constrained requests with fresh schemas: sent {summary['sent']}, completed {summary['completed']}, "
        f"failed {summary['failed']}, not a JSON object {summary['not_an_object']}"
    )
    return 0 if summary["failed"] == 0 and summary["not_an_object"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
