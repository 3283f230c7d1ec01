"""Shared fixtures: tiny random Hugging Face models saved with save_pretrained."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
STORIES = REPO / "surge" / "assets" / "stories260K"
SHARED = REPO.parent / "shared" / "assets"


@pytest.fixture(scope="session")
def stories_dir() -> Path:
    return STORIES
