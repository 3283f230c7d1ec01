"""Data parallelism: several engine replicas behind one API server.

:class:`DPEngineClient` has the surface of :class:`~surge.engine.client.EngineClient` that the
server uses, over ``data_parallel_size`` of them (one engine process each, each with its own
tensor-parallel workers and GPUs). A request goes to the live replica with the fewest requests
in flight (sent and not finished: the replica's waiting plus running requests, counted in this
process so that requests still on their way count too). The ``n`` samples of a prompt (one
request, fanned out by the engine) stay on one replica, so the samples
share their prompt's KV blocks through prefix caching; the prompts of one HTTP request (a
completions prompt list, a batch of chats) are routed one by one, as vLLM routes them, so a
list of 64 prompts is spread over the replicas. The server is ready only while every replica
is.

With several API processes (``--api-server-count``) each one routes its own requests, and a
replica's load is the engine's own count of waiting plus running requests (in the stats of every
batch, which every API process receives) plus this process's requests not yet counted there
(:attr:`EngineClient.load`), so every process sees the requests of the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable

import msgspec

from surge.config import EngineConfig
from surge.core.outputs import SchedulerStats
from surge.engine.client import EngineAttachment, EngineClient, EngineDeadError, EngineStartError, QueueItem
from surge.engine.core_proc import EngineFactory, EngineReady
from surge.parallel.launch import replica_device
from surge.sampling_params import SamplingParams

logger = logging.getLogger("surge.parallel")


def replica_config(config: EngineConfig, rank: int) -> EngineConfig:
    """``config`` for replica ``rank``: its first GPU (:func:`replica_device`) and its rank (which
    sets its store port when ``master_port`` is given)."""
    return dataclasses.replace(
        config,
        device=replica_device(config, rank),
        parallel=dataclasses.replace(config.parallel, data_parallel_rank=rank),
    )


def make_engine_client(
    config: EngineConfig,
    *,
    engine_factory: EngineFactory | None = None,
    log_level: int = logging.INFO,
    attach: list[EngineAttachment] | None = None,
) -> EngineClient | DPEngineClient:
    """One :class:`EngineClient`, or a :class:`DPEngineClient` with ``data_parallel_size > 1``;
    ``attach`` (one per replica) connects to engines another process started."""
    if config.parallel.data_parallel_size == 1:
        one = None if attach is None else attach[0]
        return EngineClient(config, engine_factory=engine_factory, log_level=log_level, attach=one)
    return DPEngineClient(config, engine_factory=engine_factory, log_level=log_level, attach=attach)


def sum_stats(stats: list[SchedulerStats | None]) -> SchedulerStats | None:
    """The replicas' stats added up (KV usage: used blocks over all blocks)."""
    known = [s for s in stats if s is not None]
    if not known:
        return None
    total = sum(s.num_total_blocks for s in known)
    free = sum(s.num_free_blocks for s in known)
    return SchedulerStats(
        num_running=sum(s.num_running for s in known),
        num_waiting=sum(s.num_waiting for s in known),
        kv_cache_usage=(total - free) / total if total else 0.0,
        num_free_blocks=free,
        num_total_blocks=total,
        num_preemptions_total=sum(s.num_preemptions_total for s in known),
        prefix_cache_hit_tokens=sum(s.prefix_cache_hit_tokens for s in known),
        prefix_cache_query_tokens=sum(s.prefix_cache_query_tokens for s in known),
        prefix_cache_requests=sum(s.prefix_cache_requests for s in known),
        num_waiting_deferred=sum(s.num_waiting_deferred for s in known),
    )


