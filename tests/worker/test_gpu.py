"""Decode CUDA graphs and the Triton backend on a GPU (skipped without CUDA).

Run on a GPU host: ``PYTHONPATH=. python3 -m pytest -p no:cacheprovider -o timeout=0 -m gpu tests/worker``
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest
import torch

from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.layers.torch_attention import TorchAttentionBackend
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.cuda_graph import decode_buckets
from surge.worker.model_runner import ModelRunner
from tests.models.helpers import hf_greedy, load_hf, make_hf_model, run_loop
from tests.worker.helpers import QWEN3_8B, count_replays, drive, randomize, tiny_long_qwen3

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _cuda_runner(
    model_dir: Path,
    dtype: str,
    *,
    eager: bool,
    torch_backend: bool = False,
    max_model_len: int = 2048,
    max_num_seqs: int = 16,
    load_format: str = "auto",
    std: float | None = None,
) -> ModelRunner:
    mc = ModelConfig.from_pretrained(
        model_dir, dtype=dtype, load_format=load_format, max_model_len=max_model_len
    )
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_kv_blocks=1024),
        scheduler=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=1024, max_model_len=max_model_len
        ),
        device="cuda",
        enforce_eager=eager,
    )
    runner = ModelRunner(cfg, TorchAttentionBackend() if torch_backend else None)
    if std is not None:
        randomize(runner, std)
    runner.init_kv_cache(1024)
    return runner


def test_graph_decode_logits_equal_eager_fp32(tmp_path: Path) -> None:
    path = tiny_long_qwen3(tmp_path / "qwen3")
    kwargs = dict(load_format="dummy", std=0.1)
    graph = _cuda_runner(path, "float32", eager=False, **kwargs)  # type: ignore[arg-type]
    eager = _cuda_runner(path, "float32", eager=True, **kwargs)  # type: ignore[arg-type]
    reference = _cuda_runner(path, "float32", eager=True, torch_backend=True, **kwargs)  # type: ignore[arg-type]
    assert graph.graph_runner is not None and eager.graph_runner is None
    assert graph.graph_runner.captured == decode_buckets(16, 1024)
    replays = count_replays(graph)
    prompts = [
        [(7 * j + i) % 512 for j in range(n)] for i, n in enumerate([5, 700, 33, 1, 300, 17, 64, 9, 1200])
    ]

    def close(a: torch.Tensor, b: torch.Tensor) -> None:
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    drive([graph, eager, reference], prompts, [0, 0, 1, 2, 2, 5, 9, 9, 12], 24, close)
    assert {1, 2, 4, 8, 16} & set(replays), replays
    assert len(replays) > 15


@pytest.mark.skipif(not QWEN3_8B.is_dir(), reason="needs ../shared/assets/models/qwen3-8b")
def test_graph_decode_bf16_qwen3_8b_shape_close_to_torch_reference(tmp_path: Path) -> None:
    cfg = json.loads((QWEN3_8B / "config.json").read_text())
    cfg["num_hidden_layers"] = 4
    model_dir = tmp_path / "qwen3-8b-4l"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(cfg))
    kwargs = dict(max_model_len=4096, max_num_seqs=32, load_format="dummy")
    graph = _cuda_runner(model_dir, "bfloat16", eager=False, **kwargs)  # type: ignore[arg-type]
    reference = _cuda_runner(model_dir, "bfloat16", eager=True, torch_backend=True, **kwargs)  # type: ignore[arg-type]
    replays = count_replays(graph)

    def close(a: torch.Tensor, b: torch.Tensor) -> None:
        err = (a - b).abs().max().item()
        scale = b.abs().max().item()
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).min().item()
        assert err <= 0.05 * scale + 1e-3, (err, scale)
        assert cos > 0.995, cos

    prompts = [[(7 * i + j) % 150000 for j in range(n)] for i, n in enumerate([32, 600, 5, 2000, 130, 47])]
    drive([graph, reference], prompts, [0, 0, 1, 1, 3, 6], 16, close)
    assert len(replays) > 8


@pytest.mark.parametrize("kind", ["qwen3", "llama3", "qwen3_yarn"])
def test_greedy_tokens_equal_hf_with_graphs(tmp_path: Path, kind: str) -> None:
    pytest.importorskip("transformers")
    path = make_hf_model(kind, tmp_path / kind)
    runner = _cuda_runner(path, "float32", eager=False, max_model_len=256)
    replays = count_replays(runner)
    prompts = [[3, 17, 9, 250, 4], [100, 101, 102] * 9, [7], [50 + i for i in range(40)], [11, 12]]
    reqs = [
        Request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
        for i, p in enumerate(prompts)
    ]
    got = run_loop(runner, reqs, 64, [0, 0, 2, 3, 7], num_blocks=1024)
    hf = load_hf(path)
    for prompt, out in zip(prompts, got, strict=True):
        assert out == hf_greedy(hf, prompt, 20)
    assert len(replays) > 10


def test_async_scheduling_with_graphs_equals_sync(tmp_path: Path) -> None:
    from surge import LLM

    path = make_hf_model("qwen3", tmp_path / "qwen3")
    prompts = [[3, 17, 9, 250, 4], [100, 101, 102] * 9, [7], [50 + i for i in range(40)], [11, 12]]
    params = [SamplingParams(temperature=0.0, max_tokens=24 + i, ignore_eos=True) for i in range(5)]
    params[2] = SamplingParams(temperature=1.0, seed=5, max_tokens=20, ignore_eos=True)
    outs = []
    for mode in (False, True):
        llm = LLM(
            path,
            device="cuda",
            dtype="float32",
            max_model_len=256,
            max_num_seqs=8,
            num_kv_blocks=512,
            async_scheduling=mode,
        )
        assert llm.engine.async_scheduling is mode
        outs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        del llm
        gc.collect()
    assert outs[1] == outs[0]
    assert [len(t) for t in outs[1]] == [p.max_tokens for p in params]


def test_kv_sizing_profiles_on_cuda(tmp_path: Path) -> None:
    gc.collect()  # runners of earlier tests (graph pools included) must not count as in use
    torch.cuda.empty_cache()
    path = tiny_long_qwen3(tmp_path / "qwen3")
    mc = ModelConfig.from_pretrained(path, dtype="float32", load_format="dummy", max_model_len=2048)
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, gpu_memory_utilization=0.5),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=2048),
        device="cuda",
    )
    runner = ModelRunner(cfg)
    num_blocks = runner.determine_num_kv_blocks()
    assert num_blocks == 8 * 128  # a tiny model: capped at what 8 sequences can use
    runner.init_kv_cache(num_blocks)
    assert runner.graph_runner is not None and runner.graph_runner.captured == [1, 2, 4, 8]
