"""ModelRunner: SchedulerOutput -> input tensors -> forward -> logits -> sampled tokens.

The GPU hot path: inputs are prepared on the host with numpy into one pinned buffer and
copied with one ``non_blocking`` copy (:mod:`surge.worker.input_batch`); pure-decode steps
replay a CUDA graph of their batch-size bucket (:mod:`surge.worker.cuda_graph`), and so do
small prefill and mixed steps laid out as one decode row per token
(:mod:`surge.worker.decode_form`; not when a request wants prompt logprobs); larger prefill
and mixed steps up to 1024 tokens replay piecewise graphs with attention run eagerly between
them (:mod:`surge.worker.piecewise_graph`); all-greedy
batches sample with one argmax, and other batches reuse their sampling tensors while the
batch composition is unchanged. The only host sync of a step is the copy of the sampled
ids back. Logprobs (:mod:`surge.worker.logprobs`) are computed eagerly after the forward,
only for the rows that ask, and copied back with the sampled ids.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import msgspec
import numpy as np
import torch

from surge.config import EngineConfig
from surge.core.outputs import ModelOutput, SchedulerOutput
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.layers.sampler import Sampler, SamplingMetadata
from surge.layers.stream_decode import bind_stream_kv, enable_stream_decode
from surge.layers.top_k_top_p import warm_up_sample_top_k_window
from surge.layers.torch_attention import TorchAttentionBackend
from surge.model.loader import load_model
from surge.parallel.communicator import TPCommunicator, attach_communicator
from surge.quant.config import require_fp8_gpu
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.structured.bitmask import warm_up_token_bitmask
from surge.worker.cuda_graph import (
    CUDA_GRAPH_MEMORY_RESERVE,
    DecodeGraphRunner,
    decode_buckets,
    use_cuda_graphs,
)
from surge.worker.decode_form import DecodeFormPolicy
from surge.worker.input_batch import InputPreparer, PreparedInputs
from surge.worker.logprobs import PromptLogprobPlan, StepLogprobs
from surge.worker.piecewise_graph import PiecewiseGraphRunner, piecewise_buckets
from surge.worker.sampling_state import StepSampler

logger = logging.getLogger("surge.worker")

KVCache = tuple[torch.Tensor, torch.Tensor]


@dataclass
class InputBatch:
    """The device tensors of one step.

    Attributes:
        input_ids: ``[T]`` int64 token ids.
        positions: ``[T]`` int64 absolute positions.
        metadata: the attention layout (slot mapping, ...); its ``block_table`` is
            ``[num_seqs, max blocks of any sequence in this step]``, zero-padded.
        logits_indices: ``[S]`` int64 rows of the hidden states to sample from (the last
            token of each sequence with ``sample=True``).
        sample_requests: the ``S`` requests sampled this step, in row order.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    logits_indices: torch.Tensor
    sample_requests: list[Request]


@dataclass
class StepTiming:
    """Where the time of the last :meth:`ModelRunner.execute` went (when timing is on).

    Attributes:
        prepare_s: host seconds building and copying the inputs.
        launch_s: host seconds launching the forward, logits and sampler (graph replay or
            eager kernels), up to the wait for the sampled ids.
        sync_s: host seconds blocked waiting for the sampled ids.
        device_s: CUDA-event seconds from just after the input copy was queued to the
            sampled ids' copy (the device span of the step; on CPU the wall time of
            launch + sync).
        graph_bucket: the decode CUDA-graph bucket replayed, or None (piecewise or eager step).
        num_tokens, num_seqs: real tokens and sequences of the step.
        piecewise_bucket: the token bucket of the piecewise graphs replayed
            (:mod:`surge.worker.piecewise_graph`), or None (decode graph or eager step).
    """

    prepare_s: float
    launch_s: float
    sync_s: float
    device_s: float
    graph_bucket: int | None
    num_tokens: int
    num_seqs: int
    piecewise_bucket: int | None = None


