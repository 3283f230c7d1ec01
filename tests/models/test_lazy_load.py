"""Tensor-parallel loading reads shards lazily and gives each rank the same weights as a full read."""

from __future__ import annotations

from pathlib import Path

import torch

from surge.config import ModelConfig
from surge.model.lazy_tensor import LazyTensor
from surge.model.loader import iter_safetensors, load_weights
from surge.model.registry import get_model_class
from tests.engine.tiny_models import make_tiny_model


def test_lazy_shards_equal_full_reads(tmp_path: Path) -> None:
    folder = make_tiny_model("qwen2", tmp_path / "m")
    cfg = ModelConfig.from_pretrained(folder)
    cls = get_model_class(cfg.architecture)
    for rank in range(2):
        full, lazy = cls(cfg, tp_rank=rank, tp_size=2), cls(cfg, tp_rank=rank, tp_size=2)
        load_weights(full, iter_safetensors(folder))
        load_weights(lazy, iter_safetensors(folder, lazy=True))
        for (name, a), (_, b) in zip(full.named_parameters(), lazy.named_parameters(), strict=True):
            assert torch.equal(a, b), name


def test_lazy_tensor_reads_only_what_is_indexed(tmp_path: Path) -> None:
    folder = make_tiny_model("qwen3", tmp_path / "m")
    name, lazy = next((n, t) for n, t in iter_safetensors(folder, lazy=True) if n.endswith("o_proj.weight"))
    full = dict(iter_safetensors(folder))[name]
    assert isinstance(lazy, LazyTensor) and lazy.shape == full.shape and lazy.dim() == 2
    assert torch.equal(lazy.narrow(1, 16, 16), full.narrow(1, 16, 16))
    assert torch.equal(lazy[2:5], full[2:5])
    out = torch.zeros_like(full)
    out.copy_(lazy)  # whole-tensor use reads it all
    assert torch.equal(out, full)
    assert torch.equal(lazy.float(), full)
