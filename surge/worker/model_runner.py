"""ModelRunner: SchedulerOutput -> input tensors -> forward -> logits -> sampled tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from surge.config import EngineConfig
from surge.core.outputs import ModelOutput, SchedulerOutput
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.layers.sampler import Sampler, SamplingMetadata
from surge.layers.torch_attention import TorchAttentionBackend
from surge.model.loader import load_model
from surge.request import Request
from surge.sampling_params import SamplingParams

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


class _PenaltyState:
    """Penalty inputs of one request, updated incrementally: output token counts ``[V]``
    float32 over the first ``num_counted`` outputs, and the prompt's token mask ``[V]``."""

    __slots__ = ("counts", "prompt_mask", "num_counted")

    def __init__(self, request: Request, vocab_size: int, device: torch.device) -> None:
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        self.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        ids = [t for t in request.prompt_token_ids if 0 <= t < vocab_size]
        if ids:
            self.prompt_mask[torch.tensor(ids, device=device)] = True
        self.num_counted = 0

    def update(self, output_token_ids: list[int], vocab_size: int) -> None:
        if len(output_token_ids) < self.num_counted:  # outputs were reset: count again
            self.counts.zero_()
            self.num_counted = 0
        new = [t for t in output_token_ids[self.num_counted :] if 0 <= t < vocab_size]
        if new:
            idx = torch.tensor(new, device=self.counts.device)
            self.counts.index_add_(0, idx, torch.ones(len(new), device=self.counts.device))
        self.num_counted = len(output_token_ids)


class ModelRunner:
    """Runs the model for one step's batch and samples its tokens.

    Args:
        config: the engine configuration (model, cache, limits, device, seed).
        attn_backend: the attention implementation; the torch reference backend by default.
        tp_rank: this worker's tensor-parallel rank (the world size is
            ``config.parallel.tensor_parallel_size``; rank 0 by default).

    Attributes:
        model: the loaded model (``forward`` / ``compute_logits``).
        kv_caches: per layer ``(k_cache, v_cache)``, each
            ``[num_blocks, block_size, num_kv_heads_local, head_dim]``; empty until
            :meth:`init_kv_cache`.

    Raises:
        ValueError: the model cannot be built or loaded (see :func:`load_model`).
    """

    def __init__(
        self, config: EngineConfig, attn_backend: AttentionBackend | None = None, tp_rank: int = 0
    ) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.tp_rank = tp_rank
        self.tp_size = config.parallel.tensor_parallel_size
        mc = config.model
        self.model = load_model(mc, self.device, tp_rank, self.tp_size)
        self.attn_backend: AttentionBackend = attn_backend or TorchAttentionBackend()
        self.sampler = Sampler(config.seed, self.device)
        self.vocab_size = mc.vocab_size
        self.block_size = config.cache.block_size
        self.num_kv_heads = max(1, mc.num_key_value_heads // self.tp_size)
        self.kv_caches: list[KVCache] = []
        self._penalty_states: dict[str, _PenaltyState] = {}
        self._zero_counts: torch.Tensor | None = None
        self._zero_mask: torch.Tensor | None = None

        sc = config.scheduler
        self.max_num_tokens = sc.max_num_batched_tokens
        self.max_num_seqs = sc.max_num_seqs
        self.max_blocks_per_seq = -(-sc.max_model_len // self.block_size)
        pin = self.device.type == "cuda"

        def buf(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, pin_memory=pin)

        self._input_ids = buf(self.max_num_tokens, dtype=torch.int64)
        self._positions = buf(self.max_num_tokens, dtype=torch.int64)
        self._slot_mapping = buf(self.max_num_tokens, dtype=torch.int64)
        self._query_start_loc = buf(self.max_num_seqs + 1, dtype=torch.int32)
        self._seq_lens = buf(self.max_num_seqs, dtype=torch.int32)
        # Flat, so that the [num_seqs, width] view of a step is contiguous.
        self._block_table = buf(self.max_num_seqs * self.max_blocks_per_seq, dtype=torch.int32)
        # On CUDA, the host must not refill the pinned buffers before the previous step's
        # asynchronous copies out of them have run.
        self._copy_done = torch.cuda.Event() if pin else None

    # ----------------------------------------------------------------- KV cache sizing

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one KV block on this rank: K and V of ``block_size`` tokens, all layers."""
        mc = self.config.model
        return 2 * mc.num_hidden_layers * self.block_size * self.num_kv_heads * mc.head_dim * mc.dtype_bytes

    def determine_num_kv_blocks(self) -> int:
        """How many KV blocks to allocate.

        ``cache.num_kv_blocks`` when set. Otherwise on CPU ``cache.cpu_kv_cache_bytes //
        bytes_per_block``; on CUDA a profiling forward pass at the full token budget (plus
        the sampler on ``max_num_seqs`` rows) measures peak activation memory, and the pool
        gets what is left under ``gpu_memory_utilization`` of the device's memory. Capped
        at ``max_num_seqs * ceil(max_model_len / block_size)`` blocks, all that could ever
        be used.

        Raises:
            ValueError: not even one block fits.
        """
        cache = self.config.cache
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        if self.device.type == "cuda":
            available = self._profile_available_bytes()
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
        q_lens = q_lens[: self.max_num_seqs]
        num_tokens = sum(q_lens)
        mc = self.config.model
        shape = (1, self.block_size, self.num_kv_heads, mc.head_dim)
        caches = [
            (torch.zeros(shape, dtype=mc.torch_dtype, device=self.device),) * 2
            for _ in range(mc.num_hidden_layers)
        ]
        cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        positions = np.concatenate([np.arange(n) for n in q_lens])
        width = -(-max(q_lens) // self.block_size)
        dev = self.device
        metadata = AttentionMetadata(
            num_tokens=num_tokens,
            num_seqs=len(q_lens),
            query_start_loc=torch.from_numpy(cu).to(dev),
            seq_lens=torch.tensor(q_lens, dtype=torch.int32, device=dev),
            block_table=torch.zeros(len(q_lens), width, dtype=torch.int32, device=dev),
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=dev),
            max_query_len=max(q_lens),
            max_seq_len=max(q_lens),
            query_start_loc_cpu=cu.tolist(),
            seq_lens_cpu=list(q_lens),
        )
        params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05, repetition_penalty=1.1)
        rows = self.max_num_seqs
        with torch.inference_mode():
            input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=dev)
            hidden = self.model(
                input_ids, torch.from_numpy(positions).to(dev), caches, metadata, self.attn_backend
            )
            idx = torch.arange(rows, device=dev) % num_tokens
            logits = self.model.compute_logits(hidden[idx])
            del hidden
            md = SamplingMetadata.build(
                [params] * rows, [[]] * rows, [[]] * rows, [()] * rows, self.vocab_size, dev
            )
            self.sampler(logits, md)

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate per-layer K and V caches ``[num_blocks, block_size, num_kv_heads, head_dim]``
        (zeros, model dtype) on the device."""
        mc = self.config.model
        shape = (num_blocks, self.block_size, self.num_kv_heads, mc.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=mc.torch_dtype, device=self.device),
                torch.zeros(shape, dtype=mc.torch_dtype, device=self.device),
            )
            for _ in range(mc.num_hidden_layers)
        ]

    # ----------------------------------------------------------------- one step

    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        """Run one step and sample a token for every scheduled request with ``sample=True``.

        Returns:
            ``ModelOutput`` mapping request_id -> sampled token id.

        Raises:
            RuntimeError: :meth:`init_kv_cache` was not called.
            ValueError: the step exceeds ``max_num_batched_tokens`` / ``max_num_seqs`` or a
                request's block table is too short for its tokens.
        """
        for request_id in scheduler_output.finished_request_ids:
            self._penalty_states.pop(request_id, None)
        if scheduler_output.is_empty:
            return ModelOutput()
        if not self.kv_caches:
            raise RuntimeError("init_kv_cache() must be called before execute()")
        batch = self.prepare_inputs(scheduler_output)
        with torch.inference_mode():
            hidden = self._forward(batch.input_ids, batch.positions, batch.metadata)
            if not batch.sample_requests:
                return ModelOutput()
            logits = self.model.compute_logits(hidden[batch.logits_indices])
            tokens = self.sampler(logits, self._sampling_metadata(batch.sample_requests)).tolist()
        return ModelOutput({r.request_id: t for r, t in zip(batch.sample_requests, tokens, strict=True)})

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """The model's forward over this runner's caches and backend: ``-> hidden [T, hidden]``.

        The seam CUDA graphs wrap: it reads nothing but its arguments and ``kv_caches``.
        """
        return self.model(input_ids, positions, self.kv_caches, metadata, self.attn_backend)

    def prepare_inputs(self, scheduler_output: SchedulerOutput) -> InputBatch:
        """Lay the step's tokens out back to back and build the attention metadata.

        Request ``i`` contributes tokens ``[num_computed_tokens, num_computed_tokens +
        num_new_tokens)`` of its prompt + output. Host work is one Python iteration per
        request (not per token) into preallocated (pinned on CUDA) buffers.
        """
        scheduled = scheduler_output.scheduled
        num_seqs = len(scheduled)
        q_lens = np.fromiter((s.num_new_tokens for s in scheduled), dtype=np.int64, count=num_seqs)
        starts = np.fromiter(
            (s.request.num_computed_tokens for s in scheduled), dtype=np.int64, count=num_seqs
        )
        num_tokens = int(q_lens.sum())
        if num_tokens > self.max_num_tokens or num_seqs > self.max_num_seqs:
            raise ValueError(
                f"step of {num_tokens} tokens / {num_seqs} sequences exceeds max_num_batched_tokens="
                f"{self.max_num_tokens} / max_num_seqs={self.max_num_seqs}"
            )
        seq_lens = starts + q_lens
        bs = self.block_size
        num_blocks = -(-seq_lens // bs)
        width = int(num_blocks.max())
        if width > self.max_blocks_per_seq:
            raise ValueError(f"a sequence of {int(seq_lens.max())} tokens exceeds max_model_len")
        if self._copy_done is not None:
            self._copy_done.synchronize()
        ids_np = self._input_ids.numpy()
        block_table = self._block_table[: num_seqs * width].view(num_seqs, width)
        bt_np = block_table.numpy()
        bt_np[:] = 0
        t = 0
        for i, s in enumerate(scheduled):
            req = s.request
            n = s.num_new_tokens
            start = req.num_computed_tokens
            ids_np[t : t + n] = req.token_ids_slice(start, start + n)
            t += n
            nb = int(num_blocks[i])
            if len(req.block_ids) < nb:
                raise ValueError(
                    f"request {req.request_id!r} has {len(req.block_ids)} KV blocks, needs {nb} "
                    f"for {int(seq_lens[i])} tokens"
                )
            bt_np[i, :nb] = req.block_ids[:nb]
        cu = self._query_start_loc.numpy()
        cu[0] = 0
        cu[1 : num_seqs + 1] = np.cumsum(q_lens)
        rows = np.repeat(np.arange(num_seqs), q_lens)
        positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(starts - cu[:num_seqs], q_lens)
        self._positions.numpy()[:num_tokens] = positions
        self._slot_mapping.numpy()[:num_tokens] = (
            bt_np[rows, positions // bs].astype(np.int64) * bs + positions % bs
        )
        self._seq_lens.numpy()[:num_seqs] = seq_lens

        sample_idx = [i for i, s in enumerate(scheduled) if s.sample]
        logits_indices = cu[1:][sample_idx].astype(np.int64) - 1
        dev = self.device

        def to_dev(x: torch.Tensor) -> torch.Tensor:
            return x.to(dev, non_blocking=True)

        metadata = AttentionMetadata(
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            query_start_loc=to_dev(self._query_start_loc[: num_seqs + 1]),
            seq_lens=to_dev(self._seq_lens[:num_seqs]),
            block_table=to_dev(block_table),
            slot_mapping=to_dev(self._slot_mapping[:num_tokens]),
            max_query_len=int(q_lens.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc_cpu=cu[: num_seqs + 1].tolist(),
            seq_lens_cpu=seq_lens.tolist(),
        )
        batch = InputBatch(
            input_ids=to_dev(self._input_ids[:num_tokens]),
            positions=to_dev(self._positions[:num_tokens]),
            metadata=metadata,
            logits_indices=torch.from_numpy(logits_indices).to(dev, non_blocking=True),
            sample_requests=[scheduled[i].request for i in sample_idx],
        )
        if self._copy_done is not None:
            self._copy_done.record()
        return batch

    def _sampling_metadata(self, requests: list[Request]) -> SamplingMetadata:
        params = [r.sampling_params for r in requests]
        penalty = None
        if any(p.has_penalties for p in params):
            penalty = self._penalty_tensors(requests)
        return SamplingMetadata.build(
            params,
            [r.prompt_token_ids for r in requests],
            [r.output_token_ids for r in requests],
            [r.eos_token_ids for r in requests],
            self.vocab_size,
            self.device,
            penalty_tensors=penalty,
        )

    def _penalty_tensors(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack ``(output_token_counts [B, V], prompt_mask [B, V])`` from the per-request
        incremental state (zero rows for requests without penalties)."""
        if self._zero_counts is None:
            self._zero_counts = torch.zeros(self.vocab_size, dtype=torch.float32, device=self.device)
            self._zero_mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        counts, masks = [], []
        for r in requests:
            if not r.sampling_params.has_penalties:
                counts.append(self._zero_counts)
                masks.append(self._zero_mask)
                continue
            state = self._penalty_states.get(r.request_id)
            if state is None:
                state = self._penalty_states[r.request_id] = _PenaltyState(r, self.vocab_size, self.device)
            state.update(r.output_token_ids, self.vocab_size)
            counts.append(state.counts)
            masks.append(state.prompt_mask)
        return torch.stack(counts), torch.stack(masks)
