"""Hugging Face architecture name -> Surge model class, imported lazily.

Imports no torch: :mod:`surge.config` checks a folder's architecture against this table before
torch is imported (the CLI's one-line refusals)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("surge.model.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("surge.model.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("surge.model.qwen3", "Qwen3ForCausalLM"),
}


def supported_architectures() -> tuple[str, ...]:
    """The architecture names Surge can run."""
    return tuple(_MODELS)


def get_model_class(architecture: str) -> type[nn.Module]:
    """The model class of ``architecture`` (e.g. "Qwen3ForCausalLM").

    Raises:
        ValueError: the architecture is not supported.
    """
    if architecture not in _MODELS:
        raise ValueError(f"architecture {architecture!r} is not supported (supported: {', '.join(_MODELS)})")
    module_name, class_name = _MODELS[architecture]
    return getattr(importlib.import_module(module_name), class_name)
