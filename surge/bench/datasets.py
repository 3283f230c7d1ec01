"""Benchmark prompts: ``random`` (exact token counts) and ``sharegpt`` (first human turns).

Random (``shared/design.md`` §5): token ids drawn with ``numpy.random.default_rng(seed)`` from the
tokenizer's non-special vocabulary, decoded, re-encoded and adjusted until the text has exactly
``input_len`` tokens *as the server counts the prompt*: a completions prompt with its special
tokens (such as a BOS), or for the chat endpoint the whole templated chat prompt (the text is the
single user message; the template's role headers count towards ``input_len``, so the server sees
exactly ``input_len`` prompt tokens, which vLLM's random dataset does not guarantee). Request fields
of ``--extra-body`` that change the prompt's tokens (``chat_template_kwargs`` such as Qwen3's
``enable_thinking: false``, ``add_special_tokens``, ...) are counted as the server applies them
(``options``, see :func:`surge.bench.tokens.prompt_options`).

ShareGPT: a list of ``{"id", "conversations": [{"from": "human", "value": ...}, {"from": "gpt",
...}, ...]}`` (vLLM's ``ShareGPT_V3_unfiltered_cleaned_split.json``), shuffled with the seed; the
first human turn is the prompt and the turn after it the reply. As vLLM's ``sharegpt`` dataset:
each request asks as many tokens as its reply has (counted as vLLM counts it, special tokens
included) unless a fixed length is given (vLLM's ``--sharegpt-output-len``); conversations
without a reply are dropped, and so are prompts under 4 tokens or over 1,024, prompts whose output
takes them over 2,048 tokens, and (reply lengths only) replies under 4 tokens. Two differences: the
prompt is counted as the server will see it (templated on the chat endpoint; vLLM counts the raw
text), and the first human turn is taken wherever it is (vLLM takes turns 0 and 1 whatever their
roles). A file without any reply (``shared/assets/datasets/sharegpt/*.json`` keep only the
prompts) asks ``--output-len`` of every request.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from surge.bench.tokens import TokenCounter

MAX_ADJUST_ROUNDS = 30


@dataclass(frozen=True)
class SampleRequest:
    """One benchmark prompt. ``prompt_len`` in tokens as counted for a completions prompt."""

    prompt: str
    prompt_len: int
    expected_output_len: int


def prompt_encoder(
    counter: TokenCounter, chat: bool, options: Mapping[str, Any] | None = None
) -> Callable[[str], list[int]]:
    """How the server counts a prompt text: as a completions prompt, or (``chat``) as the single
    user message of a chat request, chat template included, under the request fields
    ``options`` that change the prompt's tokens (:func:`surge.bench.tokens.prompt_options` of
    ``--extra-body``, e.g. ``chat_template_kwargs`` or ``add_special_tokens``)."""
    opts = dict(options or {})
    if chat:
        return (lambda text: counter.encode_chat(text, opts)) if opts else counter.encode_chat
    if opts.get("add_special_tokens") is False:
        return lambda text: counter.encode(text, add_special_tokens=False)
    return counter.encode


def exact_length_prompt(
    counter: TokenCounter,
    rng: np.random.Generator,
    n_tokens: int,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
) -> str:
    """A random text of exactly ``n_tokens`` tokens as the server counts it.

    Without ``chat`` the text is counted as a completions prompt; with ``chat`` as the user
    message of a chat request, so that the templated prompt has exactly ``n_tokens`` tokens.
    ``options`` are the request fields that change the count (see :func:`prompt_encoder`).
    Draws ids from ``counter.candidate_ids()``, decodes, re-counts and trims or extends the id
    list by the difference until the count is exact (restarting with fresh draws if it cycles).
    Raises:
        ValueError: ``n_tokens`` is below the fixed overhead (a BOS, or the chat template's own
            tokens plus one), or no exact text was found.
    """
    pool = counter.candidate_ids()
    if len(pool) == 0:
        raise ValueError("the tokenizer has no non-special vocabulary to draw from")
    encode = prompt_encoder(counter, chat, options)
    overhead = len(encode(""))
    minimum = overhead + 1 if chat else max(overhead, 1)
    if n_tokens < minimum:
        what = "the chat template's" if chat else "the tokenizer's"
        raise ValueError(f"input length {n_tokens} is below {what} minimum of {minimum}")
    for _attempt in range(5):
        ids = [int(i) for i in rng.choice(pool, size=n_tokens - overhead)]
        for _ in range(MAX_ADJUST_ROUNDS):
            text = counter.decode(ids)
            count = len(encode(text))
            if count == n_tokens:
                return text
            diff = n_tokens - count
            if diff < 0:
                ids = ids[: max(len(ids) + diff, 0)]
            else:
                ids = ids + [int(i) for i in rng.choice(pool, size=diff)]
    raise ValueError(f"could not build a prompt of exactly {n_tokens} tokens")


def range_bounds(length: int, ratio: float) -> tuple[int, int]:
    """The lengths (tokens) ``--random-range-ratio`` draws from, as vLLM's random dataset:
    integers in ``[int(length * (1 - ratio)), int(length * (1 + ratio))]``, at least 1."""
    return max(1, int(length * (1 - ratio))), max(1, int(length * (1 + ratio)))


def random_requests(
    counter: TokenCounter,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    range_ratio: float = 0.0,
) -> list[SampleRequest]:
    """``num_prompts`` random prompts of exactly ``input_len`` tokens as the server counts them
    (templated for ``chat``, under the request fields ``options``), each asking ``output_len``
    tokens. With ``range_ratio`` r > 0 (vLLM's ``--random-range-ratio``) each request's input and
    output lengths are drawn uniformly from :func:`range_bounds` instead (integers, seeded by
    ``seed``), and each prompt still has exactly its drawn length.

    Raises:
        ValueError: a count or length below 1, r outside [0, 1), or a drawn input length below
            the tokenizer's or chat template's minimum.
    """
    if num_prompts < 1 or output_len < 1:
        raise ValueError("--num-prompts and --output-len must be >= 1")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    if range_ratio == 0.0:  # the fixed lengths draw nothing else: the same prompts as before the option
        in_lens, out_lens = [input_len] * num_prompts, [output_len] * num_prompts
    else:
        lengths = np.random.default_rng([seed, 1])  # its own stream: the prompts' draws stay as they are
        (in_lo, in_hi), (out_lo, out_hi) = (
            range_bounds(input_len, range_ratio),
            range_bounds(output_len, range_ratio),
        )
        in_lens = [int(v) for v in lengths.integers(in_lo, in_hi + 1, size=num_prompts)]
        out_lens = [int(v) for v in lengths.integers(out_lo, out_hi + 1, size=num_prompts)]
    out: list[SampleRequest] = []
    for n_in, n_out in zip(in_lens, out_lens, strict=True):
        try:
            prompt = exact_length_prompt(counter, rng, n_in, chat, options)
        except ValueError as e:
            if range_ratio == 0.0:
                raise
            raise ValueError(f"--random-range-ratio {range_ratio} drew {e}") from None
        out.append(SampleRequest(prompt, n_in, n_out))
    return out


# vLLM's pruning of ShareGPT conversations whose reply gives the output length (tokens)
SHAREGPT_MIN_LEN = 4
SHAREGPT_MAX_PROMPT_LEN = 1024
SHAREGPT_MAX_TOTAL_LEN = 2048


@dataclass(frozen=True)
class Conversation:
    """A ShareGPT conversation's first human turn and the turn that answers it (None: none)."""

    prompt: str
    reply: str | None


def load_sharegpt(path: str) -> list[Conversation]:
    """The first human turn of every conversation in a ShareGPT JSON file, with its reply.

    Raises:
        ValueError: missing file or not the ShareGPT list format.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--dataset-path {path}: is a directory (give the ShareGPT JSON file)")
    if not p.is_file():
        raise ValueError(f"--dataset-path {path}: no such file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"--dataset-path {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ValueError(f"--dataset-path {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--dataset-path {path}: not JSON ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"--dataset-path {path}: expected a list of conversations")
    out: list[Conversation] = []
    for item in data:
        convs = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(convs, list):
            continue
        for i, turn in enumerate(convs):
            if isinstance(turn, dict) and turn.get("from") == "human" and isinstance(turn.get("value"), str):
                nxt = convs[i + 1] if i + 1 < len(convs) else None
                reply = nxt.get("value") if isinstance(nxt, dict) and nxt.get("from") != "human" else None
                out.append(Conversation(turn["value"], reply if isinstance(reply, str) else None))
                break
    if not out:
        raise ValueError(f"--dataset-path {path}: no human turns found")
    return out


def sharegpt_requests(
    counter: TokenCounter,
    path: str,
    num_prompts: int,
    output_len: int,
    seed: int,
    max_model_len: int | None = None,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    fixed_output_len: int | None = None,
) -> list[SampleRequest]:
    """``num_prompts`` ShareGPT first turns (shuffled by ``seed``) with their output lengths.

    A request asks ``fixed_output_len`` tokens when given, else its reply's token count (vLLM's
    rule and pruning, see the module docstring), else (a file without replies) ``output_len``.
    A prompt's length is counted as the server will see it (templated for ``chat``, under the
    request fields ``options``); a reply's as vLLM counts it.

    Raises:
        ValueError: the file is unusable or holds fewer usable prompts than ``num_prompts``.
    """
    conversations = load_sharegpt(path)
    encode = prompt_encoder(counter, chat, options)
    replies = any(c.reply is not None for c in conversations)
    if not replies and fixed_output_len is None:  # documented, but easy to miss: say it
        print(
            f"surge: note: {path} has no replies; every request asks --output-len {output_len}",
            file=sys.stderr,
        )
    order = np.random.default_rng(seed).permutation(len(conversations))
    out: list[SampleRequest] = []
    for idx in order:
        conv = conversations[int(idx)]
        if replies and conv.reply is None:
            continue  # vLLM keeps only conversations of two turns or more
        n = len(encode(conv.prompt))
        if fixed_output_len is not None:
            want = fixed_output_len
        elif conv.reply is not None:
            # vLLM's count: tokenizer(reply).input_ids, special tokens (a BOS) included
            want = len(counter.encode(conv.reply))
            if want < SHAREGPT_MIN_LEN:
                continue
        else:
            want = output_len
        if n < SHAREGPT_MIN_LEN or n > SHAREGPT_MAX_PROMPT_LEN or n + want > SHAREGPT_MAX_TOTAL_LEN:
            continue
        if max_model_len is not None and n + want > max_model_len:
            continue
        out.append(SampleRequest(conv.prompt, n, want))
        if len(out) == num_prompts:
            return out
    context = f"; the server's max_model_len {max_model_len}" if max_model_len is not None else ""
    raise ValueError(
        f"{path} has only {len(out)} usable prompts, {num_prompts} asked (vLLM's pruning: prompts of "
        f"{SHAREGPT_MIN_LEN} to {SHAREGPT_MAX_PROMPT_LEN} tokens, at most {SHAREGPT_MAX_TOTAL_LEN} with "
        f"the output{context})"
    )