class StepHandle:
    """A launched step whose sampled ids are on their way to the host.

    :meth:`result` blocks until they are there (the step's only host sync) and returns
    them; it may be called once. Created by :meth:`ModelRunner.execute_async`.
    """

    __slots__ = (
        "_runner",
        "_request_ids",
        "_sampled",
        "_host",
        "_ready",
        "_times",
        "_inputs",
        "_done",
        "_logprobs",
        "_tokens",
    )

    def __init__(
        self,
        runner: ModelRunner,
        request_ids: list[str],
        sampled: torch.Tensor | None,
        host: torch.Tensor | None,
        ready: torch.cuda.Event | None,
        times: tuple[float, float, float],
        inputs: PreparedInputs | None,
        logprobs: StepLogprobs | None = None,
    ) -> None:
        self._runner = runner
        self._request_ids = request_ids
        self._sampled = sampled
        self._host = host
        self._ready = ready
        self._times = times
        self._inputs = inputs
        self._done = False
        self._logprobs = logprobs
        self._tokens: list[int] | None = None

    def done(self) -> bool:
        """Whether the sampled ids are on the host (:meth:`result` would not wait)."""
        return self._ready is None or self._ready.query()

    @property
    def launch_times(self) -> tuple[float, float, float]:
        """``time.perf_counter()`` seconds at which :meth:`ModelRunner.execute_async` started,
        had its inputs prepared, and had launched the step (for step-timing tools)."""
        return self._times

    def sampled_token_ids(self) -> dict[str, int]:
        """Wait for the step's sampled ids only (not for :meth:`result`'s bookkeeping) and
        return them by request id; may be called any number of times, before or after
        :meth:`result`. A grammar mask of the next step takes its previous tokens here."""
        return dict(zip(self._request_ids, self._wait_tokens(), strict=True))

    def _wait_tokens(self) -> list[int]:
        if self._tokens is None:
            if self._ready is not None and not self._request_ids:
                self._ready.synchronize()  # a step that only computed prompt logprobs
            if not self._request_ids:
                self._tokens = []
            elif self._ready is None:
                assert self._sampled is not None
                self._tokens = self._sampled.tolist()
            else:
                assert self._host is not None
                self._ready.synchronize()
                self._tokens = self._host.tolist()
        return self._tokens

    def result(self) -> ModelOutput:
        """Wait for the step and return its sampled token ids.

        Raises:
            RuntimeError: called twice.
        """
        if self._done:
            raise RuntimeError("StepHandle.result() called twice")
        self._done = True
        tokens = self._wait_tokens()
        self._runner._record_timing(self._inputs, *self._times, time.perf_counter())
        output = ModelOutput(dict(zip(self._request_ids, tokens, strict=True)))
        if self._logprobs is not None:
            output.logprobs, output.prompt_logprobs = self._logprobs.lists(self._request_ids)
        return output


