"""The engine's grammar compiler: compile worker processes with a time limit, the engine's
xgrammar tokenizer info, a cache by key."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from typing import Any

import msgspec

from surge.sampling_params import StructuredOutputsParams
from surge.structured.compile_worker import (
    CompileDone,
    CompileFailed,
    CompileJob,
    CompileWorkerSpec,
    WorkerMessage,
    WorkerReady,
    compile_grammar,
    grammar_name,
    make_tokenizer_info,
)
from surge.structured.cpus import available_cpus

logger = logging.getLogger("surge.structured")

CACHE_SIZE = 512
"""Compiled grammars kept (least recently used dropped first)."""

CACHE_BYTES = 512 * 1024 * 1024
"""Most bytes of compiled grammars kept (xgrammar's ``memory_size_bytes``; least recently used
dropped first): one may take up to ``MAX_COMPILED_BYTES`` (64 MiB), so 512 of them could
otherwise hold gigabytes."""

TIMEOUT_REFUSAL_TTL_S = 600.0
"""Seconds a grammar refused for running past ``--grammar-compile-timeout`` stays refused at
once when sent again; then it is compiled again (the limit may have been hit on a busy host).
Other refusals (a grammar that accepts no text, one xgrammar cannot compile) are for good."""

CPUS_PER_COMPILE_THREAD = 8
"""The compilations together use at most one thread per this many CPUs (at least one): the
engine loop, the mask fill's threads and the API process need the rest, and a compilation
that takes the cores they run on stalls every stream (measured: README of
``benchmarks/results/h200-qwen3-8b/features/``)."""


_MAX_WAIT_S = 3600.0
"""Longest single wait on a worker's socket, in seconds (longer limits wait in several)."""

WORKER_START_TIMEOUT_S = 120.0
"""Seconds a compile worker may take to start (import xgrammar and transformers, build the
tokenizer info: about 3 s for Qwen3's tokenizer on a 2-core machine) before its job fails."""


