"""Continuous-batching scheduler: one token budget per step, chunked prefill, preemption. No torch.

The engine loop is ``schedule()`` -> executor -> ``update()``. Design (``shared/design.md`` §3,
after vLLM v1's unified scheduler and Sarathi-Serve's chunked prefill, arXiv:2403.02310):

- Every step has one token budget (``max_num_batched_tokens``). Running requests go first
  (a decode takes 1 token, a partly prefilled prompt a chunk), then waiting requests in the
  policy's order take chunks of what is left.
- A request is admitted by the blocks its first chunk needs, keeping a small watermark of
  free blocks; it is never reserved its worst case.
- When a running request cannot get a block, the most recently admitted running request is
  preempted by recompute (blocks freed, progress reset, output kept, back to the front of
  the waiting queue).
- The ``priority`` policy (``SchedulerConfig.scheduling_policy``, vLLM's
  ``--scheduling-policy priority``) changes only the order: the waiting queue is a heap by
  ``(priority, arrival_time)`` (lower first), the preempted request is the running one of the
  largest ``(priority, arrival_time)`` (a request already scheduled in this step gives its
  tokens back; when it is the request that needs the block, the requests after it are still
  scheduled), and a preempted request goes back into the heap by its own key. A waiting
  request never preempts running ones, whatever its priority.
- Asynchronous scheduling (vLLM's ``--async-scheduling``, SGLang's overlap scheduler): the
  engine may schedule step k+1 before step k's sampled ids are back. :meth:`Scheduler.advance`
  marks a launched step's tokens as computed and its samples as pending
  (``Request.num_pending_outputs``); a decode then computes its pending token, whose id the
  executor takes from the previous step's output on the device. A request whose pending
  token will be its last (``max_tokens`` or ``max_model_len``) is not scheduled again; a stop
  found one step late costs one discarded token.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator
from operator import attrgetter

from surge.config import CacheConfig, SchedulerConfig
from surge.core.kv_cache_manager import KVCacheManager, cdiv
from surge.core.outputs import EngineOutput, ModelOutput, ScheduledRequest, SchedulerOutput, SchedulerStats
from surge.core.thinking_budget import ForcedTokens
from surge.request import Request, RequestStatus


def _count(n: int, noun: str) -> str:
    """``"1 block"``, ``"2 blocks"``: a count and its noun, for messages."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def check_request_fits(
    num_prompt_tokens: int,
    max_tokens: int,
    *,
    max_model_len: int,
    block_size: int,
    num_kv_blocks: int,
    max_tokens_name: str = "max_tokens",
) -> None:
    """Reject a request that can never be served, in words fit for an API error.

    Used by :meth:`Scheduler.add_request` and by the API server before it sends a request.

    Args:
        num_prompt_tokens: prompt length in tokens.
        max_tokens: the most tokens to generate.
        max_model_len: longest prompt + output, in tokens.
        block_size: tokens per KV block.
        num_kv_blocks: blocks in the whole KV pool.
        max_tokens_name: what the message calls ``max_tokens`` (chat's ``max_completion_tokens``).

    Raises:
        ValueError: the prompt is empty, prompt + max_tokens exceeds ``max_model_len``, or the
            request needs more KV blocks than the pool holds.
    """
    if num_prompt_tokens == 0:
        raise ValueError("The prompt is empty (it must contain at least one token).")
    total = num_prompt_tokens + max_tokens
    if total > max_model_len:
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{total} tokens ({num_prompt_tokens} in the prompt, {max_tokens} for the completion). "
            f"Please reduce the length of the prompt or {max_tokens_name}."
        )
    blocks = cdiv(total, block_size)
    if blocks > num_kv_blocks:
        raise ValueError(
            f"The request needs {blocks} KV cache blocks ({total} tokens: {num_prompt_tokens} in the "
            f"prompt, {max_tokens} for the completion) but the KV cache holds only "
            f"{_count(num_kv_blocks, 'block')} ({_count(num_kv_blocks * block_size, 'token')}). "
            f"Please reduce the length of the prompt or {max_tokens_name}."
        )


