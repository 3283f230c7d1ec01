"""Vocabulary-parallel token embedding and LM head (Megatron-LM layout, as in vLLM).

The vocabulary is padded to a multiple of ``tp_size`` and split into equal contiguous
parts, one per rank. Padding rows are zero and their logits are dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from surge.layers.linear import gemm

if TYPE_CHECKING:
    from surge.parallel.communicator import TPCommunicator


class VocabParallelEmbedding(nn.Module):
    """Token embedding with the vocabulary split over ranks.

    Attributes:
        weight: ``[vocab_per_rank, hidden_size]``, this rank's rows
            ``[tp_rank * vocab_per_rank, (tp_rank + 1) * vocab_per_rank)``.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.vocab_per_rank = -(-vocab_size // tp_size)
        self.vocab_start = tp_rank * self.vocab_per_rank
        self.comm: TPCommunicator | None = None
        """The all-reduce of a TP worker (set by the model runner); None: ``torch.distributed``."""
        self.weight = nn.Parameter(
            torch.empty(self.vocab_per_rank, hidden_size, dtype=dtype), requires_grad=False
        )
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        """Copy this rank's vocabulary rows of the full ``[vocab_size, hidden]`` tensor.

        Raises:
            ValueError: the tensor's shape is not ``[vocab_size, hidden_size]``.
        """
        expected = (self.vocab_size, param.shape[1])
        if tuple(loaded_weight.shape) != expected:
            raise ValueError(
                f"{type(self).__name__}: checkpoint tensor has shape {tuple(loaded_weight.shape)}, "
                f"expected {expected}"
            )
        n = max(0, min(self.vocab_per_rank, self.vocab_size - self.vocab_start))
        param.data.zero_()
        param.data[:n].copy_(loaded_weight[self.vocab_start : self.vocab_start + n])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids [T] int -> [T, hidden_size]``."""
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        mask = (local < 0) | (local >= self.vocab_per_rank)
        out = F.embedding(local.masked_fill(mask, 0), self.weight)
        out.masked_fill_(mask.unsqueeze(-1), 0)
        if self.comm is not None:
            return self.comm.all_reduce(out)
        torch.distributed.all_reduce(out)
        return out


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection to vocabulary logits, split over ranks like the embedding.

    With ``tie_to`` set, the weight is the embedding's (one shared parameter).
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        dtype: torch.dtype | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        tie_to: VocabParallelEmbedding | None = None,
    ) -> None:
        super().__init__(vocab_size, hidden_size, dtype, tp_rank, tp_size)
        if tie_to is not None:
            self.weight = tie_to.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """``hidden [N, hidden_size] -> logits [N, vocab_size]`` in the weight dtype.

        The projection is :func:`surge.layers.linear.gemm` (the skinny Triton GEMM on CUDA for
        at most ``SKINNY_MAX_M`` rows).
        """
        logits = gemm(hidden, self.weight)
        if self.tp_size > 1:
            parts = [torch.empty_like(logits) for _ in range(self.tp_size)]
            torch.distributed.all_gather(parts, logits)
            logits = torch.cat(parts, dim=-1)
        return logits[:, : self.vocab_size]
