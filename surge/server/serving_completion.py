"""``POST /v1/completions``: prompts (text or token ids), generation, OpenAI completion responses."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import Response

from surge.server.errors import bad_request
from surge.server.generation import ChoiceDelta, Generation
from surge.server.protocol import CompletionRequest
from surge.server.serving_common import (
    NO_STREAM_INTERVAL,
    ChunkEnvelope,
    ServerState,
    build_sampling_params,
    collect,
    full_response,
    resolve_max_tokens,
    stream_response,
    with_finish,
)


async def _prompts(state: ServerState, body: CompletionRequest) -> list[tuple[list[int], str | None]]:
    """The request's prompts as (token ids, text or None); text is tokenized on the tokenizer thread."""
    p = body.prompt
    if isinstance(p, str):
        items: list[str | list[int]] = [p]
    elif not p:
        raise bad_request("prompt must not be empty", param="prompt")
    elif isinstance(p[0], int):
        items = [p]  # type: ignore[list-item]
    else:
        items = list(p)  # type: ignore[arg-type]
    texts = [item for item in items if isinstance(item, str)]
    encoded = iter(
        await state.tokenizer_worker.encode_many(texts, add_special_tokens=body.add_special_tokens)
        if texts
        else []
    )
    return [(next(encoded), item) if isinstance(item, str) else (list(item), None) for item in items]


async def create_completion(state: ServerState, body: CompletionRequest, request: Request) -> Response:
    """Serve one completion request (one or more prompts, ``n`` choices each), streamed or not.

    Choice ``index`` is ``prompt_index * n + i``.

    Raises:
        ApiError: 400 for a bad request, 404 for an unknown model, 503 when the engine is gone.
        ClientGone: the client disconnected before a non-streamed answer was ready.
    """
    arrival = time.monotonic()
    state.check_model(body.model)
    body.check_unimplemented()
    state.check_stop(body.stop_list)
    prompts = await _prompts(state, body)
    plans = []
    for ids, text in prompts:
        max_tokens = resolve_max_tokens(state, body.requested_max_tokens, len(ids))
        params = build_sampling_params(body, max_tokens)
        state.check_prompt(ids, max_tokens)
        plans.append((ids, text, params))
    state.check_engine()
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    interval = state.stream_interval if body.stream else NO_STREAM_INTERVAL
    gen = Generation(state.client, state.tokenizer, state.metrics, interval, arrival)
    try:
        for j, (ids, text, params) in enumerate(plans):
            gen.add_prompt(request_id if len(plans) == 1 else f"{request_id}-p{j}", ids, params, text)
    except Exception:
        gen.abort()
        raise
    model = state.model_name

    def echo_text(prompt_index: int) -> str:
        info = gen.prompts[prompt_index]
        if info.text is not None:
            return info.text
        return state.tokenizer.decode(info.token_ids, skip_special_tokens=True)

    if not body.stream:
        results = await collect(request, gen)
        choices = []
        for i, (text, finish, stop) in sorted(results.items()):
            if body.echo:
                text = echo_text(gen.choices[i].prompt_index) + text
            choices.append(
                {"index": i, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": stop}
            )
        return full_response(request_id, "text_completion", created, model, choices, gen)

    env = ChunkEnvelope(request_id, "text_completion", created, model)

    def make_chunks(deltas: list[ChoiceDelta]) -> list[bytes]:
        chunks = []
        for d in deltas:
            text = echo_text(d.prompt_index) + d.text if (body.echo and d.first) else d.text
            chunks.append(env.chunk([with_finish({"index": d.index, "text": text}, d)]))
        return chunks

    usage = (lambda: env.usage_chunk(gen)) if body.include_usage else None
    return await stream_response(request, gen, make_chunks, usage, state.sse_queued_interval)
