"""vLLM 0.26 deployment flags on `surge serve`, checked at the argument level (no server started):
each is taken and does what vLLM's does, or is refused in one line that names it."""

from __future__ import annotations

import pytest

from surge.cli import build_parser
from surge.server.cli import log_requests_flag


@pytest.mark.parametrize(
    ("argv", "logged"),
    [
        ([], True),
        (["--enable-log-requests"], True),
        (["--no-enable-log-requests"], False),
        (["--disable-log-requests"], False),
        (["--no-enable-log-requests", "--disable-log-requests"], False),
    ],
)
def test_vllm_026_request_log_switch(argv: list[str], logged: bool) -> None:
    """vLLM 0.26's only request-log flag is ``--enable-log-requests`` (with its ``--no-`` form;
    ``--disable-log-requests`` is gone there): a launch line that carries it was refused."""
    assert log_requests_flag(build_parser().parse_args(["serve", *argv])) is logged


def test_request_log_switches_that_contradict_are_refused() -> None:
    args = build_parser().parse_args(["serve", "--enable-log-requests", "--disable-log-requests"])
    with pytest.raises(ValueError, match="^--enable-log-requests and --disable-log-requests contradict"):
        log_requests_flag(args)
