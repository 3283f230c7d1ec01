"""LLMEngine: the engine loop of three calls, ``schedule()``, ``execute()``, ``update()``."""

from __future__ import annotations

import copy
import dataclasses
import logging
import numbers
import secrets
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from surge.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    check_visible_gpus,
    resolve_device,
)
from surge.core.outputs import EngineOutput, RequestFailure, SchedulerOutput, SchedulerStats
from surge.core.scheduler import Scheduler, check_request_fits, room_for_output
from surge.core.thinking_budget import (
    THINKING_BUDGET_BREAKS_GRAMMAR,
    THINKING_BUDGET_NEEDS_REASONING,
    ThinkingBudget,
)
from surge.quant.config import require_fp8_gpu
from surge.request import Request, token_ids_in_range
from surge.sampling_params import SamplingParams, truncated_prompt

logger = logging.getLogger("surge.engine")

if TYPE_CHECKING:
    import torch

    from surge.structured.manager import StructuredOutputManager

_GRAMMAR_WAIT_S = 0.005
"""When only requests waiting for their grammar remain, a step waits this long (seconds) at
most for a compilation to finish instead of spinning."""


def split_n(request_id: str, params: SamplingParams) -> list[tuple[str, SamplingParams]]:
    """Fan a request with ``n > 1`` out into ``n`` single-sequence child requests.

    Child ``i`` has id ``f"{request_id}-{i}"`` (:func:`choice_ids`) and the params of
    :func:`choice_params`. Returns ``[(request_id, params)]`` when ``n == 1``.
    """
    return list(zip(choice_ids(request_id, params.n), choice_params(params), strict=True))


def choice_ids(request_id: str, n: int) -> list[str]:
    """The ids of a request's ``n`` choices: ``f"{request_id}-{i}"``, or ``[request_id]`` for one."""
    return [request_id] if n == 1 else [f"{request_id}-{i}" for i in range(n)]


def choice_params(params: SamplingParams) -> list[SamplingParams]:
    """The single-sequence params of a request's ``params.n`` choices (``[params]`` for one).

    Choice ``i`` is a shallow copy with ``n`` 1 and, when the request is seeded, seed
    ``seed + i`` (wrapped into the int64 range) so the samples differ but stay reproducible.
    Seed -1 is no seed (vLLM's ``SamplingParams`` turns -1 into None): every choice draws fresh
    random numbers. Only the request's own seed means that: a choice's ``seed + i`` may be -1.
    The choices share the prompt's KV blocks through prefix caching, and the parent's checked
    fields (its token lists are the parent's objects): a copy is not checked again (a
    ``msgspec.structs.replace`` re-ran every check, 16 ms per choice for 256 long ``bad_words``,
    2 s on the API's event loop for ``n: 128``).
    """
    if params.seed == -1:
        params = copy.copy(params)  # no __post_init__: checked already
        msgspec.structs.force_setattr(params, "seed", None)
    if params.n == 1:
        return [params]
    children = []
    for i in range(params.n):
        # Stay inside SamplingParams' seed range: wrap into [-2**63, 2**63).
        seed = None if params.seed is None else (params.seed + i + 2**63) % 2**64 - 2**63
        child = copy.copy(params)  # no __post_init__: the parent's fields are checked already
        msgspec.structs.force_setattr(child, "n", 1)
        msgspec.structs.force_setattr(child, "seed", seed)
        children.append(child)
    return children


