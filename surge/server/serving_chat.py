"""``POST /v1/chat/completions``: chat template, generation, and OpenAI chat responses."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from surge.core.logprobs import LogprobsLists
from surge.sampling_params import SamplingParams
from surge.server.chat_tools import ChatPlan, is_empty_delta, plan_chat
from surge.server.errors import ApiError, bad_request
from surge.server.generation import ChoiceDelta, Generation
from surge.server.logprobs import LogprobOptions, chat_content, chat_options, vllm_prompt_logprobs
from surge.server.protocol import BatchChatCompletionRequest, ChatCompletionRequest
from surge.server.serving_common import (
    ChunkEnvelope,
    Cooperative,
    ServerState,
    build_sampling_params,
    check_template_kwargs,
    collect,
    full_response,
    log_request_start,
    render_chat,
    resolve_max_tokens,
    start_generation,
    stream_response,
    truncate_prompt,
    usage_in_chunks,
    with_finish,
)
from surge.server.token_rules import token_rules_of


@dataclass(frozen=True)
class PreparedChat:
    """A chat request checked, rendered and sent to the engine (:func:`start_chat`).

    Attributes:
        request_id: the response id (``<prefix>-<id>``).
        gen: the generation running in the engine (the caller must consume or abort it).
        plan: how the output is parsed (tools, reasoning, grammar).
        prompt_ids: the templated prompt's token ids.
        prompt_text: the templated prompt's text (before ``truncate_prompt_tokens``).
        params: the engine's sampling parameters.
        lp: the request's logprob options.
        created: Unix time (seconds) of the response.
    """

    request_id: str
    gen: Generation
    plan: ChatPlan
    prompt_ids: list[int]
    prompt_text: str
    params: SamplingParams
    lp: LogprobOptions
    created: int


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request checked and its prompt rendered (:func:`prepare_chat`), nothing sent yet.

    Attributes:
        plan: how the output is parsed (tools, reasoning, grammar).
        prompt_ids: the templated prompt's token ids (after ``truncate_prompt_tokens``).
        prompt_text: the templated prompt's text (before ``truncate_prompt_tokens``).
        params: the engine's sampling parameters.
        lp: the request's logprob options.
    """

    plan: ChatPlan
    prompt_ids: list[int]
    prompt_text: str
    params: SamplingParams
    lp: LogprobOptions


async def prepare_chat(
    state: ServerState,
    body: ChatCompletionRequest,
    *,
    prompt_param: str = "messages",
    render: bool,
    on_generation_spans: Callable[[list[tuple[int, int]]], None] | None = None,
    none_excludes_tools: bool = False,
) -> ChatPrompt:
    """Check a chat request and render its prompt as the engine would get it: what chat
    completions, the Responses API and ``/v1/chat/completions/render`` (``render`` true: the
    render-only fields are allowed) share. ``prompt_param`` is the field the errors about the
    whole prompt (empty, too long for the context) name; ``on_generation_spans`` gets the
    assistant spans of a template that marks them (:func:`surge.tokenizer.apply_chat_template`).
    ``none_excludes_tools``: a ``tool_choice`` of ``"none"`` renders no tools whatever the
    server's flag (:meth:`ServerState.template_tools`; the Responses API).

    Raises:
        ApiError: 400 for a bad request (``param`` names the chat field), 404 for an unknown
            model.
    """
    state.check_model(body.model)
    body.check_unimplemented()
    body.check_usage_options(state.force_include_usage)
    if not render:
        body.refuse_render_only()
    state.check_priority(body.priority)
    state.check_thinking_budget(body.thinking_token_budget)
    check_template_kwargs(body.template_kwargs)
    body.use_template_defaults(state.default_chat_template_kwargs)
    state.check_chat_template(body.chat_template)
    state.check_stop(body.stop_list)
    lp = chat_options(body, state.vocab_size)
    if not body.messages:
        raise bad_request(f"{prompt_param} must not be empty", param=prompt_param)
    # on a tokenizer thread: checking a grammar (tools, response_format) may take xgrammar a while
    worker = state.tokenizer_worker
    plan = await worker.run(plan_chat, body, state.tokenizer, state.tool_call_parser, state.reasoning_parser)
    tools = state.template_tools(plan.tools, body.tool_choice, none_excludes=none_excludes_tools)
    try:
        prompt_ids, prompt_text = await render_chat(
            state,
            body.messages,
            body.add_generation_prompt,
            body.template_kwargs,
            tools,
            bound=body.truncate_prompt_tokens is None,  # truncated prompts may exceed the context
            chat_template=body.chat_template,
            continue_final_message=body.continue_final_message,
            add_special_tokens=body.add_special_tokens,
            documents=body.documents,
            on_generation_spans=on_generation_spans,
        )
    except ApiError as e:
        _note_template(e, "messages", body.chat_template)  # render_chat's name for the prompt
        _note_tools(e, "messages", tools)
        raise
    prompt_ids = truncate_prompt(state, prompt_ids, body)
    plan.see_prompt(state.tokenizer, prompt_ids)
    max_tokens = resolve_max_tokens(state, body, len(prompt_ids))
    rules = await worker.run(token_rules_of, body, state.tokenizer, state.vocab_size)  # bad_words: tokenized
    params = build_sampling_params(
        body, state.capped_max_tokens(max_tokens), plan.structured_outputs, token_rules=rules
    )
    params.skip_special_tokens = plan.skip_special_tokens(body)  # hermes reads <tool_call> tokens
    state.check_thinking_budget_grammar(params, prompt_ids)
    params = lp.engine_params(params)
    try:
        state.check_prompt(
            prompt_ids,
            max_tokens,
            prompt_param=prompt_param,
            max_tokens_sent=body.max_tokens_sent,
            max_tokens_param=body.max_tokens_param,
        )
    except ApiError as e:
        _note_template(e, prompt_param, body.chat_template)
        _note_tools(e, prompt_param, tools)
        raise
    return ChatPrompt(plan, prompt_ids, prompt_text, params, lp)


