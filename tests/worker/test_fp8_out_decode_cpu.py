"""An FP8 model's decode steps with the attention output quantized inside the Triton backend's
decode attention for the o projection (``quant_out``): the same logits, bit for bit, as the same
runner whose o projection quantizes the bf16 output itself, over padded graph buckets, one-split
and split-KV (merged in the launch) contexts. On CPU under the Triton interpreter (the FP8 layers
emulated: their quantization of the input is the torch reference of the kernel's), on a GPU
compiled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.layers.triton_attention import TritonAttentionBackend
from surge.worker.cuda_graph import DecodeGraphRunner, decode_buckets
from surge.worker.model_runner import ModelRunner
from tests.worker.helpers import count_replays, drive, tiny_long_qwen3

MAX_MODEL_LEN = 1024
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _runner(path: Path, backend: TritonAttentionBackend) -> ModelRunner:
    dtype = "bfloat16" if DEVICE == "cuda" else "float32"
    mc = ModelConfig.from_pretrained(
        path, dtype=dtype, load_format="dummy", max_model_len=MAX_MODEL_LEN, quantization="fp8"
    )
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_kv_blocks=128),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=MAX_MODEL_LEN),
        device=DEVICE,
        enforce_eager=True,  # the static-buffer path below runs without capture
        fp8_emulation=DEVICE == "cpu",
    )
    runner = ModelRunner(cfg, backend)
    runner.init_kv_cache(128)
    runner.graph_runner = DecodeGraphRunner(
        runner._forward, runner.device, decode_buckets(8), runner.max_blocks_per_seq, MAX_MODEL_LEN, False
    )
    return runner


@pytest.mark.parametrize("prompt_lens", [(40, 3, 70), (300, 3, 200)])
def test_o_proj_input_quantized_in_decode_attention_same_logits(
    tmp_path: Path, prompt_lens: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decode step (3 sequences in bucket 4) of each layer hands o_proj the attention's
    own Fp8Activations, and the logits equal those of the unfused runner exactly."""
    from surge.layers import triton_attention as ta

    quantized: list[int] = []
    attend = ta.paged_attention

    def recording(*args: object, **kwargs: object) -> torch.Tensor:
        if kwargs.get("quant_out") is not None:
            quantized.append(1)
        return attend(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ta, "paged_attention", recording)
    path = tiny_long_qwen3(tmp_path / "qwen3")
    fused_backend = TritonAttentionBackend(num_sms=132)
    fused = _runner(path, fused_backend)
    plain = _runner(path, TritonAttentionBackend(num_sms=132, quantize_decode_output=False))
    layer = fused.model.model.layers[0]
    assert layer.self_attn.attn.consumer is layer.self_attn.o_proj
    assert layer.self_attn.o_proj.quant_method is not None
    replays = count_replays(fused)

    def same(a: torch.Tensor, b: torch.Tensor) -> None:
        assert torch.equal(a, b)

    drive(
        [fused, plain],
        [[(5 * j + i) % 512 for j in range(n)] for i, n in enumerate(prompt_lens)],
        [0, 0, 0],
        3,
        same,
    )
    assert replays == [4, 4]  # two decode steps of 3 sequences, padded to 4
    assert len(quantized) == 2 * 2  # two decode steps x two layers
    counters = fused_backend._token_counters
    assert counters is not None and torch.all(counters == 0)
