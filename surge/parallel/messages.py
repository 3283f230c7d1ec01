"""The msgspec structs between the engine process and its tensor-parallel workers.

Engine -> every worker at once (ZMQ XPUB -> SUB, one encoded message per step):
:class:`StepMessage`, :class:`InitKVCache`, :class:`ShutdownWorkers`.

Workers -> engine (ZMQ PUSH -> PULL): :class:`WorkerReady` / :class:`WorkerStartupError` from
every rank at start-up, :class:`KVCacheReady` from every rank after :class:`InitKVCache`, then
:class:`StepResult` from rank 0 for each step that samples, and :class:`WorkerFatalError` from a
rank whose loop raised.
"""

from __future__ import annotations

import msgspec

from surge.core.logprobs import LogprobsLists
from surge.sampling_params import SamplingParams


class NewRequestData(msgspec.Struct, array_like=True):
    """A request a worker has not seen (or a new request reusing a finished one's id).

    Attributes: request_id; prompt_token_ids; sampling_params.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams


class ScheduledData(msgspec.Struct, array_like=True):
    """One request's share of a step and what changed in it since the worker last saw it.

    Attributes:
        request_id: the request.
        num_new_tokens: tokens to compute this step.
        sample: whether this step samples a token for it.
        num_computed_tokens: the request's ``num_computed_tokens`` when it was scheduled.
        new_block_ids: block ids appended to its block table (the whole table when
            ``blocks_reset``).
        blocks_reset: the engine replaced the request's block table (preemption).
        new_output_ids: output token ids appended (all of them when ``outputs_reset``).
        outputs_reset: the engine's output list shrank (never in practice; kept exact).
    """

    request_id: str
    num_new_tokens: int
    sample: bool
    num_computed_tokens: int
    new_block_ids: list[int]
    blocks_reset: bool
    new_output_ids: list[int]
    outputs_reset: bool


class StepMessage(msgspec.Struct, tag=True, array_like=True):
    """One step of the scheduler, for every rank.

    Attributes:
        step: sequence number (from 0) of the step messages.
        new_requests: requests the workers must create before applying ``scheduled``.
        scheduled: the step's requests, in the scheduler's order.
        num_scheduled_tokens: total tokens of the step.
        preempted_request_ids, finished_request_ids: as in ``SchedulerOutput``.
        any_prompt_logprobs: as in ``SchedulerOutput``; rank 0 then answers every step (its
            prompt logprobs may come from a chunk that samples nothing).
        grammar_mask: the step's grammar token mask (``[len(grammar_request_ids), ceil(V / 32)]``
            int32, bytes), filled by the engine; empty when no sampled request has a grammar.
        grammar_request_ids: the requests of the mask's rows.
        forced_tokens: as in ``SchedulerOutput`` (a spent ``thinking_token_budget``'s reasoning
            end), decided by the engine so every rank samples the same ids.
    """

    step: int
    new_requests: list[NewRequestData]
    scheduled: list[ScheduledData]
    num_scheduled_tokens: int
    preempted_request_ids: list[str]
    finished_request_ids: list[str]
    any_prompt_logprobs: bool = False
    grammar_mask: bytes = b""
    grammar_request_ids: list[str] = msgspec.field(default_factory=list)
    forced_tokens: dict[str, int] | None = None


class InitKVCache(msgspec.Struct, tag=True, array_like=True):
    """Allocate the KV pool (and capture CUDA graphs). Attributes: num_blocks."""

    num_blocks: int


class ShutdownWorkers(msgspec.Struct, tag=True, array_like=True):
    """Leave the worker loop and exit."""


WorkerInput = StepMessage | InitKVCache | ShutdownWorkers


class WorkerReady(msgspec.Struct, tag=True, array_like=True):
    """A rank loaded its shard. Attributes: rank; pid; num_kv_blocks (the MIN over ranks);
    settings: the rank's :meth:`~surge.config.EngineConfig.shared_settings`, which the engine
    compares with its own (a rank on another host was started by its own command line)."""

    rank: int
    pid: int
    num_kv_blocks: int
    settings: dict[str, str] = msgspec.field(default_factory=dict)


class WorkerStartupError(msgspec.Struct, tag=True, array_like=True):
    """A rank could not start. Attributes: rank; message (one line); user_error: the rank
    refused the configuration or the model folder (a ``ValueError``), rather than crashing."""

    rank: int
    message: str
    user_error: bool = False


class KVCacheReady(msgspec.Struct, tag=True, array_like=True):
    """A rank allocated its KV pool. Attributes: rank."""

    rank: int


class StepResult(msgspec.Struct, tag=True, array_like=True):
    """Rank 0's sampled ids of one step, in the order of the step's ``sample`` requests.

    Attributes: step (the step's sequence number); token_ids; logprobs and prompt_logprobs
    (as in ``ModelOutput``, for the requests that ask).
    """

    step: int
    token_ids: list[int]
    logprobs: dict[str, LogprobsLists] = msgspec.field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[int, LogprobsLists]] = msgspec.field(default_factory=dict)


class WorkerFatalError(msgspec.Struct, tag=True, array_like=True):
    """A rank's loop raised; it exits right after. Attributes: rank; message (one line)."""

    rank: int
    message: str


WorkerOutput = WorkerReady | WorkerStartupError | KVCacheReady | StepResult | WorkerFatalError
