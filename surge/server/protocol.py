"""Pydantic models of the OpenAI request bodies Surge accepts, and their checks.

Every field is honoured, refused or inert (:mod:`surge.server.field_policy`; the list is in
docs/openai-api.md). Fields no endpoint knows are a 400 naming them (``extra="forbid"``); known
fields of the wrong type are a 400. Types are strict, with no coercion between JSON types: a
boolean field takes only ``true``/``false`` (not ``0`` or ``"true"``), an integer field only
integers (not ``"1"``, ``1.5`` or ``false``; a count, limit or seed also takes a number equal to an
integer, ``16.0``, as vLLM does: :data:`JsonInt`), a number field integers or decimals, a string
field only strings. Every
numeric field has finite bounds (``2**70`` is a 400 naming the field), and no string anywhere in
a body may hold a lone UTF-16 surrogate (``"\ud800"``). Refused fields are a 400 whenever they
ask for something other than their default. A field OpenAI declares nullable
(:data:`~surge.server.field_policy.NULLABLE_CHAT_FIELDS`,
:data:`~surge.server.field_policy.NULLABLE_COMPLETION_FIELDS`) takes ``null`` for "not set": it
is dropped before validation, exactly as if it had been left out.
``tools``, ``tool_choice`` and ``parallel_tool_calls`` are checked by
:mod:`surge.server.chat_tools` (chat only). Structured-output fields (``response_format``,
``structured_outputs``, ``guided_*``) are checked by :mod:`surge.server.structured_request`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    model_validator,
)

from surge.reasoning_effort import template_kwargs_with_effort
from surge.sampling_params import MAX_REPETITION_PENALTY, MAX_TEMPERATURE, MIN_REPETITION_PENALTY
from surge.server.errors import bad_request
from surge.server.field_policy import (
    NULLABLE_CHAT_FIELDS,
    NULLABLE_COMPLETION_FIELDS,
    REFUSED_FIELDS,
    first_refused,
)
from surge.tokenizer import content_text


def integral_number(value: Any) -> Any:
    """A JSON number without a fractional part (``16.0``) as the integer it is, as vLLM's lax
    pydantic models read it (a client computing a limit in floating point sends one); any other
    value unchanged, for the strict check to take or refuse (``16.5``, ``"16"``, ``true``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(integral_number)]
"""A count, limit or seed of a request: an integer, or a number equal to one (``16.0``)."""

MAX_INT = 2**63 - 1
"""Largest value of an integer field without a tighter bound (int64, as the engine stores them)."""
MAX_TOKEN_COUNT = 2**31 - 1
"""Largest token count field (``max_tokens``, ``min_tokens``, ...)."""


ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]
"""OpenAI's ``service_tier`` values. Inert: Surge has one tier, so every value is accepted and none
changes anything; another string is a 400 naming the field, as OpenAI answers."""


class RequestBody(BaseModel):
    """Base of every request body: strict types, unknown fields refused (a 400 naming them).

    Lone surrogates are refused before parsing, by :class:`surge.server.guard.RequestGuard`.
    """

    model_config = ConfigDict(extra="forbid", strict=True)


class NullIsUnsetBody(RequestBody):
    """A request body whose every ``null`` means "not set": dropped before validation, so the
    field keeps its default (the Responses and Messages APIs, whose SDKs send ``null`` for
    options left out)."""

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            return {k: v for k, v in data.items() if v is not None}
        return data


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


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
"""Chat ``reasoning_effort``: OpenAI's values (those of vLLM's field)."""


