"""TPExecutor: the engine's model runner when ``tensor_parallel_size > 1``.

It has the runner's interface (``determine_num_kv_blocks``, ``init_kv_cache``, ``execute``,
``execute_async``), so :class:`~surge.engine.llm_engine.LLMEngine` and its scheduler do not
know about ranks. It spawns one :func:`surge.parallel.worker.run_worker` process per rank of
this host, and per step publishes one :class:`StepMessage` that every rank receives at once
(ZMQ XPUB; the engine waits for every rank's subscription before the first message, so none
is lost). Rank 0 sends the sampled ids back.

A worker that dies or reports an error makes the next call raise :class:`WorkerDiedError`
(checked every ``_POLL_MS`` while waiting, and by :meth:`check_health` while idle), which ends
the engine like any engine failure. :meth:`close` stops every worker; they also die with the
engine process (parent-death signal).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import msgspec
import zmq

from surge.config import EngineConfig
from surge.core.outputs import ModelOutput, SchedulerOutput
from surge.parallel.launch import endpoints
from surge.parallel.messages import (
    InitKVCache,
    KVCacheReady,
    ShutdownWorkers,
    StepResult,
    WorkerFatalError,
    WorkerOutput,
    WorkerReady,
    WorkerStartupError,
)
from surge.parallel.step_codec import StepEncoder
from surge.parallel.worker import start_worker

logger = logging.getLogger("surge.parallel")

_POLL_MS = 100
"""While waiting on the workers, check that they live this often (milliseconds)."""


_PEER_DEATH_GRACE_S = 3.0
"""After a rank reports a failure, how long to wait for a dead peer to show (seconds)."""


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker died or failed (the message says which and why)."""


class _RemoteStep:
    """A launched step; :meth:`result` waits for rank 0's sampled ids."""

    __slots__ = ("_executor", "_step", "_request_ids", "_done", "_answered")

    def __init__(self, executor: TPExecutor, step: int, request_ids: list[str], answered: bool) -> None:
        self._executor = executor
        self._step = step
        self._request_ids = request_ids
        self._done = False
        self._answered = answered

    def done(self) -> bool:
        """Whether :meth:`result` would not wait on the network (nothing to wait for)."""
        return not self._answered

    def result(self) -> ModelOutput:
        """The step's sampled ids.

        Raises:
            WorkerDiedError: a worker died or failed meanwhile.
            RuntimeError: called twice, or rank 0 answered another step.
        """
        if self._done:
            raise RuntimeError("result() called twice")
        self._done = True
        if not self._answered:
            return ModelOutput()
        msg = self._executor._recv()
        # An earlier step's answer still in the socket: its result() was interrupted (e.g. a
        # KeyboardInterrupt in LLM.generate) after it was marked done; that step is settled.
        while isinstance(msg, StepResult) and msg.step < self._step:
            msg = self._executor._recv()
        if not isinstance(msg, StepResult) or msg.step != self._step:
            raise RuntimeError(f"step {self._step}: unexpected message from rank 0: {msg!r}")
        return ModelOutput(
            dict(zip(self._request_ids, msg.token_ids, strict=True)), msg.logprobs, msg.prompt_logprobs
        )


