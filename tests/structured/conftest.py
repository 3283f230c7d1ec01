"""Models for structured-output tests: the bundled stories260K (byte-fallback SentencePiece
vocabulary), a tiny random Qwen3 with the stories tokenizer, and a tiny random Qwen3 with the
real Qwen3 tokenizer (byte-level BPE, logits wider than the tokenizer's vocabulary)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import QWEN3_8B_DIR, STORIES
from tests.engine.tiny_models import make_tiny_model


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("tiny-qwen3-structured"))


def make_qwen3_vocab_model(path: Path) -> Path:
    """A 2-layer Qwen3 of hidden size 32 with the real Qwen3 tokenizer and its padded vocabulary
    (151936 logits for 151669 tokens); random ("dummy") weights."""
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(config))
    for f in QWEN3_8B_DIR.iterdir():
        if f.name != "config.json":
            shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="session")
def qwen3_vocab_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_8b_dir: Path) -> Path:
    return make_qwen3_vocab_model(tmp_path_factory.mktemp("qwen3-vocab"))


__all__ = ["STORIES"]
