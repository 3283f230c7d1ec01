"""Start, watch and stop the server of a benchmark matrix (``surge bench matrix --launch "..."``).

The command runs in its own process group (``start_new_session``) with its output in a log file;
stopping sends SIGTERM to the whole group, then SIGKILL after a grace period, so no child
(e.g. an engine process) is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO


class ServerLauncher:
    """A server subprocess that is healthy when ``GET {base_url}/health`` answers 200.

    Args:
        command: shell-like command line (split with ``shlex``, run without a shell).
        base_url: where the server will listen, e.g. ``http://127.0.0.1:8000``.
        health_timeout_s: seconds to wait for ``/health`` after each start.
        log_path: file that receives the server's stdout and stderr (appended across restarts).
    """

    def __init__(self, command: str, base_url: str, health_timeout_s: float, log_path: Path) -> None:
        self.argv = shlex.split(command)
        if not self.argv:
            raise ValueError("--launch command is empty")
        self.base_url = base_url.rstrip("/")
        self.health_timeout_s = health_timeout_s
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    def alive(self) -> bool:
        """True while the server process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        """True when ``/health`` answers 200 right now."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as resp:
                return bool(resp.status == 200)
        except (OSError, ValueError):
            return False

    def start(self) -> None:
        """Start the command and wait for ``/health``.

        Raises:
            ValueError: the process exits during start-up or is not healthy within the timeout
                (it is then stopped); the message points at the log file.
        """
        self.stop()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the process's lifetime)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            raise ValueError(f"cannot start {self.argv[0]!r}: {e}") from None
        self.starts += 1
        deadline = time.monotonic() + self.health_timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode
                self.stop()
                raise ValueError(f"server exited with code {code} during start-up; see {self.log_path}")
            if self.healthy():
                return
            time.sleep(0.5)
        self.stop()
        raise ValueError(f"server not healthy after {self.health_timeout_s:.0f} s; see {self.log_path}")

    def ensure_running(self, retries: int = 3, retry_delay_s: float = 1.0) -> bool:
        """Restart the server if it died or no longer answers ``/health`` with 200 (a server
        whose engine process died stays up but reports 503). Returns True when it restarted.
        Raises like :meth:`start`."""
        if self.alive():
            for attempt in range(retries):
                if self.healthy():
                    return False
                if attempt + 1 < retries:
                    time.sleep(retry_delay_s)
            self.stop()
        self.start()
        return True

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL after ``grace_s`` seconds; idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace_s)
            # the group may outlive its leader (an engine child): always finish it off
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