def room_for_output(
    num_prompt_tokens: int, *, max_model_len: int, block_size: int, num_kv_blocks: int
) -> int:
    """Output tokens that fit after a prompt of ``num_prompt_tokens`` tokens: ``min(max_model_len,
    num_kv_blocks * block_size) - num_prompt_tokens`` (zero or negative when none fit). What an
    unset ``max_tokens`` becomes, in the API server and in :class:`surge.engine.llm_engine.LLMEngine`
    alike; a request of that many output tokens passes :func:`check_request_fits`."""
    return min(max_model_len, num_kv_blocks * block_size) - num_prompt_tokens


_priority_key = attrgetter("priority", "arrival_time")


class PriorityQueue:
    """The waiting queue of the ``priority`` policy: a heap by ``(priority, arrival_time)``,
    lower first, ties in insertion order.

    It has the deque methods the scheduler uses, so the ``fcfs`` policy keeps its plain
    ``collections.deque`` and pays nothing. ``append`` and ``appendleft`` both insert by the
    key (a preempted request goes back by its own priority and arrival, as in vLLM: a priority
    queue has no front to put it at); ``[0]`` is the head; iteration is in queue order.
    """

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = 0  # insertion counter: breaks ties without comparing requests

    def append(self, request: Request) -> None:
        """Insert ``request`` by ``(priority, arrival_time)``; O(log n)."""
        heapq.heappush(self._heap, (request.priority, request.arrival_time, self._seq, request))
        self._seq += 1

    appendleft = append

    def popleft(self) -> Request:
        """Remove and return the head. Raises IndexError when empty."""
        return heapq.heappop(self._heap)[3]

    def __getitem__(self, index: int) -> Request:
        """The ``index``-th request in queue order: the head (0) in O(1), others by a sort.
        Raises IndexError past the end."""
        if index == 0:
            return self._heap[0][3]
        return sorted(self._heap)[index][3]

    def remove(self, request: Request) -> None:
        """Remove ``request`` (an abort); O(n). Raises ValueError when it is not queued."""
        for i, entry in enumerate(self._heap):
            if entry[3] is request:
                del self._heap[i]
                heapq.heapify(self._heap)
                return
        raise ValueError(f"request {request.request_id!r} is not in the waiting queue")

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap))