class StreamOptions(BaseModel):
    """``stream_options`` (only with ``stream: true``, else a 400 as in vLLM): ``include_usage``
    adds one final chunk with the usage of every choice; ``continuous_usage_stats`` (vLLM), only
    with ``include_usage`` (alone it is a 400: vLLM would ignore it), also puts in every choices
    chunk the usage of that chunk's choice so far (``--enable-force-include-usage`` turns on both for
    every stream, as vLLM's flag); ``include_obfuscation`` is inert (Surge never pads chunks)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False
    include_obfuscation: bool | None = None


class RepetitionDetection(BaseModel):
    """vLLM's ``repetition_detection``: end the output, with finish reason ``"repetition"``
    and stop reason ``"repetition_detected"``, once its last tokens repeat one pattern of
    ``min_pattern_size``..``max_pattern_size`` tokens ``min_count`` times back to back
    (:class:`surge.sampling_params.RepetitionDetectionParams` checks the combination)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    max_pattern_size: JsonInt = Field(default=0, ge=0, le=MAX_TOKEN_COUNT)
    min_pattern_size: JsonInt = Field(default=0, ge=0, le=MAX_TOKEN_COUNT)
    min_count: JsonInt = Field(default=0, ge=0, le=MAX_TOKEN_COUNT)


def _admits_null(prop: dict[str, Any]) -> bool:
    """Whether a property's JSON schema accepts ``null`` (an ``Any`` field has no type at all)."""
    if not {"type", "anyOf", "oneOf", "allOf", "$ref", "const", "enum"} & prop.keys():
        return True
    return prop.get("type") == "null" or any(s.get("type") == "null" for s in prop.get("anyOf", ()))


def _null_in_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """JSON schema hook: an optional field whose ``null`` the model drops (``null_is_unset``)
    admits ``null`` in the schema too, so that ``/openapi.json`` says what the server accepts."""
    props = schema.get("properties", {})
    required = set(schema.get("required", ()))
    for name in sorted(getattr(model, "null_is_unset", ())):
        prop = props.get(name)
        if prop is None or name in required or _admits_null(prop):
            continue
        outer = {k: prop.pop(k) for k in ("title", "default", "description") if k in prop}
        props[name] = {"anyOf": [prop, {"type": "null"}], **outer}


