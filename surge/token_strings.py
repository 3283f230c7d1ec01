"""Text and raw bytes of single tokens, for logprobs (cached per token id).

A token's text is ``tokenizer.decode([id])`` with special tokens kept (so an EOS among the
top alternatives shows as ``<|im_end|>`` rather than nothing), with the leading space that
SentencePiece drops from a word piece decoded alone (``▁the`` is `` the``). Its bytes are the UTF-8 of
that text, except for a token that is only part of a UTF-8 character (its decoded text
contains U+FFFD): then the raw bytes come from the token string, through the byte-level BPE
alphabet (GPT-2's ``bytes_to_unicode``, used by Qwen and Llama 3) or SentencePiece's
``<0xNN>`` byte-fallback pieces.
"""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_REPLACEMENT = "\ufffd"
_SP_SPACE = "\u2581"


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-character alphabet for the 256 byte values, inverted (char -> byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenStrings:
    """``token id -> (text, bytes)`` of one tokenizer, computed once per id.

    Args:
        tokenizer: the model's tokenizer.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._byte_decoder: dict[str, int] | None = None

    def text(self, token_id: int) -> str:
        """The token's text."""
        return self.get(token_id)[0]

    def get(self, token_id: int) -> tuple[str, list[int]]:
        """``(text, bytes as a list of ints)`` of one token (OpenAI's ``token`` and ``bytes``)."""
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._compute(token_id)
        return hit

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and piece.startswith(_SP_SPACE) and not text.startswith(" "):
            text = " " + text  # SentencePiece drops a word's leading space when decoding it alone
        if _REPLACEMENT not in text:
            return text, list(text.encode("utf-8"))
        if isinstance(piece, str):
            m = _BYTE_PIECE.match(piece)
            if m:
                return text, [int(m.group(1), 16)]
            if self._byte_decoder is None:
                self._byte_decoder = _byte_level_decoder()
            if piece and all(c in self._byte_decoder for c in piece):
                return text, [self._byte_decoder[c] for c in piece]
        return text, list(text.encode("utf-8"))
