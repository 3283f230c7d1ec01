"""A recorder of the split-K FP8 GEMM launches a layer makes, for tests of which config it picks."""

from __future__ import annotations

import pytest
import torch

from surge.kernels import fp8_gemm_splitk
from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig


def record_splitk_configs(
    monkeypatch: pytest.MonkeyPatch, block_size: tuple[int, int] | None = None
) -> list[Fp8SplitKConfig]:
    """Wrap :func:`surge.kernels.fp8_gemm_splitk.fp8_linear_splitk` so that each call appends its
    ``config`` to the returned list (then runs as usual); with ``block_size``, also assert that
    every call passes those block scales."""
    calls: list[Fp8SplitKConfig] = []
    real = fp8_gemm_splitk.fp8_linear_splitk

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs["config"])  # type: ignore[arg-type]
        if block_size is not None:
            assert kwargs["block_size"] == block_size
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fp8_gemm_splitk, "fp8_linear_splitk", spy)
    return calls
