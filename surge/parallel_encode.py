"""A long text's tokenization split into pieces that the Hugging Face tokenizer encodes in parallel.

A Hugging Face fast tokenizer encodes one text on one core. In session 34's H200 server logs, 27-38
ms passed between a 4,096-token chat request's arrival and the engine's first schedule, against
2-3 ms for a 32-token one; one encode of such a prompt takes 14-25 ms on the development CPU, and
its prefill about 100 ms. ``encode_batch`` encodes several texts at once on the tokenizer's own
thread pool (Rust's rayon, all cores), so :func:`encode_text` cuts a long text into pieces at
points where the tokenizer's pre-tokenizer starts a new word anyway, encodes the pieces as a
batch and joins them. The ids are the same as one ``tokenizer.encode(text)`` call, by
construction:

- The pre-tokenizer must be byte-level BPE's split by one of :data:`SAFE_SPLIT_PATTERNS` (Qwen2
  and Qwen3's, Llama 3's) followed by ``ByteLevel`` without a prefix space, the normalizer none or
  NFC, the model BPE without dropout; no added token may hold whitespace, strip its neighbours or
  be ``single_word``; no truncation or padding is set and special tokens are not split
  (:func:`split_safe`). Anything else is encoded whole.
- A piece starts at a space that follows a non-space character and precedes an ASCII letter
  (:func:`split_points`). Every alternative of those patterns stops before such a space (letters,
  digits and punctuation runs exclude it, whitespace runs need it at their start), and at the
  space the pattern's second alternative (an optional non-letter, then letters) matches: so the
  whole text's pre-tokens already start there, none crosses the cut, and the patterns look at
  no character behind a match (their only look-around, ``\\s+(?!\\S)``, is a look-ahead inside a
  whitespace run, which ends before the cut). NFC composes no character with a preceding ASCII
  space. BPE merges never cross a pre-token.
- The pieces are encoded without special tokens, merged, and post-processed once with the
  caller's ``add_special_tokens`` (the tokenizer's own last step), so a BOS is added once.

A text too short to split is encoded whole. When the caller has proven :func:`split_safe` (the
server's :class:`~surge.server.tokenization.TokenizerWorker` and :class:`~surge.LLM` do, once), it calls
``backend_tokenizer.encode_batch([text])`` itself: that is the one call transformers' ``encode``
makes (an ``encode_batch`` of one, which releases the GIL, where the backend's ``encode`` holds
it), and what the wrapper adds around it is a no-op for such a tokenizer (it keeps truncation and
padding off and special tokens unsplit, which :func:`split_safe` requires, and the tokenizer's
class must not override transformers' ``encode`` path). It saves about a fifth of a short
prompt's encode (45 us instead of 57 for ``surge bench``'s templated 32-token chat prompts on the
development CPU, ``benchmarks/results/api-intake-cpu-s45/``).

The test suite checks this against ``tokenizer.encode`` on generated texts of letters, digits,
punctuation, contractions, whitespace runs, newlines, non-Latin scripts, combining marks, emoji
and special tokens, cut as finely as every word (``tests/test_parallel_encode.py``).

Measured (``benchmarks/results/parallel-encode-cpu/``), on the 2-core development machine only:
one encode against the pieces, 1.4x faster at 8,192 tokens, 1.5-1.8x at 16,384 and 32,768, within
the noise at 2,048-4,096 tokens. Through a CPU server, a 12,000-token prompt's time to the
engine's first schedule did not improve (the CPU engine's threads likely held both cores). Not
measured on a GPU host, where it is meant to shorten long prompts' time to first token.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tokenizers import Encoding
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PARALLEL_MIN_CHARS = 16_384
"""Texts shorter than this (in characters; about 3,300 tokens of random words) are encoded whole:
on two cores the pieces broke even at about 20,000 characters and lost at 10,656 in two runs of
three (``benchmarks/results/parallel-encode-cpu/``)."""
PIECE_CHARS = 2_048
"""Target characters per piece (a piece ends at the first split point at or after this many)."""

_SPLIT_POINT = re.compile(r"(?<=\S) (?=[A-Za-z])")
"""A space after a non-space character (``str.isspace``'s whitespace) and before an ASCII letter."""

SAFE_SPLIT_PATTERNS: frozenset[str] = frozenset(
    {
        # Qwen2, Qwen2.5, Qwen3 (tokenizer.json's pre_tokenizer Split regex)
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        # Llama 3, 3.1, 3.2, 3.3
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    }
)
"""Pre-tokenizer regexes that never match across a space between a non-space character and an
ASCII letter, and always start a match at that space (see the module docstring)."""


def _state(component: Any) -> dict[str, Any] | None:
    """A tokenizers component (normalizer, pre-tokenizer, model) as its JSON, or None."""
    if component is None:
        return None
    return json.loads(component.__getstate__())


def _byte_level_split(pre: dict[str, Any] | None) -> bool:
    if pre is None or pre.get("type") != "Sequence":
        return False
    steps = pre.get("pretokenizers", [])
    if len(steps) != 2:
        return False
    split, byte_level = steps
    return (
        split.get("type") == "Split"
        and split.get("pattern", {}).get("Regex") in SAFE_SPLIT_PATTERNS
        and split.get("behavior") == "Isolated"
        and split.get("invert") is False
        and byte_level.get("type") == "ByteLevel"
        and byte_level.get("add_prefix_space") is False
        and byte_level.get("use_regex") is False
    )


def split_safe(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether :func:`encode_text` may split this tokenizer's texts (the conditions of the module
    docstring). It reads every added token: about 25 us for Qwen3's 26, 350 us for Llama 3's 256,
    so a caller that encodes many texts computes it once and passes it to :func:`encode_text`
    (Surge never changes a tokenizer after loading it).

    Args:
        tokenizer: a transformers tokenizer; only fast (Rust-backed) ones qualify.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "split_special_tokens", False):
        return False
    if backend.truncation is not None or backend.padding is not None or backend.encode_special_tokens:
        return False
    normalizer = _state(backend.normalizer)
    if normalizer is not None and normalizer != {"type": "NFC"}:
        return False
    if not _byte_level_split(_state(backend.pre_tokenizer)) or type(backend.model).__name__ != "BPE":
        return False
    if backend.model.dropout:  # random merges: two encodes of one text differ anyway
        return False
    if type(tokenizer).encode is not PreTrainedTokenizerBase.encode or (
        type(tokenizer)._encode_plus is not PreTrainedTokenizerFast._encode_plus
    ):  # a class of its own may change the ids around the backend's call
        return False
    for added in tokenizer.added_tokens_decoder.values():
        if added.lstrip or added.rstrip or added.single_word or any(c.isspace() for c in added.content):
            return False
    return True