def note_prompt_part(error: ApiError, prompt_param: str, part: str) -> None:
    """Add to ``error``'s message, when it says that the prompt (named ``prompt_param``) is too
    long for the context, that the chat template renders ``part`` into the prompt too: a prompt
    too long because of its tools (or the Messages API's ``system``, the Responses API's
    ``instructions``) blamed the messages alone."""
    if _says_too_long(error, prompt_param):
        error.message += f" The chat template renders {part} into the prompt too."


def _note_template(error: ApiError, prompt_param: str, chat_template: str | None) -> None:
    """Add to ``error``'s message, when it says that the prompt (named ``prompt_param``) is too
    long for the context, that the request's own ``chat_template`` renders the prompt: a prompt
    too long because of the request's template blamed the messages alone."""
    if chat_template is not None and _says_too_long(error, prompt_param):
        error.message += " The request's 'chat_template' renders the prompt."


def _says_too_long(error: ApiError, prompt_param: str) -> bool:
    """Whether ``error`` says that the prompt (named ``prompt_param``) is too long for the context."""
    return error.param == prompt_param and error.message.startswith("This model's")


def _note_tools(error: ApiError, prompt_param: str, tools: list[dict[str, Any]] | None) -> None:
    """:func:`note_prompt_part` for the request's ``tools``, if any."""
    if tools:
        n = len(tools)
        note_prompt_part(error, prompt_param, f"the {n} tool{'' if n == 1 else 's'} of 'tools'")


async def start_chat(
    state: ServerState,
    body: ChatCompletionRequest,
    request: Request,
    prefix: str,
    arrival: float,
    *,
    separator: str = "-",
    prompt_param: str = "messages",
    reserved_ids: Container[str] = (),
    none_excludes_tools: bool = False,
) -> PreparedChat:
    """Check a chat request, render its prompt and send it to the engine: what chat
    completions and the Responses API (which builds a :class:`ChatCompletionRequest` from its
    own body) share. ``prefix`` and ``separator`` start the response id (``chatcmpl-``,
    ``resp_``); ``prompt_param`` is the field the errors about the whole prompt (empty, too
    long for the context) name, in their message as in their ``param`` (the Responses API:
    ``input``); the response id is not one of ``reserved_ids`` (the Responses API's stored
    ids: a client's repeated ``X-Request-Id`` gets a suffixed id instead of replacing one);
    ``none_excludes_tools`` as :func:`prepare_chat`'s.

    Raises:
        ApiError: 400 for a bad request (``param`` names the chat field), 404 for an unknown
            model, 503 when the engine is gone.
    """
    prompt = await prepare_chat(
        state, body, prompt_param=prompt_param, render=False, none_excludes_tools=none_excludes_tools
    )
    state.check_engine()
    request_id, gen = start_generation(
        state,
        request,
        body,
        prefix,
        arrival,
        first_needs_text=True,
        separator=separator,
        reserved=reserved_ids,
        grammar_param=prompt.plan.grammar_param,
    )
    created = int(time.time())
    log_request_start(state, request_id, prompt.params, prompt.prompt_ids)
    try:
        gen.add_prompt(request_id, prompt.prompt_ids, prompt.params, share_prompt_logprobs=not body.stream)
    except Exception:
        gen.abort()
        raise
    return PreparedChat(
        request_id, gen, prompt.plan, prompt.prompt_ids, prompt.prompt_text, prompt.params, prompt.lp, created
    )


