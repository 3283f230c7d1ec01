"""Piecewise CUDA graphs of the forward for prefill and mixed steps (eager layout).

A step that is neither pure decode nor small enough for decode form
(:mod:`surge.worker.decode_form`) runs the model eagerly: some 15 Triton and torch launches per
layer, each costing the host tens of microseconds. For Qwen3-8B that is about 17 ms of host
time per step whatever its size, while the GPU needs about 4 ms for 256 tokens and 26 ms for
2048 (H200, FP8): a 256-token prompt's first token took 21 ms in the engine, and a burst of
short prompts spent 25 ms per mixed step (``benchmarks/results/h200-qwen3-8b-fp8/``).

Here a step of ``T`` tokens (``T`` at most the largest bucket, :func:`piecewise_buckets`) is
padded to the smallest token bucket ``Tb >= T`` and replayed as ``L + 1`` CUDA graphs with
the ``L`` attention calls run eagerly between them (the layout vLLM's piecewise graphs use,
Apache-2.0; Surge captures the pieces itself, without torch.compile). A graph holds everything
between two attention cores: the embedding or the previous layer's o projection, residual
adds, norms, the MLP, the qkv projection and the fused q/k norm + rotary + K/V write. The
attention core's grid depends on the step's sequences (their number and query lengths), so
it stays eager; it reads the step's own metadata.

How the pieces are cut: the forward runs once under capture with a :class:`_SplittingBackend`
in place of the attention backend. At each attention call it copies ``q``, ``k``, ``v`` into
static buffers (those copies are captured), ends the current graph, records the call (layer
caches and scales) and begins the next graph; it returns a static output buffer that the next
graph reads. At replay the runner replays graph ``i``, runs attention ``i`` on the static
``q``/``k``/``v`` with the step's metadata into the static output, and so on. Every layer
shares the four static buffers (the pieces run in stream order), so they cost
``Tb x (2 q + 2 kv) x head_dim`` elements once, not per layer.

Padding rows have token id 0, position 0 and slot -1 (no K/V is written); attention writes
only the real rows of the output buffer, and the padding rows' hidden states are never read.
Only tensor-parallel size 1 uses these graphs (the all-reduces of a larger group are not
captured here). All buckets are captured largest first, on the decode graphs' capture stream and
into their memory pool (:meth:`surge.worker.model_runner.ModelRunner.init_kv_cache`): captured on
a second stream, they cost every decode step its PDL overlap (3.46 -> 3.60 ms at batch 1, FP8
Qwen3-8B on an H200).
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.worker.cuda_graph import pick_bucket
from surge.worker.input_batch import PreparedInputs

if TYPE_CHECKING:
    from surge.kernels.kv_write import RopeKvWrite

PIECEWISE_MAX_TOKENS = 1024
"""Largest step (tokens) replayed through piecewise graphs. Around it an eager Qwen3-8B step
becomes GPU-bound, so graphs stop paying (``benchmarks/prefill_step_timing.py`` on an H200: FP8
1024 tokens 17.1 ms in pieces against 22.3 ms eager, 1536 tokens 25.5 against 25.0; bf16 1024
tokens 24.9 against 25.2)."""

ForwardWithBackend = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, AttentionBackend], torch.Tensor]


def piecewise_buckets(max_num_batched_tokens: int, max_tokens: int = PIECEWISE_MAX_TOKENS) -> list[int]:
    """Token buckets of the piecewise graphs.

    Args:
        max_num_batched_tokens: the step's token budget; no bucket exceeds it.
        max_tokens: the largest bucket wanted (:data:`PIECEWISE_MAX_TOKENS`).

    Returns:
        Sorted distinct sizes: 16, 32, 64, 128, then steps of 64 to 512 and of 128 to 1024,
        cut at ``min(max_tokens, max_num_batched_tokens)``, which is itself a
        bucket when it falls between two of them (a step of more than 192 tokens pads by
        less than a quarter of its bucket).
    """
    top = min(max_tokens, max_num_batched_tokens)
    grid = [16, 32, 64, 128, *range(192, 513, 64), *range(640, 1025, 128)]
    sizes = {b for b in grid if b <= top}
    if top > 0:
        sizes.add(top)
    return sorted(sizes)


@dataclass(frozen=True)
class _AttentionCall:
    """One layer's attention core as recorded at capture: everything but the step's metadata."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    scale: float
    write_kv: bool
    k_scale: float
    v_scale: float


@dataclass
class _Captured:
    graphs: list[torch.cuda.CUDAGraph]
    calls: list[_AttentionCall]
    hidden: torch.Tensor


