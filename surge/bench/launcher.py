"""Start, watch and stop the server of a benchmark matrix (``surge bench matrix --launch "..."``).

The command runs in its own process group (``start_new_session``) with its output in a log file;
stopping sends SIGTERM to the whole group, then SIGKILL after a grace period, so no child
(e.g. an engine process) is left behind.

It never measures the wrong server: the port of ``--base-url`` must be free before the start
(else one line at once: something already listens there), a ``--port`` in the command (8000
for ``surge serve`` or ``vllm serve`` without one) must match ``--base-url`` (:func:`check_launch_port`), and when ``/health`` names its process
(Surge's ``X-Surge-Pid`` header) that process must belong to the started process group.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import IO

PID_HEADER = "X-Surge-Pid"


def url_host_port(base_url: str) -> tuple[str, int]:
    """Host and port of ``base_url`` (port 80/443 by scheme when it names none).

    Raises:
        ValueError: not an http(s) URL.
    """
    u = urllib.parse.urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"--base-url must be an http(s) URL, got {base_url!r}")
    return u.hostname, u.port or (443 if u.scheme == "https" else 80)


def command_port(argv: list[str]) -> int | None:
    """The value of ``--port N`` / ``--port=N`` in a command line, or None."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--port" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--port="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


SERVE_DEFAULT_PORT = 8000
"""The port of ``surge serve`` and ``vllm serve`` without ``--port``."""

_SERVE_MODULES = ("surge", "surge.cli", "vllm.entrypoints.cli.main")
"""``python -m MODULE serve ...`` spellings of ``surge serve`` and ``vllm serve``."""


def serve_command_name(argv: list[str]) -> str | None:
    """``"surge serve"`` or ``"vllm serve"`` when ``argv`` runs that command (``surge serve ...``,
    ``/path/to/vllm serve ...``, ``python -m surge serve ...``, also after an ``env``-style prefix),
    else None (another program, whose default port is unknown)."""
    for i, arg in enumerate(argv[:-1]):
        name = os.path.basename(arg)
        if name in ("surge", "vllm") and argv[i + 1] == "serve":
            return f"{name} serve"
        if arg == "-m" and argv[i + 1] in _SERVE_MODULES and i + 2 < len(argv) and argv[i + 2] == "serve":
            return f"{argv[i + 1].split('.')[0]} serve"
    return None


def check_launch_port(command: str, base_url: str) -> None:
    """Raise ValueError when the ``--launch`` command's port differs from ``--base-url``'s: its
    ``--port``, or, for a ``surge serve`` / ``vllm serve`` command without one (nor ``--uds`` or a
    ``--config`` file, which may set it), their default port 8000, where the server would listen
    while the benchmark waited ``--server-timeout`` for another port."""
    _, port = url_host_port(base_url)
    try:
        argv = shlex.split(command)
    except ValueError as e:  # an unbalanced quote
        raise ValueError(f"--launch {command!r}: {e}") from None
    launch_port = command_port(argv)
    if launch_port is not None and launch_port != port:
        raise ValueError(
            f"--launch starts the server on port {launch_port} but --base-url {base_url} uses port {port}; "
            "make them the same"
        )
    elsewhere = any(a.split("=", 1)[0] in ("--uds", "--config") for a in argv)
    serve = serve_command_name(argv)
    if launch_port is None and serve is not None and not elsewhere and port != SERVE_DEFAULT_PORT:
        raise ValueError(
            f"--launch starts {serve} without --port, on its default port {SERVE_DEFAULT_PORT}, but --base-url "
            f"{base_url} uses port {port}; add --port {port} to the command"
        )


