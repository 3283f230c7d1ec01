"""Tensor-parallel linear layers that own their weight loading.

The layout follows Megatron-LM (Shoeybi et al., 2019) as used by vLLM: a column-parallel
layer splits the output features over ranks (no communication), a row-parallel layer splits
the input features and all-reduces its partial sums. Each parameter carries a
``weight_loader(param, loaded_weight, shard_id=None)`` that copies this rank's slice of a
full Hugging Face tensor into it. ``tp_rank``/``tp_size`` are passed explicitly; with
``tp_size == 1`` nothing is split and no collective runs.

On CUDA, matmuls of at most ``SKINNY_MAX_M`` tokens (decode steps) with a weight shape where it
measured faster run on the skinny Triton GEMM of :mod:`surge.kernels.skinny_gemm` instead of
cuBLAS (see :func:`gemm`).

A quantized layer (FP8, :mod:`surge.quant`) has a ``quant_method`` that owns its weights'
format and runs its matmul; unquantized layers keep ``quant_method = None`` and :func:`gemm`.
The kernel producing a layer's input asks :meth:`_LinearBase.wants_fp8_input` whether to hand
it per-token FP8 activations (:class:`surge.quant.fp8.Fp8Activations`) instead of bf16 ones;
only a quantized layer on a w8a8 path says yes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from surge.layers.norm import RMSNorm
    from surge.parallel.communicator import TPCommunicator
    from surge.quant.fp8 import Fp8Activations, SplitKPartials

WeightLoader = Callable[..., None]


class LinearMethod(Protocol):
    """A quantized layer's matmul (e.g. :class:`surge.quant.fp8_linear.Fp8LinearMethod`)."""

    def apply(
        self, layer: _LinearBase, x: torch.Tensor | Fp8Activations, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``x [T, in_local] -> [T, out_local]`` in ``x``'s dtype, plus ``bias`` when given."""
        ...

    def wants_fp8_input(self, m: int, dtype: torch.dtype) -> bool:
        """Whether a step of ``m`` tokens of ``dtype`` takes :class:`Fp8Activations`."""
        ...

    def apply_partials(
        self, layer: _LinearBase, x: torch.Tensor | Fp8Activations, bias: torch.Tensor | None
    ) -> torch.Tensor | SplitKPartials:
        """:meth:`apply`, except that a step whose GEMM would end in a split-K reduce launch
        returns its unreduced :class:`SplitKPartials` instead (for an RMSNorm to reduce)."""
        ...

    def apply_gated(
        self, layer: _LinearBase, x: torch.Tensor | Fp8Activations, bias: torch.Tensor | None
    ) -> torch.Tensor | None:
        """SwiGLU's ``silu(gate) * up`` of a merged ``[gate; up]`` layer from its GEMM's
        epilogue, or None where this step's path cannot fuse it."""
        ...


def _divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator != 0:
        raise ValueError(f"{what} ({numerator}) is not divisible by the tensor parallel size ({denominator})")
    return numerator // denominator


def _check_shape(param: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(
            f"{name}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}"
        )


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``x [T, in] -> [T, out]`` in ``x``'s dtype.

    On CUDA, when :func:`surge.kernels.skinny_gemm.use_skinny` holds (``T <= SKINNY_MAX_M``,
    fp16/bf16, a weight shape where it measured faster), the skinny Triton GEMM runs instead of
    cuBLAS. Triton is imported only then, so
    CPU-only hosts need not have it.
    """
    if x.is_cuda:
        from surge.kernels.skinny_gemm import skinny_linear, use_skinny

        if use_skinny(x, weight):
            return skinny_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _make_param(shape: tuple[int, ...], dtype: torch.dtype | None, loader: WeightLoader) -> nn.Parameter:
    param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    param.weight_loader = loader  # type: ignore[attr-defined]
    return param


class _LinearBase(nn.Module):
    """Holds ``weight [out_local, in_local]`` and optional ``bias [out_local]``.

    ``quant_method`` is None unless :mod:`surge.quant` quantized the layer at load.
    """

    def __init__(
        self,
        in_local: int,
        out_local: int,
        bias: bool,
        dtype: torch.dtype | None,
        tp_rank: int,
        tp_size: int,
    ) -> None:
        super().__init__()
        if not 0 <= tp_rank < tp_size:
            raise ValueError(f"tp_rank {tp_rank} is out of range for tp_size {tp_size}")
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.in_features_local = in_local
        self.out_features_local = out_local
        self.weight = _make_param((out_local, in_local), dtype, self.weight_loader)
        self.bias = _make_param((out_local,), dtype, self.weight_loader) if bias else None
        self.quant_method: LinearMethod | None = None

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        raise NotImplementedError

    def wants_fp8_input(self, num_tokens: int, dtype: torch.dtype) -> bool:
        """Whether the producer of this layer's ``[num_tokens, in_local]`` input of ``dtype``
        should pass it quantized per token (:class:`surge.quant.fp8.Fp8Activations`): only an
        FP8 layer whose path for ``num_tokens`` is a w8a8 GEMM says yes. Depends only on the
        shapes, so it is fixed for a captured CUDA graph."""
        qm = self.quant_method
        return qm is not None and qm.wants_fp8_input(num_tokens, dtype)

    def forward(self, x: torch.Tensor | Fp8Activations) -> torch.Tensor:
        """``x [T, in_local] -> [T, out_local]`` (:func:`gemm` or the quant method; per-token
        FP8 activations only when :meth:`wants_fp8_input` said so)."""
        if self.quant_method is None:
            return gemm(x, self.weight, self.bias)
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(_LinearBase):
    """A linear layer whose full weight lives on every rank."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__(in_features, out_features, bias, dtype, tp_rank, tp_size)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        """Copy the full tensor. Raises ValueError on a shape mismatch."""
        _check_shape(param, loaded_weight, type(self).__name__)
        param.data.copy_(loaded_weight)


class ColumnParallelLinear(_LinearBase):
    """``y = x W^T + b`` with W's output features split over ranks; output stays sharded."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        out_local = _divide(out_features, tp_size, f"{type(self).__name__} output size")
        super().__init__(in_features, out_local, bias, dtype, tp_rank, tp_size)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        """Copy rows ``[rank * out_local, (rank + 1) * out_local)`` of the full tensor."""
        n = param.shape[0]
        if loaded_weight.shape[0] != n * self.tp_size:
            raise ValueError(
                f"{type(self).__name__}: checkpoint tensor has {loaded_weight.shape[0]} rows, "
                f"expected {n * self.tp_size}"
            )
        shard = loaded_weight.narrow(0, self.tp_rank * n, n)
        _check_shape(param, shard, type(self).__name__)
        param.data.copy_(shard)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stacked in one weight (e.g. ``gate_up_proj``).

    ``output_sizes`` are the full sizes of the stacked parts; ``shard_id`` is the part index.
    """

    def __init__(
        self,
        in_features: int,
        output_sizes: list[int],
        bias: bool = False,
        dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        self.output_sizes_local = [_divide(s, tp_size, "merged output size") for s in output_sizes]
        super().__init__(in_features, sum(output_sizes), bias, dtype, tp_rank, tp_size)

    def swiglu(self, x: torch.Tensor | Fp8Activations) -> torch.Tensor | None:
        """``silu(part 0) * part 1``, ``[T, out_local / 2]``, computed in the GEMM's epilogue
        where the quant method fuses it (:meth:`LinearMethod.apply_gated`; the FP8 split-K path
        of decode steps), else None: the caller runs :meth:`forward` and the activation. Only
        for two parts of one size (``gate_proj``, ``up_proj``), whose rows on every rank are
        this rank's gate rows then its up rows."""
        sizes = self.output_sizes_local
        if self.quant_method is None or len(sizes) != 2 or sizes[0] != sizes[1]:
            return None
        return self.quant_method.apply_gated(self, x, self.bias)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        """Copy this rank's slice of part ``shard_id`` (int) into its rows of the stacked weight."""
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes_local):
            raise ValueError(f"MergedColumnParallelLinear: bad shard_id {shard_id!r}")
        size = self.output_sizes_local[shard_id]
        offset = sum(self.output_sizes_local[:shard_id])
        if loaded_weight.shape[0] != size * self.tp_size:
            raise ValueError(
                f"MergedColumnParallelLinear: part {shard_id} has {loaded_weight.shape[0]} rows, "
                f"expected {size * self.tp_size}"
            )
        target = param.data.narrow(0, offset, size)
        shard = loaded_weight.narrow(0, self.tp_rank * size, size)
        _check_shape(target, shard, "MergedColumnParallelLinear")
        target.copy_(shard)


class QKVParallelLinear(ColumnParallelLinear):
    """The fused q, k, v projection: output ``[q (H*D) | k (Hkv*D) | v (Hkv*D)]`` per rank.

    Query heads are split over ranks; KV heads too, or replicated when ``tp_size`` exceeds
    ``num_kv_heads`` (each rank then holds the one KV head its query heads use).
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp_size, "num_attention_heads")
        if tp_size >= num_kv_heads:
            _divide(tp_size, num_kv_heads, "(tp_size / num_kv_heads) replication")
            self.num_kv_heads = 1
            self.kv_head_offset = tp_rank // (tp_size // num_kv_heads)
        else:
            self.num_kv_heads = _divide(num_kv_heads, tp_size, "num_key_value_heads")
            self.kv_head_offset = tp_rank * self.num_kv_heads
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim
        out_local = self.q_size + 2 * self.kv_size
        _LinearBase.__init__(self, hidden_size, out_local, bias, dtype, tp_rank, tp_size)

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        """Copy this rank's heads of the full ``q``/``k``/``v`` tensor (``shard_id``)."""
        if shard_id == "q":
            offset, size, start = 0, self.q_size, self.tp_rank * self.q_size
        elif shard_id in ("k", "v"):
            offset = self.q_size + (self.kv_size if shard_id == "v" else 0)
            size, start = self.kv_size, self.kv_head_offset * self.head_dim
        else:
            raise ValueError(f"QKVParallelLinear: bad shard_id {shard_id!r}")
        if loaded_weight.shape[0] < start + size:
            raise ValueError(
                f"QKVParallelLinear: {shard_id} tensor has {loaded_weight.shape[0]} rows, "
                f"need at least {start + size}"
            )
        target = param.data.narrow(0, offset, size)
        shard = loaded_weight.narrow(0, start, size)
        _check_shape(target, shard, f"QKVParallelLinear ({shard_id})")
        target.copy_(shard)


class RowParallelLinear(_LinearBase):
    """``y = x W^T + b`` with W's input features split over ranks; partial sums all-reduced.

    The input is this rank's shard ``[T, in/tp]``; the output is the full ``[T, out]``.
    The bias is added once, after the reduction.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        in_local = _divide(in_features, tp_size, f"{type(self).__name__} input size")
        super().__init__(in_local, out_features, bias, dtype, tp_rank, tp_size)
        self.comm: TPCommunicator | None = None
        """The all-reduce of a TP worker (set by the model runner); None: ``torch.distributed``."""
        self.partials_consumer: RMSNorm | None = None
        """The norm that reads this layer's output and reduces split-K partials itself (set by
        :meth:`surge.layers.norm.RMSNorm.sums_partials_of`, TP=1 only; not a submodule), or
        None: the output is always a tensor."""

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        """Copy columns ``[rank * in_local, (rank + 1) * in_local)`` (the bias whole)."""
        if param.dim() == 2:
            n = param.shape[1]
            if loaded_weight.dim() != 2 or loaded_weight.shape[1] != n * self.tp_size:
                raise ValueError(
                    f"RowParallelLinear: checkpoint tensor has shape {tuple(loaded_weight.shape)}, "
                    f"expected ({param.shape[0]}, {n * self.tp_size})"
                )
            loaded_weight = loaded_weight.narrow(1, self.tp_rank * n, n)
        _check_shape(param, loaded_weight, "RowParallelLinear")
        param.data.copy_(loaded_weight)

    def forward(self, x: torch.Tensor | Fp8Activations) -> torch.Tensor | SplitKPartials:  # type: ignore[override]
        """``x [T, in_local] -> [T, out]`` (all-reduced over ranks when ``tp_size > 1``); with a
        :attr:`partials_consumer`, :class:`SplitKPartials` for the steps whose quantized GEMM
        would end in a split-K reduce launch (only that norm receives them)."""
        if self.quant_method is not None:
            if self.tp_size == 1:
                if self.partials_consumer is not None:
                    return self.quant_method.apply_partials(self, x, self.bias)
                return self.quant_method.apply(self, x, self.bias)
            return self._reduce(self.quant_method.apply(self, x, None))
        if self.tp_size == 1:
            return gemm(x, self.weight, self.bias)
        return self._reduce(gemm(x, self.weight))

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """All-reduce this rank's partial sums ``[T, out]``, then add the bias once."""
        if self.comm is not None:
            partial = self.comm.all_reduce(partial)
        else:
            torch.distributed.all_reduce(partial)
        if self.bias is not None:
            partial = partial + self.bias
        return partial
