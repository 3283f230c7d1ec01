"""The types that cross the scheduler / executor / API boundaries. No torch here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from surge.core.logprobs import Logprob, LogprobsLists, PositionLogprobs
from surge.request import Request

__all__ = [
    "CompletionOutput",
    "EngineOutput",
    "Logprob",
    "LogprobsLists",
    "ModelOutput",
    "PositionLogprobs",
    "RequestFailure",
    "RequestOutput",
    "ScheduledRequest",
    "SchedulerOutput",
    "SchedulerStats",
]


class RequestFailure(NamedTuple):
    """A request the engine ended with an error after ``add_request`` returned.

    Attributes:
        request_id: the request.
        message: one line for the client (the HTTP error body's message).
        status: the HTTP status it maps to: 400 when the request is at fault (its grammar was
            refused, or reached a dead end), 500 when the server is (a grammar compile worker
            that died or could not start).
        grammar: the request's grammar is at fault (refused, or reached a dead end): the API
            names the request field that carried it.
    """

    request_id: str
    message: str
    status: int = 400
    grammar: bool = False


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step.

    The executor computes tokens ``[start, start + num_new_tokens)`` of
    ``request``'s prompt + output, where ``start = request.num_computed_tokens`` at the
    time of scheduling (the scheduler advances ``num_computed_tokens`` after the step is
    launched, in ``advance`` or ``update``). With asynchronous scheduling the one token of
    a decode may be pending (``start == request.num_tokens``): sampled by the previous
    step, its id is read on the device.

    Attributes:
        request: the request (its ``block_ids`` is the block table for this step).
        num_new_tokens: tokens to compute this step (>= 1).
        sample: True when this chunk reaches the end of the known tokens, so the executor
            samples one new token; a prompt chunk that stops short samples nothing.
        completes: this chunk reaches the end of the known tokens (``sample`` unless
            ``max_tokens`` is 0). Applying such a chunk of a ``max_tokens=0`` request, whose
            chunks sample nothing, finishes it; with asynchronous scheduling its
            ``num_computed_tokens`` reaches the end as soon as the last chunk is launched,
            while the steps before it may still be applied.
    """

    request: Request
    num_new_tokens: int
    sample: bool
    completes: bool = False


@dataclass(slots=True)
class SchedulerOutput:
    """What one step computes: running requests first, then prefill chunks.

    Attributes:
        scheduled: requests of this step, decodes and running chunks before new prefills.
        num_scheduled_tokens: total tokens of the step (<= ``max_num_batched_tokens``).
        preempted_request_ids: requests preempted while building this step.
        finished_request_ids: requests that finished or were aborted since the previous
            step; the executor may drop any per-request state it keeps for them.
        advanced: whether :meth:`Scheduler.advance` has applied this step's progress.
        any_prompt_logprobs: some unfinished request asks for ``prompt_logprobs`` (the
            executor looks for prompt positions to score only then).
        grammar: the token mask of the step's constrained rows, to apply to the logits
            before sampling (a :class:`surge.structured.manager.GrammarBitmask`; set by the
            engine), or None when no sampled request has a grammar.
        forced_tokens: the step's rows whose request has a ``thinking_token_budget`` (a
            :class:`surge.core.thinking_budget.ForcedTokens`: the sampler asks it which rows a
            spent budget forces to the reasoning end, and overwrites their sampled ids), or None
            when no sampled request has one.
    """

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_scheduled_tokens: int = 0
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)
    advanced: bool = False
    any_prompt_logprobs: bool = False
    grammar: Any = None
    forced_tokens: Any = None

    @property
    def is_empty(self) -> bool:
        """Whether the step schedules no request."""
        return not self.scheduled


@dataclass(slots=True)
class ModelOutput:
    """What the executor returns for one step.

    Attributes:
        sampled_token_ids: request_id -> the one token sampled for it, for every scheduled
            request with ``sample=True`` (and only those).
        logprobs: request_id -> one row for its sampled token, for sampled requests whose
            ``SamplingParams.logprobs`` is set (empty when none asks).
        prompt_logprobs: request_id -> ``(first, rows)``: rows for prompt tokens ``first,
            first + 1, ...`` (index in the prompt, >= 1) computed this step, for requests
            whose ``SamplingParams.prompt_logprobs`` is set.
    """

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[int, LogprobsLists]] = field(default_factory=dict)


class EngineOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """New tokens of one request after a step (sent from the engine to the API process).

    Attributes:
        request_id: the request.
        new_token_ids: tokens generated this step (usually one).
        finish_reason: "stop", "length", "abort" or "repetition" once finished, else None.
        stop_token_id: the EOS or stop token that ended it, if any (it is part of
            ``new_token_ids``; the detokenizer leaves it out of the text).
        num_prompt_tokens: prompt length in tokens.
        num_cached_tokens: prompt tokens served from the prefix cache.
        arrival_time, first_scheduled_time, first_token_time, finished_time: seconds
            (``time.monotonic()`` of the engine process); set on the final output (the first
            output carries ``first_scheduled_time`` and ``first_token_time`` too).
        num_preemptions: times the request was preempted.
        queued_time: seconds (``time.monotonic()`` of the engine process) when the scheduler
            queued it (vLLM's ``QUEUED`` event); set on the first and the final output.
        logprobs: one row per token of ``new_token_ids`` when the request asked for
            ``logprobs``.
        prompt_logprobs: rows for prompt tokens 1..P-1 (the first has none), on the
            request's first output, when it asked for ``prompt_logprobs``.
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_token_id: int | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    arrival_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    logprobs: LogprobsLists | None = None
    prompt_logprobs: LogprobsLists | None = None
    queued_time: float | None = None

    @property
    def finished(self) -> bool:
        """Whether this output ends its request (a finish reason is set)."""
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """Snapshot of the scheduler for metrics and logs.

    Attributes:
        num_running, num_waiting: requests in each queue.
        kv_cache_usage: fraction of KV blocks in use (0..1).
        num_free_blocks, num_total_blocks: KV pool figures in blocks.
        num_preemptions_total: preemptions since start.
        prefix_cache_hit_tokens, prefix_cache_query_tokens: prompt tokens found in / looked up
            in the prefix cache since start, at each request's first admission (a re-admission
            after a preemption is left out, as in vLLM's counters).
        prefix_cache_requests: the first admissions those two counters count, since start.
        num_waiting_deferred: the requests of ``num_waiting`` that cannot be scheduled yet (their
            grammar is compiling: vLLM's "deferred" waiting reason).
    """

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_free_blocks: int
    num_total_blocks: int
    num_preemptions_total: int
    prefix_cache_hit_tokens: int = 0
    prefix_cache_query_tokens: int = 0
    prefix_cache_requests: int = 0
    num_waiting_deferred: int = 0


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence of a request (offline API, like vLLM's).

    Attributes:
        index: choice index in ``[0, n)``.
        text: the generated text (stop strings and stop tokens excluded); ``""`` under
            ``SamplingParams(detokenize=False)``.
        token_ids: the generated token ids (a final EOS or stop token included).
        finish_reason: "stop", "length" or "repetition".
        stop_reason: the stop string or stop token id that ended it, if any.
        logprobs: with ``SamplingParams.logprobs``, one dict per token of ``token_ids`` (each
            ``decoded_token`` None under ``detokenize=False``).
        lora_request: always None: Surge serves no LoRA adapters (vLLM's field, so that code
            written for vLLM reads it).
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None = None
    logprobs: list[PositionLogprobs] | None = None
    lora_request: None = None

    @property
    def cumulative_logprob(self) -> float | None:
        """The sum of the generated tokens' log-probabilities (natural log, raw logits, as the
        ``logprobs`` report them), or None without ``SamplingParams.logprobs`` (as vLLM)."""
        if self.logprobs is None:
            return None
        return sum(pos[t].logprob for t, pos in zip(self.token_ids, self.logprobs, strict=False) if t in pos)

    def finished(self) -> bool:
        """Whether the sequence has ended (a ``finish_reason`` is set), as vLLM's method."""
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """The result of one prompt of :meth:`surge.LLM.generate`.

    Attributes:
        request_id: the request's id (the offline ``LLM``'s: its prompts counted in decimal, "0", "1", ..., as vLLM's).
        prompt: the prompt text (None when the prompt was given as token ids).
        prompt_token_ids: the prompt in tokens.
        outputs: ``n`` completions, by index.
        num_cached_tokens: prompt tokens served from the prefix cache.
        prompt_logprobs: with ``SamplingParams.prompt_logprobs``, None for the first prompt
            token then one dict per prompt token.
        metrics: always None: the offline API keeps no per-request timings (vLLM's V1 engine
            leaves its ``RequestOutput.metrics`` None too unless stats logging is on); the
            attribute exists so that code written for vLLM reads it.
        lora_request: always None: Surge serves no LoRA adapters.
        encoder_prompt, encoder_prompt_token_ids: always None: Surge serves decoder-only models
            (vLLM's encoder-decoder fields).
        kv_transfer_params, ec_transfer_params: always None: Surge has no KV or encoder-cache
            connector (vLLM's disaggregated serving fields).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    metrics: None = None
    lora_request: None = None
    encoder_prompt: None = None
    encoder_prompt_token_ids: None = None
    kv_transfer_params: None = None
    ec_transfer_params: None = None

    @property
    def finished(self) -> bool:
        """Whether every completion of the request has a finish reason."""
        return all(o.finish_reason is not None for o in self.outputs)
