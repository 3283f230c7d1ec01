"""Which request fields Surge refuses and which it accepts without effect.

Every field of a chat or completions request is one of three kinds (docs/openai-api.md lists
them all): honoured; refused with a 400 naming it when it asks for something Surge does not do;
or inert (accepted and ignored because it has no effect on a single-tenant server, such as
``user``). A field that is none of these is unknown and is a 400 too (pydantic ``extra="forbid"``).
A field OpenAI declares nullable takes ``null`` for "not set": the request models drop it before
validation, so it is neither checked nor refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INERT_FIELDS: tuple[str, ...] = (
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
)
"""Accepted and ignored: labels for the caller's own records, or switches with nothing to switch."""

NULLABLE_COMPLETION_FIELDS: frozenset[str] = frozenset(
    {
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "prompt",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
    }
)
"""Fields of ``POST /v1/completions`` that OpenAI's API declares nullable (``nullable: true`` in
``CreateCompletionRequest`` of openai/openai-openapi's ``openapi.yaml``). ``null`` means the
field is not set, the same as leaving it out (``max_tokens: null`` is 16, as in vLLM 0.26)."""

NULLABLE_CHAT_FIELDS: frozenset[str] = frozenset(
    {
        "audio",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "top_logprobs",
        "top_p",
        "verbosity",
    }
)
"""Fields of ``POST /v1/chat/completions`` that OpenAI's API declares nullable
(``CreateChatCompletionRequest``, the fields Surge knows): ``null`` means the field is not set,
the same as leaving it out."""


def _unset(value: Any) -> bool:
    return value is None


def _false(value: Any) -> bool:
    return value is None or value is False  # strict: 0 is not false here either


def _empty_list(value: Any) -> bool:
    return value is None or value == []  # strict: an empty object is not an empty list


def _empty_dict(value: Any) -> bool:
    return value is None or value == {}


def _number_is(default: float) -> Callable[[Any], bool]:
    """None, or a JSON number (not a boolean) equal to ``default``."""
    return lambda v: v is None or (type(v) in (int, float) and v == default)


def _whole_count(v: Any) -> bool:
    """None, or a JSON number that is a whole count >= 1 (``2.0`` too; not a boolean)."""
    return v is None or (type(v) in (int, float) and math.isfinite(v) and v >= 1 and v == int(v))


@dataclass(frozen=True)
class Refusal:
    """One field Surge refuses unless it keeps its default.

    Attributes:
        name: the request field.
        allowed: True for values that ask for nothing Surge lacks (the defaults).
        reason: why it is refused (ends the 400's message).
    """

    name: str
    allowed: Callable[[Any], bool]
    reason: str


REFUSALS: tuple[Refusal, ...] = (
    Refusal("use_beam_search", _false, "beam search is not supported"),
    Refusal("length_penalty", _number_is(1.0), "length_penalty applies to beam search only"),
    # vLLM 0.26 declares it on its batch chat body only
    Refusal("early_stopping", _false, "early_stopping applies to beam search only"),
    Refusal("lora_request", _unset, "LoRA adapters are not supported"),
    Refusal("lora", _unset, "LoRA adapters are not supported"),
    Refusal(
        "structural_tag",
        _unset,
        "a top-level structural_tag is not read (send response_format "
        '{"type": "structural_tag", ...} or structured_outputs.structural_tag)',
    ),
    Refusal(
        "guided_decoding_backend",
        _unset,
        "the backend is always xgrammar (use response_format or structured_outputs)",
    ),
    Refusal(
        "guided_whitespace_pattern",
        _unset,
        "a whitespace pattern is not supported (xgrammar's JSON whitespace)",
    ),
    Refusal("functions", _empty_list, "the deprecated functions field is not supported: use tools"),
    Refusal(
        "function_call",
        lambda v: v in (None, "none", "auto"),
        "the deprecated function_call field is not supported: use tool_choice",
    ),
    # a count above n is refused where n is known (``check_unimplemented``): best_of equal to n is n
    Refusal(
        "best_of",
        _whole_count,
        "best_of must be a whole number of at least 1 (each choice is sampled once; use n)",
    ),
    Refusal("suffix", lambda v: v is None or v == "", "suffix (insertion) is not supported"),
    Refusal("audio", _unset, "audio output is not supported"),
    Refusal("modalities", lambda v: v is None or v == ["text"], "only the text modality is supported"),
    Refusal("prediction", _unset, "predicted outputs are not supported"),
    Refusal("web_search_options", _unset, "web search is not supported"),
    Refusal(
        "verbosity", lambda v: v is None or v == "medium", 'verbosity other than "medium" is not supported'
    ),
    Refusal("mm_processor_kwargs", _empty_dict, "multimodal inputs are not supported"),
    Refusal("media_io_kwargs", _empty_dict, "multimodal inputs are not supported"),
    Refusal("prompt_embeds", _unset, "prompt embeddings are not supported"),
    Refusal("logits_processors", _empty_list, "custom logits processors are not supported"),
    Refusal("kv_transfer_params", _unset, "KV transfer is not supported"),
    Refusal("ec_transfer_params", _unset, "encoder-cache transfer is not supported"),
    Refusal("vllm_xargs", _empty_dict, "vllm_xargs is not supported"),
)
"""Fields refused with a 400 naming them when their value asks for something Surge does not do."""

REFUSED_FIELDS: frozenset[str] = frozenset(r.name for r in REFUSALS)


def first_refused(values: dict[str, Any]) -> tuple[str, str] | None:
    """``(field, message)`` of the first refused field ``values`` asks for, or None.

    Args:
        values: request fields by name; a field absent from it is not checked (the request
            models pass only the fields the client sent: a default is always allowed).
    """
    for r in REFUSALS:
        if r.name in values and not r.allowed(values[r.name]):
            return r.name, f"'{r.name}' is not supported by Surge: {r.reason}"
    return None
