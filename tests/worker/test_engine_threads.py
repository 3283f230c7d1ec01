"""The torch threads of a process that runs the model: ``cpu_threads`` on CPU, one on a GPU
(an OpenMP pool left spinning there takes the cores of the API process and the grammar fill)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.layers.torch_attention import TorchAttentionBackend
from surge.worker.model_runner import ModelRunner, engine_torch_threads
from tests.worker.helpers import tiny_long_qwen3


def _config(path: Path, cpu_threads: int) -> EngineConfig:
    mc = ModelConfig.from_pretrained(path, dtype="float32", load_format="dummy", max_model_len=512)
    return EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_kv_blocks=16),
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=512),
        device="cpu",
        enforce_eager=True,
        cpu_threads=cpu_threads,
    )


def test_one_torch_thread_on_a_gpu_cpu_threads_on_cpu(tmp_path: Path) -> None:
    cfg = _config(tiny_long_qwen3(tmp_path), 3)
    assert engine_torch_threads(cfg) == 3
    on_gpu = dataclasses.replace(cfg, device="cuda")
    assert engine_torch_threads(on_gpu) == 1
    assert engine_torch_threads(dataclasses.replace(on_gpu, device="cuda:1", cpu_threads=8)) == 1


def test_the_runner_sets_them_once_the_model_is_loaded(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ModelRunner(_config(tiny_long_qwen3(tmp_path), 2), TorchAttentionBackend())
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