class ModelRunner:
    """Runs the model for one step's batch and samples its tokens.

    Args:
        config: the engine configuration (model, cache, limits, device, seed,
            ``enforce_eager``).
        attn_backend: the attention implementation; by default the Triton backend on CUDA
            (imported lazily) and the torch reference backend on CPU.
        tp_rank: this worker's tensor-parallel rank (the world size is
            ``config.parallel.tensor_parallel_size``; rank 0 by default).

    Attributes:
        model: the loaded model (``forward`` / ``compute_logits``).
        kv_caches: per layer ``(k_cache, v_cache)``, each
            ``[num_blocks, block_size, num_kv_heads_local, head_dim]``; empty until
            :meth:`init_kv_cache`.
        graph_runner: the decode CUDA graphs (None on CPU, with ``enforce_eager`` or a
            backend that is not graph safe); captured by :meth:`init_kv_cache`.
        piecewise: the piecewise CUDA graphs of prefill and mixed steps
            (:mod:`surge.worker.piecewise_graph`; only with :attr:`graph_runner` and
            tensor-parallel size 1, else None); captured by :meth:`init_kv_cache`.
        decode_form: which small prefill / mixed steps replay a decode graph in decode form
            (used only with :attr:`graph_runner`; None: only pure decode steps do).
        last_timing: the :class:`StepTiming` of the last step when timing is on
            (:meth:`set_timing`), else None.
        defers_grammar_masks: a step's grammar mask is filled after its forward is
            launched, so it may wait there for the previous step's sampled ids
            (:meth:`StepHandle.sampled_token_ids`): asynchronous scheduling need not wait
            for a step with constrained rows before it schedules the next.

    Raises:
        ValueError: the model cannot be built or loaded (see :func:`load_model`).
    """

    defers_grammar_masks = True

    def __init__(
        self, config: EngineConfig, attn_backend: AttentionBackend | None = None, tp_rank: int = 0
    ) -> None:
        self.config = config
        self.device = torch.device(config.device)
        if self.device.type == "cpu":
            torch.set_num_threads(config.cpu_threads)
        elif self.device.index is not None:  # kernels launch on the current device: make it ours
            torch.cuda.set_device(self.device)
        self.tp_rank = tp_rank
        self.tp_size = config.parallel.tensor_parallel_size
        mc = config.model
        if config.uses_fp8:
            require_fp8_gpu(config.device)
        self.kv_cache_dtype: torch.dtype = (
            torch.float8_e4m3fn if config.cache.kv_cache_dtype == "fp8" else mc.torch_dtype
        )
        self.model = load_model(mc, self.device, tp_rank, self.tp_size)
        if config.uses_fp8 and config.stream_decode and self.device.type == "cuda":
            why_not = enable_stream_decode(
                self.model, self.device, self.tp_size, kv_fp8=self.kv_cache_dtype == torch.float8_e4m3fn
            )
            if why_not is None:
                logger.info("start-up: one-token decode steps run the FP8 stream kernel")
            elif config.stream_attention is True:  # asked for, and it runs only inside that kernel
                raise ValueError(
                    f"--stream-attention needs the FP8 stream kernel, which cannot run here: {why_not}"
                )
            else:
                logger.info("start-up: FP8 stream kernel off (%s)", why_not)
        # after loading, which may convert weights on the host with every core
        torch.set_num_threads(engine_torch_threads(config))
        # The one stream every CUDA graph of this process is captured on (see init_kv_cache).
        self._capture_stream: torch.cuda.Stream | None = (
            torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None
        )
        self.comm: TPCommunicator | None = None
        if self.tp_size > 1 and torch.distributed.is_initialized():
            # before warm-up and graph capture: the graphs record the all-reduce path
            self.comm = TPCommunicator(
                self.device,
                mc.hidden_size,
                mc.torch_dtype,
                max_rows=config.scheduler.max_num_seqs,
                method="nccl" if config.parallel.all_reduce == "nccl" else "auto",
                single_host=config.parallel.nnodes == 1,
                capture_stream=self._capture_stream,
            )
            attach_communicator(self.model, self.comm)
        self.attn_backend: AttentionBackend = attn_backend or default_attention_backend(self.device)
        self.sampler = Sampler(config.seed, self.device)
        self.vocab_size = mc.vocab_size
        self.block_size = config.cache.block_size
        self.num_kv_heads = max(1, mc.num_key_value_heads // self.tp_size)
        self.kv_caches: list[KVCache] = []
        self.step_sampler = StepSampler(self.sampler, self.vocab_size, self.device)
        self._penalty_states = self.step_sampler.penalty_states

        sc = config.scheduler
        self.max_num_tokens = sc.max_num_batched_tokens
        self.max_num_seqs = sc.max_num_seqs
        self.max_blocks_per_seq = -(-sc.max_model_len // self.block_size)
        # before warm-up and graph capture: the graphs hold the backend's scratch
        self.attn_backend.reserve(self.max_num_seqs, self.num_kv_heads, self.device)
        self.graph_runner: DecodeGraphRunner | None = None
        if use_cuda_graphs(config, self.attn_backend):
            self.graph_runner = DecodeGraphRunner(
                self._forward,
                self.device,
                decode_buckets(self.max_num_seqs, self.max_num_tokens),
                self.max_blocks_per_seq,
                sc.max_model_len,
                capture_error_mode="thread_local" if self.tp_size > 1 else "global",
                independent_buckets=self.attn_backend.fuses_decode_rope,
                short_context=self._short_context,
            )
        self.piecewise: PiecewiseGraphRunner | None = None
        if self.graph_runner is not None and self.tp_size == 1:
            self.piecewise = PiecewiseGraphRunner(
                self._forward_with,
                self.attn_backend,
                self.device,
                piecewise_buckets(self.max_num_tokens),
                mc.num_attention_heads,
                mc.num_key_value_heads,
                mc.head_dim,
                mc.torch_dtype,
            )
        self.decode_form: DecodeFormPolicy | None = DecodeFormPolicy(self.bytes_per_block // self.block_size)
        self.inputs = InputPreparer(
            self.device, self.max_num_tokens, self.max_num_seqs, self.block_size, sc.max_model_len
        )
        cuda = self.device.type == "cuda"
        # Two pinned buffers and events: the ids of step k land in one while the host
        # reads those of step k-1 from the other (asynchronous scheduling).
        self._sampled_host = [
            torch.zeros(self.max_num_seqs, dtype=torch.int64, pin_memory=cuda) for _ in range(2)
        ]
        self._sampled_ready = [torch.cuda.Event() for _ in range(2)] if cuda else None
        self._num_launched = 0
        # The last launched step's sampled ids on the device, and each request's row in it:
        # the source of the next step's pending tokens.
        self._last_sampled: torch.Tensor | None = None
        self._last_rows: dict[str, int] = {}
        self._timing_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        self._timing = False
        self.last_timing: StepTiming | None = None

    # ----------------------------------------------------------------- KV cache sizing

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one KV block on this rank: K and V of ``block_size`` tokens, all layers, in
        the KV cache dtype (1 byte per value with ``kv_cache_dtype="fp8"``)."""
        mc = self.config.model
        itemsize = self.kv_cache_dtype.itemsize
        return 2 * mc.num_hidden_layers * self.block_size * self.num_kv_heads * mc.head_dim * itemsize

    def determine_num_kv_blocks(self) -> int:
        """How many KV blocks to allocate.

        ``cache.num_kv_blocks`` when set. Otherwise on CPU ``cache.cpu_kv_cache_bytes //
        bytes_per_block``; on CUDA a profiling forward pass at the full token budget (plus
        the sampler on ``max_num_seqs`` rows) measures peak activation memory, and the pool
        gets ``gpu_memory_utilization`` of the device's memory minus what is in use
        (weights, buffers, other processes), minus that peak, minus
        :data:`CUDA_GRAPH_MEMORY_RESERVE` when decode graphs will be captured. Capped at
        ``max_num_seqs * ceil(max_model_len / block_size)`` blocks, all that could ever be
        used.

        Raises:
            ValueError: not even one block fits.
        """
        cache = self.config.cache
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        if self.device.type == "cuda":
            available = self._profile_available_bytes()
            if self.graph_runner is not None:
                available -= CUDA_GRAPH_MEMORY_RESERVE
        else:
            available = cache.cpu_kv_cache_bytes
        num_blocks = min(int(available // self.bytes_per_block), self.max_num_seqs * self.max_blocks_per_seq)
        if num_blocks < 1:
            raise ValueError(
                f"no memory left for the KV cache ({available / 2**30:.2f} GiB available, "
                f"{self.bytes_per_block} bytes per block): raise gpu_memory_utilization or "
                f"lower max_num_batched_tokens"
            )
        return num_blocks

    def _profile_available_bytes(self) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        used_before = total - free
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        self.profile_run()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        torch.cuda.empty_cache()
        return int(total * self.config.cache.gpu_memory_utilization - used_before - peak)

    def profile_run(self) -> None:
        """One forward pass of ``max_num_batched_tokens`` dummy tokens (sequences of up to
        ``max_model_len``) over a one-block dummy cache that is never written, then the
        sampler with every feature on over ``max_num_seqs`` rows."""
        sc = self.config.scheduler
        total = self.max_num_tokens
        chunk = min(total, sc.max_model_len)
        q_lens = [chunk] * (total // chunk) + ([total % chunk] if total % chunk else [])
        self._dummy_step(q_lens[: self.max_num_seqs], self.max_num_seqs, full_sampler=True)

    def warm_up(self) -> None:
        """Run small dummy steps so the Triton kernels that eager steps use get compiled at
        start-up rather than under load (each kernel has variants by tile shape and by
        Triton's specialisation of ints equal to 1 or divisible by 16): prefill chunks of
        1..33 tokens, a mixed prefill + decode batch, a 128-token chunk next to a decode (the
        prefill attention kernel and the paged kernel's skipping variant), the LM head over
        1, 2 and 16 rows (the one-token step as a true decode step, so a backend's decode
        variant with the rotary fused into attention compiles too), the grammar-mask kernel (so the first constrained request does
        not stall the batch while it compiles) and the window sampling kernel. A no-op on CPU."""
        if self.device.type != "cuda":
            return
        shapes = (([1], 1), ([2], 2), ([5, 1], 2), ([16], 16), ([33, 1, 1], 3), ([128, 1], 2))
        for q_lens, rows in shapes:
            self._dummy_step(q_lens, rows, full_sampler=False)
        # The split-KV variants of small steps over a long context (a prompt's last block
        # found in the prefix cache), one per query tile size.
        context = 2048
        if self.config.scheduler.max_model_len >= context + 16:
            for q_len in (2, 5, 16, 33):
                self._dummy_step([q_len], 1, full_sampler=False, context=context)
        logits_dtype = self.config.model.torch_dtype  # _sample_logits: the model's dtype
        warm_up_token_bitmask(self.vocab_size, self.device, logits_dtype)
        # float32 too: the sampler widens the logits of a batch with logit rules (penalties,
        # logit_bias, allowed ids, min_tokens) before its window sampling
        for dtype in dict.fromkeys((logits_dtype, torch.float32)):
            warm_up_sample_top_k_window(self.vocab_size, self.device, dtype)
        torch.cuda.synchronize(self.device)

    def _dummy_step(self, q_lens: list[int], sample_rows: int, full_sampler: bool, context: int = 0) -> None:
        """A forward of sequences with ``q_lens`` new tokens each (positions from
        ``context``, every earlier position read from the dummy block) over a one-block
        dummy cache that is never written (slot -1), the LM head over ``sample_rows`` rows
        and, with ``full_sampler``, the sampler with every feature on."""
        num_tokens = sum(q_lens)
        mc = self.config.model
        shape = (1, self.block_size, self.num_kv_heads, mc.head_dim)
        caches = [
            (torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device),) * 2
            for _ in range(mc.num_hidden_layers)
        ]
        cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        positions = np.concatenate([np.arange(n) for n in q_lens]) + context
        seq_lens = [n + context for n in q_lens]
        width = -(-max(seq_lens) // self.block_size)
        dev = self.device
        metadata = AttentionMetadata(
            num_tokens=num_tokens,
            num_seqs=len(q_lens),
            query_start_loc=torch.from_numpy(cu).to(dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_table=torch.zeros(len(q_lens), width, dtype=torch.int32, device=dev),
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=dev),
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            query_start_loc_cpu=cu.tolist(),
            seq_lens_cpu=seq_lens,
            min_query_len=min(q_lens),
            # nothing is written (slot -1): a one-token step may take the backend's fused
            # decode variant, which then compiles here too
            independent_rows=max(q_lens) == 1,
        )
        rows = sample_rows
        with torch.inference_mode():
            input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=dev)
            hidden = self.model(
                input_ids, torch.from_numpy(positions).to(dev), caches, metadata, self.attn_backend
            )
            idx = torch.arange(rows, device=dev) % num_tokens
            logits = self.model.compute_logits(hidden[idx])
            del hidden
            if not full_sampler:
                return
            params = SamplingParams(
                temperature=0.8,
                top_p=0.9,
                top_k=50,
                min_p=0.05,
                repetition_penalty=1.1,
                logit_bias={0: 1.0},
                allowed_token_ids=(0, self.vocab_size - 1),
            )
            seeded = msgspec.structs.replace(params, seed=0)
            md = SamplingMetadata.build(
                # Half the rows seeded: the seeded noise path has its own [rows, vocab] temporaries.
                [params, seeded] * (rows // 2) + [params] * (rows % 2),
                [[]] * rows,
                [[]] * rows,
                [()] * rows,
                self.vocab_size,
                dev,
            )
            md.top_k_window = None  # profile the full-sort top-k/top-p path (its temporaries are larger)
            self.sampler(logits, md)

    def _short_context(self, bucket: int) -> int | None:
        """The decode graphs' short-context length for ``bucket`` (tokens): batch 1 gets one
        when the FP8 stream kernel runs attention itself (``EngineConfig.stream_attention``), up
        to its :attr:`~surge.layers.stream_decode.StreamDecode.fused_max_len`."""
        sd = getattr(getattr(self.model, "model", None), "stream_decode", None)
        return sd.fused_max_len if bucket == 1 and sd is not None else None

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate per-layer K and V caches ``[num_blocks, block_size, num_kv_heads, head_dim]``
        (zeros, in :attr:`kv_cache_dtype`) on the device, compile the eager kernels' variants
        (:meth:`warm_up`), then capture the piecewise and the decode CUDA graphs (when on), on
        one stream into one memory pool."""
        mc = self.config.model
        shape = (num_blocks, self.block_size, self.num_kv_heads, mc.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device),
                torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device),
            )
            for _ in range(mc.num_hidden_layers)
        ]
        if self.config.stream_attention is not False and getattr(
            getattr(self.model, "model", None), "stream_decode", None
        ):
            why_not = bind_stream_kv(self.model, self.kv_caches)
            if why_not is None:
                logger.info(
                    "start-up: one-token steps of contexts up to %d tokens run attention inside the FP8 "
                    "stream kernel (one launch)",
                    self._short_context(1),
                )
            elif self.config.stream_attention is True:
                raise ValueError(
                    f"--stream-attention cannot run attention inside the FP8 stream kernel: {why_not}"
                )
            else:
                logger.info("start-up: attention outside the FP8 stream kernel (%s)", why_not)
        t0 = time.perf_counter()
        self.warm_up()
        if self.device.type == "cuda":
            logger.info("start-up: kernel warm-up in %.1f s", time.perf_counter() - t0)
        # One capture stream (the communicator's self-check uses it too) and one pool for both
        # kinds of graphs. Measured on the H200 (FP8 Qwen3-8B, batch 1): with the piecewise
        # graphs captured on a second stream every decode step took 3.60 ms instead of 3.46,
        # whichever was captured first and even after the piecewise graphs were destroyed; the
        # decode graph's kernels lost their PDL overlap
        # (benchmarks/results/h200-qwen3-8b-fp8/piecewise-f48da30/README.md).
        stream = pool = None
        if self._capture_stream is not None and (self.piecewise is not None or self.graph_runner is not None):
            stream, pool = self._capture_stream, torch.cuda.graph_pool_handle()
        if self.piecewise is not None:
            t0 = time.perf_counter()
            self.piecewise.capture(stream, pool)
            logger.info(
                "start-up: piecewise CUDA graphs of prefill and mixed steps (up to %d tokens, %d buckets) "
                "captured in %.1f s",
                self.piecewise.max_bucket,
                len(self.piecewise.buckets),
                time.perf_counter() - t0,
            )
        if self.graph_runner is not None:
            t0 = time.perf_counter()
            self.graph_runner.capture(stream=stream, pool=pool)
            logger.info("start-up: decode CUDA graphs captured in %.1f s", time.perf_counter() - t0)
        if stream is not None:
            # The warm-ups ran on the capture stream: hand their cached blocks back, so that
            # the steps' own stream need not hit an allocation failure (and a sync) to reuse them.
            torch.cuda.empty_cache()

    # ----------------------------------------------------------------- one step

    def set_timing(self, enabled: bool) -> None:
        """Record a :class:`StepTiming` per step in :attr:`last_timing` (adds CUDA events
        and host timers; off by default)."""
        self._timing = enabled
        if enabled and self.device.type == "cuda" and self._timing_events is None:
            self._timing_events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        if not enabled:
            self.last_timing = None

    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        """Run one step and sample a token for every scheduled request with ``sample=True``.

        The same as ``execute_async(scheduler_output).result()``.

        Returns:
            ``ModelOutput`` mapping request_id -> sampled token id.

        Raises:
            RuntimeError: :meth:`init_kv_cache` was not called.
            ValueError: the step exceeds ``max_num_batched_tokens`` / ``max_num_seqs`` or a
                request's block table is too short for its tokens.
        """
        return self.execute_async(scheduler_output).result()

    def execute_async(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Launch one step without waiting for it: inputs, forward, logits, sampling and the
        copy of the sampled ids to the host are queued; :meth:`StepHandle.result` waits.

        A decode token that is pending (asynchronous scheduling: sampled by the previous
        launched step, id not yet on the host) is copied on the device from that step's
        sampled ids. At most two handles may be unresolved at a time (the sampled ids
        land in two alternating pinned buffers).

        Raises:
            RuntimeError: :meth:`init_kv_cache` was not called.
            ValueError: as :meth:`execute`, or a pending token that the previous launched
                step did not sample.
        """
        t0 = time.perf_counter()
        self.step_sampler.drop(scheduler_output.finished_request_ids)
        self.inputs.drop(scheduler_output.finished_request_ids)
        self.inputs.drop(scheduler_output.preempted_request_ids)
        if scheduler_output.is_empty:
            self._last_sampled, self._last_rows = None, {}
            return StepHandle(self, [], None, None, None, (t0, t0, t0), None)
        if not self.kv_caches:
            raise RuntimeError("init_kv_cache() must be called before execute()")
        inputs = self._prepare(scheduler_output)
        t1 = time.perf_counter()
        events = self._timing_events if self._timing else None
        if events is not None:
            events[0].record()
        prompt_plan = None
        if scheduler_output.any_prompt_logprobs:
            prompt_plan = PromptLogprobPlan.build(scheduler_output, inputs.query_start_loc_cpu)
        with torch.inference_mode():
            if inputs.pending_idx is not None:
                self._fill_pending(inputs)
            hidden = self._hidden(inputs)
            logits = self._sample_logits(hidden, inputs)
            requests = inputs.sample_requests
            sample_lp = None
            samples = logits is not None
            if logits is not None:
                sampled, sample_lp = self.step_sampler.sample_with_logprobs(
                    logits, requests, scheduler_output.grammar, scheduler_output.forced_tokens
                )
                del logits
            prompt_lp = None
            if prompt_plan is not None:
                ids, lps = prompt_plan.compute(hidden, self.model.compute_logits, self.max_num_seqs)
                prompt_lp = (prompt_plan, ids, lps)
            del hidden
        logprobs = None
        if sample_lp is not None or prompt_lp is not None:
            logprobs = StepLogprobs(sample_lp, prompt_lp)
            if self._sampled_ready is not None:
                logprobs.copy_to_host()
        if not samples:  # nothing samples: no sync, unless timing wants the span or logprobs
            self._last_sampled, self._last_rows = None, {}
            if events is not None:
                events[1].record()
            ready = None
            if logprobs is not None and self._sampled_ready is not None:
                ready = torch.cuda.Event()
                ready.record()
            return StepHandle(self, [], None, None, ready, (t0, t1, time.perf_counter()), inputs, logprobs)
        ids = [r.request_id for r in requests]
        self._last_sampled = sampled
        self._last_rows = {rid: i for i, rid in enumerate(ids)}
        host = ready = None
        if self._sampled_ready is not None:
            slot = self._num_launched % 2
            host = self._sampled_host[slot][: sampled.shape[0]]
            host.copy_(sampled, non_blocking=True)
            if events is not None:
                events[1].record()
            ready = self._sampled_ready[slot]
            ready.record()
        self._num_launched += 1
        return StepHandle(self, ids, sampled, host, ready, (t0, t1, time.perf_counter()), inputs, logprobs)

    def _fill_pending(self, inputs: PreparedInputs) -> None:
        """Copy the pending tokens' ids from the last launched step's sampled ids."""
        idx = inputs.pending_idx
        prev = self._last_sampled
        if idx is None or prev is None:
            raise ValueError("a pending token, but the last launched step sampled nothing")
        ids = inputs.input_ids
        n = idx.shape[1]
        if inputs.pending_identity:
            ids[:n].copy_(prev[:n])
        else:
            ids.index_copy_(0, idx[0], prev.index_select(0, idx[1]))

    def _record_timing(
        self, inputs: PreparedInputs | None, t0: float, t1: float, t2: float, t3: float
    ) -> None:
        """Fill :attr:`last_timing` for a resolved step (when timing is on; the CUDA events
        are shared, so the figures hold for synchronous use, one step at a time)."""
        if not self._timing or inputs is None:
            return
        events = self._timing_events
        if events is not None:
            events[1].synchronize()
            device_s = events[0].elapsed_time(events[1]) / 1e3
        else:
            device_s = t3 - t1
        self.last_timing = StepTiming(
            prepare_s=t1 - t0,
            launch_s=t2 - t1,
            sync_s=t3 - t2,
            device_s=device_s,
            graph_bucket=inputs.padded_seqs if self._graph_step(inputs) else None,
            num_tokens=inputs.num_tokens,
            num_seqs=inputs.num_seqs,
            piecewise_bucket=(
                self.piecewise.bucket_for(inputs.num_tokens)
                if self.piecewise is not None and self._piecewise_step(inputs)
                else None
            ),
        )

    def compute_logits(self, scheduler_output: SchedulerOutput) -> tuple[torch.Tensor | None, list[Request]]:
        """Run one step's forward (writing its K/V) and return the logits of the sampled rows.

        Takes the same path as :meth:`execute` (CUDA graph for pure decode when on) but
        does not sample: for tests and debugging.

        Returns:
            ``(logits [S, vocab_size] float32 or None when nothing samples, the S requests)``
            (the sampler gets the model's dtype; these are widened for comparisons).
        """
        self.inputs.drop(scheduler_output.finished_request_ids)
        self.inputs.drop(scheduler_output.preempted_request_ids)
        if scheduler_output.is_empty:
            return None, []
        inputs = self._prepare(scheduler_output)
        with torch.inference_mode():
            logits = self._logits(inputs)
            return (None if logits is None else logits.float()), inputs.sample_requests

    def _prepare(self, scheduler_output: SchedulerOutput) -> PreparedInputs:
        runner = self.graph_runner
        if runner is None:
            return self.inputs.prepare(scheduler_output, None, self._last_rows)
        # Prompt logprobs need every prompt row's hidden state in the eager layout.
        form = None if scheduler_output.any_prompt_logprobs else self.decode_form
        return self.inputs.prepare(scheduler_output, runner.bucket_for, self._last_rows, form)

    def _graph_step(self, inputs: PreparedInputs) -> bool:
        """Whether this step replays a decode graph (pure decode or decode form, padded to
        a bucket)."""
        runner = self.graph_runner
        return runner is not None and inputs.max_query_len == 1 and inputs.padded_seqs in runner.buckets

    def _logits(self, inputs: PreparedInputs) -> torch.Tensor | None:
        """Forward (graph replay or eager) and the LM head over the sampled rows."""
        return self._sample_logits(self._hidden(inputs), inputs)

    def _piecewise_step(self, inputs: PreparedInputs) -> bool:
        """Whether this step runs through the piecewise graphs: an eager-layout step (not a
        decode graph's, not decode form) of at most the largest piecewise bucket's tokens."""
        pw = self.piecewise
        return (
            pw is not None
            and not inputs.decode_form
            and not self._graph_step(inputs)
            and pw.bucket_for(inputs.num_tokens) is not None
        )

    def _hidden(self, inputs: PreparedInputs) -> torch.Tensor:
        """The forward: a decode graph's replay, the piecewise graphs' (prefill and mixed
        steps up to :data:`~surge.worker.piecewise_graph.PIECEWISE_MAX_TOKENS`) or the eager
        model, ``-> hidden [T', H]`` (``T' >= num_tokens`` rows; a graph's output is valid until
        its next replay)."""
        if self._graph_step(inputs):
            assert self.graph_runner is not None
            return self.graph_runner.run(inputs)
        if self._piecewise_step(inputs):
            assert self.piecewise is not None
            return self.piecewise.run(inputs, self._metadata(inputs))
        return self._forward(inputs.input_ids, inputs.positions, self._metadata(inputs))

    def _sample_logits(self, hidden: torch.Tensor, inputs: PreparedInputs) -> torch.Tensor | None:
        """The LM head over the rows that sample, ``[S, vocab]`` in the model's dtype (None when
        none does). Not widened to float32: the window sampler's top-k reads them as they are
        (a bf16 -> float32 copy of the rows took 27 us of a 64-row FP8 decode step on the H200),
        and every other consumer (penalties, masks, logprobs) widens what it reads."""
        if not inputs.sample_requests:
            return None
        if inputs.all_rows_sample:
            rows = hidden[: inputs.num_seqs]
        else:
            rows = hidden[inputs.logits_indices]
        return self.model.compute_logits(rows, upcast=False)

    @staticmethod
    def _metadata(inputs: PreparedInputs) -> AttentionMetadata:
        return AttentionMetadata(
            num_tokens=inputs.num_tokens,
            num_seqs=inputs.num_seqs,
            query_start_loc=inputs.query_start_loc[: inputs.num_seqs + 1],
            seq_lens=inputs.seq_lens[: inputs.num_seqs],
            block_table=inputs.block_table,
            slot_mapping=inputs.slot_mapping[: inputs.num_tokens],
            max_query_len=inputs.max_query_len,
            max_seq_len=inputs.max_seq_len,
            query_start_loc_cpu=inputs.query_start_loc_cpu[: inputs.num_seqs + 1],
            seq_lens_cpu=inputs.seq_lens_cpu[: inputs.num_seqs],
            min_query_len=inputs.min_query_len,
            independent_rows=inputs.independent_rows,
        )

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """The model's forward over this runner's caches and backend: ``-> hidden [T, hidden]``.

        The seam CUDA graphs wrap: it reads nothing but its arguments and ``kv_caches``.
        """
        return self.model(input_ids, positions, self.kv_caches, metadata, self.attn_backend)

    def _forward_with(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """The model's forward over this runner's caches with ``backend`` (the piecewise
        graphs' seam: they pass the backend that cuts the forward at each attention call)."""
        return self.model(input_ids, positions, self.kv_caches, metadata, backend)

    def prepare_inputs(self, scheduler_output: SchedulerOutput) -> InputBatch:
        """Lay the step's tokens out back to back and build the attention metadata (eager
        layout, never padded).

        Request ``i`` contributes tokens ``[num_computed_tokens, num_computed_tokens +
        num_new_tokens)`` of its prompt + output. Host work is one Python iteration per
        request (not per token) into a preallocated (pinned on CUDA) buffer.

        Raises:
            ValueError: see :meth:`execute`.
        """
        inputs = self.inputs.prepare(scheduler_output)
        return InputBatch(
            input_ids=inputs.input_ids,
            positions=inputs.positions,
            metadata=self._metadata(inputs),
            logits_indices=inputs.logits_indices,
            sample_requests=inputs.sample_requests,
        )


def engine_torch_threads(config: EngineConfig) -> int:
    """Torch intra-op threads of a process that runs the model, once it is loaded:
    ``config.cpu_threads`` on CPU, 1 on a GPU.

    On a GPU the host side of a step is launches and a few small torch ops, which gain nothing
    from threads; but each op that does open an OpenMP parallel region leaves the pool's
    threads (one per core) spin-waiting for the next one, taking the cores that the API
    process, the grammar mask fill and the clients need. Measured on the H200 host (16 cores,
    Qwen3-8B, C64 I256/O1024 with a ``json_schema`` on every request): 15 engine threads each
    busy about 90 % of the run, 7,025 output tok/s and P99 ITL 18.5 ms; with one thread
    8,755 tok/s and 8.25 ms (``benchmarks/results/h200-qwen3-8b/features/structured-395bb05/threads-diag/``).
    vLLM likewise runs its GPU workers with one OpenMP thread."""
    return config.cpu_threads if config.device == "cpu" else 1


def default_attention_backend(device: torch.device) -> AttentionBackend:
    """The Triton backend on CUDA (imported here, so CPU hosts never need it), the torch
    reference backend elsewhere."""
    if device.type == "cuda":
        from surge.layers.triton_attention import TritonAttentionBackend

        return TritonAttentionBackend()
    return TorchAttentionBackend()
