"""Greedy tokens through the ModelRunner equal Hugging Face's greedy tokens.

The runner is driven by a minimal scheduler loop (tests/models/helpers.py): requests arrive
at different steps, long prompts are chunked across steps, and decodes share steps with
prefill chunks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.models.helpers import greedy_requests, hf_greedy, load_hf, make_runner, run_loop

STORIES = Path(__file__).resolve().parents[2] / "surge" / "assets" / "stories260K"
LENGTHS = [1, 3, 9, 16, 17, 30, 41, 64]
ARRIVALS = [0, 0, 1, 2, 2, 3, 5, 6]


def _prompts(vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.mark.parametrize("kind", ["qwen3", "qwen2", "llama3", "llama_tied"])
def test_greedy_chunked_and_mixed_matches_hf(kind: str, tiny_models: dict[str, Path]) -> None:
    path = tiny_models[kind]
    hf = load_hf(path)
    max_tokens = 10
    prompts = _prompts(hf.config.vocab_size, seed=7)
    expected = [hf_greedy(hf, p, max_tokens) for p in prompts]
    # A budget of 24 tokens forces the 30-, 41- and 64-token prompts into several chunks
    # and mixes them with running decodes; a second runner takes whole prompts.
    for budget in (24, 256):
        runner = make_runner(path, max_num_batched_tokens=budget)
        got = run_loop(runner, greedy_requests(prompts, max_tokens), budget, ARRIVALS)
        assert got == expected, f"budget {budget}"


def test_stories_matches_golden_greedy() -> None:
    golden = json.loads((STORIES / "golden_greedy.json").read_text())["cases"]
    runner = make_runner(None, max_num_batched_tokens=8, max_num_seqs=8)
    prompts = [c["prompt_ids"] for c in golden]
    got = run_loop(runner, greedy_requests(prompts, 64), 8, [0, 1, 2, 3][: len(prompts)])
    assert got == [c["generated_ids"] for c in golden]