def split_points(text: str, piece_chars: int = PIECE_CHARS) -> list[int]:
    """Where the pieces of ``text`` start: ``0``, then the first split point (a space after a
    non-space character and before an ASCII letter) at or after every ``piece_chars`` characters
    from the previous one.

    Args:
        text: the text.
        piece_chars: target piece length in characters (>= 1).

    Returns:
        Increasing character offsets, the first one 0.
    """
    points = [0]
    i = piece_chars
    while i < len(text):
        m = _SPLIT_POINT.search(text, i)
        if m is None:
            break
        points.append(m.start())
        i = m.start() + piece_chars
    return points


def encode_text(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    add_special_tokens: bool,
    *,
    splittable: bool | None = None,
    min_chars: int = PARALLEL_MIN_CHARS,
    piece_chars: int = PIECE_CHARS,
) -> list[int]:
    """Token ids of ``text``, the same as ``tokenizer.encode(text, add_special_tokens=...)``;
    a text of at least ``min_chars`` characters whose tokenizer passes :func:`split_safe` is
    encoded in pieces (:func:`split_points`) on the tokenizer's thread pool, and a shorter one,
    when the caller passes ``splittable=True``, by the Rust tokenizer's ``encode_batch`` directly.

    Args:
        tokenizer: a transformers tokenizer.
        text: the text.
        add_special_tokens: add the tokenizer's special tokens (e.g. BOS) as ``encode`` does.
        splittable: :func:`split_safe` of ``tokenizer`` computed once by the caller, or None
            to check it here (only for a text of ``min_chars`` or more).
        min_chars: shortest text that is split (tests lower it).
        piece_chars: target piece length in characters.

    Returns:
        The token ids.
    """
    if len(text) >= min_chars:
        if split_safe(tokenizer) if splittable is None else splittable:
            points = split_points(text, piece_chars)
            if len(points) > 1:
                backend = tokenizer.backend_tokenizer
                pieces = [text[a:b] for a, b in zip(points, [*points[1:], len(text)], strict=True)]
                encodings = backend.encode_batch(pieces, add_special_tokens=False)
                merged = Encoding.merge(encodings, growing_offsets=True)
                return list(backend.post_process(merged, None, add_special_tokens).ids)
    elif splittable:
        # transformers' own call without its per-call wrapper (see the module docstring)
        return tokenizer.backend_tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
