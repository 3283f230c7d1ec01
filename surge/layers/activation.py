"""Activation functions of the MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """SwiGLU's gate (Shazeer, 2020): ``x [..., 2d] -> silu(x[..., :d]) * x[..., d:]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, 2d] -> [T, d]``; on CUDA the Triton kernel :func:`surge.kernels.silu_and_mul.silu_and_mul`."""
        if x.is_cuda and x.dim() == 2:
            from surge.kernels.silu_and_mul import silu_and_mul

            return silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
