"""Activation functions of the MLP."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from surge.quant.fp8 import Fp8Activations, quantize_per_token

if TYPE_CHECKING:
    from surge.layers.linear import _LinearBase


class SiluAndMul(nn.Module):
    """SwiGLU's gate (Shazeer, 2020): ``x [..., 2d] -> silu(x[..., :d]) * x[..., d:]``.

    Like :class:`surge.layers.norm.RMSNorm`, it may name the linear layer it feeds
    (:meth:`feeds`) and then returns per-token FP8 activations
    (:class:`surge.quant.fp8.Fp8Activations`) for the steps where that layer runs a w8a8 GEMM.

    Attributes:
        consumer: the linear layer fed by this activation (not a submodule), or None.
    """

    def __init__(self) -> None:
        super().__init__()
        self.consumer: _LinearBase | None = None

    def feeds(self, consumer: _LinearBase) -> None:
        """Declare that this activation's output is ``consumer``'s input (kept as a plain
        reference, not registered as a submodule)."""
        object.__setattr__(self, "consumer", consumer)

    def forward(self, x: torch.Tensor) -> torch.Tensor | Fp8Activations:
        """``x [T, 2d] -> [T, d]``; on CUDA the Triton kernel :func:`surge.kernels.silu_and_mul.silu_and_mul`,
        or :func:`surge.kernels.silu_and_mul.silu_and_mul_fp8` (:class:`Fp8Activations`) when
        the :attr:`consumer` wants per-token FP8 input for ``T`` tokens."""
        consumer = self.consumer
        if (
            consumer is not None
            and consumer.quant_method is not None
            and x.dim() == 2
            and consumer.wants_fp8_input(x.shape[0], x.dtype)
        ):
            if x.is_cuda:
                from surge.kernels.silu_and_mul import silu_and_mul_fp8

                return Fp8Activations(*silu_and_mul_fp8(x), x.dtype)
            return Fp8Activations(*quantize_per_token(self._reference(x)), x.dtype)
        if x.is_cuda and x.dim() == 2:
            from surge.kernels.silu_and_mul import silu_and_mul

            return silu_and_mul(x)
        return self._reference(x)

    @staticmethod
    def _reference(x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
