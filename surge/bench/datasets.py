"""Benchmark prompts: ``random`` (exact token counts), ``sharegpt`` (first human turns), ``custom``
(a JSONL file of prompts), ``prefix_repetition`` (random prompts over shared prefixes), ``sonnet``
(lines drawn from a text file) and ``burstgpt`` (the lengths of BurstGPT trace rows).

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
...}, ...]}`` (vLLM's ``ShareGPT_V3_unfiltered_cleaned_split.json``), in vLLM's order: the
conversations of two turns or more, shuffled by Python's ``random`` seeded with the seed; the
first human turn is the prompt and the turn after it the reply. As vLLM's ``sharegpt`` dataset:
each request asks as many tokens as its reply has (counted as vLLM counts it, special tokens
included) unless a fixed length is given (vLLM's ``--sharegpt-output-len``); conversations
without a reply are dropped, and so are prompts under 4 tokens or over 1,024, prompts whose output
takes them over 2,048 tokens, and (reply lengths only) replies under 4 tokens, each counted as vLLM
counts it (the raw text with its BOS, on either endpoint). Two differences: the request's prompt length
is counted as the server will see it (templated on the chat endpoint; vLLM reports the raw text's
count), and so is the check against the server's ``max_model_len``, and the first human turn is taken wherever it is (vLLM takes turns 0 and 1 whatever their
roles; a conversation without a human turn is left out before the shuffle, so a file with one
orders the rest otherwise than vLLM). A file without any reply (``shared/assets/datasets/sharegpt/*.json`` keep only the
prompts) asks ``--output-len`` of every request.

Shared prefixes (vLLM's ``--random-prefix-len`` and ``prefix_repetition``): a random text of exactly N
tokens counted without special tokens (:func:`shared_prefix`), then a space and the prompt's own random
tokens, the whole prompt exact as the server counts it (N + the input or suffix length, which covers
the BOS or chat template). A prompt is kept only when the server's tokens still hold the prefix's N
ids at the same place (after the BOS or the template's header), so the prefix is really shared.

Custom (vLLM's ``CustomDataset``): see :func:`custom_requests`. Sonnet and BurstGPT (vLLM's
``SonnetDataset`` and ``BurstGPTDataset``): see :func:`sonnet_requests` and :func:`burstgpt_requests`.
vLLM's ``timed_trace`` (the replay of a timed request trace) is :mod:`surge.bench.timed_trace`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from surge.bench.tokens import TokenCounter

MAX_ADJUST_ROUNDS = 30
PREFIX_ATTEMPTS = 20  # draws of a prompt whose random part must leave a shared prefix's tokens as they are


@dataclass(frozen=True)
class SampleRequest:
    """One benchmark prompt. ``prompt_len`` in tokens as counted for a completions prompt;
    ``timestamp``: when a timed trace sends it, seconds after the start of the run (None: the
    arrival schedule of ``--request-rate`` decides)."""

    prompt: str
    prompt_len: int
    expected_output_len: int
    timestamp: float | None = None


def fewer_prompts_note(path: str, have: int, what: str, num_prompts: int) -> None:
    """vLLM's ``--no-oversample`` with a file of ``have`` < ``num_prompts`` usable prompts: one
    note on stderr that the run sends those ``have`` (vLLM's behaviour; without the flag Surge
    refuses the run where vLLM would send some prompts twice)."""
    print(
        f"surge: note: {path} has {have} {what}: sending those {have}, not --num-prompts {num_prompts} "
        "(--no-oversample, as vLLM)",
        file=sys.stderr,
    )


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


def least_prompt_len(counter: TokenCounter, chat: bool, options: Mapping[str, Any] | None = None) -> int:
    """The shortest prompt :func:`exact_length_prompt` builds, in tokens as the server counts
    them: the chat template's own tokens plus one (``chat``), else the BOS (at least 1 token).
    ``options`` as for :func:`prompt_encoder`."""
    overhead = len(prompt_encoder(counter, chat, options)(""))
    return overhead + 1 if chat else max(overhead, 1)


class PromptTooShortError(ValueError):
    """A prompt length below the fixed overhead of every prompt (:func:`exact_length_prompt`).

    Attributes:
        n_tokens: the length asked, in tokens.
        minimum: the least length a prompt can have (the BOS or the chat template's tokens, plus
            one token of the prompt's own where there is a template or a head).
        chat: the length counts a templated chat prompt.
    """

    def __init__(self, n_tokens: int, minimum: int, chat: bool) -> None:
        self.what = "the chat template's" if chat else "the tokenizer's"
        super().__init__(f"input length {n_tokens} is below {self.what} minimum of {minimum}")
        self.n_tokens, self.minimum, self.chat = n_tokens, minimum, chat


def exact_length_prompt(
    counter: TokenCounter,
    rng: np.random.Generator,
    n_tokens: int,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    head: str = "",
    keep: Callable[[list[int]], bool] | None = None,
) -> str:
    """A random text of exactly ``n_tokens`` tokens as the server counts it.

    Without ``chat`` the text is counted as a completions prompt; with ``chat`` as the user
    message of a chat request, so that the templated prompt has exactly ``n_tokens`` tokens.
    ``options`` are the request fields that change the count (see :func:`prompt_encoder`).
    Draws ids from ``counter.candidate_ids()``, decodes, re-counts and trims or extends the id
    list by the difference until the count is exact (restarting with fresh draws if it cycles).
    With ``head`` the text is ``head`` followed by the random part (``head``'s tokens count in
    ``n_tokens``), and a text is taken only when ``keep`` (if given) accepts its token ids as the
    server counts them (restarting with fresh draws otherwise).

    Raises:
        PromptTooShortError: ``n_tokens`` is below the fixed overhead (a BOS, or the chat
            template's own tokens plus one; with ``head``, its tokens plus one).
        ValueError: no exact text was found.
    """
    pool = counter.candidate_ids()
    if len(pool) == 0:
        raise ValueError("the tokenizer has no non-special vocabulary to draw from")
    encode = prompt_encoder(counter, chat, options)
    overhead = len(encode(head))
    minimum = overhead + 1 if chat or head else max(overhead, 1)
    if n_tokens < minimum:
        raise PromptTooShortError(n_tokens, minimum, chat)
    for _attempt in range(PREFIX_ATTEMPTS if keep is not None else 5):
        ids = [int(i) for i in rng.choice(pool, size=n_tokens - overhead)]
        for _ in range(MAX_ADJUST_ROUNDS):
            text = head + counter.decode(ids)
            tokens = encode(text)
            count = len(tokens)
            if count == n_tokens:
                if keep is None or keep(tokens):
                    return text
                break  # the random part changed the head's tokens: draw again
            diff = n_tokens - count
            if diff < 0:
                ids = ids[: max(len(ids) + diff, 0)]
            else:
                ids = ids + [int(i) for i in rng.choice(pool, size=diff)]
    raise ValueError(f"could not build a prompt of exactly {n_tokens} tokens")


def range_bounds(length: int, ratio: float, special: int = 0) -> tuple[int, int]:
    """The lengths (tokens) ``--random-range-ratio`` draws from, as vLLM's random dataset
    (``get_sampling_params``): the ``special`` tokens the tokenizer adds to every prompt (a BOS;
    vLLM's ``num_special_tokens_to_add()``, 0 for an output length) are not scaled, so the bounds
    are ``special`` plus the integers in ``[floor(m * (1 - ratio)), ceil(m * (1 + ratio))]`` for
    ``m = length - special``, at least 1 (the mean drawn length is ``length`` when the bounds are
    whole, as in vLLM)."""
    m = max(length - special, 0)
    return (
        max(1, special + math.floor(m * (1 - ratio))),
        max(1, special + math.ceil(m * (1 + ratio))),
    )


def special_tokens_added(counter: TokenCounter) -> int:
    """How many special tokens the tokenizer adds to every text it encodes (a BOS: 1 for Llama,
    0 for Qwen3), vLLM's ``tokenizer.num_special_tokens_to_add()``."""
    return len(counter.encode(""))


def random_requests(
    counter: TokenCounter,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    output_range_ratio: float | None = None,
    *,
    input_len_flag: str = "--input-len",
    output_len_flag: str = "--output-len",
) -> list[SampleRequest]:
    """``num_prompts`` random prompts of exactly ``input_len`` tokens as the server counts them
    (templated for ``chat``, under the request fields ``options``), each asking ``output_len``
    tokens. With ``range_ratio`` r > 0 (vLLM's ``--random-range-ratio``) each request's input and
    output lengths are drawn uniformly from :func:`range_bounds` instead (integers, seeded by
    ``seed``; the tokenizer's special tokens are not scaled: :func:`special_tokens_added`, as
    vLLM), and each prompt still has exactly its drawn length; ``output_range_ratio`` (vLLM's
    ``{"input": r, "output": r2}`` form) draws the output lengths with its own ratio instead of r.
    With ``prefix_len`` N > 0
    (vLLM's ``--random-prefix-len``) every prompt begins with the same :func:`shared_prefix` of N
    tokens and has exactly N + its input length tokens as the server counts them (the input
    length covers the random part, the BOS or chat template, and the separator after the prefix).
    ``input_len_flag`` and ``output_len_flag`` are the flags the user gave the lengths with
    (``--random-input-len`` is vLLM's spelling of ``--input-len``), which errors name.

    Raises:
        ValueError: a count or length below 1 (N below 0), r outside [0, 1), or a (drawn) input
            length below the tokenizer's or chat template's minimum (naming the least
            ``input_len_flag`` and, on the chat endpoint, ``--endpoint /v1/completions``).
    """
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    if output_len < 1:
        raise ValueError(f"{output_len_flag} must be >= 1, got {output_len}")
    out_ratio = range_ratio if output_range_ratio is None else output_range_ratio
    for ratio in (range_ratio, out_ratio):
        if not 0.0 <= ratio < 1.0:
            raise ValueError(f"--random-range-ratio must be in [0, 1), got {ratio}")
    if prefix_len < 0:
        raise ValueError(f"--random-prefix-len must be >= 0, got {prefix_len}")
    rng = np.random.default_rng(seed)
    if (
        range_ratio == 0.0 and out_ratio == 0.0
    ):  # fixed lengths draw nothing: the prompts as before the option
        in_lens, out_lens = [input_len] * num_prompts, [output_len] * num_prompts
    else:
        lengths = np.random.default_rng([seed, 1])  # its own stream: the prompts' draws stay as they are
        (in_lo, in_hi), (out_lo, out_hi) = (
            range_bounds(input_len, range_ratio, special_tokens_added(counter)),
            range_bounds(output_len, out_ratio),
        )
        in_lens = [int(v) for v in lengths.integers(in_lo, in_hi + 1, size=num_prompts)]
        out_lens = [int(v) for v in lengths.integers(out_lo, out_hi + 1, size=num_prompts)]
    if prefix_len:
        prefix = shared_prefix(counter, np.random.default_rng([seed, 2]), prefix_len, chat, options)
        least = prefix.least_rest(counter, chat, options)
        if min(in_lens) < least:
            drew = f"--random-range-ratio {range_ratio} drew " if range_ratio else ""
            raise ValueError(
                f"{drew}{input_len_flag} {min(in_lens)} is below the minimum of {least} with --random-prefix-len "
                f"{prefix_len} (one random token after the prefix, with the BOS or chat template's tokens)"
            )
        return [
            SampleRequest(
                prefix.prompt(counter, rng, prefix_len + n_in, chat, options), prefix_len + n_in, n_out
            )
            for n_in, n_out in zip(in_lens, out_lens, strict=True)
        ]
    out: list[SampleRequest] = []
    for n_in, n_out in zip(in_lens, out_lens, strict=True):
        try:
            prompt = exact_length_prompt(counter, rng, n_in, chat, options)
        except PromptTooShortError as e:
            if range_ratio != 0.0:
                raise ValueError(f"--random-range-ratio {range_ratio} drew {e}") from None
            # what to do instead: on the chat endpoint a Llama 3.1 template alone is 35 tokens
            other = ", or --endpoint /v1/completions (no chat template)" if e.chat else ""
            raise ValueError(
                f"{input_len_flag} {e.n_tokens} is below {e.what} minimum of {e.minimum}: give "
                f"{input_len_flag} {e.minimum} or more{other}"
            ) from None
        except ValueError as e:
            if range_ratio == 0.0:
                raise
            raise ValueError(f"--random-range-ratio {range_ratio} drew {e}") from None
        out.append(SampleRequest(prompt, n_in, n_out))
    return out


PREFIX_SEPARATOR = " "
"""Put between a shared prefix and a prompt's own tokens, so that the first of these does not merge
with the prefix's last token (BPE pre-tokenizers split at spaces)."""


@dataclass(frozen=True)
class SharedPrefix:
    """A random text of ``len(ids)`` tokens that prompts begin with.

    ``ids`` are its tokens counted without special tokens, ``offset`` where they sit in the
    server's tokens of a prompt that begins with it (after a BOS, or the chat template's header).
    """

    text: str
    ids: tuple[int, ...]
    offset: int

    def keeps(self, tokens: list[int]) -> bool:
        """True when a prompt's tokens (as the server counts them) hold the prefix's tokens."""
        return tuple(tokens[self.offset : self.offset + len(self.ids)]) == self.ids

    def least_rest(self, counter: TokenCounter, chat: bool, options: Mapping[str, Any] | None) -> int:
        """The fewest tokens a prompt may have besides the prefix's (the BOS or chat template, the
        separator and one random token), as the server counts them."""
        return len(prompt_encoder(counter, chat, options)(self.text + PREFIX_SEPARATOR)) + 1 - len(self.ids)

    def prompt(
        self,
        counter: TokenCounter,
        rng: np.random.Generator,
        n_tokens: int,
        chat: bool,
        options: Mapping[str, Any] | None,
    ) -> str:
        """A prompt of exactly ``n_tokens`` tokens as the server counts it: this prefix, the
        separator, then random tokens; the server's tokens hold the prefix's at ``offset``.

        Raises:
            ValueError: ``n_tokens`` below ``len(ids) + least_rest``, or no such text was found.
        """
        try:
            return exact_length_prompt(
                counter, rng, n_tokens, chat, options, head=self.text + PREFIX_SEPARATOR, keep=self.keeps
            )
        except ValueError as e:
            raise ValueError(f"{e} (after a shared prefix of {len(self.ids)} tokens)") from None


def shared_prefix(
    counter: TokenCounter,
    rng: np.random.Generator,
    n_tokens: int,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
) -> SharedPrefix:
    """A random text of exactly ``n_tokens`` tokens counted without special tokens (as vLLM's
    random and prefix-repetition datasets count a prefix), placed where its tokens stay the same
    at the start of a prompt (completions, or the user message of a chat request).

    Raises:
        ValueError: ``n_tokens`` below 1, or no such text was found.
    """
    if n_tokens < 1:
        raise ValueError(f"a shared prefix needs at least 1 token, got {n_tokens}")
    bare = {"add_special_tokens": False}
    encode = prompt_encoder(counter, chat, options)
    for _attempt in range(5):
        text = exact_length_prompt(counter, rng, n_tokens, False, bare)
        ids = tuple(counter.encode(text, add_special_tokens=False))
        whole = encode(text + PREFIX_SEPARATOR)
        for offset in range(len(whole) - n_tokens + 1):
            if tuple(whole[offset : offset + n_tokens]) == ids:
                return SharedPrefix(text, ids, offset)
    raise ValueError(f"could not build a shared prefix of {n_tokens} tokens that prompts keep")


def prefix_repetition_requests(
    counter: TokenCounter,
    num_prompts: int,
    prefix_len: int,
    suffix_len: int,
    num_prefixes: int,
    output_len: int,
    seed: int,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    shuffle: bool = True,
) -> list[SampleRequest]:
    """vLLM's ``prefix_repetition`` dataset (``shuffle`` False: vLLM's ``--disable-shuffle``, the
    prompts in prefix order): ``num_prefixes`` :func:`shared_prefix` texts of
    ``prefix_len`` tokens, each followed by random suffixes; every prompt has exactly
    ``prefix_len + suffix_len`` tokens as the server counts them (the suffix length covers the
    BOS or chat template and the separator) and asks ``output_len`` tokens. The ``num_prompts``
    prompts are spread over the prefixes as evenly as possible (vLLM sends ``num_prefixes *
    (num_prompts // num_prefixes)``, dropping the rest) and shuffled with ``seed``.

    Raises:
        ValueError: a length or count below 1, fewer prompts than prefixes (as vLLM), or a
            suffix below the BOS's or chat template's minimum.
    """
    for flag, value in (
        ("--prefix-repetition-prefix-len", prefix_len),
        ("--prefix-repetition-suffix-len", suffix_len),
        ("--prefix-repetition-num-prefixes", num_prefixes),
        ("--prefix-repetition-output-len", output_len),
        ("--num-prompts", num_prompts),
    ):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if num_prompts < num_prefixes:
        raise ValueError(
            f"--num-prompts {num_prompts} is below --prefix-repetition-num-prefixes {num_prefixes} "
            "(every prefix needs a prompt)"
        )
    prefix_rng, rng = np.random.default_rng([seed, 2]), np.random.default_rng(seed)
    out: list[SampleRequest] = []
    for k in range(num_prefixes):
        prefix = shared_prefix(counter, prefix_rng, prefix_len, chat, options)
        least = prefix.least_rest(counter, chat, options)
        if suffix_len < least:
            raise ValueError(
                f"--prefix-repetition-suffix-len {suffix_len} is below the minimum of {least} (one random "
                "token after the prefix, with the BOS or chat template's tokens)"
            )
        count = num_prompts // num_prefixes + (1 if k < num_prompts % num_prefixes else 0)
        for _ in range(count):
            prompt = prefix.prompt(counter, rng, prefix_len + suffix_len, chat, options)
            out.append(SampleRequest(prompt, prefix_len + suffix_len, output_len))
    if not shuffle:
        return out
    order = np.random.default_rng([seed, 3]).permutation(len(out))
    return [out[int(i)] for i in order]


_FILE_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
)


def dataset_file(path: str, what: str) -> Path:
    """``--dataset-path`` as a regular file; ``what`` names the expected file (``ShareGPT JSON
    file``) in the messages. An empty file passes: each dataset says what it lacks ("no lines").

    Raises:
        ValueError: one line naming the flag: no such file, a folder, not a regular file (a device
            such as ``/dev/null``, a named pipe, a socket), or a path that cannot be looked at (no
            permission).
    """
    p = Path(path)
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(f"--dataset-path {path}: no such file") from None
    except OSError as e:
        raise ValueError(f"--dataset-path {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"--dataset-path {path}: is a directory (give the {what})")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "not a file")
        raise ValueError(f"--dataset-path {path}: not a regular file ({kind}; give the {what})")
    return p


def _read_text(path: str, what: str) -> str:
    """The text of ``--dataset-path``. Raises ValueError naming the flag (see
    :func:`dataset_file`; unreadable, not UTF-8); ``what`` names the expected file."""
    p = dataset_file(path, what)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"--dataset-path {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ValueError(f"--dataset-path {path}: {e.strerror or e}") from None


@dataclass(frozen=True)
class CustomPrompt:
    """One line of a custom dataset: its ``prompt``, its ``output_tokens`` (None: absent; any
    JSON value otherwise, checked when used) and its line number (1-based)."""

    prompt: str
    output_tokens: Any
    line: int


def load_custom(path: str) -> list[CustomPrompt]:
    """The lines of a custom JSONL dataset (vLLM's ``custom``): one JSON object per line with a
    ``prompt`` string and optionally ``output_tokens``; blank lines are skipped, other keys
    ignored.

    Raises:
        ValueError: missing or unreadable file, a line that is not a JSON object, a line without
            a non-empty ``prompt`` string, or no line at all (one line naming the file and line).
    """
    out: list[CustomPrompt] = []
    for n, line in enumerate(_read_text(path, "JSONL file").splitlines(), start=1):
        if not line.strip():
            continue
        hint = " (a custom dataset is JSON Lines: one object a line)" if line.lstrip()[:1] == "[" else ""
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--dataset-path {path}: line {n}: not JSON ({e}){hint}") from None
        if not isinstance(item, dict):
            raise ValueError(f'--dataset-path {path}: line {n}: expected a JSON object with a "prompt"{hint}')
        prompt = item.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            got = 'no "prompt"' if "prompt" not in item else f'"prompt" {json.dumps(prompt)[:40]}'
            raise ValueError(
                f"--dataset-path {path}: line {n}: {got} (every line needs a non-empty prompt string)"
            )
        out.append(CustomPrompt(prompt, item.get("output_tokens"), n))
    if not out:
        raise ValueError(f"--dataset-path {path}: no prompts (expected one JSON object per line)")
    return out


def _output_tokens(path: str, item: CustomPrompt) -> int:
    """A line's ``output_tokens`` (``--custom-output-len -1``). Raises ValueError naming the line."""
    value = item.output_tokens
    if value is None:
        raise ValueError(
            f'--dataset-path {path}: line {item.line} has no "output_tokens" (--custom-output-len -1 takes '
            "each line's; give a length instead)"
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f'--dataset-path {path}: line {item.line}: "output_tokens" must be an integer >= 1, got '
            f"{json.dumps(value)}"
        )
    return value


def custom_requests(
    counter: TokenCounter,
    path: str,
    num_prompts: int,
    output_len: int | None,
    seed: int,
    max_model_len: int | None = None,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    skip_chat_template: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    shuffle: bool = True,
    fewer_ok: bool = False,
) -> list[SampleRequest]:
    """``num_prompts`` prompts of a custom JSONL file (:func:`load_custom`), in vLLM's order (the
    lines shuffled by Python's ``random`` seeded with ``seed``; ``shuffle`` False, vLLM's
    ``--disable-shuffle``: the file's order).

    Each asks ``output_len`` tokens, or (None: vLLM's ``--custom-output-len -1``) its line's
    ``output_tokens``. As vLLM, a completions prompt is the prompt rendered with the model's chat
    template (the user message, with the generation prompt, and the template variables
    ``chat_template_kwargs``: vLLM's ``--chat-template-kwargs``) unless ``skip_chat_template``; on the
    chat endpoint the prompt is the user message and the server applies the template (vLLM's
    client would apply it a second time). Lengths are counted as the server will see the prompt.

    Raises:
        ValueError: an unusable file or line, fewer prompts than ``num_prompts`` (vLLM would
            repeat some), or a prompt whose length and output exceed ``max_model_len``.
    """
    items = load_custom(path)
    if output_len is None:
        for item in items:
            _output_tokens(path, item)
    if fewer_ok and 0 < len(items) < num_prompts:  # vLLM's --no-oversample
        fewer_prompts_note(path, len(items), "prompts", num_prompts)
        num_prompts = len(items)
    if len(items) < num_prompts:
        raise ValueError(
            f"{path} has {len(items)} prompts, --num-prompts {num_prompts} asked (vLLM would send some "
            f"twice; give --num-prompts {len(items)} or fewer)"
        )
    encode = prompt_encoder(counter, chat, options)
    order = list(range(len(items)))
    if shuffle:
        random.Random(seed).shuffle(order)  # vLLM's order: Python's random seeded with --seed
    out: list[SampleRequest] = []
    for idx in order[:num_prompts]:
        item = items[idx]
        text = item.prompt
        if not chat and not skip_chat_template:
            text = counter.render_chat(text, chat_template_kwargs)
        n = len(encode(text))
        want = _output_tokens(path, item) if output_len is None else output_len
        if max_model_len is not None and n + want > max_model_len:
            raise ValueError(
                f"{path} line {item.line}: a prompt of {n} tokens and {want} output tokens exceed the "
                f"server's max_model_len {max_model_len}"
            )
        out.append(SampleRequest(text, n, want))
    return out


# vLLM's pruning of ShareGPT conversations whose reply gives the output length (tokens)
SHAREGPT_MIN_LEN = 4
SHAREGPT_MAX_PROMPT_LEN = 1024
SHAREGPT_MAX_TOTAL_LEN = 2048


@dataclass(frozen=True)
class Conversation:
    """A ShareGPT conversation's first human turn and the turn that answers it (None: none), and
    how many turns the conversation has (vLLM shuffles only those of two turns or more)."""

    prompt: str
    reply: str | None
    turns: int = 1


def load_sharegpt(path: str) -> list[Conversation]:
    """The first human turn of every conversation in a ShareGPT JSON file, with its reply.

    Raises:
        ValueError: missing file or not the ShareGPT list format.
    """
    text = _read_text(path, "ShareGPT JSON file")
    if not text.strip():
        raise ValueError(f"--dataset-path {path}: the file is empty (expected a JSON list of conversations)")
    try:
        data = json.loads(text)
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
                out.append(Conversation(turn["value"], reply if isinstance(reply, str) else None, len(convs)))
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
    shuffle: bool = True,
    fewer_ok: bool = False,
) -> list[SampleRequest]:
    """``num_prompts`` ShareGPT first turns (shuffled by ``seed``; ``shuffle`` False, vLLM's
    ``--disable-shuffle``: in the file's order) with their output lengths.

    A request asks ``fixed_output_len`` tokens when given, else its reply's token count (vLLM's
    rule and pruning, see the module docstring), else (a file without replies) ``output_len``.
    A prompt's length is counted as the server will see it (templated for ``chat``, under the
    request fields ``options``: the request's ``prompt_len`` and the ``max_model_len`` check), and
    pruned on vLLM's count (the raw text with its BOS, whatever the endpoint), so that a seed
    picks vLLM's conversations on either endpoint; a reply's as vLLM counts it.

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
    # vLLM's order: the conversations of two turns or more, shuffled by Python's random seeded with
    # --seed (a file without replies, which vLLM could not use, has all its conversations shuffled)
    pool = [c for c in conversations if c.turns >= 2] if replies else list(conversations)
    if shuffle:
        random.Random(seed).shuffle(pool)
    out: list[SampleRequest] = []
    for conv in pool:
        if conv.reply is None and replies:
            continue  # vLLM keeps only conversations of two turns or more
        n = len(encode(conv.prompt))  # as the server counts it: the request's prompt_len
        # vLLM prunes on tokenizer(prompt).input_ids, the raw text with its BOS, whatever the
        # endpoint: the same count picks the same conversations on the chat endpoint too
        n_vllm = len(counter.encode(conv.prompt)) if chat or options else n
        if fixed_output_len is not None:
            want = fixed_output_len
        elif conv.reply is not None:
            # vLLM's count: tokenizer(reply).input_ids, special tokens (a BOS) included
            want = len(counter.encode(conv.reply))
            if want < SHAREGPT_MIN_LEN:
                continue
        else:
            want = output_len
        if (
            n_vllm < SHAREGPT_MIN_LEN
            or n_vllm > SHAREGPT_MAX_PROMPT_LEN
            or n_vllm + want > SHAREGPT_MAX_TOTAL_LEN
        ):
            continue
        if max_model_len is not None and n + want > max_model_len:
            continue
        out.append(SampleRequest(conv.prompt, n, want))
        if len(out) == num_prompts:
            return out
    if fewer_ok and out:  # vLLM's --no-oversample
        fewer_prompts_note(path, len(out), "usable prompts", num_prompts)
        return out
    context = f"; the server's max_model_len {max_model_len}" if max_model_len is not None else ""
    raise ValueError(
        f"{path} has only {len(out)} usable prompts, {num_prompts} asked (vLLM's pruning: prompts of "
        f"{SHAREGPT_MIN_LEN} to {SHAREGPT_MAX_PROMPT_LEN} tokens, at most {SHAREGPT_MAX_TOTAL_LEN} with "
        f"the output{context})"
    )


SONNET_INSTRUCTION = "Pick as many lines as you can from these poem lines:\n"
"""The text every sonnet prompt begins with, before its lines (vLLM's)."""
SONNET_MAX_REJECTIONS = 1000
"""Draws of a sonnet prompt over ``--sonnet-input-len`` in a row before giving up (vLLM draws forever)."""


def load_lines(path: str) -> list[str]:
    """The lines of a text file as Python's ``readlines`` gives them (each with its newline, blank
    lines kept), as vLLM's sonnet dataset reads its file.

    Raises:
        ValueError: missing or unreadable file, or no line at all (one line naming the file).
    """
    lines = io.StringIO(_read_text(path, "text file")).readlines()
    if not lines:
        raise ValueError(f"--dataset-path {path}: no lines (the sonnet dataset draws a text file's lines)")
    return lines


def sonnet_requests(
    counter: TokenCounter,
    path: str,
    num_prompts: int,
    input_len: int,
    prefix_len: int,
    output_len: int,
    seed: int,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
    *,
    input_len_flag: str = "--sonnet-input-len",
    output_len_flag: str = "--sonnet-output-len",
) -> list[SampleRequest]:
    """vLLM's ``sonnet`` dataset: ``num_prompts`` prompts of :data:`SONNET_INSTRUCTION` followed by
    lines of the text file ``path`` (:func:`load_lines`), each asking ``output_len`` tokens.

    As vLLM: a line's length is its token count with special tokens (a BOS counts), ``L`` the mean
    over the file's lines, ``B`` the instruction's length as the server counts it (chat-templated);
    a prompt has ``max(round((input_len - B) / L), 1)`` lines, of which the file's first
    ``max(round((prefix_len - B) / L), 0)`` lines (the prefix every prompt shares) and the rest
    drawn with replacement by ``random.Random(seed).choices`` (vLLM seeds Python's ``random`` with
    ``--seed``); a draw whose prompt has more than ``input_len`` tokens is drawn again, so prompts
    have up to ``input_len`` tokens. On /v1/completions the prompt is sent rendered with the model's
    chat template (as vLLM); on the chat endpoint it is the user message. ``prompt_len`` is counted
    as the server sees the prompt (under the request fields ``options``). ``input_len_flag`` and
    ``output_len_flag`` are the flags the user gave the lengths with (``--input-len`` and
    ``--output-len`` set the sonnet ones, as vLLM), which errors name.

    Raises:
        ValueError: an unusable file, a length or count out of range, ``input_len`` not above
            ``B``, or no prompt of at most ``input_len`` tokens in :data:`SONNET_MAX_REJECTIONS`
            draws in a row (vLLM would loop forever).
    """
    for flag, value, least in (
        ("--num-prompts", num_prompts, 1),
        (input_len_flag, input_len, 1),
        ("--sonnet-prefix-len", prefix_len, 0),
        (output_len_flag, output_len, 1),
    ):
        if value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    lines = load_lines(path)
    line_lens: dict[str, int] = {}
    for line in lines:
        if line not in line_lens:
            line_lens[line] = len(counter.encode(line))
    mean = sum(line_lens[line] for line in lines) / len(lines)
    if mean <= 0:
        raise ValueError(f"--dataset-path {path}: the lines have no tokens (blank lines only)")
    encode = prompt_encoder(counter, chat, options)

    def sent(prompt: str) -> str:  # what the request carries
        return prompt if chat else counter.render_chat(prompt)

    base = len(encode(sent(SONNET_INSTRUCTION)))
    if input_len <= base:
        raise ValueError(
            f"{input_len_flag} {input_len} must be above the {base} tokens of the instruction alone "
            "(as the server counts it, chat template included)"
        )
    n_lines = max(round((input_len - base) / mean), 1)
    n_prefix = max(round((prefix_len - base) / mean), 0)
    prefix = lines[:n_prefix]
    n_drawn = n_lines - n_prefix  # vLLM's: none when the prefix takes all the lines
    rng = random.Random(seed)
    out: list[SampleRequest] = []
    rejected = 0
    while len(out) < num_prompts:
        drawn = rng.choices(lines, k=n_drawn) if n_drawn > 0 else []
        text = sent(SONNET_INSTRUCTION + "".join(prefix + drawn))
        n = len(encode(text))
        if n <= input_len:
            out.append(SampleRequest(text, n, output_len))
            rejected = 0
            continue
        rejected += 1
        if n_drawn <= 0:
            raise ValueError(
                f"--sonnet-prefix-len {prefix_len}: the instruction and the file's first {len(prefix)} lines "
                f"take {n} tokens, over {input_len_flag} {input_len} (lower --sonnet-prefix-len)"
            )
        if rejected >= SONNET_MAX_REJECTIONS:
            raise ValueError(
                f"--dataset-path {path}: no draw of {n_drawn} lines (after {len(prefix)} prefix lines) fit "
                f"{input_len_flag} {input_len} in {SONNET_MAX_REJECTIONS} tries (the lines average "
                f"{mean:.1f} tokens, the instruction takes {base}); raise {input_len_flag}"
            )
    return out


BURSTGPT_MODEL = "GPT-4"
"""The BurstGPT rows vLLM keeps (its ``Model`` column); the others are left out."""
BURSTGPT_COLUMNS = ("Model", "Request tokens", "Response tokens")


@dataclass(frozen=True)
class BurstRow:
    """One kept BurstGPT row: its token counts and its line in the file (1-based, the header is 1)."""

    request_tokens: int
    response_tokens: int
    line: int


def _count_cell(path: str, line: int, column: str, cell: str) -> int:
    """A token count of a BurstGPT row (an integer, ``12.0`` too). Raises ValueError naming it."""
    text = cell.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value.is_integer():
        raise ValueError(f"--dataset-path {path}: line {line}: {column!r} must be an integer, got {cell!r}")
    return int(value)


def load_burstgpt(path: str) -> list[BurstRow]:
    """The rows vLLM's ``burstgpt`` dataset keeps from a BurstGPT CSV file (its header names the
    columns :data:`BURSTGPT_COLUMNS`, e.g. BurstGPT's ``Timestamp,Model,Request tokens,Response
    tokens,Total tokens,Log Type``): ``Model`` :data:`BURSTGPT_MODEL` and ``Response tokens`` > 0
    (a failed request has none), in the file's order; blank lines are skipped.

    Raises:
        ValueError: missing or unreadable file, no header or a header without those columns, a
            kept row whose token counts are not integers, or no row kept (one line naming the file).
    """
    reader = csv.reader(io.StringIO(_read_text(path, "BurstGPT CSV file"), newline=""))
    header = next(reader, None)
    missing = [c for c in BURSTGPT_COLUMNS if header is None or c not in header]
    if header is None or missing:
        got = ",".join(header)[:80] if header else "nothing"
        raise ValueError(
            f"--dataset-path {path}: not a BurstGPT CSV file: its header has no {', '.join(repr(c) for c in missing)} "
            f"column (found {got!r})"
        )
    model_col, request_col, response_col = (header.index(c) for c in BURSTGPT_COLUMNS)
    width = max(model_col, request_col, response_col) + 1
    out: list[BurstRow] = []
    for row in reader:
        if not row:
            continue
        line = reader.line_num
        if len(row) < width:
            raise ValueError(
                f"--dataset-path {path}: line {line}: {len(row)} fields, the header has {len(header)}"
            )
        if row[model_col] != BURSTGPT_MODEL:
            continue
        response = _count_cell(path, line, BURSTGPT_COLUMNS[2], row[response_col])
        if response <= 0:
            continue
        out.append(BurstRow(_count_cell(path, line, BURSTGPT_COLUMNS[1], row[request_col]), response, line))
    if not out:
        raise ValueError(
            f"--dataset-path {path}: no row of Model {BURSTGPT_MODEL} with Response tokens > 0 (vLLM's filter)"
        )
    return out


def burstgpt_requests(
    counter: TokenCounter,
    path: str,
    num_prompts: int,
    seed: int,
    max_model_len: int | None = None,
    chat: bool = False,
    options: Mapping[str, Any] | None = None,
) -> list[SampleRequest]:
    """vLLM's ``burstgpt`` dataset: ``num_prompts`` rows of a BurstGPT CSV file
    (:func:`load_burstgpt`), each a request of its ``Request tokens`` prompt tokens asking its
    ``Response tokens``.

    Rows are picked as vLLM's ``DataFrame.sample(n, random_state=seed)``
    (``numpy.random.RandomState(seed).choice``), without replacement unless ``num_prompts`` exceeds
    the rows (then with, as vLLM), so a seed picks vLLM's rows. Each prompt is a random text of
    exactly its row's request tokens as the server counts it (:func:`exact_length_prompt`, seeded
    by ``seed``; chat-templated on the chat endpoint, under the request fields ``options``), where
    vLLM decodes the ids ``(i + j) % vocab_size`` and counts the row's number whatever the server
    counts. Rows the server could not take are left out before the pick, with a note on stderr:
    request tokens below the least prompt (an empty one with a BOS or the chat template's tokens),
    or request and response tokens over ``max_model_len``.

    Raises:
        ValueError: an unusable file, no row left, ``num_prompts`` below 1 or a seed of 2**32 or
            more (``RandomState``'s range).
    """
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    if seed >= 2**32:
        raise ValueError(f"--seed must be below 2**32 with --dataset burstgpt (vLLM's row pick), got {seed}")
    rows = load_burstgpt(path)
    overhead = len(prompt_encoder(counter, chat, options)(""))
    least = overhead + 1 if chat else max(overhead, 1)  # exact_length_prompt's minimum
    short = [r for r in rows if r.request_tokens < least]
    over = [
        r
        for r in rows
        if r.request_tokens >= least
        and max_model_len is not None
        and r.request_tokens + r.response_tokens > max_model_len
    ]
    if short or over:
        left = {r.line for r in short + over}
        rows = [r for r in rows if r.line not in left]
        why = []
        if short:
            why.append(f"{len(short)} with Request tokens below the least prompt of {least}")
        if over:
            why.append(
                f"{len(over)} over the server's max_model_len {max_model_len} with their Response tokens"
            )
        if not rows:
            raise ValueError(f"--dataset-path {path}: no usable row ({'; '.join(why)})")
        print(
            f"surge: note: {path}: {len(short) + len(over)} {BURSTGPT_MODEL} rows left out ({'; '.join(why)})",
            file=sys.stderr,
        )
    picked = np.random.RandomState(seed).choice(len(rows), size=num_prompts, replace=num_prompts > len(rows))
    rng = np.random.default_rng(seed)
    out: list[SampleRequest] = []
    for idx in picked:
        row = rows[int(idx)]
        prompt = exact_length_prompt(counter, rng, row.request_tokens, chat, options)
        out.append(SampleRequest(prompt, row.request_tokens, row.response_tokens))
    return out
