"""RMSNorm (Zhang & Sennrich, 2019) with an optional fused residual add."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``y = weight * x / sqrt(mean(x^2) + eps)`` over the last dimension.

    Computed as Hugging Face's ``LlamaRMSNorm``: normalise in float32, cast back to the
    input dtype, then multiply by the weight.

    Attributes:
        weight: ``[hidden_size]``, initialised to ones.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalise ``x [..., hidden]``.

        Without ``residual``, returns the normalised ``x``. With it, first forms
        ``s = x + residual`` (in the input dtype, as HF's decoder layers do) and returns
        ``(norm(s), s)``: the normalised sum and the new residual.

        On CUDA this runs the fused Triton kernel :func:`surge.kernels.add_rmsnorm.add_rmsnorm`;
        the torch code here is its reference and the CPU path.
        """
        if x.is_cuda:
            from surge.kernels.add_rmsnorm import add_rmsnorm

            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            res2 = None if residual is None else residual.reshape(-1, shape[-1])
            out, new_res = add_rmsnorm(x2, self.weight, self.eps, res2)
            if new_res is None:
                return out.view(shape)
            return out.view(shape), new_res.view(shape)
        if residual is None:
            return self._norm(x)
        s = x + residual
        return self._norm(s), s
