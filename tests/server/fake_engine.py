"""A torch-free stand-in for LLMEngine, for tests of the engine process and client."""

from __future__ import annotations

import time
from collections.abc import Iterable

from surge.config import EngineConfig
from surge.core.outputs import EngineOutput, RequestFailure, SchedulerStats
from surge.engine.llm_engine import choice_params
from surge.sampling_params import SamplingParams


class FakeEngine:
    """Emits token ``(prompt[-1] + k + seed) % 500 + 3`` at output position k (seed 0 when unset);
    rejects prompts with token 999 and, as the real engine, params with ``n != 1``.

    A prompt starting with token 666 makes ``step`` raise (a crashed engine); one starting with
    token 777 (778) is ended by its first step with a late error of status 500 (400), as a
    grammar whose compile worker died (that was refused) is.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.num_kv_blocks = 64
        self.block_size = config.cache.block_size
        self.max_model_len = config.scheduler.max_model_len
        self._reqs: dict[str, tuple[list[int], SamplingParams, int]] = {}
        self._late: list[RequestFailure] = []

    def add_request(
        self, request_id, prompt_token_ids, sampling_params, arrival_time=None, cache_salt=None, priority=0
    ) -> None:
        if 999 in prompt_token_ids:
            raise ValueError("token 999 is not allowed")
        if sampling_params.n != 1:
            raise ValueError("LLMEngine.add_request takes n=1")
        if request_id in self._reqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        self._reqs[request_id] = (list(prompt_token_ids), sampling_params, 0)

    def add_choices(
        self,
        request_ids,
        prompt_token_ids,
        sampling_params,
        arrival_time=None,
        prompt_logprobs_once=False,
        cache_salt=None,
        priority=0,
    ) -> list:
        """As ``LLMEngine.add_choices``: the request is checked once, then fanned out."""
        if len(request_ids) != sampling_params.n:
            raise ValueError(f"{len(request_ids)} request ids for a request of n={sampling_params.n} choices")
        if 999 in prompt_token_ids:
            return [(rid, "token 999 is not allowed") for rid in request_ids]
        refused = []
        for rid, params in zip(request_ids, choice_params(sampling_params), strict=True):
            try:
                self.add_request(rid, prompt_token_ids, params, arrival_time)
            except ValueError as e:
                refused.append((rid, str(e)))
        return refused

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._reqs.pop(rid, None)

    def step(self) -> list[EngineOutput]:
        time.sleep(0.001)  # a real step takes time; without it the API side drowns in messages
        outs = []
        for rid, (prompt, params, k) in list(self._reqs.items()):
            if prompt[0] == 666:
                raise RuntimeError("simulated engine failure")
            if prompt[0] in (777, 778):
                del self._reqs[rid]
                status = 500 if prompt[0] == 777 else 400
                self._late.append(RequestFailure(rid, f"simulated late failure {status}", status))
                continue
            tok = (prompt[-1] + k + (params.seed or 0)) % 500 + 3
            k += 1
            done = k >= params.max_tokens
            out = EngineOutput(rid, [tok], num_prompt_tokens=len(prompt))
            if done:
                out.finish_reason = "length"
                del self._reqs[rid]
            else:
                self._reqs[rid] = (prompt, params, k)
            outs.append(out)
        return outs

    def take_request_errors(self) -> list[RequestFailure]:
        late, self._late = self._late, []
        return late

    def take_grammar_compile_times(self) -> list[float]:
        return []

    def has_unfinished_requests(self) -> bool:
        return bool(self._reqs)

    def reset_prefix_cache(self) -> int:
        self.resets = getattr(self, "resets", 0) + 1
        return 0

    def get_stats(self) -> SchedulerStats:
        n = len(self._reqs)
        return SchedulerStats(n, 0, n / 64, 64 - n, 64, 0)


class OutOfMemoryEngine:
    """An engine whose construction runs out of memory, like a KV pool too large for the host."""

    def __init__(self, config: EngineConfig) -> None:
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 2048000000000 bytes. Error code 12 (Cannot allocate memory)"
        )


class BrokenEngine:
    """An engine whose construction fails, like a model folder with bad weights."""

    def __init__(self, config: EngineConfig) -> None:
        raise ValueError("weights file is corrupt\nsecond line")
