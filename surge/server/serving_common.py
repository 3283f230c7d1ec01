"""What chat and completions share: server state, request checks, SSE plumbing, disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from transformers import PreTrainedTokenizerBase

from surge.core.scheduler import check_request_fits
from surge.core.scheduler import room_for_output as context_room
from surge.core.thinking_budget import (
    THINKING_BUDGET_BREAKS_GRAMMAR,
    THINKING_BUDGET_NEEDS_REASONING,
    ReasoningTokens,
    opens_reasoning,
)
from surge.engine.client import EngineClient
from surge.request import token_ids_in_range
from surge.sampling_params import SamplingParams, StructuredOutputsParams, truncated_prompt
from surge.server.chunked_validation import dump_models
from surge.server.drain import InFlight
from surge.server.errors import ApiError, bad_request, error_body
from surge.server.generation import ChoiceDelta, Generation
from surge.server.logprobs import TokenIdStrings
from surge.server.metrics import ServerMetrics
from surge.server.protocol import SamplingRequestFields
from surge.server.request_id import request_id_of
from surge.server.response_store import ResponseStore
from surge.server.tokenization import TokenizerWorker
from surge.token_strings import TokenStrings
from surge.tokenizer import check_chat_template_kwargs

T = TypeVar("T")
logger = logging.getLogger("surge.server")

_json_encode = msgspec.json.Encoder().encode


@dataclass
class ServerState:
    """Everything a handler needs.

    Attributes:
        client: the engine client.
        tokenizer: the model's tokenizer.
        metrics: the server's metrics.
        served_model_names: names accepted in ``model`` (the first is reported).
        model_path: the model folder (``root`` in /v1/models).
        max_model_len: longest prompt + output, in tokens.
        num_kv_blocks, block_size: the engine's KV pool.
        vocab_size: the model's vocabulary size (prompt token ids must be below it).
        stream_interval: tokens per SSE event after the first.
        chat_template: a template overriding the tokenizer's, or None.
        trust_request_chat_template: accept a request's own ``chat_template`` (``--trust-request-chat-template``).
        chat_template_content_format: how message content reaches the chat template
            (``--chat-template-content-format``: ``auto``, ``string`` or ``openai``).
        api_keys: bearer tokens accepted on /v1 routes; empty = no key needed.
        created: server start time (Unix seconds).
        metrics_require_key: ``/metrics`` needs the API key too.
        max_request_body_bytes: largest request body (bytes).
        body_read_timeout: seconds allowed to receive a request body.
        max_stop_strings: most ``stop`` strings in one request.
        max_stop_string_length: longest ``stop`` string, in characters.
        max_choices_per_request: most choices (prompts times ``n``) of one request.
        engine_stall_timeout: seconds without a finished engine step, while requests are
            pending, after which ``/health`` answers 503.
        sse_queued_interval: seconds between ``: queued`` SSE comments while a stream waits
            for its first token.
        tokenizer_worker: tokenization and chat templates off the event loop (built here).
        tool_call_parser: name of the tool-call parser (``--tool-call-parser``), or None.
        reasoning_parser: name of the reasoning parser (``--reasoning-parser``), or None.
        reasoning_tokens: its delimiters' token ids (``EngineConfig.reasoning_tokens``), or None.
        in_flight: the generations in flight and the drain flag.
        log_requests: log one line when a request starts and one when it ends.
        return_tokens_as_token_ids: logprob tokens are ``"token_id:<id>"`` for requests that
            leave ``return_tokens_as_token_ids`` unset (``--return-tokens-as-token-ids``, vLLM's).
        prompt_tokens_details: chat and completions usage carries
            ``prompt_tokens_details.cached_tokens`` (``--enable-prompt-tokens-details``, vLLM's).
        force_include_usage: every chat and completions stream carries the usage as if it
            asked for ``stream_options.include_usage`` and ``continuous_usage_stats``
            (``--enable-force-include-usage``, vLLM's).
        response_role: the ``role`` of chat answers under ``add_generation_prompt``
            (``--response-role``, vLLM's; else the last message's role).
        exclude_tools_when_tool_choice_none: a chat request with ``tool_choice: "none"`` does
            not render its tools (``--exclude-tools-when-tool-choice-none``, vLLM's):
            :meth:`template_tools`.
        default_chat_template_kwargs: chat template variables every chat request gets under
            its own (``--default-chat-template-kwargs``, vLLM's), or None.
        scheduling_policy: the engine's ``fcfs`` or ``priority`` (``--scheduling-policy``).
        eos_token_ids: the model's EOS ids (``config.json`` and ``generation_config.json``); a
            stop on one other than the tokenizer's EOS reports its id as ``stop_reason`` (vLLM's).
        responses: the Responses API's stored responses (``store: true``), in memory.
        background: the Responses API's background responses still running (``background:
            true``), by response id: the task that generates and stores each one.
        background_streams: the event logs of the streamed ones among them, by response id
            (``surge.server.serving_responses._EventLog``), which ``GET ...?stream=true`` replays.
        sampling_defaults: the model's sampling defaults in force (field -> value,
            ``EngineConfig.model.sampling_defaults``), which the engine gives the fields a
            request leaves out; the render endpoints report them. Its ``max_tokens`` (the
            file's ``max_new_tokens``) is the output length of a chat request that sends none.
        max_tokens_cap: the most tokens any request may generate (``--override-generation-config``'s
            ``max_new_tokens``, vLLM's ``override_max_tokens``), or None.
    """

    client: EngineClient
    tokenizer: PreTrainedTokenizerBase
    metrics: ServerMetrics
    served_model_names: tuple[str, ...]
    model_path: str
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    vocab_size: int
    stream_interval: int
    chat_template: str | None
    api_keys: tuple[str, ...]
    created: int
    metrics_require_key: bool = False
    max_request_body_bytes: int = 4 * 1024 * 1024
    body_read_timeout: float = 60.0
    max_stop_strings: int = 64
    max_stop_string_length: int = 256
    max_choices_per_request: int = 1024
    engine_stall_timeout: float = 60.0
    sse_queued_interval: float = 5.0
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    reasoning_tokens: ReasoningTokens | None = None
    trust_request_chat_template: bool = False
    chat_template_content_format: str = "auto"
    return_tokens_as_token_ids: bool = False
    prompt_tokens_details: bool = False
    force_include_usage: bool = False
    response_role: str = "assistant"
    default_chat_template_kwargs: dict[str, Any] | None = None
    exclude_tools_when_tool_choice_none: bool = False
    scheduling_policy: str = "fcfs"
    eos_token_ids: tuple[int, ...] = ()
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)
    max_tokens_cap: int | None = None
    tokenizer_worker: TokenizerWorker = field(init=False)
    responses: ResponseStore = field(default_factory=ResponseStore)
    background: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    background_streams: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokenizer_worker = TokenizerWorker(
            self.tokenizer, self.max_model_len, self.chat_template, self.chat_template_content_format
        )

    in_flight: InFlight = field(default_factory=InFlight)
    log_requests: bool = True

    @property
    def model_name(self) -> str:
        """The first served model name: the one responses report."""
        return self.served_model_names[0]

    @functools.cached_property
    def token_strings(self) -> TokenStrings:
        """Text and bytes of single tokens (for logprobs), cached per token id."""
        return TokenStrings(self.tokenizer)

    def logprob_tokens(self, req: SamplingRequestFields) -> TokenStrings | TokenIdStrings:
        """What names a token in a request's ``logprobs`` (``token``, completions' ``tokens``
        and ``top_logprobs`` keys): its text, or ``"token_id:<id>"`` with vLLM's
        ``return_tokens_as_token_ids`` (the request's value, else the server's default).
        ``prompt_logprobs`` keep the text in ``decoded_token`` either way, as in vLLM."""
        as_ids = req.return_tokens_as_token_ids
        if as_ids is None:
            as_ids = self.return_tokens_as_token_ids
        return TokenIdStrings(self.token_strings) if as_ids else self.token_strings

    def check_model(self, model: str | None) -> None:
        """Raise a 404 ApiError for a model name this server does not serve. None and the
        empty string are the served model, as vLLM's ``_is_model_supported`` (``if not
        model_name: return True``) takes them. Its message starts as vLLM's (``The model `X`
        does not exist.``) and names the served names, since the default one, the ``--model``
        path, is rarely what a client guesses."""
        if model and model not in self.served_model_names:
            served = ", ".join(f"`{name}`" for name in self.served_model_names)
            raise ApiError(
                404,
                f"The model `{model}` does not exist. This server serves {served} (GET /v1/models lists it; "
                "`surge serve --served-model-name NAME` sets another name).",
                param="model",
                code="model_not_found",
            )

    def with_template_defaults(self, template_kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        """A request's chat template variables (its ``chat_template_kwargs``, with its
        ``reasoning_effort``'s) over the server's ``--default-chat-template-kwargs``: the
        request's win, as vLLM's ``ChatParams.with_defaults``. Without defaults, as given."""
        if not self.default_chat_template_kwargs:
            return template_kwargs
        return self.default_chat_template_kwargs | (template_kwargs or {})

    def template_tools(
        self, tools: list[dict[str, Any]] | None, tool_choice: Any, *, none_excludes: bool = False
    ) -> list[dict[str, Any]] | None:
        """The checked ``tools`` of a chat request (``ChatPlan.tools``) that its chat template
        renders: all of them, or none when the request's ``tool_choice`` is ``"none"`` and either
        ``none_excludes`` (the Responses API, whose tools vLLM 0.26 never renders under
        ``"none"``) or the server was started with ``--exclude-tools-when-tool-choice-none``
        (vLLM's flag, for chat and the Messages API)."""
        if tool_choice == "none" and (none_excludes or self.exclude_tools_when_tool_choice_none):
            return None
        return tools

    def check_chat_template(self, template: str | None) -> None:
        """Raise a 400 ApiError naming ``chat_template`` for a request's own template unless the
        server trusts them: a Jinja template is code the server runs (one can loop for hours on
        the tokenizer threads), so it is refused by default, as vLLM refuses it."""
        if template is not None and not self.trust_request_chat_template:
            raise bad_request(
                "a chat_template in the request is refused: this server does not run request "
                "templates (start it with --trust-request-chat-template to allow them)",
                param="chat_template",
            )

    def check_priority(self, priority: int) -> None:
        """Raise a 400 ApiError naming ``priority`` for a priority other than 0 unless the
        server schedules by priority (``--scheduling-policy priority``): fcfs would ignore it."""
        if priority != 0 and self.scheduling_policy != "priority":
            raise bad_request(
                f"priority {priority} needs priority scheduling: this server schedules first come, "
                "first served (start it with --scheduling-policy priority), so priority must be 0",
                param="priority",
            )

    def check_thinking_budget(self, budget: int | None) -> None:
        """Raise a 400 ApiError naming ``thinking_token_budget`` for a budget (not None or -1)
        without ``--reasoning-parser``: with no reasoning delimiters there is nothing to count
        or force (vLLM refuses it too)."""
        if budget is not None and budget != -1 and self.reasoning_parser is None:
            raise bad_request(THINKING_BUDGET_NEEDS_REASONING, param="thinking_token_budget")

    def check_thinking_budget_grammar(self, params: SamplingParams, prompt_token_ids: list[int]) -> None:
        """Raise a 400 ApiError naming ``thinking_token_budget`` when its forced reasoning end would
        break the request's grammar: one that applies from the first token (not gated on
        ``</think>``) after a prompt that opens the reasoning (the engine refuses it too)."""
        grammar = params.structured_outputs
        if (
            params.thinking_token_budget is not None
            and grammar is not None
            and grammar.reasoning_end_token_id is None
            and self.reasoning_tokens is not None
            and opens_reasoning(self.reasoning_tokens, prompt_token_ids)
        ):
            raise bad_request(THINKING_BUDGET_BREAKS_GRAMMAR, param="thinking_token_budget")

    def check_stop(self, stop: tuple[str, ...]) -> None:
        """Raise a 400 ApiError naming ``stop`` for a list over the server's bounds."""
        if len(stop) > self.max_stop_strings:
            raise bad_request(
                f"stop has {len(stop)} strings; at most {self.max_stop_strings} are allowed "
                "(--max-stop-strings).",
                param="stop",
            )
        longest = max((len(s) for s in stop), default=0)
        if longest > self.max_stop_string_length:
            raise bad_request(
                f"a stop string has {longest} characters; at most {self.max_stop_string_length} are "
                "allowed (--max-stop-string-length).",
                param="stop",
            )

    def check_engine(self) -> None:
        """Raise a 503 ApiError when the engine is not running."""
        if not self.client.is_ready:
            raise ApiError(503, f"The engine is not available: {self.client.dead_reason or 'not ready'}")

    def check_prompt(
        self,
        token_ids: list[int],
        max_tokens: int,
        *,
        prompt_param: str,
        max_tokens_sent: bool,
        max_tokens_param: str = "max_tokens",
        prompt_name: str | None = None,
    ) -> None:
        """Raise a 400 ApiError for a prompt that can never be served; ``prompt_name`` names it
        in the message when it is one of a list (``prompt[2]``).

        A prompt that alone leaves no room for one output token is blamed on ``prompt_param``
        (``messages`` or ``prompt``) with its number of input tokens; only a ``max_tokens`` the
        client sent is blamed on ``max_tokens_param`` (the field it came in: ``max_tokens`` or chat's
        ``max_completion_tokens``). With ``max_tokens`` 0 (completions' ``echo`` scoring a
        prompt) nothing is generated, so a prompt may fill the context (vLLM's rule: prompt +
        max_tokens <= max_model_len). The length is checked before the ids, so a
        huge prompt costs nothing to refuse.
        """
        n = len(token_ids)
        if n == 0:
            what = "The prompt" if prompt_name is None else prompt_name
            raise bad_request(f"{what} is empty (it must contain at least one token).", param=prompt_param)
        capacity = self.num_kv_blocks * self.block_size
        room = 0 if max_tokens == 0 else 1  # the least the completion needs
        if n + room > self.max_model_len or n + room > capacity:
            limit = (
                f"maximum context length is {self.max_model_len} tokens"
                if n + room > self.max_model_len
                else f"KV cache holds only {capacity} tokens"
            )
            left = (
                ", which leaves no room for the completion" if n <= min(self.max_model_len, capacity) else ""
            )
            has = "have" if prompt_param == "messages" else "has"  # your messages have, your prompt has
            yours = f"your {prompt_param}" if prompt_name is None else prompt_name
            raise bad_request(
                f"This model's {limit}. However, {yours} {has} {n} input "
                f"token{'' if n == 1 else 's'}{left}. "
                f"Please reduce the length of {'the ' + prompt_param if prompt_name is None else prompt_name}.",
                param=prompt_param,
            )
        if not token_ids_in_range(token_ids, self.vocab_size):
            where = "" if prompt_name is None else f"{prompt_name}: "
            raise bad_request(
                f"{where}Prompt token ids must be in [0, {self.vocab_size}).", param=prompt_param
            )
        try:
            check_request_fits(
                n,
                max_tokens,
                max_model_len=self.max_model_len,
                block_size=self.block_size,
                num_kv_blocks=self.num_kv_blocks,
                max_tokens_name=max_tokens_param,
            )
        except ValueError as e:
            where = "" if prompt_name is None else f"{prompt_name}: "
            raise bad_request(
                f"{where}{e}", param=max_tokens_param if max_tokens_sent else prompt_param
            ) from e

    def capped_max_tokens(self, max_tokens: int) -> int:
        """``max_tokens`` (:func:`resolve_max_tokens`) at most ``max_tokens_cap``, the length
        a request generates."""
        return max_tokens if self.max_tokens_cap is None else min(max_tokens, self.max_tokens_cap)

    def room_for_output(self, num_prompt_tokens: int) -> int:
        """Output tokens that fit after a prompt of ``num_prompt_tokens`` (context and KV pool;
        :func:`surge.core.scheduler.room_for_output`)."""
        return context_room(
            num_prompt_tokens,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
        )


def start_generation(
    state: ServerState,
    request: Request,
    body: SamplingRequestFields,
    prefix: str,
    arrival: float,
    *,
    first_needs_text: bool = False,
    separator: str = "-",
    reserved: Container[str] = (),
    grammar_param: str | None = None,
) -> tuple[str, Generation]:
    """A new :class:`Generation` for one HTTP request, tracked in ``state.in_flight`` until it
    closes, and its request id: ``<prefix><separator><X-Request-Id, body request_id or a fresh
    id>`` (``separator`` "-", or "_" for the Responses API's ``resp_...``; with a random suffix
    if a request in flight already has that id, or ``reserved`` holds it). ``first_needs_text``
    and ``grammar_param`` (the field that carried the request's grammar) are
    :class:`Generation`'s."""
    stream = bool(body.stream)
    request_id = state.in_flight.unique_id(
        f"{prefix}{separator}{request_id_of(request, body.request_id)}", reserved
    )
    interval = state.stream_interval if stream else NO_STREAM_INTERVAL

    def closed() -> None:
        state.in_flight.remove(request_id)
        if state.log_requests:
            finishes = ",".join(str(c.finish_reason) for c in gen.choices)
            logger.info(
                "request %s done: finish_reason %s, %d prompt + %d completion tokens, %.3fs%s",
                request_id,
                finishes,
                gen.prompt_tokens,
                gen.completion_tokens,
                time.monotonic() - arrival,
                gen.first_token_split(),
            )

    gen = Generation(
        state.client,
        state.tokenizer,
        state.metrics,
        interval,
        arrival,
        first_needs_text=first_needs_text,
        on_close=closed,
        serial=state.in_flight.next_serial(),
        return_token_ids=bool(body.return_token_ids),
        cache_salt=body.cache_salt,
        priority=body.priority,
        eos_token_ids=state.eos_token_ids,
        grammar_param=grammar_param,
        prompt_tokens_details=state.prompt_tokens_details,
    )
    state.in_flight.add(request_id, gen)
    return request_id, gen


def log_request_start(
    state: ServerState, request_id: str, params: SamplingParams, prompt_tokens: list[int]
) -> None:
    """The log line of a request sent to the engine (its id names it in every later line)."""
    if state.log_requests:
        logger.info(
            "request %s: %d prompt tokens, max_tokens %d, n %d",
            request_id,
            len(prompt_tokens),
            params.max_tokens,
            params.n,
        )


def check_template_kwargs(chat_template_kwargs: dict[str, Any] | None) -> None:
    """Refuse ``chat_template_kwargs`` that set a name the chat template call passes itself
    (``messages``, ``tools``, ``add_generation_prompt``, ...; see
    :data:`surge.tokenizer.RESERVED_TEMPLATE_KWARGS`): chat and ``/tokenize`` call it before
    anything is rendered, so the 400 names the field rather than ``messages``.

    Raises:
        ApiError: 400 naming ``chat_template_kwargs``.
    """
    try:
        check_chat_template_kwargs(chat_template_kwargs)
    except ValueError as e:
        raise bad_request(str(e), param="chat_template_kwargs") from e


async def render_chat(
    state: ServerState,
    messages: list[Any],
    add_generation_prompt: bool,
    chat_template_kwargs: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None = None,
    *,
    bound: bool = True,
    chat_template: str | None = None,
    continue_final_message: bool = False,
    add_special_tokens: bool | None = None,
    documents: list[dict[str, Any]] | None = None,
    on_generation_spans: Callable[[list[tuple[int, int]]], None] | None = None,
) -> tuple[list[int], str]:
    """Token ids and rendered text (vLLM's ``prompt_text``) of ``messages`` (pydantic chat
    messages) under the request's chat template
    (``chat_template``) or else the server's (with ``tools``, OpenAI function definitions, when
    given), rendered and tokenized on a tokenizer thread
    (:class:`surge.server.tokenization.TokenizerWorker`).

    Args:
        bound: refuse a prompt surely longer than the context before tokenizing it all
            (``/tokenize`` passes False: it counts texts of any length).
        chat_template, continue_final_message, add_special_tokens, documents: the request's
            options (:func:`surge.tokenizer.apply_chat_template`).
        on_generation_spans: called (on the worker thread) with the assistant spans of a
            template that marks them (:func:`surge.tokenizer.apply_chat_template`).

    Raises:
        ApiError: 400 naming ``messages`` when the template cannot render them, or when the
            rendered prompt is surely longer than the context.
    """
    return await state.tokenizer_worker.render_chat(
        await dump_models(messages, exclude_none=True),  # a long list in chunks, yielding
        add_generation_prompt,
        chat_template_kwargs,
        tools,
        bound=bound,
        chat_template=chat_template,
        continue_final_message=continue_final_message,
        add_special_tokens=add_special_tokens,
        documents=documents,
        on_generation_spans=on_generation_spans,
    )


def truncate_prompt(state: ServerState, token_ids: list[int], req: SamplingRequestFields) -> list[int]:
    """A prompt cut to the request's ``truncate_prompt_tokens`` (None keeps it whole): its last
    tokens (vLLM's default left truncation), or its first ones when ``truncation_side`` is
    "right". -1 keeps what the context leaves after the request's ``max_tokens`` (vLLM 0.26's
    ``max_model_len - max_tokens``, 16 on completions when left out, nothing reserved on chat
    when left out).

    Raises:
        ApiError: 400 naming ``truncate_prompt_tokens`` when it exceeds ``max_model_len``.
    """
    try:
        return truncated_prompt(
            token_ids,
            req.truncate_prompt_tokens,
            state.max_model_len,
            req.truncation_side or "left",
            req.requested_max_tokens,
        )
    except ValueError as e:
        raise bad_request(str(e), param="truncate_prompt_tokens") from None


def build_sampling_params(
    req: SamplingRequestFields,
    max_tokens: int,
    structured_outputs: StructuredOutputsParams | None,
    *,
    token_rules: Mapping[str, Any],
) -> SamplingParams:
    """The engine's SamplingParams of a request; its grammar is ``structured_outputs`` (the
    checked one of :func:`~surge.server.structured_request.structured_outputs_of`, or chat's
    plan, which adds forced tool calls; None: no grammar). Sampling fields the
    request leaves out stay unset, so the engine gives them the model's generation_config.json
    defaults. ``token_rules`` are the request's checked ``logit_bias``, ``allowed_token_ids``
    and ``bad_words`` (:func:`surge.server.token_rules.token_rules_of`). ``seed: -1`` is no
    seed, as vLLM reads it.

    Raises:
        ApiError: 400 for an out-of-range value or an invalid grammar (the message names the field).
    """
    try:
        return SamplingParams(
            **token_rules,
            n=req.n,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=None if req.seed == -1 else req.seed,  # vLLM's "no seed" (as choice_params reads it)
            stop_token_ids=tuple(req.stop_token_ids or ()),
            stop=req.stop_list,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=req.repetition_penalty,
            structured_outputs=structured_outputs,
            repetition_detection=(
                None if req.repetition_detection is None else req.repetition_detection.model_dump()
            ),
            thinking_token_budget=req.thinking_token_budget,
        )
    except ValueError as e:
        field = str(e).split(" ", 1)[0].rstrip(":")  # "min_p", "repetition_detection.min_count"
        raise bad_request(
            str(e), param=field if field.split(".")[0] in type(req).model_fields else None
        ) from e


def resolve_max_tokens(state: ServerState, req: SamplingRequestFields, num_prompt_tokens: int) -> int:
    """The output length of a request: the ``max_tokens`` the client sent; else the endpoint's
    default (16 on completions) or, without one, the model's default (its generation_config.json
    ``max_new_tokens``, ``sampling_defaults["max_tokens"]``) or all the room left after the
    prompt, whichever is less (at least 1, so that a prompt with no room is reported by
    ``check_prompt``). ``check_prompt`` checks this length; the request then generates at most
    :meth:`ServerState.capped_max_tokens` of it (vLLM checks the request's own ``max_tokens``
    against the context, then ``get_max_tokens`` caps it).

    Raises:
        ApiError: 400 naming ``max_tokens`` for a value below 1.
    """
    requested = req.requested_max_tokens
    room = max(1, state.room_for_output(num_prompt_tokens))
    if req.max_tokens_sent:
        assert requested is not None
        if requested < 1:
            param = req.max_tokens_param
            raise bad_request(f"{param} must be at least 1, got {requested}", param=param)
        resolved = requested
    elif requested is not None:
        resolved = min(requested, room)
    else:
        default = state.sampling_defaults.get("max_tokens")
        resolved = room if default is None else min(int(default), room)
    return resolved


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ClientGone(Exception):
    """The HTTP client disconnected before the response was ready (answered with 499)."""


async def until_disconnect(request: Request, awaitable: Awaitable[T], on_disconnect: Callable[[], None]) -> T:
    """Await ``awaitable`` unless the client disconnects first.

    Raises:
        ClientGone: the client disconnected (``on_disconnect`` was called and the work cancelled).
    """
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        on_disconnect()
        raise
    finally:
        watch.cancel()
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    on_disconnect()
    raise ClientGone


def sse(obj: Any) -> bytes:
    """One SSE event carrying ``obj`` as JSON."""
    return b"data: " + _json_encode(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
NO_STREAM_INTERVAL = 1 << 30
"""Stream interval of a non-streaming request: its text is collected once, at the end."""


@dataclass(frozen=True)
class ChunkEnvelope:
    """The fields every streamed chunk of one response shares (OpenAI chunk objects).

    Attributes:
        request_id: the response id ("chatcmpl-..." / "cmpl-...").
        object: "chat.completion.chunk" or "text_completion".
        created: Unix time in seconds of the response.
        model: the served model name.
        gen: the generation, for usage figures.
        usage_in_chunks: what each choices chunk says in ``usage``: "omit" (no key), "null"
            (``stream_options.include_usage``: only the final chunk carries the usage, the
            others ``"usage": null`` as in OpenAI's reference), or "running" (with
            ``continuous_usage_stats`` too: the usage of the chunk's one choice so far,
            :func:`choice_usage`, as in vLLM).
    """

    request_id: str
    object: str
    created: int
    model: str
    gen: Generation | None = None
    usage_in_chunks: str = "omit"

    @functools.cached_property
    def _head(self) -> bytes:
        """``data: {"id":...,"object":...,"created":...,"model":...,"choices":``: the bytes every
        event of the response starts with, encoded once."""
        base = {"id": self.request_id, "object": self.object, "created": self.created, "model": self.model}
        return b"data: " + _json_encode(base)[:-1] + b',"choices":'

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        """One SSE event with these ``choices`` (and extra top-level fields such as usage): the
        JSON object ``{id, object, created, model, choices, *extra}``, its head encoded once per
        response."""
        if "usage" not in extra and self.usage_in_chunks != "omit":
            extra["usage"] = self._running_usage(choices)
        parts = [self._head, _json_encode(choices)]
        for key, value in extra.items():
            parts.append(b"," + _json_encode(key) + b":" + _json_encode(value))
        parts.append(b"}\n\n")
        return b"".join(parts)

    def _running_usage(self, choices: list[dict[str, Any]]) -> dict[str, int] | None:
        """The ``usage`` of a choices chunk: with "running", that of the one choice it carries
        (:func:`choice_usage`); else None."""
        if self.usage_in_chunks != "running" or self.gen is None or len(choices) != 1:
            return None
        return choice_usage(self.gen, choices[0]["index"])

    def usage_chunk(self, gen: Generation) -> bytes:
        """The final ``include_usage`` event: no choices, the exact usage."""
        return self.chunk([], usage=usage_dict(gen))


def usage_in_chunks(req: SamplingRequestFields, force_include_usage: bool = False) -> str:
    """``ChunkEnvelope.usage_in_chunks`` for a request's ``stream_options``: "running" when
    ``continuous_usage_stats`` is set (validation refuses it without ``include_usage``), or
    whatever the request asks under ``--enable-force-include-usage`` (``force_include_usage``:
    vLLM's ``should_include_usage`` then turns on both ``include_usage`` and
    ``continuous_usage_stats``). A stream whose chunks carry usage ("null" or "running") also
    ends with the usage-only chunk; one that omits it does not."""
    if force_include_usage:
        return "running"
    if not req.include_usage:
        return "omit"
    return "running" if req.continuous_usage else "null"


async def full_response(
    request_id: str,
    obj: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    gen: Generation,
    **extra: Any,
) -> Response:
    """The non-streaming OpenAI body: ``choices`` plus the exact usage of ``gen`` (and
    ``extra`` top-level fields, such as chat's ``prompt_logprobs``, after ``usage``).

    With logprobs of many choices the body runs to hundreds of MB: it is encoded by msgspec
    (``json.dumps`` is about ten times slower) one choice at a time, with a pause for the event
    loop every few ms (:class:`Cooperative`), so that other clients' streams go on meanwhile (a
    1 GB answer encoded in one call stopped them for 3.3-5.2 s).
    """
    turn = Cooperative()
    head = {"id": request_id, "object": obj, "created": created, "model": model}
    parts = [_json_encode(head)[:-1], b',"choices":[']
    for i, choice in enumerate(choices):
        await turn.pause()
        if i:
            parts.append(b",")
        parts.append(_json_encode(choice))
    parts.append(b'],"usage":' + _json_encode(usage_dict(gen)))
    for key, value in extra.items():
        await turn.pause()
        parts.append(b"," + _json_encode(key) + b":" + _json_encode(value))
    parts.append(b"}")
    await turn.pause()
    return Response(b"".join(parts), media_type="application/json")


_MAX_BUILD_SECONDS = 0.005
"""Longest stretch :class:`Cooperative` lets a response's construction hold the event loop."""


class Cooperative:
    """Yield to the event loop between the pieces of a long construction (a non-streamed
    response's choices with their logprobs), so that other clients' streams go on meanwhile."""

    def __init__(self) -> None:
        self._since = time.monotonic()

    async def pause(self) -> None:
        """Let other tasks run if this one has held the loop for more than a few ms."""
        if time.monotonic() - self._since > _MAX_BUILD_SECONDS:
            await asyncio.sleep(0)
            self._since = time.monotonic()


def with_finish(choice: dict[str, Any], delta: ChoiceDelta) -> dict[str, Any]:
    """Add ``finish_reason`` (and vLLM's ``stop_reason`` once finished) to a streamed choice."""
    choice["logprobs"] = None
    choice["finish_reason"] = delta.finish_reason
    if delta.finish_reason is not None:
        choice["stop_reason"] = delta.stop_reason
    return choice


SSE_QUEUED = b": queued\n\n"
"""SSE comment sent while a stream waits for its first token (clients ignore comments)."""


async def stream_response(
    request: Request,
    gen: Generation,
    make_chunks: Callable[[list[ChoiceDelta]], list[bytes]],
    usage_chunk: Callable[[], bytes] | None,
    queued_interval: float = 5.0,
    *,
    opening: list[bytes] | None = None,
    closing: Callable[[], list[bytes]] | None = None,
    on_error: Callable[[ApiError], list[bytes]] | None = None,
) -> StreamingResponse:
    """Stream a generation: the headers go out now, then ``: queued`` comments every
    ``queued_interval`` seconds until the first token, then the chunks.

    Events: the chunks of every delta batch, the usage chunk if asked, then ``[DONE]``. An
    error once the stream has started (an engine rejection, the engine's death, a shutdown:
    :class:`~surge.server.drain.ShutdownError`) is sent as one ``data: {"error": ...}`` event, then ``[DONE]``, as
    vLLM ends such a stream; so is any other exception raised while the stream is produced (a
    bug: its traceback is logged once, the client gets a 500 "Internal server error" event). A
    client disconnect aborts the request in the engine.

    The Responses API streams other events: ``opening`` goes out first (before any ``: queued``
    comment), ``closing()`` replaces the usage chunk and ``[DONE]`` at the end, and
    ``on_error(error)`` gives the events of an error.
    """
    iterator = gen.deltas().__aiter__()

    async def events() -> AsyncIterator[bytes]:
        try:
            for event in opening or ():
                yield event
            first_step = asyncio.ensure_future(iterator.__anext__())
            try:
                while not (await asyncio.wait((first_step,), timeout=queued_interval))[0]:
                    yield SSE_QUEUED
            finally:
                first_step.cancel()
            try:
                first = first_step.result()
            except StopAsyncIteration:
                first = []
            for chunk in make_chunks(first):
                yield chunk
            async for deltas in iterator:
                for chunk in make_chunks(deltas):
                    yield chunk
            if closing is not None:
                for event in closing():
                    yield event
                return
            if usage_chunk is not None:
                yield usage_chunk()
            yield SSE_DONE
        except Exception as e:  # noqa: BLE001 - every stream ends with an error event, never a cut socket
            if isinstance(e, ApiError):
                error = e
            else:  # a bug of ours (a parser, the detokenizer, a chunk builder): log it, answer a 500
                logger.exception("internal error while streaming %s", request.url.path)
                error = ApiError(500, "Internal server error")
            if on_error is not None:
                for event in on_error(error):
                    yield event
                return
            yield sse(error_body(error.status, error.message, param=error.param, code=error.code))
            yield SSE_DONE  # as vLLM: the error event, then the end of the stream
        finally:
            gen.abort()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def collect(request: Request, gen: Generation) -> dict[int, tuple[str, str | None, str | int | None]]:
    """Run a non-streaming generation to the end: choice index -> (text, finish_reason, stop_reason).

    Raises:
        ApiError: from the engine (400 rejected, 503 engine gone).
        ClientGone: the client disconnected (the request is aborted).
    """

    async def run() -> dict[int, tuple[str, str | None, str | int | None]]:
        texts: dict[int, list[str]] = {}
        finals: dict[int, tuple[str | None, str | int | None]] = {}
        async for deltas in gen.deltas():
            for d in deltas:
                texts.setdefault(d.index, []).append(d.text)
                if d.finish_reason is not None:
                    finals[d.index] = (d.finish_reason, d.stop_reason)
        return {i: ("".join(t), *finals.get(i, (None, None))) for i, t in texts.items()}

    try:
        return await until_disconnect(request, run(), gen.abort)
    finally:
        gen.abort()


def usage_dict(gen: Generation) -> dict[str, Any]:
    """OpenAI ``usage``: prompt tokens (once per prompt), completion tokens (all choices), total;
    with ``--enable-prompt-tokens-details`` also ``prompt_tokens_details.cached_tokens``
    (:attr:`Generation.cached_prompt_tokens`), as vLLM's flag adds it."""
    p, c = gen.prompt_tokens, gen.completion_tokens
    usage: dict[str, Any] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    if gen.prompt_tokens_details:
        usage["prompt_tokens_details"] = {"cached_tokens": gen.cached_prompt_tokens}
    return usage


def choice_usage(gen: Generation, index: int) -> dict[str, int]:
    """The ``usage`` of choice ``index`` alone, as vLLM's ``continuous_usage_stats`` chunks give
    it: the tokens of its prompt and the tokens it has generated so far (all those the server has
    received, which may include tokens of the choice's next chunks when the engine's outputs for
    it came in together), and their total."""
    choice = gen.choices[index]
    p, c = len(gen.prompts[choice.prompt_index].token_ids), choice.num_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