class DPEngineClient:
    """``data_parallel_size`` engine replicas as one client (see the module docstring).

    Args:
        config: the engine configuration (``parallel.data_parallel_size > 1``).
        engine_factory, log_level: as for :class:`EngineClient`, for every replica.
        attach: one :class:`EngineAttachment` per replica when the engines were started by
            another process (one of several API processes); routing then goes by
            :attr:`EngineClient.load`.

    Attributes:
        replicas: one :class:`EngineClient` per replica, by replica rank.
        info: replica 0's ready message with the smallest KV pool of all, once started.
        num_routed: requests (prompts, whatever their ``n``) sent to each replica since start.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        engine_factory: EngineFactory | None = None,
        log_level: int = logging.INFO,
        attach: list[EngineAttachment] | None = None,
    ) -> None:
        self.config = config
        size = config.parallel.data_parallel_size
        if attach is not None and len(attach) != size:
            raise ValueError(f"attach has {len(attach)} replicas, data_parallel_size is {size}")
        self._shared = attach is not None
        self.replicas = [
            EngineClient(
                replica_config(config, d),
                engine_factory=engine_factory,
                log_level=log_level,
                attach=None if attach is None else attach[d],
                replica=d,
            )
            for d in range(size)
        ]
        self.info: EngineReady | None = None
        self.num_routed = [0] * len(self.replicas)

    @property
    def pid(self) -> int | None:
        """Replica 0's engine process pid (None before it has started)."""
        return self.replicas[0].pid

    @property
    def is_ready(self) -> bool:
        """True while every replica is started and alive."""
        return self.info is not None and all(r.is_ready for r in self.replicas)

    @property
    def dead_reason(self) -> str | None:
        """Why a replica is gone, naming it (None while all live)."""
        return next((r.dead_reason for r in self.replicas if r.dead_reason is not None), None)

    @property
    def num_inflight(self) -> int:
        """Requests sent to any replica and not finished yet."""
        return sum(r.num_inflight for r in self.replicas)

    @property
    def stats(self) -> SchedulerStats | None:
        """The replicas' latest stats added up."""
        return sum_stats(self.get_replica_stats())

    def seconds_without_progress(self) -> float:
        """The longest time any replica with requests in flight has gone without reporting a step."""
        return max(r.seconds_without_progress() for r in self.replicas)

    def get_replica_stats(self) -> list[SchedulerStats | None]:
        """Each replica's latest stats, by replica rank."""
        return [r.stats for r in self.replicas]

    async def start(self) -> EngineReady:
        """Start every replica at once and wait for all.

        Raises:
            EngineStartError: a replica failed to start (the others are shut down).
        """
        results = await asyncio.gather(*(r.start() for r in self.replicas), return_exceptions=True)
        for d, res in enumerate(results):
            if isinstance(res, BaseException):
                await self.shutdown()
                if isinstance(res, EngineStartError):
                    raise EngineStartError(f"replica {d}: {res}", user_error=res.user_error)
                raise res
        infos = [res for res in results if isinstance(res, EngineReady)]
        self.info = msgspec.structs.replace(infos[0], num_kv_blocks=min(i.num_kv_blocks for i in infos))
        logger.info("%d replicas ready (engine pids %s)", len(infos), ", ".join(str(i.pid) for i in infos))
        return self.info

    def pick_replica(self) -> int:
        """The replica with the fewest requests in flight (the lowest rank on a tie): counted in
        this process, or with engines shared by several API processes, the engine's waiting
        plus running requests and this process's not yet counted there."""
        if self._shared:
            loads = [r.load for r in self.replicas]
        else:
            loads = [r.num_inflight for r in self.replicas]
        return loads.index(min(loads))

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        queue: asyncio.Queue[QueueItem],
        index: int = 0,
        arrival_time: float | None = None,
        prompt_logprobs_once: bool = False,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> int:
        """Send one request (its ``n`` choices together) to the replica with the least load
        (see the module docstring), as :meth:`EngineClient.add_request`.

        Returns:
            The replica's index (the ``engine`` label of the request's metrics).

        Raises:
            EngineDeadError: a replica is not running.
        """
        if not self.is_ready:
            raise EngineDeadError(self.dead_reason or "the engine is not running")
        d = self.pick_replica()
        self.replicas[d].add_request(
            request_id,
            prompt_token_ids,
            sampling_params,
            queue,
            index,
            arrival_time,
            prompt_logprobs_once,
            cache_salt,
            priority,
        )
        self.num_routed[d] += 1  # counted once the replica took it
        return d

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Abort requests on whichever replica holds them (each ignores ids it does not hold)."""
        ids = list(request_ids)
        for r in self.replicas:
            r.abort_requests(ids)

    def reset_prefix_cache(self) -> None:
        """Reset every replica's prefix cache (see :meth:`EngineClient.reset_prefix_cache`).

        Raises:
            EngineDeadError: a replica is not running.
        """
        if not self.is_ready:
            raise EngineDeadError(self.dead_reason or "the engine is not running")
        for r in self.replicas:
            r.reset_prefix_cache()

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every replica. Safe to call more than once."""
        await asyncio.gather(*(r.shutdown(timeout) for r in self.replicas), return_exceptions=True)
