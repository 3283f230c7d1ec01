"""The attention backend interface: paged K/V cache writes and attention over block tables.

A step's batch is a list of sequences, each contributing ``q_len >= 1`` new tokens
(a prefill chunk or one decode token) laid out back to back in a token dimension of
``num_tokens`` rows. Each layer has its own K and V cache of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from surge.kernels.kv_write import RopeKvWrite


@dataclass
class AttentionMetadata:
    """Per-step batch layout shared by every layer.

    Attributes:
        num_tokens: real (unpadded) query tokens in the step.
        num_seqs: real sequences in the step.
        query_start_loc: ``[num_seqs + 1]`` int32, ``cu_seqlens_q``: sequence i's query rows
            are ``query_start_loc[i]:query_start_loc[i+1]``.
        seq_lens: ``[num_seqs]`` int32, context length of each sequence after this step
            (cached tokens + new tokens).
        block_table: ``[num_seqs, max_blocks_per_seq]`` int32 KV block ids (unused entries 0).
        slot_mapping: ``[num_tokens]`` int64 cache slot (``block_id * block_size + offset``) of
            each new token; -1 marks a padding token whose K/V must not be written.
        max_query_len: the longest q_len in the step (host int).
        max_seq_len: the longest seq_len in the step (host int).
        query_start_loc_cpu, seq_lens_cpu: host copies, for backends that loop on the host.
        min_query_len: the shortest q_len in the step (host int); 0 when unknown.
        independent_rows: a pure decode step in which no row reads K/V that another row
            writes (not :mod:`surge.worker.decode_form`, whose rows of one request read each
            other's new K/V, nor a step where a row completes a KV block that a request admitted
            in the same step may share through the prefix cache; see
            :attr:`surge.worker.input_batch.PreparedInputs.independent_rows`): a backend may
            write a row's K/V inside the attention program that reads it
            (:meth:`AttentionBackend.fuses_decode_rope`). False when unknown.
    """

    num_tokens: int
    num_seqs: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    min_query_len: int = 0
    independent_rows: bool = False


class AttentionBackend(ABC):
    """Writes new K/V into the paged cache and computes causal attention.

    Implementations: :class:`surge.layers.torch_attention.TorchAttentionBackend` (reference,
    CPU and GPU) and the Triton backend (GPU).
    """

    name: str = "abstract"
    fuses_rope_kv_write: bool = False
    """True when the caller may hand the q/k norm, rotary and K/V write to ``forward`` as
    ``rope`` (with ``write_kv=False``) instead of running them before it."""
    cuda_graph_safe: bool = False
    """True when ``forward`` has no host syncs and fixed grids, so it can be captured."""

    def reserve(self, max_num_seqs: int, num_kv_heads: int, device: torch.device) -> None:
        """Allocate the persistent scratch that :meth:`forward` may use on steps of up to
        ``max_num_seqs`` sequences with ``num_kv_heads`` KV heads (this rank's), on ``device``;
        called once, before any CUDA-graph capture. Default: nothing to allocate."""
        return None

    def fuses_decode_rope(self, num_seqs: int) -> bool:
        """Whether a ``rope`` handed to :meth:`forward` on a decode step of ``num_seqs``
        :attr:`AttentionMetadata.independent_rows` runs inside the attention kernel (so a
        CUDA graph of such a step differs from a decode-form step's of the same bucket)."""
        return False

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        write_kv: bool = True,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        rope: RopeKvWrite | None = None,
    ) -> torch.Tensor:
        """Write ``k``/``v`` at ``metadata.slot_mapping`` (unless ``write_kv`` is False because
        the caller already wrote them) and attend.

        Args:
            q: ``[num_tokens, num_heads, head_dim]`` queries (rotary already applied, unless
                ``rope`` is given).
            k, v: ``[num_tokens, num_kv_heads, head_dim]`` new keys and values.
            k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, updated in
                place; in the model dtype or float8_e4m3fn (``--kv-cache-dtype fp8``).
            metadata: the step's layout.
            scale: softmax scale, usually ``head_dim ** -0.5``.
            k_scale, v_scale: the layer's dequantization multipliers of an FP8 cache
                (stored ``= x / scale``); ignored for other caches.
            rope: only for a backend with :attr:`fuses_rope_kv_write` (and ``write_kv`` False):
                ``q`` and ``rope.k`` come before their per-head RMSNorm and rotary, and the
                backend applies them and writes ``rope.k``/``rope.v`` into the caches itself
                (:class:`surge.kernels.kv_write.RopeKvWrite`; ``q`` and ``k`` may be modified in
                place).

        Returns:
            ``[num_tokens, num_heads, head_dim]``: each query token attends causally to
            its sequence's cached tokens and the new tokens up to itself. Rows of padding
            tokens (beyond ``query_start_loc[-1]``) are unspecified.
        """
