"""Tensor-parallel smoke test on GPUs: greedy ids and batch-1 decode speed of one configuration.

Run once per configuration and compare the printed ids (bf16: the TP all-reduce sums in another
order than one GPU, so a late token may differ; the first ones must not):

    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/tp_smoke.py MODEL --tp 1
    python3 benchmarks/tp_smoke.py MODEL --tp 2 --enforce-eager
    python3 benchmarks/tp_smoke.py MODEL --tp 2

Prints one JSON line: the configuration, the greedy ids of 4 prompts, start-up seconds and the
decode tokens/s of one request (64 tokens after a warm-up request). On CPU it runs at tiny shapes
(``--device cpu`` with a tiny model folder).
"""

from __future__ import annotations

import argparse
import json
import time

from surge import LLM, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--tp-all-reduce", choices=("auto", "nccl"), default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    t0 = time.perf_counter()
    llm = LLM(
        args.model,
        tensor_parallel_size=args.tp,
        tp_all_reduce=args.tp_all_reduce,
        enforce_eager=args.enforce_eager,
        device=args.device,
        load_format=args.load_format,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
    )
    start_s = time.perf_counter() - t0
    with llm:
        greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        prompts = [[1, 2, 3, 4], [100, 200, 300], [7] * 40, [42]]
        ids = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
        one = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
        llm.generate([[5, 6, 7]], one)  # warm-up
        t = time.perf_counter()
        llm.generate([[8, 9, 10]], one)
        decode_tps = args.tokens / (time.perf_counter() - t)
    print(
        json.dumps(
            {
                "model": args.model,
                "tp": args.tp,
                "enforce_eager": args.enforce_eager,
                "tp_all_reduce": args.tp_all_reduce,
                "start_s": round(start_s, 1),
                "batch1_tokens_per_s": round(decode_tps, 1),
                "greedy_ids": ids,
            }
        )
    )


if __name__ == "__main__":
    main()
