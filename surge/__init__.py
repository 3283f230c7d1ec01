"""Surge: an LLM serving engine with a paged KV cache and continuous batching."""

from surge.core.outputs import CompletionOutput, RequestOutput
from surge.inputs import TextPrompt, TokensPrompt
from surge.sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "CompletionOutput",
    "RequestOutput",
    "SamplingParams",
    "TextPrompt",
    "TokensPrompt",
    "__version__",
]


def __getattr__(name: str) -> object:
    # Lazy import keeps `import surge` free of torch for the API process and the scheduler tests.
    if name == "LLM":
        from surge.engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'surge' has no attribute {name!r}")
