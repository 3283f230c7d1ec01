"""Builders of tiny random Qwen3, Qwen2 and Llama (llama3 rope) folders for engine tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from tests.conftest import STORIES

_COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.15,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="float32",
)


def make_tiny_model(kind: str, path: Path, seed: int = 0, **overrides: object) -> Path:
    """Save a tiny random model of ``kind`` ("qwen3", "qwen2", "llama3") with the stories tokenizer;
    ``overrides`` replace fields of its config (e.g. ``hidden_size``)."""
    from transformers import (
        AutoModelForCausalLM,
        LlamaConfig,
        Qwen2Config,
        Qwen3Config,
    )

    common = {**_COMMON, **overrides}
    if kind == "qwen3":
        config = Qwen3Config(**{"head_dim": 16, "tie_word_embeddings": False, **common})
    elif kind == "qwen2":
        config = Qwen2Config(**{"tie_word_embeddings": True, **common})
    elif kind == "llama3":
        llama3 = {
            "tie_word_embeddings": False,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        }
        config = LlamaConfig(**{**llama3, **common})
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(STORIES / name, path / name)
    return path


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation with transformers, full recompute each step (fp32, CPU, no EOS stop)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    results = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(max_new_tokens):
                logits = model(torch.tensor([ids])).logits[0, -1]
                ids.append(int(logits.argmax()))
            results.append(ids[len(prompt) :])
    return results


def hf_logprobs(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """``[len(ids), V]`` float32: log-softmax of the Hugging Face model ``hf``'s logits at every
    position of the sequence ``ids`` (one forward pass, no gradients)."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