def _int_arg(name: str, value: int | None) -> int | None:
    """``value`` as an int (NumPy integers too), None as is.

    Raises:
        ValueError: naming ``name``, for a bool, a float, a string or anything else (a float
            ``block_size`` or a string ``max_model_len`` failed deep inside).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def build_engine_config(
    model: str | None = None,
    *,
    dtype: str | torch.dtype = "auto",
    load_format: str = "auto",
    seed: int | None = 0,
    device: str = "auto",
    block_size: int | None = 16,
    num_kv_blocks: int | None = None,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = 8192,
    max_model_len: int | None = None,
    enable_prefix_caching: bool | None = True,
    enforce_eager: bool = False,
    async_scheduling: bool | None = None,
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    tp_all_reduce: str = "nccl",
    distributed_timeout_seconds: float | None = None,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    fp8_emulation: bool = False,
    generation_config: str = "auto",
    stream_decode: bool = True,
    stream_attention: bool | None = None,
    grammar_compile_timeout: float = 60.0,
    hf_overrides: dict[str, Any] | None = None,
    scheduling_policy: str = "fcfs",
    override_generation_config: dict[str, Any] | None = None,
) -> EngineConfig:
    """Build and validate an :class:`EngineConfig` from flat, CLI-style arguments.

    ``max_model_len=None`` takes the model's ``max_position_embeddings``; ``block_size``,
    ``max_num_batched_tokens`` and ``enable_prefix_caching`` None are their defaults (16, 8192,
    True), as vLLM's None leaves them to the engine; ``max_num_seqs`` None is 256, or
    ``max_num_batched_tokens`` when that is lower (as vLLM derives it, so that a small budget
    alone is taken), and a ``max_num_seqs`` above ``max_num_batched_tokens`` is refused
    (:class:`~surge.config.SchedulerConfig`, vLLM's check);
    ``async_scheduling=None`` turns it on on CUDA (where the GPU runs ahead of the host)
    and off on CPU (where a step's compute is the host's own work). ``tensor_parallel_size``
    to ``master_port`` are :class:`~surge.config.ParallelConfig`'s (``tp_all_reduce`` is its
    ``all_reduce``, ``distributed_timeout_seconds`` its ``distributed_timeout_s``, None its default).

    FP8 (``quantization="fp8"``, an FP8 checkpoint, or ``kv_cache_dtype="fp8"``) is refused on
    CPU unless ``fp8_emulation`` (tests only) and on GPUs older than compute capability 8.9.
    ``generation_config`` is "auto" (the model's generation_config.json sampling defaults
    apply to what a request leaves out), "none" or a folder whose generation_config.json is read
    instead (vLLM's third form); ``override_generation_config`` is vLLM's
    (:mod:`surge.generation_defaults`). ``stream_decode`` and
    ``stream_attention`` are :attr:`EngineConfig.stream_decode` and
    :attr:`EngineConfig.stream_attention`; ``grammar_compile_timeout`` is
    :attr:`EngineConfig.grammar_compile_timeout` (seconds). ``hf_overrides`` replaces top-level
    keys of the model's ``config.json`` (:meth:`~surge.config.ModelConfig.from_pretrained`);
    ``scheduling_policy`` is :attr:`SchedulerConfig.scheduling_policy` (``fcfs`` or
    ``priority``).

    Raises:
        ValueError: a bad model folder, a value of the wrong type or out of range (the message
            names it).
    """
    seed = _int_arg("seed", seed)
    # vLLM's None for these (its EngineArgs defaults, left to the engine): Surge's defaults
    block_size = 16 if block_size is None else _int_arg("block_size", block_size)  # type: ignore[assignment]
    seqs_given = max_num_seqs is not None
    max_num_seqs = 256 if max_num_seqs is None else _int_arg("max_num_seqs", max_num_seqs)  # type: ignore[assignment]
    max_num_batched_tokens = (
        8192 if max_num_batched_tokens is None else _int_arg("max_num_batched_tokens", max_num_batched_tokens)
    )  # type: ignore[assignment]
    enable_prefix_caching = True if enable_prefix_caching is None else enable_prefix_caching
    num_kv_blocks = _int_arg("num_kv_blocks", num_kv_blocks)
    max_model_len = _int_arg("max_model_len", max_model_len)
    if max_model_len == -1:
        from surge.engine.cli_args import AUTO_MAX_MODEL_LEN

        raise ValueError(
            f"max_model_len -1: {AUTO_MAX_MODEL_LEN.replace('--max-model-len', 'max_model_len')}"
        )
    for name, size in (
        ("tensor_parallel_size", tensor_parallel_size),
        ("data_parallel_size", data_parallel_size),
    ):
        if size is None:  # vLLM's are integers too (1 by default)
            raise ValueError(f"{name} must be an integer, got None")
    tensor_parallel_size = _int_arg("tensor_parallel_size", tensor_parallel_size)  # type: ignore[assignment]
    data_parallel_size = _int_arg("data_parallel_size", data_parallel_size)  # type: ignore[assignment]
    for name, flag in (
        ("enable_prefix_caching", enable_prefix_caching),
        ("enforce_eager", enforce_eager),
        ("async_scheduling", async_scheduling),
        ("fp8_emulation", fp8_emulation),
    ):
        if flag is not None and not isinstance(flag, bool):
            raise ValueError(f"{name} must be true or false, got {flag!r}")
    if seed is None:  # as vLLM: an unseeded engine (dummy weights and unseeded sampling differ per run)
        seed = secrets.randbelow(2**31)
        logger.info("seed None: this engine's seed is %d (pass it to reproduce the run)", seed)
    seed %= 2**63  # any integer (vLLM takes negative ones); torch's generators take [0, 2**63)
    resolved = resolve_device(device)
    model_config = ModelConfig.from_pretrained(
        model,
        device=resolved,
        dtype=dtype,
        load_format=load_format,
        seed=seed,
        max_model_len=max_model_len,
        quantization=quantization,
        generation_config=generation_config,
        hf_overrides=hf_overrides,
        override_generation_config=override_generation_config,
    )
    parallel = ParallelConfig(
        tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=data_parallel_size,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        all_reduce=tp_all_reduce,
        **(
            {}
            if distributed_timeout_seconds is None
            else {"distributed_timeout_s": distributed_timeout_seconds}
        ),
    )
    if resolved.startswith("cuda"):
        import torch

        check_visible_gpus(resolved, parallel, torch.cuda.device_count())
    # A step holds at most max_num_seqs requests of at most max_model_len tokens: a larger token
    # budget can never be used, only allocated (the start-up profile runs a step that size)
    useful = max_num_seqs * model_config.max_model_len if max_num_seqs >= 1 else max_num_batched_tokens
    if max_num_batched_tokens > useful:
        logger.info(
            "max_num_batched_tokens %d lowered to %d (max_num_seqs x max_model_len): a step can hold no more",
            max_num_batched_tokens,
            useful,
        )
        max_num_batched_tokens = useful
    if not seqs_given:  # vLLM's derived default: no more sequences than the budget has tokens
        max_num_seqs = min(max_num_seqs, max(max_num_batched_tokens, 1))  # a budget < 1 is named below
    if async_scheduling is None:
        async_scheduling = resolved.startswith("cuda")
    config = EngineConfig(
        model=model_config,
        cache=CacheConfig(
            block_size=block_size,
            num_kv_blocks=num_kv_blocks,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            kv_cache_dtype=kv_cache_dtype,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=model_config.max_model_len,
            scheduling_policy=scheduling_policy,  # type: ignore[arg-type]  # validated there
        ),
        parallel=parallel,
        device=resolved,
        enforce_eager=enforce_eager,
        async_scheduling=async_scheduling,
        seed=seed,
        stream_decode=stream_decode,
        stream_attention=stream_attention,
        fp8_emulation=fp8_emulation,
        grammar_compile_timeout=grammar_compile_timeout,
    )
    if config.uses_fp8:
        require_fp8_gpu(config.device)
    return config


class _InFlight:
    """A launched step whose results are not applied yet."""

    __slots__ = ("scheduler_output", "handle", "exact")

    def __init__(self, scheduler_output: SchedulerOutput, handle: Any, exact: bool) -> None:
        self.scheduler_output = scheduler_output
        self.handle = handle
        self.exact = exact


class LLMEngine:
    """Runs the model over continuously batched requests.

    Each :meth:`step` is ``scheduler.schedule()`` -> ``runner.execute()`` ->
    ``scheduler.update()``. The engine knows token ids only; text lives with the caller.

    With ``config.async_scheduling`` a step is instead ``schedule()`` ->
    ``runner.execute_async()`` -> ``scheduler.advance()``, then ``update()`` of the step
    launched before it: the host schedules and prepares step k+1 while the GPU runs step
    k, and :meth:`step` returns the outputs of step k. A step that samples a request whose
    sampling needs every token id on the host (``SamplingParams.needs_token_history``) is
    applied before the next one is scheduled. A request with a grammar needs only its
    previous token, for its mask: with a runner that ``defers_grammar_masks`` the next step is
    scheduled and its forward launched first, and the mask waits for the previous step's
    ids inside the sampler (see docs/architecture.md, "Structured outputs"), and so does a
    request with a ``thinking_token_budget`` (its forced reasoning end); with other
    executors (tensor parallelism, whose mask is filled when the step is published) such a
    step is applied before the next one (``SamplingParams.needs_previous_token``).

    Requests with ``structured_outputs`` wait in :mod:`surge.structured` until their grammar
    is compiled (in a worker process, :mod:`surge.structured.compiler`), then join the
    scheduler; each step that samples one carries a
    :class:`~surge.structured.manager.GrammarBitmask` the sampler applies.

    Attributes:
        config: the engine configuration.
        num_kv_blocks: KV blocks in the pool; ``block_size`` tokens each.
        max_model_len: longest prompt + output, in tokens.
    """

    def __init__(self, config: EngineConfig, runner: Any | None = None) -> None:
        """Load the model, size the KV pool and build the scheduler.

        Args:
            config: the engine configuration.
            runner: an executor with ``determine_num_kv_blocks``, ``init_kv_cache`` and
                ``execute`` (default: :class:`surge.worker.model_runner.ModelRunner`, or
                :class:`surge.parallel.executor.TPExecutor` with ``tensor_parallel_size > 1``).
        """
        t0 = time.perf_counter()
        built = runner is None
        if runner is None and config.parallel.tensor_parallel_size > 1:
            from surge.parallel.executor import TPExecutor

            runner = TPExecutor(config)
        elif runner is None:
            from surge.worker.model_runner import ModelRunner

            runner = ModelRunner(config)
        if built:
            logger.info(
                "start-up: model built, weights %s in %.1f s",
                "random (--load-format dummy)" if config.model.load_format == "dummy" else "loaded",
                time.perf_counter() - t0,
            )
        self.config = config
        self.runner = runner
        try:
            t0 = time.perf_counter()
            num_blocks = config.cache.num_kv_blocks or runner.determine_num_kv_blocks()
            per_block = getattr(runner, "bytes_per_block", 0)
            if config.cache.num_kv_blocks:
                how = "given (--num-kv-blocks)"
            elif str(config.device).startswith("cuda"):
                how = "sized by a profiling run"
            else:
                how = "sized from the CPU KV budget"
            sched = config.scheduler
            cap = sched.max_num_seqs * -(-sched.max_model_len // config.cache.block_size)
            if not config.cache.num_kv_blocks and num_blocks == cap:
                # the budget holds more: the pool stops at what max_num_seqs sequences could ever use
                budget = "memory left after the profiling run" if "profiling" in how else "CPU KV budget"
                how = f"capped at max_num_seqs x ceil(max_model_len / block_size) (the {budget} holds more)"
            logger.info(
                "start-up: KV pool %s in %.1f s: %d block%s x %d tokens = %d tokens (%.2f GiB, kv_cache_dtype %s)",
                how,
                time.perf_counter() - t0,
                num_blocks,
                "" if num_blocks == 1 else "s",
                config.cache.block_size,
                num_blocks * config.cache.block_size,
                num_blocks * per_block / 2**30 if isinstance(per_block, int) else 0.0,
                config.cache.kv_cache_dtype,
            )
            runner.init_kv_cache(num_blocks)
        except BaseException:
            if hasattr(runner, "close"):
                runner.close()
            raise
        self.num_kv_blocks: int = num_blocks
        self.block_size: int = config.cache.block_size
        self.max_model_len: int = config.scheduler.max_model_len
        if num_blocks * self.block_size < self.max_model_len:
            # served anyway (shorter requests fit); a longer one is a 400 that names both sizes
            profiled = str(config.device).startswith("cuda") and not config.cache.num_kv_blocks
            more = "--gpu-memory-utilization or --num-kv-blocks" if profiled else "--num-kv-blocks"
            logger.warning(
                "start-up: the KV cache holds %d tokens, fewer than max_model_len %d: a request whose prompt "
                "plus max_tokens exceeds %d tokens is refused by the server, and cut there by the offline "
                "LLM when its prompt fits (finish_reason 'length') (raise %s, or lower --max-model-len)",
                num_blocks * self.block_size,
                self.max_model_len,
                num_blocks * self.block_size,
                more,
            )
        self.scheduler = Scheduler(config.scheduler, config.cache, num_blocks)
        self._eos_token_ids = frozenset(config.model.eos_token_ids)
        self._last_stops: tuple[tuple[int, ...], frozenset[int]] = ((), frozenset())
        self.async_scheduling: bool = config.async_scheduling and hasattr(runner, "execute_async")
        self._in_flight: _InFlight | None = None
        # The runner fills a grammar mask after launching the forward and can wait there for
        # the step in flight: a constrained step need not be applied before the next one.
        self._defer_grammar: bool = bool(getattr(runner, "defers_grammar_masks", False))
        # Built on the first request with a grammar: an engine without one pays nothing.
        self._structured: StructuredOutputManager | None = None
        self._request_errors: list[RequestFailure] = []

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> None:
        """Queue one single-sequence request (use :func:`split_n` for ``n > 1``).

        Sampling fields the caller left out take the model's defaults
        (``config.model.sampling_defaults``, from generation_config.json). ``cache_salt``
        (vLLM's): only requests with the same salt share prefix-cache blocks (None: no salt).
        ``priority`` orders it under the ``priority`` scheduling policy (lower first, then
        ``arrival_time``).

        Raises:
            ValueError: ``n != 1``, a ``priority`` that is not an integer, or not 0 under the
                ``fcfs`` policy, ``truncate_prompt_tokens`` over ``max_model_len``, a token
                id outside the vocabulary (prompt, ``logit_bias``,
                ``allowed_token_ids``, bad words), ``bad_words`` without their
                ``bad_words_token_ids``, a ``thinking_token_budget`` without the engine's
                ``reasoning_tokens`` (or with a grammar from the first token after a prompt that
                opens the reasoning, which the forced end would break), a request that
                can never fit (prompt + max_tokens over ``max_model_len``, or more blocks
                than the pool holds).
        """
        if sampling_params.n != 1:
            raise ValueError("LLMEngine.add_request takes n=1; split n > 1 with split_n()")
        priority = self._checked_priority(priority)
        prompt_token_ids = truncated_prompt(
            prompt_token_ids,
            sampling_params.truncate_prompt_tokens,
            self.max_model_len,
            max_tokens=sampling_params.max_tokens,
        )
        self._queue(
            request_id,
            prompt_token_ids,
            self._checked(prompt_token_ids, sampling_params),
            arrival_time,
            cache_salt,
            priority,
        )

    def add_choices(
        self,
        request_ids: list[str],
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float | None = None,
        prompt_logprobs_once: bool = False,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> list[tuple[str, str]]:
        """Queue a request's ``n`` choices as ``n`` single-sequence requests of ids
        ``request_ids`` (:func:`choice_params`: seed ``seed + i``), checking the request once: its
        token lists are checked and its model defaults applied before the fan-out, not once per
        choice (``n: 128`` with 256 long ``bad_words`` took 3.8 s of the engine loop that way).
        With ``prompt_logprobs_once`` only the first choice computes ``prompt_logprobs`` (the
        caller shares them; the prompt's logits were computed ``n`` times, and a request asking
        for them never reads cached prompt blocks). ``cache_salt`` and ``priority`` are
        :meth:`add_request`'s, for every choice.

        Returns:
            ``(request_id, message)`` of each choice refused (all of them when the request is).

        Raises:
            ValueError: ``len(request_ids) != sampling_params.n`` (a caller's bug, not a request's).
        """
        if len(request_ids) != sampling_params.n:
            raise ValueError(f"{len(request_ids)} request ids for a request of n={sampling_params.n} choices")
        try:
            priority = self._checked_priority(priority)
            prompt_token_ids = truncated_prompt(
                prompt_token_ids,
                sampling_params.truncate_prompt_tokens,
                self.max_model_len,
                max_tokens=sampling_params.max_tokens,
            )
            parent = self._checked(prompt_token_ids, sampling_params)
        except ValueError as e:
            return [(rid, str(e)) for rid in request_ids]
        refused = []
        for i, (rid, params) in enumerate(zip(request_ids, choice_params(parent), strict=True)):
            if i > 0 and prompt_logprobs_once and params.prompt_logprobs is not None:
                msgspec.structs.force_setattr(params, "prompt_logprobs", None)  # a copy of its own
            try:
                self._queue(rid, prompt_token_ids, params, arrival_time, cache_salt, priority)
            except ValueError as e:
                refused.append((rid, str(e)))
        return refused

    def _checked_priority(self, priority: int) -> int:
        """``priority`` as an int (a NumPy integer too).

        Raises:
            ValueError: not an integer (a bool is not one), or not 0 under the ``fcfs`` policy
                (which would ignore it).
        """
        if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        priority = int(priority)
        if priority and self.config.scheduler.scheduling_policy != "priority":
            raise ValueError(
                f"priority {priority} needs the priority scheduling policy (LLM(scheduling_policy="
                "'priority') or surge serve --scheduling-policy priority); under fcfs it must be 0"
            )
        return priority

    def _checked(self, prompt_token_ids: list[int], sampling_params: SamplingParams) -> SamplingParams:
        """``sampling_params`` checked against the vocabulary, with the model's defaults and an
        unset ``max_tokens`` filled in (see :meth:`add_request` for the errors raised)."""
        vocab = self.config.model.vocab_size
        if not token_ids_in_range(prompt_token_ids, vocab):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        bad_field = sampling_params.token_ids_in_vocab(vocab)
        if bad_field is not None:
            raise ValueError(f"{bad_field}: token ids must be in [0, {vocab})")
        if sampling_params.bad_words and not sampling_params.bad_words_token_ids:
            raise ValueError(
                "bad_words: tokenize them into bad_words_token_ids first (LLM and the server do)"
            )
        sampling_params = sampling_params.with_model_defaults(self.config.model.sampling_defaults)
        if sampling_params.max_tokens is None:
            sampling_params = self._fill_context(len(prompt_token_ids), sampling_params)
        return sampling_params

    def _queue(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float | None,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> None:
        """Hand a checked single-sequence request to the scheduler, or to the grammar compiler
        first (raises ValueError for an id in use or a request that can never fit)."""
        request = Request(
            request_id,
            prompt_token_ids,
            sampling_params,
            self._eos_token_ids,
            arrival_time,
            cache_salt,
            priority,
            self._stop_token_set(sampling_params.stop_token_ids),
        )
        if sampling_params.thinking_token_budget is not None:
            reasoning = self.config.reasoning_tokens
            if reasoning is None:
                raise ValueError(THINKING_BUDGET_NEEDS_REASONING)
            request.thinking = ThinkingBudget(
                reasoning, sampling_params.thinking_token_budget, prompt_token_ids
            )
            grammar = sampling_params.structured_outputs
            if (
                grammar is not None
                and grammar.reasoning_end_token_id is None
                and request.thinking.in_reasoning
            ):
                raise ValueError(THINKING_BUDGET_BREAKS_GRAMMAR)
        if sampling_params.structured_outputs is None:
            if self._structured is not None and request_id in self._structured.waiting:
                # a request of that id waits for its grammar: the scheduler would refuse it
                # only at admission, inside step()
                raise ValueError(f"request id {request_id!r} is already in use")
            self.scheduler.add_request(request)
            return
        # A request with a grammar waits outside the scheduler until it is compiled.
        structured = self._structured_outputs()
        if request_id in self.scheduler.requests or request_id in structured.waiting:
            raise ValueError(f"request id {request_id!r} is already in use")
        check_request_fits(
            request.num_prompt_tokens,
            sampling_params.max_tokens,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
        )
        request.queued_time = time.monotonic()  # queued now, as vLLM's WAITING_FOR_FSM request
        structured.add(request)

    def _stop_token_set(self, stop_token_ids: tuple[int, ...]) -> frozenset[int]:
        """``stop_token_ids`` as a set; the last one built is reused when the same tuple comes back:
        a request's choices share their parent's tuple, whether they come together
        (:meth:`add_choices`) or one by one (the offline ``LLM``'s :meth:`add_request`)."""
        if self._last_stops[0] is not stop_token_ids:
            self._last_stops = (stop_token_ids, frozenset(stop_token_ids))
        return self._last_stops[1]

    def room_for_output(self, num_prompt_tokens: int) -> int:
        """Output tokens that fit after a prompt of ``num_prompt_tokens`` tokens, in the context and
        the KV pool (:func:`surge.core.scheduler.room_for_output`; zero or negative when none)."""
        return room_for_output(
            num_prompt_tokens,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
        )

    def _fill_context(self, num_prompt_tokens: int, params: SamplingParams) -> SamplingParams:
        """``params`` with ``max_tokens=None`` set to the room the context leaves after a prompt
        of ``num_prompt_tokens`` tokens (vLLM's rule for an unset ``max_tokens``), within what the
        KV pool holds (as the server's unset ``max_tokens``).

        Raises:
            ValueError: the prompt leaves no room, or less than ``min_tokens``.
        """
        room = self.room_for_output(num_prompt_tokens)
        if room < max(1, params.min_tokens):
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens and the KV cache "
                f"holds {self.num_kv_blocks * self.block_size}. However, the prompt has "
                f"{num_prompt_tokens} tokens, which leaves {max(room, 0)} for the completion "
                f"(max_tokens unset{f', min_tokens {params.min_tokens}' if params.min_tokens else ''})."
            )
        return msgspec.structs.replace(params, max_tokens=room)

    def _structured_outputs(self) -> StructuredOutputManager:
        if self._structured is None:
            from surge.structured.manager import StructuredOutputManager

            mc = self.config.model
            self._structured = StructuredOutputManager(
                mc.model,
                mc.vocab_size,
                tuple(mc.eos_token_ids),
                self.config.device,
                self.config.grammar_compile_timeout,
            )
        return self._structured

    def _admit_compiled(self, structured: StructuredOutputManager) -> None:
        """Hand the requests whose grammar is compiled to the scheduler; record failures."""
        ready, failed = structured.take_ready()
        for request in ready:
            try:
                self.scheduler.add_request(request)
            except ValueError as e:
                # add_request refuses ids in use up front; a refusal here must fail this request,
                # never the step (an exception out of step() ends the engine for every request).
                # take_ready made its matcher (no other request of that id has one): drop it.
                structured.grammars.pop(request.request_id, None)
                failed.append(RequestFailure(request.request_id, str(e)))
        self._request_errors += failed

    def take_request_errors(self) -> list[RequestFailure]:
        """The requests ended with an error after :meth:`add_request` returned (a grammar that
        was refused or reached a dead end: status 400; a compile worker that failed: 500),
        since the last call."""
        errors, self._request_errors = self._request_errors, []
        return errors

    def take_grammar_compile_times(self) -> list[float]:
        """Seconds of each grammar compilation finished since the last call."""
        if self._structured is None:
            return []
        return self._structured.cache.take_compile_times()

    def _schedule(self) -> SchedulerOutput:
        """``scheduler.schedule()``, plus the grammar work when requests carry grammars:
        admit compiled requests, forget finished ones, attach the step's token mask; and for
        requests with a thinking budget whose previous token is in flight, where to read it."""
        structured = self._structured
        if structured is None:
            return self._with_pending_ids(self.scheduler.schedule())
        self._admit_compiled(structured)
        scheduler_output = self._with_pending_ids(self.scheduler.schedule())
        structured.abort(scheduler_output.finished_request_ids)
        if scheduler_output.is_empty and structured.waiting and self._in_flight is None:
            structured.wait(_GRAMMAR_WAIT_S)  # nothing to run until a grammar is ready
        else:
            in_flight = self._in_flight
            scheduler_output.grammar = structured.bitmask_for(
                [s.request.request_id for s in scheduler_output.scheduled if s.sample],
                in_flight.handle.sampled_token_ids if in_flight is not None and self._defer_grammar else None,
            )
        return scheduler_output

    def _with_pending_ids(self, scheduler_output: SchedulerOutput) -> SchedulerOutput:
        """Give the step's :class:`~surge.core.thinking_budget.ForcedTokens` the ids of the step
        in flight, when one of its requests' previous token is there (asynchronous scheduling
        with a runner that defers grammar masks; otherwise such a step was applied first)."""
        forced = scheduler_output.forced_tokens
        if forced is not None and forced.needs_pending and self._in_flight is not None:
            forced.pending_ids = self._in_flight.handle.sampled_token_ids
        return scheduler_output

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Abort requests; their KV blocks are free at once. Unknown ids are ignored."""
        if self._structured is not None:
            request_ids = list(request_ids)
            self._structured.abort(request_ids)
        self.scheduler.abort_requests(request_ids)

    def reset_prefix_cache(self) -> int:
        """Evict every cached KV block no request holds; returns how many were evicted."""
        return self.scheduler.kv.reset_prefix_cache()

    def step(self) -> list[EngineOutput]:
        """Run one step and return the new tokens of each request that got one (with
        asynchronous scheduling: launch one step and return those of the step before)."""
        if self.async_scheduling:
            return self._step_async()
        scheduler_output = self._schedule()
        if scheduler_output.is_empty and not scheduler_output.finished_request_ids:
            return []
        # An empty step still reaches the runner so it drops state of finished requests.
        model_output = self.runner.execute(scheduler_output)
        if scheduler_output.is_empty:
            return []
        return self._unfinished_grammars(
            scheduler_output, self.scheduler.update(scheduler_output, model_output)
        )

    def _step_async(self) -> list[EngineOutput]:
        outputs: list[EngineOutput] = []
        if self._in_flight is not None and self._in_flight.exact:
            outputs = self._apply_in_flight()
        scheduler_output = self._schedule()
        launched: _InFlight | None = None
        if not scheduler_output.is_empty or scheduler_output.finished_request_ids:
            handle = self.runner.execute_async(scheduler_output)
            self.scheduler.advance(scheduler_output)
            if not scheduler_output.is_empty:
                if self._defer_grammar:
                    exact = any(
                        s.sample and s.request.sampling_params.needs_token_history
                        for s in scheduler_output.scheduled
                    )
                else:
                    exact = any(
                        s.sample and s.request.sampling_params.needs_previous_token
                        for s in scheduler_output.scheduled
                    )
                launched = _InFlight(scheduler_output, handle, exact)
        try:
            outputs += self._apply_in_flight()
        finally:
            # Kept even when waiting for the previous step raised (e.g. KeyboardInterrupt):
            # :meth:`finish_in_flight` can then settle it.
            self._in_flight = launched
        return outputs

    def _apply_in_flight(self) -> list[EngineOutput]:
        """Wait for the step in flight (if any) and apply its results."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return []
        so = in_flight.scheduler_output
        return self._unfinished_grammars(so, self.scheduler.update(so, in_flight.handle.result()))

    def _unfinished_grammars(self, so: SchedulerOutput, outputs: list[EngineOutput]) -> list[EngineOutput]:
        """``outputs`` less those of requests whose grammar rejected a token: each such request
        becomes a request error (:meth:`take_request_errors`, status 400) instead of a "stop"
        (or, under ``ignore_eos``, a run of stop tokens up to ``max_tokens``), and is aborted
        if it has not finished.

        Such a grammar had reached a dead end (no token can continue it: an impossible pattern or
        schema); its row then allowed only the stop tokens, which the grammar rejects, so the
        output is not what the request asked for. A grammar that ends at a stop token it
        accepts, or a user stop id it allows, is a "stop"."""
        structured = self._structured
        if structured is None or not structured.grammars:
            return outputs
        kept: list[EngineOutput] = []
        by_id: dict[str, Request] | None = None
        dead: list[str] = []
        for out in outputs:
            g = structured.grammars.get(out.request_id)
            if g is not None and g.active:
                if by_id is None:
                    by_id = {s.request.request_id: s.request for s in so.scheduled}
                request = by_id.get(out.request_id)
                if request is not None:
                    g.catch_up(request.output_token_ids)
                    if g.failed:
                        self._request_errors.append(
                            RequestFailure(
                                out.request_id,
                                "structured output: no token can continue the grammar after "
                                f"{request.num_output_tokens - 1} generated tokens (a pattern, schema or grammar "
                                "that nothing satisfies from there)",
                                grammar=True,
                            )
                        )
                        if out.finish_reason is None:
                            dead.append(out.request_id)
                        continue
            kept.append(out)
        if dead:
            self.abort_requests(dead)
        return kept

    def finish_in_flight(self) -> list[EngineOutput]:
        """Wait for the step in flight (asynchronous scheduling), if any, and apply it now
        instead of in the next :meth:`step`; requests aborted since its launch get nothing.
        After :meth:`abort_requests` of every request, the engine then has none unfinished.

        Returns:
            The new tokens of the requests it sampled that are still running.

        Raises:
            Exception: whatever the executor raises while waiting for the step (the step is
                dropped all the same).
        """
        return self._apply_in_flight()

    def has_unfinished_requests(self) -> bool:
        """Whether :meth:`step` has work: a request waiting or running, one waiting for its
        grammar, or a step in flight whose results are not applied yet (asynchronous scheduling;
        it may hold only requests that have finished since its launch). This is vLLM's
        ``EngineCore.has_work`` (its scheduler's requests or a batch in its queue), not its
        ``LLMEngine.has_unfinished_requests`` (requests whose final output the caller awaits):
        a loop that steps while it is True ends with the engine idle, as the server's engine
        loop (:mod:`surge.engine.core_proc`) does; :meth:`finish_in_flight` settles the step in
        flight without scheduling another."""
        return (
            self._in_flight is not None
            or self.scheduler.has_unfinished_requests()
            or (self._structured is not None and bool(self._structured.waiting))
        )

    def get_stats(self) -> SchedulerStats:
        """The scheduler's snapshot; requests waiting for their grammar count as waiting, and as
        deferred (vLLM's ``WAITING_FOR_FSM`` requests are its skipped waiting ones)."""
        stats = self.scheduler.get_stats()
        if self._structured is not None and self._structured.waiting:
            n = len(self._structured.waiting)
            stats = dataclasses.replace(stats, num_waiting=stats.num_waiting + n, num_waiting_deferred=n)
        return stats

    def check_health(self) -> None:
        """Raise when the executor lost a worker (tensor parallelism); a no-op otherwise."""
        check = getattr(self.runner, "check_health", None)
        if check is not None:
            check()

    def close(self) -> None:
        """Settle the step in flight (asynchronous scheduling), abort every request, then stop
        the grammar compile workers and the executor's worker processes, if it has any.
        Idempotent; raises nothing from the step in flight.

        The step in flight is waited for, so that no launched work outlives the executor, and
        dropped: its tokens belong to requests the close aborts. A failure of that step (a
        worker that died) is logged, not raised. Every KV block is free afterwards and
        :meth:`has_unfinished_requests` is False."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            try:
                in_flight.handle.result()
            except Exception as e:
                logger.warning("close(): the step in flight failed while it was settled: %s", e)
        pending = list(self.scheduler.requests)
        if self._structured is not None:
            pending += list(self._structured.waiting)
        self.abort_requests(pending)
        if self._structured is not None:
            self._structured.close()
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()
