"""vLLM's ``timed_trace`` dataset: the replay of a timed request trace (Mooncake-style JSONL).

Each line of the trace is a JSON object with a timestamp, an input length, an output length and the
prefix hashes of the prompt's blocks, e.g. ``{"timestamp": 27482, "input_length": 6955,
"output_length": 52, "hash_ids": [46, 47, 48, ...]}``; the field names are vLLM's
``--timed-trace-label-*`` flags. As vLLM 0.26's ``TimedTrace`` (``benchmarks/datasets/datasets.py``):

- the first ``--num-prompts`` rows are taken in the file's order (no shuffle);
- a prompt is built block by block from its ``hash_ids``: each hash ``h`` gives
  ``--timed-trace-chunk-hash-size`` tokens (the last block of a row only the tokens left of its
  ``input_length``), the ids drawn by ``random.Random(seed).choices`` from the sorted non-special
  vocabulary, ``seed`` derived from the key ``"{h}:{size}"`` (so the same hash at the same size is
  the same tokens in every prompt, and prompts that share leading hashes share a prefix); the ids
  are decoded to the prompt's text; a row whose hashes cover fewer tokens than its input length
  gets the shorter prompt, as vLLM;
- a request asks its row's output length (``--ignore-eos`` is on by default, as vLLM forces it);
- a request is sent at its row's timestamp times ``--timed-trace-sec-multiplier`` seconds after
  the start of the run (vLLM's ``--self-timed``, the default with this dataset).

Differences: vLLM seeds each block with Python's ``hash(key) & 0xFFFFFFFF``, which is salted per
process (``PYTHONHASHSEED``), so its prompts change from run to run; Surge's seed is a stable hash of
``"{--seed}:{h}:{size}"`` (the same prompts for the same ``--seed``, fresh ones for another, as
every Surge dataset). The vocabulary is Surge's (:meth:`~surge.bench.tokens.TokenCounter.candidate_ids`:
added tokens such as ``<think>`` and byte-fallback pieces are left out too). A prompt's length is
counted as the server sees it (decoded ids re-tokenize to about, not exactly, as many tokens;
on the chat endpoint the template's tokens count). Rows the server could not take (over its
``max_model_len`` with their output) are left out with a note, those far over it before their
prompts are built (:func:`surely_too_long`), and a bad row is refused in one
line naming it (vLLM raises on a missing field and sends an empty prompt for a row without hashes).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from surge.bench.datasets import SampleRequest, dataset_file, prompt_encoder
from surge.bench.tokens import TokenCounter


@dataclass(frozen=True)
class TimedTraceOptions:
    """vLLM's ``--timed-trace-*`` flags, with vLLM's defaults.

    ``chunk_hash_size``: tokens per hash block (16 for the Qwen/Alibaba traces, 512 for Moonshot's
    Mooncake traces); ``sec_multiplier``: seconds per timestamp unit (0.001 for milliseconds);
    ``label_*``: the JSON field names of a row's timestamp, input length, output length and hashes.
    """

    chunk_hash_size: int = 16
    sec_multiplier: float = 1.0
    label_timestamp: str = "timestamp"
    label_input_length: str = "input_length"
    label_output_length: str = "output_length"
    label_hash_ids: str = "hash_ids"

    def validate(self) -> None:
        """Raises ValueError (one line naming the flag) on a block size below 1 or a multiplier that
        is not a finite number above 0 (vLLM takes both and sends every request at once or builds
        empty prompts)."""
        if self.chunk_hash_size < 1:
            raise ValueError(f"--timed-trace-chunk-hash-size must be >= 1, got {self.chunk_hash_size}")
        if not (self.sec_multiplier > 0 and math.isfinite(self.sec_multiplier)):
            raise ValueError(
                f"--timed-trace-sec-multiplier must be > 0 and finite, got {self.sec_multiplier:g}"
            )


_LABEL_FLAGS = {
    "label_timestamp": "--timed-trace-label-timestamp",
    "label_input_length": "--timed-trace-label-input-length",
    "label_output_length": "--timed-trace-label-output-length",
    "label_hash_ids": "--timed-trace-label-hash-ids",
}


@dataclass(frozen=True)
class TraceRow:
    """One row of a trace: ``timestamp`` in the trace's unit (not yet scaled), lengths in tokens,
    the block hashes, and the row's line in the file (1-based)."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int | str, ...]
    line: int


