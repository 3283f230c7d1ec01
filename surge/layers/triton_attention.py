"""The Triton attention backend: paged K/V write, a prefill kernel and a varlen paged kernel.

Sequences with at least ``PrefillKernelChoice.min_query_len`` new tokens (prefill chunks) run
on :func:`surge.kernels.prefill_attention.prefill_attention` (FlashAttention-2 schedule; the
new tokens' K/V from the step's contiguous tensors, the prefix from the paged cache); the
other rows of the step (decodes, short chunks) run on
:func:`surge.kernels.paged_attention.paged_attention`, which skips the rows the prefill kernel
took. Both kernels read an FP8 cache (dequantized in registers with the layer's scales). A pure decode step
(``max_query_len == 1``) takes the kernel's decode grid (one program per sequence and KV
head), and small decode batches take the split-KV (flash-decoding) path, each sequence
using only the splits its own context needs; its last split merges them (after
:meth:`TritonAttentionBackend.reserve`; otherwise a reduce kernel does). Every host-side choice is
made from host ints already in :class:`AttentionMetadata` and tensor shapes, so a forward
never syncs with the GPU and is safe inside CUDA-graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from surge.kernels.kv_write import RopeKvWrite, write_kv_cache
from surge.kernels.paged_attention import choose_num_splits, decode_rope_supported, paged_attention
from surge.kernels.prefill_attention import PrefillTileConfig, prefill_attention, prefill_supported
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata

_DEFAULT_NUM_SMS = 132  # H100/H200; used when no CUDA device is visible (interpreter tests)

SPLIT_PREFILL_MAX_TOKENS = 128
"""Largest step (tokens) with prefill rows that may take the split-KV path."""
SPLIT_PREFILL_MIN_CONTEXT = 1024
"""Shortest longest-context (tokens) of such a step that splits."""
SPLIT_PREFILL_NUM_SPLITS = 16
"""KV splits of such a step (an empty split costs one store and its share of the reduce)."""
DECODE_ROPE_MAX_SEQS = 2
"""Largest decode step (sequences) whose q/k norm, rotary and K/V write run inside the decode
attention kernel. Measured on the H200 (Qwen3-8B, FP8 weights, ``benchmarks/decode_step_sweep.py``,
``benchmarks/results/h200-qwen3-8b-fp8/decode-rope/``): over 4096-token contexts the step is 1.9 %
shorter at 1 and 2 sequences but 3.5 % longer at 4 and 11 % at 16 (each of the split-KV grid's
programs rotates its query before its first dot, and the programs of a larger grid run in
several waves); over short contexts it gains 1.4-2.1 % up to 16 sequences and nothing at 32-64."""


def _on(t: torch.Tensor, device: torch.device | str) -> bool:
    """Whether ``t`` lives on ``device`` (a device without an index matches any of its type)."""
    d = torch.device(device)
    return t.device.type == d.type and (d.index is None or t.device.index == d.index)


@dataclass(frozen=True)
class PrefillKernelChoice:
    """Which rows take the prefill kernel, and its tiles.

    Attributes:
        enabled: False runs every row on the paged kernel (the previous behaviour).
        min_query_len: sequences with at least this many new tokens take the prefill
            kernel; shorter ones (decodes, short chunks) stay on the paged kernel, which
            packs a KV head's query heads into one tile and is the faster one there.
        tile: the prefill kernel's tile shape and launch parameters; None picks them by
            head size, dtype and cache dtype
            (:func:`surge.kernels.prefill_attention.default_prefill_tile`).
    """

    enabled: bool = True
    min_query_len: int = 64
    tile: PrefillTileConfig | None = None

    def __post_init__(self) -> None:
        if self.min_query_len < 2:
            raise ValueError(f"min_query_len must be >= 2, got {self.min_query_len}")


class TritonAttentionBackend(AttentionBackend):
    """:class:`AttentionBackend` on Triton kernels (GPU, or CPU under ``TRITON_INTERPRET=1``).

    Args:
        num_sms: streaming multiprocessors used by the split-KV heuristic; read from the
            current CUDA device when None.
        max_num_splits: upper bound on KV splits per (sequence, KV head).
        split_kv: False disables the split-KV path (always one pass).
        prefill: which sequences take the prefill kernel (default
            :class:`PrefillKernelChoice`).
        decode_rope_max_seqs: largest decode step (sequences) that runs a layer's q/k norm,
            rotary and K/V write inside the decode attention kernel (0: never); default
            :data:`DECODE_ROPE_MAX_SEQS`.
        inline_split_reduce: on split-KV decode steps, let the attention kernel's last split
            merge the partials instead of a reduce launch, once :meth:`reserve` has allocated
            its counters (False: always the reduce kernel).

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

    def __init__(
        self,
        num_sms: int | None = None,
        max_num_splits: int = 32,
        split_kv: bool = True,
        prefill: PrefillKernelChoice | None = None,
        decode_rope_max_seqs: int = DECODE_ROPE_MAX_SEQS,
        inline_split_reduce: bool = True,
    ) -> None:
        if num_sms is None:
            num_sms = (
                torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
                if torch.cuda.is_available()
                else _DEFAULT_NUM_SMS
            )
        self.num_sms = num_sms
        self.max_num_splits = max_num_splits
        self.split_kv = split_kv
        self.prefill = prefill or PrefillKernelChoice()
        self.decode_rope_max_seqs = decode_rope_max_seqs
        self.inline_split_reduce = inline_split_reduce
        self._split_counters: torch.Tensor | None = None

    def reserve(self, max_num_seqs: int, num_kv_heads: int, device: torch.device) -> None:
        """See :meth:`AttentionBackend.reserve`: the split-KV decode grid's arrival counters
        (int32, ``max_num_seqs * num_kv_heads``, zero), so that its last split merges the
        partials in place of the reduce launch (``split_counters`` of :func:`paged_attention`);
        a decode step of more sequences than reserved keeps the reduce kernel. A no-op when
        :attr:`inline_split_reduce` is off, or when the counters already reserved cover the
        request (captured graphs hold them, so they are never replaced).

        Raises:
            ValueError: ``max_num_seqs`` or ``num_kv_heads`` below 1, or counters already
                reserved on another device or smaller than this request.
        """
        if max_num_seqs < 1 or num_kv_heads < 1:
            raise ValueError(
                f"max_num_seqs and num_kv_heads must be >= 1, got {max_num_seqs}, {num_kv_heads}"
            )
        if not self.inline_split_reduce:
            return
        need = max_num_seqs * num_kv_heads
        c = self._split_counters
        if c is None:
            self._split_counters = torch.zeros(need, dtype=torch.int32, device=device)
        elif not _on(c, device) or c.numel() < need:
            raise ValueError(
                f"split counters already reserved ({c.numel()} on {c.device}); cannot grow to {need} on {device}"
            )

    def _counters_for(self, num_seqs: int, num_kv_heads: int, device: torch.device) -> torch.Tensor | None:
        """The reserved counters when they cover ``num_seqs`` x ``num_kv_heads`` on ``device``."""
        c = self._split_counters
        if c is None or c.device != device or c.numel() < num_seqs * num_kv_heads:
            return None
        return c

    def fuses_decode_rope(self, num_seqs: int) -> bool:
        """See :meth:`AttentionBackend.fuses_decode_rope`: up to :attr:`decode_rope_max_seqs`."""
        return num_seqs <= self.decode_rope_max_seqs

    def num_splits(self, metadata: AttentionMetadata, num_kv_heads: int) -> int:
        """KV splits for this step (1 = single pass), from host-side metadata only.

        Pure decode steps follow :func:`choose_num_splits`. A small step with longer queries
        (at most :data:`SPLIT_PREFILL_MAX_TOKENS` tokens, e.g. the last block of a prompt
        found in the prefix cache) over a context of at least
        :data:`SPLIT_PREFILL_MIN_CONTEXT` tokens has too few programs on the paged kernel's
        mixed grid to stream its KV: it takes :data:`SPLIT_PREFILL_NUM_SPLITS` splits (one
        fixed count, so one kernel variant per tile, compiled at warm-up).
        """
        if not self.split_kv:
            return 1
        if metadata.max_query_len != 1:
            small = metadata.num_tokens <= SPLIT_PREFILL_MAX_TOKENS
            few_programs = metadata.seq_lens.shape[0] * num_kv_heads < self.num_sms
            if small and few_programs and metadata.max_seq_len >= SPLIT_PREFILL_MIN_CONTEXT:
                return min(SPLIT_PREFILL_NUM_SPLITS, self.max_num_splits)
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
        rope: RopeKvWrite | None = None,
    ) -> torch.Tensor:
        """See :meth:`AttentionBackend.forward`.

        ``q``/``k``/``v`` need a contiguous last dimension and the caches ``q``'s dtype or
        float8_e4m3fn.
        Padding rows (beyond ``query_start_loc[-1]``) are unspecified. With ``rope``, a
        decode step of :attr:`AttentionMetadata.independent_rows` (not decode form) of at most
        :data:`DECODE_ROPE_MAX_SEQS` sequences with a power-of-two head size leaves the norm,
        rotary and K/V write to the decode grid of :func:`paged_attention`, one launch less;
        any other step runs :meth:`RopeKvWrite.apply` first.
        """
        n = metadata.num_tokens
        fuse = (
            rope is not None
            and metadata.max_query_len == 1
            and metadata.independent_rows
            and self.fuses_decode_rope(metadata.num_seqs)
            and decode_rope_supported(q, k_cache)
        )
        if rope is not None and not fuse:
            rope.apply(q, k_cache, v_cache, k_scale, v_scale)
        if write_kv:
            write_kv_cache(k, v, k_cache, v_cache, metadata.slot_mapping[:n], k_scale, v_scale)
        pf = self.prefill
        if pf.enabled and metadata.max_query_len >= pf.min_query_len and prefill_supported(q, k_cache):
            return self._prefill_forward(q, k, v, k_cache, v_cache, metadata, scale, k_scale, v_scale)
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
            rope=rope if fuse else None,
            split_counters=(
                self._counters_for(metadata.seq_lens.shape[0], k_cache.shape[2], q.device)
                if metadata.max_query_len == 1
                else None
            ),
        )

    def _prefill_forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        k_scale: float,
        v_scale: float,
    ) -> torch.Tensor:
        """The long sequences on the prefill kernel, then (unless the step has none) the
        short ones on the paged kernel's mixed grid, into one output."""
        threshold = self.prefill.min_query_len
        out = prefill_attention(
            q,
            k,
            v,
            k_cache,
            v_cache,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            scale,
            min_query_len=threshold,
            config=self.prefill.tile,
            k_scale=k_scale,
            v_scale=v_scale,
        )
        if metadata.min_query_len < threshold:  # 0: unknown
            paged_attention(
                q,
                k_cache,
                v_cache,
                metadata.query_start_loc,
                metadata.seq_lens,
                metadata.block_table,
                scale,
                out,
                max_query_len=max(2, min(metadata.max_query_len, threshold - 1)),
                skip_query_len=threshold,
                k_scale=k_scale,
                v_scale=v_scale,
            )
        return out
