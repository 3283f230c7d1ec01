"""`surge generate`: one completion from the command line."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_MAX_TOKENS = 64
"""`surge generate`'s output length when neither ``--max-tokens`` nor the model's
``max_new_tokens`` (generation_config.json, ``--override-generation-config``) gives one."""


_DP_HINT = "`surge serve -dp N` for N replicas: surge generate runs one engine, as vLLM's offline LLM"

GENERATE_FLAG_HINTS = {
    "-dp": _DP_HINT,
    "--data-parallel-size": _DP_HINT,
}
"""vLLM's data-parallel flag, which only `surge serve` takes: ``--data-parallel-size 2`` was asked
"did you mean --tensor-parallel-size?", and ``-dp 2`` took 2 for the model folder."""


def add_generate_parser(subparsers: Any) -> None:
    """Register `surge generate` on an argparse sub-parser collection."""
    p = subparsers.add_parser(
        "generate",
        flag_hints=GENERATE_FLAG_HINTS,
        help="generate one completion offline",
        description="Generate a completion for one prompt and print it: greedy unless --temperature or the "
        "model's generation_config.json (Qwen3's: temperature 0.6, top-k 20, top-p 0.95) sets sampling.",
    )
    p.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="Hugging Face model folder, as `surge serve MODEL` takes it (the same as --model)",
    )
    p.add_argument("--model", default=None, help="Hugging Face model folder (default: bundled stories260K)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="tokens to generate (default: the model's max_new_tokens, from its generation_config.json or "
        f"--override-generation-config, as the server's default max_tokens; else {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 = greedy (default: the model's generation_config.json value, else greedy)",
    )
    p.add_argument("--top-p", type=float, default=None, help="default: the model's, else 1")
    p.add_argument("--top-k", type=int, default=None, help="default: the model's, else 0 (off)")
    p.add_argument("--min-p", type=float, default=None, help="default: the model's, else 0 (off)")
    p.add_argument(
        "--repetition-penalty", type=float, default=None, help="default: the model's, else 1 (off)"
    )
    from surge.engine.cli_args import (
        add_device_args,
        add_engine_args,
        add_generation_config_args,
        add_load_args,
    )

    add_generation_config_args(p, "--max-tokens")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="this request's sampling seed (default: unset, which samples from the engine's generator, "
        "seeded 0 as vLLM's LLM(seed=0): runs repeat exactly)",
    )
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS up to --max-tokens")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_engine_args(p)
    add_device_args(p)
    add_load_args(p)
    from surge.parallel.cli_args import add_parallel_args

    add_parallel_args(p, serve=False)
    p.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    """Run `surge generate`; prints the completion text. Returns the exit code.

    The output is ``--max-tokens`` long at most, else the model's ``max_new_tokens`` (its
    generation_config.json's or ``--override-generation-config``'s), else
    :data:`DEFAULT_MAX_TOKENS`; the override's ``max_new_tokens`` also caps ``--max-tokens``, as
    it caps every request's ``max_tokens`` on `surge serve`.

    Raises:
        CliError: a bad model folder (checked before torch is imported), two different models
            (MODEL and --model) or ``--max-tokens`` below 1.
        ValueError: a bad engine setting or ``--override-generation-config`` key or value (one
            line naming it, from the engine config's checks, as on `surge serve`).
    """
    from surge.cli import CliError, check_model_dir

    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise CliError(f"two models given: {args.model_tag!r} and --model {args.model!r}")
        args.model = args.model_tag
    if args.max_tokens is not None and args.max_tokens < 1:  # as the server answers max_tokens 0
        raise CliError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    check_model_dir(args.model, args.load_format, flag="MODEL" if args.model_tag is not None else "--model")
    from surge.engine.cli_args import enforce_eager, gpu_memory_utilization
    from surge.engine.llm import LLM
    from surge.generation_defaults import override_max_tokens
    from surge.sampling_params import SamplingParams

    llm = LLM(
        args.model,
        dtype=args.dtype,
        device=args.device,
        load_format=args.load_format,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        gpu_memory_utilization=gpu_memory_utilization(args),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        enforce_eager=enforce_eager(args),
        async_scheduling=args.async_scheduling,
        tensor_parallel_size=args.tensor_parallel_size,
        tp_all_reduce=args.tp_all_reduce,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        generation_config=args.generation_config,
        hf_overrides=args.hf_overrides,
        override_generation_config=args.override_generation_config,
    )
    max_tokens = args.max_tokens
    if max_tokens is None:
        max_tokens = int(llm.sampling_defaults.get("max_tokens", DEFAULT_MAX_TOKENS))
    cap = override_max_tokens(args.override_generation_config)  # checked already by LLM()
    if cap is not None:
        max_tokens = min(max_tokens, cap)
    temperature = args.temperature
    if temperature is None and "temperature" not in llm.sampling_defaults:
        temperature = 0.0  # this command is greedy unless the model or the flag says otherwise
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    with llm:
        if args.chat:
            out = llm.chat([{"role": "user", "content": args.prompt}], params)[0]
        else:
            out = llm.generate(args.prompt, params)[0]
    print(out.outputs[0].text)
    return 0