async def create_chat_completion(
    state: ServerState, body: ChatCompletionRequest, request: Request
) -> Response:
    """Serve one chat completion request, streamed (SSE) or not.

    Raises:
        ApiError: 400 for a bad request, 404 for an unknown model, 503 when the engine is gone.
        ClientGone: the client disconnected before a non-streamed answer was ready.
    """
    prepared = await start_chat(state, body, request, "chatcmpl", time.monotonic())
    request_id, gen, plan, prompt_ids = prepared.request_id, prepared.gen, prepared.plan, prepared.prompt_ids
    lp, created = prepared.lp, prepared.created
    model = state.model_name
    strings = state.token_strings
    names = state.logprob_tokens(body)
    return_ids = bool(body.return_token_ids)
    echo = body.echo_text(state.response_role)
    role = body.answer_role(state.response_role)

    def logprobs_of(rows: LogprobsLists | None) -> dict[str, Any] | None:
        if lp.logprobs is None:
            return None
        return {
            "content": chat_content(rows or LogprobsLists(), lp.logprobs, names, lp.token_ids is not None)
        }

    if not body.stream:
        results = await collect(request, gen)
        choices = []
        turn = Cooperative()
        for i, (text, finish, stop) in sorted(results.items()):
            await turn.pause()
            message, finish = plan.message(text, finish)
            message["role"] = role
            if echo:  # vLLM: the echoed message first, whatever the answer holds
                message["content"] = echo + (message.get("content") or "")
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "logprobs": logprobs_of(_all_rows(gen, i)),
                "finish_reason": finish,
                "stop_reason": stop,
            }
            if return_ids:  # vLLM: every generated id, the EOS or stop token included
                choice["token_ids"] = gen.choices[i].token_ids
            choices.append(choice)
        extra: dict[str, Any] = {}
        if lp.prompt_logprobs is not None:
            rows = gen.choices[0].prompt_logprobs
            extra["prompt_logprobs"] = vllm_prompt_logprobs(rows, lp.prompt_logprobs, strings)
        if return_ids:  # vLLM: the templated prompt's ids, once, at the top level
            extra["prompt_token_ids"] = prompt_ids
        if body.return_prompt_text:  # vLLM: the templated prompt's text, at the top level
            extra["prompt_text"] = prepared.prompt_text
        return await full_response(request_id, "chat.completion", created, model, choices, gen, **extra)

    env = ChunkEnvelope(
        request_id,
        "chat.completion.chunk",
        created,
        model,
        gen,
        usage_in_chunks(body, state.force_include_usage),
    )

    parsers = {c.index: p for c in gen.choices if (p := plan.new_parser()) is not None}
    role_delta = {"role": role, "content": ""}

    def running_usage() -> dict[str, Any]:
        """With ``continuous_usage_stats``, the usage of a chunk sent before any token: the
        prompt's tokens and none generated, as vLLM."""
        if env.usage_in_chunks != "running":
            return {}
        p = len(prompt_ids)
        return {"usage": {"prompt_tokens": p, "completion_tokens": 0, "total_tokens": p}}

    def role_chunk(index: int) -> bytes:
        """A choice's first chunk, as vLLM and OpenAI send it: the role and empty content (with
        ``continuous_usage_stats``, the prompt's tokens and none generated, as vLLM; with
        ``return_token_ids``, the prompt's ids at the top level, as vLLM's role chunks; with
        ``return_prompt_text``, the templated prompt's text: each choice's role chunk, as vLLM's)."""
        choice = {"index": index, "delta": role_delta, "logprobs": None, "finish_reason": None}
        extra = running_usage()
        if return_ids:
            extra["prompt_token_ids"] = prompt_ids
        if body.return_prompt_text:
            extra["prompt_text"] = prepared.prompt_text
        return env.chunk([choice], **extra)

    def make_chunks(deltas: list[ChoiceDelta]) -> list[bytes]:
        chunks = []
        for d in deltas:
            if d.first:
                chunks.append(role_chunk(d.index))
                if echo:  # vLLM: the echoed message in a chunk of its own after the role
                    echoed = {
                        "index": d.index,
                        "delta": {"content": echo},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    chunks.append(env.chunk([echoed], **running_usage()))
            parser = parsers.get(d.index)
            delta, finish = plan.delta(parser, d.text, d.finish_reason)
            logprobs = logprobs_of(d.logprobs)
            if (
                parser is not None
                and finish is None
                and is_empty_delta(delta)
                and not _has_entries(logprobs)
                and not d.token_ids
            ):
                # the parser took the text (a tool call's markup, a reasoning tag) and released
                # nothing yet: no chunk, as in vLLM (which sends it with return_token_ids, so
                # that the streamed ids hold every token)
                continue
            choice = with_finish({"index": d.index, "delta": delta}, d)
            choice["finish_reason"] = finish
            choice["logprobs"] = logprobs
            if d.token_ids is not None:
                choice["token_ids"] = d.token_ids
            chunks.append(env.chunk([choice]))
        return chunks

    usage = (lambda: env.usage_chunk(gen)) if env.usage_in_chunks != "omit" else None
    return await stream_response(request, gen, make_chunks, usage, state.sse_queued_interval)


async def create_batch_chat_completion(
    state: ServerState, body: BatchChatCompletionRequest, request: Request
) -> Response:
    """Serve ``POST /v1/chat/completions/batch`` (vLLM 0.26's): every conversation checked and
    rendered as a chat completion of its own, then all sent to the engine together (they run in
    the same steps; under ``-dp`` spread over the replicas), answered in one non-streamed chat completion whose choice ``index`` is the
    conversation's position, with the usage of them all. One bad conversation refuses the whole
    request before anything is generated (a 400 naming ``messages[i]``), as one engine error
    fails it all; a client that disconnects aborts every conversation in the engine.

    Raises:
        ApiError: 400 for a bad request, 404 for an unknown model, 503 when the engine is gone.
        ClientGone: the client disconnected before the answer was ready.
    """
    arrival = time.monotonic()
    body.check_batch(state.max_choices_per_request)
    conversations = [body.conversation(i) for i in range(len(body.messages))]
    prompts: list[ChatPrompt] = []
    for i, conv in enumerate(conversations):
        try:
            prompts.append(await prepare_chat(state, conv, prompt_param=f"messages[{i}]", render=False))
        except ApiError as e:
            raise _in_conversation(e, i) from None
    state.check_engine()
    request_id, gen = start_generation(
        state,
        request,
        body,
        "chatcmpl",
        arrival,
        first_needs_text=True,
        grammar_param=prompts[0].plan.grammar_param,
    )
    created = int(time.time())
    try:
        for i, prompt in enumerate(prompts):
            prompt_id = f"{request_id}-p{i}"
            log_request_start(state, prompt_id, prompt.params, prompt.prompt_ids)
            gen.add_prompt(prompt_id, prompt.prompt_ids, prompt.params)
    except Exception:
        gen.abort()
        raise
    lp = prompts[0].lp  # the same options for every conversation: they come from the shared fields
    names = state.logprob_tokens(body)
    return_ids = bool(body.return_token_ids)
    results = await collect(request, gen)
    choices = []
    turn = Cooperative()
    for i, (text, finish, stop) in sorted(results.items()):
        await turn.pause()
        prompt = prompts[i]
        message, finish = prompt.plan.message(text, finish)
        message["role"] = conversations[i].answer_role(state.response_role)
        echo = conversations[i].echo_text(state.response_role)
        if echo:
            message["content"] = echo + (message.get("content") or "")
        rows = _all_rows(gen, i)
        choice: dict[str, Any] = {
            "index": i,
            "message": message,
            "logprobs": None
            if lp.logprobs is None
            else {
                "content": chat_content(rows or LogprobsLists(), lp.logprobs, names, lp.token_ids is not None)
            },
            "finish_reason": finish,
            "stop_reason": stop,
        }
        if return_ids:  # vLLM's choice token_ids; the prompt's ids per choice (one prompt each)
            choice["token_ids"] = gen.choices[i].token_ids
            choice["prompt_token_ids"] = prompt.prompt_ids
        if body.return_prompt_text:
            choice["prompt_text"] = prompt.prompt_text
        choices.append(choice)
    return await full_response(request_id, "chat.completion", created, state.model_name, choices, gen)


def _in_conversation(error: ApiError, index: int) -> ApiError:
    """A batch conversation's error naming the conversation: an error about its messages (the
    template refused them, the prompt is too long) names ``messages[index]`` as its ``param`` and
    in its message, and one that blames the output length (which the conversation's prompt
    leaves no room for) says which conversation; errors about other fields are those of every
    conversation, and unchanged."""
    where = f"messages[{index}]"
    param = error.param
    if param == "messages":
        param = where
    elif param not in (where, "max_tokens", "max_completion_tokens"):
        return error
    message = error.message
    if error.param == "messages" and re.match(r"messages\[\d+\]", message):
        message = where + message[len("messages") :]  # one of its messages: messages[i][j]
    elif where in message:
        pass
    elif message.startswith("messages"):  # "messages: ..." / "messages must ..." of the one conversation
        message = where + message[len("messages") :]
    else:
        message = f"{where}: {message}"
    return ApiError(error.status, message, param=param, code=error.code)


def _has_entries(logprobs: dict[str, Any] | None) -> bool:
    """Whether a streamed choice's ``logprobs`` holds at least one token's entry."""
    return bool(logprobs and logprobs["content"])


def _all_rows(gen: Generation, index: int) -> LogprobsLists | None:
    """Every generated-token row of choice ``index`` (None without logprobs)."""
    tracker = gen.choices[index].logprobs
    return None if tracker is None else tracker.rows
