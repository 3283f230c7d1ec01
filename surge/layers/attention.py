"""One layer's attention core: (q/k RMSNorm,) rotary, paged K/V write and attention."""

from __future__ import annotations

import torch
from torch import nn

from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.layers.norm import RMSNorm
from surge.layers.rotary import RotaryEmbedding


class Attention(nn.Module):
    """Rotary embedding (with Qwen3's optional per-head q/k RMSNorm first), then the backend's
    K/V cache write and paged attention.

    On CUDA with a backend that sets ``fuses_rope_kv_write``, the backend gets the norm, rotary
    and cache write as :class:`surge.kernels.kv_write.RopeKvWrite`: the Triton backend runs
    them inside its decode attention kernel on pure decode steps, and as one Triton kernel
    (:func:`surge.kernels.kv_write.fused_qk_norm_rope_kv_write`) before attention otherwise;
    elsewhere the torch layers run them and are the reference.

    Args:
        num_heads, num_kv_heads, head_dim: this rank's query heads, KV heads and head size.
        rotary: the model's shared rotary embedding.
        q_norm, k_norm: per-head RMSNorms over ``head_dim`` (both or neither).

    Attributes:
        k_scale, v_scale: dequantization multipliers of an FP8 KV cache (1.0 unless the
            checkpoint gives ``k_scale``/``v_scale``; unused for other caches).
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: RotaryEmbedding,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> None:
        super().__init__()
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm must be given together")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.rotary = rotary
        self.q_norm = q_norm
        self.k_norm = k_norm
        self.k_scale = 1.0
        self.v_scale = 1.0

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """Attend.

        Args:
            positions: ``[T]`` absolute positions.
            q: ``[T, num_heads * head_dim]``; k, v: ``[T, num_kv_heads * head_dim]`` (views of
                the fused qkv projection are fine; q and k may be modified in place).
            kv_cache: this layer's ``(k_cache, v_cache)``, each
                ``[num_blocks, block_size, num_kv_heads, head_dim]``.

        Returns:
            ``[T, num_heads * head_dim]``.
        """
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        if q.is_cuda and backend.fuses_rope_kv_write:
            from surge.kernels.kv_write import RopeKvWrite

            rope = RopeKvWrite(
                k,
                v,
                positions,
                self.rotary.cos_cache,
                self.rotary.sin_cache,
                metadata.slot_mapping[:t],
                None if self.q_norm is None else self.q_norm.weight,
                None if self.k_norm is None else self.k_norm.weight,
                1e-6 if self.q_norm is None else self.q_norm.eps,
            )
            out = backend.forward(
                q, k, v, k_cache, v_cache, metadata, self.scale, False, self.k_scale, self.v_scale, rope=rope
            )
        else:
            if self.q_norm is not None and self.k_norm is not None:
                q = self.q_norm(q)
                k = self.k_norm(k)
            q, k = self.rotary(positions, q, k)
            out = backend.forward(
                q, k, v, k_cache, v_cache, metadata, self.scale, True, self.k_scale, self.v_scale
            )
        return out.reshape(t, self.num_heads * self.head_dim)