class _SplittingBackend(AttentionBackend):
    """The attention backend the forward sees while the runner warms up or captures.

    Each call copies ``q``/``k``/``v`` into the runner's static buffers, hands the call to the
    runner (which ends one graph and begins the next, or runs attention at once when not
    capturing) and returns the static output buffer's first ``T`` rows.
    """

    name = "piecewise"
    cuda_graph_safe = True

    def __init__(self, runner: PiecewiseGraphRunner) -> None:
        self.runner = runner
        self.fuses_rope_kv_write = runner.backend.fuses_rope_kv_write

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
        r = self.runner
        t = q.shape[0]
        if rope is not None:  # inside the piece being captured, as the layer ran it before
            rope.apply(q, k_cache, v_cache, k_scale, v_scale)
        if q.shape[1:] != r.q.shape[1:] or k.shape[1:] != r.k.shape[1:] or v.shape[1:] != r.v.shape[1:]:
            raise ValueError(
                f"attention shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match the "
                f"piecewise buffers {tuple(r.q.shape[1:])}, {tuple(r.k.shape[1:])}"
            )
        r.q[:t].copy_(q)
        r.k[:t].copy_(k)
        r.v[:t].copy_(v)
        r._on_attention(_AttentionCall(k_cache, v_cache, scale, write_kv, k_scale, v_scale))
        return r.out[:t]


