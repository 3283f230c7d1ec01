"""Per-token, per-128-column-group FP8 quantization (:mod:`surge.kernels.fp8_group_quant`) against
:func:`surge.quant.fp8.quantize_per_token_group`, bit for bit, with its padding rows and the
outer-dim-major scale layout cuBLAS's ``BlockWise1x128`` scaling takes."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.fp8_group_quant import GROUP_SIZE, per_token_group_quant_fp8
from surge.quant.fp8 import dequantize_per_token_group, quantize_per_token_group

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "m,k,row_multiple", [(1, 128, 1), (5, 256, 4), (17, 384, 16), (33, 512, 16), (16, 128, 16)]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_group_quant_is_bit_exact_and_padded(m: int, k: int, row_multiple: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(m * k)
    # groups of very different magnitudes: one scale per row would flush the small ones
    mag = torch.exp(torch.randn(m, k // GROUP_SIZE, generator=gen) * 2).repeat_interleave(GROUP_SIZE, 1)
    x = (torch.randn(m, k, generator=gen) * mag).to(dtype)
    x[0, :3] = torch.tensor([1000.0, -0.001, 0.0])  # a wide group
    if m > 2:
        x[2, GROUP_SIZE - k :] = 0  # all-zero groups: the floor scale
    q, s = per_token_group_quant_fp8(x.to(DEVICE), row_multiple)
    q_ref, s_ref = quantize_per_token_group(x)
    m_pad = -(-m // row_multiple) * row_multiple
    assert q.shape == (m_pad, k) and q.dtype == torch.float8_e4m3fn and q.is_contiguous()
    assert s.shape == (m_pad, k // GROUP_SIZE) and s.dtype == torch.float32 and s.stride() == (1, m_pad)
    assert torch.equal(s[:m].cpu(), s_ref)
    assert torch.equal(q[:m].cpu().view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(q[m:].cpu().float(), torch.zeros(m_pad - m, k))  # padding: zeros ...
    assert torch.equal(s[m:].cpu(), torch.ones(m_pad - m, k // GROUP_SIZE))  # ... times 1.0


def test_group_quant_reads_strided_rows() -> None:
    x = torch.randn(6, 512, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, s = per_token_group_quant_fp8(x.to(DEVICE)[:, :256])  # row stride 512
    q_ref, s_ref = quantize_per_token_group(x[:, :256])
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s.cpu(), s_ref)


def test_group_quant_reference_round_trips() -> None:
    """The reference's dequantization is within e4m3's half-ulp (2**-4 relative) of the input."""
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2)) * 5
    q, s = quantize_per_token_group(x)
    assert s.shape == (3, 2)
    back = dequantize_per_token_group(q, s.t().contiguous().t())  # any scale strides
    assert ((back - x).abs() <= x.abs() * 2.0**-4 + 1e-6).all()


def test_group_quant_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="multiple of 128"):
        per_token_group_quant_fp8(torch.zeros(2, 192, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous last dim"):
        per_token_group_quant_fp8(torch.zeros(256, 2, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="fp16, bf16 or fp32"):
        per_token_group_quant_fp8(torch.zeros(2, 128, dtype=torch.int32))
    with pytest.raises(ValueError, match="row_multiple"):
        per_token_group_quant_fp8(torch.zeros(2, 128, dtype=torch.bfloat16), 0)
    with pytest.raises(ValueError, match="multiple of 128"):
        quantize_per_token_group(torch.zeros(2, 192))
    q, s = per_token_group_quant_fp8(torch.zeros(0, 256, dtype=torch.bfloat16), 16)
    assert q.shape == (0, 256) and s.shape == (0, 2)


def test_group_reference_rejects_bad_groups_and_scales() -> None:
    with pytest.raises(ValueError, match="group must be >= 1"):
        quantize_per_token_group(torch.zeros(2, 128), 0)
    q, s = quantize_per_token_group(torch.randn(2, 256))
    with pytest.raises(ValueError, match=r"need q \[M, K\] and scale \[M, G\]"):
        dequantize_per_token_group(q, s[:1])
    with pytest.raises(ValueError, match="not a multiple of the 3 scale groups"):
        dequantize_per_token_group(q, torch.ones(2, 3))
