"""scripts/install.sh says which pip command installed torch, never a source it cannot know.

Runs the script against a stub ``.venv/bin/python`` (no pip, no network): the stub fails or
succeeds each pip command as the scenario says and records what it was asked.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

STUB = r"""#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG"
case "$*" in
  "-c import torch") [ -e "$STUB_DIR/torch" ] ;;
  -c*) [ -e "$STUB_DIR/torch" ] && echo "2.13.0+cpu (CPU only)" ;;
  *--no-index*) exit 1 ;;
  *--index-url*)
    if [ "$CPU_INDEX_OK" = 1 ]; then touch "$STUB_DIR/torch"; else echo "ERROR: network unreachable" >&2; exit 1; fi ;;
  "-m pip install -q torch==2.13.0") touch "$STUB_DIR/torch" ;;
  "-m pip install -q -e .") ;;
  *) echo "stub: unexpected $*" >&2; exit 3 ;;
esac
"""


def _run_install(tmp_path: Path, cpu_index_ok: bool) -> tuple[str, list[str]]:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "install.sh", tmp_path / "scripts" / "install.sh")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STUB)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "stub.log"
    env = {
        **os.environ,
        "STUB_LOG": str(log),
        "STUB_DIR": str(tmp_path),
        "CPU_INDEX_OK": "1" if cpu_index_ok else "0",
    }
    p = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "install.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout, log.read_text().splitlines()


@pytest.mark.parametrize("cpu_index_ok", [True, False])
def test_torch_step_names_the_command_that_succeeded(tmp_path: Path, cpu_index_ok: bool) -> None:
    out, calls = _run_install(tmp_path, cpu_index_ok)
    assert "[install] no torch is importable: installing torch==2.13.0 (CPU build)" in out
    assert "from PyTorch's CPU index" not in out and "not reachable" not in out, out
    if cpu_index_ok:
        done = f"[install] `pip install --index-url {CPU_INDEX} torch==2.13.0` succeeded: torch 2.13.0+cpu"
        assert done in out, out
        assert "-m pip install -q torch==2.13.0" not in calls
    else:
        assert f"pip install --index-url {CPU_INDEX} torch==2.13.0 failed (pip says why above)" in out
        assert "[install] `pip install torch==2.13.0` succeeded: torch 2.13.0+cpu (CPU only)" in out, out
        assert calls.count("-m pip install -q torch==2.13.0") == 1
    assert calls[-1] == "-m pip install -q -e ."
    assert "[install] done" in out
