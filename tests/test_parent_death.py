"""``set_parent_death_signal``: a process that set it dies with its parent (Linux)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_GRANDCHILD = (
    "import signal, time\n"
    "from surge.parent_death import set_parent_death_signal\n"
    "set_parent_death_signal(signal.SIGKILL)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)
_MIDDLE = (
    "import subprocess, sys\n"
    f"p = subprocess.Popen([sys.executable, '-c', {_GRANDCHILD!r}], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)\n"
    "assert p.stdout.readline().strip() == 'ready'\n"
    "print(p.pid, flush=True)\n"
)


def _alive(pid: int) -> bool:
    """Running, not a zombie (a reaper that never reaps leaves a zombie behind)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_process_dies_with_its_parent() -> None:
    middle = subprocess.run(
        [sys.executable, "-c", _MIDDLE], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    pid = int(middle.stdout.split()[0])
    deadline = time.monotonic() + 10.0
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(pid)
    if alive:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert not alive, "the grandchild outlived its parent"
