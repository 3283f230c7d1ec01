"""Several API server processes over the same engine(s): ``surge serve --api-server-count N``.

One API process turns every streamed token into an SSE event (ZMQ receive, detokenization, JSON,
one socket write); at a few tens of thousands of tokens per second that process's one core is
the server's ceiling (``benchmarks/host_ceiling.py`` measures it). With ``N > 1`` the
``surge serve`` process becomes a supervisor:

- it binds the port (to fail fast on a busy one), starts the engine process of every
  data-parallel replica, each connected to the ZMQ addresses of all N API processes
  (:func:`surge.engine.core_proc.run_engine_core`), then starts the N API processes;
- each API process runs the ordinary server (:func:`surge.server.api_server.run_server`) on its
  own ``SO_REUSEPORT`` socket of the same port (the kernel spreads connections over them), with
  engine clients that attach to the running engines (:class:`EngineAttachment`); its requests
  come back to it alone, and data-parallel routing uses the load every replica reports to all;
- counters and histograms are shared through ``prometheus_client``'s multiprocess mode (one
  folder of value files, so ``/metrics`` on any process counts every process's requests);
- SIGTERM / SIGINT to the supervisor is passed on to the API processes as SIGTERM (they drain as
  a single server does, in their own process group so a terminal's Ctrl-C reaches them once,
  through the supervisor; one still starting ends at once, a clean stop). Every child starts with
  both signals blocked: an API process until it has left the supervisor's process group, an engine
  until its own handlers are in place, so a signal to the whole group during start-up is one stop,
  not a traceback or a crash per child. Once the API processes have exited
  the engines are stopped. An API process that exits on
  its own ends the whole server (exit code 1). Every child dies with the supervisor (parent
  death signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from typing import Any

from surge.config import EngineConfig
from surge.engine.client import _IPC_PREFIX, EngineAttachment, remove_stale_ipc_dirs
from surge.engine.core_proc import STOP_SIGNAL, EngineFactory, run_engine_core
from surge.parent_death import set_parent_death_signal
from surge.server.listen import bind_reuseport

logger = logging.getLogger("surge.server")

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""The variable prometheus_client reads, at import, to keep its values in shared files."""


_METRICS_PREFIX = "surge-metrics-"
"""Name prefix of the supervisor's shared Prometheus folder (``<prefix><pid>-*``)."""


STOP_SIGNALS: frozenset[signal.Signals] = frozenset({signal.SIGINT, signal.SIGTERM})
"""A terminal's Ctrl-C and a service manager's stop, which the supervisor passes on."""


def start_with_stops_blocked(proc: multiprocessing.process.BaseProcess) -> None:
    """Start a spawned child with :data:`STOP_SIGNALS` blocked (a new interpreter inherits the
    signal mask). While it imports, it is still in the supervisor's process group: a Ctrl-C or a
    SIGTERM to the group stays pending there instead of printing a ``KeyboardInterrupt``
    traceback from the import or ending it with -15 (which the supervisor, not yet signalled
    itself, took for a crash: exit code 1). The child looks at them when its target starts
    (:func:`stop_came_while_starting`, or the engine's own handlers); this process gets its own
    signals once the start returns."""
    # the first spawn starts multiprocessing's resource tracker, whose start unblocks both
    # signals (it blocks them for its own child, then unblocks instead of restoring): started
    # before the block, it is already running inside it
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def stop_came_while_starting() -> bool:
    """In a child started by :func:`start_with_stops_blocked`, once it has left the supervisor's
    process group: True when a stop signal came while it started (they stay blocked; the caller
    ends, a clean stop), else False with them unblocked (a SIGTERM then ends it at once, as one
    that comes before its server's handlers)."""
    if signal.sigpending() & STOP_SIGNALS:
        return True
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return False


