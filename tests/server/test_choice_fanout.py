"""A request's ``n`` choices share what the API works out once per prompt: per-choice work on
the event loop grows with ``n`` while every other stream waits."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from transformers import AutoTokenizer

from surge.core.outputs import SchedulerStats
from surge.engine.client import EngineClient
from surge.sampling_params import SamplingParams
from surge.server.generation import Generation
from surge.server.metrics import ServerMetrics
from tests.conftest import STORIES


class _SilentClient:
    """Takes every request and answers none."""

    def add_request(
        self, request_id: str, token_ids: list[int], params: SamplingParams, *_: Any, **__: Any
    ) -> int:
        return 0

    def abort_requests(self, ids: list[str]) -> None:
        pass


def test_the_choices_of_a_prompt_share_one_set_of_reported_stop_ids() -> None:
    """``n: 128`` with 150,000 ``stop_token_ids`` built a set per choice: 1.5 s of the API's
    event loop before the request was even sent."""

    async def main() -> Generation:
        metrics = ServerMetrics("m", lambda: SchedulerStats(0, 0, 0.0, 10, 10, 0), max_model_len=2048)
        client = cast(EngineClient, _SilentClient())
        gen = Generation(client, AutoTokenizer.from_pretrained(STORIES), metrics, 1, 0.0, eos_token_ids=(2,))
        gen.add_prompt("r", [1, 5], SamplingParams(max_tokens=3, n=128, stop_token_ids=tuple(range(150_000))))
        return gen

    gen = asyncio.run(main())
    assert len(gen.choices) == 128
    assert len({id(c.stop_ids) for c in gen.choices}) == 1
    assert 149_999 in gen.choices[-1].stop_ids
