"""The grammar threads are sized from the CPUs the process may use (affinity mask, cgroup CPU
quota), not from the host's CPU count, and the mask fill uses at most MAX_FILL_THREADS."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from surge.structured import compiler as compiler_module
from surge.structured import manager as manager_module
from surge.structured.cpus import available_cpus
from surge.structured.manager import MAX_FILL_THREADS, StructuredOutputManager
from tests.conftest import STORIES

SIXTEEN = set(range(16))


def test_affinity_mask_without_cgroup_files(tmp_path: Path) -> None:
    assert available_cpus(tmp_path, SIXTEEN) == 16
    assert available_cpus(tmp_path, {3, 5}) == 2
    assert available_cpus(tmp_path, set()) == 1


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("200000 100000\n", 2),
        ("150000 100000\n", 2),
        ("50000 100000\n", 1),
        ("max 100000\n", 16),
        ("junk", 16),
    ],
)
def test_cgroup_v2_quota_lowers_the_count(tmp_path: Path, cpu_max: str, expected: int) -> None:
    (tmp_path / "cpu.max").write_text(cpu_max)
    assert available_cpus(tmp_path, SIXTEEN) == expected


@pytest.mark.parametrize(("quota", "expected"), [("400000", 4), ("-1", 16)])
def test_cgroup_v1_quota(tmp_path: Path, quota: str, expected: int) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(quota + "\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cpus(tmp_path, SIXTEEN) == expected


def test_quota_never_raises_the_affinity_count(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("3200000 100000\n")
    assert available_cpus(tmp_path, {0, 1}) == 2


def test_this_process() -> None:
    assert 1 <= available_cpus() <= max(1, os.cpu_count() or 1)


@pytest.mark.parametrize(
    ("cpus", "threads"), [(1, 1), (2, 1), (6, 3), (8, 4), (16, MAX_FILL_THREADS), (128, 4)]
)
def test_fill_threads_follow_the_available_cpus(
    monkeypatch: pytest.MonkeyPatch, cpus: int, threads: int
) -> None:
    """Half the available CPUs, 1 to MAX_FILL_THREADS (4): xgrammar's batch matcher starts
    fresh threads on every call, and threads past 4 gain little while they take the CPUs of
    the engine loop and the API process."""
    monkeypatch.setattr(manager_module, "available_cpus", lambda: cpus)
    monkeypatch.setattr(compiler_module, "available_cpus", lambda: cpus)
    manager = StructuredOutputManager(str(STORIES), 512, (2,), "cpu")
    assert MAX_FILL_THREADS == 4
    assert manager._fill_threads == threads
    workers, _ = compiler_module.compile_thread_budget(cpus)
    assert manager.cache._pool.max_workers == workers
