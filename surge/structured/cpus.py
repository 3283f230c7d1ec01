"""How many CPUs the engine process may really use, for sizing the grammar threads."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"
"""Where a container sees its own cgroup (v2: ``cpu.max``; v1: ``cpu/cpu.cfs_quota_us``)."""


def _cgroup_quota(root: Path) -> float | None:
    """CPUs the cgroup's quota allows (``quota / period``), or None when unlimited or unknown."""
    try:
        fields = (root / "cpu.max").read_text().split()
        if len(fields) == 2 and fields[0] != "max":
            return int(fields[0]) / int(fields[1])
        return None
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def available_cpus(cgroup_root: str | Path = CGROUP_ROOT, affinity: set[int] | None = None) -> int:
    """The CPUs this process may run on: the size of its affinity mask (``os.cpu_count()``
    where the platform has none), lowered to its cgroup's CPU quota rounded up; at least 1.

    ``os.cpu_count()`` counts the host's CPUs, also in a container limited to fewer (by
    ``taskset``/cpusets or a CFS quota): threads sized from it oversubscribe the CPUs, and
    a quota then throttles every process of the container, the API process included.

    Args:
        cgroup_root: the folder of the cgroup files (tests point it elsewhere).
        affinity: the CPU ids allowed (default: ``os.sched_getaffinity(0)``).
    """
    if affinity is None:
        try:
            affinity = os.sched_getaffinity(0)
        except AttributeError:  # not on Linux
            affinity = set(range(os.cpu_count() or 1))
    cpus = max(1, len(affinity))
    quota = _cgroup_quota(Path(cgroup_root))
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus
