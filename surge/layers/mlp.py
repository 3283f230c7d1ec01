"""The gated (SwiGLU) MLP shared by the Llama, Qwen2 and Qwen3 decoder layers."""

from __future__ import annotations

import torch
from torch import nn

from surge.layers.activation import SiluAndMul
from surge.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from surge.quant.fp8 import Fp8Activations, SplitKPartials


class GatedMLP(nn.Module):
    """SwiGLU MLP (Shazeer, 2020): ``down(silu(gate(x)) * up(x))``.

    ``gate_proj`` and ``up_proj`` are one column-parallel matmul (``gate_up_proj``); the down
    projection is row-parallel; the activation :meth:`~surge.layers.activation.SiluAndMul.feeds`
    ``down_proj`` (per-token FP8 output when that layer runs w8a8). Parameter names follow Hugging Face's (``gate_up_proj`` is
    loaded from ``gate_proj`` and ``up_proj``).

    Args:
        hidden_size: model width.
        intermediate_size: MLP width (before tensor-parallel sharding).
        bias: whether the projections have biases (Llama's ``mlp_bias``).
        dtype: parameter dtype.
        tp_rank, tp_size: this rank and the tensor-parallel world size.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        dtype: torch.dtype,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        inter = intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [inter, inter], bias, dtype, tp_rank, tp_size
        )
        self.down_proj = RowParallelLinear(inter, hidden_size, bias, dtype, tp_rank, tp_size)
        self.act = SiluAndMul()
        self.act.feeds(self.down_proj)

    def forward(self, x: torch.Tensor | Fp8Activations) -> torch.Tensor | SplitKPartials:
        """``x [T, hidden] -> [T, hidden]``; :class:`SplitKPartials` when ``down_proj`` leaves
        its split-K reduction to the norm that reads this output
        (:meth:`surge.layers.norm.RMSNorm.sums_partials_of`).

        Where ``down_proj`` takes bf16 activations for ``T`` tokens and the FP8 path of
        ``gate_up_proj`` can apply the SwiGLU in its GEMM's epilogue
        (:meth:`~surge.layers.linear.MergedColumnParallelLinear.swiglu`: on the H200 table,
        decode steps of 1..16 tokens), that replaces the GEMM + :attr:`act` pair, bit for bit.
        """
        m = x.data.shape[0] if isinstance(x, Fp8Activations) else x.shape[0]
        if not self.down_proj.wants_fp8_input(m, x.dtype):
            act = self.gate_up_proj.swiglu(x)
            if act is not None:
                return self.down_proj(act)
        return self.down_proj(self.act(self.gate_up_proj(x)))
