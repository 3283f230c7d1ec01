"""``surge bench serve | matrix | compare | roofline``: argument parsing and the four entry points.

Heavy modules (aiohttp, matplotlib, transformers) are imported inside the handlers so that
``surge --help`` stays fast. Each handler returns the exit code: 0 on success, 1 when a request or a
point failed; a bad flag raises ``ValueError`` with one readable line (``surge.cli`` prints it, exit 2).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import shlex
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from surge.quant.config import KV_CACHE_DTYPE_ALIASES, KV_CACHE_DTYPES

DEFAULT_BASE_URL = "http://127.0.0.1:8000"

SHUFFLED_DATASETS = ("sharegpt", "custom", "hf", "spec_bench", "prefix_repetition")
"""The datasets whose prompts vLLM 0.26 shuffles unless ``--disable-shuffle``."""

FEWER_OK_DATASETS = ("sharegpt", "custom", "hf", "spec_bench")
"""The datasets whose files may hold fewer usable prompts than ``--num-prompts``: vLLM 0.26 then
sends some twice, or with ``--no-oversample`` those it has."""

SAMPLING_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--top-p", float, "0.9"),
    ("--top-k", int, "20"),
    ("--min-p", float, "0.05"),
    ("--frequency-penalty", float, "0.5"),
    ("--presence-penalty", float, "0.5"),
    ("--repetition-penalty", float, "1.1"),
)
"""vLLM 0.26's ``bench serve`` sampling flags besides ``--temperature``: (flag, value type, an
example); each given one is sent as the request field of its name (``--top-k`` -> ``top_k``)."""


def _add_hardware_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("roofline")
    g.add_argument(
        "--gpu", default=None, help="known GPU name for default ceilings (h200, h100-sxm, a100-80gb, ...)"
    )
    g.add_argument(
        "--hbm-bandwidth", type=float, default=None, help="HBM read bandwidth in bytes/s (e.g. 4.24e12)"
    )
    g.add_argument("--peak-flops", type=float, default=None, help="dense bf16 peak in FLOP/s (e.g. 7.9e14)")
    g.add_argument(
        "--peak-flops-fp8",
        type=float,
        default=None,
        help="dense FP8 peak in FLOP/s for FP8 weights' prefill GEMMs (e.g. 1.435e15; default: --gpu's, "
        "else --peak-flops)",
    )
    g.add_argument(
        "--model-config",
        default=None,
        help="model folder or config.json for the roofline (default: a known local model folder)",
    )
    g.add_argument(
        "--roofline-tp",
        type=int,
        default=1,
        help="the server's tensor-parallel size: the ceiling is per GPU with link traffic (default 1)",
    )
    g.add_argument(
        "--roofline-dtype",
        default=None,
        help="the server's weight dtype for the roofline, e.g. fp8 for --quantization fp8 (default: the "
        "config's; fp8 when its quantization_config is FP8)",
    )
    g.add_argument(
        "--roofline-kv-cache-dtype",
        default=None,
        choices=[*KV_CACHE_DTYPES, *KV_CACHE_DTYPE_ALIASES],
        help="the server's KV cache dtype for the roofline: auto (the model's) or fp8 (fp8_e4m3, vLLM's name, "
        "is the same) (default auto)",
    )


class _SpelledAs(argparse.Action):
    """Stores the value and, in ``<dest>_flag``, the option string the user gave (vLLM's spelling
    or Surge's), for an error that names the flag as typed."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_flag", option_string or self.option_strings[0])


def _add_client_flags(p: argparse.ArgumentParser, matrix: bool = False) -> None:
    p.add_argument("--base-url", default=None, help=f"server URL (default {DEFAULT_BASE_URL})")
    p.add_argument(
        "--host", default=None, help="vLLM's spelling: the server is http://HOST:PORT (default 127.0.0.1)"
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="vLLM's spelling: the server is http://HOST:PORT (default 8000)",
    )
    p.add_argument(
        "--endpoint",
        default=None,
        help="API route of the requests, joined to the server's URL: one ending with /chat/completions gets "
        "chat requests, any other ending with /completions completions requests, with any prefix (a proxy's, "
        "e.g. /proxy/v1/completions, or none, /completions) (default /v1/chat/completions, or --backend's; "
        "vLLM's bench serve defaults to /v1/completions)",
    )
    p.add_argument(
        "--backend",
        default=None,
        help="vLLM's request format: openai or vllm (completions requests; default --endpoint "
        "/v1/completions, as vLLM) or openai-chat (chat requests; default --endpoint "
        "/v1/chat/completions), recorded as the result's backend; vLLM's other backends (audio, "
        "embeddings, pooling, rerank) are refused (default: --endpoint's, openai-chat or openai)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="model name sent in requests, or with --served-model-name the model id recorded (default: first of "
        "/v1/models)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="with --model M: the model name sent in requests, M being the result's model_id and tokenizer_id "
        "(its tokenizer's vocabulary when M is a local folder), as vLLM's option (default: --model)",
    )
    p.add_argument(
        "--tokenizer", default=None, help="local tokenizer folder (default: the server's /tokenize)"
    )
    p.add_argument(
        "--tokenizer-mode",
        default="auto",
        help="vLLM's option: auto or hf, the tokenizer Surge counts with (transformers' AutoTokenizer, the fast "
        "one when the folder has it); vLLM's slow, mistral and other modes are refused. Not recorded in the "
        "result, as vLLM",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY if set, as vLLM's bench; else none)",
    )
    p.add_argument(
        "--header",
        nargs="*",
        default=None,
        metavar="KEY=VALUE",
        help="HTTP headers sent with every call to the server, e.g. --header x-tenant=a x-team=b; one "
        "replaces the Content-Type or the --api-key's Authorization header, the X-Request-Id of "
        "--request-id-prefix replaces one of that name (vLLM's option; Surge also sends them to /tokenize and "
        "/reset_prefix_cache) (default: none)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="do not check an https server's TLS certificate (a self-signed one), as vLLM's option (default off)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and arrival times (default 0)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="temperature sent with every request (default: none sent, the server's default, as vLLM)",
    )
    g = p.add_argument_group("sampling parameters (vLLM's; sent with every request, none by default)")
    for flag, kind, example in SAMPLING_FLAGS:
        g.add_argument(
            flag,
            type=kind,
            default=None,
            help=f"the request field {flag[2:].replace('-', '_')}, e.g. {example}; --extra-body's own "
            "field of that name wins, as vLLM (default: none sent, the server's default)",
        )
    g.add_argument(
        "--logprobs",
        type=int,
        default=None,
        metavar="N",
        help="--endpoint /v1/completions: the request field logprobs (the top N logprobs of each token), "
        "as vLLM's completions client sends it; refused on the chat endpoint, where vLLM's chat client "
        """drops it (there use --extra-body '{"logprobs": true, "top_logprobs": N}') (default: none sent)""",
    )
    p.add_argument(
        "--extra-body",
        default=None,
        metavar="JSON",
        help="JSON object merged into every request body, e.g. '{\"top_k\": 1}'; its fields that change "
        "the prompt's tokens (chat_template_kwargs, add_special_tokens, ...) count in --input-len; "
        "the fields the benchmark sends itself (model, messages/prompt, max_tokens, "
        "max_completion_tokens, stream, stream_options) are refused (default: none)",
    )
    p.add_argument(
        "--label",
        default=None,
        help="label stored in the result (default: none, null in the JSON, as vLLM's) and, in bench serve, "
        "the start of --save-result's file name (default there: the backend, openai-chat or openai)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed warm-up requests with other prompts, one after another, before each run of a point (default 1)"
        if matrix
        else "untimed warm-up requests with other prompts, one after another (default 1; 0 with --num-warmups)",
    )
    p.add_argument(
        "--percentiles",
        "--metric-percentiles",
        action=_SpelledAs,
        default="99",
        help="comma-separated percentiles to report, each from 0 (the least) to 100 (the largest) (default 99); "
        "--metric-percentiles is vLLM's spelling",
    )
    p.set_defaults(percentiles_flag="--percentiles")
    p.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="NAME:MS",
        help="SLOs in ms, NAME ttft, tpot or e2el, e.g. ttft:500 tpot:50 e2el:10000: request_goodput is the "
        "successful requests meeting every one of them (value <= SLO; an SLO may be 0, as vLLM's, not "
        "negative; each NAME once; a request of one token has TPOT 0 here) per second of the run (vLLM's option) (default: none)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=6 * 3600.0,
        help="seconds a request may take in all before it fails with 'the request timed out' (default "
        "21600, the fixed timeout of vLLM's client)",
    )
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    _add_hardware_flags(p)


def _add_grid_flags(p: argparse.ArgumentParser, preset_default: str = "none") -> None:
    p.add_argument(
        "--preset",
        choices=["official-8b"],
        default=None,
        help=f"official-8b: the 30-point reference matrix (default: {preset_default})",
    )
    p.add_argument("--concurrency", default=None, help="comma-separated, e.g. 1,4 (default: none)")
    p.add_argument(
        "--input-len",
        default=None,
        help="comma-separated prompt lengths in tokens as the server counts them (on the chat endpoint "
        "the templated prompt), e.g. 32,256 (default: none)",
    )
    p.add_argument(
        "--output-len", default=None, help="comma-separated output lengths, e.g. 256,1024 (default: none)"
    )


_BURST = "nothing: a matrix point is a burst, its C requests sent at once (bench serve takes it)"
_FRESH = "nothing: a matrix point's prompts are fresh random ones of exactly --input-len tokens (bench serve takes it)"

MATRIX_FLAG_HINTS = {
    "--num-prompts": "--concurrency C,...: a point sends C requests, all at once (bench serve takes it)",
    "--max-concurrency": "--concurrency C,...: a point sends C requests, all at once (bench serve takes it)",
    "--request-rate": _BURST,
    "--burstiness": _BURST,
    "--ramp-up-strategy": _BURST,
    "--ramp-up-start-rps": _BURST,
    "--ramp-up-end-rps": _BURST,
    "--dataset-name": "nothing: every matrix point is a random one (bench serve takes the other datasets)",
    "--dataset-path": "nothing: every matrix point is a random one (bench serve takes the other datasets)",
    "--random-input-len": "--input-len I,...: the prompt lengths of the grid",
    "--random-output-len": "--output-len O,...: the output lengths of the grid",
    "--random-range-ratio": _FRESH,
    "--random-prefix-len": _FRESH,
    "--ignore-eos": "nothing: every matrix point asks the server to ignore EOS and checks each request's "
    "exact length",
    "--metadata": "--label L, which the matrix's files record (bench serve takes it)",
    "--save-detailed": "nothing: each point's *.requests.json.gz holds its per-request timings (bench serve "
    "takes it, with the generated texts)",
    "--plot-timeline": "nothing: the matrix draws throughput.png and latency.png (bench serve takes it)",
    "--plot-dataset-stats": "nothing: a matrix point's lengths are exact (bench serve takes it)",
}
"""``vllm bench serve`` flags that a ``bench matrix`` point sets itself or does without (added to
:data:`surge.cli.VLLM_FLAG_HINTS` for ``bench matrix`` only): an unrecognized one says what the
matrix does instead, in its one error line."""


def add_bench_parser(subparsers: Any) -> None:
    """Register ``surge bench`` and its sub-commands on the top-level ``subparsers``."""
    bench = subparsers.add_parser("bench", help="serving benchmark: serve, matrix, compare, roofline")
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="{serve,matrix,compare,roofline}")

    p = sub.add_parser("serve", help="benchmark one workload against an OpenAI-compatible server")
    _add_client_flags(p)
    p.add_argument(
        "--dataset",
        "--dataset-name",
        choices=[
            "random",
            "sharegpt",
            "custom",
            "prefix_repetition",
            "sonnet",
            "burstgpt",
            "spec_bench",
            "hf",
            "timed_trace",
        ],
        default="random",
        help="prompts (default random): random tokens, ShareGPT first turns, custom (a JSONL file of "
        "prompts), prefix_repetition (random prompts over a few shared prefixes), sonnet (lines of a text "
        "file), burstgpt (the lengths of a BurstGPT trace's rows), spec_bench (the first turns of an "
        "MT-Bench-style question file), hf (a local copy of MT-Bench or of ShareGPT-format conversations) or "
        "timed_trace (the replay of a timed request trace: each row's lengths, shared prefix blocks and send "
        "time), as vLLM's datasets of those names; --dataset-name is vLLM's spelling",
    )
    p.add_argument(
        "--dataset-path",
        default=None,
        help='ShareGPT JSON file (--dataset sharegpt), JSONL file, one {"prompt": ...} object a line '
        "(--dataset custom), text file (--dataset sonnet, e.g. vLLM's benchmarks/sonnet.txt), BurstGPT "
        "CSV file (--dataset burstgpt, e.g. BurstGPT_without_fails_2.csv) or question JSONL file, one "
        '{"turns": [...], "category": ...} object a line (--dataset spec_bench, e.g. Spec-Bench\'s or '
        "MT-Bench's question.jsonl), or with --dataset hf a local copy of the dataset --hf-name names (a JSON or "
        "JSONL file, or a folder of them such as a hub snapshot; vLLM's hub id here means --hf-name), or JSONL "
        'trace, one {"timestamp", "input_length", "output_length", "hash_ids"} row a line (--dataset '
        "timed_trace, e.g. a Mooncake trace) (default: none)",
    )
    p.add_argument(
        "--input-len",
        type=int,
        default=None,
        help="prompt tokens of the random dataset, as the server counts them: on the chat endpoint the "
        "templated prompt (role headers included) has exactly this many tokens (default 256; vLLM's 1024); "
        "sets --random-input-len, and --sonnet-input-len with --dataset sonnet, as vLLM",
    )
    p.add_argument(
        "--output-len",
        type=int,
        default=None,
        help="max_tokens of every request (default 256, vLLM's random 128; with --dataset sharegpt, default: each "
        "conversation's reply length, as vLLM; with prefix_repetition 128, vLLM's); sets the dataset's own "
        "output length (--random-output-len, --sharegpt-output-len, --custom-output-len, "
        "--prefix-repetition-output-len, --sonnet-output-len, --spec-bench-output-len, --hf-output-len) as in vLLM; "
        "refused with --dataset timed_trace and burstgpt, whose rows give each request's output length",
    )
    p.add_argument(
        "--random-input-len",
        type=int,
        default=None,
        help="--dataset random: --input-len (vLLM's option of that dataset only; the two must agree when "
        "both are given) (default 256)",
    )
    p.add_argument(
        "--random-output-len",
        type=int,
        default=None,
        help="--dataset random: --output-len (vLLM's option of that dataset only; the two must agree when "
        "both are given) (default 256)",
    )
    p.add_argument(
        "--random-range-ratio",
        default=None,
        help="--dataset random: draw each request's input and output lengths uniformly from "
        '[L * (1 - r), L * (1 + r)] (vLLM\'s option; 0 <= r < 1, or as vLLM \'{"input": r, "output": r2}\'; '
        "default 0: every request exactly --input-len / --output-len); each prompt has exactly its drawn "
        "length, the roofline column uses the nominal lengths",
    )
    p.add_argument(
        "--random-prefix-len",
        type=int,
        default=None,
        help="--dataset random: every prompt begins with the same random prefix of this many tokens and has "
        "exactly this + --input-len tokens as the server counts them (vLLM's option; default 0); no roofline "
        "column, since the server may reuse the cached prefix",
    )
    p.add_argument(
        "--custom-output-len",
        type=int,
        default=None,
        help='--dataset custom: max_tokens of every request, or -1 for each line\'s "output_tokens" '
        "(vLLM's option; default 256, or --output-len)",
    )
    p.add_argument(
        "--skip-chat-template",
        action="store_true",
        help="--dataset custom or hf (MT-Bench) on /v1/completions: send each prompt as it is instead of "
        "rendered with the model's chat template (vLLM's option; on the chat endpoint the server applies the template, "
        "so the prompt is always sent as it is) (default off)",
    )
    p.add_argument(
        "--chat-template-kwargs",
        default=None,
        metavar="JSON",
        help="""--dataset custom on /v1/completions: a JSON object of template variables the prompts are rendered """
        """with, e.g. '{"enable_thinking": false}' (vLLM's option; on the chat endpoint the server renders: use """
        """--extra-body '{"chat_template_kwargs": ...}')""",
    )
    g = p.add_argument_group("prefix_repetition dataset (vLLM's options)")
    g.add_argument(
        "--prefix-repetition-prefix-len",
        type=int,
        default=None,
        help="tokens of each shared prefix (default 256)",
    )
    g.add_argument(
        "--prefix-repetition-suffix-len",
        type=int,
        default=None,
        help="tokens after the prefix, BOS or chat template included: each prompt has exactly prefix + suffix "
        "tokens as the server counts them (default 256)",
    )
    g.add_argument(
        "--prefix-repetition-num-prefixes",
        type=int,
        default=None,
        help="distinct prefixes; --num-prompts are spread over them as evenly as possible (default 10)",
    )
    g.add_argument(
        "--prefix-repetition-output-len",
        type=int,
        default=None,
        help="max_tokens of every request (default 128, or --output-len)",
    )
    g = p.add_argument_group("sonnet dataset (vLLM's options)")
    g.add_argument(
        "--sonnet-input-len",
        type=int,
        default=None,
        help="the most tokens of a prompt as the server counts it (chat template included); the number of "
        "lines is this over the lines' mean length, as vLLM (default 550, or --input-len)",
    )
    g.add_argument(
        "--sonnet-prefix-len",
        type=int,
        default=None,
        help="about this many tokens of every prompt, with the instruction, are the file's first lines "
        "(default 200)",
    )
    g.add_argument(
        "--sonnet-output-len",
        type=int,
        default=None,
        help="max_tokens of every request (default 150, or --output-len)",
    )
    g = p.add_argument_group("timed_trace dataset (vLLM's options)")
    g.add_argument(
        "--timed-trace-chunk-hash-size",
        type=int,
        default=None,
        help="tokens per hash id of a row's hash_ids: rows sharing leading hash ids share that prefix "
        "(default 16, the Qwen/Alibaba traces'; Moonshot's Mooncake traces use 512)",
    )
    g.add_argument(
        "--timed-trace-sec-multiplier",
        type=float,
        default=None,
        help="seconds per unit of the trace's timestamps: 0.001 for milliseconds (default 1)",
    )
    for name, field in (
        ("timestamp", "timestamp"),
        ("input-length", "input_length"),
        ("output-length", "output_length"),
        ("hash-ids", "hash_ids"),
    ):
        g.add_argument(
            f"--timed-trace-label-{name}",
            default=None,
            help=f"the JSON field of a row's {field.replace('_', ' ')} (default {field})",
        )
    g.add_argument(
        "--self-timed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send each request at its row's timestamp (times --timed-trace-sec-multiplier) after the start, "
        "waiting on --max-concurrency if given; --no-self-timed sends the trace's requests on the "
        "--request-rate schedule instead (vLLM's option; default on with --dataset timed_trace, which "
        "alone takes it)",
    )
    g = p.add_argument_group("spec_bench dataset (vLLM's options)")
    g.add_argument(
        "--spec-bench-output-len",
        type=int,
        default=None,
        help="max_tokens of every request (default 256, or --output-len)",
    )
    g.add_argument(
        "--spec-bench-category",
        default=None,
        help="only the questions of this category, e.g. writing or math_reasoning (default: all)",
    )
    g = p.add_argument_group("hf dataset (vLLM's options; local copies only)")
    g.add_argument(
        "--hf-name",
        default=None,
        help="the hub id of the dataset at --dataset-path: philschmid/mt-bench (MT-Bench) or "
        "Aeala/ShareGPT_Vicuna_unfiltered (ShareGPT-format conversations) (default: --dataset-path)",
    )
    g.add_argument(
        "--hf-split",
        default=None,
        help="the split read: a folder's files whose names carry it, as datasets infers splits; a single file "
        "is train (default train; vLLM's conversations need it given)",
    )
    g.add_argument(
        "--hf-subset",
        default=None,
        help="only default: Surge reads no dataset card's subsets (give the subset's own folder) (default: none)",
    )
    g.add_argument(
        "--hf-output-len",
        type=int,
        default=None,
        help="max_tokens of every request (default: MT-Bench 256, conversations each reply's length; or "
        "--output-len)",
    )
    p.add_argument(
        "--sharegpt-output-len",
        type=int,
        default=None,
        help="vLLM's name for a fixed --output-len with --dataset sharegpt (default: reply lengths)",
    )
    p.add_argument(
        "--num-warmups",
        type=int,
        default=None,
        metavar="N",
        help="vLLM's warm-up instead of --warmup's: the first timed request sent N times at once (at most "
        "--max-concurrency in flight), untimed, before the run; a failed one fails the run, as a --warmup "
        "request's (vLLM ignores it) (vLLM's option; default: none, --warmup's one request)",
    )
    p.add_argument(
        "--no-oversample",
        action="store_true",
        help="--dataset sharegpt, custom, hf or spec_bench: a file with fewer usable prompts than --num-prompts "
        "sends those, with a note (vLLM's option; without it Surge refuses the run, where vLLM sends some "
        "prompts twice; refused with the other datasets, which it does not change) (default off)",
    )
    p.add_argument(
        "--disable-shuffle",
        action="store_true",
        help="--dataset sharegpt, custom, hf, spec_bench or prefix_repetition: the prompts in their file's "
        "order (prefix_repetition: prefix by prefix) instead of shuffled (vLLM's option; refused with the "
        "other datasets, whose order it does not change) (default off)",
    )
    p.add_argument(
        "--num-prompts",
        type=int,
        default=16,
        help="requests to send (default 16; vLLM's 1000); 0 or less with --dataset custom or spec_bench: every "
        "prompt of the file (of --spec-bench-category), as vLLM",
    )
    p.add_argument(
        "--max-concurrency", type=int, default=None, help="requests in flight at most (default: all)"
    )
    p.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="requests/s; inf (default) = burst (a finite rate gets no roofline column: the ceiling is a burst's)",
    )
    p.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of arrival gaps (1 = Poisson; inf, as vLLM: evenly spaced, every gap 1/rate)",
    )
    p.add_argument(
        "--ramp-up-strategy",
        choices=["linear", "exponential"],
        default=None,
        help="raise the request rate from --ramp-up-start-rps (first request) to --ramp-up-end-rps (last), "
        "linearly or geometrically in the request's index, instead of --request-rate (vLLM's option; "
        "no roofline column: the ceiling is a burst's) (default: none)",
    )
    p.add_argument(
        "--ramp-up-start-rps", type=int, default=None, help="--ramp-up-strategy's first rate, requests/s"
    )
    p.add_argument(
        "--ramp-up-end-rps", type=int, default=None, help="--ramp-up-strategy's last rate, requests/s"
    )
    p.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ask the server to ignore EOS, so that every request runs to its length (default: on with "
        "--dataset random and timed_trace, as vLLM's bench serve, off with the others, burstgpt's and "
        "sonnet's included)",
    )
    p.add_argument(
        "--exact-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fail requests whose completion_tokens != the length they asked (default: on with --ignore-eos)",
    )
    p.add_argument(
        "--result-file",
        default=None,
        help="write the result JSON here (gzipped if it ends in .gz; default: none)",
    )
    p.add_argument(
        "--save-result",
        action="store_true",
        help="write the result JSON to a file named as vLLM names it, "
        "LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json, in --result-dir (vLLM's option; --result-file names "
        "the file instead) (default off)",
    )
    p.add_argument(
        "--append-result",
        action="store_true",
        help="add the result JSON as one line to that file (vLLM's option) (default off)",
    )
    p.add_argument(
        "--result-dir",
        default=None,
        help="--save-result's and --append-result's folder, made when missing; needs one of them (vLLM's option) "
        "(default: the current folder)",
    )
    p.add_argument(
        "--result-filename",
        default=None,
        help="--save-result's and --append-result's file name instead of vLLM's; needs one of them (vLLM's "
        "option) (default: none)",
    )
    p.add_argument(
        "--save-detailed",
        action="store_true",
        help="also save the generated texts in the result file (needs --result-file, --save-result or "
        "--append-result) (default off)",
    )
    p.add_argument(
        "--plot-timeline",
        action="store_true",
        help="draw each request's TTFT and inter-token gaps on a time line into R.timeline.png next to "
        "--result-file R.json (vLLM's option; vLLM writes HTML with plotly, Surge a PNG with matplotlib) "
        "(default off)",
    )
    p.add_argument(
        "--timeline-itl-thresholds",
        default=None,
        metavar="LOW,HIGH",
        help="--plot-timeline's colours: ITL gaps below LOW ms green, below HIGH ms orange, else red "
        "(vLLM's option; default 25,50)",
    )
    p.add_argument(
        "--plot-dataset-stats",
        action="store_true",
        help="histograms of the prompt, output and total tokens per request into R.dataset_stats.png next "
        "to --result-file R.json (vLLM's option) (default off)",
    )
    p.add_argument(
        "--metadata",
        nargs="*",
        default=None,
        metavar="KEY=VALUE",
        help="strings recorded in --result-file, e.g. --metadata version=0.3.3 tp=1: each as a top-level "
        "field, as vLLM (a key the result has keeps the result's value), and all under 'metadata' "
        "(default: none)",
    )
    p.add_argument(
        "--percentile-metrics",
        default=None,
        help="comma-separated latencies whose mean, median, std and --percentiles are reported, from "
        "ttft,tpot,itl,e2el (vLLM's option; default: all four, where vLLM's is ttft,tpot,itl)",
    )
    p.add_argument(
        "--ready-check-timeout-sec",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to this long for a server that is not up yet (nothing listening, or a 502/503/504 "
        "from /v1/models), asking every 5 s, before the run; then the warm-up request checks the endpoint "
        "(vLLM's option; 0: ask once) (default 0)",
    )
    p.add_argument(
        "--request-id-prefix",
        default=None,
        help="timed request i sends the header X-Request-Id: PREFIX{i}, which the server names it after "
        "(vLLM's option; default: bench-, 8 random hex digits, -)",
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "matrix",
        help="run a grid of burst points and write summary, tables and plots",
        flag_hints=MATRIX_FLAG_HINTS,
    )
    _add_client_flags(p, matrix=True)
    _add_grid_flags(p)
    p.add_argument(
        "--output-dir", default="bench-matrix", help="where to write the artifacts (default bench-matrix)"
    )
    p.add_argument(
        "--launch",
        default=None,
        help='start the server with this command, e.g. "surge serve --port 8000" (default: use a running one)',
    )
    p.add_argument(
        "--server-timeout", type=float, default=600.0, help="seconds to wait for /health (default 600)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per point, each with fresh prompts; the summary gives the mean and the spread (default 1)",
    )
    p.add_argument(
        "--keep-prefix-cache",
        action="store_true",
        help="do not call the server's POST /reset_prefix_cache before each run (default: reset)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the successful points already in --output-dir and run only the others; a folder "
        "measured with other settings (server, model, seed, --repeats, --warmup...) is refused (default off)",
    )
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no new point after this many seconds (the first always runs); finish later with "
        "--resume (default: no limit)",
    )
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser(
        "compare",
        help="compare two matrix runs (summary.json or its folder) or two bench serve result files "
        "(.json or .json.gz)",
    )
    p.add_argument("base", help="the reference run")
    p.add_argument("new", help="the run compared with it")
    p.add_argument(
        "--metric", default="output_throughput", help="summary field to compare (default output_throughput)"
    )
    p.add_argument(
        "--tie-pct",
        type=float,
        default=None,
        help="a change smaller than this %% is a tie when a point has no repeats to measure its noise "
        "(default 2)",
    )
    p.add_argument(
        "--plot",
        default=None,
        help="write a plot of the per-point change (PNG, or the format its extension names; "
        "no extension: FILE.png) (default: none)",
    )
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "roofline",
        help="print the per-point throughput ceilings of a model on a GPU",
        description="Print the per-point throughput ceilings of a model on a GPU. Needs the hardware: "
        "--gpu NAME, or both --hbm-bandwidth and --peak-flops.",
    )
    p.add_argument("--model", required=True, help="model folder or config.json")
    p.add_argument(
        "--dtype",
        default=None,
        help="weight dtype, e.g. bfloat16 or fp8; auto: the config's (default: the config's)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default=None,
        choices=[*KV_CACHE_DTYPES, *KV_CACHE_DTYPE_ALIASES],
        help="KV cache dtype: auto (the model's) or fp8 (fp8_e4m3, vLLM's name, is the same) (default auto)",
    )
    _add_grid_flags(p, preset_default="official-8b when no --concurrency/--input-len/--output-len is given")
    g = p.add_argument_group("hardware (required: --gpu, or both --hbm-bandwidth and --peak-flops)")
    g.add_argument(
        "--gpu", default=None, help="known GPU name: h200, h100-sxm, a100-80gb, ... (default: none)"
    )
    g.add_argument(
        "--hbm-bandwidth",
        type=float,
        default=None,
        help="HBM read bandwidth in bytes/s, e.g. 4.24e12 (default: none)",
    )
    g.add_argument(
        "--peak-flops",
        type=float,
        default=None,
        help="dense bf16 peak in FLOP/s, e.g. 7.9e14 (default: none)",
    )
    g.add_argument(
        "--peak-flops-fp8",
        type=float,
        default=None,
        help="dense FP8 peak in FLOP/s for FP8 weights' prefill GEMMs, e.g. 1.435e15 (default: --gpu's, "
        "else --peak-flops)",
    )
    g.add_argument(
        "-tp", "--tensor-parallel-size", type=int, default=1, help="GPUs sharing the model (default 1)"
    )
    g.add_argument(
        "--link-bandwidth",
        type=float,
        default=None,
        help="GPU link bytes/s per direction for -tp > 1 (default: the --gpu's NVLink figure)",
    )
    p.set_defaults(func=cmd_roofline)