def port_in_use(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def check_port_free(base_url: str) -> None:
    """Raise ValueError when something already listens on ``base_url``'s port, where ``--launch``
    is to start the server (it would fail to bind, or the benchmark would measure the other one)."""
    host, port = url_host_port(base_url)
    if port_in_use(host, port):
        raise ValueError(
            f"port {port} on {host} is already in use (another server?): stop it, or give --launch "
            "and --base-url a free port"
        )


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While active, SIGTERM raises ``SystemExit(143)`` in the main thread, so that ``finally``
    blocks run (a launched server is stopped) instead of the process dying where it stands;
    further SIGTERMs are ignored while it unwinds. A no-op off the main thread, where signal
    handlers cannot be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


LAST_LINE_CHARS = 300
"""The most characters of the server's last log line quoted in a start-up failure."""


def last_log_line(path: Path, start: int, tail_bytes: int = 8192) -> str:
    """The last non-blank line written to ``path`` at or after byte offset ``start`` (this start's
    part of a log appended across restarts), stripped and cut to :data:`LAST_LINE_CHARS`
    characters; "" when there is none or the file cannot be read. Only the last ``tail_bytes``
    bytes are read (a server's log may be long)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start, size - tail_bytes))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= LAST_LINE_CHARS else line[: LAST_LINE_CHARS - 3] + "..."


class ServerLauncher:
    """A server subprocess that is healthy when ``GET {base_url}/health`` answers 200.

    Args:
        command: shell-like command line (split with ``shlex``, run without a shell).
        base_url: where the server will listen, e.g. ``http://127.0.0.1:8000``.
        health_timeout_s: seconds to wait for ``/health`` after each start.
        log_path: file that receives the server's stdout and stderr (appended across restarts).
    """

    def __init__(self, command: str, base_url: str, health_timeout_s: float, log_path: Path) -> None:
        try:
            self.argv = shlex.split(command)
        except ValueError as e:  # an unbalanced quote
            raise ValueError(f"--launch {command!r}: {e}") from None
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

    def exits_within(self, timeout_s: float) -> bool:
        """True when the server process has exited, or exits within ``timeout_s`` seconds (a dying
        server drops its connections before its process is gone, longer so on a loaded machine)."""
        if self.proc is None:
            return True
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout_s)
        return not self.alive()

    def healthy(self) -> bool:
        """True when ``/health`` answers 200 right now."""
        return self._health()[0]

    def _health(self) -> tuple[bool, int | None]:
        """(``/health`` answered 200, the pid it names in ``X-Surge-Pid`` or None)."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as resp:
                pid = resp.headers.get(PID_HEADER)
                return resp.status == 200, int(pid) if pid and pid.isdigit() else None
        except (OSError, ValueError):
            return False, None

    def _is_ours(self, pid: int) -> bool:
        """True when ``pid`` is in the process group of the started command."""
        if self.proc is None:
            return False
        try:
            return os.getpgid(pid) == self.proc.pid
        except (ProcessLookupError, PermissionError):
            return False

    def start(self) -> None:
        """Start the command and wait for ``/health``.

        Raises:
            ValueError: the process exits during start-up (the message quotes the last line it
                wrote, e.g. ``surge serve``'s one-line error) or is not healthy within the timeout
                (it is then stopped); the message points at the log file.
        """
        self.stop()
        check_port_free(self.base_url)
        print(f"[launch] starting: {shlex.join(self.argv)}", flush=True)
        print(f"[launch] server log: {self.log_path}; waiting for {self.base_url}/health", flush=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the process's lifetime)
        log_start = self._log.tell()
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
                said = last_log_line(self.log_path, log_start)
                raise ValueError(
                    f"server exited with code {code} during start-up"
                    + (f", its last line: {said!r}" if said else " without a line")
                    + f"; see {self.log_path}"
                )
            ok, pid = self._health()
            if ok:
                if pid is not None and not self._is_ours(pid):
                    self.stop()
                    raise ValueError(
                        f"the server answering {self.base_url}/health (pid {pid}) is not the one --launch "
                        "started; is another server on that port?"
                    )
                print(
                    f"[launch] server healthy after {self.health_timeout_s - (deadline - time.monotonic()):.0f} s"
                )
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
