"""The attention layer hands its consumer (the o projection, :meth:`Attention.feeds`) per-token FP8
activations quantized by the backend's kernel only when every condition holds: a consumer, an FP8
one, on a w8a8 path for the step's token count, and a backend that can quantize this step
(:meth:`AttentionBackend.quantizes_output`). Recorded on a fake backend (the Triton backend's own
choice and bits are tested in ``tests/kernels/test_paged_attention_fp8_out.py``); and the three
models declare the wiring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from surge.config import ModelConfig
from surge.layers.attention import Attention
from surge.layers.attention_backend import AttentionMetadata
from surge.layers.linear import RowParallelLinear
from surge.layers.rotary import RotaryEmbedding
from surge.layers.torch_attention import TorchAttentionBackend
from surge.model.registry import get_model_class
from surge.quant import fp8_linear
from surge.quant.config import Fp8Config
from surge.quant.fp8 import Fp8Activations, quantize_per_token

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


class _Recording(TorchAttentionBackend):
    """The torch backend that says whether it quantizes (``allow``), records each call's
    ``quantize_out`` and, when asked, returns its output quantized per token."""

    def __init__(self, allow: bool) -> None:
        super().__init__()
        self.allow = allow
        self.calls: list[bool] = []

    def quantizes_output(self, q: torch.Tensor, k_cache: torch.Tensor, metadata: AttentionMetadata) -> bool:
        assert q.dim() == 3 and k_cache.shape[2] == KV_HEADS
        return self.allow

    def forward(
        self, *args: object, quantize_out: bool = False, **kwargs: object
    ) -> torch.Tensor | Fp8Activations:  # type: ignore[override]
        self.calls.append(quantize_out)
        out = super().forward(*args, **kwargs)  # type: ignore[arg-type]
        if not quantize_out:
            return out
        assert self.allow
        return Fp8Activations(*quantize_per_token(out.reshape(out.shape[0], -1)), out.dtype)


def _step(t: int) -> tuple[torch.Tensor, ...]:
    """A decode step of ``t`` sequences (one token each) over 5-token contexts."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(t, HEADS * HEAD_DIM, generator=gen)
    k = torch.randn(t, KV_HEADS * HEAD_DIM, generator=gen)
    v = torch.randn(t, KV_HEADS * HEAD_DIM, generator=gen)
    cache = torch.randn(2, t + 1, 16, KV_HEADS, HEAD_DIM, generator=gen)
    return q, k, v, cache


def _metadata(t: int) -> AttentionMetadata:
    return AttentionMetadata(
        num_tokens=t,
        num_seqs=t,
        query_start_loc=torch.arange(t + 1, dtype=torch.int32),
        seq_lens=torch.full((t,), 5, dtype=torch.int32),
        block_table=torch.arange(1, t + 1, dtype=torch.int32)[:, None],
        slot_mapping=torch.arange(1, t + 1) * 16 + 4,
        max_query_len=1,
        max_seq_len=5,
        query_start_loc_cpu=list(range(t + 1)),
        seq_lens_cpu=[5] * t,
    )


def _o_proj(quantized: bool) -> RowParallelLinear:
    layer = RowParallelLinear(HEADS * HEAD_DIM, 32, dtype=torch.float32)
    layer.weight.data.copy_(
        torch.randn(32, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(5)) * 0.05
    )
    if quantized:
        method = fp8_linear.Fp8LinearMethod(Fp8Config("channel", False, None), emulate=True)  # type: ignore[arg-type]
        method.process_weights(layer)
        layer.quant_method = method
    return layer


def _run(attn: Attention, backend: _Recording, t: int = 3) -> torch.Tensor | Fp8Activations:
    q, k, v, cache = _step(t)
    return attn(torch.full((t,), 4), q, k, v, (cache[0], cache[1]), _metadata(t), backend)


@pytest.mark.parametrize(
    "consumer,wants,allow,fused",
    [
        ("none", True, True, False),
        ("bf16", True, True, False),
        ("fp8", False, True, False),  # the o projection's path for T tokens is w8a16
        ("fp8", True, False, False),  # the backend cannot quantize this step
        ("fp8", True, True, True),
    ],
)
def test_attention_quantizes_for_its_w8a8_consumer_only_when_all_hold(
    consumer: str, wants: bool, allow: bool, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rotary = RotaryEmbedding(HEAD_DIM, 64)
    attn = Attention(HEADS, KV_HEADS, HEAD_DIM, rotary)
    o_proj = _o_proj(consumer == "fp8") if consumer != "none" else None
    if o_proj is not None:
        attn.feeds(o_proj)
        assert attn.consumer is o_proj and "consumer" not in dict(attn.named_modules())
    if o_proj is not None and o_proj.quant_method is not None:
        monkeypatch.setattr(o_proj.quant_method, "wants_fp8_input", lambda m, dtype: wants)
    backend = _Recording(allow)
    out = _run(attn, backend)
    assert backend.calls == [fused]
    assert isinstance(out, Fp8Activations) == fused
    plain = _run(Attention(HEADS, KV_HEADS, HEAD_DIM, rotary), _Recording(False))
    assert isinstance(plain, torch.Tensor) and plain.shape == (3, HEADS * HEAD_DIM)
    if fused:
        assert isinstance(out, Fp8Activations) and o_proj is not None
        assert out.data.shape == (3, HEADS * HEAD_DIM) and out.dtype == torch.float32
        assert torch.equal(o_proj(out), o_proj(plain))  # type: ignore[arg-type]
    else:
        assert isinstance(out, torch.Tensor) and torch.equal(out, plain)


def _config(tmp_path: Path, arch: str, model_type: str) -> ModelConfig:
    cfg = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": 64,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
    }
    path = tmp_path / model_type
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return ModelConfig.from_pretrained(path, dtype="float32", load_format="dummy")


@pytest.mark.parametrize(
    "arch,model_type",
    [("Qwen3ForCausalLM", "qwen3"), ("Qwen2ForCausalLM", "qwen2"), ("LlamaForCausalLM", "llama")],
)
def test_models_give_attention_its_o_projection(tmp_path: Path, arch: str, model_type: str) -> None:
    mc = _config(tmp_path, arch, model_type)
    with torch.device("meta"):
        model = get_model_class(arch)(mc)
    layers = model.model.layers
    assert len(layers) == 2
    for layer in layers:
        assert layer.self_attn.attn.consumer is layer.self_attn.o_proj
