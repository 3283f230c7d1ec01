"""Kernel tests run on the GPU when one is present, else on CPU under Triton's interpreter.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` decoration runs, i.e. before
``surge.kernels`` is imported; this conftest is loaded before the test modules here.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

    from tests.kernels import interpreter_fixes

    interpreter_fixes.apply()
