"""Llama (Llama 2, Llama 3.x with llama3 rope scaling, TinyStories Llamas) as in HF's
``LlamaForCausalLM``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from surge.config import ModelConfig
from surge.layers.attention import Attention
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from surge.layers.linear import QKVParallelLinear, RowParallelLinear
from surge.layers.mlp import GatedMLP
from surge.layers.norm import RMSNorm
from surge.layers.rotary import RotaryEmbedding, rope_from_hf_config
from surge.layers.stream_decode import StreamDecode
from surge.quant.fp8 import SplitKPartials

KVCache = tuple[torch.Tensor, torch.Tensor]


class LlamaAttention(nn.Module):
    """Self-attention: fused qkv projection, rotary, paged attention, output projection."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        hf: dict[str, Any] = cfg.hf_config
        bias = bool(hf.get("attention_bias", False))
        dtype = cfg.torch_dtype
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size,
            cfg.head_dim,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            bias=bias,
            dtype=dtype,
            tp_rank=tp_rank,
            tp_size=tp_size,
        )
        self.o_proj = RowParallelLinear(
            cfg.num_attention_heads * cfg.head_dim,
            cfg.hidden_size,
            bias=bias,
            dtype=dtype,
            tp_rank=tp_rank,
            tp_size=tp_size,
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.attn = Attention(self.num_heads, self.num_kv_heads, cfg.head_dim, rotary)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        kv_cache: KVCache,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor | SplitKPartials:
        """``hidden [T, hidden] -> [T, hidden]``; writes this layer's K/V into ``kv_cache``.
        :class:`SplitKPartials` where ``o_proj`` leaves its split-K reduction to the
        post-attention norm."""
        q_size, kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        q, k, v = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        return self.o_proj(self.attn(positions, q, k, v, kv_cache, metadata, backend))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))`` with fused add + norm."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        eps = float(cfg.hf_config.get("rms_norm_eps", 1e-6))
        self.self_attn = LlamaAttention(cfg, rotary, tp_rank, tp_size)
        self.mlp = GatedMLP(
            cfg.hidden_size,
            cfg.intermediate_size,
            bool(cfg.hf_config.get("mlp_bias", False)),
            cfg.torch_dtype,
            tp_rank,
            tp_size,
        )
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps, cfg.torch_dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps, cfg.torch_dtype)
        self.input_layernorm.feeds(self.self_attn.qkv_proj)
        self.post_attention_layernorm.feeds(self.mlp.gate_up_proj)
        self.post_attention_layernorm.sums_partials_of(self.self_attn.o_proj)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor | SplitKPartials,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor | SplitKPartials, torch.Tensor]:
        """Returns ``(mlp output, residual)``, both ``[T, hidden]``; their sum is the layer
        output. The MLP output is :class:`SplitKPartials` on the FP8 steps whose down projection
        leaves its split-K reduction to the next norm (see
        :meth:`surge.layers.norm.RMSNorm.sums_partials_of`); ``hidden`` likewise."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, metadata, backend)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers and the final norm. ``stream_decode`` (set by the model runner where
    eligible, :func:`surge.layers.stream_decode.enable_stream_decode`) runs one-token steps'
    layers through the persistent FP8 kernel."""

    def __init__(self, cfg: ModelConfig, tp_rank: int, tp_size: int) -> None:
        super().__init__()
        dtype = cfg.torch_dtype
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, dtype, tp_rank, tp_size)
        rotary = rope_from_hf_config(cfg.hf_config, cfg.head_dim, cfg.max_model_len)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, rotary, tp_rank, tp_size) for _ in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, float(cfg.hf_config.get("rms_norm_eps", 1e-6)), dtype)
        next_norms = [*(layer.input_layernorm for layer in self.layers[1:]), self.norm]
        for layer, norm in zip(self.layers, next_norms, strict=True):
            norm.sums_partials_of(layer.mlp.down_proj)
        self.stream_decode: StreamDecode | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """``input_ids [T]``, ``positions [T]`` and one ``(k_cache, v_cache)`` per layer -> the
        hidden states after the final norm, ``[T, hidden]`` (a one-token step through
        :attr:`stream_decode` when set)."""
        hidden = self.embed_tokens(input_ids)
        if self.stream_decode is not None and input_ids.shape[0] == 1:
            hidden, residual = self.stream_decode(hidden, positions, kv_caches, metadata, backend)
            hidden, _ = self.norm(hidden, residual)
            return hidden
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, metadata, backend)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """Llama decoder with its LM head (tied to the embedding when ``tie_word_embeddings``).

    Args:
        model_config: shapes, dtype and the HF ``config.json`` (rope, eps, biases, tying).
        tp_rank, tp_size: this rank and the tensor-parallel world size.
    """

    def __init__(self, model_config: ModelConfig, tp_rank: int = 0, tp_size: int = 1) -> None:
        super().__init__()
        cfg = model_config
        self.model = LlamaModel(cfg, tp_rank, tp_size)
        self.tie_word_embeddings = bool(cfg.hf_config.get("tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.torch_dtype,
            tp_rank,
            tp_size,
            tie_to=self.model.embed_tokens if self.tie_word_embeddings else None,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn_metadata: AttentionMetadata,
        attn_backend: AttentionBackend,
    ) -> torch.Tensor:
        """``input_ids [T]``, ``positions [T]`` -> final hidden states ``[T, hidden]``."""
        return self.model(input_ids, positions, kv_caches, attn_metadata, attn_backend)

    def compute_logits(self, hidden: torch.Tensor, *, upcast: bool = True) -> torch.Tensor:
        """``hidden [N, hidden] -> logits [N, vocab_size]``: float32, or with ``upcast=False``
        the model's dtype (the sampler's consumers widen what they need)."""
        logits = self.lm_head(hidden)
        return logits.float() if upcast else logits
