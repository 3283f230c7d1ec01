"""Rotary position embedding (Su et al., 2021, RoFormer) in the rotate-half (GPT-NeoX) layout.

Matches Hugging Face's ``LlamaRotaryEmbedding`` / ``apply_rotary_pos_emb`` and its
``rope_type="llama3"`` frequency scaling (``_compute_llama3_parameters`` in
``transformers.modeling_rope_utils``, from Meta's Llama 3.1 reference code) and
``rope_type="yarn"`` (``_compute_yarn_parameters``; Peng et al., 2023, arXiv:2309.00071), the
long-context mode Qwen documents for Qwen2.5 and Qwen3. The settings are read and checked by
:func:`surge.rope_params.rope_params`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from surge.rope_params import ROPE_TYPES, rope_params


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


def yarn_inv_freq(head_dim: int, base: float, scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """YaRN inverse frequencies and the attention factor that multiplies cos and sin.

    Dimensions that turn fewer than ``beta_slow`` (default 1) times over the original context
    are interpolated (divided by ``factor``), those that turn more than ``beta_fast`` (default
    32) times keep their frequency, with a linear ramp between. The attention factor is
    ``attention_factor`` if given, else ``0.1 ln(factor) + 1`` (Eq. 21 of the paper), or the
    ratio of that formula at ``mscale`` and ``mscale_all_dim`` when both are given.

    Args:
        head_dim: rotary dimension.
        base: ``rope_theta``.
        scaling: :attr:`surge.rope_params.RopeParams.scaling` of a "yarn" model (``factor``
            and ``original_max_position_embeddings`` filled in).

    Returns:
        ``[head_dim // 2]`` float32 inverse frequencies, and the attention factor.
    """

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def correction_dim(num_rotations: float) -> float:
        return (head_dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """Applies rotary embedding to q and k from a precomputed float32 cos/sin cache.

    The cache already holds YaRN's attention factor (cos and sin multiplied by it, as
    transformers does before its cast), so every kernel that reads it (the KV write, decode
    attention, the stream kernel) applies YaRN without knowing of it.

    Args:
        head_dim: rotary dimension (the whole head).
        max_position: cache length in positions (tokens).
        base: ``rope_theta``.
        rope_type: one of :data:`surge.rope_params.ROPE_TYPES`.
        scaling: the scaling keys of that type, as :attr:`surge.rope_params.RopeParams.scaling`
            gives them (checked and filled in; read them with
            :func:`surge.rope_params.rope_params`, as :func:`rope_from_hf_config` does).

    Raises:
        ValueError: an unknown ``rope_type``.
    """

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float = 10000.0,
        rope_type: str = "default",
        scaling: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        scaling = scaling or {}
        attention_factor = 1.0
        if rope_type == "default":
            inv_freq = default_inv_freq(head_dim, base)
        elif rope_type == "linear":
            inv_freq = default_inv_freq(head_dim, base) / float(scaling["factor"])
        elif rope_type == "llama3":
            inv_freq = llama3_inv_freq(head_dim, base, scaling)
        elif rope_type == "yarn":
            inv_freq, attention_factor = yarn_inv_freq(head_dim, base, scaling)
        else:
            raise ValueError(f"rope_type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
        freqs = torch.arange(max_position, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
        self.cos_cache: torch.Tensor
        self.sin_cache: torch.Tensor
        self.register_buffer("cos_cache", freqs.cos() * attention_factor, persistent=False)
        self.register_buffer("sin_cache", freqs.sin() * attention_factor, persistent=False)

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
    """Build the model's :class:`RotaryEmbedding` from a ``config.json`` dict (either form
    transformers writes; see :mod:`surge.rope_params`).

    Raises:
        ValueError: an unsupported rope type or a bad scaling key.
    """
    params = rope_params(hf_config)
    return RotaryEmbedding(head_dim, max_position, params.theta, params.rope_type, params.scaling)