def run_api_process(
    config: EngineConfig,
    options: Any,
    attach: list[EngineAttachment],
    index: int,
    supervisor_pid: int,
    metrics_dir: str,
    log_level: int,
) -> None:
    """Entry point of API process ``index`` (a ``multiprocessing`` spawn target).

    Args:
        config: the engine configuration (the engines already run it).
        options: the server's :class:`~surge.server.api_server.ServeOptions` (its ``port`` is
            the bound one).
        attach: one attachment per data-parallel replica.
        index: this API process's index (0-based).
        supervisor_pid: the ``surge serve`` process (named on ``/health``; its death ends this one).
        metrics_dir: the shared prometheus folder.
        log_level: ``logging`` level.
    """
    os.setpgrp()  # a terminal's Ctrl-C reaches the supervisor, which passes it on once
    if stop_came_while_starting():
        return  # a stop during start-up is a clean one
    set_parent_death_signal()
    logging.basicConfig(
        level=log_level, format=f"%(asctime)s %(levelname)s [%(name)s api{index}] %(message)s"
    )
    if os.getppid() != supervisor_pid:  # the supervisor died before the death signal was set
        return
    from surge.server.api_server import run_server
    from surge.tokenizer import load_tokenizer

    sock = bind_reuseport(options.host, options.port)
    try:
        try:
            import uvloop

            loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
            loop_factory = None
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            code = runner.run(
                run_server(
                    config,
                    options,
                    sock,
                    tokenizer=load_tokenizer(config.model.model),
                    attach=attach,
                    server_pid=supervisor_pid,
                    metrics_dir=metrics_dir,
                )
            )
    finally:
        sock.close()
    if code:
        raise SystemExit(code)


