"""Rotary position embedding (Su et al., 2021, RoFormer) in the rotate-half (GPT-NeoX) layout.

Matches Hugging Face's ``LlamaRotaryEmbedding`` / ``apply_rotary_pos_emb`` and its
``rope_type="llama3"`` frequency scaling (``_compute_llama3_parameters`` in
``transformers.modeling_rope_utils``, from Meta's Llama 3.1 reference code).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def default_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """``[head_dim // 2]`` float32: ``1 / base^(2i / head_dim)``."""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def llama3_inv_freq(head_dim: int, base: float, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 inverse frequencies: long wavelengths divided by ``factor``, a smooth ramp
    between ``low_freq_factor`` and ``high_freq_factor``, short wavelengths unchanged.

    Raises:
        ValueError: a required key of ``scaling`` is missing.
    """
    try:
        factor = float(scaling["factor"])
        low_freq_factor = float(scaling["low_freq_factor"])
        high_freq_factor = float(scaling["high_freq_factor"])
        old_context_len = float(scaling["original_max_position_embeddings"])
    except KeyError as e:
        raise ValueError(f"rope_scaling llama3 lacks the key {e}") from e
    inv_freq = default_inv_freq(head_dim, base)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


class RotaryEmbedding(nn.Module):
    """Applies rotary embedding to q and k from a precomputed float32 cos/sin cache.

    Args:
        head_dim: rotary dimension (the whole head).
        max_position: cache length in positions (tokens).
        base: ``rope_theta``.
        rope_scaling: None, or a dict with ``rope_type`` (or ``type``) "default", "linear"
            (``factor``) or "llama3" (``factor``, ``low_freq_factor``, ``high_freq_factor``,
            ``original_max_position_embeddings``).

    Raises:
        ValueError: an unsupported ``rope_type``.
    """

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float = 10000.0,
        rope_scaling: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        rope_type = "default"
        if rope_scaling:
            rope_type = str(rope_scaling.get("rope_type") or rope_scaling.get("type") or "default")
        if rope_type == "default":
            inv_freq = default_inv_freq(head_dim, base)
        elif rope_type == "linear":
            inv_freq = default_inv_freq(head_dim, base) / float(rope_scaling["factor"])  # type: ignore[index]
        elif rope_type == "llama3":
            inv_freq = llama3_inv_freq(head_dim, base, rope_scaling)  # type: ignore[arg-type]
        else:
            raise ValueError(f"rope_type {rope_type!r} is not supported (default, linear, llama3)")
        freqs = torch.arange(max_position, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        self.cos_cache: torch.Tensor
        self.sin_cache: torch.Tensor
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q [T, H, D]`` and ``k [T, Hkv, D]`` by ``positions [T]`` (int).

        Returns new tensors in the input dtype (cos/sin are cast to it first, as in HF).
        """
        cos = self.cos_cache[positions].unsqueeze(1)
        sin = self.sin_cache[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_from_hf_config(hf_config: dict[str, Any], head_dim: int, max_position: int) -> RotaryEmbedding:
    """Build the model's :class:`RotaryEmbedding` from a ``config.json`` dict.

    Reads the transformers >= 5 form (``rope_parameters`` with ``rope_theta`` and
    ``rope_type``) or the older one (``rope_theta`` plus ``rope_scaling``).

    Raises:
        ValueError: an unsupported rope type.
    """
    params = hf_config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        base = float(params["rope_theta"])
        scaling: dict[str, Any] | None = params
    else:
        base = float(hf_config.get("rope_theta", 10000.0))
        scaling = hf_config.get("rope_scaling") or None
    return RotaryEmbedding(head_dim, max_position, base, scaling)
