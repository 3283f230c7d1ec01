"""Session fixtures: tiny random HF model folders (built once per test session)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.models.helpers import KINDS, make_hf_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {kind: make_hf_model(kind, root / kind, seed=i) for i, kind in enumerate(KINDS)}
