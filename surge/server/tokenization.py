"""Tokenization, chat templating and detokenization of whole requests, on worker threads.

The API process's event loop streams every client's tokens; a 10 MB prompt tokenized on it
would freeze them all for seconds, and even a short prompt's template and tokenization hold it
while a burst's other requests wait to be parsed and earlier requests' first tokens wait to be
forwarded. :class:`TokenizerWorker` runs that work on worker threads (Hugging Face fast
tokenizers release the GIL while they encode; a Jinja template does not, but Python switches
threads every few milliseconds, so the loop keeps running either way).

Every prompt takes a thread, however short. Session 15 had kept prompts of up to 2,048
characters on the loop, which measured better in a CPU burst of 64; on the H200 (Qwen3-8B,
FP8 weights, same lease, fresh servers) sending them to the threads instead lowered the mean
TTFT of every C16 and C64 burst with 32-token prompts, by 8-41 % (C64/I32/O256: 137.6 -> 95.5
ms, four runs each), and left the 256-token-prompt bursts within their spread
(``benchmarks/results/h200-qwen3-8b-fp8/session17/``).

Two pools, so that no client's work queues behind another's unbounded work: prompts of
generation requests (bounded by the context, see below) on ``_GENERATION_THREADS`` threads, and
``/tokenize`` / ``/detokenize`` and the prompts of requests with ``truncate_prompt_tokens``
(any text under the body limit: they are cut to their last tokens only once tokenized) on their
own thread. The
tokenizer is shared by the threads: Surge never changes its truncation or padding, so its Rust
core is only read.

Before tokenizing a long text, a cheap bound rejects a prompt that cannot fit the context: the
text's first ``_BOUND_CHARS_PER_TOKEN * max_model_len`` characters are tokenized, and if they
alone are more than ``max_model_len`` tokens the whole text is too (a prefix never has
meaningfully more tokens than the text; ``_BOUND_MARGIN`` covers the one word the cut splits).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from transformers import PreTrainedTokenizerBase

from surge.chat_content_format import check_content_format
from surge.parallel_encode import encode_text, split_safe
from surge.server.errors import bad_request
from surge.tokenizer import apply_chat_template

T = TypeVar("T")

_BOUND_CHARS_PER_TOKEN = 8
"""Characters per token in the prefix tokenized by the cheap length bound."""
_BOUND_MARGIN = 16
"""Tokens a prefix may have beyond the whole text's count (the word split by the cut)."""
_GENERATION_THREADS = 2
"""Threads tokenizing and templating the prompts of generation requests."""


