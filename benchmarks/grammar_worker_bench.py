"""Cost of compiling grammars in worker processes (``surge/structured/compiler.py``) against
compiling in the engine's own process, on CPU.

For each grammar: the median wall time of a compilation in this process (build, compile, the
accepts-text check of :func:`surge.structured.compile_worker.compile_grammar`) against a fresh
cache key through :class:`~surge.structured.compiler.CompiledGrammarCache` (job to the worker,
compile, serialize, back, deserialize), the serialized size, and the first grammar's wait for a
worker to start. Prints one JSON line per row.

    PYTHONPATH=. python3 benchmarks/grammar_worker_bench.py --model ../shared/assets/models/qwen3-8b --vocab-size 151936
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from surge.sampling_params import StructuredOutputsParams
from surge.structured.compile_worker import CompileWorkerSpec, compile_grammar, make_tokenizer_info
from surge.structured.compiler import CompiledGrammarCache


def _schema(properties: int, salt: int) -> str:
    """A JSON schema of ``properties`` required string/integer properties (``salt`` makes the
    cache key new without changing the grammar's size)."""
    props = {f"p{i}_{salt}": {"type": "string" if i % 2 else "integer"} for i in range(properties)}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def main() -> None:
    """Parse the flags, time both paths per schema size (milliseconds, medians of ``--rounds``)
    and print the rows; exits 2 on a bad flag (argparse)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a model folder with tokenizer files")
    ap.add_argument("--vocab-size", type=int, required=True, help="the model's vocabulary size")
    ap.add_argument("--eos", type=int, nargs="+", default=[151645, 151643], help="EOS ids")
    ap.add_argument("--properties", type=int, nargs="+", default=[2, 80], help="schema sizes")
    ap.add_argument("--rounds", type=int, default=10, help="compilations per size and path")
    args = ap.parse_args()
    import xgrammar as xgr

    spec = CompileWorkerSpec(
        tokenizer_dir=args.model, vocab_size=args.vocab_size, stop_token_ids=tuple(args.eos)
    )
    here = xgr.GrammarCompiler(make_tokenizer_info(spec), max_threads=1, cache_enabled=False)
    cache = CompiledGrammarCache(args.model, args.vocab_size, tuple(args.eos), max_workers=1)
    t0 = time.perf_counter()
    cache.submit(StructuredOutputsParams(regex="a+")).result(timeout=300)
    print(json.dumps({"first_grammar_with_worker_start_s": round(time.perf_counter() - t0, 3)}), flush=True)
    salt = 0
    for n in args.properties:
        local: list[float] = []
        worker: list[float] = []
        size = 0
        for _ in range(args.rounds):
            salt += 1
            params = StructuredOutputsParams(json=_schema(n, salt))
            t0 = time.perf_counter()
            compiled = compile_grammar(here, args.vocab_size, params)
            local.append(time.perf_counter() - t0)
            size = len(compiled.serialize_json())
            salt += 1
            params = StructuredOutputsParams(json=_schema(n, salt))
            t0 = time.perf_counter()
            cache.submit(params).result(timeout=300)
            worker.append(time.perf_counter() - t0)
        row = {
            "properties": n,
            "in_process_ms": round(1e3 * statistics.median(local), 2),
            "through_worker_ms": round(1e3 * statistics.median(worker), 2),
            "serialized_bytes": size,
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg()[0],
        }
        print(json.dumps(row), flush=True)
    cache.shutdown()


if __name__ == "__main__":
    main()