class PiecewiseGraphRunner:
    """Captures and replays the forward of eager-layout steps per token bucket, in pieces.

    Args:
        forward: ``(input_ids [T], positions [T], metadata, backend) -> hidden [T, hidden_size]``
            over the model's caches; it must read nothing but its arguments and tensors whose
            addresses never change (weights, KV caches), and call ``backend.forward`` once per
            layer.
        backend: the attention backend the eager calls between the graphs use.
        device: the model's device.
        buckets: token bucket sizes (:func:`piecewise_buckets`).
        num_heads, num_kv_heads, head_dim: one layer's query heads, KV heads and head size.
        dtype: the activations' dtype (the model's).
        use_graphs: False runs the same pieces eagerly over the static buffers, without
            capture (CPU tests).

    Attributes:
        token_i64: ``[3, max_bucket]`` int64 static rows: input ids, positions, slot mapping.
        q, k, v, out: ``[max_bucket, heads, head_dim]`` static attention inputs and output.
        replays: steps run through :meth:`run` (for tests and step accounting).
        capture_stream: the stream :meth:`capture` used (None before it).
    """

    def __init__(
        self,
        forward: ForwardWithBackend,
        backend: AttentionBackend,
        device: torch.device,
        buckets: list[int],
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        use_graphs: bool = True,
    ) -> None:
        if not buckets:
            raise ValueError("piecewise graphs need at least one token bucket")
        self.forward = forward
        self.backend = backend
        self.device = device
        self.buckets = buckets
        self.use_graphs = use_graphs
        top = buckets[-1]
        self.token_i64 = torch.zeros(3, top, dtype=torch.int64, device=device)
        self._pad = torch.zeros(3, top, dtype=torch.int64, device=device)
        self._pad[2].fill_(-1)
        self.q = torch.zeros(top, num_heads, head_dim, dtype=dtype, device=device)
        self.k = torch.zeros(top, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros(top, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.out = torch.zeros(top, num_heads, head_dim, dtype=dtype, device=device)
        self._splitter = _SplittingBackend(self)
        self._graphs: dict[int, _Captured] = {}
        self._calls: list[_AttentionCall] = []
        self._pieces: list[torch.cuda.CUDAGraph] = []
        self._capturing: torch.cuda.CUDAGraph | None = None
        self._pool: tuple[int, int] | None = None
        self._step_metadata: AttentionMetadata | None = None
        self.capture_stream: torch.cuda.Stream | None = None
        self.replays = 0

    @property
    def max_bucket(self) -> int:
        """The largest token bucket (the longest step these graphs take)."""
        return self.buckets[-1]

    @property
    def captured(self) -> list[int]:
        """Buckets with captured graphs."""
        return sorted(self._graphs)

    def bucket_for(self, num_tokens: int) -> int | None:
        """The bucket an eager-layout step of ``num_tokens`` tokens replays (None: eager)."""
        return pick_bucket(self.buckets, num_tokens)

    # ----------------------------------------------------------------- the attention calls

    def _on_attention(self, call: _AttentionCall) -> None:
        """At capture: end this piece, begin the next. Otherwise: attend now over the step's
        metadata (warm-up, or ``use_graphs=False``)."""
        graph = self._capturing
        if graph is not None:
            graph.capture_end()
            self._capturing = None  # ended: not ended again if the next begin fails
            self._pieces.append(graph)
            self._calls.append(call)
            self._capturing = self._begin()
            return
        md = self._step_metadata
        assert md is not None, "an attention call outside run() or capture()"
        self._attend(call, md)

    def _attend(self, call: _AttentionCall, md: AttentionMetadata) -> None:
        n = md.num_tokens
        out = self.backend.forward(
            self.q[:n],
            self.k[:n],
            self.v[:n],
            call.k_cache,
            call.v_cache,
            md,
            call.scale,
            call.write_kv,
            call.k_scale,
            call.v_scale,
        )
        self.out[:n].copy_(out[:n])

    def _begin(self) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=self._pool)
        return graph

    # ----------------------------------------------------------------- capture

    def _warmup_metadata(self, bucket: int) -> AttentionMetadata:
        """One token per sequence at position 0 over block 0 (context 1), slot -1: attention
        reads block 0 and nothing is written."""
        dev = self.device
        return AttentionMetadata(
            num_tokens=bucket,
            num_seqs=bucket,
            query_start_loc=torch.arange(bucket + 1, dtype=torch.int32, device=dev),
            seq_lens=torch.ones(bucket, dtype=torch.int32, device=dev),
            block_table=torch.zeros(bucket, 1, dtype=torch.int32, device=dev),
            slot_mapping=self.token_i64[2, :bucket],
            max_query_len=1,
            max_seq_len=1,
            query_start_loc_cpu=list(range(bucket + 1)),
            seq_lens_cpu=[1] * bucket,
            min_query_len=1,
        )

    def capture(self, stream: torch.cuda.Stream | None = None, pool: tuple[int, int] | None = None) -> None:
        """Warm up and capture every bucket, largest first, into one shared memory pool.

        Without ``use_graphs`` this does nothing. The KV caches must be allocated before and
        never reallocated after. Warm-up reads block 0 of every cache and writes nothing.

        Args:
            stream, pool: the capture stream and memory pool, shared with the decode graphs
                (:meth:`surge.worker.model_runner.ModelRunner.init_kv_cache`); a new stream and
                pool when None.

        Raises:
            RuntimeError: CUDA graph capture failed (the capture is ended first).
        """
        if not self.use_graphs:
            return
        torch.cuda.synchronize(self.device)
        gc.collect()
        torch.cuda.empty_cache()
        self._pool = torch.cuda.graph_pool_handle() if pool is None else pool
        stream = torch.cuda.Stream(device=self.device) if stream is None else stream
        self.capture_stream = stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode(), torch.cuda.stream(stream):
            for bucket in reversed(self.buckets):
                self._capture_bucket(bucket, stream)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)

    def _capture_bucket(self, bucket: int, stream: torch.cuda.Stream) -> None:
        self.token_i64[:, :bucket].copy_(self._pad[:, :bucket])
        md = self._warmup_metadata(bucket)
        ids, pos = self.token_i64[0, :bucket], self.token_i64[1, :bucket]
        self._step_metadata = md
        try:
            self.forward(ids, pos, md, self._splitter)  # warm-up: compiles, sizes the pool
        finally:
            self._step_metadata = None
        stream.synchronize()
        self._pieces, self._calls = [], []
        self._capturing = self._begin()
        try:
            hidden = self.forward(ids, pos, md, self._splitter)
        except BaseException:
            if self._capturing is not None:
                self._capturing.capture_end()
            raise
        finally:
            last, self._capturing = self._capturing, None
        assert last is not None
        last.capture_end()
        self._pieces.append(last)
        self._graphs[bucket] = _Captured(self._pieces, self._calls, hidden)
        self._pieces, self._calls = [], []

    # ----------------------------------------------------------------- replay

    def fill(self, inputs: PreparedInputs, bucket: int) -> None:
        """Copy an eager-layout step's token rows into the static buffers and pad them to
        ``bucket`` rows (id 0, position 0, slot -1): two device copies."""
        n = inputs.num_tokens
        self.token_i64[:, :n].copy_(inputs.token_i64[:, :n], non_blocking=True)
        if bucket > n:
            self.token_i64[:, n:bucket].copy_(self._pad[:, n:bucket], non_blocking=True)

    def run(self, inputs: PreparedInputs, metadata: AttentionMetadata) -> torch.Tensor:
        """Run an eager-layout step through its bucket's pieces.

        Args:
            inputs: the step's unpadded device inputs (eager layout, not decode form).
            metadata: the step's attention metadata over its real ``num_tokens`` rows.

        Returns:
            ``hidden [bucket, hidden_size]``: rows ``>= inputs.num_tokens`` are padding. With
            graphs the tensor is the last graph's static output, valid until its next replay.

        Raises:
            ValueError: the step is in decode form, or larger than every bucket.
        """
        bucket = self.bucket_for(inputs.num_tokens)
        if bucket is None or inputs.decode_form:
            raise ValueError(
                f"a step of {inputs.num_tokens} tokens (decode form: {inputs.decode_form}) has no piecewise "
                f"bucket {self.buckets}"
            )
        self.fill(inputs, bucket)
        self.replays += 1
        entry = self._graphs.get(bucket)
        if entry is None:  # not captured: the same pieces, eagerly
            # The layers see the padded slot row, as captured; attention sees the real step.
            padded = dataclasses.replace(metadata, slot_mapping=self.token_i64[2, :bucket])
            self._step_metadata = metadata
            try:
                return self.forward(
                    self.token_i64[0, :bucket], self.token_i64[1, :bucket], padded, self._splitter
                )
            finally:
                self._step_metadata = None
        for graph, call in zip(entry.graphs, entry.calls, strict=False):
            graph.replay()
            self._attend(call, metadata)
        entry.graphs[-1].replay()
        return entry.hidden
