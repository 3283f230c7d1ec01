"""FP8 checkpoints under tensor parallelism on CPU (gloo, ``fp8_emulation``).

A checkpoint's 128 x 128-style block scales (``weight_scale_inv``) are sharded with their weight:
column-parallel layers split the scales' rows, row-parallel layers their columns, and the merged
qkv / gate_up layers take each part's slice. In float32 the block path is weight-only (the
activations are not quantized, see ``Fp8LinearMethod.weight_only``), so TP=2 must give exactly
the greedy tokens of TP=1 and of Hugging Face run on the dequantized weights. (Online FP8 and
per-tensor checkpoints quantize activations per token on each rank's shard of a row-parallel
input, as vLLM does, so their TP=2 tokens may legitimately differ from TP=1's; they are not
compared here.) In bf16, where prefill steps of 128 x 128 block checkpoints take cuBLAS's
block-scaled path (emulated here), TP=2's prompt log-probabilities must be as close to Hugging
Face's as TP=1's.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch

from surge import LLM, SamplingParams
from surge.quant.fp8_linear import SPLITK_MAX_M, Fp8LinearMethod, block_scaled_mm_eligible
from tests.engine.tiny_models import hf_greedy, hf_logprobs, make_tiny_model
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
    with pytest.raises(ValueError) as err:
        LLM(tmp_path / "fp8", device="cpu", dtype="float32", fp8_emulation=True, tensor_parallel_size=2)
    # the layer by name, its full sizes and the per-rank ones; no exception type in the line
    assert re.fullmatch(
        r"tensor-parallel rank \d: fp8: model\.layers\.\d+\.self_attn\.qkv_proj with output parts \[\d+, 32, 32\] x "
        r"input \d+ \(\[\d+, 16, 16\] x \d+ per rank at tensor_parallel_size 2\) is not a multiple of "
        r"weight_block_size \[32, 32\]",
        str(err.value),
    ), str(err.value)


def _prompt_logprobs(llm: LLM, prompts: list[list[int]]) -> list[float]:
    """Each prompt token's log-probability (after the first), prompts concatenated."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    out = []
    for o, prompt in zip(llm.generate(prompts, params), prompts, strict=True):
        assert o.prompt_logprobs is not None and o.prompt_logprobs[0] is None
        out += [entry[tok].logprob for entry, tok in zip(o.prompt_logprobs[1:], prompt[1:], strict=True)]
    return out


def _hf_prompt_logprobs(model_dir: Path, prompts: list[list[int]]) -> list[float]:
    """Hugging Face's log-probability of each prompt token (after the first), fp32, prompts
    concatenated."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out: list[float] = []
    for prompt in prompts:
        lp = hf_logprobs(model, prompt)[:-1]
        out += lp.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()
    return out


def test_tp2_bf16_block_checkpoint_on_the_cublas_path_is_as_close_to_hf_as_tp1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bf16 128 x 128-block checkpoint whose every GEMM shard is eligible for cuBLAS's
    block-scaled path (N in 128s, K in 512s, at TP=1 and TP=2): its prefill steps (more than
    ``SPLITK_MAX_M`` tokens) quantize activations per 128-column group, emulated on CPU as the
    GPU path runs them. Greedy tokens are not compared between TP=1 and TP=2 (each rank rounds
    its row-parallel partial sum to bf16 before the all-reduce, and FP8 activation quantization
    downstream amplifies that on random weights); the prompt log-probabilities are, against
    Hugging Face on the dequantized weights in fp32: TP=2 must be as close as TP=1, which
    mis-sharded block scales would not be (scales rolled by one column at TP=2 measured 0.19
    nats against 0.04). At TP=1, which runs in this process, the steps that took the path are
    recorded; at TP=2 every shard shape is eligible, and the same code decides."""
    dims = dict(
        vocab_size=512,
        hidden_size=1024,
        intermediate_size=2048,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        initializer_range=0.02,
    )
    src = make_tiny_model("qwen3", tmp_path / "src", **dims)  # type: ignore[arg-type]
    fp8_checkpoint(src, tmp_path / "fp8", (128, 128), dequantized=tmp_path / "deq")
    qkv = (8 + 2 * 2) * 128
    for tp in (1, 2):  # (N, K) of each shard: qkv, o, gate_up, down
        for n, k in ((qkv // tp, 1024), (1024, 1024 // tp), (2 * 2048 // tp, 1024), (1024, 2048 // tp)):
            assert block_scaled_mm_eligible(n, k, (128, 128)), (tp, n, k)
    rng = random.Random(11)
    prompts = [[1] + [rng.randrange(3, 512) for _ in range(n)] for n in (90, 70)]
    assert all(len(p) > SPLITK_MAX_M for p in prompts)
    kwargs = dict(device="cpu", dtype="bfloat16", fp8_emulation=True, enable_prefix_caching=False)
    want = _hf_prompt_logprobs(tmp_path / "deq", prompts)
    steps: list[int] = []  # TP=1 runs in this process: record the steps that took the path
    original = Fp8LinearMethod.block_scaled_mm_step

    def spy(self: Fp8LinearMethod, m: int, dtype: torch.dtype = torch.bfloat16) -> bool:
        taken = original(self, m, dtype)
        if taken:
            steps.append(m)
        return taken

    with monkeypatch.context() as mp:
        mp.setattr(Fp8LinearMethod, "block_scaled_mm_step", spy)
        with LLM(tmp_path / "fp8", **kwargs) as llm:  # type: ignore[arg-type]
            tp1 = _prompt_logprobs(llm, prompts)
    assert steps and min(steps) > SPLITK_MAX_M
    with LLM(tmp_path / "fp8", tensor_parallel_size=2, **kwargs) as llm:  # type: ignore[arg-type]
        tp2 = _prompt_logprobs(llm, prompts)

    def mean_abs(a: list[float], b: list[float]) -> float:
        return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)

    err1, err2, between = mean_abs(tp1, want), mean_abs(tp2, want), mean_abs(tp2, tp1)
    print(f"mean |logprob - HF|: TP=1 {err1:.4f}, TP=2 {err2:.4f}; TP=2 - TP=1 {between:.4f}")
    assert err2 <= 1.5 * err1 + 0.01, (err1, err2, between)


def test_executor_counts_fp8_kv_blocks_in_bytes_of_fp8() -> None:
    """The start-up line's GiB under tensor parallelism used the model dtype for an FP8 cache
    (twice the real size); a rank's runner counts 1 byte per value."""
    from types import SimpleNamespace

    from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from surge.parallel.executor import TPExecutor
    from surge.worker.model_runner import ModelRunner

    mc = ModelConfig.from_pretrained(None, dtype="bfloat16")
    sizes = {}
    for kv in ("auto", "fp8"):
        cfg = EngineConfig(
            model=mc,
            cache=CacheConfig(kv_cache_dtype=kv),
            scheduler=SchedulerConfig(max_model_len=64),
            fp8_emulation=kv == "fp8",
        )
        fake = SimpleNamespace(config=cfg, tp_size=1)
        sizes[kv] = TPExecutor.bytes_per_block.fget(fake)  # type: ignore[attr-defined]
        assert sizes[kv] == ModelRunner(cfg).bytes_per_block
    assert sizes["auto"] == 2 * sizes["fp8"]
