"""EngineClient: the API process's asyncio handle on the engine core process.

It binds the two ZMQ sockets, spawns :func:`surge.engine.core_proc.run_engine_core`, waits for
:class:`EngineReady`, then runs one dispatch task that routes every :class:`EngineOutput` to the
``asyncio.Queue`` of its request. A watcher on the process sentinel notices an engine death at
once: every in-flight request gets an :class:`EngineDeadError` item and new requests are refused.
A wedged engine (alive but stepping no more) shows in :meth:`EngineClient.seconds_without_progress`.

The ZMQ sockets live in a folder ``surge-ipc-<pid>-*`` of the temporary directory, removed at
shutdown; folders left by a killed API process (whose pid no longer runs) are removed at the
next start.

With several API processes (``surge serve --api-server-count N``, :mod:`surge.server.api_workers`)
the engine is started by the supervisor process and each API process's client *attaches* to it
(:class:`EngineAttachment`): it binds its own pair of addresses, tags its requests with its
``client_index``, and watches the engine's pid instead of a child process.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio

from surge.config import EngineConfig
from surge.core.outputs import EngineOutput, SchedulerStats
from surge.engine.core_proc import (
    STOP_SIGNAL,
    AbortRequest,
    AddRequest,
    EngineFactory,
    EngineFatalError,
    EngineMessage,
    EngineOutputs,
    EngineReady,
    EngineStartupError,
    RequestError,
    ResetPrefixCache,
    run_engine_core,
)
from surge.engine.llm_engine import choice_ids
from surge.sampling_params import SamplingParams

logger = logging.getLogger("surge.engine.client")


_EXIT_GRACE_S = 0.5
"""Seconds between noticing the engine process's exit and failing its requests (see
:meth:`EngineClient._on_process_exit`)."""


class EngineStartError(RuntimeError):
    """The engine process failed to start (the message is one readable line).

    Attributes:
        user_error: the engine refused the configuration or the model folder (a bad input,
            exit code 2 for the CLI), rather than crashing.
        engine_exited: the engine process was gone before it said anything.
    """

    def __init__(self, message: str, *, user_error: bool = False, engine_exited: bool = False) -> None:
        super().__init__(message)
        self.user_error = user_error
        self.engine_exited = engine_exited


class EngineDeadError(RuntimeError):
    """The engine process is gone; requests cannot be served."""


_IPC_PREFIX = "surge-ipc-"


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_ipc_dirs(tmp_dir: str | None = None, prefix: str = _IPC_PREFIX) -> list[str]:
    """Remove this user's ``<prefix><pid>-*`` folders (``surge-ipc-`` by default; the API server
    supervisor's ``surge-metrics-`` too) whose process no longer runs (a SIGKILL left them).

    Args:
        tmp_dir: where to look (default ``tempfile.gettempdir()``).
        prefix: the folders' name prefix, up to the pid.

    Returns:
        The removed folders.
    """
    base = tmp_dir or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].split("-", 1)[0]
        path = os.path.join(base, name)
        try:
            if not pid_text.isdigit() or os.stat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        pid = int(pid_text)
        if pid != os.getpid() and not _pid_running(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


QueueItem = tuple[int, EngineOutput | RequestError | EngineDeadError]
"""What a request's queue receives: (choice index, item)."""


@dataclass(frozen=True)
class EngineAttachment:
    """An engine started by another process, as one of several API processes sees it.

    Attributes:
        input_address, output_address: the ZMQ addresses this API process binds (the engine
            connects to them).
        client_index: this API process's index (the engine sends its outputs back to it).
        engine_pid: the engine process's pid (watched for its death).
    """

    input_address: str
    output_address: str
    client_index: int
    engine_pid: int


