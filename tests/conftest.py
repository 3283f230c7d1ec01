"""Shared fixtures: tiny random Hugging Face models saved with save_pretrained, and the shared
assets' Qwen3-8B tokenizer folder (one path, one skip where it is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
STORIES = REPO / "surge" / "assets" / "stories260K"
SHARED = REPO.parent / "shared" / "assets"
QWEN3_8B_DIR = SHARED / "models" / "qwen3-8b"
"""The real Qwen3-8B folder of ``../shared/assets``: its tokenizer, chat template and config (no
weights). Absent on a machine without the shared assets: look it up through
:func:`qwen3_8b_dir_or_skip`, the ``qwen3_8b_dir`` fixture or :data:`requires_qwen3_8b`."""
QWEN3_8B_MISSING = "shared Qwen3-8B tokenizer assets not found (../shared/assets/models/qwen3-8b)"
"""The one skip reason of every test that needs :data:`QWEN3_8B_DIR` where it is absent."""
requires_qwen3_8b = pytest.mark.skipif(not QWEN3_8B_DIR.is_dir(), reason=QWEN3_8B_MISSING)
"""A module's or test's mark: skipped (:data:`QWEN3_8B_MISSING`) without the Qwen3-8B folder."""


def qwen3_8b_dir_or_skip() -> Path:
    """:data:`QWEN3_8B_DIR`; skips the calling test with :data:`QWEN3_8B_MISSING` where the folder
    is absent (for helpers called from a test; fixtures take ``qwen3_8b_dir``)."""
    if not QWEN3_8B_DIR.is_dir():
        pytest.skip(QWEN3_8B_MISSING)
    return QWEN3_8B_DIR


@pytest.fixture(scope="session")
def stories_dir() -> Path:
    return STORIES


@pytest.fixture(scope="session")
def qwen3_8b_dir() -> Path:
    """The Qwen3-8B tokenizer folder, or a skip (:func:`qwen3_8b_dir_or_skip`)."""
    return qwen3_8b_dir_or_skip()
