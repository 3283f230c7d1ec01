"""Test hooks of the grammar compile workers (``CompileWorkerSpec.hook``), imported by path in
the worker process: they make one job deterministically slow."""

from __future__ import annotations

import time

from surge.sampling_params import StructuredOutputsParams

SLOW_REGEX = "slow+"
"""The regex whose compilation :func:`sleep_on_slow_regex` holds for a minute."""


def sleep_on_slow_regex(params: StructuredOutputsParams) -> None:
    """Sleep 60 s before compiling :data:`SLOW_REGEX` (far past the tests' time limits)."""
    if params.regex == SLOW_REGEX:
        time.sleep(60.0)