class TokenizerWorker:
    """Runs a tokenizer's whole-request work on worker threads (see the module docstring).

    Args:
        tokenizer: the model's tokenizer.
        max_model_len: the context length in tokens (for the cheap bound).
        chat_template: a template overriding the tokenizer's, or None.
        content_format: how message content reaches the chat templates, the server's
            ``--chat-template-content-format``: ``auto`` (each template's own, the server's or a
            request's), ``string`` or ``openai`` (:mod:`surge.chat_content_format`).

    Raises:
        ValueError: an unknown ``content_format``.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        max_model_len: int,
        chat_template: str | None,
        content_format: str = "auto",
    ) -> None:
        check_content_format(content_format)
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.chat_template = chat_template
        self.content_format = content_format
        # long texts are encoded in pieces, short ones by the Rust tokenizer directly (surge.parallel_encode)
        self.splittable = split_safe(tokenizer)
        self._pool = ThreadPoolExecutor(max_workers=_GENERATION_THREADS, thread_name_prefix="surge-tokenizer")
        self._utility_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="surge-tokenize-route")

    async def run(self, fn: Callable[..., T], *args: Any, utility: bool = False) -> T:
        """``fn(*args)`` on a worker thread (the ``/tokenize`` thread when ``utility``); its
        exceptions propagate."""
        pool = self._utility_pool if utility else self._pool
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def close(self) -> None:
        """Stop the worker threads (pending work is dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._utility_pool.shutdown(wait=False, cancel_futures=True)

    def _check_bound(self, text: str, param: str) -> None:
        limit = self.max_model_len
        cut = _BOUND_CHARS_PER_TOKEN * (limit + _BOUND_MARGIN)
        if len(text) <= cut:
            return
        n = len(encode_text(self.tokenizer, text[:cut], False, splittable=self.splittable))
        if n > limit + _BOUND_MARGIN:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens, but the prompt has more "
                f"than {n - _BOUND_MARGIN} tokens (its first {cut} of {len(text)} characters alone).",
                param=param,
            )

    def _encode(self, text: str, add_special_tokens: bool, param: str | None) -> list[int]:
        if param is not None:
            self._check_bound(text, param)
        return encode_text(self.tokenizer, text, add_special_tokens, splittable=self.splittable)

    def _encode_many(
        self, texts: Sequence[str], add_special_tokens: bool, param: str | None
    ) -> list[list[int]]:
        return [self._encode(t, add_special_tokens, param) for t in texts]

    def _render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        chat_template_kwargs: dict[str, Any] | None,
        chat_template: str | None,
        continue_final_message: bool,
        add_special_tokens: bool | None,
        bound: bool,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        on_generation_spans: Callable[[list[tuple[int, int]]], None] | None = None,
    ) -> tuple[list[int], str]:
        rendered: list[str] = []

        def check(text: str) -> None:
            rendered.append(text)
            if bound:
                self._check_bound(text, "messages")

        try:
            ids = apply_chat_template(
                self.tokenizer,
                messages,
                add_generation_prompt=add_generation_prompt,
                chat_template=chat_template if chat_template is not None else self.chat_template,
                chat_template_kwargs=chat_template_kwargs,
                continue_final_message=continue_final_message,
                add_special_tokens=add_special_tokens,
                check_text=check,
                tools=tools,
                splittable=self.splittable,
                documents=documents,
                on_generation_spans=on_generation_spans,
                content_format=self.content_format,
            )
        except ValueError as e:
            raise bad_request(str(e), param="messages") from e
        return ids, rendered[0]

    async def encode(
        self, text: str, *, add_special_tokens: bool = True, param: str | None = "prompt"
    ) -> list[int]:
        """Token ids of ``text``.

        Args:
            text: the text.
            add_special_tokens: add the tokenizer's special tokens (e.g. BOS).
            param: the request field holding ``text``, for the cheap context bound; None skips
                the bound and runs on the ``/tokenize`` thread (it counts texts of any length).

        Raises:
            ApiError: 400 naming ``param`` when the text is surely longer than the context.
        """
        return await self.run(self._encode, text, add_special_tokens, param, utility=param is None)

    async def encode_many(
        self, texts: Sequence[str], *, add_special_tokens: bool = True, param: str | None = "prompt"
    ) -> list[list[int]]:
        """Token ids of each text (one trip to a worker thread).

        Args:
            param: as for :meth:`encode`: the request field, for the cheap context bound; None
                skips the bound and runs on the ``/tokenize`` thread (a prompt that is truncated
                to its last tokens after tokenizing, ``truncate_prompt_tokens``, may be longer
                than the context, so it is unbounded work).

        Raises:
            ApiError: 400 naming ``param`` when a text is surely longer than the context.
        """
        return await self.run(
            self._encode_many, list(texts), add_special_tokens, param, utility=param is None
        )

    async def render_chat(
        self,
        messages: list[dict[str, Any]],
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
        """Token ids and text of chat ``messages`` (plain dicts) under the request's ``chat_template``,
        else the server's (with ``tools``, OpenAI function definitions, when given; see
        :func:`surge.tokenizer.apply_chat_template` for the options).

        Args:
            messages, add_generation_prompt, chat_template_kwargs: as for
                :func:`surge.tokenizer.apply_chat_template`.
            bound: apply the cheap context bound; False runs on the ``/tokenize`` thread.
            chat_template, continue_final_message, add_special_tokens, documents: the request's
                options.
            on_generation_spans: called on the worker thread with the text's assistant spans
                when the template marks them (:func:`surge.tokenizer.apply_chat_template`).

        Raises:
            ApiError: 400 naming ``messages`` when the template cannot render them or the
                rendered prompt is surely longer than the context.
        """
        args = (
            messages,
            add_generation_prompt,
            chat_template_kwargs,
            chat_template,
            continue_final_message,
            add_special_tokens,
            bound,
            tools,
            documents,
            on_generation_spans,
        )
        return await self.run(self._render_chat, *args, utility=not bound)

    async def token_strings(self, token_ids: list[int]) -> list[str]:
        """Each id's string in the tokenizer's vocabulary, as ``convert_ids_to_tokens`` gives it
        (byte-level BPE's ``"Ġword"``, SentencePiece's ``"▁word"``; vLLM's ``/tokenize``
        ``token_strs``), on the ``/tokenize`` thread. ``token_ids`` are the tokenizer's own
        output, so every id has a string."""
        return await self.run(self.tokenizer.convert_ids_to_tokens, token_ids, utility=True)

    async def decode(self, token_ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``token_ids`` (on the ``/tokenize`` thread)."""
        return await self.run(self.tokenizer.decode, token_ids, skip_special_tokens, utility=True)
