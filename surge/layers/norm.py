"""RMSNorm (Zhang & Sennrich, 2019) with an optional fused residual add."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from surge.quant.fp8 import Fp8Activations, SplitKPartials, quantize_per_token, splitk_reduce_reference

if TYPE_CHECKING:
    from surge.layers.linear import RowParallelLinear, _LinearBase


class RMSNorm(nn.Module):
    """``y = weight * x / sqrt(mean(x^2) + eps)`` over the last dimension.

    Computed as Hugging Face's ``LlamaRMSNorm``: normalise in float32, cast back to the
    input dtype, then multiply by the weight.

    A norm whose output is the input of one linear layer may name it (:meth:`feeds`): when
    that layer runs a w8a8 FP8 GEMM for the step's token count
    (:meth:`surge.layers.linear._LinearBase.wants_fp8_input`), the norm returns its output
    quantized per token (:class:`surge.quant.fp8.Fp8Activations`, on CUDA from the same kernel:
    :func:`surge.kernels.add_rmsnorm.add_rmsnorm_fp8`) and the GEMM skips its own quantization.

    In the other direction, a norm whose input ``x`` is the output of one row-parallel linear
    layer may say so (:meth:`sums_partials_of`): when that layer's FP8 GEMM ends in a split-K
    reduce launch, it hands the norm its unreduced partials
    (:class:`surge.quant.fp8.SplitKPartials`) and the norm's kernel reduces them
    (:func:`surge.kernels.add_rmsnorm.add_rmsnorm_partials`), bit for bit as the reduce launch
    would have.

    Attributes:
        weight: ``[hidden_size]``, initialised to ones.
        consumer: the linear layer fed by this norm (not a submodule), or None.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.consumer: _LinearBase | None = None

    def feeds(self, consumer: _LinearBase) -> None:
        """Declare that this norm's output is ``consumer``'s input (kept as a plain reference,
        not registered as a submodule)."""
        object.__setattr__(self, "consumer", consumer)

    def sums_partials_of(self, producer: RowParallelLinear) -> None:
        """Declare that this norm's input ``x`` is ``producer``'s output and nothing else reads
        that output, so ``producer`` may return :class:`SplitKPartials` for this norm to reduce
        (kept as a plain reference on ``producer``, not a submodule). A no-op when ``producer``
        is tensor-parallel (``tp_size > 1``): its output is all-reduced first."""
        if producer.tp_size == 1:
            object.__setattr__(producer, "partials_consumer", self)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)

    def forward(
        self, x: torch.Tensor | SplitKPartials, residual: torch.Tensor | None = None
    ) -> torch.Tensor | Fp8Activations | tuple[torch.Tensor | Fp8Activations, torch.Tensor]:
        """Normalise ``x [..., hidden]``.

        Without ``residual``, returns the normalised ``x``. With it, first forms
        ``s = x + residual`` (in the input dtype, as HF's decoder layers do) and returns
        ``(norm(s), s)``: the normalised sum and the new residual. The normalised part is
        :class:`Fp8Activations` (``x`` 2-D) when the :attr:`consumer` wants them.
        :class:`SplitKPartials` (only from the layer named in :meth:`sums_partials_of`) stand
        for their reduced ``[T, hidden]`` output.

        On CUDA this runs the fused Triton kernel :func:`surge.kernels.add_rmsnorm.add_rmsnorm`
        (or ``add_rmsnorm_fp8``, or their ``_partials`` forms); the torch code here is its
        reference and the CPU path.
        """
        if isinstance(x, SplitKPartials):
            return self._forward_partials(x, residual)
        consumer = self.consumer
        if (
            consumer is not None
            and consumer.quant_method is not None
            and x.dim() == 2
            and consumer.wants_fp8_input(x.shape[0], x.dtype)
        ):
            return self._forward_fp8(x, residual)
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

    def _forward_fp8(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> Fp8Activations | tuple[Fp8Activations, torch.Tensor]:
        """:meth:`forward` with the normalised ``x [T, hidden]`` quantized per token."""
        if x.is_cuda:
            from surge.kernels.add_rmsnorm import add_rmsnorm_fp8

            q, scale, new_res = add_rmsnorm_fp8(x, self.weight, self.eps, residual)
        else:
            new_res = None if residual is None else x + residual
            q, scale = quantize_per_token(self._norm(x if new_res is None else new_res))
        act = Fp8Activations(q, scale, x.dtype)
        return act if new_res is None else (act, new_res)

    def _forward_partials(
        self, p: SplitKPartials, residual: torch.Tensor | None
    ) -> torch.Tensor | Fp8Activations | tuple[torch.Tensor | Fp8Activations, torch.Tensor]:
        """:meth:`forward` of the split-K output ``p`` stands for: on CUDA one kernel reduces,
        adds and normalises (and quantizes for a w8a8 :attr:`consumer`); elsewhere (CPU tests
        under Triton's interpreter) the torch reduction, then :meth:`forward`."""
        if not p.partials.is_cuda:
            return self.forward(splitk_reduce_reference(p), residual)
        from surge.kernels.add_rmsnorm import add_rmsnorm_partials, add_rmsnorm_partials_fp8

        consumer = self.consumer
        m = p.partials.shape[1]
        if (
            consumer is not None
            and consumer.quant_method is not None
            and consumer.wants_fp8_input(m, p.dtype)
        ):
            q, scale, new_res = add_rmsnorm_partials_fp8(p, self.weight, self.eps, residual)
            act = Fp8Activations(q, scale, p.dtype)
            return act if new_res is None else (act, new_res)
        out, new_res = add_rmsnorm_partials(p, self.weight, self.eps, residual)
        return out if new_res is None else (out, new_res)
