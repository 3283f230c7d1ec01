"""A request's token rules: ``logit_bias`` (OpenAI), ``allowed_token_ids`` and ``bad_words``
(vLLM), checked against the model's vocabulary and turned into :class:`SamplingParams` fields.

The sampler applies them on the device (:mod:`surge.layers.sampler`); a request without them
adds nothing to a step.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from surge.server.errors import bad_request
from surge.server.protocol import SamplingRequestFields
from surge.tokenizer import bad_words_token_ids

MAX_BAD_WORDS = 256
"""Most ``bad_words`` per request: each is tokenized (on a tokenizer thread) and checked against
the output's end at every step of the request."""
MAX_BAD_WORD_CHARS = 1024
"""Longest ``bad_words`` entry in characters: a longer one held a tokenizer thread for seconds
(3.6 MB: 2.8 s) while it bans a text no answer is likely to repeat."""


def token_rules_of(
    req: SamplingRequestFields, tokenizer: PreTrainedTokenizerBase, vocab_size: int
) -> dict[str, Any]:
    """The ``logit_bias``, ``allowed_token_ids``, ``bad_words`` and ``bad_words_token_ids``
    fields of ``req`` as :class:`~surge.sampling_params.SamplingParams` keyword arguments
    (empty when it has none), after checking ``stop_token_ids`` against the vocabulary too (an id
    the model cannot sample would never stop anything; that field itself is passed on by
    :func:`~surge.server.serving_common.build_sampling_params`). ``logit_bias`` keys are token
    ids written as strings of ASCII digits (OpenAI), each id once (``"10"`` and ``"010"`` are
    one id); its values' range (-100..100) is checked by the request model.

    Raises:
        ApiError: 400 naming the field for a ``logit_bias`` key that is not a token id, a token
            id outside ``[0, vocab_size)`` (in ``logit_bias``, ``allowed_token_ids`` or
            ``stop_token_ids``), an empty ``allowed_token_ids``, more than
            :data:`MAX_BAD_WORDS` bad words, one longer than :data:`MAX_BAD_WORD_CHARS` characters
            or one that encodes to no token.
    """
    rules: dict[str, Any] = {}
    bad_stop = next((t for t in req.stop_token_ids or () if not 0 <= t < vocab_size), None)
    if bad_stop is not None:
        raise bad_request(
            f"stop_token_ids must be in [0, {vocab_size}), got {bad_stop}", param="stop_token_ids"
        )
    if req.logit_bias:
        bias: dict[int, float] = {}
        for key, value in req.logit_bias.items():
            # ASCII digits only: int() also takes " 5", "+5", "1_0" and other scripts' digits
            if not (key.isascii() and key.isdigit() and len(key) <= 10):
                raise bad_request(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
            token = int(key)
            if token in bias:
                raise bad_request(f"logit_bias: token id {token} is given twice", param="logit_bias")
            if not 0 <= token < vocab_size:
                raise bad_request(
                    f"logit_bias: token ids must be in [0, {vocab_size}), got {token}", param="logit_bias"
                )
            bias[token] = float(value)
        rules["logit_bias"] = bias
    if req.allowed_token_ids is not None:
        if not req.allowed_token_ids:
            raise bad_request("allowed_token_ids must not be empty", param="allowed_token_ids")
        bad = next((t for t in req.allowed_token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise bad_request(
                f"allowed_token_ids must be in [0, {vocab_size}), got {bad}", param="allowed_token_ids"
            )
        rules["allowed_token_ids"] = tuple(dict.fromkeys(req.allowed_token_ids))
    if req.bad_words:
        if len(req.bad_words) > MAX_BAD_WORDS:
            raise bad_request(
                f"bad_words: at most {MAX_BAD_WORDS} words, got {len(req.bad_words)}", param="bad_words"
            )
        long = next((w for w in req.bad_words if len(w) > MAX_BAD_WORD_CHARS), None)
        if long is not None:
            raise bad_request(
                f"bad_words: each word may have at most {MAX_BAD_WORD_CHARS} characters, got one of {len(long)}",
                param="bad_words",
            )
        try:
            ids = bad_words_token_ids(tokenizer, req.bad_words)
        except ValueError as e:
            raise bad_request(str(e), param="bad_words") from e
        bad = next((t for word in ids for t in word if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise bad_request(
                f"bad_words: token id {bad} is outside the model's vocabulary [0, {vocab_size})",
                param="bad_words",
            )
        rules["bad_words"] = tuple(req.bad_words)
        rules["bad_words_token_ids"] = ids
    return rules
