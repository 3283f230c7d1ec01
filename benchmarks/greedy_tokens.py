"""Greedy token ids of one engine over fixed waves of random prompts, to compare two trees bit for bit.

A kernel change that claims the same bits as the code it replaces (a fusion, say) can be checked
end to end: build one engine (``load_format="dummy"``: random weights from the config's seed, so
two trees get the same weights) and, for each ``--wave B:P:N``, admit ``B`` requests of ``P``
random prompt tokens (numpy seed ``--seed``) at once and decode ``N`` greedy tokens each
(``ignore_eos``, with the 5 top log-probabilities of each position), so that every decode step of
the wave runs at batch ``B`` (its CUDA graph). Writes ``{request_id: {"tokens": [...],
"logprobs": [[...], ...]}}`` as JSON; ``--compare OTHER.json`` then counts the requests whose
tokens or log-probabilities (compared exactly: any change in the logits shows) differ, with the
first position where they do (exit 1 on any difference).

Run from the repository root of the tree under test, with that root on ``PYTHONPATH`` (the
script does not add its own tree, so another tree's ``surge`` can be imported)::

    PYTHONPATH=. python3 benchmarks/greedy_tokens.py --model .assets/qwen3-8b --quantization fp8 \\
        --wave 16:32:48 --wave 64:32:48 --json OUT.json [--compare BASE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.sampling_params import SamplingParams


def parse_wave(spec: str) -> tuple[int, int, int]:
    """``B:P:N`` -> ``(batch, prompt tokens, new tokens)``.

    Raises:
        argparse.ArgumentTypeError: not three positive integers.
    """
    try:
        b, p, n = (int(x) for x in spec.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--wave {spec!r}: expected B:P:N, e.g. 64:32:48") from None
    if min(b, p, n) < 1:
        raise argparse.ArgumentTypeError(f"--wave {spec!r}: every field must be at least 1")
    return b, p, n


Run = dict[str, dict[str, list]]


def compare(mine: Run, other: Run) -> int:
    """Print how ``mine`` and ``other`` differ; return the number of differing requests."""
    bad = 0
    for rid in sorted(set(mine) | set(other)):
        a, b = mine.get(rid), other.get(rid)
        if a == b:
            continue
        bad += 1
        if a is None or b is None:
            print(f"{rid}: only in {'other' if a is None else 'this run'}")
            continue
        for key in ("tokens", "logprobs"):
            x, y = a[key], b[key]
            first = next(
                (i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y))
            )
            if first < max(len(x), len(y)):
                print(f"{rid}: {key} differ from position {first} of {len(x)}")
    print(f"{len(mine)} requests, {bad} differ")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder (config.json; weights are random)")
    ap.add_argument("--wave", type=parse_wave, action="append", required=True, help="B:P:N (repeatable)")
    ap.add_argument("--quantization", choices=("fp8",), default=None)
    ap.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    ap.add_argument("--seed", type=int, default=0, help="numpy seed of the prompts")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--compare", type=Path, default=None, help="another run's JSON")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--gpu-memory-utilization", type=float, default=0.45, help="leaves room for a test run beside it"
    )
    args = ap.parse_args()
    from surge.cli import CliError, check_model_dir

    try:  # a bad folder is one line, as `surge serve` says it, not a traceback
        check_model_dir(args.model, load_format="dummy")
    except CliError as e:
        ap.error(str(e))
    engine = LLMEngine(
        build_engine_config(
            args.model,
            dtype=args.dtype,
            load_format="dummy",
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
            max_num_seqs=max(b for b, _, _ in args.wave),
            gpu_memory_utilization=args.gpu_memory_utilization,
        )
    )
    vocab = engine.config.model.vocab_size
    rng = np.random.default_rng(args.seed)
    tokens: Run = {}
    for w, (batch, plen, n) in enumerate(args.wave):
        params = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, logprobs=5)
        for i in range(batch):
            engine.add_request(f"w{w}-{i}", rng.integers(3, vocab, plen).tolist(), params)
        while engine.has_unfinished_requests():
            for out in engine.step():
                row = tokens.setdefault(out.request_id, {"tokens": [], "logprobs": []})
                row["tokens"].extend(out.new_token_ids)
                if out.logprobs is not None:
                    row["logprobs"].extend(out.logprobs.logprobs)
    args.json.write_text(json.dumps(tokens))
    print(f"wrote {len(tokens)} requests to {args.json}")
    if args.compare is not None:
        sys.exit(1 if compare(tokens, json.loads(args.compare.read_text())) else 0)


if __name__ == "__main__":
    main()