class SamplingRequestFields(RequestBody):
    """Request fields shared by chat and completions (OpenAI names plus vLLM extensions).

    The number and length of ``stop`` strings are bounded by the server (``--max-stop-strings``,
    ``--max-stop-string-length``), checked when the request is served.
    """

    model_config = ConfigDict(json_schema_extra=_null_in_schema)
    null_is_unset: ClassVar[frozenset[str]] = frozenset()
    """Fields whose ``null`` means "not set" (OpenAI declares them nullable): dropped from the
    body before validation, so such a field keeps its default, is not in ``model_fields_set``
    and is never refused."""

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data: Any) -> Any:
        """The body without the ``null`` values of :attr:`null_is_unset` fields (one C-speed scan
        of the values when the body holds no ``null``)."""
        if isinstance(data, dict) and None in data.values():
            unset = cls.null_is_unset
            return {k: v for k, v in data.items() if v is not None or k not in unset}
        return data

    model: str | None = None
    max_tokens: JsonInt | None = Field(default=None, le=MAX_TOKEN_COUNT)
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float | None = Field(default=None, le=1.0)
    top_k: JsonInt | None = Field(default=None, ge=-1, le=MAX_TOKEN_COUNT)
    min_p: float | None = Field(default=None, le=1.0)
    seed: JsonInt | None = Field(default=None, ge=-(2**63), le=MAX_INT)
    # vLLM's: lower runs earlier under --scheduling-policy priority; not 0 under fcfs is a 400
    # (ServerState.check_priority)
    priority: JsonInt = Field(default=0, ge=-(2**63), le=MAX_INT)
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=MAX_TOKEN_COUNT)]] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: JsonInt = Field(default=0, ge=0, le=MAX_TOKEN_COUNT)
    n: JsonInt = Field(default=1, ge=1, le=128)
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(
        default=None, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY
    )
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    allowed_token_ids: list[_TokenId] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: JsonInt | None = Field(default=None, ge=-1, le=MAX_TOKEN_COUNT)
    truncation_side: Literal["left", "right"] | None = None  # vLLM's: the end truncate_prompt_tokens cuts
    repetition_detection: RepetitionDetection | None = None
    # vLLM's: tokens generated inside the reasoning before </think> is forced (-1: unlimited);
    # needs --reasoning-parser (ServerState.check_thinking_budget)
    thinking_token_budget: JsonInt | None = Field(default=None, ge=-1, le=MAX_TOKEN_COUNT)
    add_special_tokens: bool | None = None
    request_id: str | None = None
    cache_salt: str | None = None  # vLLM's: non-empty; only requests with the same salt share cached blocks
    # vLLM's: per-token character offsets, on the render endpoints only (refuse_render_only)
    return_token_offsets: bool | None = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # inert (field_policy.INERT_FIELDS)
    user: str | None = None
    # structured outputs (surge.server.structured_request checks them)
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: ServiceTier | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # checked by surge.server.logprobs (chat: bool + top_logprobs; completions: an int)
    logprobs: Any = None
    top_logprobs: Any = None
    prompt_logprobs: Any = None
    logprob_token_ids: list[int] | None = None  # vLLM's: these ids' logprobs instead of the top-k
    # vLLM's token ids: ``prompt_token_ids`` and each choice's ``token_ids`` in the response;
    # logprob tokens as ``"token_id:<id>"`` (None: the server's --return-tokens-as-token-ids)
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    # checked by surge.server.chat_tools (chat only)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # not implemented: refused unless left at their defaults (field_policy.REFUSALS)
    structural_tag: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    functions: Any = None
    function_call: Any = None
    best_of: Any = None
    use_beam_search: Any = None
    length_penalty: Any = None
    lora_request: Any = None
    lora: Any = None
    logits_processors: Any = None
    ec_transfer_params: Any = None
    kv_transfer_params: Any = None
    vllm_xargs: Any = None

    def check_unimplemented(self) -> None:
        """Raise a 400 ApiError naming the first refused field the request asks for."""
        # A refused field left out keeps its default, which every refusal allows (a test
        # checks it): only the fields the client sent can be refused.
        refused = first_refused(
            {name: getattr(self, name) for name in REFUSED_FIELDS & self.model_fields_set}
        )
        if refused is not None:
            raise bad_request(refused[1], param=refused[0])
        if type(self.best_of) in (int, float) and self.best_of < self.n:  # best_of 1 (allowed) with n > 1
            raise bad_request(
                f"best_of must be greater than or equal to n, got n={self.n} and best_of={self.best_of}",
                param="best_of",
            )
        if type(self.best_of) in (int, float) and self.best_of > self.n:  # equal to n: the n choices
            raise bad_request(
                "'best_of' is not supported by Surge above n: each choice is sampled once, so best_of must "
                f"equal n (got n={self.n} and best_of={self.best_of}; use n for more choices)",
                param="best_of",
            )
        if self.cache_salt == "":  # as vLLM (null is unset)
            raise bad_request("cache_salt must be a non-empty string if provided", param="cache_salt")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options can only be set when stream is true", param="stream_options")
        if self.truncate_prompt_tokens is not None and not (
            self.truncate_prompt_tokens == -1 or self.truncate_prompt_tokens >= 1
        ):
            raise bad_request(
                f"truncate_prompt_tokens must be -1 or at least 1, got {self.truncate_prompt_tokens}",
                param="truncate_prompt_tokens",
            )

    def check_usage_options(self, force_include_usage: bool = False) -> None:
        """Raise a 400 ApiError naming ``stream_options.continuous_usage_stats`` when it is set
        without ``include_usage`` and would do nothing (vLLM ignores it then; a field must work
        or be refused). Under ``--enable-force-include-usage`` (``force_include_usage``) every
        stream carries the running usage anyway, as vLLM's, so the field is honoured and
        allowed."""
        if (
            not force_include_usage
            and self.stream_options is not None
            and self.stream_options.continuous_usage_stats
            and not self.include_usage
        ):
            raise bad_request(
                "stream_options.continuous_usage_stats needs stream_options.include_usage: true",
                param="stream_options.continuous_usage_stats",
            )

    RENDER_ONLY: ClassVar[tuple[str, ...]] = ("return_token_offsets",)
    """Fields that ask for something only the render endpoints (``/v1/completions/render``,
    ``/v1/chat/completions/render``) return."""

    def refuse_render_only(self) -> None:
        """A generation endpoint's 400 naming the first render-only field set to true (vLLM
        ignores them there; Surge refuses a field it would not honour)."""
        for name in self.RENDER_ONLY:
            if getattr(self, name):
                path = (
                    "/v1/chat/completions" if isinstance(self, ChatCompletionRequest) else "/v1/completions"
                )
                raise bad_request(
                    f"'{name}' is honoured by {path}/render only (it renders the prompt without generating)",
                    param=name,
                )

    @property
    def stop_list(self) -> tuple[str, ...]:
        """``stop`` as a tuple of strings (empty when unset)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        """Whether ``stream_options.include_usage`` asks for a final usage chunk."""
        return bool(self.stream_options is not None and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's ``stream_options.continuous_usage_stats`` (validated to come with
        ``include_usage``): every choices chunk carries its own choice's usage so far."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def max_tokens_sent(self) -> bool:
        """Whether the client gave the output length (``max_tokens`` or ``max_completion_tokens``)."""
        return self.requested_max_tokens is not None and bool(
            {"max_tokens", "max_completion_tokens"} & self.model_fields_set
        )

    @property
    def max_tokens_param(self) -> str:
        """The field the output length came from, for errors that blame it:
        ``max_completion_tokens`` when the request sent it (it wins), else ``max_tokens``."""
        return (
            "max_completion_tokens"
            if getattr(self, "max_completion_tokens", None) is not None
            else "max_tokens"
        )

    @property
    def requested_max_tokens(self) -> int | None:
        """The output-token cap the client asked for (``max_tokens``), or None."""
        return self.max_tokens


class ChatMessage(BaseModel):
    """One chat message: ``content`` is a string or a list of text parts (``{"type": "text", "text": ...}``,
    ``refusal``, ``input_text``, ``output_text``, ``thinking``: :data:`surge.tokenizer.TEXT_PART_KEYS`).

    Other keys (``name``, ``tool_calls``, ``tool_call_id``, ...) are passed to the chat template.
    Those OpenAI's and vLLM's message types declare as strings (``name``, ``tool_call_id``,
    ``reasoning``, and ``reasoning_content``, its other name) must be strings (or null, left out),
    else a 400 names ``messages``: a template given ``"name": 5`` rendered it or dropped it
    silently, where vLLM refuses it.
    """

    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None


def check_continue_final_message(continue_final_message: bool, add_generation_prompt: bool) -> None:
    """Chat and ``/tokenize`` messages: a 400 naming ``continue_final_message`` when both it and
    ``add_generation_prompt`` are true (the last message cannot stay open under a new header)."""
    if continue_final_message and add_generation_prompt:
        raise bad_request(
            "continue_final_message and add_generation_prompt cannot both be true "
            "(set add_generation_prompt to false)",
            param="continue_final_message",
        )


class ChatCompletionRequest(SamplingRequestFields):
    """Body of ``POST /v1/chat/completions``.

    ``max_completion_tokens`` wins over ``max_tokens``; ``chat_template`` replaces the server's
    template for this request and ``chat_template_kwargs`` are passed to it (e.g.
    ``{"enable_thinking": false}`` for Qwen3); ``continue_final_message`` leaves the last
    (assistant) message open for the model to continue; ``add_special_tokens`` lets the
    tokenizer add its special tokens (e.g. BOS) on top of the template's (unset: no, except for a
    model without a chat template, whose fallback rendering adds them unless it is false).
    """

    null_is_unset: ClassVar[frozenset[str]] = NULLABLE_CHAT_FIELDS

    messages: list[ChatMessage]
    max_completion_tokens: JsonInt | None = Field(default=None, le=MAX_TOKEN_COUNT)
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False
    reasoning_effort: ReasoningEffort | None = None
    include_reasoning: bool = True
    return_prompt_text: bool | None = None  # vLLM's: the templated prompt's text in the response
    documents: list[dict[str, str]] | None = None  # vLLM's RAG documents, passed to the chat template
    # vLLM's: the per-token 0/1 mask of the template's {% generation %} text, render endpoint only
    return_assistant_tokens_mask: bool = False
    # refused unless left at their defaults (field_policy.REFUSALS)
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    verbosity: Any = None
    mm_processor_kwargs: Any = None
    media_io_kwargs: Any = None

    RENDER_ONLY: ClassVar[tuple[str, ...]] = ("return_token_offsets", "return_assistant_tokens_mask")
    # the server's --default-chat-template-kwargs, under the request's own (use_template_defaults)
    _template_defaults: dict[str, Any] | None = PrivateAttr(default=None)

    def use_template_defaults(self, defaults: dict[str, Any] | None) -> None:
        """Give :attr:`template_kwargs` the server's ``--default-chat-template-kwargs`` (vLLM's),
        which the request's own variables override."""
        self._template_defaults = defaults or None

    def check_unimplemented(self) -> None:
        """As for every request, plus ``continue_final_message`` with ``add_generation_prompt``."""
        super().check_unimplemented()
        check_continue_final_message(self.continue_final_message, self.add_generation_prompt)

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens``, else the deprecated ``max_tokens``, or None."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def answer_role(self, response_role: str = "assistant") -> str:
        """The answer's ``role``, vLLM's ``get_chat_request_role``: ``response_role`` (the
        server's ``--response-role``) under ``add_generation_prompt``, else the last message's
        own role (the prompt continues that message)."""
        if self.add_generation_prompt or not self.messages:
            return response_role
        return self.messages[-1].role

    def echo_text(self, response_role: str = "assistant") -> str:
        """vLLM's chat ``echo``: the text the answer's content starts with, the last message's
        content when that message has the answer's role (:meth:`answer_role`: ``response_role``,
        or the last message's own role under ``add_generation_prompt: false``), else (and
        without ``echo``) ``""``. Text parts are joined by newlines."""
        if not self.echo or not self.messages:
            return ""
        last = self.messages[-1]
        if last.role != self.answer_role(response_role):
            return ""
        try:
            return content_text(last.content)
        except ValueError:
            return ""  # a part the template refuses: its 400 comes from rendering

    @property
    def template_kwargs(self) -> dict[str, Any] | None:
        """The chat template's extra variables: ``chat_template_kwargs``, with ``reasoning_effort``
        as vLLM passes it: the value itself as the template variable ``reasoning_effort``, and
        ``enable_thinking`` false for ``"none"``, true for any other effort (Qwen3's switch); a
        variable the request's ``chat_template_kwargs`` set wins
        (:func:`surge.reasoning_effort.template_kwargs_with_effort`); all of them over the server's
        defaults (:meth:`use_template_defaults`), as vLLM's ``ChatParams.with_defaults``."""
        own = template_kwargs_with_effort(self.chat_template_kwargs, self.reasoning_effort)
        if self._template_defaults is None:
            return own
        return self._template_defaults | (own or {})