_PID_POLL_S = 0.25
"""An attached client checks that the engine's pid lives this often (seconds)."""


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    if not _pid_running(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc: trust kill(pid, 0)


@dataclass(slots=True)
class _Sink:
    queue: asyncio.Queue[QueueItem]
    index: int
    started: bool = False  # its first output (its prefill done) has come


class EngineClient:
    """Start, feed and watch the engine core process from an asyncio event loop.

    Args:
        config: the engine configuration (sent to the engine process).
        engine_factory: picklable callable building the engine (default ``LLMEngine``).
        log_level: ``logging`` level of the engine process.
        attach: connect to an engine another process started instead of starting one (one
            of several API processes).
        replica: the data-parallel replica this engine is (``DPEngineClient``'s), or None:
            every reason of its death then starts ``"replica {replica}: "`` (its in-flight
            requests' errors, :attr:`dead_reason`, the ``on_dead`` reason, the log line), but
            not the server's own shutdown, which no replica caused.

    Attributes:
        info: the engine's :class:`EngineReady` message once started.
        stats: the latest :class:`SchedulerStats` snapshot: the ready message's (the KV pool at
            start-up), then each batch's (None before the engine is ready).
        on_grammar_compile_time: called with the seconds of each grammar compilation the
            engine reports (the server's histogram), or None.
        on_iteration_tokens: called once per engine batch that has outputs with its tokens as
            vLLM's ``iteration_tokens_total`` counts them (the tokens generated, plus the prompt
            tokens computed for each request whose prefill the batch completes: its first
            output, less its prefix-cache hits), or None.
        on_dead: called once with the reason when the engine dies or fails (not when the
            server shuts it down), after the in-flight requests got their error; or None.
        pid: the engine process id once started.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        engine_factory: EngineFactory | None = None,
        log_level: int = logging.INFO,
        attach: EngineAttachment | None = None,
        replica: int | None = None,
    ) -> None:
        self.config = config
        self._attach = attach
        self._reason_prefix = "" if replica is None else f"replica {replica}: "
        self._client_index = 0 if attach is None else attach.client_index
        # Several API processes may be given the same request id (X-Request-Id): the engine
        # sees each one's ids with the process's index appended.
        self._id_suffix = "" if attach is None else f"@{attach.client_index}"
        self._num_sent = 0
        self._num_added = 0
        self._engine_factory = engine_factory
        self._log_level = log_level
        self.info: EngineReady | None = None
        self.stats: SchedulerStats | None = None
        self.on_grammar_compile_time: Callable[[float], None] | None = None
        self.on_iteration_tokens: Callable[[int], None] | None = None
        self.on_dead: Callable[[str], None] | None = None
        self._sinks: dict[str, _Sink] = {}
        self._dead_reason: str | None = None
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._ipc_dir: str | None = None
        self._zctx: zmq.asyncio.Context | None = None
        self._sync_ctx: zmq.Context | None = None
        self._in_sock: zmq.Socket | None = None
        self._out_sock: zmq.asyncio.Socket | None = None
        self._dispatch_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._unreachable = False  # a send found no engine: its death is reported after a grace
        self._last_progress = time.monotonic()

    @property
    def pid(self) -> int | None:
        """The engine process's pid (the attached engine's, or the one this client started);
        None before it has started."""
        if self._attach is not None:
            return self._attach.engine_pid
        return None if self._proc is None else self._proc.pid

    @property
    def load(self) -> int:
        """The engine's waiting plus running requests as last reported, plus this process's
        requests it had not yet received then (the routing load of one of several API
        processes, which share the engine)."""
        unseen = self._num_sent - self._num_added
        s = self.stats
        return unseen if s is None else s.num_running + s.num_waiting + unseen

    @property
    def is_ready(self) -> bool:
        """True while the engine is started and alive."""
        return self.info is not None and self._dead_reason is None and not self._closing

    @property
    def dead_reason(self) -> str | None:
        """Why the engine is gone (None while it lives)."""
        return self._dead_reason

    @property
    def num_inflight(self) -> int:
        """Requests sent to the engine and not finished yet."""
        return len(self._sinks)

    def seconds_without_progress(self) -> float:
        """Seconds since the engine last reported a step while requests are in flight (0 when none are).

        The engine reports after every step that produced anything, and at least once a second
        while it has work, so a large value means a stopped or wedged engine.
        """
        if not self._sinks:
            return 0.0
        return time.monotonic() - self._last_progress

    async def start(self) -> EngineReady:
        """Spawn the engine process and wait until it is ready.

        Returns:
            The engine's ready message (model, KV pool, max_model_len).

        Raises:
            EngineStartError: the engine reported a start-up error or died while starting.
        """
        self._loop = asyncio.get_running_loop()
        if self._attach is None:
            for path in remove_stale_ipc_dirs():
                logger.info("removed the IPC folder %s of an API process that is gone", path)
            self._ipc_dir = tempfile.mkdtemp(prefix=f"{_IPC_PREFIX}{os.getpid()}-")
            in_addr = f"ipc://{self._ipc_dir}/input"
            out_addr = f"ipc://{self._ipc_dir}/output"
        else:
            in_addr, out_addr = self._attach.input_address, self._attach.output_address
        self._sync_ctx = zmq.Context(io_threads=1)
        self._in_sock = self._sync_ctx.socket(zmq.PUSH)
        self._zctx = zmq.asyncio.Context(io_threads=1)
        self._out_sock = self._zctx.socket(zmq.PULL)
        for sock in (self._in_sock, self._out_sock):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
        self._in_sock.bind(in_addr)
        self._out_sock.bind(out_addr)
        if self._attach is None:
            ctx = multiprocessing.get_context("spawn")
            self._proc = ctx.Process(
                target=run_engine_core,
                args=(self.config, in_addr, out_addr, os.getpid(), self._engine_factory, self._log_level),
                # a start-up error the user is to fix reaches them through EngineStartError only
                kwargs={"log_user_start_error": False},
                name="surge-engine-core",
            )
            self._proc.start()
            atexit.register(self._terminate_at_exit)
        decoder = msgspec.msgpack.Decoder(EngineMessage)
        while True:
            if await self._out_sock.poll(200, zmq.POLLIN):
                msg = decoder.decode(await self._out_sock.recv())
                break
            if not self._engine_alive():
                code = None if self._proc is None else self._proc.exitcode
                await self.shutdown()
                raise EngineStartError(
                    f"the engine process exited during start-up (exit code {code})", engine_exited=True
                )
        if isinstance(msg, EngineStartupError):
            await self.shutdown()
            raise EngineStartError(msg.message, user_error=msg.user_error)
        if not isinstance(msg, EngineReady):
            await self.shutdown()
            raise EngineStartError(f"unexpected first message from the engine: {type(msg).__name__}")
        # The engine's input connection may still be in its handshake: wait until our PUSH socket
        # has a peer, so that non-blocking sends never fail for want of one.
        while not self._in_sock.poll(0, zmq.POLLOUT):
            if not self._engine_alive():
                code = None if self._proc is None else self._proc.exitcode
                await self.shutdown()
                raise EngineStartError(
                    f"the engine process exited during start-up (exit code {code})", engine_exited=True
                )
            await asyncio.sleep(0.005)
        self.info = msg
        if msg.stats is not None:  # the KV pool's figures from start-up, before any batch
            self.stats = msg.stats
        if self._proc is not None:
            self._loop.add_reader(self._proc.sentinel, self._on_process_exit)
        else:
            self._loop.call_later(_PID_POLL_S, self._poll_engine_pid)
        self._dispatch_task = asyncio.create_task(self._dispatch(decoder), name="surge-engine-dispatch")
        self._dispatch_task.add_done_callback(self._on_dispatch_done)
        return msg

    def _engine_alive(self) -> bool:
        if self._attach is not None:
            return pid_alive(self._attach.engine_pid)
        assert self._proc is not None
        return self._proc.is_alive()

    def _poll_engine_pid(self) -> None:
        """An attached client's watch on the engine it did not start (every ``_PID_POLL_S``)."""
        if self._closing or self._dead_reason is not None or self._loop is None:
            return
        if self._engine_alive():
            self._loop.call_later(_PID_POLL_S, self._poll_engine_pid)
        else:  # the engine's own EngineFatalError, if it sent one, may still be on its way
            self._loop.call_later(_EXIT_GRACE_S, self._report_exit)

    def _on_dispatch_done(self, task: asyncio.Task[None]) -> None:
        """A dispatch loop that ends with an error leaves no one to route outputs: fail fast."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error("the engine output dispatcher failed", exc_info=exc)
            self._mark_dead(f"the engine output dispatcher failed: {exc!r}")

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        queue: asyncio.Queue[QueueItem],
        index: int = 0,
        arrival_time: float | None = None,
        prompt_logprobs_once: bool = False,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> int:
        """Send a request; its outputs go to ``queue`` tagged with ``index``. Returns the index
        of the engine that serves it: 0 (one engine; see ``DPEngineClient.add_request``).

        With ``sampling_params.n > 1`` the engine runs its ``n`` choices
        (:func:`~surge.engine.llm_engine.split_n`'s ids ``f"{request_id}-{i}"``, which the
        outputs carry), tagged ``index``, ``index + 1``, ...; the parameters cross the socket once.
        ``prompt_logprobs_once``: only the first choice's outputs carry ``prompt_logprobs``
        (:class:`~surge.engine.core_proc.AddRequest`). ``cache_salt``: only requests with the
        same salt share prefix-cache blocks (None: no salt). ``priority``: the scheduling
        priority (lower first) under the ``priority`` policy.
        A rejection by the engine arrives on the queue as a :class:`RequestError` (one per
        choice); an engine death as an :class:`EngineDeadError`. The queue gets nothing more for
        a choice after its finished output.

        Raises:
            EngineDeadError: the engine is not running.
            ValueError: a choice's id is in flight already (its outputs could not be told apart).
        """
        if not self.is_ready or self._in_sock is None:
            raise EngineDeadError(self._dead_reason or "the engine is not running")
        if not self._sinks:  # the engine was idle: its stall clock starts now
            self._last_progress = time.monotonic()
        n = sampling_params.n
        engine_ids = [rid + self._id_suffix for rid in choice_ids(request_id, n)]
        taken = next((e for e in engine_ids if e in self._sinks), None)
        if taken is not None:  # never overwrite another request's routing
            raise ValueError(f"request id {taken.removesuffix(self._id_suffix)!r} is already in use")
        for i, engine_id in enumerate(engine_ids):
            self._sinks[engine_id] = _Sink(queue, index + i)
        self._num_sent += n
        msg = AddRequest(
            engine_ids[0] if n == 1 else request_id + self._id_suffix,
            prompt_token_ids,
            sampling_params,
            arrival_time or time.monotonic(),
            self._client_index,
            engine_ids if n > 1 else [],
            prompt_logprobs_once and n > 1,
            cache_salt,
            priority,
        )
        self._send(msgspec.msgpack.encode(msg))
        return 0

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Abort requests (unknown or finished ids are ignored); their queues get nothing more."""
        suffix = self._id_suffix
        ids = [rid + suffix for rid in request_ids if self._sinks.pop(rid + suffix, None) is not None]
        if ids and self.is_ready:
            self._send(msgspec.msgpack.encode(AbortRequest(ids)))

    def reset_prefix_cache(self) -> None:
        """Ask the engine to evict its unreferenced cached KV blocks; requests added after this
        call are scheduled after the reset.

        Raises:
            EngineDeadError: the engine is not running.
        """
        if not self.is_ready or self._in_sock is None:
            raise EngineDeadError(self._dead_reason or "the engine is not running")
        self._send(msgspec.msgpack.encode(ResetPrefixCache()))

    def _send(self, buf: bytes) -> None:
        assert self._in_sock is not None
        try:
            self._in_sock.send(buf, flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:  # no peer any more: the engine is dying
            if self._loop is None:
                self._mark_dead(f"cannot reach the engine process: {e}")
            elif not self._unreachable:  # its requests fail once the grace has passed
                self._unreachable = True
                self._loop.call_later(_EXIT_GRACE_S, self._report_unreachable, str(e))

    def _report_unreachable(self, error: str) -> None:
        """A send found no engine ``_EXIT_GRACE_S`` ago: fail in-flight requests with the reason
        the process watch gives (the engine's own :class:`EngineFatalError`, read meanwhile, or its
        exit code: ``-9`` for the kernel's OOM killer), not the socket's ``Resource temporarily
        unavailable``; with the socket's error only while the process still runs."""
        if self._closing or self._dead_reason is not None:
            return
        if self._engine_alive():
            self._mark_dead(f"cannot reach the engine process: {error}")
        else:
            self._report_exit()

    async def _dispatch(self, decoder: msgspec.msgpack.Decoder) -> None:
        """Route every engine message to the queues of its requests."""
        assert self._out_sock is not None
        sinks = self._sinks
        while True:
            frame = await self._out_sock.recv(copy=False)
            msg = decoder.decode(frame.buffer)
            if isinstance(msg, EngineOutputs):
                self.stats = msg.stats
                self._num_added = msg.num_added
                self._last_progress = time.monotonic()
                if msg.grammar_compile_times and self.on_grammar_compile_time is not None:
                    for seconds in msg.grammar_compile_times:
                        self.on_grammar_compile_time(seconds)
                step_tokens = 0
                for out in msg.outputs:
                    sink = sinks.get(out.request_id)
                    if sink is None:
                        continue  # aborted by the API side
                    step_tokens += len(out.new_token_ids)
                    if not sink.started:  # its prefill is done: its computed prompt tokens count
                        sink.started = True
                        step_tokens += out.num_prompt_tokens - out.num_cached_tokens
                    sink.queue.put_nowait((sink.index, out))
                    if out.finish_reason is not None:
                        del sinks[out.request_id]
                if msg.outputs and self.on_iteration_tokens is not None:
                    self.on_iteration_tokens(step_tokens)
                for err in msg.errors:
                    sink = sinks.pop(err.request_id, None)
                    if sink is not None:
                        sink.queue.put_nowait((sink.index, err))
                # recv() of a waiting message does not yield: let the HTTP handlers run.
                await asyncio.sleep(0)
            elif isinstance(msg, EngineFatalError):
                self._mark_dead(f"the engine failed: {msg.message}")
                return

    def _on_process_exit(self) -> None:
        """The engine process ended: fail in-flight requests, after a short grace.

        An engine that fails sends :class:`EngineFatalError` and then exits; the sentinel can fire
        before the dispatch task has read that message, and before the exit code can be read.
        Deciding ``_EXIT_GRACE_S`` later lets the engine's own reason reach the requests first
        (first reason wins in :meth:`_mark_dead`). An engine that exits with code 0 while the
        server is not shutting down (a stop signal sent to it directly) is not reported as a
        crash. A SIGTERM to the whole process group does not stop the engine: it ignores SIGTERM
        while this process lives, and the server drains, then stops it.
        """
        if self._loop is not None and self._proc is not None:
            self._loop.remove_reader(self._proc.sentinel)
        if self._closing:
            return
        if self._loop is None:
            self._report_exit()
        else:
            self._loop.call_later(_EXIT_GRACE_S, self._report_exit)

    def _report_exit(self) -> None:
        """Fail in-flight requests with the engine process's exit code (unless shutting down)."""
        if self._closing or self._dead_reason is not None:
            return
        if self._attach is not None:  # not our child: no exit code to read
            self._mark_dead(f"the engine process (pid {self._attach.engine_pid}) is gone")
            return
        code = None
        if self._proc is not None:
            self._proc.join(timeout=0)  # reap it, so that the exit code is known
            code = self._proc.exitcode
        if code == 0:  # a clean stop (its stop signal, sent by someone else): not a crash
            self._mark_dead("the engine process stopped (exit code 0)", logging.INFO)
        else:
            self._mark_dead(f"the engine process died (exit code {code})")

    def _mark_dead(self, reason: str, level: int = logging.ERROR) -> None:
        if self._dead_reason is not None:
            return
        if not self._closing:  # a data-parallel replica's death names it; a shutdown is no replica's
            reason = self._reason_prefix + reason
        self._dead_reason = reason
        if not self._closing:
            logger.log(level, "%s; failing %d in-flight requests", reason, len(self._sinks))
        err = EngineDeadError(reason)
        for sink in self._sinks.values():
            sink.queue.put_nowait((sink.index, err))
        self._sinks.clear()
        if not self._closing and self.on_dead is not None:
            self.on_dead(reason)

    def _terminate_at_exit(self) -> None:
        """If the API process exits without :meth:`shutdown`, do not leave (or wait on) the engine."""
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the engine process (:data:`surge.engine.core_proc.STOP_SIGNAL`, then SIGKILL after
        ``timeout`` seconds) and close sockets.

        In-flight requests get an :class:`EngineDeadError`. Safe to call more than once.
        """
        self._closing = True
        self._mark_dead("the server is shutting down")
        if self._dispatch_task is not None:
            self._dispatch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._dispatch_task
            self._dispatch_task = None
        proc = self._proc
        if proc is not None:
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(proc.sentinel)
            if proc.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, STOP_SIGNAL)  # the engine ignores SIGTERM while we live
                deadline = time.monotonic() + timeout
                while proc.is_alive() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                if proc.is_alive():
                    logger.warning("the engine process did not stop in %.0f s; killing it", timeout)
                    proc.kill()
            proc.join(timeout=timeout)
            atexit.unregister(self._terminate_at_exit)
        for sock in (self._in_sock, self._out_sock):
            if sock is not None:
                sock.close(linger=0)
        for zctx in (self._zctx, self._sync_ctx):
            if zctx is not None:
                zctx.term()
        self._in_sock = self._out_sock = None
        self._zctx = self._sync_ctx = None
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._ipc_dir = None