class Scheduler:
    """Decides which requests compute how many tokens each step, and applies the results.

    Args:
        config: budget and sequence limits, and the scheduling policy.
        cache_config: ``block_size`` and ``enable_prefix_caching``.
        num_kv_blocks: blocks in the KV pool (the runner sized it).

    Raises:
        ValueError: ``num_kv_blocks`` is not positive.
    """

    def __init__(self, config: SchedulerConfig, cache_config: CacheConfig, num_kv_blocks: int) -> None:
        self.config = config
        self.block_size = cache_config.block_size
        self.kv = KVCacheManager(num_kv_blocks, cache_config.block_size, cache_config.enable_prefix_caching)
        self.watermark_blocks = math.ceil(config.watermark * num_kv_blocks)
        self._by_priority = config.scheduling_policy == "priority"
        self.waiting: deque[Request] | PriorityQueue = PriorityQueue() if self._by_priority else deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []
        self.num_preemptions_total = 0
        self._num_prompt_logprobs = 0  # unfinished requests that ask for prompt_logprobs
        self._num_thinking = 0  # unfinished requests with a thinking_token_budget

    @property
    def num_running(self) -> int:
        """Requests in the running queue."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue (new and preempted)."""
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        """Whether any request is running or waiting."""
        return bool(self.running or self.waiting)

    def add_request(self, request: Request) -> None:
        """Queue a new request: at the back (``fcfs``) or by its ``(priority, arrival_time)``
        (``priority``).

        Raises:
            ValueError: the id is already in use, the prompt is empty, prompt + max_tokens
                exceeds ``max_model_len``, or the request needs more KV blocks than the pool has.
        """
        rid = request.request_id
        if rid in self.requests:
            raise ValueError(f"request id {rid!r} is already in use")
        check_request_fits(
            request.num_prompt_tokens,
            request.sampling_params.max_tokens,
            max_model_len=self.config.max_model_len,
            block_size=self.block_size,
            num_kv_blocks=self.kv.num_total_blocks,
        )
        request.status = RequestStatus.WAITING
        if request.queued_time is None:  # a request that waited for its grammar was queued then
            request.queued_time = time.monotonic()
        self.requests[rid] = request
        self.waiting.append(request)
        if request.prompt_logprobs is not None:
            self._num_prompt_logprobs += 1
        if request.thinking is not None:
            self._num_thinking += 1

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Abort requests now: free their blocks, mark them FINISHED_ABORTED, drop them from the queues.

        The ids are reported in the next ``SchedulerOutput.finished_request_ids``. Unknown or
        already finished ids are ignored.
        """
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            self._finish(request, RequestStatus.FINISHED_ABORTED)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        request.finished_time = time.monotonic()
        self.kv.free(request)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)
        if request.prompt_logprobs is not None:
            self._num_prompt_logprobs -= 1
        if request.thinking is not None:
            self._num_thinking -= 1

    def _preempt(self, request: Request) -> None:
        """Preempt by recompute: free blocks, reset progress (output kept), front of the queue
        (under ``priority``: back into the heap by its own key).

        A token still in flight for it is dropped (``update`` skips the request); it is
        sampled again after the recompute."""
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.num_pending_outputs = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(request)

    def schedule(self) -> SchedulerOutput:
        """Build the next step. Does not advance ``num_computed_tokens`` (``advance`` or
        ``update`` does).

        Pending tokens (``Request.num_pending_outputs``, asynchronous scheduling) count as
        known: a request with one computes it next, and a request whose pending token will
        end it is left out.

        Returns:
            The step: running requests first (in admission order), then newly admitted
            chunks; ``num_scheduled_tokens <= max_num_batched_tokens``.
        """
        out = SchedulerOutput(
            finished_request_ids=self._finished_ids, any_prompt_logprobs=self._num_prompt_logprobs > 0
        )
        self._finished_ids = []
        budget = self.config.max_num_batched_tokens
        now = time.monotonic()
        scheduled = out.scheduled
        max_len = self.config.max_model_len

        # 1. Running requests: decodes and the next chunks of partly prefilled prompts.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            pending = request.num_pending_outputs
            known = request.num_tokens + pending
            if known == request.num_computed_tokens:
                i += 1  # a max_tokens=0 request whose whole prompt is launched: nothing left
                continue
            if pending and (
                request.num_output_tokens + pending >= request.sampling_params.max_tokens or known >= max_len
            ):
                i += 1  # its last token is in flight: nothing more to compute
                continue
            num_new = min(known - request.num_computed_tokens, budget)
            while not self.kv.allocate_slots(request, num_new):
                if self._by_priority:
                    victim = max(reversed(self.running), key=_priority_key)  # ties: the latest admitted
                    j = self.running.index(victim)
                    del self.running[j]
                    if j < i:  # already passed in this step: its tokens go back to the budget
                        i -= 1
                        budget += self._unschedule(scheduled, victim)
                else:
                    victim = self.running.pop()
                self._preempt(victim)
                out.preempted_request_ids.append(victim.request_id)
                if victim is request:
                    break
            else:
                budget -= num_new
                completes = request.num_computed_tokens + num_new == known
                sample = completes and request.sampling_params.max_tokens > 0
                scheduled.append(ScheduledRequest(request, num_new, sample, completes))
                i += 1
                continue
            if self._by_priority:
                continue  # it preempted itself (the worst running one): the next one is at i now
            break  # the request itself was preempted: it was the last running one

        # 2. Waiting requests in queue order, while budget, sequence slots and blocks allow.
        if not out.preempted_request_ids:
            self._admit_waiting(budget, now, scheduled)

        out.num_scheduled_tokens = sum(s.num_new_tokens for s in scheduled)
        if self._num_thinking:  # requests with a thinking_token_budget: the sampler asks them
            thinking = [s.request for s in scheduled if s.sample and s.request.thinking is not None]
            if thinking:
                out.forced_tokens = ForcedTokens(thinking)
        return out

    @staticmethod
    def _unschedule(scheduled: list[ScheduledRequest], request: Request) -> int:
        """Drop ``request`` from this step's ``scheduled`` (a ``priority`` preemption of a
        request passed earlier in the step); returns the tokens it had (0 if it had none)."""
        for k, s in enumerate(scheduled):
            if s.request is request:
                del scheduled[k]
                return s.num_new_tokens
        return 0

    def _admit_waiting(self, budget: int, now: float, scheduled: list[ScheduledRequest]) -> None:
        max_seqs = self.config.max_num_seqs
        while self.waiting and budget > 0 and len(self.running) < max_seqs:
            request = self.waiting[0]
            # Prompt logprobs need the logits of every prompt position: no cache lookup.
            looked_up = not request.num_prompt_logprobs_missing
            if looked_up:
                cached_blocks, num_cached = self.kv.get_computed_blocks(request)
            else:
                cached_blocks, num_cached = [], 0
            num_new = min(request.num_tokens - num_cached, budget)
            # The watermark keeps a few blocks for running requests; a lone request may use all.
            reserved = self.watermark_blocks if self.running else 0
            if not self.kv.allocate_slots(
                request, num_new, cached_blocks, num_reserved_blocks=reserved, looked_up=looked_up
            ):
                break  # strict order: nobody overtakes the head of the queue
            self.waiting.popleft()
            request.num_computed_tokens = num_cached
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_time is None:
                # Usage reports the prompt tokens the first admission found in the cache;
                # a re-admission after preemption does not change it.
                request.num_cached_tokens = min(num_cached, request.num_prompt_tokens)
                request.first_scheduled_time = now
            self.running.append(request)
            budget -= num_new
            completes = num_cached + num_new == request.num_tokens
            sample = completes and request.sampling_params.max_tokens > 0
            scheduled.append(ScheduledRequest(request, num_new, sample, completes))

    def advance(self, scheduler_output: SchedulerOutput) -> None:
        """Mark a launched step as computed before its results are known (asynchronous
        scheduling): each request's ``num_computed_tokens`` grows by its share and each
        sampled request gets one pending output. Idempotent per step; ``update`` calls it
        when the caller did not."""
        if scheduler_output.advanced:
            return
        scheduler_output.advanced = True
        for s in scheduler_output.scheduled:
            request = s.request
            if request.status != RequestStatus.RUNNING:
                continue
            request.num_computed_tokens += s.num_new_tokens
            if s.sample:
                request.num_pending_outputs += 1

    def update(self, scheduler_output: SchedulerOutput, model_output: ModelOutput) -> list[EngineOutput]:
        """Apply a computed step: advance progress (unless :meth:`advance` did), append
        sampled tokens, finish requests.

        Stop checks, in order: EOS (unless ``ignore_eos``) or a stop token id, once at least
        ``min_tokens`` tokens exist (at once for a request with ``structured_outputs`` or
        ``allowed_token_ids``, whose constraints can leave the sampler no other token) -> "stop";
        ``max_tokens`` reached -> "length"; ``max_model_len`` reached -> "length"; the output's end
        repeats an n-gram (``repetition_detection``, once ``min_tokens`` tokens exist) ->
        "repetition", as vLLM 0.26's ``check_stop``. Requests that
        were aborted, preempted or finished since ``schedule`` are skipped (their token of this
        step is dropped).

        Returns:
            One output per request that got a token this step, in schedule order.

        Raises:
            KeyError: ``model_output`` lacks the token of a request scheduled with ``sample``.
        """
        self.advance(scheduler_output)
        outputs: list[EngineOutput] = []
        max_len = self.config.max_model_len
        now = time.monotonic()
        finished: list[Request] = []
        if model_output.prompt_logprobs:
            self._store_prompt_logprobs(model_output)
        logprobs = model_output.logprobs
        prompt_logprobs = self._num_prompt_logprobs > 0
        for s in scheduler_output.scheduled:
            request = s.request
            if request.status != RequestStatus.RUNNING:
                continue  # aborted / preempted / finished since schedule()
            if not s.sample:
                # The step of the last chunk, not num_computed_tokens: under asynchronous
                # scheduling that counts the chunks launched after this step too, whose prompt
                # rows would be lost.
                if s.completes and request.sampling_params.max_tokens == 0:
                    outputs.append(self._finish_prompt_only(request))
                    finished.append(request)
                continue  # no token
            request.num_pending_outputs -= 1
            token = model_output.sampled_token_ids[request.request_id]
            request.output_token_ids.append(token)
            first = request.first_token_time is None
            if first:
                request.first_token_time = now
            params = request.sampling_params
            n_out = request.num_output_tokens
            status: RequestStatus | None = None
            stop_token: int | None = None
            # Under min_tokens the sampler bans EOS and the stop ids unless the request's grammar or
            # allowed_token_ids leave it no other token, so a constrained request that samples one
            # anyway has ended (its grammar is complete): it stops instead of padding with EOS.
            if (
                (token in request.eos_token_ids and not params.ignore_eos) or token in request.stop_token_set
            ) and (
                n_out >= params.min_tokens
                or params.structured_outputs is not None
                or params.allowed_token_ids is not None
            ):
                status, stop_token = RequestStatus.FINISHED_STOPPED, token
            elif n_out >= params.max_tokens or request.num_tokens >= max_len:
                status = RequestStatus.FINISHED_LENGTH
            elif (
                params.repetition_detection is not None
                and n_out >= params.min_tokens
                and params.repetition_detection.detects(request.output_token_ids)
            ):
                status = RequestStatus.FINISHED_REPETITION
            out = EngineOutput(
                request.request_id,
                [token],
                num_prompt_tokens=request.num_prompt_tokens,
                num_cached_tokens=request.num_cached_tokens,
            )
            if first:  # the times the API's request histograms need, even if the API ends it
                out.queued_time = request.queued_time
                out.first_scheduled_time = request.first_scheduled_time
                out.first_token_time = now
            if logprobs:
                out.logprobs = logprobs.get(request.request_id)
            if prompt_logprobs and request.prompt_logprobs is not None and not request.prompt_logprobs_sent:
                out.prompt_logprobs = request.prompt_logprobs
                request.prompt_logprobs_sent = True
            if status is not None:
                self._finish(request, status)
                finished.append(request)
                out.finish_reason = status.finish_reason
                out.stop_token_id = stop_token
                out.arrival_time = request.arrival_time
                out.first_scheduled_time = request.first_scheduled_time
                out.first_token_time = request.first_token_time
                out.finished_time = request.finished_time
                out.queued_time = request.queued_time
                out.num_preemptions = request.num_preemptions
            outputs.append(out)
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
        return outputs

    def _finish_prompt_only(self, request: Request) -> EngineOutput:
        """Finish a ``max_tokens=0`` request whose prompt is computed: "length", no token, its
        prompt logprobs (when asked) and times."""
        self._finish(request, RequestStatus.FINISHED_LENGTH)
        out = EngineOutput(
            request.request_id,
            [],
            finish_reason=RequestStatus.FINISHED_LENGTH.finish_reason,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens,
            arrival_time=request.arrival_time,
            first_scheduled_time=request.first_scheduled_time,
            finished_time=request.finished_time,
            queued_time=request.queued_time,
            num_preemptions=request.num_preemptions,
        )
        if request.prompt_logprobs is not None:
            out.prompt_logprobs = request.prompt_logprobs
            request.prompt_logprobs_sent = True
        return out

    def _store_prompt_logprobs(self, model_output: ModelOutput) -> None:
        """Append each request's newly computed prompt-token rows, skipping rows already
        stored (a recompute after preemption computes some positions twice)."""
        for request_id, (first, rows) in model_output.prompt_logprobs.items():
            request = self.requests.get(request_id)
            if request is None or request.prompt_logprobs is None:
                continue  # finished or aborted since
            stored = request.prompt_logprobs
            skip = len(stored) + 1 - first
            if 0 <= skip < len(rows):
                stored.extend(rows, skip)

    def get_stats(self) -> SchedulerStats:
        """A snapshot for metrics: queue sizes, KV usage, preemption and prefix-cache counters."""
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=self.kv.usage,
            num_free_blocks=self.kv.num_free_blocks,
            num_total_blocks=self.kv.num_total_blocks,
            num_preemptions_total=self.num_preemptions_total,
            prefix_cache_hit_tokens=self.kv.prefix_cache_hit_tokens,
            prefix_cache_query_tokens=self.kv.prefix_cache_query_tokens,
            prefix_cache_requests=self.kv.prefix_cache_requests,
        )
