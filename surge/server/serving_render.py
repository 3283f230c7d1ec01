"""``POST /v1/chat/completions/render`` and ``POST /v1/completions/render`` (vLLM's render API).

Each takes the body of its generation endpoint, checks it and renders its prompt exactly as that
endpoint would (chat template, tools, ``chat_template_kwargs``, ``add_generation_prompt``,
``continue_final_message``, ``add_special_tokens``, ``truncate_prompt_tokens``,
``truncation_side``), and answers what vLLM's render answers: vLLM's ``GenerateRequest``, the
request as its token-in endpoint would take it, with the prompt's ``token_ids`` and the resolved
``sampling_params`` (one object for chat, a list of one per prompt for completions). Nothing
reaches the engine, so these work while it is busy or down. Tokenization and templating run on
the :class:`surge.server.tokenization.TokenizerWorker`'s threads, never on the event loop.

On request:

- ``return_token_offsets``: ``token_offsets``, the ``[start, end)`` character offsets of each
  token in the text that was tokenized (for chat, the templated prompt), from a fast
  tokenizer's offset mapping; null for a slow tokenizer and for a prompt given as token ids;
- ``return_assistant_tokens_mask`` (chat): ``assistant_tokens_mask``, one 0/1 per token, 1 for the
  tokens that overlap the text a ``{% generation %}`` block of the chat template wrote
  (transformers' rule); null when the template has no such block, under
  ``continue_final_message`` (transformers refuses the two together) or with a slow tokenizer;
- ``return_prompt_text`` (chat): ``prompt_text``, the templated prompt's text (not in vLLM's
  answer, which ignores the field here).

Both lists are cut by ``truncate_prompt_tokens`` exactly as the token ids are.
"""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response
from transformers import PreTrainedTokenizerBase

from surge.sampling_params import SamplingParams, truncated_prompt
from surge.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequestFields
from surge.server.request_id import request_id_of
from surge.server.serving_chat import prepare_chat
from surge.server.serving_common import ServerState
from surge.server.serving_completion import prepare_completion
from surge.tokenizer import chat_adds_special_tokens

_INTERNAL_PARAMS = ("output_kind", "skip_clone", "model_default_fields", "bad_words_token_ids")
"""Fields of Surge's :class:`SamplingParams` that are bookkeeping, not sampling settings."""


def token_offsets(
    tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool
) -> tuple[list[int], list[tuple[int, int]]] | None:
    """The token ids of ``text`` and each token's ``(start, end)`` character offsets in it (a
    special token the tokenizer adds has ``(0, 0)``), or None for a tokenizer without an offset
    mapping (a slow one)."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    return list(enc["input_ids"]), [(int(s), int(e)) for s, e in enc["offset_mapping"]]


def assistant_tokens_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose characters overlap one of ``spans`` (in order, as ``offsets``),
    else 0: transformers' ``assistant_masks`` rule, so a span cut by truncation keeps the
    tokens that remain."""
    mask = [0] * len(offsets)
    i = 0
    for t, (start, end) in enumerate(offsets):
        while i < len(spans) and start >= spans[i][1]:
            i += 1
        if i == len(spans):
            break
        if end > spans[i][0]:
            mask[t] = 1
    return mask


def _generate_request(
    state: ServerState,
    body: SamplingRequestFields,
    request_id: str,
    token_ids: list[int],
    params: SamplingParams,
    offsets: list[tuple[int, int]] | None,
    mask: list[int] | None,
) -> dict[str, Any]:
    """vLLM's ``GenerateRequest`` fields, in its order. ``sampling_params`` are the engine's,
    the model's ``generation_config.json`` defaults applied where the request left a field out."""
    sampling = msgspec.to_builtins(params.with_model_defaults(state.sampling_defaults))
    for name in _INTERNAL_PARAMS:
        sampling.pop(name, None)
    stream = bool(body.stream)
    return {
        "request_id": request_id,
        "token_ids": token_ids,
        "assistant_tokens_mask": mask,
        "token_offsets": offsets,
        "features": None,
        "sampling_params": sampling,
        "model": body.model,
        "stream": stream,
        "stream_options": body.stream_options.model_dump() if stream and body.stream_options else None,
        "cache_salt": body.cache_salt,
        "priority": body.priority,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }


def _cut(state: ServerState, body: SamplingRequestFields, items: list[Any]) -> list[Any]:
    """``items`` (one per token of the whole prompt) cut as ``truncate_prompt_tokens`` cuts the ids."""
    return truncated_prompt(
        items,
        body.truncate_prompt_tokens,
        state.max_model_len,
        body.truncation_side or "left",
        body.requested_max_tokens,
    )


async def render_chat_completion(
    state: ServerState, body: ChatCompletionRequest, request: Request
) -> Response:
    """``POST /v1/chat/completions/render``: the chat request rendered, as vLLM's
    ``GenerateRequest`` (see the module docstring).

    Raises:
        ApiError: 400 for a bad request (as the chat endpoint's), 404 for an unknown model.
    """
    found: list[list[tuple[int, int]]] = []
    want_mask = body.return_assistant_tokens_mask
    prompt = await prepare_chat(
        state, body, render=True, on_generation_spans=found.append if want_mask else None
    )
    offsets: list[tuple[int, int]] | None = None
    mask: list[int] | None = None
    if body.return_token_offsets or (want_mask and found):
        template = body.chat_template if body.chat_template is not None else state.chat_template
        if template is None:
            template = state.tokenizer.chat_template
        add_special = chat_adds_special_tokens(template, body.add_special_tokens)
        encoded = await state.tokenizer_worker.run(
            token_offsets, state.tokenizer, prompt.prompt_text, add_special, utility=True
        )
        if encoded is not None and _cut(state, body, encoded[0]) == prompt.prompt_ids:
            whole = encoded[1]
            if body.return_token_offsets:
                offsets = _cut(state, body, whole)
            if want_mask and found:
                mask = _cut(state, body, assistant_tokens_mask(whole, found[0]))
    request_id = f"chatcmpl-{request_id_of(request, body.request_id)}"
    out = _generate_request(state, body, request_id, prompt.prompt_ids, prompt.params, offsets, mask)
    if body.return_prompt_text:
        out["prompt_text"] = prompt.prompt_text
    return Response(msgspec.json.encode(out), media_type="application/json")


async def render_completion(state: ServerState, body: CompletionRequest, request: Request) -> Response:
    """``POST /v1/completions/render``: one vLLM ``GenerateRequest`` per prompt (see the module
    docstring), in the prompts' order; their ids are the completion's (``cmpl-<id>``, and
    ``cmpl-<id>-p<j>`` for prompt ``j`` of several).

    Raises:
        ApiError: 400 for a bad request (as the completions endpoint's), 404 for an unknown model.
    """
    prepared = await prepare_completion(state, body, render=True)
    base = f"cmpl-{request_id_of(request, body.request_id)}"
    add_special = body.add_special_tokens is not False
    out = []
    for j, p in enumerate(prepared.prompts):
        offsets: list[tuple[int, int]] | None = None
        if body.return_token_offsets and p.source is not None:  # token-id prompts have no text
            encoded = await state.tokenizer_worker.run(
                token_offsets, state.tokenizer, p.source, add_special, utility=True
            )
            if encoded is not None and _cut(state, body, encoded[0]) == p.token_ids:
                offsets = _cut(state, body, encoded[1])
        request_id = base if len(prepared.prompts) == 1 else f"{base}-p{j}"
        out.append(_generate_request(state, body, request_id, p.token_ids, p.params, offsets, None))
    return Response(msgspec.json.encode(out), media_type="application/json")
