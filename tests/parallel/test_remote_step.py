"""``_RemoteStep.result``: rank 0's answer to an earlier step whose ``result()`` was interrupted
is skipped, not taken for this step's (a Ctrl-C in ``LLM.generate`` under ``-tp``)."""

from __future__ import annotations

from typing import Any

import pytest

from surge.parallel.executor import _RemoteStep
from surge.parallel.messages import StepResult


class _FakeExecutor:
    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages

    def _recv(self) -> Any:
        return self.messages.pop(0)


def test_a_stale_answer_of_an_earlier_step_is_skipped() -> None:
    ex = _FakeExecutor([StepResult(4, [11]), StepResult(5, [22])])
    out = _RemoteStep(ex, 5, ["r"], answered=True).result()  # type: ignore[arg-type]
    assert out.sampled_token_ids == {"r": 22} and not ex.messages


def test_an_answer_of_a_later_step_is_an_error() -> None:
    ex = _FakeExecutor([StepResult(6, [11])])
    with pytest.raises(RuntimeError, match="unexpected message"):
        _RemoteStep(ex, 5, ["r"], answered=True).result()  # type: ignore[arg-type]
