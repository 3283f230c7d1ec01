"""Folders a SIGKILLed server leaves in the temporary directory are removed at the next start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from surge.engine.client import remove_stale_ipc_dirs
from surge.server.api_workers import _METRICS_PREFIX


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_gone_supervisors_metrics_folder_is_removed(tmp_path: Path) -> None:
    """The IPC folder was cleaned up, the supervisor's surge-metrics-<pid>-* folder was not."""
    gone = tmp_path / f"{_METRICS_PREFIX}{_dead_pid()}-abc"
    live = tmp_path / f"{_METRICS_PREFIX}{os.getppid()}-abc"  # a running process
    ipc = tmp_path / f"surge-ipc-{_dead_pid()}-abc"
    for d in (gone, live, ipc):
        d.mkdir()
    assert remove_stale_ipc_dirs(str(tmp_path), prefix=_METRICS_PREFIX) == [str(gone)]
    assert live.exists() and ipc.exists()  # a running process's folder; another prefix
    assert remove_stale_ipc_dirs(str(tmp_path)) == [str(ipc)]
