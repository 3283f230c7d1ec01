"""Kernel tests run on the GPU when one is present, else on CPU under Triton's interpreter.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` decoration runs, i.e. before
``surge.kernels`` is imported; this conftest is loaded before the test modules here.

Many tests here build CPU tensors on purpose: they are the interpreter's (CI's) tests, and
their GPU twins are marked ``gpu``. On a GPU host a Triton launch refuses CPU tensors; such a
test (not marked ``gpu``) is reported as skipped with that reason instead of failed, so that
``pytest tests/kernels`` there runs the device-aware tests and the ``gpu`` ones and is green.
Any other failure stays a failure.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest
import torch

CUDA = torch.cuda.is_available()
_CPU_TENSOR_LAUNCH = "cannot be accessed from Triton (cpu tensor?)"

if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

    from tests.kernels import interpreter_fixes

    interpreter_fixes.apply()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """On a GPU host, an interpreter test's refused CPU-tensor launch -> skipped (see above)."""
    outcome = yield
    if not CUDA or call.when != "call" or item.get_closest_marker("gpu") is not None:
        return
    report = outcome.get_result()
    exc = call.excinfo
    if (
        report.failed
        and exc is not None
        and exc.errisinstance(ValueError)
        and _CPU_TENSOR_LAUNCH in str(exc.value)
    ):
        report.outcome = "skipped"
        report.longrepr = (
            str(item.path),
            item.location[1] or 0,
            "Skipped: a CPU-interpreter test (its tensors are on the CPU); on a GPU host its -m gpu twins run",
        )
