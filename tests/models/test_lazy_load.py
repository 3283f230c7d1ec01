"""Tensor-parallel loading reads shards lazily and gives each rank the same weights as a full read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.config import ModelConfig
from surge.model.lazy_tensor import LazyTensor
from surge.model.loader import iter_weights, load_weights
from surge.model.registry import get_model_class
from tests.engine.tiny_models import make_tiny_model


def test_lazy_shards_equal_full_reads(tmp_path: Path) -> None:
    folder = make_tiny_model("qwen2", tmp_path / "m")
    cfg = ModelConfig.from_pretrained(folder)
    cls = get_model_class(cfg.architecture)
    for rank in range(2):
        full, lazy = cls(cfg, tp_rank=rank, tp_size=2), cls(cfg, tp_rank=rank, tp_size=2)
        load_weights(full, iter_weights(folder))
        load_weights(lazy, iter_weights(folder, lazy=True))
        for (name, a), (_, b) in zip(full.named_parameters(), lazy.named_parameters(), strict=True):
            assert torch.equal(a, b), name


def test_lazy_tensor_reads_only_what_is_indexed(tmp_path: Path) -> None:
    folder = make_tiny_model("qwen3", tmp_path / "m")
    name, lazy = next((n, t) for n, t in iter_weights(folder, lazy=True) if n.endswith("o_proj.weight"))
    full = dict(iter_weights(folder))[name]
    assert isinstance(lazy, LazyTensor) and lazy.shape == full.shape and lazy.dim() == 2
    assert torch.equal(lazy.narrow(1, 16, 16), full.narrow(1, 16, 16))
    assert torch.equal(lazy[2:5], full[2:5])
    out = torch.zeros_like(full)
    out.copy_(lazy)  # whole-tensor use reads it all
    assert torch.equal(out, full)
    assert torch.equal(lazy.float(), full)


def test_fp8_weights_are_read_lazily_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The FP8 weight loader checks the stored dtype from the header, without reading the whole
    tensor on every rank (``.dtype`` fell through to ``materialize()``)."""
    from surge.model.loader import load_model
    from tests.quant.helpers import fp8_checkpoint

    src = make_tiny_model("qwen3", tmp_path / "src")
    fp8_checkpoint(src, tmp_path / "fp8", (16, 16))  # whole blocks in each rank's k/v shard
    read: list[tuple[int, ...]] = []
    original = LazyTensor.materialize

    def counted(self: LazyTensor) -> torch.Tensor:
        out = original(self)
        if out.dtype == torch.float8_e4m3fn:
            read.append(tuple(out.shape))
        return out

    monkeypatch.setattr(LazyTensor, "materialize", counted)
    model = load_model(ModelConfig.from_pretrained(tmp_path / "fp8"), "cpu", tp_rank=0, tp_size=2)
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    assert read == []  # no FP8 weight read whole