def compile_thread_budget(cpus: int) -> tuple[int, int]:
    """``(workers, threads_per_compile)`` for ``cpus`` CPUs: ``workers`` concurrent
    compilations (worker processes) of one xgrammar thread each,
    ``cpus // CPUS_PER_COMPILE_THREAD`` of them (1 to 4); ``workers * threads_per_compile``
    never exceeds that budget."""
    return max(1, min(4, cpus // CPUS_PER_COMPILE_THREAD)), 1


def start_worker_process(name: str) -> tuple[subprocess.Popen[bytes], Connection]:
    """Start ``python -m surge.structured.compile_worker`` and return it with the engine's end
    of its socket pair (the worker's end is passed as an inherited descriptor).

    A fresh interpreter, not a ``multiprocessing`` "spawn" child: spawn re-imports the parent's
    ``__main__``, so an offline script without an ``if __name__ == "__main__":`` guard would
    re-run itself in every worker. The child gets this process's ``sys.path`` as its
    ``PYTHONPATH`` (what spawn passes too) and runs with ``-P`` (no working directory first on
    its path), so it imports the same ``surge``.

    Raises:
        OSError: the interpreter could not be started.
    """
    ours, theirs = socket.socketpair()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        process = subprocess.Popen(
            # -P: the working directory is not put first on sys.path, so the worker imports the
            # engine's surge (and xgrammar, json, ...), not a folder of that name where it runs
            [sys.executable, "-P", "-m", "surge.structured.compile_worker", str(theirs.fileno()), name],
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,  # a Ctrl-C to the terminal reaches the engine, which stops it
            env=env,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, Connection(ours.detach())


class CompilePool:
    """A first-in-first-out pool of daemon threads running jobs into futures: the compile jobs'
    threads, like ``concurrent.futures.ThreadPoolExecutor``'s but daemons, so that an
    interpreter that exits while a compilation runs (an offline ``LLM`` never closed, or a
    ``generate`` interrupted) does not wait for it: the executor's threads are joined at exit,
    and one waiting on a hostile grammar's worker held the exit for the whole time limit.

    Args:
        max_workers: threads (>= 1), started at once.
        name: the threads' name prefix.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max_workers
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()  # a submit never queues behind shutdown's stop markers
        for i in range(max_workers):
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """A future of ``fn(*args)``, run by the next free thread.

        Raises:
            RuntimeError: the pool is shut down.
        """
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is shutting down")
            self._jobs.put((future, lambda: fn(*args)))
        return future

    def shutdown(self) -> None:
        """Cancel the jobs not started and let the threads end after their current job.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
            for _ in range(self.max_workers):
                self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, call = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as e:  # the job's failure is its future's
                future.set_exception(e)
            else:
                future.set_result(result)
            del job, future, call


def _stop_workers(
    closed: threading.Event, lock: threading.Lock, pool: CompilePool, workers: list[_Worker]
) -> None:
    """Mark the cache closed (a job cut short says "shutting down", not that its worker died),
    stop its pool's threads and kill ``workers``' processes, under the cache's ``lock``: the
    cache's finalizer, at exit or when it is collected without :meth:`CompiledGrammarCache.shutdown`.
    None of the arguments refers back to the cache."""
    closed.set()
    with lock:
        pool.shutdown()
        for worker in workers:
            worker.stop()


class _Worker:
    """One compile worker process (None until started, and after it was stopped) and the
    engine's end of its socket."""

    __slots__ = ("index", "process", "conn")

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None

    def stop(self) -> None:
        """Kill the process (SIGKILL: it holds nothing to save) and close the socket."""
        process, conn = self.process, self.conn
        self.process = self.conn = None
        if process is not None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5.0)
        if conn is not None:
            conn.close()


class CompiledGrammarCache:
    """Compiles grammars in worker processes, with a time limit, and caches them by
    ``StructuredOutputsParams.key``.

    Each job runs on one of ``max_workers`` threads of a :class:`CompilePool` (daemons, so an
    interpreter that exits without :meth:`shutdown` does not wait for a compilation; a
    finalizer kills the workers then) and takes one idle worker process
    (:func:`~surge.structured.compile_worker.run_compile_worker` in a fresh interpreter,
    :func:`start_worker_process`, started by the first job that takes it and again after it was
    stopped). The worker builds the grammar, compiles it with one xgrammar thread, refuses a
    grammar that accepts no text or compiles too large, and sends back a small compiled
    grammar's JSON (at most ``SERIALIZE_MAX_BYTES`` compiled), which the engine deserializes
    with its own tokenizer info; a larger one the engine compiles again on the job's thread
    (xgrammar releases the GIL while it compiles), since its JSON grows about with the square of
    its size: on 2 CPUs with Qwen3's vocabulary, a 2-property JSON schema took 17-18 ms against
    13-14 ms compiled in-process, an 80-property one (1.96 MB of JSON) 96-99 ms against 18
    (``benchmarks/grammar_worker_bench.py``, ``benchmarks/results/grammar-workers-cpu/``), and a
    1,000-property one 268 MB of JSON and 12.6 s against a 0.13 s compile (``session52/`` there). An exchange cut short by an
    exception stops its worker, so that no reply is ever read by the next job. A compilation
    that runs longer than ``compile_timeout`` is stopped by killing its worker: a thread could
    not be stopped, and a valid 400-rule EBNF grammar held a compile thread for 88 s with
    Qwen3's vocabulary. The limit bounds each grammar's cost, not the wait behind it: the
    workers are few and take jobs first in first out. A refused grammar (over the limit, or
    accepting no text) is remembered like a compiled one, so a client that sends it again
    costs no worker time.

    The xgrammar ``TokenizerInfo`` (here and in each worker) is built from the model folder's
    tokenizer (byte-level BPE such as Qwen3's, or byte-fallback SentencePiece such as
    stories260K's) with the model's vocabulary size (the LM head may be wider than the
    tokenizer: the padded ids are never allowed) and the model's EOS ids as stop tokens. Both
    are built by the first compilation: an engine that never sees a grammar starts no worker
    and never loads them.

    Args:
        tokenizer_dir: the model folder (its tokenizer files).
        vocab_size: the model's vocabulary size (logits width).
        stop_token_ids: the model's EOS ids; a finished grammar allows only these.
        compile_timeout: seconds one compilation may run (> 0; worker start-up not counted).
        max_workers: concurrent compilations (default: :func:`compile_thread_budget`).
        worker_hook: tests only: :attr:`CompileWorkerSpec.hook` of the workers.

    Attributes:
        compile_times: seconds of each finished compilation (measured in the worker, plus the
            engine's own compilation of a grammar too large to send) not yet taken by
            :meth:`take_compile_times` (for the grammar compile-time histogram).
        compiled_here: grammars the engine compiled again itself (too large to send as JSON).

    Raises:
        ValueError: ``compile_timeout`` is not a positive finite number.
    """

    def __init__(
        self,
        tokenizer_dir: str,
        vocab_size: int,
        stop_token_ids: tuple[int, ...],
        compile_timeout: float = 60.0,
        max_workers: int | None = None,
        worker_hook: str | None = None,
    ) -> None:
        if not 0 < compile_timeout < math.inf:
            raise ValueError(
                f"grammar_compile_timeout must be a positive number of seconds, got {compile_timeout}"
            )
        workers, threads = compile_thread_budget(available_cpus())
        workers = max_workers or workers
        self._spec = CompileWorkerSpec(
            tokenizer_dir=tokenizer_dir,
            vocab_size=vocab_size,
            stop_token_ids=tuple(stop_token_ids),
            threads=threads,
            hook=worker_hook,
        )
        self._timeout = compile_timeout
        self._pool = CompilePool(workers, "surge-grammar")
        self._workers = [_Worker(i) for i in range(workers)]
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        for worker in self._workers:
            self._idle.put(worker)
        self._lock = threading.Lock()  # worker starts and stops against shutdown
        self._closed = threading.Event()  # shutdown(), or the finalizer at exit
        # an interpreter that exits without shutdown() kills the workers (its threads are daemons)
        self._finalizer = weakref.finalize(
            self, _stop_workers, self._closed, self._lock, self._pool, self._workers
        )
        self._info_lock = threading.Lock()
        self._info: Any = None
        self._compiler: Any = None  # the engine's own, for grammars too large to send as JSON
        self._sizes: dict[tuple[str, Any], int] = {}  # key -> memory_size_bytes of a compiled grammar
        self._cached_bytes = 0
        self._sizes_lock = threading.Lock()
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(WorkerMessage)
        self._cache: OrderedDict[tuple[str, Any], Future[Any]] = OrderedDict()
        self._timed_out: dict[tuple[str, Any], float] = {}  # key -> monotonic time of the refusal
        self.compile_times: list[float] = []
        self.compiled_here = 0

    def submit(self, params: StructuredOutputsParams) -> Future[Any]:
        """A future of the ``xgrammar.CompiledGrammar`` of ``params`` (done at once on a
        cache hit). A refused grammar raises ``ValueError`` from ``result()`` (invalid, not
        compilable, accepting no text, or over the time limit); the refusal is cached like a
        compiled grammar, so the same grammar sent again fails at once instead of holding a
        worker for the time limit again (a refusal for the time limit, which a busy host may
        cause, for :data:`TIMEOUT_REFUSAL_TTL_S` only). A worker that died or could not start raises
        ``RuntimeError``; that failure is not cached, nor is a compilation cancelled before
        it started (every request that waited for it was aborted)."""
        key = params.key
        future = self._cache.get(key)
        timed_out = self._timed_out.get(key)
        if timed_out is not None and time.monotonic() - timed_out > TIMEOUT_REFUSAL_TTL_S:
            del self._timed_out[key]  # it may have run late on a busy host: compile it again
            future = None
        if (
            future is not None
            and not future.cancelled()
            and not (future.done() and not isinstance(future.exception(), ValueError | None))
        ):
            self._cache.move_to_end(key)
            return future
        future = self._pool.submit(self._compile, params)
        self._cache[key] = future
        while len(self._cache) > CACHE_SIZE or (self._cached_bytes > CACHE_BYTES and len(self._cache) > 1):
            with self._sizes_lock:  # against a compile job adding the size of the key popped
                old = self._cache.popitem(last=False)[0]
                self._cached_bytes -= self._sizes.pop(old, 0)
            self._timed_out.pop(old, None)
        return future

    @property
    def cached_bytes(self) -> int:
        """Bytes of the compiled grammars in the cache (``memory_size_bytes``; those still
        compiling not counted)."""
        return self._cached_bytes

    def tokenizer_info(self) -> Any:
        """The engine's xgrammar ``TokenizerInfo`` (built on first use)."""
        with self._info_lock:
            if self._info is None:
                t0 = time.perf_counter()
                self._info = make_tokenizer_info(self._spec)
                logger.info("grammar tokenizer info ready in %.2f s", time.perf_counter() - t0)
            return self._info

    def _own_compiler(self) -> Any:
        """The engine's xgrammar ``GrammarCompiler`` (built on first use, as the workers'):
        grammars too large to send as JSON are compiled again with it."""
        import xgrammar as xgr

        info = self.tokenizer_info()
        with self._info_lock:
            if self._compiler is None:
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=self._spec.threads, cache_enabled=False
                )
            return self._compiler

    def worker_pids(self) -> list[int]:
        """Process ids of the compile workers started and not stopped."""
        with self._lock:
            return [w.process.pid for w in self._workers if w.process is not None]

    def _compile(self, params: StructuredOutputsParams) -> Any:
        worker = self._idle.get()  # never waits: one worker per pool thread
        try:
            return self._compile_on(worker, params)
        finally:
            self._idle.put(worker)

    def _compile_on(self, worker: _Worker, params: StructuredOutputsParams) -> Any:
        import xgrammar as xgr

        conn, process = self._ready_worker(worker)
        try:
            with contextlib.suppress(OSError):  # the worker is gone or shutdown closed the pipe
                conn.send_bytes(self._encoder.encode(CompileJob(params)))
            reply = self._receive(
                worker, conn, process, self._timeout, f"compiling the {grammar_name(params)} grammar"
            )
        except BaseException:
            self._stop_if_current(worker, process)  # its reply would answer the next job
            raise
        if reply is None:
            with self._lock:
                worker.stop()
            self._timed_out[params.key] = time.monotonic()
            logger.warning(
                "grammar compile worker %d killed: a %s grammar ran past %g s (--grammar-compile-timeout)",
                worker.index,
                grammar_name(params),
                self._timeout,
            )
            raise ValueError(
                f"the {grammar_name(params)} grammar took longer than {self._timeout:g} s to compile "
                f"(--grammar-compile-timeout); sent again within {TIMEOUT_REFUSAL_TTL_S / 60:g} minutes, "
                "it is refused at once"
            )
        if isinstance(reply, CompileFailed):
            raise ValueError(reply.message)
        if not isinstance(reply, CompileDone):
            self._stop_if_current(worker, process)
            raise RuntimeError(f"unexpected message from a grammar compile worker: {type(reply).__name__}")
        seconds = reply.seconds
        if reply.compiled_json is not None:
            compiled = xgr.CompiledGrammar.deserialize_json(reply.compiled_json, self.tokenizer_info())
        else:  # compiled within the limit in the worker: the same code takes about as long here
            t0 = time.perf_counter()
            compiled = compile_grammar(self._own_compiler(), self._spec.vocab_size, params)
            seconds += time.perf_counter() - t0
            self.compiled_here += 1
        self.compile_times.append(seconds)
        size = compiled.memory_size_bytes
        with self._sizes_lock:
            if params.key in self._cache and params.key not in self._sizes:
                self._sizes[params.key] = size
                self._cached_bytes += size
        return compiled

    def _ready_worker(self, worker: _Worker) -> tuple[Connection, subprocess.Popen[bytes]]:
        """``worker``'s pipe and process, once the process runs and is ready; it is started
        here when it is not running (the engine's tokenizer info is built meanwhile).

        Raises:
            RuntimeError: the cache is shut down, or the worker could not start.
        """
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("the engine is shutting down")
            if worker.process is not None and worker.conn is not None and worker.process.poll() is None:
                return worker.conn, worker.process
            worker.stop()
            t0 = time.perf_counter()
            try:
                process, conn = start_worker_process(f"surge-grammar-{worker.index}")
            except OSError as e:
                raise RuntimeError(f"the grammar compile worker could not start: {e}") from e
            worker.process, worker.conn = process, conn
            with contextlib.suppress(OSError):  # a worker that died at once: _receive says so
                conn.send_bytes(self._encoder.encode(self._spec))
        try:
            self.tokenizer_info()  # built while the worker starts
            reply = self._receive(worker, conn, process, WORKER_START_TIMEOUT_S, "starting")
        except BaseException:
            self._stop_if_current(worker, process)  # its WorkerReady would answer the next job
            raise
        if not isinstance(reply, WorkerReady):
            with self._lock:
                worker.stop()
            if reply is None:
                raise RuntimeError(
                    f"the grammar compile worker did not start within {WORKER_START_TIMEOUT_S:g} s"
                )
            reason = reply.message if isinstance(reply, CompileFailed) else type(reply).__name__
            raise RuntimeError(f"the grammar compile worker could not start: {reason}")
        logger.info("grammar compile worker %d ready in %.2f s", worker.index, time.perf_counter() - t0)
        return conn, process

    def _receive(
        self,
        worker: _Worker,
        conn: Connection,
        process: subprocess.Popen[bytes],
        timeout: float,
        doing: str,
    ) -> WorkerMessage | None:
        """``process``'s next message on ``conn``, or None after ``timeout`` seconds.

        Raises:
            RuntimeError: the worker exited (killed from outside, crashed, or stopped by
                :meth:`shutdown`); it is stopped, to be started again by the next job.
        """
        deadline = time.monotonic() + timeout
        try:
            # a worker that exits closes its end (EOF); waits are cut to an hour each, as
            # poll() takes milliseconds in a C int (a limit of 1e7 s raised OverflowError)
            while not wait([conn], min(deadline - time.monotonic(), _MAX_WAIT_S)):
                if time.monotonic() >= deadline:
                    return None
            return self._decoder.decode(conn.recv_bytes())
        except (EOFError, OSError):  # the worker is gone, or shutdown closed the pipe
            pass
        with self._lock:
            closed = self._closed.is_set()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(1.0)
            if worker.process is process:
                worker.stop()
        if closed:
            raise RuntimeError("the engine is shutting down")
        message = (
            f"the grammar compile worker exited unexpectedly while {doing} (exit code {process.returncode})"
        )
        logger.warning("%s; it starts again with the next grammar", message)
        raise RuntimeError(message)

    def _stop_if_current(self, worker: _Worker, process: subprocess.Popen[bytes]) -> None:
        """Stop ``worker`` if ``process`` is still its process (an exchange with it was cut
        short: a reply left unread would be taken by the next job as its own)."""
        with self._lock:
            if worker.process is process:
                worker.stop()

    def take_compile_times(self) -> list[float]:
        """Compile times (seconds) recorded since the last call."""
        times, self.compile_times = self.compile_times, []
        return times

    def shutdown(self) -> None:
        """Stop the pool (compilations not started are cancelled) and kill the workers (a
        running compilation's future fails with ``RuntimeError``). Idempotent."""
        with self._lock:
            self._closed.set()
            self._pool.shutdown()
            for worker in self._workers:
                worker.stop()
