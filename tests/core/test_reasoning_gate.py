"""Where a grammar starts under a reasoning parser (``surge/core/reasoning_gate.py``): after
the ``</think>`` token alone. vLLM 0.26's qwen3 reasoner also ends the reasoning at a
``<tool_call>`` token not yet closed by ``</tool_call>``; docs/structured-outputs.md says why
Surge does not follow it (its chat parse then keeps ``<tool_call>`` as the answer's start, so a
forced call's constrained JSON no longer parses)."""

from __future__ import annotations

from surge.core.reasoning_gate import wait_for_reasoning_end
from surge.sampling_params import SamplingParams, StructuredOutputsParams
from surge.server.parsers import reasoning_tokens
from tests.conftest import qwen3_8b_dir_or_skip


def _tokenizer():  # type: ignore[no-untyped-def]
    folder = qwen3_8b_dir_or_skip()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def test_the_gate_is_the_think_end_token_alone() -> None:
    """A prompt that ends inside the reasoning with a ``<tool_call>`` (vLLM: reasoning ended, the
    grammar applies at once) still waits for ``</think>``; one that closed the reasoning does not
    wait; the gate is one token, ``</think>``, never ``<tool_call>``."""
    tok = _tokenizer()
    tokens = reasoning_tokens(tok, "qwen3")
    think_end = tok.convert_tokens_to_ids("</think>")
    tool_call = tok.convert_tokens_to_ids("<tool_call>")
    assert tokens.end == (think_end,) and tool_call not in tokens.end
    params = SamplingParams(
        max_tokens=8, structured_outputs=StructuredOutputsParams(json='{"type": "object"}')
    )
    opened = tok.encode("<|im_start|>assistant\n<think>\nCall f.<tool_call>", add_special_tokens=False)
    assert opened[-1] == tool_call
    gated = wait_for_reasoning_end(params, tokens, opened).structured_outputs
    assert gated is not None and gated.reasoning_end_token_id == think_end
    closed = tok.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)
    assert wait_for_reasoning_end(params, tokens, closed) is params
