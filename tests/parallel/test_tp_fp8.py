"""FP8 checkpoints under tensor parallelism on CPU (gloo, ``fp8_emulation``).

A checkpoint's 128 x 128-style block scales (``weight_scale_inv``) are sharded with their weight:
column-parallel layers split the scales' rows, row-parallel layers their columns, and the merged
qkv / gate_up layers take each part's slice. In float32 the block path is weight-only (the
activations are not quantized, see ``Fp8LinearMethod.weight_only``), so TP=2 must give exactly
the greedy tokens of TP=1 and of Hugging Face run on the dequantized weights. (Online FP8 and
per-tensor checkpoints quantize activations per token on each rank's shard of a row-parallel
input, as vLLM does, so their TP=2 tokens may legitimately differ from TP=1's; they are not
compared here.)
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from surge import LLM, SamplingParams
from tests.engine.tiny_models import hf_greedy, make_tiny_model
from tests.quant.helpers import fp8_checkpoint

NEW_TOKENS = 8


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert all(len(o.outputs[0].token_ids) == NEW_TOKENS for o in outs)
    return [o.outputs[0].token_ids for o in outs]


def test_tp2_block_checkpoint_matches_tp1_and_hf(tmp_path: Path) -> None:
    src = make_tiny_model("qwen3", tmp_path / "src")
    fp8_checkpoint(src, tmp_path / "fp8", (8, 8), dequantized=tmp_path / "deq")
    rng = random.Random(5)
    prompts = [[1] + [rng.randrange(3, 512) for _ in range(n)] for n in (14, 13, 30, 3)]
    kwargs = dict(device="cpu", dtype="float32", fp8_emulation=True, enable_prefix_caching=False)
    tp1 = _greedy(LLM(tmp_path / "fp8", **kwargs), prompts)  # type: ignore[arg-type]
    with LLM(tmp_path / "fp8", tensor_parallel_size=2, **kwargs) as llm:  # type: ignore[arg-type]
        tp2 = _greedy(llm, prompts)
    assert tp2 == tp1
    assert tp1 == hf_greedy(tmp_path / "deq", prompts, NEW_TOKENS)


def test_tp2_block_shards_not_on_block_boundaries_is_one_error(tmp_path: Path) -> None:
    """The tiny model's k/v projections (32 rows) split in two are 16-row shards: not whole
    32 x 32 blocks, so the start-up error names the layer and the block size."""
    src = make_tiny_model("qwen3", tmp_path / "src")
    fp8_checkpoint(src, tmp_path / "fp8", (32, 32))
    with pytest.raises(ValueError, match=r"not a multiple of weight_block_size \[32, 32\]"):
        LLM(tmp_path / "fp8", device="cpu", dtype="float32", fp8_emulation=True, tensor_parallel_size=2)
