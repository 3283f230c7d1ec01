"""vLLM's prompt dicts for the offline API (``vllm.inputs``' ``TextPrompt`` and ``TokensPrompt``).

Typed dicts: ``TokensPrompt(prompt_token_ids=[...])`` is the plain dict
``{"prompt_token_ids": [...]}``, which :meth:`surge.LLM.generate` takes as it takes any such dict
(:func:`surge.engine.llm._prompt_of` checks the keys and values). They are here so that a script
written for vLLM imports them (``from surge import TokensPrompt``, or ``from surge.inputs import
...``) and a type checker reads its prompts.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

__all__ = ["TextPrompt", "TokensPrompt"]


class _PromptOptions(TypedDict):
    """Keys both prompt dicts may carry.

    Attributes:
        cache_salt: only prompts with the same salt share prefix-cache blocks (None or ``""``:
            no salt).
        multi_modal_data, mm_processor_kwargs, multi_modal_uuids: vLLM's multimodal inputs:
            taken only absent, None or empty (Surge serves text-only models; anything else is a
            ``ValueError``).
    """

    cache_salt: NotRequired[str | None]
    multi_modal_data: NotRequired[Any]
    mm_processor_kwargs: NotRequired[dict[str, Any] | None]
    multi_modal_uuids: NotRequired[Any]


class TextPrompt(_PromptOptions):
    """A text prompt, tokenized by the model's tokenizer.

    Attributes:
        prompt: the text.
    """

    prompt: str


class TokensPrompt(_PromptOptions):
    """A prompt given as token ids.

    Attributes:
        prompt_token_ids: the ids that run.
        prompt: the ids' text, if known: reported as :attr:`RequestOutput.prompt`, never
            tokenized.
    """

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