class BatchChatCompletionRequest(ChatCompletionRequest):
    """Body of ``POST /v1/chat/completions/batch`` (vLLM 0.26's): chat completions' fields, with
    ``messages`` a list of conversations (each a list of chat messages). Each conversation is
    rendered and generated as its own chat completion (:meth:`conversation`), all of them in the
    engine at once; the answer has one choice per conversation, ``index`` = its position.

    As in vLLM: no streaming, no tools, ``n`` 1 (:meth:`check_batch`); also no
    ``prompt_logprobs`` (chat answers them once, at the top level, for its one prompt).
    """

    messages: list[list[ChatMessage]]  # type: ignore[assignment]
    # vLLM's beam-search option of this body: refused unless false (field_policy.REFUSALS)
    early_stopping: Any = None

    def check_batch(self, max_conversations: int) -> None:
        """Raise a 400 ApiError naming the field of what a batch cannot do.

        Args:
            max_conversations: the most conversations of one request
                (``--max-choices-per-request``).
        """
        if not self.messages:
            raise bad_request("messages must hold at least one conversation", param="messages")
        if "early_stopping" in self.model_fields_set:  # the conversations do not carry it
            refused = first_refused({"early_stopping": self.early_stopping})
            if refused is not None:
                raise bad_request(refused[1], param=refused[0])
        if len(self.messages) > max_conversations:
            raise bad_request(
                f"the request has {len(self.messages)} conversations; at most {max_conversations} "
                "are allowed (--max-choices-per-request).",
                param="messages",
            )
        if self.stream:
            raise bad_request(
                "Batch chat completions do not support streaming: set stream to false (or leave it out)",
                param="stream",
            )
        if self.n != 1:
            raise bad_request(
                "Batch chat completions do not support `n > 1`. Please set `n` to 1.", param="n"
            )
        if self.tools:
            raise bad_request("Batch chat completions do not support tools: leave tools out", param="tools")
        if self.tool_choice not in (None, "none"):
            raise bad_request(
                'Batch chat completions do not support tools: tool_choice may only be "none"',
                param="tool_choice",
            )
        if self.prompt_logprobs is not None:
            raise bad_request(
                "Batch chat completions do not return prompt_logprobs: leave prompt_logprobs out",
                param="prompt_logprobs",
            )

    def conversation(self, index: int) -> ChatCompletionRequest:
        """Conversation ``index`` as a chat completion request of its own: the same fields (the
        same ones set, but the batch's own ``early_stopping``, checked on the batch), ``messages``
        that conversation. Not validated again: every field was."""
        values = dict(self)
        del values["early_stopping"]
        values["messages"] = self.messages[index]
        values["tools"] = self.tools or None  # ``[]`` is taken here (no tools) but not on chat
        fields_set = self.model_fields_set - {"early_stopping"}
        return ChatCompletionRequest.model_construct(_fields_set=fields_set, **values)


