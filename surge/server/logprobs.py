"""Logprobs in the OpenAI API: request options, which rows go with which text, response JSON.

The engine sends token ids and floats (:class:`~surge.core.logprobs.LogprobsLists`); this
module, in the API process, checks the request fields, keeps each choice's rows in step with
the text it streams (:class:`LogprobTracker`), and turns rows into OpenAI's chat
``logprobs.content``, the legacy completions ``logprobs`` object, and vLLM's
``prompt_logprobs``. Values are the log-softmax of the model's raw logits (before penalties,
temperature and top-k/p), as vLLM's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from surge.core.logprobs import LogprobsLists
from surge.sampling_params import MAX_LOGPROB_TOKEN_IDS, MAX_LOGPROBS, SamplingParams
from surge.server.errors import bad_request
from surge.server.protocol import integral_number
from surge.token_strings import TokenStrings

_FLOOR = -9999.0
"""JSON has no -inf: a log-probability below this is reported as this (as vLLM does)."""


@dataclass(frozen=True, slots=True)
class LogprobOptions:
    """What one request asks for.

    Attributes:
        logprobs: top-k of the generated tokens' logprobs, or None for none.
        prompt_logprobs: vLLM's ``prompt_logprobs`` top-k, or None.
        echo_logprobs: completions with ``echo`` and ``logprobs``: the prompt's rows come
            first in ``logprobs`` with this top-k (None otherwise).
        token_ids: vLLM's ``logprob_token_ids``: each generated token's alternatives are these
            ids, in this order, instead of the top-k (``logprobs`` is then their number).
    """

    logprobs: int | None = None
    prompt_logprobs: int | None = None
    echo_logprobs: int | None = None
    token_ids: tuple[int, ...] | None = None

    @property
    def engine_logprobs(self) -> int | None:
        """The ``logprobs`` to ask the engine for: None when ``token_ids`` list the entries
        (``SamplingParams.logprob_token_ids`` then asks for them)."""
        return None if self.token_ids is not None else self.logprobs

    @property
    def engine_prompt_logprobs(self) -> int | None:
        """The ``prompt_logprobs`` to ask the engine for (the larger of the two uses)."""
        ks = [k for k in (self.prompt_logprobs, self.echo_logprobs) if k is not None]
        return max(ks) if ks else None

    def engine_params(self, params: SamplingParams) -> SamplingParams:
        """``params`` with the logprobs fields the engine is asked for (:attr:`engine_logprobs`,
        ``logprob_token_ids`` = :attr:`token_ids`, :attr:`engine_prompt_logprobs`); ``params``
        itself when the request asks for no logprobs."""
        if self.logprobs is None and self.engine_prompt_logprobs is None:
            return params
        return msgspec.structs.replace(
            params,
            logprobs=self.engine_logprobs,
            logprob_token_ids=self.token_ids,
            prompt_logprobs=self.engine_prompt_logprobs,
        )


def _top_k(value: Any, name: str) -> int:
    value = integral_number(value)  # 5.0 is 5, as for every count (surge.server.protocol.JsonInt)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}", param=name)
    if not 0 <= value <= MAX_LOGPROBS:
        raise bad_request(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}", param=name)
    return value


def _prompt_logprobs(body: Any) -> int | None:
    if body.prompt_logprobs is None:
        return None
    k = _top_k(body.prompt_logprobs, "prompt_logprobs")
    if body.stream:
        # vLLM 0.26 refuses a stream's prompt_logprobs above 0 only; its chunks have no field for
        # them, so 0 is taken and returns nothing (nothing is computed for it here)
        if k > 0:
            raise bad_request(
                "prompt_logprobs above 0 is not available when stream is true", param="prompt_logprobs"
            )
        return None
    return k


def _listed_ids(body: Any, vocab_size: int) -> tuple[int, ...] | None:
    """The request's ``logprob_token_ids`` (None when absent or empty, as vLLM).

    Raises:
        ApiError: 400 naming ``logprob_token_ids``: more than :data:`MAX_LOGPROB_TOKEN_IDS`, or
            an id outside the vocabulary (vLLM's checks).
    """
    ids = getattr(body, "logprob_token_ids", None)
    if not ids:
        return None
    if len(ids) > MAX_LOGPROB_TOKEN_IDS:
        raise bad_request(
            f"logprob_token_ids lists {len(ids)} token ids, more than the {MAX_LOGPROB_TOKEN_IDS} allowed",
            param="logprob_token_ids",
        )
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(
            f"logprob_token_ids holds token ids outside the vocabulary [0, {vocab_size}): {bad[:8]}",
            param="logprob_token_ids",
        )
    return tuple(dict.fromkeys(ids))  # a repeated id is one entry, as in vLLM's dict


def chat_options(body: Any, vocab_size: int = 0) -> LogprobOptions:
    """Options of a chat request: ``logprobs`` (bool), ``top_logprobs`` (0..20; above 0 it needs
    ``logprobs: true``, while 0, its default, is taken without, as vLLM takes it),
    ``prompt_logprobs`` (0..20; streamed, 0 is taken and returns nothing, above 0 is a 400, as
    in vLLM; with ``echo`` and not
    streamed, ``top_logprobs`` (0 when unset) unless sent, as vLLM's chat ``echo``), vLLM's
    ``logprob_token_ids`` (needs ``logprobs: true``; they replace the top-k; ``vocab_size``
    bounds the ids).

    Raises:
        ApiError: 400 naming the field.
    """
    if body.logprobs is not None and not isinstance(body.logprobs, bool):
        raise bad_request(f"logprobs must be a boolean, got {body.logprobs!r}", param="logprobs")
    top = None
    if body.top_logprobs is not None:
        top = _top_k(body.top_logprobs, "top_logprobs")
        if top and not body.logprobs:  # 0 asks for nothing (vLLM refuses only above 0)
            raise bad_request("top_logprobs above 0 requires logprobs to be true", param="top_logprobs")
    prompt = _prompt_logprobs(body)
    if prompt is None and getattr(body, "echo", False) and not body.stream:
        prompt = top or 0  # vLLM: echo asks for the prompt's logprobs, top_logprobs of them
    listed = _listed_ids(body, vocab_size)
    if listed is not None:
        if not body.logprobs:
            raise bad_request(
                "when using logprob_token_ids, logprobs must be set to true", param="logprob_token_ids"
            )
        return LogprobOptions(logprobs=len(listed), prompt_logprobs=prompt, token_ids=listed)
    return LogprobOptions(logprobs=(top or 0) if body.logprobs else None, prompt_logprobs=prompt)


def completion_options(body: Any, vocab_size: int = 0) -> LogprobOptions:
    """Options of a completions request: ``logprobs`` (0..20; with ``echo`` the prompt's
    rows too), ``prompt_logprobs`` (0..20; streamed, 0 is taken and returns nothing, above 0 is
    a 400, as in vLLM), vLLM's ``logprob_token_ids``
    (needs ``logprobs``, whose top-k then applies to the echoed prompt rows only;
    ``vocab_size`` bounds the ids).

    Raises:
        ApiError: 400 naming the field.
    """
    if getattr(body, "top_logprobs", None) is not None:  # a chat field: here it would do nothing
        raise bad_request(
            "top_logprobs is a chat completions field: on /v1/completions 'logprobs' is the number of "
            "top log probabilities per token",
            param="top_logprobs",
        )
    k = None if body.logprobs is None else _top_k(body.logprobs, "logprobs")
    echo = k if body.echo else None
    listed = _listed_ids(body, vocab_size)
    if listed is not None:
        if k is None:
            raise bad_request("when using logprob_token_ids, logprobs must be set", param="logprob_token_ids")
        if body.echo and body.max_tokens == 0:
            raise bad_request(
                "logprob_token_ids is not supported when echo is true and max_tokens is 0: no token is "
                "generated",
                param="logprob_token_ids",
            )
        return LogprobOptions(len(listed), _prompt_logprobs(body), echo, listed)
    return LogprobOptions(logprobs=k, prompt_logprobs=_prompt_logprobs(body), echo_logprobs=echo)


class LogprobTracker:
    """One choice's generated-token rows, released in step with its text.

    Each token's text ends at some character of the decoded output; a row is released once
    all text up to that end has been emitted (text held back as an unfinished character or a
    possible stop-string prefix holds its rows back too). A token that adds no text yet (a
    byte of an unfinished character, a skipped special token) ends where the next text ends.
    The final delta releases every remaining row, so the joined rows are exactly one per
    generated token (the stop token included, as the usage counts it).

    Attributes:
        rows: every row received, in token order.
        num_sent: rows handed out by :meth:`take`.
    """

    __slots__ = ("rows", "num_sent", "_ends", "_decoded", "_emitted")

    def __init__(self) -> None:
        self.rows = LogprobsLists()
        self.num_sent = 0
        self._ends: list[int | None] = []
        self._decoded = 0
        self._emitted = 0

    def add(self, rows: LogprobsLists, num_emitted: int, num_held: int) -> None:
        """Record one token's row after the detokenizer took it.

        Args:
            rows: the token's row (one).
            num_emitted: characters the detokenizer emitted for this token's update.
            num_held: characters it holds back after it (``num_held_chars``).
        """
        self.rows.extend(rows)
        self._emitted += num_emitted
        decoded = self._emitted + num_held
        self._ends.append(None)
        if decoded > self._decoded:
            self._decoded = decoded
            ends = self._ends
            i = len(ends) - 1
            while i >= self.num_sent and ends[i] is None:
                ends[i] = decoded
                i -= 1

    def add_text(self, num_emitted: int) -> None:
        """Count characters emitted without a token (the final flush)."""
        self._emitted += num_emitted

    def take(self, final: bool) -> LogprobsLists:
        """The rows to send with a delta that carries all text emitted so far."""
        end = len(self._ends)
        if not final:
            i = self.num_sent
            while i < end and (e := self._ends[i]) is not None and e <= self._emitted:
                i += 1
            end = i
        out = self.rows.slice(self.num_sent, end)
        self.num_sent = end
        return out


TOKEN_ID_PREFIX = "token_id:"
"""vLLM's ``return_tokens_as_token_ids`` names a token ``"token_id:<id>"``."""


class TokenIdStrings:
    """Token names for vLLM's ``return_tokens_as_token_ids``: ``"token_id:<id>"`` for a token's
    text, so that a token whose text is ambiguous (a piece of a UTF-8 character, two ids with
    one text) is still identified. Its ``bytes`` stay the token's own
    (:class:`~surge.token_strings.TokenStrings`).

    Args:
        strings: the server's token texts and bytes (shared cache).
    """

    __slots__ = ("_strings",)

    def __init__(self, strings: TokenStrings) -> None:
        self._strings = strings

    def text(self, token_id: int) -> str:
        """``"token_id:<id>"``."""
        return f"{TOKEN_ID_PREFIX}{token_id}"

    def get(self, token_id: int) -> tuple[str, list[int]]:
        """``("token_id:<id>", the token's own bytes)``."""
        return self.text(token_id), self._strings.get(token_id)[1]


def _lp(value: float) -> float:
    return value if value >= _FLOOR else _FLOOR  # -inf and NaN -> the floor


def chat_content(
    rows: LogprobsLists, top: int, strings: TokenStrings | TokenIdStrings, listed: bool = False
) -> list[dict[str, Any]]:
    """OpenAI chat ``logprobs.content``: per token ``{token, logprob, bytes, top_logprobs}``
    with the ``top`` most likely alternatives (``token`` as ``strings`` name it).

    With ``listed`` (vLLM's ``logprob_token_ids``: the rows' alternatives are the chosen ids),
    ``top_logprobs`` is the sampled token, then the chosen ids but the sampled one, as vLLM
    0.26 lists them (its per-token dict keyed by id, the sampled token inserted first)."""
    out = []
    for ids, lps in zip(rows.token_ids, rows.logprobs, strict=True):
        text, raw = strings.get(ids[0])
        pairs = zip(ids[1 : top + 1], lps[1 : top + 1], strict=True)
        alternatives = []
        if listed:
            alternatives.append({"token": text, "logprob": _lp(lps[0]), "bytes": raw})
            pairs = ((t, lp) for t, lp in pairs if t != ids[0])
        for t, lp in pairs:
            t_text, t_raw = strings.get(t)
            alternatives.append({"token": t_text, "logprob": _lp(lp), "bytes": t_raw})
        out.append({"token": text, "logprob": _lp(lps[0]), "bytes": raw, "top_logprobs": alternatives})
    return out


@dataclass
class CompletionLogprobs:
    """The legacy completions ``logprobs`` object of one choice, built incrementally.

    ``text_offset`` counts characters of the tokens' texts from the start of the choice's
    text (the echoed prompt first, with ``echo``), carried across streamed chunks; a token's
    text is what ``strings`` name it (``"token_id:<id>"`` with ``return_tokens_as_token_ids``,
    whose lengths vLLM counts too).
    """

    top: int
    strings: TokenStrings | TokenIdStrings
    offset: int = 0

    def build(self, rows: LogprobsLists, first_is_null: bool = False) -> dict[str, Any]:
        """``{tokens, token_logprobs, top_logprobs, text_offset}`` of ``rows``; with
        ``first_is_null`` the first row is a prompt's first token (no logprob). Each
        ``top_logprobs`` dict holds the sampled token first, then the alternatives, as vLLM 0.26
        builds it, with one difference: where an alternative's text is the sampled token's (two
        ids that decode alike, such as a letter and its byte token), the sampled token keeps its
        own value, so that ``top_logprobs[i][tokens[i]] == token_logprobs[i]`` (vLLM overwrites
        it); two alternatives of one text keep the first's place and the last's value, as vLLM."""
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for j, (ids, lps) in enumerate(zip(rows.token_ids, rows.logprobs, strict=True)):
            text = self.strings.text(ids[0])
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            if first_is_null and j == 0:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(_lp(lps[0]))
            entry = {text: _lp(lps[0])}  # the sampled token first, as vLLM's dict
            for t, lp in zip(ids[1 : self.top + 1], lps[1 : self.top + 1], strict=True):
                alt = self.strings.text(t)
                if alt != text:
                    entry[alt] = _lp(lp)
            top_logprobs.append(entry)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": offsets,
        }

    @staticmethod
    def join(parts: list[dict[str, Any]]) -> dict[str, Any]:
        """Concatenate several objects' lists (echoed prompt, then generated tokens)."""
        keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
        return {k: [x for p in parts for x in p[k]] for k in keys}


def with_first_prompt_token(prompt_token_ids: list[int], rows: LogprobsLists | None) -> LogprobsLists:
    """A prompt's rows with a placeholder row for its first token in front (its id, logprob
    0, rank 1; callers print it as null)."""
    out = LogprobsLists([[prompt_token_ids[0]]], [[0.0]], [1])
    if rows is not None:
        out.extend(rows)
    return out


def vllm_prompt_logprobs(
    rows: LogprobsLists | None, top: int, strings: TokenStrings
) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: None for the first prompt token, then per token a dict
    ``"token_id" -> {logprob, rank, decoded_token}`` holding the prompt token (with its rank)
    and the ``top`` most likely tokens (ranks 1..top)."""
    out: list[dict[str, Any] | None] = [None]
    if rows is None:
        return out
    for ids, lps, rank in zip(rows.token_ids, rows.logprobs, rows.ranks, strict=True):
        entry = {str(ids[0]): {"logprob": _lp(lps[0]), "rank": rank, "decoded_token": strings.text(ids[0])}}
        for r, (t, lp) in enumerate(zip(ids[1 : top + 1], lps[1 : top + 1], strict=True), start=1):
            entry.setdefault(str(t), {"logprob": _lp(lp), "rank": r, "decoded_token": strings.text(t)})
        out.append(entry)
    return out
