"""Without a GPU, Triton kernels of these tests run under the CPU interpreter.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` decoration runs (before
``surge.kernels`` is imported), as in ``tests/kernels/conftest.py``.
"""

from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

    from tests.kernels import interpreter_fixes

    interpreter_fixes.apply()
