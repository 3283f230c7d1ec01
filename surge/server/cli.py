"""`surge serve`: the OpenAI-compatible HTTP server with its engine process."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from surge.config import SCHEDULING_POLICIES
from surge.server.auth import OPEN_PATHS, api_keys_source, parse_api_keys
from surge.server.cors import CorsOptions
from surge.server.metrics import METRICS_PREFIXES
from surge.server.vllm_flags import DENSE_ONLY, NO_LORA, vllm_flags_without_counterpart

_BUILT_IN_PARSERS = "(Surge's parsers are built in; no plugins)"
_ONE_HOST_DP = "nothing: Surge's replicas (-dp N) all run on one host; --nnodes spans hosts with -tp only"
_NO_NUMA = "nothing: Surge binds no process to NUMA nodes; run it under numactl (numactl --cpunodebind=N --membind=N surge serve ...)"
_NO_CONTEXT_PARALLEL = "-tp N (--tensor-parallel-size): Surge has no context parallelism"
_NO_TORCH_COMPILE = (
    "nothing: Surge runs no torch.compile; its CUDA graphs are its own (--enforce-eager turns them off)"
)
_NO_SPECULATIVE = "nothing: Surge has no speculative decoding"
_ONE_TOKEN_BUDGET = (
    "--max-num-batched-tokens N, the one token budget of a step that prompts are prefilled in chunks of "
    "(Surge has no separate cap for long prompts)"
)

VLLM_SERVE_FLAG_HINTS = {
    **vllm_flags_without_counterpart(),
    "--tokenizer-mode": "nothing: Surge loads the model folder's tokenizer with transformers' AutoTokenizer",
    "--data-parallel-address": _ONE_HOST_DP,
    "--data-parallel-rpc-port": _ONE_HOST_DP,
    "--data-parallel-start-rank": _ONE_HOST_DP,
    "--data-parallel-hybrid-lb": _ONE_HOST_DP,
    "--data-parallel-external-lb": _ONE_HOST_DP,
    "--data-parallel-backend": "nothing: Surge starts each -dp replica as a process itself (vLLM's mp)",
    "--data-parallel-rank": _ONE_HOST_DP,
    "--data-parallel-multi-port-external-lb": _ONE_HOST_DP,
    # vLLM's short forms of the data-parallel flags above
    "-dpn": _ONE_HOST_DP,
    "-dpr": _ONE_HOST_DP,
    "-dpa": _ONE_HOST_DP,
    "-dpp": _ONE_HOST_DP,
    "-dph": _ONE_HOST_DP,
    "-dpe": _ONE_HOST_DP,
    "-dpm": _ONE_HOST_DP,
    "-dpb": "nothing: Surge starts each -dp replica as a process itself (vLLM's mp)",
    "--decode-context-parallel-size": _NO_CONTEXT_PARALLEL,
    "-dcp": _NO_CONTEXT_PARALLEL,
    "--prefill-context-parallel-size": _NO_CONTEXT_PARALLEL,
    "-pcp": _NO_CONTEXT_PARALLEL,
    "--headless": "--nnodes N --node-rank R (R > 0): such a node runs only tensor-parallel workers",
    "--revision": "the folder of that revision as MODEL (Surge loads local model folders only)",
    "--code-revision": "nothing: Surge never runs a model folder's code",
    "--tokenizer-revision": "nothing: Surge reads the model folder's own tokenizer files",
    "--hf-token": "nothing: Surge loads local model folders only and never downloads",
    "--enable-lora": NO_LORA,
    "--max-loras": NO_LORA,
    "--max-lora-rank": NO_LORA,
    "--speculative-config": _NO_SPECULATIVE,
    "--cpu-offload-gb": "nothing: Surge keeps every weight on the device",
    "--kv-cache-memory-bytes": "--num-kv-blocks N (N blocks of --block-size tokens) or --gpu-memory-utilization",
    "--num-gpu-blocks-override": "--num-kv-blocks N",
    "--compilation-config": _NO_TORCH_COMPILE,
    "--disable-custom-all-reduce": "nothing: Surge's default --tp-all-reduce nccl is NCCL only",
    "--runner": "nothing: Surge serves generative models only",
    "--convert": "nothing: Surge serves generative models only",
    "--limit-mm-per-prompt": "nothing: Surge serves text-only models",
    "--mm-processor-kwargs": "nothing: Surge serves text-only models",
    "--enable-sleep-mode": "nothing: Surge has no sleep mode",
    "--structured-outputs-config": "nothing: Surge's structured outputs always use xgrammar "
    "(docs/structured-outputs.md)",
    "--kv-transfer-config": "nothing: Surge has no KV connector",
    "--model-impl": "nothing: Surge runs its own model code for the supported architectures",
    "--enable-expert-parallel": DENSE_ONLY,
    "-ep": DENSE_ONLY,
    "--enable-eplb": DENSE_ONLY,
    "--reasoning-parser-plugin": f"--reasoning-parser qwen3|deepseek_r1 {_BUILT_IN_PARSERS}",
    "--tool-parser-plugin": f"--tool-call-parser hermes|llama3_json|pythonic {_BUILT_IN_PARSERS}",
    "--logits-processors": "nothing: Surge has no logits-processor plugins",
    "--enable-ssl-refresh": "nothing: Surge reads --ssl-certfile and --ssl-keyfile once at start-up; restart it "
    "to serve a renewed certificate",
    "--disable-frontend-multiprocessing": "nothing: Surge's API server always runs apart from its engine process",
    "--middleware": "nothing: Surge takes no ASGI middleware plugins",
    "--log-config-file": "--log-level LEVEL: Surge reads no logging config file",
    "--disable-access-log-for-endpoints": "nothing: the access log is off unless --access-log",
    "--enable-log-outputs": "nothing: Surge logs no prompt or output text (each request's end: its finish "
    "reason and token counts)",
    "--otlp-traces-endpoint": "nothing: Surge exports no OpenTelemetry traces (GET /metrics serves Prometheus "
    "metrics)",
    "--numa-bind": _NO_NUMA,
    "--numa-bind-nodes": _NO_NUMA,
    "--numa-bind-cpus": _NO_NUMA,
    "--cpu-distributed-timeout-seconds": "--distributed-timeout-seconds N: Surge's tensor-parallel ranks "
    "have one process group (NCCL on GPUs, gloo on CPU), and that flag is its timeout",
    "--attention-backend": "nothing: Surge runs its own attention kernels",
    "--disable-sliding-window": "nothing: Surge serves full attention only (a config.json with "
    "use_sliding_window true is refused)",
    "--cudagraph-capture-sizes": "nothing: Surge picks its CUDA graph batch sizes itself (--enforce-eager "
    "turns the graphs off)",
    "--max-cudagraph-capture-size": "nothing: Surge picks its CUDA graph batch sizes itself (--enforce-eager "
    "turns the graphs off)",
    "--logprobs-mode": "nothing: logprobs are the model's raw ones (vLLM's default raw_logprobs; "
    "docs/openai-api.md)",
    # vLLM's short forms of flags hinted above (-O0..-O3 are Surge's own flags: surge/engine/cli_args.py)
    "-cc": _NO_TORCH_COMPILE,
    "-sc": _NO_SPECULATIVE,
    "--attention-config": "nothing: Surge runs its own attention kernels",
    "-ac": "nothing: Surge runs its own attention kernels",
    "-dc": "nothing: Surge serves no diffusion models",
    "--max-num-partial-prefills": _ONE_TOKEN_BUDGET,
    "--max-long-partial-prefills": _ONE_TOKEN_BUDGET,
    "--max-num-scheduled-tokens": "--max-num-batched-tokens N (with no speculative decoding, a step schedules up "
    "to its whole budget)",
    "--prefix-caching-hash-algo": "nothing: Surge's prefix cache hashes its blocks with SHA-256 (vLLM's default "
    "sha256)",
    "--disable-cascade-attn": "nothing: Surge has no cascade attention",
    "--quantization-config": "-q fp8 (--quantization fp8), which takes no settings (docs/fp8.md)",
    "--spec-method": _NO_SPECULATIVE,
    "--spec-model": _NO_SPECULATIVE,
    "--spec-tokens": _NO_SPECULATIVE,
}
"""``vllm serve`` flags that Surge spells otherwise or does without, and what to use instead: the
serve parser's additions to (and, for ``--tokenizer-mode``, replacement of)
:data:`surge.cli.VLLM_FLAG_HINTS`, given in the error line of an unrecognized one."""


SERVE_HELP_GROUPS: dict[str, tuple[str, ...]] = {
    "model (vLLM's ModelConfig)": (
        "model",
        "config",
        "tokenizer",
        "served_model_name",
        "device",
        "dtype",
        "seed",
        "max_model_len",
        "hf_overrides",
        "generation_config",
        "override_generation_config",
    ),
    "load (vLLM's LoadConfig)": ("load_format", "quantization"),
    "cache (vLLM's CacheConfig)": (
        "block_size",
        "num_kv_blocks",
        "gpu_memory_utilization",
        "kv_cache_dtype",
        "enable_prefix_caching",
    ),
    "scheduler (vLLM's SchedulerConfig)": (
        "max_num_seqs",
        "max_num_batched_tokens",
        "scheduling_policy",
        "async_scheduling",
    ),
    "CUDA graphs and kernels (vLLM's CompilationConfig)": (
        "enforce_eager",
        "optimization_level",
        "stream_decode",
        "stream_attention",
    ),
    "parallel (vLLM's ParallelConfig)": (
        "tensor_parallel_size",
        "tp_all_reduce",
        "pipeline_parallel_size",
        "distributed_executor_backend",
        "data_parallel_size",
        "data_parallel_size_local",
        "device_ids",
        "nnodes",
        "node_rank",
        "master_addr",
        "master_port",
        "distributed_timeout_seconds",
    ),
    "server: address, TLS, CORS and processes (vLLM's Frontend)": (
        "host",
        "port",
        "uds",
        "root_path",
        "api_key",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_ca_certs",
        "ssl_cert_reqs",
        "ssl_ciphers",
        "allowed_origins",
        "allowed_methods",
        "allowed_headers",
        "allow_credentials",
        "api_server_count",
        "shutdown_timeout",
        "keep_alive_on_engine_death",
        "disable_web_ui",
        "disable_fastapi_docs",
        "enable_tokenizer_info_endpoint",
        "enable_server_load_tracking",
        "enable_request_id_headers",
    ),
    "server: limits and timeouts": (
        "max_request_body_bytes",
        "header_read_timeout",
        "body_read_timeout",
        "max_connections",
        "engine_stall_timeout",
        "sse_queued_interval",
        "max_stop_strings",
        "max_stop_string_length",
        "max_choices_per_request",
        "grammar_compile_timeout",
    ),
    "chat, tools and responses (vLLM's Frontend)": (
        "chat_template",
        "chat_template_content_format",
        "default_chat_template_kwargs",
        "trust_request_chat_template",
        "response_role",
        "enable_auto_tool_choice",
        "tool_call_parser",
        "exclude_tools_when_tool_choice_none",
        "reasoning_parser",
        "stream_interval",
        "return_tokens_as_token_ids",
        "enable_prompt_tokens_details",
        "enable_force_include_usage",
    ),
    "logging and metrics (vLLM's ObservabilityConfig)": (
        "log_level",
        "log_interval",
        "enable_log_requests",
        "disable_log_requests",
        "max_log_len",
        "access_log",
        "disable_uvicorn_access_log",
        "uvicorn_log_level",
        "metrics_prefix",
        "metrics_require_key",
    ),
}
"""``surge serve --help``'s groups of flags, by title (each flag by its ``dest``), in the order
shown, after vLLM's groups (ModelConfig, CacheConfig, ...); every flag but ``--help`` is in one
(:func:`surge.cli.group_options`)."""


def non_negative_int(value: str) -> int:
    """An argparse type for an integer of at least 0.

    Raises:
        argparse.ArgumentTypeError: not an integer, or below 0 (argparse's one line names the flag).
    """
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {number}")
    return number


def add_serve_parser(subparsers: Any) -> None:
    """Register `surge serve` on an argparse sub-parser collection."""
    from surge.cli import group_options
    from surge.engine.cli_args import (
        add_device_args,
        add_engine_args,
        add_generation_config_args,
        add_load_args,
        json_object,
    )

    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a Hugging Face model folder over an OpenAI-compatible HTTP API.",
        flag_hints=VLLM_SERVE_FLAG_HINTS,
        config_file=True,
    )
    p.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="Hugging Face model folder, as in `vllm serve MODEL` (the same as --model)",
    )
    p.add_argument("--model", default=None, help="Hugging Face model folder (default: bundled stories260K)")
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE.yaml",
        help="vLLM's flag: read flags from a YAML file of names and values (port: 8000, served-model-name: "
        "[a, b], enable-prefix-caching: false, hf-overrides: {...}); flags on the command line win "
        "(default: none)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="vLLM's flag, taken when it names the model folder itself (however spelled): Surge reads "
        "the model folder's own tokenizer, so another folder is refused (default: the model folder)",
    )
    p.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=None, help="port to listen on (default 8000; 0 = any free port)"
    )
    p.add_argument(
        "--uds",
        default=None,
        metavar="PATH",
        help="vLLM's flag: listen on this Unix domain socket instead of TCP (not with --host, --port or "
        "--api-server-count above 1); a socket file nothing listens on any more is replaced, and the file is "
        "removed at exit (default: TCP)",
    )
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="model name(s) accepted in requests and listed by /v1/models (default: the --model path as "
        "given, like vLLM)",
    )
    p.add_argument(
        "--api-key",
        action="extend",
        nargs="+",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health, /ping, /load, /tokenizer_info, /version, "
        "/metrics (unless --metrics-require-key), the API docs and the web pages' static files (printable ASCII); "
        "several keys: --api-key K1 K2 (vLLM's form), the flag repeated, or a comma list "
        "(default: the SURGE_API_KEY environment variable, else vLLM's VLLM_API_KEY, else no key)",
    )
    p.add_argument(
        "--root-path",
        default=None,
        metavar="PATH",
        help="vLLM's flag (FastAPI's root_path): the path prefix a proxy serves the API under, e.g. /api; "
        "routes answer with it (/api/v1/models) and without it (a proxy that strips it), and the API docs "
        "name it (default: none)",
    )
    p.add_argument("--metrics-require-key", action="store_true", help="/metrics needs the API key too")
    p.add_argument(
        "--keep-alive-on-engine-death",
        action="store_true",
        help="when the engine dies, stay up answering 503 (/health too) instead of exiting with code 1 "
        "as vLLM does (for a supervisor that restarts from health checks)",
    )
    p.add_argument(
        "--metrics-prefix",
        choices=METRICS_PREFIXES,
        default="surge",
        help="the /metrics names' prefix: surge (surge:num_requests_running, ...) or vllm (vLLM's names "
        "of the same metrics, e.g. vllm:num_requests_waiting, for dashboards and autoscalers written for vLLM; "
        "Surge-only metrics such as surge:engine_up keep their surge: names)",
    )
    p.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="largest request body in bytes; larger ones get a 413 (default 4 MiB)",
    )
    p.add_argument(
        "--header-read-timeout",
        type=float,
        default=10.0,
        help="seconds to receive a request's headers, else 408 (default 10)",
    )
    p.add_argument(
        "--body-read-timeout",
        type=float,
        default=60.0,
        help="seconds to receive a request's body, else 408 (default 60)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="most open HTTP connections; more are refused with a 503 "
        "(default 4096, or fewer when the open-file limit is lower)",
    )
    p.add_argument(
        "--engine-stall-timeout",
        type=float,
        default=60.0,
        help="/health answers 503 when requests are pending and no engine step finished "
        "for this many seconds (default 60)",
    )
    p.add_argument(
        "--sse-queued-interval",
        type=float,
        default=5.0,
        help="seconds between ': queued' comments of a stream waiting for its first token (default 5)",
    )
    p.add_argument(
        "--max-stop-strings", type=int, default=64, help="most stop strings per request (default 64)"
    )
    p.add_argument(
        "--max-choices-per-request",
        type=int,
        default=1024,
        help="most choices one completion request may ask for, prompts times n (default 1024), so that "
        "one request cannot hold the queue for long",
    )
    p.add_argument(
        "--max-stop-string-length",
        type=int,
        default=256,
        help="longest stop string in characters (default 256)",
    )
    p.add_argument(
        "--allowed-origins",
        nargs="+",
        default=None,
        help="enable CORS for these origins ('*' = any; a JSON list or comma list also works); "
        "default: no CORS headers",
    )
    p.add_argument("--allowed-methods", nargs="+", default=None, help="CORS: allowed methods (default '*')")
    p.add_argument(
        "--allowed-headers", nargs="+", default=None, help="CORS: allowed request headers (default '*')"
    )
    p.add_argument(
        "--allow-credentials", action="store_true", help="CORS: allow credentials (cookies, Authorization)"
    )
    p.add_argument(
        "--ssl-certfile",
        default=None,
        metavar="FILE",
        help="vLLM's flag: serve HTTPS with this PEM certificate chain (read once at start-up; it may also "
        "hold the key) (default: plain HTTP)",
    )
    p.add_argument(
        "--ssl-keyfile",
        default=None,
        metavar="FILE",
        help="vLLM's flag: the PEM private key of --ssl-certfile, unencrypted (default: in the certificate file)",
    )
    p.add_argument(
        "--ssl-ca-certs",
        default=None,
        metavar="FILE",
        help="vLLM's flag: with --ssl-certfile, the PEM CA bundle client certificates are verified against",
    )
    p.add_argument(
        "--ssl-cert-reqs",
        type=int,
        default=None,
        metavar="{0,1,2}",
        help="vLLM's flag: with --ssl-certfile, the client certificate asked for (the ssl module's CERT_NONE 0, "
        "CERT_OPTIONAL 1, CERT_REQUIRED 2; 1 and 2 need --ssl-ca-certs) (default: 0)",
    )
    p.add_argument(
        "--ssl-ciphers",
        default=None,
        metavar="CIPHERS",
        help="vLLM's flag: with --ssl-certfile, an OpenSSL cipher string for TLS 1.2 and below "
        "(default: OpenSSL's)",
    )
    p.add_argument(
        "--api-server-count",
        "-asc",
        type=int,
        default=1,
        help="API server processes sharing the port and the engine(s): each one streams its own "
        "requests' tokens, so more of them carry more tokens/s at high concurrency (default 1)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds requests in flight may run on before they are ended (default 30)",
    )
    add_generation_config_args(p, "every request's max_tokens")
    p.add_argument(
        "--enable-log-requests",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM 0.26's switch: log a line when each request starts and one when it ends (Surge logs them "
        "unless told not to; --no-enable-log-requests, as --disable-log-requests, turns them off)",
    )
    p.add_argument(
        "--disable-log-requests",
        action="store_true",
        help="no log line per request start and end (older vLLM's flag; vLLM 0.26's is --no-enable-log-requests)",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens per streamed event after the first one (default 1)",
    )
    p.add_argument(
        "--scheduling-policy",
        default="fcfs",
        choices=list(SCHEDULING_POLICIES),
        help="fcfs: requests in arrival order, a request's priority must be 0 (default); priority: "
        "by each request's priority field (lower first, then arrival), and under memory pressure "
        "the running request of the largest priority is preempted, as vLLM's",
    )
    add_engine_args(p)
    add_device_args(p)
    add_load_args(p)
    p.add_argument(
        "--seed", type=int, default=0, help="seed of unseeded sampling and dummy weights (default 0)"
    )
    p.add_argument("--chat-template", default=None, help="a Jinja chat template file (or template text)")
    p.add_argument(
        "--default-chat-template-kwargs",
        type=json_object,
        default=None,
        metavar="JSON",
        help="vLLM's flag: chat template variables every chat request gets under its own "
        "chat_template_kwargs (and reasoning_effort), which win, e.g. '{\"enable_thinking\": false}' to "
        "turn Qwen3's thinking off by default; also for the Responses and Messages APIs, /tokenize and the "
        "render endpoints (default: none)",
    )
    p.add_argument(
        "--response-role",
        default="assistant",
        metavar="ROLE",
        help="vLLM's flag: the role of chat completions answers (message.role, the streamed role chunk) "
        "when the request has add_generation_prompt true; else the answer takes the last message's role "
        "(default assistant)",
    )
    p.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="accept a request's own chat_template (a template is code the server runs: off by default, "
        "so a request that sends one gets a 400, as vLLM)",
    )
    p.add_argument(
        "--tool-call-parser",
        default=None,
        choices=["hermes", "llama3_json", "pythonic"],
        help="parse tool calls of chat completions: hermes (Qwen2.5/Qwen3 <tool_call>), llama3_json, or "
        'pythonic (Llama 3.2/4 [f(a=1)] lists); it enables tool_choice "auto"',
    )
    p.add_argument(
        "--max-log-len",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="vLLM's cap on the prompt characters or ids a request's log line shows: Surge's request log "
        "lines show none, within any cap, so the flag is taken (N >= 0) and changes nothing (default: none)",
    )
    p.add_argument(
        "--enable-request-id-headers",
        action="store_true",
        help="vLLM's switch for the X-Request-Id response header: Surge's responses always carry it, so "
        "the flag is taken and changes nothing",
    )
    p.add_argument(
        "--exclude-tools-when-tool-choice-none",
        action="store_true",
        help='vLLM\'s flag: a chat request with tool_choice "none" does not render its tools into the '
        "prompt (by default the chat template renders them; only the answer is not parsed for calls)",
    )
    p.add_argument(
        "--chat-template-content-format",
        default="auto",
        choices=["auto", "string", "openai"],
        help="how a message's content reaches the chat template, as vLLM's flag: 'string' (one string, "
        'its text parts joined by newlines), \'openai\' (a list of {"type": "text", "text"} parts) or '
        "'auto' (default: each template's own, read from the template: the Qwen and Llama templates "
        "read strings, a template that loops over message['content'] reads parts; logged at start-up)",
    )
    p.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='vLLM\'s switch for tool_choice "auto": here --tool-call-parser enables it, and this flag '
        "only checks that one is given",
    )
    p.add_argument(
        "--reasoning-parser",
        default=None,
        choices=["qwen3", "deepseek_r1"],
        help="move <think>...</think> of chat completions into reasoning (and reasoning_content); "
        "the tokenizer must have <think> and </think> as tokens",
    )
    p.add_argument(
        "--return-tokens-as-token-ids",
        action="store_true",
        help="vLLM's flag: name logprob tokens 'token_id:<id>' (chat's token and top_logprobs tokens, "
        "completions' tokens and top_logprobs keys) in requests that leave return_tokens_as_token_ids "
        "unset; a request's own value wins",
    )
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="vLLM's flag: chat and completions usage (streamed too) carries prompt_tokens_details."
        "cached_tokens, the prompt tokens served from the prefix cache",
    )
    p.add_argument(
        "--enable-force-include-usage",
        action="store_true",
        help="vLLM's flag: every chat and completions stream carries the usage whatever its "
        "stream_options ask, as with include_usage and continuous_usage_stats: each chunk the usage "
        "of its choice so far, then a final usage-only chunk (non-streamed answers always carry it)",
    )
    p.add_argument(
        "--enable-tokenizer-info-endpoint",
        action="store_true",
        help="vLLM's flag: serve GET /tokenizer_info (the tokenizer's configuration and the chat "
        "template; open without the API key, as in vLLM)",
    )
    p.add_argument(
        "--enable-server-load-tracking",
        action="store_true",
        help="vLLM's flag: count the requests being served on the generation routes, which GET /load "
        "answers (without it /load answers 0, as in vLLM)",
    )
    p.add_argument(
        "--stream-decode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="FP8 (per-row or 128-column block scales, TP=1): run one-token decode steps through the persistent CUDA stream "
        "kernel instead of one launch per GEMM (default: on; --no-stream-decode turns it off)",
    )
    p.add_argument(
        "--stream-attention",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with the FP8 stream kernel: run each layer's attention inside it too, one launch per one-token "
        "step up to 2048 tokens of context (bf16 or FP8 KV cache, 128-wide heads). Default: wherever it can; "
        "--stream-attention requires it (an error where it cannot run), --no-stream-attention turns it off",
    )
    p.add_argument(
        "--grammar-compile-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="seconds one structured-output grammar may take to compile, in a worker process that is "
        "killed past it; the request then fails (default 60)",
    )
    p.add_argument(
        "--log-interval", type=float, default=10.0, help="seconds between stats log lines (default 10)"
    )
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    p.add_argument(
        "--disable-uvicorn-access-log",
        action="store_true",
        help="vLLM's flag (its access log is on by default): no line per HTTP request, Surge's default; "
        "refused with --access-log",
    )
    p.add_argument(
        "--uvicorn-log-level",
        default=None,
        choices=list(UVICORN_LOG_LEVELS),
        help="vLLM's flag: the level of uvicorn's own lines (its start and stop, protocol errors, and the "
        "--access-log lines, at info) (default: --log-level's)",
    )
    p.add_argument(
        "--disable-web-ui",
        action="store_true",
        help="do not serve the playground (/) and dashboard (/dashboard)",
    )
    p.add_argument(
        "--disable-fastapi-docs",
        action="store_true",
        help="vLLM's flag: do not serve the OpenAPI schema (/openapi.json), Swagger UI (/docs) or "
        "ReDoc (/redoc)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default info)",
    )
    from surge.parallel.cli_args import add_parallel_args

    add_parallel_args(p, serve=True)
    group_options(p, SERVE_HELP_GROUPS)
    p.set_defaults(func=run_serve)


def _read_chat_template(value: str | None, name: str = "--chat-template") -> str | None:
    """The ``--chat-template`` flag's template: a file's text, or the value itself when it
    looks like a Jinja template. Raises ``ValueError`` (one line, starting with ``name``: the
    flag, or the offline ``LLM(chat_template=...)``'s argument) when the file cannot be
    read or is not UTF-8 text, the value is neither, or the template does not parse, so a broken template stops
    the server at start-up instead of failing every chat request."""
    if value is None:
        return None
    path = Path(value)
    try:
        is_file = path.is_file()
    except OSError:  # e.g. an inline template longer than a file name may be
        is_file = False
    if is_file:
        try:
            template = path.read_text()
        except OSError as e:
            raise ValueError(f"{name}: cannot read {value!r}: {e.strerror}") from e
        except UnicodeDecodeError as e:  # a binary file given by mistake
            raise ValueError(f"{name}: {value!r} is not UTF-8 text (byte {e.start}: {e.reason})") from e
    elif "{" in value:
        template = value
    else:
        raise ValueError(f"{name}: {value!r} is neither a file nor a template")
    try:  # the environment transformers renders chat templates with (its own extensions)
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # a transformers without it: the first chat request reports the error
        return template
    try:
        _compile_jinja_template(template)
    except Exception as e:  # noqa: BLE001 - jinja2's TemplateSyntaxError and its relatives
        line = getattr(e, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ValueError(f"{name}: the template does not parse{where}: {e}") from e
    return template


def default_max_connections() -> int:
    """4096 open connections, or fewer to stay 128 below the process's open-file limit."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 4096
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(1, min(4096, soft - 128))


def _list_flag(values: list[str] | None, flag: str) -> tuple[str, ...] | None:
    """Values of a list flag: several words, comma lists, or one JSON list (vLLM's form)."""
    if values is None:
        return None
    out: list[str] = []
    for value in values:
        if value.lstrip().startswith("["):
            try:
                items = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"{flag}: {value!r} is not a JSON list: {e.msg}") from e
            if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
                raise ValueError(f"{flag}: {value!r} is not a JSON list of strings")
            out.extend(items)
        else:
            out.extend(x.strip() for x in value.split(",") if x.strip())
    if not out:
        raise ValueError(f"{flag} needs at least one value")
    return tuple(out)


def cors_options(args: argparse.Namespace) -> CorsOptions | None:
    """The CORS settings of the flags; None (CORS off) unless ``--allowed-origins`` is given.

    Raises:
        ValueError: a CORS flag without ``--allowed-origins``, or a malformed list.
    """
    origins = _list_flag(args.allowed_origins, "--allowed-origins")
    methods = _list_flag(args.allowed_methods, "--allowed-methods")
    headers = _list_flag(args.allowed_headers, "--allowed-headers")
    if origins is None:
        if methods is not None or headers is not None or args.allow_credentials:
            raise ValueError(
                "--allowed-methods, --allowed-headers and --allow-credentials need --allowed-origins"
            )
        return None
    return CorsOptions(origins, methods or ("*",), headers or ("*",), args.allow_credentials)


def check_tokenizer_flag(tokenizer: str | None, model_dir: str) -> None:
    """Take vLLM's ``--tokenizer`` when it is None or names ``model_dir`` (the same folder,
    however spelled, as ``vllm serve M --tokenizer M`` is often written), as the offline
    ``LLM(tokenizer=...)`` takes it.

    Raises:
        ValueError: another folder (one line: Surge reads the model folder's own tokenizer).
    """
    if tokenizer is None:
        return
    if Path(tokenizer).expanduser().resolve() != Path(model_dir).expanduser().resolve():
        raise ValueError(
            f"--tokenizer {tokenizer} is not the model folder {model_dir}: Surge reads the model folder's "
            "own tokenizer; copy the tokenizer files into it and leave --tokenizer out"
        )


def check_listen_flags(args: argparse.Namespace) -> None:
    """Check where to listen and fill in the defaults: ``--host`` 127.0.0.1 and ``--port`` 8000,
    or ``--uds PATH`` alone (vLLM ignores ``--host`` and ``--port`` next to it; here they are
    refused, as is ``--api-server-count`` above 1, whose processes share a TCP port).

    Raises:
        ValueError: one line naming the flag: a port out of range, or ``--uds`` with those flags.
    """
    if args.uds is not None:
        given = [f for f, v in (("--host", args.host), ("--port", args.port)) if v is not None]
        if args.api_server_count > 1:
            given.append(f"--api-server-count {args.api_server_count}")
        if given:
            raise ValueError(
                f"--uds {args.uds}: not with {' or '.join(given)} (a Unix socket is the only address)"
            )
        if not args.uds:
            raise ValueError("--uds needs a socket path")
        return
    if args.host is None:
        args.host = "127.0.0.1"
    if args.port is None:
        args.port = 8000
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")


UVICORN_LOG_LEVELS = {"critical": 50, "error": 40, "warning": 30, "info": 20, "debug": 10, "trace": 5}
"""vLLM's ``--uvicorn-log-level`` choices and their ``logging`` levels (``trace`` is uvicorn's 5)."""


def access_log_flags(args: argparse.Namespace) -> tuple[bool, int | None]:
    """``(access_log, uvicorn_level)``: whether every HTTP request is logged (``--access-log``;
    vLLM's ``--disable-uvicorn-access-log`` asks for Surge's default, none), and the ``logging``
    level of uvicorn's loggers from ``--uvicorn-log-level`` (None: ``--log-level``'s).

    Raises:
        ValueError: ``--access-log`` with ``--disable-uvicorn-access-log`` (one line).
    """
    if args.access_log and args.disable_uvicorn_access_log:
        raise ValueError("--access-log and --disable-uvicorn-access-log contradict each other: give one")
    level = None if args.uvicorn_log_level is None else UVICORN_LOG_LEVELS[args.uvicorn_log_level]
    return args.access_log, level


LIST_FLAGS = ("served_model_name", "api_key", "allowed_origins", "allowed_methods", "allowed_headers")
"""The serve flags that take several values (``--api-key K1 K2``), so that a MODEL after them is
taken for one more value."""


def check_model_not_taken_as_a_value(args: argparse.Namespace) -> None:
    """Refuse a model folder taken as a list flag's value: ``surge serve --served-model-name foo
    /models/qwen`` reads ``/models/qwen`` as a second name and, without MODEL, served the bundled
    model under both names (vLLM refuses a model that is not the first argument).

    Raises:
        ValueError: one line naming the flag and the folder, when neither MODEL nor ``--model`` is
            given and a value of a list flag is an existing folder.
    """
    if args.model_tag is not None or args.model is not None:
        return
    for name in LIST_FLAGS:
        for value in getattr(args, name) or ():
            if value and Path(value).expanduser().is_dir():
                flag = "--" + name.replace("_", "-")
                raise ValueError(
                    f"{flag} took the folder {value!r} as one of its values and no model is given: put "
                    f"MODEL first (surge serve MODEL {flag} ...), as vLLM requires, or pass --model {value}"
                )


def log_requests_flag(args: argparse.Namespace) -> bool:
    """Whether each request's start and end are logged: on unless ``--disable-log-requests`` or
    ``--no-enable-log-requests`` (vLLM 0.26's spelling); ``--enable-log-requests`` asks for it.

    Raises:
        ValueError: ``--enable-log-requests`` with ``--disable-log-requests`` (one line).
    """
    if args.enable_log_requests and args.disable_log_requests:
        raise ValueError("--enable-log-requests and --disable-log-requests contradict each other: give one")
    return not args.disable_log_requests and args.enable_log_requests is not False


def api_key_line(args: argparse.Namespace, count: int) -> str:
    """The start-up line that says an API key is in force, where it came from and which routes
    need it (never the key itself), for ``count`` keys read from the flag or the environment."""
    source = api_keys_source(args.api_key, os.environ.get("SURGE_API_KEY"), os.environ.get("VLLM_API_KEY"))
    open_paths = sorted(OPEN_PATHS - ({"/metrics"} if args.metrics_require_key else set()))
    return (
        f"an API key is required ({count} key{'' if count == 1 else 's'} from {source}): requests need "
        f"'Authorization: Bearer KEY' except on {', '.join(open_paths)} and the web pages"
    )


def run_serve(args: argparse.Namespace) -> int:
    """Run `surge serve` until SIGINT / SIGTERM. Returns the exit code.

    Raises:
        ValueError: a bad flag value or model folder (printed as one line by ``surge.cli``).
    """
    check_model_not_taken_as_a_value(args)
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(f"two models given: {args.model_tag!r} and --model {args.model!r}")
        args.model = args.model_tag
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError(
            "--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json or pythonic), as in vLLM"
        )
    if args.default_chat_template_kwargs is not None:
        from surge.tokenizer import check_chat_template_kwargs

        try:
            check_chat_template_kwargs(args.default_chat_template_kwargs)
        except ValueError as e:
            raise ValueError(f"--default-chat-template-kwargs: {e}") from None
    if args.api_server_count < 1:
        raise ValueError(f"--api-server-count must be at least 1, got {args.api_server_count}")
    if args.stream_interval < 1:
        raise ValueError(f"--stream-interval must be at least 1, got {args.stream_interval}")
    check_listen_flags(args)
    if args.root_path is not None and not re.fullmatch(r"(/[^/\s?#]+)+", args.root_path.rstrip("/") or "/x"):
        raise ValueError(
            f"--root-path must be a path such as /api (a leading /, no ?, # or spaces), got {args.root_path!r}"
        )
    if args.log_interval <= 0:
        raise ValueError(f"--log-interval must be positive, got {args.log_interval}")
    for name in args.served_model_name or ():
        if not name.strip() or name != name.strip():
            raise ValueError(
                f"--served-model-name {name!r}: a name must be non-empty, without surrounding spaces"
            )
    if args.max_connections is None:
        args.max_connections = default_max_connections()
    for flag in (
        "max_request_body_bytes",
        "max_connections",
        "max_stop_strings",
        "max_stop_string_length",
        "max_choices_per_request",
    ):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    for flag in (
        "header_read_timeout",
        "body_read_timeout",
        "engine_stall_timeout",
        "sse_queued_interval",
        "grammar_compile_timeout",
    ):
        value = getattr(args, flag)
        if not 0 < value < float("inf"):
            raise ValueError(f"--{flag.replace('_', '-')} must be a positive number of seconds, got {value}")
    if not args.shutdown_timeout >= 0:
        raise ValueError(f"--shutdown-timeout must be non-negative, got {args.shutdown_timeout}")
    log_requests = log_requests_flag(args)
    access_log, uvicorn_level = access_log_flags(args)
    api_keys = parse_api_keys(args.api_key, os.environ.get("SURGE_API_KEY"), os.environ.get("VLLM_API_KEY"))
    cors = cors_options(args)
    from surge.server.tls import tls_options

    tls = tls_options(
        args.ssl_keyfile, args.ssl_certfile, args.ssl_ca_certs, args.ssl_cert_reqs, args.ssl_ciphers
    )
    from surge.cli import check_model_dir

    # before torch is imported: a wrong path fails at once
    check_model_dir(args.model, args.load_format, flag="MODEL" if args.model_tag is not None else "--model")
    level = getattr(logging, args.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s [%(name)s] %(message)s")
    if api_keys:
        logging.getLogger("surge.server").info("%s", api_key_line(args, len(api_keys)))
    from surge.engine.cli_args import enforce_eager, gpu_memory_utilization, unused_on_cpu
    from surge.engine.llm_engine import build_engine_config
    from surge.parallel.cli_args import parallel_kwargs, serve_device
    from surge.server.api_server import ServeOptions, run_server
    from surge.server.listen import bind_reuseport, bind_socket, bind_unix
    from surge.tokenizer import load_tokenizer

    config = build_engine_config(
        args.model,
        dtype=args.dtype,
        load_format=args.load_format,
        seed=args.seed,
        device=serve_device(args),
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        gpu_memory_utilization=gpu_memory_utilization(args),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        scheduling_policy=args.scheduling_policy,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        enforce_eager=enforce_eager(args),
        async_scheduling=args.async_scheduling,
        **parallel_kwargs(args),
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        generation_config=args.generation_config,
        hf_overrides=args.hf_overrides,
        override_generation_config=args.override_generation_config,
        stream_decode=args.stream_decode,
        stream_attention=args.stream_attention,
        grammar_compile_timeout=args.grammar_compile_timeout,
    )
    check_tokenizer_flag(args.tokenizer, config.model.model)
    if (unused := unused_on_cpu(args, config.device)) is not None:
        logging.getLogger("surge.server").warning("%s", unused)
    if config.parallel.node_rank > 0:  # a worker-only host of a multi-host group
        from surge.parallel.node import run_worker_node

        return run_worker_node(config, log_level=level)
    tokenizer = load_tokenizer(config.model.model)  # fail fast on a folder without a tokenizer
    if args.reasoning_parser is not None:  # what a request's thinking_token_budget counts and forces
        from dataclasses import replace

        from surge.server.parsers import reasoning_tokens

        config = replace(config, reasoning_tokens=reasoning_tokens(tokenizer, args.reasoning_parser))
    options = ServeOptions(
        host=args.host or "127.0.0.1",  # None with --uds, whose socket run_server is given
        port=args.port or 0,
        served_model_names=tuple(args.served_model_name or ()),
        api_keys=api_keys,
        stream_interval=args.stream_interval,
        chat_template=_read_chat_template(args.chat_template),
        trust_request_chat_template=args.trust_request_chat_template,
        chat_template_content_format=args.chat_template_content_format,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        log_interval=args.log_interval,
        access_log=access_log,
        uvicorn_log_level=uvicorn_level,
        engine_log_level=level,
        metrics_require_key=args.metrics_require_key,
        metrics_prefix=args.metrics_prefix,
        keep_alive_on_engine_death=args.keep_alive_on_engine_death,
        max_request_body_bytes=args.max_request_body_bytes,
        header_read_timeout=args.header_read_timeout,
        body_read_timeout=args.body_read_timeout,
        max_connections=args.max_connections,
        engine_stall_timeout=args.engine_stall_timeout,
        sse_queued_interval=args.sse_queued_interval,
        max_stop_strings=args.max_stop_strings,
        max_stop_string_length=args.max_stop_string_length,
        max_choices_per_request=args.max_choices_per_request,
        web_ui=not args.disable_web_ui,
        cors=cors,
        tls=tls,
        shutdown_timeout=args.shutdown_timeout,
        log_requests=log_requests,
        api_server_count=args.api_server_count,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_tokenizer_info_endpoint=args.enable_tokenizer_info_endpoint,
        enable_server_load_tracking=args.enable_server_load_tracking,
        enable_force_include_usage=args.enable_force_include_usage,
        disable_fastapi_docs=args.disable_fastapi_docs,
        response_role=args.response_role,
        default_chat_template_kwargs=args.default_chat_template_kwargs or None,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        root_path=(args.root_path or "").rstrip("/"),
    )
    if args.api_server_count > 1:
        from surge.server.api_workers import serve_with_api_workers

        sock = bind_reuseport(args.host, args.port, check_free=True)
        try:
            return serve_with_api_workers(config, options, sock)
        finally:
            sock.close()
    sock = bind_unix(args.uds) if args.uds is not None else bind_socket(args.host, args.port)
    try:
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvloop is optional
            loop_factory = None
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(run_server(config, options, sock, tokenizer=tokenizer))
    finally:
        sock.close()
        if args.uds is not None:
            Path(args.uds).unlink(missing_ok=True)
