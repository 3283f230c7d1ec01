"""``surge bench serve``: run one serving benchmark against an OpenAI-compatible server.

Flow (vLLM ``bench serve``): ask ``/v1/models`` (again every 5 s while the server is not up, for up to
``ready_check_timeout_s``, vLLM's ``--ready-check-timeout-sec``); build the prompts; send ``warmup`` untimed requests
one after another (prompts from another seed, same input length, at most 32 output tokens; a failed
warm-up aborts the run); then take ``t0 = perf_counter()`` and release the requests (all at once for
``request_rate = inf``, else at gamma-distributed gaps of mean ``1/request_rate`` and shape
``burstiness``, Poisson for 1.0, the first request's included, scaled so that the last request is
released at exactly ``num_prompts / request_rate`` s, as vLLM: :func:`arrival_offsets`; a timed
trace's at their rows' timestamps, vLLM's ``--self-timed``: :func:`trace_offsets`), never before their
time, each waiting on the ``max_concurrency`` semaphore before its own clock starts; ``duration`` ends when the last
request ends. Results are validated (exact output length when asked), aggregated by
:mod:`surge.bench.metrics`, and returned as a vLLM-style result dict.

Prompt length reported per request (``input_lens``, ``total_input_tokens``): the server's
``usage.prompt_tokens`` when it sends usage, else the dataset's count. On the chat endpoint random
prompts are built so that the *templated* prompt has exactly ``--input-len`` tokens (the template's
role headers count, and so do the ``--extra-body`` fields that change the prompt, such as
``chat_template_kwargs``), so ``usage.prompt_tokens == --input-len`` on both endpoints.

Per-request lists in the result use vLLM's names: ``input_lens``, ``output_lens``, ``ttfts``,
``itls``, ``latencies`` (E2EL), ``start_times``, ``queue_times`` (time waited on the concurrency
semaphore), ``errors``; ``generated_texts`` with ``save_detailed``.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import sys
import time
import urllib.error
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
from tqdm import tqdm

from surge.bench.client import CHAT_ENDPOINT, RequestInput, check_route, is_chat_route, send_request
from surge.bench.datasets import (
    SampleRequest,
    burstgpt_requests,
    custom_requests,
    least_prompt_len,
    prefix_repetition_requests,
    random_requests,
    range_bounds,
    sharegpt_requests,
    sonnet_requests,
    special_tokens_added,
)
from surge.bench.hf_datasets import DEFAULT_SPLIT, check_local_path, hf_dataset_kind, hf_requests
from surge.bench.metrics import LATENCY_METRICS, RequestResult, compute_metrics, metrics_to_json
from surge.bench.question_datasets import spec_bench_requests
from surge.bench.roofline import (
    DTYPE_BYTES,
    Hardware,
    check_fp8_support,
    context_warning,
    load_config,
    model_shape,
    point_roofline,
)
from surge.bench.timed_trace import TimedTraceOptions, replay_note, timed_trace_requests
from surge.bench.tokens import (
    TokenCounter,
    get_json,
    is_tokenizer_dir,
    max_model_len_of,
    prompt_options,
    resolve_counter,
)
from surge.quant.config import kv_cache_dtype_name

T = TypeVar("T")
MAX_REQUEST_ID_LEN = 256  # the longest X-Request-Id the server takes (surge.server.request_id's limit)
DATASETS = (
    "random",
    "sharegpt",
    "custom",
    "prefix_repetition",
    "sonnet",
    "burstgpt",
    "timed_trace",
    "spec_bench",
    "hf",
)
FILE_DATASETS = {
    "sharegpt": "a ShareGPT JSON file",
    "custom": "a JSONL file of prompts",
    "sonnet": "a text file whose lines the prompts are drawn from",
    "burstgpt": "a BurstGPT CSV file",
    "spec_bench": 'a question JSONL file, one {"turns": [...], "category": ...} object a line',
    "hf": "a local copy of the Hugging Face dataset --hf-name names: a JSON or JSONL file, or a folder of them",
    "timed_trace": "a JSONL request trace, one row a line with its timestamp, lengths and hash_ids",
}
"""The datasets read from ``--dataset-path``, and what the file is."""
FILE_DATASET_NAMES = "sharegpt, custom, sonnet, burstgpt, spec_bench, hf or timed_trace"
WARMUP_SEED_OFFSET = 1_000_003  # warm-up prompts come from another stream than the timed ones
WARMUP_MAX_OUTPUT = 32
WARMUP_INPUT_LEN = 32
"""Prompt tokens of a warm-up request of a dataset other than random (whose warm-ups take its
``--input-len``), or the chat template's least prompt where that is longer (Llama 3.1's: 36)."""


_OWN_FIELDS: dict[str, str] = {
    "model": "give --model",
    "messages": "the prompts come from --dataset",
    "prompt": "the prompts come from --dataset",
    "max_tokens": "give --output-len",
    "max_completion_tokens": "give --output-len",
    "stream": "it always streams (TTFT and ITL are measured on the stream)",
    "stream_options": "it always asks for usage",
}
"""Request fields the client sets (:func:`surge.bench.client.build_payload`) that ``--extra-body``
may not replace: a body would otherwise carry two lengths (the server takes
``max_completion_tokens``), or stop streaming."""


@dataclass(frozen=True)
class ServeConfig:
    """Everything one benchmark run needs. Lengths in tokens, times in seconds, rate in requests/s."""

    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = CHAT_ENDPOINT
    # vLLM's --disable-shuffle: sharegpt, custom, hf, spec_bench and prefix_repetition prompts in
    # their file's (prefix_repetition: their prefixes') order instead of the seed's shuffle
    disable_shuffle: bool = False
    # vLLM's --model with --served-model-name (then ``model``): the result's model_id and, when a
    # local folder, the tokenizer's vocabulary; None: ``model``
    model_id: str | None = None
    # vLLM's --no-oversample: a sharegpt, custom, hf or spec_bench file with fewer usable prompts than
    # num_prompts sends those (without it the run is refused, where vLLM would send some twice)
    no_oversample: bool = False
    # vLLM's --backend as given (openai, vllm or openai-chat), recorded as the result's backend;
    # None: the endpoint's, openai-chat or openai
    backend: str | None = None
    model: str | None = None  # default: the first model of /v1/models
    tokenizer: str | None = None  # local tokenizer folder; default: the server's /tokenize
    dataset: str = "random"
    dataset_path: str | None = None
    input_len: int = 256
    output_len: int = 256
    # the flags the user gave input_len and output_len with, which errors name: vLLM's
    # --random-input-len and a dataset's own output length (--random-output-len,
    # --sonnet-output-len, ...) are other spellings of them
    input_len_flag: str = "--input-len"
    output_len_flag: str = "--output-len"
    # --dataset random: per-request lengths uniform in [L (1 - r), L (1 + r)] (vLLM's option); 0: exact
    random_range_ratio: float = 0.0
    # --dataset random: the output lengths' own ratio (vLLM's '{"input": r, "output": r2}'); None: random_range_ratio
    random_output_range_ratio: float | None = None
    # --dataset sharegpt: every request asks this many tokens; None: each reply's length (vLLM)
    sharegpt_output_len: int | None = None
    # --dataset random: a prefix of this many tokens shared by every prompt, before its input_len (vLLM)
    random_prefix_len: int = 0
    # --dataset custom (vLLM's): output tokens of every request, or -1: each line's output_tokens
    custom_output_len: int = 256
    # --dataset custom on /v1/completions: send the prompt as it is, not rendered with the chat template
    skip_chat_template: bool = False
    # --dataset custom on /v1/completions: the template variables the prompt is rendered with (vLLM's)
    chat_template_kwargs: dict[str, Any] | None = None
    # --dataset prefix_repetition (vLLM's): prompts of prefix + suffix tokens over num_prefixes prefixes;
    # each asks output_len tokens
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    # --dataset sonnet (vLLM's): prompts of up to sonnet_input_len tokens whose first lines (about
    # sonnet_prefix_len tokens with the instruction) are shared; each asks output_len tokens
    sonnet_input_len: int = 550
    sonnet_input_len_flag: str = "--sonnet-input-len"  # the flag it was given with (--input-len sets it too)
    sonnet_prefix_len: int = 200
    # --dataset timed_trace (vLLM's --timed-trace-* flags): how the trace's rows are read and timed
    timed_trace: TimedTraceOptions = TimedTraceOptions()
    # vLLM's --self-timed: send each request at its trace row's timestamp instead of on the
    # --request-rate schedule (only with --dataset timed_trace, where the CLI turns it on by default)
    self_timed: bool = False
    # --dataset spec_bench (vLLM's): only the questions of this category; None: all
    spec_bench_category: str | None = None
    # --dataset hf (vLLM's): the hub id of the local copy at dataset_path (None: dataset_path is the id),
    # its split (None: train) and subset; each request's output tokens (None: the dataset's default)
    hf_name: str | None = None
    hf_split: str | None = None
    hf_subset: str | None = None
    hf_output_len: int | None = None
    num_prompts: int = 16
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    # vLLM's --ramp-up-strategy (linear or exponential) from --ramp-up-start-rps to --ramp-up-end-rps
    ramp_up_strategy: str | None = None
    ramp_up_start_rps: int | None = None
    ramp_up_end_rps: int | None = None
    seed: int = 0
    ignore_eos: bool = True
    exact_length: bool = True
    warmup: int = 1
    # vLLM's --num-warmups: untimed copies of the first timed request, sent at once before the run
    num_warmups: int = 0
    percentiles: tuple[float, ...] = (99.0,)
    # the latencies whose mean, median, std and percentiles are reported (vLLM's --percentile-metrics)
    percentile_metrics: tuple[str, ...] = LATENCY_METRICS
    goodput: tuple[tuple[str, float], ...] = ()  # (metric, ms) SLOs
    api_key: str | None = None
    # vLLM's --header KEY=VALUE pairs: sent with every call to the server, replacing a header of that name
    headers: tuple[tuple[str, str], ...] = ()
    insecure: bool = False  # vLLM's --insecure: no TLS certificate check of an https server
    save_detailed: bool = False
    hardware: Hardware | None = None
    model_config: str | None = None  # config.json or folder for the roofline; default: a known local folder
    roofline_tp: int = 1  # the server's tensor-parallel size, for a per-GPU roofline
    roofline_dtype: str | None = None  # the server's weight dtype (e.g. "fp8"); default the config's
    roofline_kv_cache_dtype: str | None = None  # "auto" (the model's) or "fp8"; default auto
    disable_tqdm: bool = False
    request_timeout_s: float = 6 * 3600.0
    # vLLM's --ready-check-timeout-sec: wait up to this long for a server that is not up yet; 0: ask once
    ready_check_timeout_s: float = 0.0
    temperature: float | None = None  # None: send no temperature (the server's default), as vLLM
    extra_body: dict[str, Any] | None = None  # merged into every request body (e.g. {"top_k": 1})
    label: str | None = None  # vLLM's --label: the result's label (null without it, as vLLM)
    # timed request i sends X-Request-Id PREFIX{i} (vLLM's --request-id-prefix); None: a fresh bench-XXXXXXXX-
    request_id_prefix: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # copied into the result (e.g. matrix point info)
    # vLLM's --metadata KEY=VALUE: (key, value) strings recorded in the result (see apply_metadata)
    metadata: tuple[tuple[str, str], ...] = ()

    def validate(self) -> None:
        """Raises ValueError with a one-line message on a bad value."""
        if self.dataset not in DATASETS:
            raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        if self.dataset in FILE_DATASETS and not self.dataset_path:
            raise ValueError(
                f"--dataset {self.dataset} needs --dataset-path FILE ({FILE_DATASETS[self.dataset]})"
            )
        if self.dataset_path is not None and self.dataset not in FILE_DATASETS:
            raise ValueError(f"--dataset-path applies to --dataset {FILE_DATASET_NAMES}, not {self.dataset}")
        if self.sonnet_input_len < 1:
            raise ValueError(f"--sonnet-input-len must be >= 1, got {self.sonnet_input_len}")
        if self.sonnet_prefix_len < 0:
            raise ValueError(f"--sonnet-prefix-len must be >= 0, got {self.sonnet_prefix_len}")
        if self.dataset != "timed_trace" and self.timed_trace != TimedTraceOptions():
            raise ValueError("the --timed-trace-* options apply to --dataset timed_trace")
        self.timed_trace.validate()
        if self.self_timed:
            self._validate_self_timed()
        if self.spec_bench_category is not None and self.dataset != "spec_bench":
            raise ValueError("--spec-bench-category applies to --dataset spec_bench")
        hf = {
            "--hf-name": self.hf_name,
            "--hf-split": self.hf_split,
            "--hf-subset": self.hf_subset,
            "--hf-output-len": self.hf_output_len,
        }
        for flag, value in hf.items():
            if value is not None and self.dataset != "hf":
                raise ValueError(f"{flag} applies to --dataset hf")
        if self.hf_output_len is not None and self.hf_output_len < 1:
            raise ValueError(f"--hf-output-len must be >= 1, got {self.hf_output_len}")
        if self.dataset == "hf" and self.dataset_path:
            hf_dataset_kind(self.dataset_path, self.hf_name)
            check_local_path(self.dataset_path, self.hf_name)
        if self.dataset == "burstgpt" and self.seed >= 2**32:
            raise ValueError(
                f"--seed must be below 2**32 with --dataset burstgpt (vLLM's row pick), got {self.seed}"
            )
        if self.random_prefix_len < 0:
            raise ValueError(f"--random-prefix-len must be >= 0, got {self.random_prefix_len}")
        if self.random_prefix_len and self.dataset != "random":
            raise ValueError("--random-prefix-len applies to --dataset random")
        if self.custom_output_len != -1 and self.custom_output_len < 1:
            raise ValueError(
                f"--custom-output-len must be >= 1, or -1 for each line's output_tokens, got {self.custom_output_len}"
            )
        if self.skip_chat_template and self.dataset not in ("custom", "hf"):
            raise ValueError("--skip-chat-template applies to --dataset custom or hf")
        if self.chat_template_kwargs is not None:
            if self.dataset != "custom":
                raise ValueError(
                    "--chat-template-kwargs applies to --dataset custom (prompts the benchmark renders with "
                    """the chat template); for the server's rendering use --extra-body '{"chat_template_kwargs": ...}'"""
                )
            if is_chat_route(self.endpoint):
                raise ValueError(
                    "--chat-template-kwargs renders custom prompts for /v1/completions; on the chat endpoint "
                    """the server applies the template: use --extra-body '{"chat_template_kwargs": ...}'"""
                )
            if self.skip_chat_template:
                raise ValueError(
                    "--chat-template-kwargs and --skip-chat-template: the template is skipped (give one)"
                )
        for flag, value in (
            ("--prefix-repetition-prefix-len", self.prefix_repetition_prefix_len),
            ("--prefix-repetition-suffix-len", self.prefix_repetition_suffix_len),
            ("--prefix-repetition-num-prefixes", self.prefix_repetition_num_prefixes),
        ):
            if value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
        if self.dataset == "prefix_repetition" and self.num_prompts < self.prefix_repetition_num_prefixes:
            raise ValueError(
                f"--num-prompts {self.num_prompts} is below --prefix-repetition-num-prefixes "
                f"{self.prefix_repetition_num_prefixes} (every prefix needs a prompt)"
            )
        check_route(self.endpoint)
        for flag, value in ((self.input_len_flag, self.input_len), (self.output_len_flag, self.output_len)):
            if value < 1:  # the CLI refuses a length flag below 1 of any dataset first, naming it
                raise ValueError(f"{flag} must be >= 1, got {value}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        for ratio in (self.random_range_ratio, self.output_range_ratio):
            if not 0.0 <= ratio < 1.0:
                raise ValueError(f"--random-range-ratio must be in [0, 1), got {ratio}")
        if (self.random_range_ratio or self.output_range_ratio) and self.dataset != "random":
            raise ValueError("--random-range-ratio applies to --dataset random")
        if self.sharegpt_output_len is not None and self.dataset != "sharegpt":
            raise ValueError("--sharegpt-output-len applies to --dataset sharegpt")
        if self.sharegpt_output_len is not None and self.sharegpt_output_len < 1:
            raise ValueError(f"--sharegpt-output-len must be >= 1, got {self.sharegpt_output_len}")
        if self.roofline_tp < 1:
            raise ValueError(f"--roofline-tp must be >= 1, got {self.roofline_tp}")
        if self.roofline_tp > 1 and self.hardware is not None and not self.hardware.link_bandwidth > 0:
            raise ValueError(f"--roofline-tp: no GPU link bandwidth known for {self.hardware.name}")
        dtype = self.roofline_dtype
        if dtype is not None and dtype != "auto" and dtype.removeprefix("torch.") not in DTYPE_BYTES:
            raise ValueError(
                f"--roofline-dtype must be auto or one of {', '.join(DTYPE_BYTES)}, got {dtype!r}"
            )
        if self.roofline_kv_cache_dtype is not None:
            try:
                kv_cache_dtype_name(self.roofline_kv_cache_dtype)
            except ValueError as e:
                raise ValueError(f"--roofline-kv-cache-dtype: {e}") from None
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("--max-concurrency must be >= 1")
        if not self.request_rate > 0:
            raise ValueError("--request-rate must be > 0 (or inf)")
        self._validate_ramp_up()
        if not self.burstiness > 0:  # inf: evenly spaced arrivals, as vLLM
            raise ValueError(f"--burstiness must be > 0 (or inf: evenly spaced), got {self.burstiness:g}")
        if self.burstiness != 1.0 and math.isinf(self.request_rate) and self.ramp_up_strategy is None:
            raise ValueError(
                "--burstiness shapes the gaps of --request-rate R (or of --ramp-up-strategy); without either "
                "every request is sent at once"
            )
        if not (self.request_timeout_s > 0 and math.isfinite(self.request_timeout_s)):
            raise ValueError(
                f"--request-timeout must be > 0 and finite (seconds), got {self.request_timeout_s:g}"
            )
        if not (self.ready_check_timeout_s >= 0 and math.isfinite(self.ready_check_timeout_s)):
            raise ValueError(
                f"--ready-check-timeout-sec must be >= 0 and finite (seconds), got {self.ready_check_timeout_s:g}"
            )
        if self.warmup < 0:
            raise ValueError("--warmup must be >= 0")
        if self.num_warmups < 0:
            raise ValueError(f"--num-warmups must be >= 0, got {self.num_warmups}")
        bad = [name for name in self.percentile_metrics if name not in LATENCY_METRICS]
        if bad or not self.percentile_metrics:
            raise ValueError(
                f"--percentile-metrics takes names from {','.join(LATENCY_METRICS)}, got {','.join(bad) or 'none'}"
            )
        prefix = self.request_id_prefix
        if prefix is not None:
            longest = len(prefix) + len(str(self.num_prompts - 1))
            if not ((prefix + "0").isprintable() and prefix.isascii() and prefix == prefix.lstrip()):
                raise ValueError(
                    f"--request-id-prefix {prefix!r}: a request id is printable ASCII without leading spaces"
                )
            if longest > MAX_REQUEST_ID_LEN:
                raise ValueError(
                    f"--request-id-prefix is {len(prefix)} characters: the ids would be up to {longest}, "
                    f"over the {MAX_REQUEST_ID_LEN} a server takes"
                )
        if self.temperature is not None and not self.temperature >= 0:
            raise ValueError(f"--temperature must be >= 0, got {self.temperature}")
        clash = sorted(set(self.extra_body or ()) & set(_OWN_FIELDS))
        if clash:
            raise ValueError(
                f"--extra-body sets {clash[0]!r}, which the benchmark sends itself: {_OWN_FIELDS[clash[0]]}"
            )
        n = (self.extra_body or {}).get("n", 1)
        if n != 1 or type(n) is not int:  # the client fails a stream of several choices
            raise ValueError(
                f"--extra-body sets 'n' to {n!r}: the benchmark times one choice per request (give no n)"
            )
        prompt_options(self.extra_body, is_chat_route(self.endpoint))  # the prompt fields' types
        if self.model_config is not None:  # read now, not after a run whose results it would lose
            shape = model_shape(
                load_config(self.model_config),
                self.roofline_dtype,
                self.roofline_tp,
                self.roofline_kv_cache_dtype,
            )
            if self.hardware is not None:
                check_fp8_support(shape.fp8_matmul_params > 0, self.hardware, "--roofline-dtype")
        elif self.hardware is not None:  # the model folder is found after the run starts
            fp8 = dtype is not None and dtype.removeprefix("torch.") == "fp8"
            check_fp8_support(fp8, self.hardware, "--roofline-dtype")

    @property
    def output_range_ratio(self) -> float:
        """The ratio the output lengths of ``--dataset random`` are drawn with."""
        if self.random_output_range_ratio is None:
            return self.random_range_ratio
        return self.random_output_range_ratio

    def _validate_self_timed(self) -> None:
        """vLLM's ``--self-timed``: the trace's timestamps set the arrivals, so the flags of the
        ``--request-rate`` schedule are refused (vLLM ignores them)."""
        if self.dataset != "timed_trace":
            raise ValueError("--self-timed applies to --dataset timed_trace (as vLLM)")
        given = [
            flag
            for flag, on in (
                ("--request-rate", not math.isinf(self.request_rate)),
                ("--burstiness", self.burstiness != 1.0),
                ("--ramp-up-strategy", self.ramp_up_strategy is not None),
            )
            if on
        ]
        if given:
            raise ValueError(
                f"{given[0]}: --dataset timed_trace sends each request at its row's timestamp (--self-timed, "
                "the default; vLLM ignores the rate then); give --no-self-timed to send the trace's requests "
                f"on the {given[0]} schedule instead"
            )

    def _validate_ramp_up(self) -> None:
        start, end = self.ramp_up_start_rps, self.ramp_up_end_rps
        if self.ramp_up_strategy is None:
            if start is not None or end is not None:
                raise ValueError("--ramp-up-start-rps and --ramp-up-end-rps apply with --ramp-up-strategy")
            return
        if self.ramp_up_strategy not in RAMP_UP_STRATEGIES:
            raise ValueError(
                f"--ramp-up-strategy must be one of {', '.join(RAMP_UP_STRATEGIES)}, got {self.ramp_up_strategy!r}"
            )
        if not math.isinf(self.request_rate):
            raise ValueError("--ramp-up-strategy sets the request rate: give no --request-rate (as vLLM)")
        if start is None or end is None:
            raise ValueError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
        if start < 1:  # vLLM takes 0 and then fails on the first request's rate of 0
            raise ValueError(f"--ramp-up-start-rps must be >= 1, got {start}")
        if end < start:
            raise ValueError(f"--ramp-up-end-rps {end} is below --ramp-up-start-rps {start}")

    def ramp_up(self) -> RampUp | None:
        """The ramp-up of a validated config, or None without ``--ramp-up-strategy``."""
        if self.ramp_up_strategy is None:
            return None
        assert self.ramp_up_start_rps is not None and self.ramp_up_end_rps is not None
        return RampUp(self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps)


READY_CHECK_INTERVAL_S = 5.0
"""Seconds between two asks of ``/v1/models`` while waiting for a server (vLLM's ready check's 5 s)."""

NOT_UP_STATUSES = (502, 503, 504)
"""HTTP statuses of a server (or a proxy before it) that is not up yet: worth asking again."""


def server_not_up_yet(e: BaseException) -> bool:
    """Does this error of a ``GET`` say that the server is not up yet (nothing listens, the
    connection was reset or timed out, a 502/503/504), so that asking again later may work? A 401,
    a 404 or an answer that is not JSON says no."""
    if isinstance(e, urllib.error.HTTPError):
        return e.code in NOT_UP_STATUSES
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    return isinstance(reason, (ConnectionError, TimeoutError))


def fetch_models(
    base_url: str,
    api_key: str | None,
    insecure: bool = False,
    wait_s: float = 0.0,
    interval_s: float | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    """The server's ``GET /v1/models`` answer (``insecure``: no TLS certificate check; ``headers``:
    vLLM's ``--header`` pairs).

    With ``wait_s`` > 0 (vLLM's ``--ready-check-timeout-sec``) a server that is not up yet
    (:func:`server_not_up_yet`) is asked again every ``interval_s``
    seconds (default :data:`READY_CHECK_INTERVAL_S`) until ``wait_s`` seconds have passed, with a
    note on stderr.

    Raises:
        ValueError: it cannot be reached (in time), saying what to do when nothing listens there,
            or when the key was refused; ``base_url`` cannot be opened (``http.client.InvalidURL``:
            a space, a port that is not a number); or it lists no model.
    """
    interval = READY_CHECK_INTERVAL_S if interval_s is None else interval_s
    deadline = time.monotonic() + wait_s
    noted = False
    while True:
        try:
            ans = get_json(f"{base_url.rstrip('/')}/v1/models", api_key, insecure=insecure, headers=headers)
            break
        except (OSError, ValueError, http.client.InvalidURL) as e:  # InvalidURL: a space, a bad port
            remaining = deadline - time.monotonic()
            if remaining > 0 and server_not_up_yet(e):
                if not noted:
                    print(
                        f"surge: note: {base_url}/v1/models is not up yet ({e}); asking again every "
                        f"{interval:g} s for up to {wait_s:g} s (--ready-check-timeout-sec)",
                        file=sys.stderr,
                        flush=True,
                    )
                    noted = True
                time.sleep(min(interval, remaining))
                continue
            raise _unreachable(base_url, api_key, e, wait_s, headers) from None
    if not isinstance(ans, dict) or not ans.get("data"):
        raise ValueError(f"{base_url}/v1/models lists no model")
    data = ans["data"]
    if not isinstance(data, list) or not all(
        isinstance(e, dict) and isinstance(e.get("id"), str) for e in data
    ):
        raise ValueError(f"{base_url}/v1/models answered no list of models with ids: {json.dumps(ans)[:200]}")
    return ans


def _unreachable(
    base_url: str,
    api_key: str | None,
    e: BaseException,
    wait_s: float,
    headers: tuple[tuple[str, str], ...] = (),
) -> ValueError:
    """The one-line error of a ``/v1/models`` that could not be read (a 401's hint names the
    ``--header`` pair that replaced ``--api-key``'s ``Authorization``, when there is one)."""
    hint = ""
    auth = next((name for name, _ in headers if name.lower() == "authorization"), None)
    if "401" in str(e) and auth is not None:
        hint = f" (check --header {auth}=...)"
    elif "401" in str(e):
        hint = (
            " (pass --api-key or set $OPENAI_API_KEY)"
            if api_key is None
            else " (check --api-key or $OPENAI_API_KEY)"
        )
    elif "404" in str(e) and base_url.rstrip("/").endswith("/v1"):
        hint = f" (--base-url is the server's root: {base_url.rstrip('/')[: -len('/v1')]})"
    elif isinstance(getattr(e, "reason", e), ConnectionRefusedError):
        hint = (
            " (no server listens there: start one, e.g. `surge serve MODEL`, or point --base-url, "
            "or --host and --port, at the running one)"
        )
    if wait_s > 0 and server_not_up_yet(e):
        hint += f" (still after --ready-check-timeout-sec {wait_s:g})"
    return ValueError(f"cannot reach {base_url}/v1/models: {e}{hint}")


def model_entry(models: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The ``/v1/models`` entry of ``model`` (the first one when None).

    Raises:
        ValueError: the server does not serve ``model`` (the message lists what it serves).
    """
    for entry in models["data"]:
        if model is None or entry.get("id") == model:
            return dict(entry)
    served = ", ".join(repr(e.get("id")) for e in models["data"])
    raise ValueError(f"the server does not serve model {model!r}; it serves {served}")


RAMP_UP_STRATEGIES = ("linear", "exponential")


@dataclass(frozen=True)
class RampUp:
    """vLLM's ``--ramp-up-strategy``: the request rate (requests/s) goes from ``start_rps`` for the
    first request to ``end_rps`` for the last, linearly or geometrically in the request's index."""

    strategy: str  # one of RAMP_UP_STRATEGIES
    start_rps: int
    end_rps: int

    def rates(self, n: int) -> list[float]:
        """The rate (requests/s) of the gap before each of ``n`` requests."""
        out = []
        for i in range(n):
            progress = i / max(n - 1, 1)
            if self.strategy == "linear":
                out.append(self.start_rps + (self.end_rps - self.start_rps) * progress)
            else:
                out.append(self.start_rps * (self.end_rps / self.start_rps) ** progress)
        return out


def arrival_offsets(
    n: int, rate: float, burstiness: float, rng: np.random.Generator, ramp_up: RampUp | None = None
) -> list[float]:
    """Seconds after the run's ``t0`` at which each of ``n`` requests is released (vLLM's
    ``get_request``).

    ``rate`` inf releases all at 0. Otherwise every request, the first included, waits a
    gamma(shape=``burstiness``, mean ``1/rate``) gap after the one before, and the cumulative
    schedule is scaled so that the last release is at exactly ``n / rate`` s: runs of any seed
    span the same time, so their throughputs compare. With ``ramp_up`` (``rate`` is then unused)
    the gap before request i has the mean ``1 / ramp_up.rates(n)[i]`` and nothing is scaled.
    ``burstiness`` inf makes every gap exactly its mean (evenly spaced arrivals, vLLM's limit of
    the gamma gaps).
    """
    if ramp_up is None and math.isinf(rate):
        return [0.0] * n
    rates = np.asarray(ramp_up.rates(n) if ramp_up is not None else [rate] * n, dtype=np.float64)
    if math.isinf(burstiness):
        gaps = 1.0 / rates
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness), size=n)
    offsets = np.cumsum(gaps)
    if ramp_up is None and n and offsets[-1] > 0:
        offsets *= (n / rate) / offsets[-1]
    return [float(t) for t in offsets]


def rps_change_events(ramp_up: RampUp, n: int, released: Sequence[float]) -> list[dict[str, Any]]:
    """vLLM's ``rps_change_events`` of a ramp-up: ``{"rps": r, "timestamp": ISO time}`` for the start
    rate, then for every whole rate reached, stamped with the release of the first request that
    reached it (``released``: each request's release, seconds since the epoch)."""
    events = [{"rps": ramp_up.start_rps, "timestamp": datetime.fromtimestamp(released[0]).isoformat()}]
    last = ramp_up.start_rps
    for rate, at in zip(ramp_up.rates(n), released, strict=True):
        whole = int(rate)
        if whole > last:
            stamp = datetime.fromtimestamp(at).isoformat()
            events.extend({"rps": r, "timestamp": stamp} for r in range(last + 1, whole + 1))
            last = whole
    return events


def trace_offsets(samples: Sequence[SampleRequest]) -> list[float]:
    """vLLM's ``--self-timed`` schedule: each request leaves at its sample's ``timestamp`` (seconds
    after the run's ``t0``; the trace's times are not shifted, so a trace whose first row is at 5 s
    waits 5 s first), in the samples' order: a row timed before the one above it leaves right
    after it (as vLLM).

    Raises:
        ValueError: a sample without a timestamp.
    """
    times = [s.timestamp for s in samples]
    if any(t is None for t in times):
        raise ValueError("--self-timed needs a timestamp on every request (--dataset timed_trace)")
    return [float(t) for t in times if t is not None]


async def _arrivals(
    items: Sequence[RequestInput], offsets: Sequence[float], t0: float
) -> AsyncIterator[RequestInput]:
    """Yield each request at ``t0 + offset`` (``perf_counter`` seconds; at once when that moment
    has passed), so late wake-ups do not add up, and never before it (uvloop's timers, in whole
    milliseconds, wake up to half a millisecond early: the rest is slept again); nothing is awaited
    after the last one."""
    for item, offset in zip(items, offsets, strict=True):
        while offset > 0 and (wait := t0 + offset - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        yield item


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to the end on a fresh event loop: uvloop's where it is installed (the client
    parses one SSE event per token, tens of thousands a second at high concurrency; uvloop's
    socket reads cost about half of asyncio's), else asyncio's."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def make_session(
    max_concurrency: int | None, timeout_s: float, insecure: bool = False
) -> aiohttp.ClientSession:
    """The HTTP session of a run, with vLLM ``bench serve``'s settings: environment proxies
    honoured (``trust_env``), keep-alive connections reused, at most ``max_concurrency``
    connections (in all and per host; unlimited without a concurrency limit), and an https
    server's certificate checked unless ``insecure`` (vLLM's ``--insecure``)."""
    limit = max_concurrency or 0
    connector = aiohttp.TCPConnector(
        ssl=not insecure,
        limit=limit,
        limit_per_host=limit,
        ttl_dns_cache=300,
        use_dns_cache=True,
        keepalive_timeout=60,
        force_close=False,
    )
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    return aiohttp.ClientSession(timeout=timeout, connector=connector, trust_env=True)


async def run_requests(
    inputs: Sequence[RequestInput],
    warmups: Sequence[RequestInput],
    max_concurrency: int | None,
    request_rate: float,
    burstiness: float,
    seed: int,
    timeout_s: float,
    disable_tqdm: bool = False,
    ramp_up: RampUp | None = None,
    released: list[float] | None = None,
    insecure: bool = False,
    offsets: Sequence[float] | None = None,
    first_copies: int = 0,
) -> tuple[list[RequestResult], float, list[RequestResult]]:
    """Send warm-ups (untimed, one after another), then ``first_copies`` untimed copies of the first
    timed request (vLLM's ``--num-warmups``: all at once, at most ``max_concurrency`` in flight, without
    its request id), then the timed requests (at ``request_rate``, or
    at the rates of ``ramp_up``: :func:`arrival_offsets`; or, given ``offsets``, request i at
    ``offsets[i]`` seconds after the start: a trace's times, :func:`trace_offsets`).

    Each timed request's ``queue_time`` is the time from its release to the moment the
    concurrency semaphore let it start (vLLM's ``client_queue_time``). ``released``, when given,
    gets each timed request's release time (seconds since the epoch). ``insecure``: no TLS
    certificate check (:func:`make_session`).
    Returns:
        (timed results in input order, duration in seconds, warm-up results).
    """
    async with make_session(max_concurrency, timeout_s, insecure) as session:
        warm = [await send_request(session, w) for w in warmups]
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        if first_copies and inputs:
            first = replace(inputs[0], request_id=None)

            async def copy() -> RequestResult:
                if sem is None:
                    return await send_request(session, first)
                async with sem:
                    return await send_request(session, first)

            warm += await asyncio.gather(*(copy() for _ in range(first_copies)))
        pbar = tqdm(total=len(inputs), disable=disable_tqdm, desc="requests")

        async def limited(req: RequestInput, released: float) -> RequestResult:
            if sem is None:
                res = await send_request(session, req)
            else:
                async with sem:
                    res = await send_request(session, req)
            res.queue_time = max(res.start_time - released, 0.0)
            pbar.update(1)
            return res

        if offsets is None:
            rng = np.random.default_rng(seed)
            offsets = arrival_offsets(len(inputs), request_rate, burstiness, rng, ramp_up)
        t0 = time.perf_counter()
        tasks: list[asyncio.Task[RequestResult]] = []
        async for req in _arrivals(inputs, offsets, t0):
            if released is not None:
                released.append(time.time())
            tasks.append(asyncio.create_task(limited(req, time.perf_counter())))
        results = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - t0
        pbar.close()
    return results, duration, warm


def say_warning(text: str, kind: str, said: set[str] | None = None, once_note: str = "") -> None:
    """Print ``surge: warning: TEXT`` on stderr (stdout holds the result table).

    ``said`` is None for a lone ``bench serve``: the line is always printed. A ``bench matrix``
    passes one set for all its points: a warning of a ``kind`` already in it is not printed again
    (each point would repeat it), and the first one of a kind is added to it, with ``once_note``
    appended where its text holds that point's own figures.
    """
    if said is not None:
        if kind in said:
            return
        said.add(kind)
        text += once_note
    print(f"surge: warning: {text}", file=sys.stderr, flush=True)


def prompt_length_warning(samples: Sequence[SampleRequest], results: Sequence[RequestResult]) -> str | None:
    """One line when the server's ``usage.prompt_tokens`` differs from the length a prompt was
    built or counted for (a server-side ``--chat-template`` that a local ``--tokenizer`` cannot
    see, another tokenizer, an ``--extra-body`` field that rewrites the prompt), else None.
    ``results`` are in the order of ``samples``; a request without usage keeps the dataset's
    count and is not compared."""
    diffs = [
        (s.prompt_len, r.prompt_len)
        for s, r in zip(samples, results, strict=True)
        if r.prompt_len != s.prompt_len
    ]
    if not diffs:
        return None
    built, served = diffs[0]
    return (
        f"the server counted {served} prompt tokens where the benchmark counted {built} "
        f"({len(diffs)} of {len(results)} requests differ); the result reports the server's counts. "
        "Count with the server's /tokenize (no --tokenizer) or with its tokenizer and template"
    )


def validate_results(
    results: Sequence[RequestResult], counter: TokenCounter | None, exact_length: bool
) -> None:
    """Count a successful request's output from its re-tokenized text where the server's usage
    gave no count, and fail wrong lengths (in place).

    The text is re-counted (without special tokens) when the stream had no
    ``usage.completion_tokens`` or when it said 0, as vLLM 0.26's ``calculate_metrics`` re-counts
    a falsy ``output_tokens``; with ``counter`` None a reported 0 stays 0. With ``exact_length``,
    a request whose count differs from the requested ``max_tokens`` fails with the reason, which
    names where the count came from.
    """
    overhead: int | None = None
    for r in results:
        if not r.success:
            continue
        source = "completion_tokens"
        if r.output_len is None or (r.output_len == 0 and counter is not None):
            if counter is None:
                r.success, r.error = False, "no usage in the stream and no tokenizer to count the text"
                continue
            why = "sent no usage" if r.output_len is None else "said completion_tokens 0"
            if overhead is None:
                overhead = len(counter.encode(""))
            r.output_len = max(len(counter.encode(r.generated_text)) - overhead, 0)
            source = "re-tokenized output"
        if exact_length and r.output_len != r.expected_output_len:
            r.success = False
            r.error = f"{source} {r.output_len} != requested {r.expected_output_len}"
            if source != "completion_tokens":  # text re-encoded whole need not give the server's tokens back
                r.error += (
                    f" (the server {why}, so the text was re-tokenized, which can differ by a token or "
                    "two: let it send stream_options.include_usage, or pass --no-exact-length)"
                )


def roofline_unused_reason(cfg: ServeConfig) -> str | None:
    """Why the roofline flags of ``cfg`` give this run no roofline column, whatever its model, as
    one warning line's text (without its ``surge: warning:`` prefix), said before the run; None
    when they may give one (or none was asked for).

    With the hardware (``--gpu``, or ``--hbm-bandwidth`` and ``--peak-flops``): a dataset other
    than random (prompts of many lengths), a shared prefix (``--random-prefix-len``: the server may
    reuse its cached KV instead of prefilling it), or a run that is not a burst (a finite
    ``--request-rate`` or a ``--ramp-up-strategy``: the ceiling assumes every request sent at
    t=0). Without it: the roofline's model flags (``--model-config``, ``--roofline-tp``,
    ``--roofline-dtype``, ``--roofline-kv-cache-dtype``), which then change nothing.
    """
    if cfg.hardware is None:
        given = [
            flag
            for flag, value in (
                ("--model-config", cfg.model_config),
                ("--roofline-tp", cfg.roofline_tp if cfg.roofline_tp != 1 else None),
                ("--roofline-dtype", cfg.roofline_dtype),
                ("--roofline-kv-cache-dtype", cfg.roofline_kv_cache_dtype),
            )
            if value is not None
        ]
        if not given:
            return None
        names = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
        return (
            f"{names} {'changes' if len(given) == 1 else 'change'} nothing without the hardware "
            "(--gpu NAME, or --hbm-bandwidth and --peak-flops): no roofline column is computed"
        )
    why = None
    if cfg.dataset != "random":
        why = f"--dataset {cfg.dataset} (the ceiling is a random run's, of one --input-len)"
    elif cfg.random_prefix_len:
        why = "--random-prefix-len (the server may reuse the shared prefix's cached KV instead of prefilling it)"
    elif cfg.ramp_up_strategy is not None:
        why = "--ramp-up-strategy (the ceiling is a burst's, every request sent at once)"
    elif not math.isinf(cfg.request_rate):
        why = f"--request-rate {cfg.request_rate:g} (the ceiling is a burst's, every request sent at once)"
    return None if why is None else f"no roofline column with {why}"


def _roofline_fields(
    cfg: ServeConfig,
    local_dir: str | None,
    throughput: float,
    model: str = "",
    said: set[str] | None = None,
) -> dict[str, Any]:
    """The result's roofline fields (``roofline_output_throughput`` in tokens/s, ``pct_of_roofline``
    in %, and the ``hardware`` and ``roofline_model`` figures they assumed), all None where the
    ceiling does not apply: no hardware, a dataset other than random, a shared prefix
    (``--random-prefix-len``), or a run that is not a burst (a finite ``--request-rate`` or a
    ``--ramp-up-strategy``: the ceiling assumes every request sent at t=0), or no model config. A
    model folder found by the served model's name that the roofline cannot model (a
    mixture-of-experts config, FP8 weights on a GPU without FP8) gets None too, with one warning
    line on stderr, not an error that would lose the finished run; so does a served ``model``
    (its name) that is no model folder here, given no ``--model-config``. A point whose
    ``input_len + output_len`` exceeds the config's context keeps its figures, with one warning
    line saying they assume a context the model does not support
    (:func:`surge.bench.roofline.context_warning`). ``said`` is :func:`say_warning`'s: a
    matrix's points say such a line once."""
    out: dict[str, Any] = {
        "roofline_output_throughput": None,
        "pct_of_roofline": None,
        "hardware": None,
        "roofline_model": None,
    }
    if cfg.hardware is None or roofline_unused_reason(cfg) is not None:
        return out  # said before the run (:func:`roofline_unused_reason`)
    src = cfg.model_config or local_dir
    if src is None:  # a GPU was named: say why its column is empty
        say_warning(
            f"no roofline column: the served model {model!r} is not a model folder here "
            "(a config.json); pass --model-config DIR",
            "roofline-model",
            said,
        )
        return out
    try:
        model_cfg = load_config(src)
        shape = model_shape(model_cfg, cfg.roofline_dtype, cfg.roofline_tp, cfg.roofline_kv_cache_dtype)
        check_fp8_support(shape.fp8_matmul_params > 0, cfg.hardware, "--roofline-dtype")
    except ValueError as e:  # the folder found by the served model's name (--model-config was checked first)
        say_warning(f"no roofline column: {src}: {e}", "roofline-model", said)
        return out
    conc = min(cfg.max_concurrency or cfg.num_prompts, cfg.num_prompts)
    roof = point_roofline(shape, cfg.hardware, conc, cfg.input_len, cfg.output_len)
    over_context = context_warning(model_cfg, [(conc, cfg.input_len, cfg.output_len)])
    if over_context:
        print(f"surge: warning: roofline column: {over_context}", file=sys.stderr)
    out["roofline_output_throughput"] = roof.output_throughput
    out["pct_of_roofline"] = 100.0 * throughput / roof.output_throughput
    out["hardware"] = {
        "name": cfg.hardware.name,
        "hbm_bandwidth": cfg.hardware.hbm_bandwidth,
        "peak_flops": cfg.hardware.peak_flops,
        "peak_flops_fp8": cfg.hardware.peak_flops_fp8,
    }
    # What the ceiling assumed the server reads: weight bytes per step and KV bytes per token.
    out["roofline_model"] = {
        "weight_bytes": shape.weight_bytes,
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "dtype": cfg.roofline_dtype,
        "kv_cache_dtype": cfg.roofline_kv_cache_dtype,
    }
    if cfg.roofline_tp > 1:
        out["hardware"]["tensor_parallel_size"] = cfg.roofline_tp
        out["hardware"]["link_bandwidth"] = cfg.hardware.link_bandwidth
    return out


def recorded_model_id(cfg: ServeConfig, entry: dict[str, Any]) -> str:
    """The result's ``model_id`` (also its ``tokenizer_id`` without ``--tokenizer`` and the model
    part of ``--save-result``'s file name), as vLLM 0.26's ``bench serve`` picks it: ``--model``
    (with ``--served-model-name``, the ``--model`` given), else the ``root`` of the server's first
    model (``entry``, its ``/v1/models`` entry: vLLM sends that entry's ``id`` and records its
    ``root``, the model's path or hub name), or its ``id`` when the server gives no ``root``.
    """
    if cfg.model_id is not None:
        return cfg.model_id
    if cfg.model is not None:
        return cfg.model
    root = entry.get("root")
    return root if isinstance(root, str) and root else str(entry["id"])


def roofline_fp8_weights(cfg: ServeConfig) -> bool | None:
    """Whether the roofline column of ``cfg`` counts FP8 GEMMs, as known before the run: from the
    config of ``--model-config`` or of the local model folder that ``--tokenizer`` or the model
    name give (the one :func:`_roofline_fields` reads then) with ``--roofline-dtype``; without
    such a folder, from ``--roofline-dtype`` alone. None when not known yet: no folder and no
    ``--roofline-dtype`` (the run may find one by ``/v1/models``' root), or a folder the roofline
    cannot model (the run warns of it).
    """
    src = cfg.model_config or _local_model_dir(cfg, {})
    dtype = cfg.roofline_dtype
    if src is None:
        if dtype is None or dtype == "auto":
            return None
        return dtype.removeprefix("torch.") == "fp8"
    try:
        shape = model_shape(load_config(src), dtype, cfg.roofline_tp, cfg.roofline_kv_cache_dtype)
    except ValueError:
        return None
    return shape.fp8_matmul_params > 0


def _local_model_dir(cfg: ServeConfig, entry: dict[str, Any]) -> str | None:
    for cand in (cfg.tokenizer, cfg.model_id, cfg.model, entry.get("root")):
        if cand and Path(cand).is_dir() and (Path(cand) / "config.json").is_file():
            return str(cand)
    return None


def _counter_for(cfg: ServeConfig, base: str, model: str, entry: dict[str, Any]) -> TokenCounter:
    local = next((m for m in (cfg.model_id, cfg.model) if is_tokenizer_dir(m)), None)
    root = cfg.tokenizer or local or entry.get("root")
    return resolve_counter(base, model, cfg.tokenizer, root, cfg.api_key, cfg.insecure, cfg.headers)


def make_counter(cfg: ServeConfig) -> TokenCounter:
    """The token counter ``run_serve`` would pick for ``cfg`` (to reuse across matrix points).

    Raises:
        ValueError: unreachable server or no way to count tokens.
    """
    base = cfg.base_url.rstrip("/")
    entry = model_entry(fetch_models(base, cfg.api_key, cfg.insecure, headers=cfg.headers), cfg.model)
    return _counter_for(cfg, base, str(cfg.model or entry["id"]), entry)


def build_samples(cfg: ServeConfig, counter: TokenCounter, max_model_len: int | None) -> list[SampleRequest]:
    """The timed prompts of ``cfg`` (random, ShareGPT, custom, prefix repetition, sonnet, BurstGPT,
    spec_bench, hf or a timed trace, whose samples carry their send times).

    Lengths are counted as the server sees the prompt: on the chat endpoint the templated
    prompt (random prompts have exactly ``input_len`` tokens including the template's), with
    the fields of ``--extra-body`` that change it (``chat_template_kwargs``, ...; see
    :func:`surge.bench.tokens.prompt_options`), and ShareGPT prompts are kept only when that
    count plus the output fits ``max_model_len``.
    """
    chat = is_chat_route(cfg.endpoint)
    options = prompt_options(cfg.extra_body, chat)
    if cfg.dataset == "sharegpt":
        assert cfg.dataset_path is not None
        return sharegpt_requests(
            counter,
            cfg.dataset_path,
            cfg.num_prompts,
            cfg.output_len,
            cfg.seed,
            max_model_len,
            chat,
            options,
            cfg.sharegpt_output_len,
            shuffle=not cfg.disable_shuffle,
            fewer_ok=cfg.no_oversample,
        )
    if cfg.dataset == "custom":
        assert cfg.dataset_path is not None
        return custom_requests(
            counter,
            cfg.dataset_path,
            cfg.num_prompts,
            None if cfg.custom_output_len == -1 else cfg.custom_output_len,
            cfg.seed,
            max_model_len,
            chat,
            options,
            cfg.skip_chat_template,
            cfg.chat_template_kwargs,
            shuffle=not cfg.disable_shuffle,
            fewer_ok=cfg.no_oversample,
        )
    if cfg.dataset == "sonnet":
        assert cfg.dataset_path is not None
        return sonnet_requests(
            counter,
            cfg.dataset_path,
            cfg.num_prompts,
            cfg.sonnet_input_len,
            cfg.sonnet_prefix_len,
            cfg.output_len,
            cfg.seed,
            chat,
            options,
            input_len_flag=cfg.sonnet_input_len_flag,
            output_len_flag=cfg.output_len_flag,
        )
    if cfg.dataset == "hf":
        assert cfg.dataset_path is not None
        return hf_requests(
            counter,
            cfg.dataset_path,
            cfg.hf_name,
            cfg.hf_split,
            cfg.hf_subset,
            cfg.num_prompts,
            cfg.hf_output_len,
            cfg.seed,
            max_model_len,
            chat,
            options,
            cfg.skip_chat_template,
            shuffle=not cfg.disable_shuffle,
            fewer_ok=cfg.no_oversample,
        )
    if cfg.dataset == "spec_bench":
        assert cfg.dataset_path is not None
        return spec_bench_requests(
            counter,
            cfg.dataset_path,
            cfg.num_prompts,
            cfg.output_len,
            cfg.spec_bench_category,
            max_model_len,
            chat,
            options,
            shuffle=not cfg.disable_shuffle,
            fewer_ok=cfg.no_oversample,
        )
    if cfg.dataset == "burstgpt":
        assert cfg.dataset_path is not None
        return burstgpt_requests(
            counter, cfg.dataset_path, cfg.num_prompts, cfg.seed, max_model_len, chat, options
        )
    if cfg.dataset == "timed_trace":
        assert cfg.dataset_path is not None
        return timed_trace_requests(
            counter,
            cfg.dataset_path,
            cfg.num_prompts,
            cfg.timed_trace,
            cfg.seed,
            max_model_len,
            chat,
            options,
        )
    if cfg.dataset == "prefix_repetition":
        return prefix_repetition_requests(
            counter,
            cfg.num_prompts,
            cfg.prefix_repetition_prefix_len,
            cfg.prefix_repetition_suffix_len,
            cfg.prefix_repetition_num_prefixes,
            cfg.output_len,
            cfg.seed,
            chat,
            options,
            shuffle=not cfg.disable_shuffle,
        )
    return random_requests(
        counter,
        cfg.num_prompts,
        cfg.input_len,
        cfg.output_len,
        cfg.seed,
        chat,
        options,
        cfg.random_range_ratio,
        cfg.random_prefix_len,
        cfg.output_range_ratio,
        input_len_flag=cfg.input_len_flag,
        output_len_flag=cfg.output_len_flag,
    )


def _input_len(cfg: ServeConfig) -> int | None:
    """The result's ``input_len``: random's ``--input-len`` (without ``--random-prefix-len``), the
    prefix-repetition prompts' length, else None (prompts of many lengths; sonnet's are up to
    ``sonnet_input_len``, which the result records)."""
    if cfg.dataset == "random":
        return cfg.input_len
    if cfg.dataset == "prefix_repetition":
        return cfg.prefix_repetition_prefix_len + cfg.prefix_repetition_suffix_len
    return None


def _dataset_settings(cfg: ServeConfig) -> dict[str, Any]:
    """The result's fields of the dataset's own settings (vLLM's flag names), None for another
    dataset, so that ``bench compare`` can tell runs apart."""
    mine = {
        "random": {"random_prefix_len": cfg.random_prefix_len},
        "custom": {
            "custom_output_len": cfg.custom_output_len,
            "skip_chat_template": cfg.skip_chat_template,
            "chat_template_kwargs": cfg.chat_template_kwargs,
        },
        "prefix_repetition": {
            "prefix_repetition_prefix_len": cfg.prefix_repetition_prefix_len,
            "prefix_repetition_suffix_len": cfg.prefix_repetition_suffix_len,
            "prefix_repetition_num_prefixes": cfg.prefix_repetition_num_prefixes,
            "prefix_repetition_output_len": cfg.output_len,
        },
        "sonnet": {
            "sonnet_input_len": cfg.sonnet_input_len,
            "sonnet_prefix_len": cfg.sonnet_prefix_len,
            "sonnet_output_len": cfg.output_len,
        },
        "timed_trace": {
            "timed_trace_chunk_hash_size": cfg.timed_trace.chunk_hash_size,
            "timed_trace_sec_multiplier": cfg.timed_trace.sec_multiplier,
            "timed_trace_label_timestamp": cfg.timed_trace.label_timestamp,
            "timed_trace_label_input_length": cfg.timed_trace.label_input_length,
            "timed_trace_label_output_length": cfg.timed_trace.label_output_length,
            "timed_trace_label_hash_ids": cfg.timed_trace.label_hash_ids,
        },
        "spec_bench": {
            "spec_bench_category": cfg.spec_bench_category,
            "spec_bench_output_len": cfg.output_len,
        },
        "hf": {
            "hf_name": cfg.hf_name,
            "hf_split": cfg.hf_split or DEFAULT_SPLIT,
            "hf_subset": cfg.hf_subset,
            "hf_output_len": cfg.hf_output_len,
        },
    }
    out: dict[str, Any] = {}
    for dataset, fields in mine.items():
        out.update({k: (v if dataset == cfg.dataset else None) for k, v in fields.items()})
    if cfg.dataset == "hf":  # MT-Bench's, as custom's
        out["skip_chat_template"] = cfg.skip_chat_template
    # vLLM's --disable-shuffle: true when given, else null (as in the files written before it)
    out["disable_shuffle"] = True if cfg.disable_shuffle else None
    out["no_oversample"] = True if cfg.no_oversample else None
    return out


def _range_ratio_field(cfg: ServeConfig) -> float | dict[str, float] | None:
    """The result's ``random_range_ratio``: the ratio, vLLM's ``{"input": r, "output": r2}`` when the
    two differ, None for another dataset."""
    if cfg.dataset != "random":
        return None
    if cfg.output_range_ratio != cfg.random_range_ratio:
        return {"input": cfg.random_range_ratio, "output": cfg.output_range_ratio}
    return cfg.random_range_ratio


def _one_length(samples: list[SampleRequest]) -> int | None:
    """The output length every sample asks, or None when they differ (ShareGPT reply lengths)."""
    lengths = {s.expected_output_len for s in samples}
    return lengths.pop() if len(lengths) == 1 else None


def run_serve(
    cfg: ServeConfig,
    command: str = "",
    counter: TokenCounter | None = None,
    said: set[str] | None = None,
) -> dict[str, Any]:
    """Run the benchmark of ``cfg`` and return the result dict (vLLM field names plus Surge's).

    ``said`` is a matrix's set of the warnings its points have said (:func:`say_warning`), so
    that a warning every point would give is said once; None (a lone run) says each.

    Raises:
        ValueError: bad config, unreachable server (also when it goes away while prompts are being
            counted), unusable tokenizer/dataset, or a failed warm-up.
    """
    try:
        return _run_serve(cfg, command, counter, said)
    except OSError as e:  # urllib errors of /tokenize, /detokenize, /v1/models
        raise ValueError(f"lost the server at {cfg.base_url}: {e}") from None


def _run_serve(
    cfg: ServeConfig, command: str, counter: TokenCounter | None, said: set[str] | None
) -> dict[str, Any]:
    cfg.validate()
    base = cfg.base_url.rstrip("/")
    models = fetch_models(base, cfg.api_key, cfg.insecure, cfg.ready_check_timeout_s, headers=cfg.headers)
    entry = model_entry(models, cfg.model)
    model = str(cfg.model or entry["id"])
    model_id = recorded_model_id(cfg, entry)
    local_dir = _local_model_dir(cfg, entry)
    if counter is None:
        counter = _counter_for(cfg, base, model, entry)
    max_model_len = max_model_len_of(entry, "/v1/models")
    if max_model_len and cfg.dataset == "random":
        special = special_tokens_added(counter) if cfg.random_range_ratio else 0  # a BOS is not scaled
        longest_in = range_bounds(cfg.input_len, cfg.random_range_ratio, special)[1]
        longest_out = range_bounds(cfg.output_len, cfg.output_range_ratio)[1]
        if cfg.random_prefix_len + longest_in + longest_out > max_model_len:
            ranged = (
                f" (up to {longest_in} + {longest_out} with --random-range-ratio)"
                if cfg.random_range_ratio or cfg.output_range_ratio
                else ""
            )
            prefix = f"--random-prefix-len {cfg.random_prefix_len} + " if cfg.random_prefix_len else ""
            raise ValueError(
                f"{prefix}{cfg.input_len_flag} {cfg.input_len} + {cfg.output_len_flag} {cfg.output_len}{ranged} "
                f"exceeds the "
                f"server's max_model_len {max_model_len}"
            )
    if (
        max_model_len
        and cfg.dataset == "sonnet"
        and cfg.sonnet_input_len + cfg.output_len > int(max_model_len)
    ):
        raise ValueError(
            f"{cfg.sonnet_input_len_flag} {cfg.sonnet_input_len} + {cfg.output_len_flag} {cfg.output_len} exceeds the "
            f"server's max_model_len {max_model_len}"
        )
    if max_model_len and cfg.dataset == "prefix_repetition":
        total = cfg.prefix_repetition_prefix_len + cfg.prefix_repetition_suffix_len + cfg.output_len
        if total > max_model_len:
            raise ValueError(
                f"--prefix-repetition-prefix-len {cfg.prefix_repetition_prefix_len} + -suffix-len "
                f"{cfg.prefix_repetition_suffix_len} + output {cfg.output_len} exceeds the server's "
                f"max_model_len {max_model_len}"
            )
    samples = build_samples(cfg, counter, max_model_len)
    api_url = base + cfg.endpoint

    def to_input(s: SampleRequest) -> RequestInput:
        return RequestInput(
            api_url,
            model,
            s.prompt,
            s.prompt_len,
            s.expected_output_len,
            cfg.ignore_eos,
            cfg.api_key,
            cfg.temperature,
            cfg.extra_body,
            headers=cfg.headers,
        )

    chat = is_chat_route(cfg.endpoint)
    warm_options = prompt_options(cfg.extra_body, chat)
    warm_samples: list[SampleRequest] = []
    if cfg.warmup:
        warm_len = (
            cfg.input_len
            if cfg.dataset == "random"
            else max(WARMUP_INPUT_LEN, least_prompt_len(counter, chat, warm_options))
        )
        warm_samples = random_requests(
            counter,
            cfg.warmup,
            warm_len,
            min(cfg.output_len, WARMUP_MAX_OUTPUT),
            cfg.seed + WARMUP_SEED_OFFSET,
            chat,
            warm_options,
            input_len_flag=cfg.input_len_flag,
            output_len_flag=cfg.output_len_flag,
        )
    id_prefix = cfg.request_id_prefix
    if id_prefix is None:  # vLLM's default: bench-, 8 random hex digits, -
        id_prefix = f"bench-{uuid.uuid4().hex[:8]}-"
    inputs = [replace(to_input(s), request_id=f"{id_prefix}{i}") for i, s in enumerate(samples)]
    ramp_up = cfg.ramp_up()
    trace_times = trace_offsets(samples) if cfg.self_timed else None
    if trace_times:
        print(f"surge: note: {replay_note(trace_times, cfg.timed_trace.sec_multiplier)}", file=sys.stderr)
    released: list[float] = []
    results, duration, warm = run_async(
        run_requests(
            inputs,
            [to_input(s) for s in warm_samples],
            cfg.max_concurrency,
            cfg.request_rate,
            cfg.burstiness,
            cfg.seed,
            cfg.request_timeout_s,
            cfg.disable_tqdm,
            ramp_up,
            released,
            cfg.insecure,
            trace_times,
            cfg.num_warmups,
        )
    )
    validate_results(warm, counter, cfg.exact_length)
    for w in warm:
        if not w.success:
            raise ValueError(f"warm-up request failed: {w.error}")
    validate_results(results, counter, cfg.exact_length)
    warning = prompt_length_warning(samples, results)
    if warning:
        say_warning(warning, "prompt-length", said, " (the first point's counts; said once for the matrix)")
    m = compute_metrics(results, duration, cfg.percentiles, dict(cfg.goodput) or None)

    backend = cfg.backend or ("openai-chat" if is_chat_route(cfg.endpoint) else "openai")
    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "command": command,
        "backend": backend,
        "endpoint_type": backend,
        "label": cfg.label,  # null without --label, as vLLM; --save-result's name falls back to the backend
        "base_url": base,
        "endpoint": cfg.endpoint,
        "model_id": model_id,
        "tokenizer_id": cfg.tokenizer or model_id,  # vLLM's: --tokenizer, else the model id
        "token_counter": counter.name,  # Surge's: the folder or server /tokenize URL that counted the tokens
        "server_models": models,
        "dataset": cfg.dataset,
        "dataset_path": cfg.dataset_path,
        "input_len": _input_len(cfg),
        # ShareGPT with reply lengths: per request in output_lens / the samples, no one length
        "output_len": cfg.output_len if cfg.dataset == "random" else _one_length(samples),
        "random_range_ratio": _range_ratio_field(cfg),
        **_dataset_settings(cfg),
        "num_prompts": cfg.num_prompts,
        "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
        # as vLLM: the ramp-up's settings only with one (readers take their absence as null)
        **(
            {
                "ramp_up_strategy": cfg.ramp_up_strategy,
                "ramp_up_start_rps": cfg.ramp_up_start_rps,
                "ramp_up_end_rps": cfg.ramp_up_end_rps,
            }
            if cfg.ramp_up_strategy is not None
            else {}
        ),
        "self_timed": cfg.self_timed,
        "seed": cfg.seed,
        "ignore_eos": cfg.ignore_eos,
        "exact_length": cfg.exact_length,
        "temperature": cfg.temperature,
        "extra_body": cfg.extra_body,
        "warmup": cfg.warmup,
        "num_warmups": cfg.num_warmups,
        "request_id_prefix": id_prefix,
        "goodput_slo_ms": dict(cfg.goodput) or None,
        **cfg.extra,
    }
    if ramp_up is not None:
        result["rps_change_events"] = rps_change_events(ramp_up, len(inputs), released)
    result.update(metrics_to_json(m, duration, cfg.percentile_metrics))
    result.update(_roofline_fields(cfg, local_dir, m.output_throughput, model, said))
    result["input_lens"] = [r.prompt_len for r in results]
    result["output_lens"] = m.output_lens
    result["ttfts"] = [r.ttft for r in results]
    result["itls"] = [r.itl for r in results]
    result["latencies"] = [r.latency for r in results]
    result["start_times"] = [r.start_time for r in results]
    result["queue_times"] = [r.queue_time for r in results]
    result["errors"] = [r.error for r in results]
    if cfg.save_detailed:
        result["generated_texts"] = [r.generated_text for r in results]
    for key in apply_metadata(result, cfg.metadata):
        print(
            f"surge: warning: --metadata {key}: the result's own {key!r} field is kept (the value is "
            "under 'metadata')",
            file=sys.stderr,
            flush=True,
        )
    return result


def apply_metadata(result: dict[str, Any], metadata: Sequence[tuple[str, str]]) -> list[str]:
    """Record vLLM's ``--metadata KEY=VALUE`` pairs in ``result``: each as a top-level string
    field, as vLLM's ``bench serve`` does, and all of them under ``"metadata"``. A key that names
    one of the result's own fields does not replace it (vLLM's measured fields win too).

    Returns:
        the keys that were not set at the top level because the result has them.
    """
    if not metadata:
        return []
    kept = [key for key, _ in metadata if key in result or key == "metadata"]
    for key, value in metadata:
        result.setdefault(key, value)
    result["metadata"] = dict(metadata)
    return kept
