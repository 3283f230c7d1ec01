"""Rotary embedding and RMSNorm against transformers' own implementations."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from surge.layers.norm import RMSNorm  # noqa: E402
from surge.layers.rotary import (  # noqa: E402
    default_inv_freq,
    llama3_inv_freq,
    rope_from_hf_config,
    yarn_inv_freq,
)
from surge.rope_params import rope_params  # noqa: E402

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
"""Qwen3's documented long-context setting, at a tiny original length."""

YARN_VARIANTS = [
    YARN,
    {**YARN, "attention_factor": 0.8},
    {**YARN, "beta_fast": 16, "beta_slow": 2},
    {**YARN, "mscale": 0.707, "mscale_all_dim": 1.0},
    {**YARN, "truncate": False},
    {"rope_type": "yarn", "factor": 2.5},  # original: max_position_embeddings
]


def _hf_config(head_dim: int, scaling: dict | None, theta: float) -> LlamaConfig:
    kwargs = {"rope_scaling": scaling} if scaling else {}
    return LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_theta=theta,
        **kwargs,
    )


def test_llama3_inv_freq_equals_transformers() -> None:
    cfg = _hf_config(64, LLAMA3, 500000.0)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    got = llama3_inv_freq(64, 500000.0, LLAMA3)
    assert torch.equal(got, ref)
    # The scaling really changes something at these settings.
    assert not torch.allclose(got, default_inv_freq(64, 500000.0))


@pytest.mark.parametrize("scaling", YARN_VARIANTS)
def test_yarn_inv_freq_and_attention_factor_equal_transformers(scaling: dict) -> None:
    cfg = _hf_config(64, dict(scaling), 1_000_000.0)
    ref, ref_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    params = rope_params(cfg.to_dict())
    assert params.rope_type == "yarn"
    got, factor = yarn_inv_freq(64, params.theta, params.scaling)
    assert torch.equal(got, ref)
    assert factor == pytest.approx(ref_factor, rel=1e-12)
    assert not torch.allclose(got, default_inv_freq(64, 1_000_000.0))


@pytest.mark.parametrize("scaling", [None, LLAMA3, YARN], ids=["default", "llama3", "yarn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_matches_transformers(scaling: dict | None, dtype: torch.dtype) -> None:
    head_dim, theta = 32, 500000.0
    cfg = _hf_config(head_dim, scaling, theta)
    hf_rope = LlamaRotaryEmbedding(cfg)
    ours = rope_from_hf_config(cfg.to_dict(), head_dim, max_position=4096)
    g = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 5, 63, 64, 65, 500, 2000, 4095])
    q = torch.randn(len(positions), 4, head_dim, generator=g).to(dtype)
    k = torch.randn(len(positions), 2, head_dim, generator=g).to(dtype)
    cos, sin = hf_rope(q, positions[None])
    # HF works on [B, H, T, D]
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    q_got, k_got = ours(positions, q, k)
    assert q_got.dtype == dtype
    torch.testing.assert_close(q_got, q_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_got, k_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_rotary_reads_old_and_new_config_forms() -> None:
    new = {"rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"}}
    old = {"rope_theta": 1000.0, "rope_scaling": None}
    a = rope_from_hf_config(new, 16, 32)
    b = rope_from_hf_config(old, 16, 32)
    assert torch.equal(a.cos_cache, b.cos_cache)
    with pytest.raises(ValueError, match=r"rope_type 'dynamic' is not supported \(supported: .*yarn"):
        rope_from_hf_config({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 16, 32)


def test_a_rope_scaling_override_wins_over_rope_parameters() -> None:
    """A folder saved by transformers 5 gives ``rope_parameters``; ``--hf-overrides`` with vLLM's
    ``rope_scaling`` key must still take effect (the theta kept from ``rope_parameters``)."""
    hf = {"rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"}, "max_position_embeddings": 64}
    plain = rope_params(hf)
    scaled = rope_params({**hf, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert (plain.rope_type, plain.max_len) == ("default", 64)
    assert (scaled.rope_type, scaled.theta, scaled.max_len) == ("yarn", 1000.0, 256)
    a = rope_from_hf_config({**hf, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 16, 256)
    b = rope_from_hf_config(hf, 16, 256)
    assert not torch.allclose(a.cos_cache, b.cos_cache)


def test_an_old_style_type_in_a_rope_scaling_override_wins_over_rope_parameters() -> None:
    """The older spelling ``{"type": "yarn"}`` (Qwen2.5's documented one) given with
    ``--hf-overrides`` to a transformers 5 folder (``rope_parameters`` with ``rope_type``
    "default"): the override's type wins; it was read as "default", so YaRN and its longer
    context were silently dropped."""
    hf = {"rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"}, "max_position_embeddings": 64}
    scaling = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    scaled = rope_params({**hf, "rope_scaling": scaling})
    assert (scaled.rope_type, scaled.theta, scaled.max_len) == ("yarn", 1000.0, 256)
    assert "type" not in scaled.scaling and "rope_type" not in scaled.scaling
    saved_yarn = {
        "rope_parameters": {"rope_theta": 1000.0, "type": "yarn", "factor": 2.0},
        "max_position_embeddings": 64,
    }
    assert rope_params(saved_yarn).rope_type == "yarn"  # rope_parameters' own type still read


@pytest.mark.parametrize(
    ("scaling", "words"),
    [
        ({"rope_type": "linear"}, "factor must be a number"),
        ({"rope_type": "linear", "factor": 0}, "factor must be positive"),
        ({"rope_type": "yarn", "factor": "4"}, "factor must be a number, got '4'"),
        ({"rope_type": "yarn", "factor": 4.0, "beta_fast": -1}, "beta_fast must be positive"),
        ({"rope_type": "yarn", "factor": 4.0, "truncate": "no"}, "truncate must be true or false"),
        ({"rope_type": "llama3", "factor": 8.0}, "llama3 lacks the key 'low_freq_factor'"),
        ("yarn", "rope_scaling must be an object or null"),
    ],
)
def test_bad_rope_scaling_is_named(scaling: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        rope_params({"rope_scaling": scaling, "max_position_embeddings": 64})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_transformers(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    ref = LlamaRMSNorm(48, eps=1e-5).to(dtype)
    ours = RMSNorm(48, eps=1e-5, dtype=dtype)
    w = torch.randn(48, generator=g).to(dtype)
    ref.weight.data.copy_(w)
    ours.weight.data.copy_(w)
    x = (torch.randn(7, 48, generator=g) * 3).to(dtype)
    r = torch.randn(7, 48, generator=g).to(dtype)
    assert torch.equal(ours(x), ref(x))
    normed, residual = ours(x, r)
    assert torch.equal(residual, x + r)
    assert torch.equal(normed, ref(r + x))
    # Per-head use (Qwen3 q/k norm) on [T, H, D].
    xh = torch.randn(5, 3, 48, generator=g).to(dtype)
    assert torch.equal(ours(xh), ref(xh))