def parse_extra_body(text: str | None, flag: str = "--extra-body") -> dict[str, Any] | None:
    """``--extra-body`` (or another JSON-object ``flag``): a JSON object, or None. Raises
    ValueError naming the flag otherwise."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} must be a JSON object: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{flag} must be a JSON object, got {type(data).__name__}")
    return data


def parse_headers(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """vLLM's ``--header KEY=VALUE ...``: (name, value) pairs, split at the first ``=`` and both
    stripped, as vLLM does; a name given twice keeps its last value, as vLLM's dict.

    Raises:
        ValueError: an item without ``=`` or with an empty name (the message names the flag and
            the item).
    """
    pairs: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--header {item!r}: give KEY=VALUE, e.g. --header x-tenant=a")
        pairs[name] = value.strip()
    return tuple(pairs.items())


def parse_metadata(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """vLLM's ``--metadata KEY=VALUE ...``: (key, value) pairs, both stripped as vLLM does.

    Raises:
        ValueError: an item without ``=``, an empty key, or a key given twice (the message names
            the flag and the item).
    """
    pairs: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--metadata {item!r}: give KEY=VALUE, e.g. --metadata version=0.3.3 tp=1")
        if key in pairs:
            raise ValueError(f"--metadata {key}: given twice")
        pairs[key] = value.strip()
    return tuple(pairs.items())


def parse_range_ratio(text: str | None) -> tuple[float, float | None]:
    """``--random-range-ratio``: a number r, or vLLM's JSON object ``{"input": r, "output": r2}``.

    Returns:
        (input ratio, output ratio or None for the same); (0.0, None) when not given.
    Raises:
        ValueError: neither form, or an object without both numbers (the message names the flag).
    """
    if text is None:
        return 0.0, None
    try:
        return float(text), None
    except ValueError:
        pass
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if (
        not isinstance(data, dict)
        or set(data) != {"input", "output"}
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in data.values())
    ):
        raise ValueError(
            f"""--random-range-ratio takes a number or '{{"input": R, "output": R}}', got {text!r}"""
        )
    return float(data["input"]), float(data["output"])


TOKENIZER_MODES = ("auto", "hf")
"""vLLM's ``--tokenizer-mode`` values Surge's bench takes: both load the tokenizer folder with
transformers' ``AutoTokenizer`` (fast when available), as vLLM 0.26 does for them outside Mistral
models."""


def check_tokenizer_mode(mode: str) -> None:
    """Refuse a vLLM ``--tokenizer-mode`` other than :data:`TOKENIZER_MODES`.

    Raises:
        ValueError: vLLM's ``slow``, ``mistral``, ``deepseek_v32`` or a plugin's mode (one line
            that names the value).
    """
    if mode not in TOKENIZER_MODES:
        raise ValueError(
            f"--tokenizer-mode {mode!r}: Surge's bench takes auto or hf (transformers' AutoTokenizer, as "
            "vLLM's auto and hf); vLLM's slow, mistral, deepseek_v32 and plugin modes are not supported"
        )


def endpoint_and_backend(endpoint: str | None, backend: str | None) -> tuple[str, str | None]:
    """``--endpoint`` and vLLM's ``--backend``: (the route, the backend to record or None for the
    route's). vLLM's ``openai`` and ``vllm`` send completions requests, ``openai-chat`` chat
    requests; a backend alone picks its route (vLLM's default route is ``/v1/completions``).

    Raises:
        ValueError: an ``--endpoint`` that is no chat or completions route
            (:func:`surge.bench.client.check_route`), a backend Surge's client does not speak
            (vLLM's audio, embeddings, pooling and rerank ones), or one whose requests do not fit
            ``--endpoint`` (vLLM would send them and get a 400 or refuse the URL).
    """
    from surge.bench.client import check_route, is_chat_route

    if endpoint is not None:
        check_route(endpoint)
    if backend is None:
        return endpoint or "/v1/chat/completions", None
    routes = {"openai": "/v1/completions", "vllm": "/v1/completions", "openai-chat": "/v1/chat/completions"}
    if backend not in routes:
        raise ValueError(
            f"--backend {backend}: Surge's bench sends text generation requests only: openai or vllm "
            "(completions) or openai-chat (chat); vLLM's audio, embeddings, pooling and rerank backends "
            "are not supported"
        )
    if endpoint is not None and is_chat_route(endpoint) != (backend == "openai-chat"):
        raise ValueError(
            f"--backend {backend} sends {'chat' if backend == 'openai-chat' else 'completions'} requests: "
            f"give --endpoint {routes[backend]} (or leave it out), not {endpoint}"
        )
    return endpoint or routes[backend], backend


def request_body_extras(args: argparse.Namespace, endpoint: str) -> dict[str, Any] | None:
    """The fields merged into every request body: ``--logprobs`` (completions only), the sampling
    flags given (:data:`SAMPLING_FLAGS`, ``--top-k`` as ``top_k``), then ``--extra-body``'s fields,
    which win over them, as vLLM 0.26 merges them; None when there are none.

    Raises:
        ValueError: a sampling value that is not finite (NaN or inf; the message names the flag),
            ``--logprobs`` on the chat endpoint (vLLM's chat client drops it; its logprobs there is
            a boolean), or a bad ``--extra-body``.
    """
    from surge.bench.client import is_chat_route

    body: dict[str, Any] = {}
    if args.logprobs is not None:
        if is_chat_route(endpoint):
            raise ValueError(
                "--logprobs applies to --endpoint /v1/completions (vLLM's chat client drops it; on the chat "
                """endpoint use --extra-body '{"logprobs": true, "top_logprobs": N}')"""
            )
        body["logprobs"] = args.logprobs
    for flag, _, _ in SAMPLING_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is None:
            continue
        if not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number, got {value}")
        body[flag[2:].replace("-", "_")] = value
    body.update(parse_extra_body(args.extra_body) or {})
    return body or None


def api_key_of(flag: str | None) -> str | None:
    """The bench's API key: ``--api-key`` if given, else ``$OPENAI_API_KEY`` when set and not
    empty (what vLLM's ``bench serve`` and the OpenAI clients read), else None (no header)."""
    if flag is not None:
        return flag
    return os.environ.get("OPENAI_API_KEY") or None


_SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "cookie", "password")


def command_line(argv: Sequence[str]) -> str:
    """The command a result file records (``surge`` and ``argv``, shell-quoted), with secrets
    masked as ``***``: the value of ``--api-key`` and of each ``--header`` pair whose name holds
    one of :data:`_SECRET_HEADER_WORDS` (``Authorization``, ``x-api-key``...). Result files are
    shared and committed; vLLM's record no command line at all."""
    out: list[str] = ["surge"]
    in_headers = False
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append("***")
            mask_next = False
            continue
        if arg.startswith("-"):
            in_headers = arg == "--header"
            if arg == "--api-key":
                mask_next = True
            elif arg.startswith("--api-key="):
                arg = "--api-key=***"
            elif arg.startswith("--header="):
                name = arg[len("--header=") :].partition("=")[0]
                if any(w in name.lower() for w in _SECRET_HEADER_WORDS):
                    arg = f"--header={name}=***"
            out.append(arg)
            continue
        if in_headers and "=" in arg:
            name = arg.partition("=")[0]
            if any(w in name.lower() for w in _SECRET_HEADER_WORDS):
                arg = f"{name}=***"
        out.append(arg)
    return shlex.join(out)


def _command_line() -> str:
    return command_line(sys.argv[1:])


def _url_error(url: str, flag: str) -> str | None:
    """What is wrong with the server URL ``url`` given by ``flag``, in one line, or None when
    ``urllib`` can open it: an ``http(s)://`` scheme, a host, a port that is a number in
    [1, 65535] (or none: 80/443), and no space or control character anywhere (``http.client``
    refuses those with a traceback: ``InvalidURL``)."""
    if not url.lower().startswith(("http://", "https://")):
        return f"{flag} {url}: give the URL with its scheme, e.g. http://{url.split('://')[-1]}"
    bad = next((c for c in url if ord(c) <= 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        return f"{flag} {url!r}: a URL cannot hold {'a space' if bad == ' ' else f'the character {bad!r}'}"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as e:  # an unclosed IPv6 bracket
        return f"{flag} {url}: not a valid URL ({e})"
    if not parts.hostname:
        return f"{flag} {url}: the URL names no host, e.g. http://127.0.0.1:8000"
    try:
        port = parts.port
    except ValueError:  # not a number, or over 65535
        port = -1
    if port is not None and not 1 <= port <= 65535:
        text = parts.netloc.rpartition("]")[2].rpartition(":")[2]
        return f"{flag} {url}: the port must be a number in [1, 65535], got {text!r}"
    return None


def base_url_of(args: argparse.Namespace) -> str:
    """The server's URL: ``--base-url``, or vLLM's ``--host`` / ``--port`` (``http://HOST:PORT``,
    127.0.0.1 and 8000 for the one left out), else :data:`DEFAULT_BASE_URL`.

    Raises:
        ValueError: ``--base-url`` together with ``--host`` or ``--port`` (vLLM takes the URL and
            drops the others; here neither is dropped silently), a port outside [1, 65535], a
            ``--base-url`` without its ``http://`` or ``https://`` (``127.0.0.1:8000``), with a port
            that is not a number, no host, or a space or control character, or a ``--host`` that is
            a URL (``http://...``, a path) or a host and port (``127.0.0.1:8000``), or holds a space.
    """
    if args.host is None and args.port is None:
        url = args.base_url or DEFAULT_BASE_URL
        error = _url_error(url, "--base-url")
        if error:
            raise ValueError(error)
        return url
    if args.base_url is not None:
        raise ValueError("give --base-url or --host/--port, not both")
    port = 8000 if args.port is None else args.port
    if not 1 <= port <= 65535:
        raise ValueError(f"--port must be in [1, 65535], got {port}")
    host = "127.0.0.1" if args.host is None else args.host
    if not host or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in host):
        why = "it is empty" if not host else "it holds a space or a control character"
        raise ValueError(f"--host {host!r}: not a host name or address ({why})")
    if "://" in host or "/" in host:
        raise ValueError(
            f"--host {host}: give the host alone, e.g. --host 127.0.0.1 (or the whole URL: --base-url {host})"
        )
    if ":" in host and not host.startswith("["):  # an IPv6 address, else a host and a port
        try:
            ipaddress.IPv6Address(host.partition("%")[0])
        except ValueError:
            name, _, given = host.rpartition(":")
            raise ValueError(
                f"--host {host}: give the host alone and the port with --port, e.g. --host {name} --port {given}"
            ) from None
        host = f"[{host}]"
    url = f"http://{host}:{port}"
    error = _url_error(url, "--host and --port make")
    if error:
        raise ValueError(error)
    return url


def _serve_config(args: argparse.Namespace, **over: Any) -> Any:
    from surge.bench.metrics import parse_goodput, parse_percentiles
    from surge.bench.roofline import resolve_hardware, unused_fp8_peak_warning
    from surge.bench.serve import ServeConfig, roofline_fp8_weights

    goodput = parse_goodput(args.goodput or [])
    check_tokenizer_mode(args.tokenizer_mode)
    endpoint, backend = endpoint_and_backend(args.endpoint, args.backend)
    fields: dict[str, Any] = {
        "temperature": args.temperature,
        "extra_body": request_body_extras(args, endpoint),
        "label": args.label,
        **_model_names(args),
        "base_url": base_url_of(args),
        "endpoint": endpoint,
        "backend": backend,
        "tokenizer": args.tokenizer,
        "seed": args.seed,
        "warmup": 1 if args.warmup is None else args.warmup,
        "percentiles": tuple(parse_percentiles(args.percentiles, args.percentiles_flag)),
        "goodput": tuple(goodput.items()),
        "api_key": api_key_of(args.api_key),
        "headers": parse_headers(args.header),
        "insecure": args.insecure,
        "hardware": resolve_hardware(args.gpu, args.hbm_bandwidth, args.peak_flops, args.peak_flops_fp8),
        "model_config": args.model_config,
        "roofline_tp": args.roofline_tp,
        "roofline_dtype": args.roofline_dtype,
        "roofline_kv_cache_dtype": args.roofline_kv_cache_dtype,
        "disable_tqdm": args.disable_tqdm,
        "request_timeout_s": args.request_timeout,
    }
    fields.update(over)
    cfg = ServeConfig(**fields)
    cfg.validate()
    if args.peak_flops_fp8 is not None:  # said once, before the run, where the weights' dtype is known then
        fp8 = roofline_fp8_weights(cfg)
        warning = unused_fp8_peak_warning(args.peak_flops_fp8, fp8, "--roofline-dtype", cfg.roofline_dtype)
        if warning:
            print(f"surge: warning: {warning}", file=sys.stderr)
    return cfg


def _model_names(args: argparse.Namespace) -> dict[str, str | None]:
    """``--model`` and vLLM's ``--served-model-name`` as ServeConfig's ``model`` (the name sent)
    and ``model_id`` (the name recorded, None for the same).

    Raises:
        ValueError: ``--served-model-name`` without ``--model`` (vLLM then ignores it and
            benchmarks the first model of ``/v1/models``).
    """
    if args.served_model_name is None:
        return {"model": args.model, "model_id": None}
    if args.model is None:
        raise ValueError(
            "--served-model-name applies with --model (vLLM ignores it without and benchmarks the first model "
            "of /v1/models): give --model NAME, the name the server serves"
        )
    return {"model": args.served_model_name, "model_id": args.model}


def _warmups(args: argparse.Namespace) -> dict[str, int]:
    """``bench serve``'s warm-up: Surge's ``--warmup`` requests, or vLLM's ``--num-warmups``
    copies of the first timed request in their place (``warmup`` 0), as ServeConfig fields.

    Raises:
        ValueError: both given (other than ``--warmup 0``), or ``--num-warmups`` below 0.
    """
    if args.num_warmups is None:
        return {}
    if args.num_warmups < 0:
        raise ValueError(f"--num-warmups must be >= 0, got {args.num_warmups}")
    if args.warmup:
        raise ValueError(
            "give --warmup (Surge's warm-up, with other prompts) or --num-warmups (vLLM's, the first prompt "
            "again), not both"
        )
    return {"warmup": 0, "num_warmups": args.num_warmups}


def _timed_trace_options(args: argparse.Namespace) -> Any:
    """The ``--timed-trace-*`` flags as :class:`surge.bench.timed_trace.TimedTraceOptions`, vLLM's
    default for each one not given."""
    from surge.bench.timed_trace import TimedTraceOptions

    given = {
        "chunk_hash_size": args.timed_trace_chunk_hash_size,
        "sec_multiplier": args.timed_trace_sec_multiplier,
        "label_timestamp": args.timed_trace_label_timestamp,
        "label_input_length": args.timed_trace_label_input_length,
        "label_output_length": args.timed_trace_label_output_length,
        "label_hash_ids": args.timed_trace_label_hash_ids,
    }
    return TimedTraceOptions(**{k: v for k, v in given.items() if v is not None})


def _every_prompt(dataset: str, path: str, category: str | None, given: int) -> int:
    """vLLM's ``--num-prompts`` 0 or less with its ``custom`` and ``spec_bench`` datasets: every
    prompt of the file (of ``--spec-bench-category``), counted here, with a note on stderr.

    Raises:
        ValueError: an unusable file or line, or no question of the category.
    """
    from surge.bench.datasets import load_custom
    from surge.bench.question_datasets import spec_bench_questions

    n = len(load_custom(path)) if dataset == "custom" else len(spec_bench_questions(path, category))
    print(
        f"surge: note: --num-prompts {given} sends every prompt of {path}: {n} (vLLM's {dataset} dataset)",
        file=sys.stderr,
    )
    return n


def _check_output_file(path: Path, flag: str) -> None:
    """Check, before any request, that ``flag``'s file (``--result-file``, ``--plot``) can be
    written: by creating it (and removing it again; an existing file is left as it was), or,
    where its folder is absent, by making a folder where that one would go (and removing it
    again). No folder is left behind, since a later check may refuse the run: the result's
    folder is made when the result is written. Raises ValueError naming the flag otherwise (a
    folder at that path, a parent that is a file, no write permission, a read-only or virtual
    file system such as ``/proc``)."""
    if path.is_dir():
        example = path / ("result.json" if flag == "--result-file" else "change.png")
        raise ValueError(f"{flag} {path}: is a directory (give a file name, e.g. {example})")
    from surge.bench.results import cannot_make_folder, cannot_write, file_in_the_way

    blocker = file_in_the_way(path.parent)
    if blocker is not None:
        raise ValueError(f"{flag} {path}: {blocker} is a file, not a folder")
    # a real try: os.access says yes to root on /proc
    why = cannot_write(path) if path.parent.is_dir() else cannot_make_folder(path.parent)
    if why is not None:
        raise ValueError(f"{flag} {path}: cannot write a file there ({why})")


def cmd_serve(args: argparse.Namespace) -> int:
    """``surge bench serve``: exit 0 when every request succeeded, 1 otherwise."""
    from surge.bench.metrics import LATENCY_METRICS, parse_percentile_metrics
    from surge.bench.report import format_result_table
    from surge.bench.serve import FILE_DATASET_NAMES, FILE_DATASETS, roofline_unused_reason, run_serve

    for flag, value in (
        ("--input-len", args.input_len),
        ("--random-input-len", args.random_input_len),
        ("--sonnet-input-len", args.sonnet_input_len),
        ("--output-len", args.output_len),
        ("--random-output-len", args.random_output_len),
        ("--sharegpt-output-len", args.sharegpt_output_len),
        ("--prefix-repetition-output-len", args.prefix_repetition_output_len),
        ("--sonnet-output-len", args.sonnet_output_len),
        ("--spec-bench-output-len", args.spec_bench_output_len),
        ("--hf-output-len", args.hf_output_len),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    in_ratio, out_ratio = parse_range_ratio(args.random_range_ratio)
    # vLLM's bench serve sets ignore_eos for its random and timed_trace datasets: every request runs
    # to its length
    ignore_eos = args.dataset in ("random", "timed_trace") if args.ignore_eos is None else args.ignore_eos
    dataset = args.dataset
    if args.disable_shuffle and dataset not in SHUFFLED_DATASETS:
        order = {
            "random": "draws fresh random prompts",
            "sonnet": "draws its lines at random",
            "burstgpt": "draws its rows at random",
            "timed_trace": "sends the trace's rows in the file's order",
        }[dataset]
        raise ValueError(
            f"--disable-shuffle applies to --dataset {', '.join(SHUFFLED_DATASETS)} (--dataset {dataset} "
            f"{order}; vLLM ignores the flag there)"
        )
    if args.no_oversample and dataset not in FEWER_OK_DATASETS:
        raise ValueError(
            f"--no-oversample applies to --dataset {', '.join(FEWER_OK_DATASETS)} (--dataset {dataset} sends "
            "--num-prompts requests whatever it says, as vLLM's)"
        )
    if dataset != "timed_trace" and args.self_timed is not None:
        raise ValueError("--self-timed/--no-self-timed applies to --dataset timed_trace (as vLLM)")
    if dataset not in ("random", "sonnet") and args.input_len is not None:
        own = {
            "sharegpt": "ShareGPT prompts keep their own lengths",
            "custom": "custom prompts keep their own lengths",
            "prefix_repetition": "use --prefix-repetition-prefix-len and --prefix-repetition-suffix-len",
            "burstgpt": "each row's Request tokens is its prompt's length, as vLLM",
            "timed_trace": "each row's input length and hash_ids make its prompt, as vLLM",
            "spec_bench": "questions keep their own lengths",
            "hf": "the dataset's prompts keep their own lengths",
        }
        raise ValueError(f"--input-len applies to --dataset random or sonnet ({own[dataset]})")
    if dataset in ("burstgpt", "timed_trace") and args.output_len is not None:
        column = "Response tokens" if dataset == "burstgpt" else "output length"
        raise ValueError(
            f"--output-len applies to the other datasets (--dataset {dataset}: each row's {column} is "
            "its request's output length, as vLLM)"
        )
    if dataset not in FILE_DATASETS and args.dataset_path is not None:
        raise ValueError(
            f"--dataset-path applies to --dataset {FILE_DATASET_NAMES} (--dataset {dataset} builds "
            "its prompts)"
        )
    if (
        args.sonnet_input_len is not None
        and args.input_len is not None
        and args.sonnet_input_len != args.input_len
    ):
        raise ValueError(
            f"--input-len {args.input_len} and --sonnet-input-len {args.sonnet_input_len} disagree (give one)"
        )
    if (
        args.random_input_len is not None
        and args.input_len is not None
        and args.random_input_len != args.input_len
    ):
        raise ValueError(
            f"--input-len {args.input_len} and --random-input-len {args.random_input_len} disagree (give one)"
        )
    own_flags = {
        "random": {
            "--random-input-len": args.random_input_len,
            "--random-output-len": args.random_output_len,
            "--random-prefix-len": args.random_prefix_len,
        },
        "sharegpt": {"--sharegpt-output-len": args.sharegpt_output_len},
        "custom": {
            "--custom-output-len": args.custom_output_len,
            "--chat-template-kwargs": args.chat_template_kwargs,
        },
        "prefix_repetition": {
            "--prefix-repetition-prefix-len": args.prefix_repetition_prefix_len,
            "--prefix-repetition-suffix-len": args.prefix_repetition_suffix_len,
            "--prefix-repetition-num-prefixes": args.prefix_repetition_num_prefixes,
            "--prefix-repetition-output-len": args.prefix_repetition_output_len,
        },
        "sonnet": {
            "--sonnet-input-len": args.sonnet_input_len,
            "--sonnet-prefix-len": args.sonnet_prefix_len,
            "--sonnet-output-len": args.sonnet_output_len,
        },
        "timed_trace": {
            "--timed-trace-chunk-hash-size": args.timed_trace_chunk_hash_size,
            "--timed-trace-sec-multiplier": args.timed_trace_sec_multiplier,
            "--timed-trace-label-timestamp": args.timed_trace_label_timestamp,
            "--timed-trace-label-input-length": args.timed_trace_label_input_length,
            "--timed-trace-label-output-length": args.timed_trace_label_output_length,
            "--timed-trace-label-hash-ids": args.timed_trace_label_hash_ids,
        },
        "spec_bench": {
            "--spec-bench-output-len": args.spec_bench_output_len,
            "--spec-bench-category": args.spec_bench_category,
        },
        "hf": {
            "--hf-name": args.hf_name,
            "--hf-split": args.hf_split,
            "--hf-subset": args.hf_subset,
            "--hf-output-len": args.hf_output_len,
        },
    }
    if dataset == "spec_bench" and args.skip_chat_template:
        raise ValueError(
            "--skip-chat-template: vLLM's spec_bench renders every question with the chat template on "
            "/v1/completions whatever this flag says (its dataset takes no such option); Surge refuses it "
            "rather than send other prompts (on the chat endpoint the question is the user message)"
        )
    for owner, flags in own_flags.items():
        for flag, value in flags.items():
            if owner != dataset and value is not None and value is not False:  # 0 is given, too
                use = " (use --output-len)" if flag.endswith("-output-len") else ""
                if flag == "--random-input-len" and dataset == "sonnet":
                    use = " (use --input-len or --sonnet-input-len)"
                raise ValueError(f"{flag} applies to --dataset {owner}{use}")
    # vLLM's dataset-specific output lengths; --output-len sets them all (vLLM), two must agree
    fixed = {
        "random": ("--random-output-len", args.random_output_len),
        "sharegpt": ("--sharegpt-output-len", args.sharegpt_output_len),
        "custom": ("--custom-output-len", args.custom_output_len),
        "prefix_repetition": ("--prefix-repetition-output-len", args.prefix_repetition_output_len),
        "sonnet": ("--sonnet-output-len", args.sonnet_output_len),
        "spec_bench": ("--spec-bench-output-len", args.spec_bench_output_len),
        "hf": ("--hf-output-len", args.hf_output_len),
    }.get(dataset, ("", None))
    if fixed[1] is not None and args.output_len is not None and args.output_len != fixed[1]:
        raise ValueError(f"--output-len {args.output_len} and {fixed[0]} {fixed[1]} disagree (give one)")
    num_prompts = args.num_prompts
    if num_prompts < 1 and dataset in ("custom", "spec_bench") and args.dataset_path is not None:
        num_prompts = _every_prompt(dataset, args.dataset_path, args.spec_bench_category, num_prompts)
    own_output = args.output_len if fixed[1] is None else fixed[1]
    default_output = {"prefix_repetition": 128, "sonnet": 150}.get(dataset, 256)  # vLLM's defaults
    output_len = next(v for v in (own_output, default_output) if v is not None)
    cfg = _serve_config(
        args,
        dataset=dataset,
        dataset_path=args.dataset_path,
        input_len=next(v for v in (args.input_len, args.random_input_len, 256) if v is not None)
        if dataset == "random"
        else 256,
        input_len_flag="--random-input-len"
        if dataset == "random" and args.input_len is None and args.random_input_len is not None
        else "--input-len",
        # the dataset's own output flag when it was typed alone, or gave sonnet's default (150)
        output_len_flag=fixed[0]
        if args.output_len is None and (fixed[1] is not None or dataset == "sonnet")
        else "--output-len",
        output_len=256 if output_len == -1 else output_len,  # -1: custom's per-line lengths
        sharegpt_output_len=own_output if dataset == "sharegpt" else None,
        random_range_ratio=in_ratio,
        random_output_range_ratio=out_ratio,
        random_prefix_len=0 if args.random_prefix_len is None else args.random_prefix_len,
        custom_output_len=output_len if dataset == "custom" else 256,
        skip_chat_template=args.skip_chat_template,
        chat_template_kwargs=parse_extra_body(args.chat_template_kwargs, "--chat-template-kwargs"),
        prefix_repetition_prefix_len=256
        if args.prefix_repetition_prefix_len is None
        else args.prefix_repetition_prefix_len,
        prefix_repetition_suffix_len=256
        if args.prefix_repetition_suffix_len is None
        else args.prefix_repetition_suffix_len,
        prefix_repetition_num_prefixes=10
        if args.prefix_repetition_num_prefixes is None
        else args.prefix_repetition_num_prefixes,
        sonnet_input_len=next(v for v in (args.sonnet_input_len, args.input_len, 550) if v is not None),
        sonnet_input_len_flag="--input-len"
        if args.sonnet_input_len is None and args.input_len is not None
        else "--sonnet-input-len",
        sonnet_prefix_len=200 if args.sonnet_prefix_len is None else args.sonnet_prefix_len,
        timed_trace=_timed_trace_options(args),
        self_timed=dataset == "timed_trace" and args.self_timed is not False,
        spec_bench_category=args.spec_bench_category,
        hf_name=args.hf_name,
        hf_split=args.hf_split,
        hf_subset=args.hf_subset,
        hf_output_len=own_output if dataset == "hf" else None,
        num_prompts=num_prompts,
        max_concurrency=args.max_concurrency,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        ramp_up_strategy=args.ramp_up_strategy,
        ramp_up_start_rps=args.ramp_up_start_rps,
        ramp_up_end_rps=args.ramp_up_end_rps,
        ignore_eos=ignore_eos,
        exact_length=ignore_eos if args.exact_length is None else args.exact_length,
        disable_shuffle=args.disable_shuffle,
        no_oversample=args.no_oversample,
        **_warmups(args),
        save_detailed=args.save_detailed,
        metadata=parse_metadata(args.metadata),
        request_id_prefix=args.request_id_prefix,
        ready_check_timeout_s=args.ready_check_timeout_sec,
        percentile_metrics=LATENCY_METRICS
        if args.percentile_metrics is None
        else parse_percentile_metrics(args.percentile_metrics),
    )
    from surge.bench.plots import parse_itl_thresholds, plot_path

    if args.timeline_itl_thresholds is not None and not args.plot_timeline:
        raise ValueError("--timeline-itl-thresholds applies with --plot-timeline")
    thresholds = parse_itl_thresholds(args.timeline_itl_thresholds or "25,50")
    plots = [
        (flag, kind)
        for flag, kind, on in (
            ("--plot-timeline", "timeline", args.plot_timeline),
            ("--plot-dataset-stats", "dataset_stats", args.plot_dataset_stats),
        )
        if on
    ]
    vllm_save = "--append-result" if args.append_result else "--save-result" if args.save_result else None
    if vllm_save and args.result_file:
        raise ValueError(
            f"give --result-file FILE or vLLM's {vllm_save} (with --result-dir and --result-filename), not both"
        )
    if not vllm_save:
        for flag, value in (("--result-dir", args.result_dir), ("--result-filename", args.result_filename)):
            if value is not None:
                raise ValueError(
                    f"{flag} applies with --save-result or --append-result (without them vLLM ignores it, "
                    "but for placing its --plot-timeline file; Surge refuses a flag that would do nothing)"
                )
    saving = args.result_file or vllm_save
    if plots and not saving:
        raise ValueError(f"{plots[0][0]} writes its PNG next to --result-file: give --result-file FILE.json")
    if args.metadata and not saving:
        raise ValueError("--metadata is recorded in the result file: give --result-file FILE.json")
    # vLLM ignores --save-detailed without --save-result: Surge refuses a flag that would do nothing
    if args.save_detailed and not saving:
        raise ValueError(
            "--save-detailed adds generated_texts to the result file: give --result-file FILE.json "
            "(or --save-result)"
        )
    if args.result_file:  # before the run, so that a bad path loses no results
        _check_output_file(Path(args.result_file), "--result-file")
        for flag, kind in plots:
            _check_output_file(plot_path(Path(args.result_file), kind), flag)
    elif vllm_save:
        folder = Path(args.result_dir or ".")
        if args.result_filename:
            _check_output_file(folder / args.result_filename, "--result-filename")
            if args.append_result:
                from surge.bench.vllm_results import check_appendable

                check_appendable(folder / args.result_filename)
        else:
            _check_output_file(folder / "result.json", "--result-dir")
    unused = roofline_unused_reason(cfg)
    if unused:  # after the flags' checks, before the run: not found as null fields after it
        print(f"surge: warning: {unused}", file=sys.stderr)
    try:
        result = run_serve(cfg, _command_line())
    except KeyboardInterrupt:
        written = " and no result file was written" if saving else ""
        print(
            f"surge: interrupted; the run was cut short, so no result table is printed{written}",
            file=sys.stderr,
        )
        raise
    print(format_result_table(result))
    path = None
    if args.result_file:
        path = Path(args.result_file)
        text = json.dumps(result, indent=2)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # checked before the run, made now
            if path.name.endswith(".gz"):
                import gzip

                path.write_bytes(gzip.compress(text.encode(), mtime=0))
            else:
                path.write_text(text)
        except OSError as e:  # the table above keeps the figures
            raise ValueError(f"--result-file {path}: {e.strerror or e} (the result table is above)") from None
    elif vllm_save:
        from surge.bench.vllm_results import save_vllm_result, vllm_result_filename

        path = vllm_result_filename(result, args.result_dir, args.result_filename)
        try:
            save_vllm_result(path, result, append=args.append_result)
        except OSError as e:  # the table above keeps the figures
            raise ValueError(f"{vllm_save} {path}: {e.strerror or e} (the result table is above)") from None
    if path is not None:
        print(f"result {'appended' if args.append_result else 'written'} to {path}")
        _write_plots(result, path, plots, thresholds)
    return 0 if result["failed"] == 0 else 1


def _write_plots(
    result: dict[str, Any], result_file: Path, plots: list[tuple[str, str]], thresholds: tuple[float, float]
) -> None:
    """Write ``--plot-timeline`` / ``--plot-dataset-stats`` next to ``result_file``; a plot that
    cannot be written is one warning line on stderr (the result file is already written), as vLLM."""
    from surge.bench.plots import plot_dataset_stats, plot_path, plot_timeline

    for flag, kind in plots:
        target = plot_path(result_file, kind)
        try:
            if kind == "timeline":
                plot_timeline(result, target, thresholds)
            else:
                plot_dataset_stats(result, target)
        except OSError as e:
            print(f"surge: warning: {flag} {target}: {e.strerror or e}", file=sys.stderr)
            continue
        print(f"{flag.removeprefix('--plot-').replace('-', ' ')} plot written to {target}")


def _grid(args: argparse.Namespace) -> list[Any]:
    from surge.bench.matrix import PRESETS, grid_points, parse_int_list

    custom = [args.concurrency, args.input_len, args.output_len]
    if args.preset:
        if any(v is not None for v in custom):
            raise ValueError("use either --preset or --concurrency/--input-len/--output-len, not both")
        return PRESETS[args.preset]()
    if any(v is None for v in custom):
        raise ValueError("give --preset official-8b or all of --concurrency, --input-len and --output-len")
    return grid_points(
        parse_int_list(args.concurrency, "--concurrency"),
        parse_int_list(args.input_len, "--input-len"),
        parse_int_list(args.output_len, "--output-len"),
    )


def cmd_matrix(args: argparse.Namespace) -> int:
    """``surge bench matrix``: exit 0 when every point succeeded, 1 otherwise."""
    from surge.bench.matrix import MatrixConfig, run_matrix

    points = _grid(args)
    cfg = _serve_config(args, ignore_eos=True, exact_length=True)
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.stop_after is not None and not args.stop_after >= 0:
        raise ValueError(f"--stop-after must be >= 0 seconds, got {args.stop_after:g}")
    if args.launch:
        from surge.bench.launcher import check_launch_port

        check_launch_port(args.launch, cfg.base_url)
    mcfg = MatrixConfig(
        tuple(points),
        cfg,
        Path(args.output_dir),
        args.launch,
        args.server_timeout,
        repeats=args.repeats,
        reset_prefix_cache=not args.keep_prefix_cache,
        resume=args.resume,
        stop_after_s=args.stop_after,
    )
    try:
        summary = run_matrix(mcfg, _command_line())
    except KeyboardInterrupt:
        print(
            f"surge: interrupted; the finished points are in {args.output_dir}: the same command with "
            "--resume runs the rest",
            file=sys.stderr,
        )
        raise
    # summary.md ends with its "N/P points successful." line (and the failed points' errors)
    print((Path(args.output_dir) / "summary.md").read_text(), end="")
    print(f"artifacts in {args.output_dir}")
    return 0 if summary["num_successful"] == summary["num_planned_points"] else 1


def cmd_compare(args: argparse.Namespace) -> int:
    """``surge bench compare BASE NEW``: markdown to stdout, optional PNG; exit 0.

    Raises:
        ValueError: an unknown ``--metric``, one null in every point of a run, or no point valid in
            both runs (nothing to compare: the message says why).
    """
    from surge.bench.compare import (
        check_metric,
        compare_points,
        comparison_markdown,
        load_points,
        mismatch_warnings,
        nothing_to_compare,
        plot_comparison,
    )

    if args.tie_pct is not None and not args.tie_pct >= 0:
        raise ValueError(f"--tie-pct must be >= 0 (a percent), got {args.tie_pct}")
    plot = Path(args.plot) if args.plot else None
    if plot is not None and not plot.suffix and not plot.is_dir():  # matplotlib would add .png silently
        plot = plot.with_name(plot.name + ".png")
    if plot is not None:  # before any work, so a bad path is one line, not a traceback after the table
        _check_output_file(plot, "--plot")
        from matplotlib.backend_bases import FigureCanvasBase

        ext = plot.suffix.lstrip(".").lower()
        formats = FigureCanvasBase.get_supported_filetypes()
        if ext and ext not in formats:
            raise ValueError(
                f"--plot {args.plot}: .{ext} is not an image format (give one of {', '.join(sorted(formats))})"
            )
    notes: list[str] = []
    base, new = load_points(args.base, notes, args.metric), load_points(args.new, notes, args.metric)
    for note in notes:  # a JSON-lines file of --append-result's runs
        print(f"surge: note: {note}", file=sys.stderr)
    check_metric(args.metric, base, new, names=(args.base, args.new))
    cmp = compare_points(base, new, args.metric, tie_pct=args.tie_pct)
    if not cmp.rows:
        raise ValueError(nothing_to_compare(cmp, base, new, args.base, args.new))
    print(comparison_markdown(cmp, args.base, args.new), end="")
    for warning in mismatch_warnings(cmp):  # one line per difference, not an error
        print(f"surge: warning: {warning}", file=sys.stderr)
    if plot is not None:
        try:
            plot.parent.mkdir(parents=True, exist_ok=True)  # checked before the work, made now
            plot_comparison(cmp, plot)
        except OSError as e:
            raise ValueError(f"--plot {args.plot}: {e.strerror or e}") from None
        print(f"surge: plot written to {plot}", file=sys.stderr)
    return 0


def cmd_roofline(args: argparse.Namespace) -> int:
    """``surge bench roofline``: print the per-point ceilings; needs --gpu or both numbers.

    Points whose prompt + output exceed the config's ``max_position_embeddings`` get one
    warning line on stderr (see :func:`surge.bench.roofline.context_warning` for why not an error).

    Raises:
        ValueError: no hardware, ``--link-bandwidth`` at ``-tp`` 1 (a flag that would do nothing),
            FP8 weights on a GPU without FP8 tensor cores, or a config the roofline cannot model.
    """
    from surge.bench.matrix import official_8b_points
    from surge.bench.roofline import (
        check_fp8_support,
        context_warning,
        format_roofline_table,
        load_config,
        model_shape,
        point_roofline,
        resolve_hardware,
        unused_fp8_peak_warning,
        with_link_bandwidth,
    )

    hw = resolve_hardware(args.gpu, args.hbm_bandwidth, args.peak_flops, args.peak_flops_fp8)
    if hw is None:
        raise ValueError("the roofline needs --gpu NAME or both --hbm-bandwidth and --peak-flops")
    if args.link_bandwidth is not None and args.tensor_parallel_size == 1:
        raise ValueError(
            "--link-bandwidth applies with -tp/--tensor-parallel-size > 1 (one GPU sends nothing over a link)"
        )
    hw = with_link_bandwidth(hw, args.link_bandwidth)
    cfg = load_config(args.model)
    shape = model_shape(cfg, args.dtype, args.tensor_parallel_size, args.kv_cache_dtype)
    check_fp8_support(shape.fp8_matmul_params > 0, hw, "--dtype")
    fp8_warning = unused_fp8_peak_warning(
        args.peak_flops_fp8, shape.fp8_matmul_params > 0, "--dtype", args.dtype
    )
    if fp8_warning:
        print(f"surge: warning: {fp8_warning}", file=sys.stderr)
    if args.preset or any(v is not None for v in (args.concurrency, args.input_len, args.output_len)):
        points = _grid(args)
    else:
        points = official_8b_points()
    rows = [point_roofline(shape, hw, p.concurrency, p.input_len, p.output_len) for p in points]
    warning = context_warning(cfg, [(p.concurrency, p.input_len, p.output_len) for p in points])
    if warning:
        print(f"surge: warning: {warning}", file=sys.stderr)
    print(format_roofline_table(shape, hw, rows))
    return 0
