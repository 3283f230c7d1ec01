"""What sending a compiled grammar as JSON costs against compiling it again: xgrammar's
``serialize_json`` + ``deserialize_json`` beside ``compile_json_schema`` for schemas of ``n``
required properties (the compile worker's choice, ``SERIALIZE_MAX_BYTES``).

    PYTHONPATH=. python3 benchmarks/grammar_serialize_cost.py --model ../shared/assets/models/qwen3-8b \
        --vocab-size 151936 --properties 1 2 20 40 80 160 300 1000

``--literals N ...`` also compiles a JSON-schema ``const`` of ``N`` characters once each and prints its
compile time and compiled bytes (what ``MAX_COMPILED_BYTES`` and the ``const`` limit rest on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _schema(properties: int, salt: int) -> str:
    props = {f"p{i}_{salt}": {"type": "string" if i % 2 else "integer"} for i in range(properties)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def main() -> None:
    """Print one JSON line per schema size: compiled bytes, JSON bytes and the median times (ms)."""
    import xgrammar as xgr

    from surge.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="model folder (its tokenizer)")
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--properties", type=int, nargs="+", default=[2, 20, 80, 160])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--literals", type=int, nargs="*", default=[], help="const string lengths (characters)")
    args = ap.parse_args()
    info = xgr.TokenizerInfo.from_huggingface(load_tokenizer(args.model), vocab_size=args.vocab_size)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    for n in args.properties:
        times: dict[str, list[float]] = {"compile": [], "serialize": [], "deserialize": []}
        for salt in range(args.repeats):
            t0 = time.perf_counter()
            grammar = compiler.compile_json_schema(_schema(n, salt), any_whitespace=False)
            t1 = time.perf_counter()
            text = grammar.serialize_json()
            t2 = time.perf_counter()
            xgr.CompiledGrammar.deserialize_json(text, info)
            t3 = time.perf_counter()
            for key, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                times[key].append(seconds * 1e3)
        row = {"properties": n, "compiled_bytes": grammar.memory_size_bytes, "json_bytes": len(text)}
        row.update({f"{k}_ms": round(statistics.median(v), 2) for k, v in times.items()})
        print(json.dumps(row), flush=True)
    for n in args.literals:
        t0 = time.perf_counter()
        grammar = compiler.compile_json_schema(json.dumps({"const": "a" * n}))
        seconds = time.perf_counter() - t0
        print(
            json.dumps(
                {
                    "const_chars": n,
                    "compiled_bytes": grammar.memory_size_bytes,
                    "compile_s": round(seconds, 2),
                }
            )
        )


if __name__ == "__main__":
    main()
