"""A long text's tokenization split into pieces that the Hugging Face tokenizer encodes in parallel.

A Hugging Face fast tokenizer encodes one text on one core. In session 34's H200 server logs, 27-38
ms passed between a 4,096-token chat request's arrival and the engine's first schedule, against
2-3 ms for a 32-token one; one encode of such a prompt takes 14-25 ms on the development CPU, and
its prefill about 100 ms. ``encode_batch`` encodes several texts at once on the tokenizer's own
thread pool (Rust's rayon, all cores), so :func:`encode_text` cuts a long text into pieces at points where the tokenizer's pre-tokenizer
starts a new word anyway, encodes the pieces as a batch and joins them. The ids are the same as
one ``tokenizer.encode(text)`` call, by construction:

- The pre-tokenizer must be byte-level BPE's split by one of :data:`SAFE_SPLIT_PATTERNS` (Qwen2
  and Qwen3's, Llama 3's) followed by ``ByteLevel`` without a prefix space, the normalizer none or
  NFC, the model BPE, and no added token may hold whitespace or strip its neighbours
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

The test suite checks this against ``tokenizer.encode`` on generated texts of letters, digits,
punctuation, contractions, whitespace runs, newlines, non-Latin scripts, combining marks, emoji
and special tokens, cut as finely as every word (``tests/test_parallel_encode.py``). Measured on
the 2-core development machine (``benchmarks/results/parallel-encode-cpu/``): 1.4x at 8,192
tokens, 1.5-1.8x at 16,384 and 32,768, within the noise at 2,048-4,096; not measured on a GPU
host.
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Encoding
from transformers import PreTrainedTokenizerBase

PARALLEL_MIN_CHARS = 8_192
"""Texts shorter than this (in characters; about 2,000 tokens) are encoded whole: their
encoding costs about as much as starting the pieces."""
PIECE_CHARS = 2_048
"""Target characters per piece (a piece ends at the first split point after this many)."""

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
    docstring); a few tens of microseconds, so it is checked per long text, not cached.

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
    for added in tokenizer.added_tokens_decoder.values():
        if added.lstrip or added.rstrip or added.single_word or any(c.isspace() for c in added.content):
            return False
    return True


def _is_ascii_letter(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


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
    n = len(text)
    i = piece_chars
    while i < n - 1:
        j = text.find(" ", i)
        while j != -1 and j < n - 1 and not (not text[j - 1].isspace() and _is_ascii_letter(text[j + 1])):
            j = text.find(" ", j + 1)
        if j == -1 or j >= n - 1:
            break
        points.append(j)
        i = j + piece_chars
    return points


def encode_text(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    add_special_tokens: bool,
    *,
    min_chars: int = PARALLEL_MIN_CHARS,
    piece_chars: int = PIECE_CHARS,
) -> list[int]:
    """Token ids of ``text``, the same as ``tokenizer.encode(text, add_special_tokens=...)``;
    a text of at least ``min_chars`` characters whose tokenizer passes :func:`split_safe` is
    encoded in pieces (:func:`split_points`) on the tokenizer's thread pool.

    Args:
        tokenizer: a transformers tokenizer.
        text: the text.
        add_special_tokens: add the tokenizer's special tokens (e.g. BOS) as ``encode`` does.
        min_chars: shortest text that is split (tests lower it).
        piece_chars: target piece length in characters.

    Returns:
        The token ids.
    """
    if len(text) >= min_chars and split_safe(tokenizer):
        points = split_points(text, piece_chars)
        if len(points) > 1:
            backend = tokenizer.backend_tokenizer
            pieces = [text[a:b] for a, b in zip(points, [*points[1:], len(text)], strict=True)]
            encodings = backend.encode_batch(pieces, add_special_tokens=False)
            merged = Encoding.merge(encodings, growing_offsets=True)
            return list(backend.post_process(merged, None, add_special_tokens).ids)
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
