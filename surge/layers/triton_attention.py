"""The Triton attention backend: paged K/V write plus one varlen paged-attention kernel.

Prefill, chunked prefill and decode run in the same launch
(:func:`surge.kernels.paged_attention.paged_attention`); a pure decode step
(``max_query_len == 1``) takes the kernel's decode grid (one program per sequence and KV
head), and small decode batches take the split-KV (flash-decoding) path with a reduce
kernel, each sequence using only the splits its own context needs. Every host-side choice is
made from host ints already in :class:`AttentionMetadata` and tensor shapes, so a forward
never syncs with the GPU and is safe inside CUDA-graph capture.
"""

from __future__ import annotations

import torch

from surge.kernels.kv_write import write_kv_cache
from surge.kernels.paged_attention import choose_num_splits, paged_attention
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata

_DEFAULT_NUM_SMS = 132  # H100/H200; used when no CUDA device is visible (interpreter tests)


class TritonAttentionBackend(AttentionBackend):
    """:class:`AttentionBackend` on Triton kernels (GPU, or CPU under ``TRITON_INTERPRET=1``).

    Args:
        num_sms: streaming multiprocessors used by the split-KV heuristic; read from the
            current CUDA device when None.
        max_num_splits: upper bound on KV splits per (sequence, KV head).
        split_kv: False disables the split-KV path (always one pass).

    Under CUDA graphs, pass the longest context a graph may replay with as
    ``metadata.max_seq_len`` at capture time (e.g. ``max_model_len``): the number of
    splits is fixed at capture as an upper bound, and the kernel gives each sequence only
    ``clamp(cdiv(seq_len, 256), 1, num_splits)`` of them (256 tokens: ``min_kv_per_split``
    in whole KV tiles), so a short context runs one split that writes its output directly
    and the reduce skips it.
    """

    name = "triton"
    fuses_rope_kv_write = True
    cuda_graph_safe = True

    def __init__(self, num_sms: int | None = None, max_num_splits: int = 32, split_kv: bool = True) -> None:
        if num_sms is None:
            num_sms = (
                torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
                if torch.cuda.is_available()
                else _DEFAULT_NUM_SMS
            )
        self.num_sms = num_sms
        self.max_num_splits = max_num_splits
        self.split_kv = split_kv

    def num_splits(self, metadata: AttentionMetadata, num_kv_heads: int) -> int:
        """KV splits for this step (1 = single pass), from host-side metadata only."""
        if not self.split_kv:
            return 1
        return choose_num_splits(
            num_seqs=metadata.seq_lens.shape[0],
            num_kv_heads=num_kv_heads,
            max_query_len=metadata.max_query_len,
            max_seq_len=metadata.max_seq_len,
            num_sms=self.num_sms,
            max_splits=self.max_num_splits,
        )

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
    ) -> torch.Tensor:
        """See :meth:`AttentionBackend.forward`.

        ``q``/``k``/``v`` need a contiguous last dimension and the caches ``q``'s dtype or
        float8_e4m3fn.
        Padding rows (beyond ``query_start_loc[-1]``) are unspecified.
        """
        n = metadata.num_tokens
        if write_kv:
            write_kv_cache(k, v, k_cache, v_cache, metadata.slot_mapping[:n], k_scale, v_scale)
        return paged_attention(
            q,
            k_cache,
            v_cache,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            scale,
            num_splits=self.num_splits(metadata, k_cache.shape[2]),
            max_query_len=metadata.max_query_len,
            k_scale=k_scale,
            v_scale=v_scale,
        )
