"""One full-sequence forward of a loaded model on CPU, returning every row's logits."""

from __future__ import annotations

import torch
from torch import nn

from surge.config import ModelConfig
from surge.layers.attention_backend import AttentionMetadata
from surge.layers.torch_attention import TorchAttentionBackend


def sequence_logits(
    model: nn.Module,
    mc: ModelConfig,
    ids: list[int],
    kv_dtype: torch.dtype | None = None,
    block_size: int = 16,
) -> torch.Tensor:
    """Prefill ``ids`` as one sequence (torch reference attention, a fresh paged cache of
    ``kv_dtype``, default the model dtype) and return ``[len(ids), vocab]`` float32 logits."""
    n = len(ids)
    nb = -(-n // block_size)
    dtype = kv_dtype or mc.torch_dtype
    shape = (nb, block_size, mc.num_key_value_heads, mc.head_dim)
    caches = [
        (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
        for _ in range(mc.num_hidden_layers)
    ]
    md = AttentionMetadata(
        num_tokens=n,
        num_seqs=1,
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_table=torch.arange(nb, dtype=torch.int32)[None],
        slot_mapping=torch.arange(n),
        max_query_len=n,
        max_seq_len=n,
        query_start_loc_cpu=[0, n],
        seq_lens_cpu=[n],
    )
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(n), caches, md, TorchAttentionBackend())
        return model.compute_logits(hidden)
