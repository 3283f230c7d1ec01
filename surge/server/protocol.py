"""Pydantic models of the OpenAI request bodies Surge accepts, and their checks.

Unknown fields are accepted and ignored (clients send many); known fields of the wrong type
are a 400. Types are strict, with no coercion between JSON types: a boolean field takes only
``true``/``false`` (not ``0``), an integer field only integers (not ``1.0`` or ``false``), a number
field integers or decimals, a string field only strings. Every numeric field has finite bounds
(``2**70`` is a 400 naming the field), and no string anywhere in a body may hold a lone UTF-16
surrogate (``"\ud800"``). Fields Surge does not implement yet (``logit_bias``, ``functions``,
...) are a 400 that says so whenever they ask for something other than the default.
``tools`` and ``tool_choice`` are checked by :mod:`surge.server.chat_tools` (chat only).
Structured-output fields (``response_format``, ``structured_outputs``, ``guided_*``) are
checked by :mod:`surge.server.structured_request`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from surge.sampling_params import MAX_REPETITION_PENALTY, MAX_TEMPERATURE
from surge.server.errors import bad_request

MAX_INT = 2**63 - 1
"""Largest value of an integer field without a tighter bound (int64, as the engine stores them)."""
MAX_TOKEN_COUNT = 2**31 - 1
"""Largest token count field (``max_tokens``, ``min_tokens``, ...)."""


class RequestBody(BaseModel):
    """Base of every request body: strict types, extra fields allowed.

    Lone surrogates are refused before parsing, by :class:`surge.server.guard.RequestGuard`.
    """

    model_config = ConfigDict(extra="allow", strict=True)


def _prompt_kind(value: Any) -> str:
    """Which form of ``prompt`` a value is, from its type and its first element."""
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, str):
            return "texts"
        if isinstance(first, list):
            return "token_id_lists"
        return "token_ids"
    return "token_ids" if isinstance(value, list) else "text"


_TokenId = int  # no per-element bound (it would triple the cost): the server checks the vocabulary range
Prompt = Annotated[
    Annotated[str, Tag("text")]
    | Annotated[list[str], Tag("texts")]
    | Annotated[list[_TokenId], Tag("token_ids")]
    | Annotated[list[list[_TokenId]], Tag("token_id_lists")],
    Discriminator(_prompt_kind),
]
"""A completion prompt: text, texts, token ids, or lists of token ids. The form is picked from the
first element, so a long list is validated once (a plain union would try every form)."""


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds one final chunk with the usage."""

    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool | None = False


class SamplingRequestFields(RequestBody):
    """Request fields shared by chat and completions (OpenAI names plus vLLM extensions).

    The number and length of ``stop`` strings are bounded by the server (``--max-stop-strings``,
    ``--max-stop-string-length``), checked when the request is served.
    """

    model: str | None = None
    max_tokens: int | None = Field(default=None, le=MAX_TOKEN_COUNT)
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(default=None, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=MAX_TOKEN_COUNT)
    min_p: float | None = Field(default=None, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=MAX_INT)
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=MAX_TOKEN_COUNT)]] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0, le=MAX_TOKEN_COUNT)
    n: int = Field(default=1, ge=1, le=128)
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=1.0, gt=0.0, le=MAX_REPETITION_PENALTY)
    skip_special_tokens: bool = True
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # structured outputs (surge.server.structured_request checks them)
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    # checked by surge.server.logprobs (chat: bool + top_logprobs; completions: an int)
    logprobs: Any = None
    top_logprobs: Any = None
    prompt_logprobs: Any = None
    # not implemented: rejected unless left at their defaults
    logit_bias: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    best_of: Any = None
    suffix: Any = None

    def check_unimplemented(self) -> None:
        """Raise a 400 ApiError naming the first unimplemented feature the request asks for."""
        checks: list[tuple[str, bool]] = [
            ("logit_bias", bool(self.logit_bias)),
            ("functions", bool(self.functions)),
            ("function_call", self.function_call not in (None, "none", "auto")),
            ("best_of", self.best_of not in (None, 1)),
            ("suffix", self.suffix not in (None, "")),
        ]
        for name, asked in checks:
            if asked:
                raise bad_request(f"'{name}' is not supported by Surge yet", param=name)
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options can only be set when stream is true", param="stream_options")

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options is not None and self.stream_options.include_usage)


class ChatMessage(BaseModel):
    """One chat message: ``content`` is a string or a list of ``{"type": "text", "text": ...}`` parts."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingRequestFields):
    """Body of ``POST /v1/chat/completions``.

    ``max_completion_tokens`` wins over ``max_tokens``; ``chat_template_kwargs`` are passed to
    the chat template (e.g. ``{"enable_thinking": false}`` for Qwen3).
    """

    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, le=MAX_TOKEN_COUNT)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    echo: bool = False

    def check_unimplemented(self) -> None:
        """As for every request, plus ``echo`` (supported on completions only)."""
        super().check_unimplemented()
        if self.echo:
            raise bad_request("'echo' is not supported on chat completions by Surge yet", param="echo")

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingRequestFields):
    """Body of ``POST /v1/completions``: ``prompt`` is a string, strings, token ids, or lists of ids.

    ``max_tokens`` defaults to 16 as in OpenAI's API.
    """

    prompt: Prompt
    max_tokens: int | None = Field(default=16, le=MAX_TOKEN_COUNT)
    echo: bool = False
    add_special_tokens: bool = True

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def check_unimplemented(self) -> None:
        """As for every request, plus ``tools`` / ``tool_choice`` (chat completions only)."""
        super().check_unimplemented()
        for name in ("tools", "tool_choice"):
            if getattr(self, name) is not None:
                raise bad_request(f"'{name}' is supported on chat completions only", param=name)


class TokenizeRequest(RequestBody):
    """Body of ``POST /tokenize``: a ``prompt`` string, or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(RequestBody):
    """Body of ``POST /detokenize``: token ids to turn into text."""

    model: str | None = None
    tokens: list[_TokenId]