def _field(path: str, line: int, entry: Mapping[str, Any], opts: TimedTraceOptions, attr: str) -> Any:
    """The value of the field ``opts.<attr>`` names. Raises ValueError naming the line, the fields
    it has and the flag to use when it is absent or null (as vLLM)."""
    name = getattr(opts, attr)
    value = entry.get(name)
    if value is None:
        fields = ", ".join(map(repr, entry))[:120] or "none"
        raise ValueError(
            f"--dataset-path {path}: line {line}: no {name!r} field (it has {fields}); name the field "
            f"with {_LABEL_FLAGS[attr]}"
        )
    return value


def _count(path: str, line: int, name: str, value: Any, least: int) -> int:
    """A token count of a row: an integer (``12.0`` too) of at least ``least``. Raises ValueError."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and math.isfinite(value) and float(value).is_integer() and value >= least:
        return int(value)
    raise ValueError(
        f"--dataset-path {path}: line {line}: {name!r} must be an integer >= {least}, got {json.dumps(value)}"
    )


def _row(path: str, line: int, entry: Any, opts: TimedTraceOptions) -> TraceRow:
    """A trace row from its decoded JSON line. Raises ValueError (one line naming it)."""
    if not isinstance(entry, dict):
        raise ValueError(f"--dataset-path {path}: line {line}: expected a JSON object (one row a line)")
    raw = _field(path, line, entry, opts, "label_timestamp")
    try:  # vLLM takes float(value): a number, or a string of one
        ts = float(raw) if isinstance(raw, int | float | str) and not isinstance(raw, bool) else math.nan
    except ValueError:
        ts = math.nan
    if not (math.isfinite(ts) and ts >= 0):
        raise ValueError(
            f"--dataset-path {path}: line {line}: {opts.label_timestamp!r} must be a number >= 0, got "
            f"{json.dumps(raw)}"
        )
    n_in = _count(
        path, line, opts.label_input_length, _field(path, line, entry, opts, "label_input_length"), 1
    )
    n_out = _count(
        path, line, opts.label_output_length, _field(path, line, entry, opts, "label_output_length"), 1
    )
    hashes = entry.get(opts.label_hash_ids)
    if (
        not isinstance(hashes, list)
        or not hashes
        or not all(isinstance(h, int | str) and not isinstance(h, bool) for h in hashes)
    ):
        got = "none" if hashes is None else json.dumps(hashes)[:60]
        raise ValueError(
            f"--dataset-path {path}: line {line}: {opts.label_hash_ids!r} must be a non-empty list of integers "
            f"(or strings), got {got}: the prompt is built from its blocks (name the field with "
            "--timed-trace-label-hash-ids)"
        )
    return TraceRow(ts, n_in, n_out, tuple(hashes), line)


def read_timed_trace(path: str, opts: TimedTraceOptions) -> Iterator[TraceRow]:
    """The rows of a JSONL trace in the file's order (blank lines skipped), each read and checked
    when it is asked for (a trace can have tens of thousands of rows; a run reads the first ones).

    Raises:
        ValueError: missing or unreadable file, or a row that is not a JSON object with the
            labelled fields (timestamp a number >= 0, lengths integers >= 1, hashes a non-empty
            list); one line naming the file and line.
    """
    p = dataset_file(path, "JSONL trace file")
    try:
        with p.open(encoding="utf-8") as f:
            for n, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    entry = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ValueError(
                        f"--dataset-path {path}: line {n}: not JSON ({e}) (a trace is JSON Lines: one object a line)"
                    ) from None
                yield _row(path, n, entry, opts)
    except UnicodeDecodeError as e:
        raise ValueError(f"--dataset-path {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ValueError(f"--dataset-path {path}: {e.strerror or e}") from None


def block_seed(key: str, seed: int) -> int:
    """The seed of a hash block's tokens: a stable 64-bit hash of ``"{seed}:{key}"`` (``key`` is
    vLLM's ``"{h}:{size}"``; vLLM takes ``hash(key) & 0xFFFFFFFF``, salted per process). A string
    hash id may hold any JSON string, a lone UTF-16 surrogate (``"\\ud800"``) too, as vLLM's
    ``hash()`` takes it: its UTF-8 bytes are hashed with ``surrogatepass``."""
    data = f"{seed}:{key}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def expand_prompt(
    hash_ids: Sequence[int | str],
    input_length: int,
    chunk_size: int,
    block_ids: Callable[[str, int], list[int]],
) -> list[int]:
    """vLLM's ``TimedTrace._expand_prompt``: the token ids of a prompt of ``input_length`` tokens
    from its blocks. Each hash gives ``chunk_size`` tokens, or the fewer left of ``input_length``
    (its key is then ``"{h}:{left}"``, other tokens than its full block's); it stops once
    ``input_length`` tokens are there, and gives fewer when the hashes run out first.
    ``block_ids(key, size)`` gives a block's ids (the same for the same key)."""
    out: list[int] = []
    left = input_length
    for h in hash_ids:
        size = chunk_size if left >= chunk_size else left
        out.extend(block_ids(f"{h}:{size}", size))
        left -= size
        if left <= 0:
            break
    return out


LONG_REPLAY_S = 3600.0
"""A self-timed replay whose last request leaves later than this (seconds) with the default
``--timed-trace-sec-multiplier`` 1 gets a hint: traces such as Mooncake's count milliseconds."""


def _seconds(t: float) -> str:
    """``t`` seconds for a note: milliseconds shown, a huge time in exponent form."""
    return f"{t:.3f} s" if t < 1e9 else f"{t:.3g} s"


def replay_note(times: Sequence[float], sec_multiplier: float) -> str:
    """The note that opens a self-timed replay: how many requests, when the first and the last
    leave (``times``: seconds after the start, in send order, at least one). With
    ``sec_multiplier`` 1 (vLLM's default) and a last time past :data:`LONG_REPLAY_S`, it adds the
    flag that reads the timestamps as milliseconds."""
    last = max(times)
    note = (
        f"replaying the trace's times: {len(times)} requests, the first {_seconds(times[0])} and the last "
        f"{_seconds(last)} after the start"
    )
    if sec_multiplier == 1.0 and last > LONG_REPLAY_S:
        note += (
            f" (over {LONG_REPLAY_S / 3600:g} hour: if the trace's timestamps are milliseconds, as Mooncake's, "
            "give --timed-trace-sec-multiplier 0.001)"
        )
    return note


PRE_DROP_SLACK_TOKENS = 1024
"""The fewest tokens by which a row's block tokens must exceed the room left by its output before
it is left out unbuilt (:func:`surely_too_long`)."""


def block_tokens(row: TraceRow, chunk_size: int) -> int:
    """The token ids :func:`expand_prompt` builds for ``row`` (tokens): its input length, or fewer
    when its hashes run out first (``len(hash_ids) * chunk_size``)."""
    return min(row.input_length, len(row.hash_ids) * chunk_size)


def surely_too_long(row: TraceRow, chunk_size: int, max_model_len: int) -> bool:
    """Whether ``row`` is over ``max_model_len`` (tokens) with its output however its prompt
    re-tokenizes, so that it can be left out before its prompt is built (decoding and counting a
    100k-token prompt takes about a second).

    A prompt's decoded block ids re-tokenize to about, not exactly, as many tokens: random ids next
    to each other can merge into one token. Measured over random draws: Qwen3's and Llama 3.1's
    tokenizers count 1.03x to 1.07x the block tokens of 2,048-token prompts, and short prompts lose
    at most 1 token (a 2-token prompt can merge into 1; 16- and 128-token prompts in 20,000 and
    3,000 draws); the bundled stories260K's 512-piece vocabulary loses at most 2 of 16 and 3 of 128
    tokens, 0.99x to 1.002x at 512 tokens or more, at most 5 tokens up to 6,000. So a row is taken
    as too long only when its block tokens, less a quarter of them and at least
    :data:`PRE_DROP_SLACK_TOKENS`, still exceed ``max_model_len`` less its output (the chat
    template's tokens, which only add, are not counted): a row the count of its decoded prompt
    would keep is not left out here; the others are counted as before."""
    built = block_tokens(row, chunk_size)
    return built - max(built // 4, PRE_DROP_SLACK_TOKENS) > max_model_len - row.output_length


def timed_trace_requests(
    counter: TokenCounter,
    path: str,
    num_prompts: int,
    opts: TimedTraceOptions,
    seed: int,
    max_model_len: int | None = None,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
) -> list[SampleRequest]:
    """vLLM's ``timed_trace`` dataset (see the module docstring): the first ``num_prompts`` rows of
    the trace ``path`` in file order, each a prompt built from its ``hash_ids`` with block seeds of
    ``seed`` (:func:`block_seed`) and decoded to text, asking its output length, with its
    ``timestamp`` scaled to seconds (``opts.sec_multiplier``).

    ``prompt_len`` is counted as the server sees the prompt (the chat endpoint's template and the
    request fields ``options`` included). A row whose prompt and output exceed ``max_model_len`` is
    left out, the next row taken in its place, with a note on stderr (a row far over it before its
    prompt is built: :func:`surely_too_long`); notes also tell of rows whose
    hashes cover fewer tokens than their input length (shorter prompts, as vLLM) and of prompts the
    server counts at another length than the trace's.

    Raises:
        ValueError: an unusable file or row, bad ``opts``, or fewer usable rows than ``num_prompts``
            (vLLM would send fewer requests); one line.
    """
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    opts.validate()
    rows = read_timed_trace(path, opts)
    first = next(rows, None)
    if first is None:
        raise ValueError(f"--dataset-path {path}: no rows (expected one JSON object per line)")
    pool = [int(i) for i in counter.candidate_ids()]
    if not pool:
        raise ValueError("the tokenizer has no non-special vocabulary to draw from")
    blocks: dict[str, list[int]] = {}

    def block_ids(key: str, size: int) -> list[int]:
        if key not in blocks:
            blocks[key] = random.Random(block_seed(key, seed)).choices(pool, k=size)
        return blocks[key]

    encode = prompt_encoder(counter, chat, options)
    overhead = len(encode(""))  # the BOS or the chat template's tokens
    out: list[SampleRequest] = []
    over: list[TraceRow] = []
    short: list[TraceRow] = []
    built = counted = 0  # tokens of the kept prompts' blocks, and as the server counts them
    for row in itertools.chain([first], rows):
        if max_model_len is not None and surely_too_long(row, opts.chunk_hash_size, max_model_len):
            over.append(row)  # left out unbuilt: its prompt could not fit however it re-tokenizes
            continue
        ids = expand_prompt(row.hash_ids, row.input_length, opts.chunk_hash_size, block_ids)
        text = counter.decode(ids)
        n = len(encode(text))
        if max_model_len is not None and n + row.output_length > max_model_len:
            over.append(row)
            continue
        short += [row] if len(ids) < row.input_length else []
        built, counted = built + len(ids), counted + n - overhead
        out.append(SampleRequest(text, n, row.output_length, row.timestamp * opts.sec_multiplier))
        if len(out) == num_prompts:
            break
    if over:
        print(
            f"surge: note: {path}: {len(over)} rows left out: their prompt and output exceed the server's "
            f"max_model_len {max_model_len} (line {over[0].line}: {over[0].input_length} + "
            f"{over[0].output_length} tokens in the trace)",
            file=sys.stderr,
        )
    if not out:  # every row read was over max_model_len (a file without rows is refused above)
        raise ValueError(
            f"--dataset-path {path}: none of its {len(over)} rows fits the server's max_model_len "
            f"{max_model_len} with its output (line {over[0].line}: {over[0].input_length} + "
            f"{over[0].output_length} tokens in the trace); serve the model with a larger --max-model-len"
        )
    if len(out) < num_prompts:
        fit = f" that fit the server's max_model_len {max_model_len}" if over else ""
        vllm = "" if over else f"vLLM would send {len(out)}; "
        raise ValueError(
            f"--dataset-path {path} has {len(out)} rows{fit}, --num-prompts {num_prompts} asked ({vllm}give "
            f"--num-prompts {len(out)} or fewer)"
        )
    if short:
        print(
            f"surge: note: {path}: {len(short)} rows have fewer hash blocks than their input length needs "
            f"(line {short[0].line}: {len(short[0].hash_ids)} blocks of --timed-trace-chunk-hash-size "
            f"{opts.chunk_hash_size} for {short[0].input_length} tokens): their prompts are shorter, as vLLM's",
            file=sys.stderr,
        )
    if counted != built:
        print(
            f"surge: note: the prompts' {built} block tokens are {counted} tokens as the server counts their "
            f"decoded text ({counted / built - 1:+.1%}, without the BOS or chat template), as with vLLM's "
            "prompts; the result reports the server's counts",
            file=sys.stderr,
        )
    return out
