"""``POST /v1/completions``: prompts (text or token ids), generation, OpenAI completion responses."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from surge.core.logprobs import LogprobsLists
from surge.core.reasoning_gate import wait_for_reasoning_end
from surge.sampling_params import SamplingParams
from surge.server.errors import bad_request
from surge.server.generation import ChoiceDelta
from surge.server.logprobs import (
    CompletionLogprobs,
    LogprobOptions,
    completion_options,
    vllm_prompt_logprobs,
    with_first_prompt_token,
)
from surge.server.protocol import CompletionRequest
from surge.server.serving_common import (
    ChunkEnvelope,
    Cooperative,
    ServerState,
    build_sampling_params,
    collect,
    full_response,
    log_request_start,
    resolve_max_tokens,
    start_generation,
    stream_response,
    truncate_prompt,
    usage_in_chunks,
    with_finish,
)
from surge.server.structured_request import grammar_param, structured_outputs_of
from surge.server.token_rules import token_rules_of


async def _prompts(
    state: ServerState, body: CompletionRequest
) -> list[tuple[list[int], str | None, str | None]]:
    """The request's prompts as (token ids after ``truncate_prompt_tokens``, text when whole or
    None, text as given or None for token ids); text is tokenized by the
    :class:`surge.server.tokenization.TokenizerWorker` on its threads."""
    p = body.prompt
    if p == "":
        # vLLM 0.26's CompletionRequest check (only the bare empty string: a list's "" is
        # tokenized, a BOS then makes a prompt of one token, as in vLLM)
        raise bad_request("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if isinstance(p, str):
        items: list[str | list[int]] = [p]
    elif not p:
        raise bad_request("prompt must not be empty", param="prompt")
    elif isinstance(p[0], int):
        items = [p]  # type: ignore[list-item]
    else:
        items = list(p)  # type: ignore[arg-type]
    choices = len(items) * body.n
    if choices > state.max_choices_per_request:
        raise bad_request(
            f"the request asks for {choices} choices ({len(items)} prompts x n={body.n}); at most "
            f"{state.max_choices_per_request} are allowed (--max-choices-per-request).",
            param="prompt" if len(items) > 1 else "n",
        )
    add_special = body.add_special_tokens is not False
    texts = [item for item in items if isinstance(item, str)]
    # A prompt truncated to its last tokens may be longer than the context: no cheap bound then.
    param = "prompt" if body.truncate_prompt_tokens is None else None
    encoded = iter(
        await state.tokenizer_worker.encode_many(texts, add_special_tokens=add_special, param=param)
        if texts
        else []
    )
    out: list[tuple[list[int], str | None, str | None]] = []
    for item in items:
        if isinstance(item, str):
            ids = next(encoded)
            kept = truncate_prompt(state, ids, body)
            out.append((kept, item if len(kept) == len(ids) else None, item))
        else:
            ids = truncate_prompt(state, list(item), body)
            out.append((ids, None, None))
    return out


@dataclass(frozen=True)
class CompletionPrompt:
    """One prompt of a completion request, checked and tokenized (:func:`prepare_completion`).

    Attributes:
        token_ids: its token ids (after ``truncate_prompt_tokens``).
        text: its text when it was given as text and kept whole, else None.
        source: its text as given, or None for token ids.
        params: the engine's sampling parameters.
    """

    token_ids: list[int]
    text: str | None
    source: str | None
    params: SamplingParams


@dataclass(frozen=True)
class PreparedCompletion:
    """A completion request checked and its prompts tokenized (:func:`prepare_completion`).

    Attributes:
        prompts: the prompts in order.
        grammar: the field that carried the request's grammar, or None.
        score_only: ``echo`` with ``max_tokens`` 0 (the prompt is scored, nothing sampled).
        lp: the request's logprob options.
    """

    prompts: list[CompletionPrompt]
    grammar: str | None
    score_only: bool
    lp: LogprobOptions


async def prepare_completion(
    state: ServerState, body: CompletionRequest, *, render: bool
) -> PreparedCompletion:
    """Check a completion request and tokenize its prompts as the engine would get them: what
    ``/v1/completions`` and ``/v1/completions/render`` (``render`` true: the render-only fields
    are allowed) share.

    Raises:
        ApiError: 400 for a bad request (``param`` names the field), 404 for an unknown model.
    """
    state.check_model(body.model)
    body.check_unimplemented()
    body.check_usage_options(state.force_include_usage)
    if not render:
        body.refuse_render_only()
    state.check_priority(body.priority)
    state.check_thinking_budget(body.thinking_token_budget)
    state.check_stop(body.stop_list)
    lp = completion_options(body, state.vocab_size)
    # echo with max_tokens 0 scores the prompt: the engine computes it and samples nothing, so
    # a prompt of max_model_len tokens fits (vLLM's rule: prompt + max_tokens <= max_model_len).
    score_only = body.echo and body.max_tokens == 0
    if score_only and body.min_tokens:
        raise bad_request(
            f"min_tokens ({body.min_tokens}) must not exceed max_tokens (0: echo scores the prompt only)",
            param="min_tokens",
        )
    prompts = await _prompts(state, body)
    plans = []
    # on a tokenizer thread, once for all prompts: a grammar's check may take xgrammar a while,
    # and bad_words are tokenized
    structured, field = await state.tokenizer_worker.run(structured_outputs_of, body)
    rules = await state.tokenizer_worker.run(token_rules_of, body, state.tokenizer, state.vocab_size)
    listed = not isinstance(body.prompt, str) and not isinstance(body.prompt[0], int)  # a list of prompts
    for j, (ids, text, source) in enumerate(prompts):
        max_tokens = 0 if score_only else resolve_max_tokens(state, body, len(ids))
        params = build_sampling_params(
            body, state.capped_max_tokens(max_tokens), structured, token_rules=rules
        )
        # with --reasoning-parser the grammar waits for </think> unless the prompt closed the
        # reasoning, as vLLM's engine decides for a completion (and Surge's offline LLM)
        params = wait_for_reasoning_end(params, state.reasoning_tokens, ids)
        state.check_thinking_budget_grammar(params, ids)
        params = lp.engine_params(params)
        state.check_prompt(
            ids,
            max_tokens,
            prompt_param="prompt",
            max_tokens_sent=body.max_tokens_sent,
            prompt_name=f"prompt[{j}]" if listed else None,
        )
        plans.append(CompletionPrompt(ids, text, source, params))
    grammar = None if structured is None or field is None else grammar_param(structured, field)
    return PreparedCompletion(plans, grammar, score_only, lp)


async def create_completion(state: ServerState, body: CompletionRequest, request: Request) -> Response:
    """Serve one completion request (one or more prompts, ``n`` choices each), streamed or not.

    Choice ``index`` is ``prompt_index * n + i``.

    Raises:
        ApiError: 400 for a bad request, 404 for an unknown model, 503 when the engine is gone.
        ClientGone: the client disconnected before a non-streamed answer was ready.
    """
    arrival = time.monotonic()
    prepared = await prepare_completion(state, body, render=False)
    plans, score_only, lp = prepared.prompts, prepared.score_only, prepared.lp
    state.check_engine()
    request_id, gen = start_generation(state, request, body, "cmpl", arrival, grammar_param=prepared.grammar)
    created = int(time.time())
    try:
        for j, p in enumerate(plans):
            prompt_id = request_id if len(plans) == 1 else f"{request_id}-p{j}"
            log_request_start(state, prompt_id, p.params, p.token_ids)
            gen.add_prompt(
                prompt_id, p.token_ids, p.params, p.text, score_only, share_prompt_logprobs=not body.stream
            )
    except Exception:
        gen.abort()
        raise
    model = state.model_name

    def echo_text(prompt_index: int) -> str:
        """The echoed prompt: its text as given; a prompt of token ids decoded with its special
        tokens (vLLM's ``tokenizer.decode(ids)``: ``<|im_start|>``, a BOS ``<s>``); a text prompt
        that ``truncate_prompt_tokens`` cut, the kept tokens' text."""
        info = gen.prompts[prompt_index]
        if info.text is not None:
            return info.text
        token_prompt = plans[prompt_index].source is None
        return state.tokenizer.decode(info.token_ids, skip_special_tokens=not token_prompt)

    strings = state.token_strings
    names = state.logprob_tokens(body)
    return_ids = bool(body.return_token_ids)
    offsets: dict[int, CompletionLogprobs] = {}

    def logprobs_of(index: int, rows: LogprobsLists | None, first: bool) -> dict[str, Any] | None:
        """The choice's ``logprobs`` for ``rows`` (the echoed prompt's first, on its first part)."""
        if lp.logprobs is None:
            return None
        builder = offsets.setdefault(index, CompletionLogprobs(lp.logprobs, names))
        parts = []
        if first and body.echo:
            choice = gen.choices[index]
            prompt_ids = gen.prompts[choice.prompt_index].token_ids
            parts.append(builder.build(with_first_prompt_token(prompt_ids, choice.prompt_logprobs), True))
        parts.append(builder.build(rows or LogprobsLists()))
        return CompletionLogprobs.join(parts)

    prompt_logprobs_built: dict[int, list[dict[str, Any] | None]] = {}

    def prompt_logprobs_of(index: int) -> dict[str, Any]:
        """The choice's ``prompt_logprobs``, built once per prompt: its ``n`` choices share
        them (they are equal across choices)."""
        if lp.prompt_logprobs is None:
            return {}
        prompt_index = gen.choices[index].prompt_index
        built = prompt_logprobs_built.get(prompt_index)
        if built is None:
            rows = gen.choices[index].prompt_logprobs
            built = prompt_logprobs_built[prompt_index] = vllm_prompt_logprobs(
                rows, lp.prompt_logprobs, strings
            )
        return {"prompt_logprobs": built}

    def token_ids_of(index: int, token_ids: list[int] | None, first: bool) -> dict[str, Any]:
        """vLLM's ``return_token_ids`` fields of a choice: its prompt's ids (on its first
        chunk) and ``token_ids``, the generated ids (streamed: those since its last chunk; an
        echoed prompt's ids are in ``prompt_token_ids`` only)."""
        if not return_ids:
            return {}
        fields: dict[str, Any] = {}
        if first:
            fields["prompt_token_ids"] = gen.prompts[gen.choices[index].prompt_index].token_ids
        fields["token_ids"] = token_ids
        return fields

    if not body.stream:
        results = await collect(request, gen)
        choices = []
        turn = Cooperative()
        for i, (text, finish, stop) in sorted(results.items()):
            await turn.pause()
            if body.echo:
                text = echo_text(gen.choices[i].prompt_index) + text
            tracker = gen.choices[i].logprobs
            choices.append(
                {
                    "index": i,
                    "text": text,
                    "logprobs": logprobs_of(i, None if tracker is None else tracker.rows, True),
                    "finish_reason": finish,
                    "stop_reason": stop,
                }
                | prompt_logprobs_of(i)
                | token_ids_of(i, gen.choices[i].token_ids, True)
            )
        return await full_response(request_id, "text_completion", created, model, choices, gen)

    env = ChunkEnvelope(
        request_id, "text_completion", created, model, gen, usage_in_chunks(body, state.force_include_usage)
    )

    def make_chunks(deltas: list[ChoiceDelta]) -> list[bytes]:
        chunks = []
        for d in deltas:
            text = echo_text(d.prompt_index) + d.text if (body.echo and d.first) else d.text
            choice = with_finish({"index": d.index, "text": text}, d)
            choice["logprobs"] = logprobs_of(d.index, d.logprobs, d.first)
            choice |= token_ids_of(d.index, d.token_ids, d.first)
            chunks.append(env.chunk([choice]))
        return chunks

    usage = (lambda: env.usage_chunk(gen)) if env.usage_in_chunks != "omit" else None
    return await stream_response(request, gen, make_chunks, usage, state.sse_queued_interval)