def serve_with_api_workers(
    config: EngineConfig,
    options: Any,
    sock: socket.socket,
    engine_factory: EngineFactory | None = None,
) -> int:
    """Run the supervisor of ``options.api_server_count`` API processes (see the module
    docstring) until they have all exited.

    Args:
        config: the engine configuration.
        options: the server's :class:`~surge.server.api_server.ServeOptions`.
        sock: a socket bound (``SO_REUSEPORT``) to the serving address; kept, not listened on.
        engine_factory: builds each engine in its process (tests and benchmarks pass a fake).

    Returns:
        0 after a clean shutdown, 1 when an API process failed (e.g. the engine did not start).

    Raises:
        ValueError: an engine refused the model folder or the configuration at start-up (or
            they did not fit in memory): its one-line message, which no process has logged.
    """
    from surge.parallel.dp_client import replica_config

    count = options.api_server_count
    num_replicas = config.parallel.data_parallel_size
    level = options.engine_log_level
    ctx = multiprocessing.get_context("spawn")
    for path in remove_stale_ipc_dirs():
        logger.info("removed the IPC folder %s of an API process that is gone", path)
    for path in remove_stale_ipc_dirs(prefix=_METRICS_PREFIX):
        logger.info("removed the metrics folder %s of an API server supervisor that is gone", path)
    ipc_dir = tempfile.mkdtemp(prefix=f"{_IPC_PREFIX}{os.getpid()}-")
    metrics_dir = tempfile.mkdtemp(prefix=f"{_METRICS_PREFIX}{os.getpid()}-")
    port = sock.getsockname()[1]
    options = _with_port(options, port)
    engines: list[multiprocessing.process.BaseProcess] = []
    apis: list[multiprocessing.process.BaseProcess] = []
    # one pipe per engine, on which it sends a start-up refusal's one line (run_engine_core)
    refusal_readers: list[Connection] = []
    refusal: str | None = None
    received: list[int] = []
    received_any = False  # a stop signal was passed on to the API processes
    stopping = False
    code = 0

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        addrs = [
            [(f"ipc://{ipc_dir}/in-{d}-{c}", f"ipc://{ipc_dir}/out-{d}-{c}") for c in range(count)]
            for d in range(num_replicas)
        ]
        for d in range(num_replicas):
            cfg = replica_config(config, d) if num_replicas > 1 else config
            reader, writer = ctx.Pipe(duplex=False)
            refusal_readers.append(reader)  # closed in the finally below, as the writer here
            proc = ctx.Process(
                target=run_engine_core,
                args=(
                    cfg,
                    [a[0] for a in addrs[d]],
                    [a[1] for a in addrs[d]],
                    os.getpid(),
                    engine_factory,
                    level,
                ),
                # this process shows a refusal once (the API processes log theirs at DEBUG)
                kwargs={"log_user_start_error": False, "start_error_conn": writer},
                name=f"surge-engine-core-{d}",
            )
            try:
                start_with_stops_blocked(proc)
            finally:
                writer.close()
            engines.append(proc)
        saved = os.environ.get(METRICS_DIR_ENV)
        os.environ[METRICS_DIR_ENV] = metrics_dir  # read by prometheus_client when a child imports it
        try:
            for c in range(count):
                attach = [
                    EngineAttachment(addrs[d][c][0], addrs[d][c][1], c, engines[d].pid or 0)
                    for d in range(num_replicas)
                ]
                proc = ctx.Process(
                    target=run_api_process,
                    args=(config, options, attach, c, os.getpid(), metrics_dir, level),
                    name=f"surge-api-{c}",
                )
                start_with_stops_blocked(proc)
                apis.append(proc)
        finally:
            if saved is None:
                os.environ.pop(METRICS_DIR_ENV, None)
            else:
                os.environ[METRICS_DIR_ENV] = saved
        logger.info(
            "%d API server processes (pids %s) over %d engine process(es) (pids %s)",
            count,
            ", ".join(str(p.pid) for p in apis),
            num_replicas,
            ", ".join(str(p.pid) for p in engines),
        )
        while any(p.is_alive() for p in apis):
            while received:
                received.pop(0)
                stopping = received_any = True
                for p in apis:
                    if p.is_alive() and p.pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            # SIGTERM for SIGINT too: the server drains on either, and one that
                            # still imports ends quietly (SIGINT's KeyboardInterrupt printed a
                            # traceback there)
                            os.kill(p.pid, signal.SIGTERM)
            wait([p.sentinel for p in apis + engines if p.exitcode is None] + refusal_readers, timeout=0.2)
            if received:  # a stop during the wait: passed on first, so an API process it ended is no crash
                continue
            for p in engines:
                p.join(timeout=0)  # reap a dead engine, so its API processes see it gone
            refusal = _read_refusal(refusal_readers, refusal)
            # the first to end stops the server: a refusal (the CLI shows its line), else an engine
            # (its API processes log an engine gone at DEBUG) or an API process that exited
            dead = next((p for p in engines + apis if p.exitcode is not None), None)
            if not stopping and (refusal is not None or dead is not None):
                if refusal is None and dead is not None:
                    kind = "engine" if dead in engines else "API server"
                    logger.error(
                        "%s process %s exited (code %s): stopping the server", kind, dead.pid, dead.exitcode
                    )
                    code = 1
                stopping = True
                for q in apis:
                    if q.is_alive():
                        q.terminate()
        # an API process the passed-on SIGTERM ended before it could drain (still starting)
        # exited as asked: a stop during start-up is a clean one, as with one API process
        stopped = -signal.SIGTERM if received_any else None
        if any(p.exitcode and p.exitcode != stopped for p in apis):
            code = 1
    finally:
        for p in apis:
            if p.is_alive():
                p.kill()
            p.join(5)
        _stop_engines(engines)
        for s, handler in old.items():
            signal.signal(s, handler)
        shutil.rmtree(ipc_dir, ignore_errors=True)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        refusal = _read_refusal(refusal_readers, refusal)  # one sent as the last API process exited
        for reader in refusal_readers:
            reader.close()
    if refusal is not None:
        raise ValueError(refusal)  # the CLI's one line, as with one API process
    failed = [p.exitcode for p in apis if p.exitcode]
    if failed and (any(p.exitcode == 2 for p in engines) or all(c == 2 for c in failed)):
        code = 2  # the model or the configuration was refused (by an engine, or by every API process)
    logger.info("shut down")
    return code


def _read_refusal(readers: list[Connection], refusal: str | None) -> str | None:
    """``refusal``, else the first start-up refusal an engine sent on one of ``readers``;
    a reader whose engine sent one or exited is closed and removed."""
    for reader in [r for r in readers if r.poll()]:  # a line, or the engine's end
        with contextlib.suppress(EOFError, OSError):
            refusal = refusal or str(reader.recv())
        readers.remove(reader)
        reader.close()
    return refusal


def _stop_engines(engines: list[multiprocessing.process.BaseProcess], timeout: float = 5.0) -> None:
    """Send every live engine its stop signal (it ignores SIGTERM while this process lives),
    SIGKILL those still alive after ``timeout`` seconds."""
    for p in engines:
        if p.is_alive() and p.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, STOP_SIGNAL)
    deadline = time.monotonic() + timeout
    for p in engines:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            logger.warning("the engine process %s did not stop in %.0f s; killing it", p.pid, timeout)
            p.kill()
            p.join(5)


def _with_port(options: Any, port: int) -> Any:
    import dataclasses

    return dataclasses.replace(options, port=port)
