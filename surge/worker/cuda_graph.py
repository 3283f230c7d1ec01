"""CUDA graphs of the decode forward, one per batch-size bucket.

A pure-decode step (every scheduled request has one new token) of ``B`` sequences replays
the graph of the smallest bucket ``Bk >= B`` (buckets 1, 2, 4, 8, then steps of 8 up to
``max_num_seqs``), with the inputs padded to ``Bk`` rows (see
:class:`surge.worker.input_batch.PreparedInputs`: padding tokens write no K/V, padding
sequences have ``q_len`` 0 and read nothing). A small prefill or mixed step of ``T`` tokens
replays the graph of bucket ``>= T`` in decode form (one decode row per token, see
:mod:`surge.worker.decode_form`); larger steps run eagerly.

What a graph holds: the model forward from the embedding through the decoder layers to
the final norm, output ``hidden [Bk, hidden_size]``. The LM head and the sampler stay
eager: they are launched while the graph runs on the device (the host is not on the
critical path for them), and capturing the logits would keep a ``[Bk, vocab]`` float32
output per graph (155 MB at ``Bk`` = 256 for Qwen3's vocabulary) in the shared pool.

Every graph reads one set of persistent static buffers (token ids, positions, slot
mapping, ``query_start_loc``, ``seq_lens`` and a full-width block table
``[max_bucket, ceil(max_model_len / block_size)]``), and all graphs share one memory pool,
captured largest bucket first after a warm-up run of that bucket (as vLLM does,
Apache-2.0). The attention backend is graph safe when it neither syncs with the host nor
decides anything from data that changes between replays: the Triton backend decides its
split-KV count from ``metadata.max_seq_len``, so capture passes ``max_model_len`` there
(any split count is correct for shorter contexts).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

from surge.config import EngineConfig
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.worker.input_batch import PreparedInputs

CUDA_GRAPH_MEMORY_RESERVE = 512 * 1024 * 1024
"""Bytes kept out of the KV pool for the graphs' shared memory pool: the decode graphs'
(activations of the largest bucket and split-KV partials; tens of MB for Qwen3-8B at 256 rows)
and, at tensor-parallel size 1, the piecewise graphs' (:mod:`surge.worker.piecewise_graph`;
for bf16 Qwen3-8B at the 1024-token bucket about 90 MB live inside one piece, plus the kept
outputs of all buckets, about 45 MB, by the tensor sizes: not measured on the GPU)."""

ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def decode_buckets(max_num_seqs: int, max_num_tokens: int | None = None) -> list[int]:
    """Batch-size buckets: 1, 2, 4, 8, then multiples of 8, and ``max_num_seqs`` itself.

    Args:
        max_num_seqs: most sequences of a step.
        max_num_tokens: the step's token budget; no bucket exceeds it.

    Returns:
        Sorted distinct bucket sizes, e.g. ``[1, 2, 4, 8, 16, 24, ..., 256]``.
    """
    top = max_num_seqs if max_num_tokens is None else min(max_num_seqs, max_num_tokens)
    sizes = {b for b in (1, 2, 4) if b <= top} | set(range(8, top + 1, 8)) | {top}
    return sorted(sizes)


def pick_bucket(buckets: list[int], num_seqs: int) -> int | None:
    """The smallest bucket ``>= num_seqs``, or None when ``num_seqs`` exceeds every bucket."""
    i = bisect.bisect_left(buckets, num_seqs)
    return buckets[i] if i < len(buckets) else None


def backend_is_graph_safe(backend: AttentionBackend) -> bool:
    """Whether ``backend`` may run inside CUDA-graph capture.

    A backend says so with its ``cuda_graph_safe`` attribute: the Triton backend (fixed
    grids, no host syncs, host hints only) is safe; the torch reference backend loops over
    host lists and indexes with masks (host syncs), so it never is.
    """
    return backend.cuda_graph_safe


def use_cuda_graphs(config: EngineConfig, backend: AttentionBackend) -> bool:
    """CUDA graphs for decode: on a CUDA device, unless ``config.enforce_eager``, with a
    graph-safe backend. CPU always runs eagerly."""
    return config.device.startswith("cuda") and not config.enforce_eager and backend_is_graph_safe(backend)


class DecodeGraphRunner:
    """Captures and replays the decode forward per bucket over persistent static inputs.

    Args:
        forward: ``(input_ids [T], positions [T], metadata) -> hidden [T, hidden_size]``; it
            must read nothing but its arguments and tensors whose addresses never change
            (weights, KV caches).
        device: the model's device.
        buckets: bucket sizes (see :func:`decode_buckets`).
        max_blocks_per_seq: the block table's full width, ``ceil(max_model_len / block_size)``.
        max_model_len: longest context a replay may see, in tokens (the attention
            backend's split-KV choice is fixed for it at capture).
        use_graphs: False runs the same static-buffer path eagerly, without capture (for
            tests on CPU, and the torch reference backend).
        capture_error_mode: ``torch.cuda.graph``'s; "thread_local" under tensor parallelism,
            so that CUDA calls of the NCCL watchdog thread cannot invalidate a capture of the
            forward's all-reduces.
        independent_buckets: which buckets also get a graph captured with
            :attr:`~surge.layers.attention_backend.AttentionMetadata.independent_rows` (the
            backend's :meth:`~surge.layers.attention_backend.AttentionBackend.fuses_decode_rope`):
            a step of such a bucket with ``PreparedInputs.independent_rows`` replays that one,
            any other (decode form, whose rows read each other's new K/V, or rows of which one
            completes a block that another may hold) the graph that writes K/V in a launch
            before attention.
        short_context: for a bucket, a context length in tokens (or None): that bucket also
            gets a graph captured with it as ``max_seq_len``, which a step whose longest
            context is at most that long replays (the forward may take a path that only
            short contexts gain from: the FP8 stream kernel's own attention,
            :data:`~surge.layers.stream_decode.FUSED_ATTENTION_MAX_LEN`). Asked at
            :meth:`capture`, once the forward's paths are set.

    Attributes:
        token_i64: ``[3, max_bucket]`` int64 static rows: input ids, positions, slot mapping.
        seq_i32: ``[2, >= max_bucket + 1]`` int32 static rows: ``query_start_loc``, ``seq_lens``.
        block_table: ``[max_bucket, max_blocks_per_seq]`` int32 static block table.
        capture_stream: the stream :meth:`capture` used (None before it).
        independent: the buckets captured twice (see ``independent_buckets``).
        short: bucket -> the context length of its short-context graph (see
            ``short_context``; filled by :meth:`capture`).
    """

    def __init__(
        self,
        forward: ForwardFn,
        device: torch.device,
        buckets: list[int],
        max_blocks_per_seq: int,
        max_model_len: int,
        use_graphs: bool = True,
        capture_error_mode: str = "global",
        independent_buckets: Callable[[int], bool] | None = None,
        short_context: Callable[[int], int | None] | None = None,
    ) -> None:
        self.forward = forward
        # buckets whose true decode steps (AttentionMetadata.independent_rows) get a graph of
        # their own, apart from the decode-form steps' (the backend fuses work into attention)
        self.independent = [b for b in buckets if independent_buckets is not None and independent_buckets(b)]
        self.capture_error_mode = capture_error_mode
        self.device = device
        self.buckets = buckets
        self.max_model_len = max_model_len
        self.use_graphs = use_graphs
        top = buckets[-1]
        self.token_i64 = torch.zeros(3, top, dtype=torch.int64, device=device)
        # Rows a multiple of 4 long: both start 16-byte aligned.
        self.seq_i32 = torch.zeros(2, -(-(top + 1) // 4) * 4, dtype=torch.int32, device=device)
        self.block_table = torch.zeros(top, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.short_context = short_context
        self.short: dict[int, int] = {}
        self._graphs: dict[tuple[int, bool, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: tuple[int, int] | None = None
        self.capture_stream: torch.cuda.Stream | None = None

    @property
    def max_bucket(self) -> int:
        """The largest batch bucket (sequences)."""
        return self.buckets[-1]

    @property
    def captured(self) -> list[int]:
        """Buckets with a captured graph."""
        return sorted({key[0] for key in self._graphs})

    def bucket_for(self, num_seqs: int) -> int | None:
        """The bucket a pure-decode step of ``num_seqs`` sequences runs in (None: eager)."""
        return pick_bucket(self.buckets, num_seqs)

    def _metadata(
        self,
        bucket: int,
        max_seq_len: int,
        query_start_loc_cpu: list[int],
        seq_lens_cpu: list[int],
        independent: bool = False,
    ) -> AttentionMetadata:
        return AttentionMetadata(
            num_tokens=bucket,
            num_seqs=bucket,
            query_start_loc=self.seq_i32[0, : bucket + 1],
            seq_lens=self.seq_i32[1, :bucket],
            block_table=self.block_table[:bucket],
            slot_mapping=self.token_i64[2, :bucket],
            max_query_len=1,
            max_seq_len=max_seq_len,
            query_start_loc_cpu=query_start_loc_cpu,
            seq_lens_cpu=seq_lens_cpu,
            independent_rows=independent,
        )

    def _reset_static(self, bucket: int) -> None:
        """Harmless inputs for warm-up: one token per sequence at position 0 reading block
        0 (context 1), writing nothing (slot -1)."""
        self.token_i64[:2].zero_()
        self.token_i64[2].fill_(-1)
        self.seq_i32[0].copy_(torch.arange(self.seq_i32.shape[1], dtype=torch.int32, device=self.device))
        self.seq_i32[1].fill_(1)
        self.block_table[:bucket].zero_()

    def capture(
        self,
        num_warmup: int = 1,
        stream: torch.cuda.Stream | None = None,
        pool: tuple[int, int] | None = None,
    ) -> None:
        """Warm up and capture every bucket, largest first, into one shared memory pool.

        Without ``use_graphs`` this does nothing. The KV caches the forward reads must be
        allocated before and never reallocated after. Reads and writes of the cache during
        warm-up: block 0 is read, nothing is written.

        Args:
            num_warmup: eager runs of each bucket before its capture.
            stream, pool: the capture stream and memory pool, when other graphs of the process
                share them (:meth:`surge.worker.model_runner.ModelRunner.init_kv_cache`); a new
                stream and pool when None.
        """
        self.short = {}
        for bucket in self.buckets:
            length = None if self.short_context is None else self.short_context(bucket)
            if length is not None and length < self.max_model_len:
                self.short[bucket] = length
        if not self.use_graphs:
            return
        self._pool = torch.cuda.graph_pool_handle() if pool is None else pool
        stream = torch.cuda.Stream(device=self.device) if stream is None else stream
        self.capture_stream = stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(stream):
            for bucket in reversed(self.buckets):
                variants = [
                    (independent, short)
                    for independent in ((False, True) if bucket in self.independent else (False,))
                    for short in ((False, True) if bucket in self.short else (False,))
                ]
                for independent, short in variants:
                    self._reset_static(bucket)
                    longest = self.short[bucket] if short else self.max_model_len
                    md = self._metadata(bucket, longest, list(range(bucket + 1)), [1] * bucket, independent)
                    ids, pos = self.token_i64[0, :bucket], self.token_i64[1, :bucket]
                    for _ in range(num_warmup):
                        self.forward(ids, pos, md)
                    stream.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(
                        graph, pool=self._pool, stream=stream, capture_error_mode=self.capture_error_mode
                    ):
                        out = self.forward(ids, pos, md)
                    self._graphs[bucket, independent, short] = (graph, out)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def fill(self, inputs: PreparedInputs) -> None:
        """Copy a padded decode step's device inputs into the static buffers (three
        device-to-device copies; padding rows come padded from ``inputs``).

        Raises:
            ValueError: ``inputs`` is not padded to a bucket.
        """
        bucket = inputs.padded_seqs
        if bucket not in self.buckets or inputs.padded_tokens != bucket:
            raise ValueError(f"inputs of {inputs.padded_seqs} rows are not padded to a bucket {self.buckets}")
        self.token_i64[:, :bucket].copy_(inputs.token_i64, non_blocking=True)
        self.seq_i32[:, : bucket + 1].copy_(inputs.seq_i32[:, : bucket + 1], non_blocking=True)
        width = inputs.block_table.shape[1]
        self.block_table[: inputs.num_seqs, :width].copy_(inputs.block_table, non_blocking=True)

    def run(self, inputs: PreparedInputs) -> torch.Tensor:
        """Fill the static buffers and replay the bucket's graph (its short-context one when
        ``inputs.max_seq_len`` fits it), or run the forward eagerly on the static buffers, as
        captured, when not captured.

        Returns:
            ``hidden [bucket, hidden_size]``; rows ``>= inputs.num_tokens`` are padding. With
            graphs the tensor is the graph's static output, valid until the next replay.
        """
        self.fill(inputs)
        bucket = inputs.padded_seqs
        independent = inputs.independent_rows and bucket in self.independent
        short = bucket in self.short and inputs.max_seq_len <= self.short[bucket]
        entry = self._graphs.get((bucket, independent, short))
        if entry is not None:
            entry[0].replay()
            return entry[1]
        # As captured: the backend sees max_model_len (or the short graph's length) as the longest context.
        longest = self.short[bucket] if short else self.max_model_len
        md = self._metadata(bucket, longest, inputs.query_start_loc_cpu, inputs.seq_lens_cpu, independent)
        return self.forward(self.token_i64[0, :bucket], self.token_i64[1, :bucket], md)
