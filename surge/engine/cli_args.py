"""The model-loading, engine and generation-config flags shared by `surge serve` and `surge generate`."""

from __future__ import annotations

import argparse
import json
import re
from decimal import Decimal
from typing import Any

from surge.config import DTYPE_ALIASES, DTYPES, LOAD_FORMATS
from surge.generation_defaults import (
    GENERATION_CONFIG_ALIASES,
    GENERATION_CONFIG_MODES,
    generation_config_mode,
)
from surge.quant.config import KV_CACHE_DTYPE_ALIASES, KV_CACHE_DTYPES, QUANTIZATION_METHODS

_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def token_count(value: str) -> int:
    """An argparse type for token counts, as vLLM's ``--max-model-len`` and
    ``--max-num-batched-tokens`` take them: an integer, or a number with a suffix, decimal in
    lower case (``32k`` = 32,000, ``25.6k`` = 25,600, ``1m``) and binary in upper case (``32K`` =
    32,768, ``1M`` = 1,048,576; whole numbers only).

    Raises:
        argparse.ArgumentTypeError: anything else, with the accepted forms.
    """
    text = value.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgKMG])", text)
    if match is not None and (match[2].islower() or "." not in match[1]):
        return int(Decimal(match[1]) * _SUFFIXES[match[2]])  # exact: 1.001k is 1,001
    raise argparse.ArgumentTypeError(
        f"{value!r} is not a token count: give an integer, or one with vLLM's suffixes "
        "(32k = 32,000, 32K = 32,768; k/m/g decimal, K/M/G binary)"
    )


AUTO_MAX_MODEL_LEN = (
    "vLLM's auto-fit (-1 or auto) is not Surge's: leave --max-model-len out for the model's maximum "
    "(the start-up log warns when the KV cache holds fewer tokens, and longer requests are refused), or give "
    "a number of tokens"
)
"""Why ``--max-model-len -1`` / ``auto`` (and ``LLM(max_model_len=-1)``) is refused."""


def max_model_len_arg(value: str) -> int:
    """The argparse type of ``--max-model-len``: :func:`token_count`, with vLLM's ``-1`` and
    ``auto`` (fit the context to the KV cache) refused by name.

    Raises:
        argparse.ArgumentTypeError: ``-1``, ``auto``, or what :func:`token_count` refuses.
    """
    if value.strip().lower() in ("-1", "auto"):
        raise argparse.ArgumentTypeError(f"{value!r}: {AUTO_MAX_MODEL_LEN}")
    return token_count(value)


def json_object(value: str) -> dict[str, Any]:
    """An argparse type for a JSON object (``--hf-overrides '{"rope_scaling": {...}}'``).

    Raises:
        argparse.ArgumentTypeError: text that is not JSON, or JSON that is not an object.
    """
    try:
        data = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {value!r}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(data).__name__}: {value!r}")
    return data


def add_device_args(p: argparse.ArgumentParser) -> None:
    """Add ``--device`` and ``--dtype``, shared by `surge serve` and `surge generate`."""
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="auto: cuda when a GPU is visible, else cpu (default: %(default)s)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=[*DTYPES, *DTYPE_ALIASES],
        help="model dtype (auto: the config's torch_dtype, except that a float32 one serves in bfloat16 "
        "on a GPU, as in vLLM); half and float are vLLM's names of float16 and float32 (default: %(default)s)",
    )


def add_load_args(p: argparse.ArgumentParser) -> None:
    """Add ``--load-format``, ``--quantization``, ``--kv-cache-dtype`` and ``--hf-overrides`` (choices from
    :data:`surge.config.LOAD_FORMATS`, :data:`surge.quant.config.QUANTIZATION_METHODS` and
    :data:`~surge.quant.config.KV_CACHE_DTYPES`, the values the engine config validates)."""
    p.add_argument(
        "--load-format",
        default="auto",
        choices=list(LOAD_FORMATS),
        help="auto: the folder's *.safetensors, else its PyTorch *.bin weights; safetensors: *.safetensors "
        "only; dummy: random weights of the right shapes (benchmarks)",
    )
    p.add_argument(
        "--quantization",
        "-q",
        default=None,
        choices=list(QUANTIZATION_METHODS),
        help="fp8: quantize a bf16 checkpoint's linear layers to FP8 at load (FP8 checkpoints need no "
        "flag); needs a GPU of compute capability >= 8.9",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=[*KV_CACHE_DTYPES, *KV_CACHE_DTYPE_ALIASES],
        help="KV cache dtype: auto (the model's) or fp8 (e4m3, about twice the tokens; GPU of compute "
        "capability >= 8.9); fp8_e4m3 is the same (vLLM's name)",
    )
    p.add_argument(
        "--hf-overrides",
        type=json_object,
        default=None,
        metavar="JSON",
        help="a JSON object whose keys replace the model config.json's, as in vLLM, e.g. "
        """'{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": """
        """32768}}' for Qwen3's 131,072-token context""",
    )


DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""``--gpu-memory-utilization`` left out (vLLM's default)."""


def gpu_memory_utilization(args: argparse.Namespace) -> float:
    """``--gpu-memory-utilization``, or its default when left out."""
    given = args.gpu_memory_utilization
    return DEFAULT_GPU_MEMORY_UTILIZATION if given is None else given


def unused_on_cpu(args: argparse.Namespace, device: str) -> str | None:
    """The start-up warning for ``--gpu-memory-utilization`` given on CPU (``device`` resolved:
    ``"cpu"``, ``"cuda:0"``, ...), where it sizes nothing, as in vLLM; None where it is used or
    was left out."""
    if args.gpu_memory_utilization is None or not device.startswith("cpu"):
        return None
    return (
        f"--gpu-memory-utilization {args.gpu_memory_utilization} is unused on CPU (as in vLLM): the KV cache "
        "takes --num-kv-blocks N blocks, else up to 256 MiB"
    )


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Add the engine's scheduler and KV cache flags shared by `surge serve` and `surge generate`:
    ``--max-num-seqs``, ``--max-num-batched-tokens``, ``--max-model-len`` (tokens),
    ``--block-size`` (tokens per block), ``--num-kv-blocks``, ``--gpu-memory-utilization`` (a
    fraction), ``--enforce-eager`` (and vLLM's ``-O``, see :func:`enforce_eager`), ``--async-scheduling`` and ``--enable-prefix-caching``, with
    the defaults of :func:`surge.engine.llm_engine.build_engine_config` (which checks the values)."""
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="most sequences in one step (default 256, or --max-num-batched-tokens when that is lower)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=token_count,
        default=8192,
        help="token budget of one step, at least --max-num-seqs; 8k = 8,000, 8K = 8,192 as in vLLM "
        "(default 8192)",
    )
    p.add_argument(
        "--max-model-len",
        type=max_model_len_arg,
        default=None,
        help="longest prompt + output; 32k = 32,000, 32K = 32,768 as in vLLM (default: the model's)",
    )
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block (default 16)")
    p.add_argument(
        "--num-kv-blocks", type=int, default=None, help="KV cache blocks (default: sized from memory)"
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help=f"fraction of GPU memory to use (default {DEFAULT_GPU_MEMORY_UTILIZATION}); on CPU, as in vLLM, it "
        "sizes nothing (the KV cache takes --num-kv-blocks, else up to 256 MiB), and `surge serve` warns that it is unused",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="disable CUDA graphs (decode and piecewise prefill graphs)",
    )
    p.add_argument(
        "-O",
        "--optimization-level",
        type=int,
        choices=range(4),
        default=None,
        metavar="{0,1,2,3}",
        help="vLLM's flag (-O0 to -O3): 0 runs without CUDA graphs, as --enforce-eager (vLLM's -O0: no "
        "compilation, no CUDA graphs); 1 to 3 keep Surge's CUDA graphs, its default (Surge runs no "
        "torch.compile) (default: as vLLM's -O2, graphs on)",
    )
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="schedule step k+1 while the GPU runs step k (default: on with CUDA, off on CPU)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="share the KV blocks of equal prompt prefixes between requests, as vLLM's flag; "
        "--no-enable-prefix-caching turns it off",
    )


def enforce_eager(args: argparse.Namespace) -> bool:
    """Whether CUDA graphs are off: ``--enforce-eager``, or vLLM's ``-O0`` (``--optimization-level
    0``: vLLM 0.26 then compiles nothing and captures no CUDA graphs). ``-O1`` to ``-O3`` ask for
    vLLM's compilation and CUDA graphs; Surge's own CUDA graphs are its default, so they change
    nothing (``--enforce-eager`` still wins, as in vLLM, whose graphs it turns off)."""
    return bool(args.enforce_eager or args.optimization_level == 0)


def _generation_config(value: str) -> str:
    """``--generation-config``'s value checked (:func:`surge.generation_defaults.generation_config_mode`);
    a bad one is argparse's one-line error."""
    try:
        generation_config_mode(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("generation_config: ")) from None
    return value


def add_generation_config_args(p: argparse.ArgumentParser, max_tokens: str) -> None:
    """Add ``--generation-config`` and ``--override-generation-config`` (vLLM's), shared by
    `surge serve` and `surge generate`. A value that is not a JSON object is an argparse error
    (one line); the override's keys and values are checked by
    :func:`surge.generation_defaults.check_override_generation_config` when the engine config is
    built (one line naming ``override_generation_config`` and the key).

    Args:
        p: the sub-command's parser.
        max_tokens: what the override's ``max_new_tokens`` caps, in the help's words (serve:
            every request's ``max_tokens``; generate: ``--max-tokens``).
    """
    p.add_argument(
        "--generation-config",
        default="auto",
        type=_generation_config,
        metavar="{" + ",".join((*GENERATION_CONFIG_MODES, *GENERATION_CONFIG_ALIASES)) + ",FOLDER}",
        help="auto: sampling defaults (and max_new_tokens, the default output length) from the model's "
        "generation_config.json apply to the values left out (default); none (or vllm, vLLM's name): "
        "ignore them; FOLDER (vLLM's third form): read them, and the EOS ids it adds, from that folder's "
        "generation_config.json instead",
    )
    p.add_argument(
        "--override-generation-config",
        type=json_object,
        default=None,
        metavar="JSON",
        help="vLLM's: a JSON object of temperature, top_p, top_k, min_p, repetition_penalty and "
        "max_new_tokens merged over the model's generation_config.json (alone with "
        f"--generation-config none); its max_new_tokens also caps {max_tokens}, e.g. "
        """'{"temperature": 0.5, "max_new_tokens": 1024}'""",
    )
