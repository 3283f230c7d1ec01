"""Pydantic models of the OpenAI request bodies Surge accepts, and their checks.

Unknown fields are accepted and ignored (clients send many); known fields of the wrong type
are a 400. Fields Surge does not implement yet (``response_format``, ``tools``, ``logprobs``,
...) are a 400 that says so whenever they ask for something other than the default.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from surge.server.errors import bad_request


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds one final chunk with the usage."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False


class SamplingRequestFields(BaseModel):
    """Request fields shared by chat and completions (OpenAI names plus vLLM extensions)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = Field(default=1, ge=1, le=128)
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0
    skip_special_tokens: bool = True
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # not implemented: rejected unless left at their defaults
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    best_of: Any = None
    suffix: Any = None
    prompt_logprobs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    def check_unimplemented(self) -> None:
        """Raise a 400 ApiError naming the first unimplemented feature the request asks for."""
        checks: list[tuple[str, bool]] = [
            ("logprobs", self.logprobs not in (None, False, 0)),
            ("top_logprobs", self.top_logprobs not in (None, 0)),
            ("prompt_logprobs", self.prompt_logprobs not in (None, 0)),
            ("logit_bias", bool(self.logit_bias)),
            (
                "response_format",
                self.response_format is not None
                and not (
                    isinstance(self.response_format, dict) and self.response_format.get("type") == "text"
                ),
            ),
            ("tools", bool(self.tools)),
            ("tool_choice", self.tool_choice not in (None, "none", "auto")),
            ("functions", bool(self.functions)),
            ("function_call", self.function_call not in (None, "none", "auto")),
            ("best_of", self.best_of not in (None, 1)),
            ("suffix", self.suffix not in (None, "")),
            ("guided_json", self.guided_json is not None),
            ("guided_regex", self.guided_regex is not None),
            ("guided_choice", self.guided_choice is not None),
            ("guided_grammar", self.guided_grammar is not None),
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

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingRequestFields):
    """Body of ``POST /v1/chat/completions``.

    ``max_completion_tokens`` wins over ``max_tokens``; ``chat_template_kwargs`` are passed to
    the chat template (e.g. ``{"enable_thinking": false}`` for Qwen3).
    """

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
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

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    add_special_tokens: bool = True

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class TokenizeRequest(BaseModel):
    """Body of ``POST /tokenize``: a ``prompt`` string, or chat ``messages``."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(BaseModel):
    """Body of ``POST /detokenize``: token ids to turn into text."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int]