class TPExecutor:
    """Runs the model over ``tensor_parallel_size`` worker processes (see the module docstring).

    Args:
        config: the engine configuration (``parallel.tensor_parallel_size > 1``).
        log_level: ``logging`` level of the workers.
        start_timeout_s: longest wait for the workers to load and size the KV pool.
        step_timing_path: each rank writes its per-step timing to
            ``{step_timing_path}.rank{rank}.jsonl`` when it shuts down
            (``benchmarks/tp_step_timing.py``); None: no timing.

    Attributes:
        num_kv_blocks: the pool size every rank can hold (MIN over ranks).
        worker_pids: pids of this host's workers, by rank.

    Raises:
        ValueError: a worker refused the model or the configuration (its one-line message,
            with its rank).
        RuntimeError: a worker crashed while starting, or the workers did not start in time.
        WorkerDiedError: a worker process died while starting.
    """

    def __init__(
        self,
        config: EngineConfig,
        log_level: int = logging.INFO,
        start_timeout_s: float = 3600.0,
        step_timing_path: str | None = None,
    ) -> None:
        pc = config.parallel
        self.config = config
        self.tp_size = pc.tensor_parallel_size
        self._closed = False
        self._ipc_dir = tempfile.mkdtemp(prefix="surge-tp-") if pc.nnodes == 1 else None
        ep = endpoints(config, self._ipc_dir)
        self._ctx = zmq.Context(io_threads=1)
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._pull = self._ctx.socket(zmq.PULL)
        for sock in (self._pub, self._pull):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
        self._pub.bind(ep.step_bind)
        self._pull.bind(ep.result_bind)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(WorkerOutput)
        self._steps = StepEncoder()
        self._procs: dict[int, multiprocessing.process.BaseProcess] = {}
        atexit.register(self.close)
        try:
            for rank in pc.local_ranks:
                self._procs[rank] = start_worker(
                    config, rank, ep, os.getpid(), log_level=log_level, step_timing_path=step_timing_path
                )
            self.num_kv_blocks, self.worker_pids = self._wait_ready(start_timeout_s)
            logger.info(
                "tensor-parallel ranks ready (pids %s), KV pool %d block%s per rank",
                ", ".join(str(p) for _, p in sorted(self.worker_pids.items())),
                self.num_kv_blocks,
                "" if self.num_kv_blocks == 1 else "s",
            )
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ start-up

    def _wait_ready(self, timeout_s: float) -> tuple[int, dict[int, int]]:
        """Wait for every rank's subscription and :class:`WorkerReady`."""
        deadline = time.monotonic() + timeout_s
        subscribed = 0
        ready: dict[int, WorkerReady] = {}
        poller = zmq.Poller()
        poller.register(self._pub, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        while subscribed < self.tp_size or len(ready) < self.tp_size:
            events = dict(poller.poll(_POLL_MS))
            if self._pub in events:
                frame = self._pub.recv()
                if frame[:1] == b"\x01":
                    subscribed += 1
            if self._pull in events:
                msg = self._decoder.decode(self._pull.recv())
                if isinstance(msg, WorkerStartupError):
                    # a rank's refusal of the model or configuration stays a ValueError (a user
                    # error for the engine process); a rank's crash does not
                    error = ValueError if msg.user_error else RuntimeError
                    raise error(f"tensor-parallel rank {msg.rank}: {msg.message}")
                if isinstance(msg, WorkerReady):
                    self._check_settings(msg)
                    ready[msg.rank] = msg
            if not events:
                try:
                    self._check_alive()
                except WorkerDiedError as e:
                    raise WorkerDiedError(f"{e}{_unguarded_script_hint()}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tensor-parallel workers did not start within {timeout_s:.0f} s")
        return min(r.num_kv_blocks for r in ready.values()), {r.rank: r.pid for r in ready.values()}

    def _check_settings(self, msg: WorkerReady) -> None:
        """Refuse a rank whose shared settings differ from this engine's (a worker host started
        with another model, dtype or ``--hf-overrides``, which would run but compute garbage).

        Raises:
            ValueError: naming the first setting that differs, with both values.
        """
        ours = self.config.shared_settings()
        for name, value in ours.items():
            theirs = msg.settings.get(name)
            if theirs != value:
                raise ValueError(
                    f"tensor-parallel rank {msg.rank} was started with {name} {theirs}, this node with "
                    f"{value}: start every node with the same model and flags"
                )

    def _check_alive(self, besides: int | None = None, grace_s: float = 0.0) -> None:
        """Raise :class:`WorkerDiedError` naming a dead rank other than ``besides``; with
        ``grace_s``, wait up to that long (seconds) for one to show as dead."""
        deadline = time.monotonic() + grace_s
        while True:
            for rank, proc in self._procs.items():
                if rank != besides and not proc.is_alive():
                    raise WorkerDiedError(
                        f"tensor-parallel worker rank {rank} (pid {proc.pid}) died (exit code {proc.exitcode})"
                    )
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def _recv(self, timeout_s: float | None = None) -> Any:
        """The next worker message; raises when a worker died or failed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._pull.poll(_POLL_MS, zmq.POLLIN):
            self._check_alive()
            if deadline is not None and time.monotonic() > deadline:
                raise WorkerDiedError(f"tensor-parallel workers did not answer within {timeout_s:.0f} s")
        msg = self._decoder.decode(self._pull.recv(copy=False).buffer)
        if isinstance(msg, WorkerFatalError):
            # A dead peer is the cause of a failed collective: name it, not the reporting rank
            # (which exits after its report). The peer's sockets close before it can be reaped,
            # so the report may come first: give its death a moment to show.
            self._check_alive(besides=msg.rank, grace_s=_PEER_DEATH_GRACE_S)
            raise WorkerDiedError(f"tensor-parallel worker rank {msg.rank} failed: {msg.message}")
        return msg

    def _publish(self, msg: msgspec.Struct) -> None:
        if self._closed:
            raise WorkerDiedError("the tensor-parallel workers are shut down")
        self._pub.send(self._encoder.encode(msg), copy=False)

    # ------------------------------------------------------------------ runner interface

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one KV block on each rank (its share of the KV heads, all layers), in the KV
        cache dtype (1 byte per value with ``kv_cache_dtype="fp8"``, as the ranks' runners)."""
        mc = self.config.model
        kv_heads = max(1, mc.num_key_value_heads // self.tp_size)
        itemsize = 1 if self.config.cache.kv_cache_dtype == "fp8" else mc.dtype_bytes
        return 2 * mc.num_hidden_layers * self.config.cache.block_size * kv_heads * mc.head_dim * itemsize

    def determine_num_kv_blocks(self) -> int:
        """The KV pool every rank can hold: the MIN over ranks of their own sizing."""
        return self.num_kv_blocks

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocate every rank's KV pool (and capture its CUDA graphs); wait for all."""
        self._publish(InitKVCache(num_blocks))
        done: set[int] = set()
        while len(done) < self.tp_size:
            msg = self._recv()
            if not isinstance(msg, KVCacheReady):
                raise RuntimeError(f"unexpected message from a worker during KV set-up: {msg!r}")
            done.add(msg.rank)

    def execute_async(self, scheduler_output: SchedulerOutput) -> _RemoteStep:
        """Publish the step to every rank; the handle waits for rank 0's sampled ids."""
        msg = self._steps.encode(scheduler_output)
        self._publish(msg)
        ids = [s.request.request_id for s in scheduler_output.scheduled if s.sample]
        # With a prompt_logprobs request alive rank 0 answers every step (see StepMessage).
        return _RemoteStep(self, msg.step, ids, bool(ids) or msg.any_prompt_logprobs)

    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        """Run one step on every rank and return rank 0's sampled ids."""
        return self.execute_async(scheduler_output).result()

    def check_health(self) -> None:
        """Raise :class:`WorkerDiedError` when a worker died or reported a failure."""
        self._check_alive()
        if self._pull.poll(0, zmq.POLLIN):
            msg = self._recv()
            raise RuntimeError(f"unexpected message from a worker while idle: {msg!r}")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop every worker (a shutdown message, then SIGTERM, then SIGKILL). Idempotent."""
        if self._closed:
            return
        with contextlib.suppress(zmq.ZMQError):
            self._pub.send(self._encoder.encode(ShutdownWorkers()), flags=zmq.NOBLOCK)
        self._closed = True
        # With a rank gone the others may be stuck in a collective: do not wait for them.
        if all(p.is_alive() for p in self._procs.values()):
            deadline = time.monotonic() + timeout_s
            for proc in self._procs.values():
                proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs.values():
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs.values():
            proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        self._pub.close(linger=0)
        self._pull.close(linger=0)
        self._ctx.term()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


def _unguarded_script_hint() -> str:
    """What to add to "a rank died" during start-up when the program is a user's script: a worker
    is a ``spawn`` child, which imports that script first (as ``__mp_main__``), so a script that
    creates ``LLM(tensor_parallel_size=N)`` outside ``if __name__ == "__main__":`` makes every
    worker try to start workers of its own, and multiprocessing ends it (its long traceback is
    printed above). "" where no user's script is imported: a process that is itself a child (the
    engine process of ``surge serve``), Surge's own entry points (``python -m surge``, the
    ``surge`` command, which guard theirs), and a program without a file (an interactive
    session, a notebook)."""
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if (
        not main_file
        or multiprocessing.parent_process() is not None
        or (spec is not None and spec.name.partition(".")[0] == "surge")
        or os.path.basename(main_file) == "surge"
    ):
        return ""
    return (
        f" during start-up (its error is above). Each worker imports {main_file} first: if it creates"
        ' LLM(tensor_parallel_size > 1) outside `if __name__ == "__main__":`, put that code under it'
        " (docs/parallel.md)"
    )
