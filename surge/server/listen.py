"""The listening sockets of ``surge serve``, bound before the engine starts so that a busy port
fails at once with one readable line."""

from __future__ import annotations

import socket


def _bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A TCP socket with ``SO_REUSEADDR`` (and ``SO_REUSEPORT`` if ``reuse_port``) bound to
    ``host:port`` (IPv6 when ``host`` has a colon).

    Raises:
        ValueError: the address cannot be bound (one readable line).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    return sock


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the listening socket of a single API process now, so a busy port fails before the
    engine starts (inheritable).

    Raises:
        ValueError: the address cannot be bound (one readable line).
    """
    sock = _bind(host, port, reuse_port=False)
    sock.set_inheritable(True)
    return sock


def bind_reuseport(host: str, port: int, *, check_free: bool = False) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` (every API process binds one).

    Args:
        check_free: first check that no socket is bound to the address (the supervisor's
            fail-fast check). ``SO_REUSEPORT`` alone lets the bind succeed next to any socket
            of the same user that set it too, so a second ``surge serve --api-server-count N``
            on the port of a running one would start and take half of its connections; a bind
            without it fails on a busy port, as vLLM's single listening socket does.

    Raises:
        ValueError: the address cannot be bound (one readable line).
    """
    if check_free and port != 0:  # port 0: the kernel picks a free one
        _bind(host, port, reuse_port=False).close()
    return _bind(host, port, reuse_port=True)


def bind_unix(path: str) -> socket.socket:
    """A Unix domain socket bound to ``path`` (vLLM's ``--uds``), bound now, so a path in use fails
    before the engine starts (inheritable). A socket file left by a server that is gone (nothing
    accepts on it) is replaced, as a stale TCP port would be free again.

    Raises:
        ValueError: one readable line: a server already listens on ``path``, ``path`` is a file
            other than a socket, or it cannot be bound (no such folder, permission denied, a
            path longer than the 107 bytes a socket address holds).
    """
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise ValueError(f"--uds {path}: {e.strerror or e}") from e
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise ValueError(f"--uds {path}: the path exists and is not a socket (give a new path)")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:  # nothing accepts on it: a socket left by a server that is gone
            os.unlink(path)
        else:
            raise ValueError(f"--uds {path}: a server already listens on it")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except (OSError, ValueError) as e:  # ValueError: an over-long path ("AF_UNIX path too long")
        sock.close()
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"--uds {path}: cannot listen there: {reason}") from e
    sock.set_inheritable(True)
    return sock
