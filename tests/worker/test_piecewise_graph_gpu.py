"""Piecewise CUDA graphs on a GPU (skipped without CUDA): prefill and mixed steps replayed as
captured pieces with eager attention between them give the greedy tokens of ``enforce_eager``
(tiny Qwen3 and Llama 3), and at Qwen3-8B's shapes the logits of an eager runner: the torch
reference for bf16 weights, the eager Triton runner for FP8 weights.

Run on a GPU host: ``PYTHONPATH=. python3 -m pytest -p no:cacheprovider -o timeout=0 -m gpu
tests/worker/test_piecewise_graph_gpu.py``
"""

from __future__ import annotations

import gc
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from surge.layers.attention_backend import AttentionMetadata
from surge.sampling_params import SamplingParams
from surge.worker.input_batch import PreparedInputs
from surge.worker.model_runner import ModelRunner
from tests.conftest import STORIES
from tests.models.helpers import make_hf_model
from tests.worker.helpers import QWEN3_8B, assert_logits_close, drive, qwen3_8b_runner, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _log_sizes(runner: ModelRunner, sizes: list[int]) -> None:
    pw = runner.piecewise
    assert pw is not None
    run = pw.run

    def logged(inputs: PreparedInputs, md: AttentionMetadata) -> torch.Tensor:
        sizes.append(inputs.num_tokens)
        return run(inputs, md)

    pw.run = logged  # type: ignore[method-assign]


def _tokens(path: Path, prompts: list[list[int]], eager: bool, **kw: Any) -> tuple[list, list[int]]:
    from surge import LLM

    llm = LLM(path, device="cuda", dtype="float32", async_scheduling=True, enforce_eager=eager, **kw)
    runner = llm.engine.runner
    sizes: list[int] = []
    if not eager:
        assert runner.piecewise is not None and runner.piecewise.captured == runner.piecewise.buckets
        # one capture stream for both kinds of graphs (two cost every decode step its PDL overlap)
        assert runner.graph_runner is not None
        assert runner.piecewise.capture_stream is runner.graph_runner.capture_stream is not None
        _log_sizes(runner, sizes)
    else:
        assert runner.piecewise is None
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    del llm, runner
    gc.collect()
    torch.cuda.empty_cache()
    return out, sizes


@pytest.mark.parametrize(("kind", "budget"), [("qwen3", 512), ("qwen3", 200), ("llama3", 200)])
def test_greedy_tokens_with_piecewise_graphs_equal_enforce_eager(
    tmp_path: Path, kind: str, budget: int
) -> None:
    """Prompts of 20-230 tokens at once: whole-prompt steps (budget 512) or chunked ones mixed
    with decodes (budget 200); Llama 3 has no q/k norms."""
    pytest.importorskip("transformers")
    path = make_hf_model(kind, tmp_path / kind)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(STORIES / name, path / name)  # the engine loads one; the prompts are ids
    kw: dict[str, Any] = dict(
        max_model_len=256, max_num_seqs=32, num_kv_blocks=512, max_num_batched_tokens=budget
    )
    prompts = random_prompts(3, [230, 20, 150, 90, 61, 200])
    graphs, sizes = _tokens(path, prompts, False, **kw)
    eager, _ = _tokens(path, prompts, True, **kw)
    assert graphs == eager
    assert sizes and max(sizes) > 128, sizes


@pytest.mark.skipif(not QWEN3_8B.is_dir(), reason="needs ../shared/assets/models/qwen3-8b")
@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_piecewise_logits_qwen3_8b_shape(tmp_path: Path, quantization: str | None) -> None:
    """A 4-layer Qwen3-8B-shaped model (dummy weights): prompts of 700, 300 and 40 tokens
    arriving over two steps (512-token steps: chunked prefills mixed with decodes) through the
    piecewise graphs. bf16: against the eager torch reference (same weights), logits close.
    FP8: against the eager Triton runner; the first step (512 tokens, bucket 512, nothing
    padded) must give identical logits, the later ones close (per-token FP8 activations turn
    the backends' last-bit differences into visible ones: the decode graphs alone measured a
    largest error of 10-12 % of the largest logit against the torch reference)."""
    graph = qwen3_8b_runner(
        tmp_path, eager=False, torch_backend=False, max_model_len=4096, quantization=quantization
    )
    reference = qwen3_8b_runner(
        tmp_path,
        eager=True,
        torch_backend=quantization is None,
        max_model_len=4096,
        quantization=quantization,
    )
    sizes: list[int] = []
    _log_sizes(graph, sizes)
    calls = 0

    def close(a: torch.Tensor, b: torch.Tensor) -> None:
        nonlocal calls
        calls += 1
        if quantization is not None and calls == 1:
            assert torch.equal(a, b), (a - b).abs().max().item()
            return
        if quantization is None:
            assert_logits_close(a, b, 0.05, 0.995)
        else:
            assert_logits_close(a, b, 0.15, 0.99)

    prompts = [[(7 * j + 3 + i) % 150000 for j in range(n)] for i, n in enumerate([700, 300, 40])]
    drive([graph, reference], prompts, [0, 0, 1], 4, close)
    assert sizes[0] == 512, sizes  # the first step, a full 512-token one, replayed in pieces
