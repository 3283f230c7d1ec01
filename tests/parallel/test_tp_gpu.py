"""Tensor parallelism on two GPUs (NCCL, decode CUDA graphs capturing the all-reduces).

Skipped without two CUDA GPUs. On the 2-GPU host: ``python -m pytest -q tests/parallel/test_tp_gpu.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge import LLM, SamplingParams
from tests.engine.tiny_models import hf_greedy, make_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]


@pytest.mark.parametrize("enforce_eager", [True, False])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_tp2_on_two_gpus_matches_hf(tmp_path: Path, enforce_eager: bool, async_scheduling: bool) -> None:
    model_dir = make_tiny_model("qwen3", tmp_path / "qwen3")
    prompts = [[1, 7, 9, 11, 200, 31, 5] * 3, [1, 300], [1, 17, 18, 19], [1] + list(range(3, 40))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    kwargs = dict(device="cuda", dtype="float32", max_num_batched_tokens=16, num_kv_blocks=6)
    with LLM(
        model_dir,
        tensor_parallel_size=2,
        enforce_eager=enforce_eager,
        async_scheduling=async_scheduling,
        **kwargs,  # type: ignore[arg-type]
    ) as llm:
        ours = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        assert llm.engine.get_stats().num_preemptions_total > 0
        sampled = llm.generate(prompts, SamplingParams(temperature=1.0, seed=5, max_tokens=12))
    assert ours == hf_greedy(model_dir, prompts, 12)
    tp1 = LLM(model_dir, enforce_eager=enforce_eager, async_scheduling=async_scheduling, **kwargs)  # type: ignore[arg-type]
    ref = tp1.generate(prompts, SamplingParams(temperature=1.0, seed=5, max_tokens=12))
    assert [o.outputs[0].token_ids for o in sampled] == [o.outputs[0].token_ids for o in ref]


def test_tp2_fp8_on_two_gpus(tmp_path: Path) -> None:
    """FP8 under tensor parallelism on two GPUs: a float32 block checkpoint (weight-only FP8
    GEMMs with each rank's slice of the block scales) gives Hugging Face's greedy tokens on the
    dequantized weights, and online FP8 on a bf16 model (w8a8, per-shard scales) serves exact
    lengths with CUDA graphs."""
    from tests.quant.helpers import fp8_checkpoint

    src = make_tiny_model("qwen3", tmp_path / "qwen3")
    fp8_checkpoint(src, tmp_path / "fp8", (8, 8), dequantized=tmp_path / "deq")
    prompts = [[1, 7, 9, 11, 200, 31, 5] * 3, [1, 300], [1, 17, 18, 19], [1] + list(range(3, 40))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with LLM(tmp_path / "fp8", tensor_parallel_size=2, device="cuda", dtype="float32") as llm:
        ours = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert ours == hf_greedy(tmp_path / "deq", prompts, 12)
    with LLM(src, tensor_parallel_size=2, device="cuda", dtype="bfloat16", quantization="fp8") as llm:
        outs = llm.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [12] * len(prompts)
