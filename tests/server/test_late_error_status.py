"""An engine's late request error keeps its HTTP status through the API's generation: a refused
grammar answers 400, a grammar compile worker that died answers 500 (the server's fault)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from transformers import AutoTokenizer

from surge.core.outputs import SchedulerStats
from surge.engine.client import EngineClient
from surge.engine.core_proc import RequestError
from surge.sampling_params import SamplingParams
from surge.server.errors import ApiError, error_body
from surge.server.generation import Generation
from surge.server.metrics import ServerMetrics
from tests.conftest import STORIES


class _RejectingClient:
    """Answers every added request (each of its choices) with one RequestError of ``status``."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.aborted: list[str] = []

    def add_request(
        self,
        request_id: str,
        token_ids: list[int],
        params: SamplingParams,
        queue: asyncio.Queue,
        first: int,
        **_: Any,
    ) -> int:
        queue.put_nowait((first, RequestError(request_id, f"failed with {self.status}", self.status)))
        return 0

    def abort_requests(self, ids: list[str]) -> None:
        self.aborted += ids


@pytest.mark.parametrize("status", [400, 500])
def test_a_late_request_error_answers_with_its_status(status: int) -> None:
    async def main() -> ApiError:
        client = _RejectingClient(status)
        metrics = ServerMetrics("m", lambda: SchedulerStats(0, 0, 0.0, 10, 10, 0), max_model_len=2048)
        gen = Generation(cast(EngineClient, client), AutoTokenizer.from_pretrained(STORIES), metrics, 1, 0.0)
        gen.add_prompt("r", [1, 5], SamplingParams(max_tokens=3))
        with pytest.raises(ApiError) as e:
            async for _ in gen.deltas():
                pass
        assert client.aborted == ["r@0"]
        return e.value

    err = asyncio.run(main())
    assert (err.status, err.message) == (status, f"failed with {status}")
    kind = error_body(err.status, err.message)["error"]["type"]
    assert kind == ("invalid_request_error" if status == 400 else "internal_server_error")