class CompletionRequest(SamplingRequestFields):
    """Body of ``POST /v1/completions``: ``prompt`` is a string, strings, token ids, or lists of ids.

    ``max_tokens`` defaults to 16 as in OpenAI's API (less when the context has less room);
    ``null`` is the same 16, as in OpenAI's API and vLLM 0.26 (its ``normalize_null_max_tokens``).
    """

    null_is_unset: ClassVar[frozenset[str]] = NULLABLE_COMPLETION_FIELDS

    prompt: Prompt
    max_tokens: JsonInt = Field(default=16, le=MAX_TOKEN_COUNT)
    echo: bool = False
    suffix: Any = None
    prompt_embeds: Any = None

    def check_unimplemented(self) -> None:
        """As for every request, plus ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
        (chat completions only)."""
        super().check_unimplemented()
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                raise bad_request(f"'{name}' is supported on chat completions only", param=name)


class TokenizeRequest(RequestBody):
    """Body of ``POST /tokenize``: a ``prompt`` string, or chat ``messages`` (with ``tools``,
    rendered by the chat template as chat completions render them)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # checked by surge.server.chat_tools, as on chat completions
    tools: Any = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: also answer each token's vocabulary string (``token_strs``); null is false
    return_token_strs: bool | None = None
    # vLLM's chat-form multimodal options: refused unless left at their defaults (REFUSALS)
    mm_processor_kwargs: Any = None
    media_io_kwargs: Any = None

    def check_unimplemented(self) -> None:
        """Raise a 400 ApiError naming the first refused field the request asks for (a
        multimodal option other than null or ``{}``)."""
        sent = {"mm_processor_kwargs", "media_io_kwargs"} & self.model_fields_set
        refused = first_refused({name: getattr(self, name) for name in sorted(sent)})
        if refused is not None:
            raise bad_request(refused[1], param=refused[0])


class DetokenizeRequest(RequestBody):
    """Body of ``POST /detokenize``: token ids to turn into text."""

    model: str | None = None
    tokens: list[_TokenId]
