"""A tensor-parallel worker process: one rank's model shard behind the step broadcast.

Life of a worker (spawned by :class:`surge.parallel.executor.TPExecutor`):

1. Connect a SUB socket to the engine's step broadcast and a PUSH socket to its results.
2. ``torch.distributed.init_process_group`` (NCCL on CUDA, gloo on CPU) over the TCP store.
3. Build a :class:`~surge.worker.model_runner.ModelRunner` for its rank (it loads only its
   shard), size the KV pool and all-reduce the MIN block count over ranks, send
   :class:`WorkerReady`.
4. Loop: a :class:`StepMessage` is mirrored into a ``SchedulerOutput`` (:class:`StepDecoder`)
   and launched with ``execute_async``; every rank samples the same ids (same logits after
   the all-gather, same seeds), rank 0 sends them back as a :class:`StepResult`. A step is
   resolved when the next message arrives (the GPU then runs both back to back) or when
   its ids are on the host, whichever comes first.

The worker dies with the engine process (parent-death signal, and a check of its parent
while idle) and reports a failing loop with :class:`WorkerFatalError` before it exits.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from surge.config import EngineConfig
from surge.parallel.launch import Endpoints, rank_device
from surge.parallel.messages import (
    InitKVCache,
    KVCacheReady,
    ShutdownWorkers,
    StepMessage,
    StepResult,
    WorkerFatalError,
    WorkerInput,
    WorkerReady,
    WorkerStartupError,
)
from surge.parallel.step_clock import StepClock
from surge.parallel.step_codec import StepDecoder
from surge.parent_death import set_parent_death_signal

logger = logging.getLogger("surge.parallel.worker")

_IDLE_POLL_MS = 500
"""While idle, wake up this often (milliseconds) to check that the engine process lives."""


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Where one worker rank runs and how it reaches the others.

    Attributes:
        rank: global tensor-parallel rank in ``[0, world_size)``.
        world_size: ``tensor_parallel_size``.
        local_device: the device this rank uses ("cpu" or "cuda:N").
        dist_init_method: ``tcp://host:port`` of the ``torch.distributed`` TCP store.
        step_address: ZMQ address of the engine's step broadcast (XPUB).
        result_address: ZMQ address of the engine's result socket (PULL).
        parent_pid: the process whose death ends this worker (None: do not check).
        log_level: ``logging`` level of this process.
        step_timing_path: where to write this rank's per-step timing
            (:class:`~surge.parallel.step_clock.StepClock`, ``{path}.rank{rank}.jsonl``) when
            it shuts down; None (the default): no timing.
    """

    rank: int
    world_size: int
    local_device: str
    dist_init_method: str
    step_address: str
    result_address: str
    parent_pid: int | None
    log_level: int = logging.INFO
    step_timing_path: str | None = None


def start_worker(
    config: EngineConfig,
    rank: int,
    ep: Endpoints,
    parent_pid: int | None,
    log_level: int = logging.INFO,
    step_timing_path: str | None = None,
) -> multiprocessing.process.BaseProcess:
    """Spawn global tensor-parallel ``rank``'s worker on this host (a daemon process named
    ``surge-tp{rank}`` running :func:`run_worker`, on :func:`~surge.parallel.launch.rank_device`),
    connected to the group's addresses ``ep``; the other arguments are :class:`WorkerSpec`'s.
    Returns the started process."""
    spec = WorkerSpec(
        rank=rank,
        world_size=config.parallel.tensor_parallel_size,
        local_device=rank_device(config, rank),
        dist_init_method=ep.dist_init_method,
        step_address=ep.step_connect,
        result_address=ep.result_connect,
        parent_pid=parent_pid,
        log_level=log_level,
        step_timing_path=step_timing_path,
    )
    proc = multiprocessing.get_context("spawn").Process(
        target=run_worker, args=(config, spec), name=f"surge-tp{rank}", daemon=True
    )
    proc.start()
    return proc


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def init_distributed(spec: WorkerSpec, timeout_s: float = 600.0) -> None:
    """Join the tensor-parallel process group of ``spec`` (NCCL on CUDA, gloo on CPU), waiting up
    to ``timeout_s`` seconds for the other ranks (also each collective's timeout:
    :attr:`surge.config.ParallelConfig.distributed_timeout_s`).

    Raises:
        RuntimeError / ValueError: from ``torch.distributed`` (a store that cannot be reached).
    """
    import datetime

    import torch
    import torch.distributed as dist

    cuda = spec.local_device.startswith("cuda")
    kwargs: dict[str, Any] = {}
    if cuda:
        device = torch.device(spec.local_device)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(
        backend="nccl" if cuda else "gloo",
        init_method=spec.dist_init_method,
        world_size=spec.world_size,
        rank=spec.rank,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )


def all_reduce_min(value: int, device: str) -> int:
    """The minimum of ``value`` over the ranks of the default process group."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def _sigterm_unless_orphaned(parent_pid: int) -> Callable[[int, Any], None]:
    """SIGTERM handler of a local worker: ignored while ``parent_pid`` (the engine process) is
    its parent, which drains and then stops the workers with a message; otherwise the default
    action (exit)."""

    def on_sigterm(signum: int, frame: Any) -> None:
        if os.getppid() != parent_pid:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    return on_sigterm


def run_worker(config: EngineConfig, spec: WorkerSpec) -> None:
    """Entry point of a worker process (a ``multiprocessing`` spawn target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.parent_pid is not None:  # a SIGTERM to the process group: the engine stops us (a message)
        signal.signal(signal.SIGTERM, _sigterm_unless_orphaned(spec.parent_pid))
    set_parent_death_signal(signal.SIGKILL)
    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s %(levelname)s [tp{spec.rank}] %(message)s")
    ctx = zmq.Context(io_threads=1)
    sub = ctx.socket(zmq.SUB)
    push = ctx.socket(zmq.PUSH)
    for sock in (sub, push):
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    # A worker on another host has no engine parent to watch: it leaves when the connection
    # to the engine's broadcast drops after having been up.
    monitor = (
        sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        if spec.parent_pid is None
        else None
    )
    sub.connect(spec.step_address)
    push.connect(spec.result_address)
    encoder = msgspec.msgpack.Encoder()
    exit_code = 0
    try:
        try:
            runner, num_blocks = _start(config, spec)
        except Exception as e:
            user_error = type(e) is ValueError  # a bad model folder or setting: one line, as in one process
            if user_error:
                logger.error("worker start-up failed: %s", _one_line(e))
                logger.debug("worker start-up failed:\n%s", traceback.format_exc())
            else:
                logger.error("worker start-up failed:\n%s", traceback.format_exc())
            message = (str(e).strip().splitlines() or [""])[0] if user_error else _one_line(e)
            push.send(encoder.encode(WorkerStartupError(spec.rank, message or _one_line(e), user_error)))
            exit_code = 1
            return
        push.send(encoder.encode(WorkerReady(spec.rank, os.getpid(), num_blocks, config.shared_settings())))
        try:
            _loop(runner, config, spec, sub, push, encoder, monitor)
        except _EngineGone:
            logger.info("worker exiting: the engine process is gone")
        except Exception as e:
            logger.error("worker loop failed:\n%s", traceback.format_exc())
            push.send(encoder.encode(WorkerFatalError(spec.rank, _one_line(e))), flags=zmq.NOBLOCK)
            exit_code = 1
    finally:
        if monitor is not None:
            sub.disable_monitor()
            monitor.close(linger=0)
        sub.close(linger=0)
        push.close(linger=500)
        ctx.term()
        _destroy_process_group()
    if exit_code:
        sys.exit(exit_code)


def _destroy_process_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def _start(config: EngineConfig, spec: WorkerSpec) -> tuple[Any, int]:
    """Join the group, load this rank's shard and agree on the KV pool size."""
    init_distributed(spec, config.parallel.distributed_timeout_s)
    from surge.worker.model_runner import ModelRunner

    local = dataclasses.replace(config, device=spec.local_device)
    runner = ModelRunner(local, tp_rank=spec.rank)
    num_blocks = runner.determine_num_kv_blocks()
    return runner, all_reduce_min(num_blocks, spec.local_device)


def _disconnected(monitor: zmq.Socket) -> bool:
    """Whether the monitor of the step socket saw it disconnect."""
    from zmq.utils.monitor import recv_monitor_message

    while monitor.poll(0, zmq.POLLIN):
        if recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED:
            return True
    return False


class _EngineGone(Exception):
    """The engine process died."""


def _loop(
    runner: Any,
    config: EngineConfig,
    spec: WorkerSpec,
    sub: zmq.Socket,
    push: zmq.Socket,
    encoder: msgspec.msgpack.Encoder,
    monitor: zmq.Socket | None = None,
) -> None:
    """Receive messages until :class:`ShutdownWorkers`; see the module docstring."""
    decoder = msgspec.msgpack.Decoder(WorkerInput)
    steps = StepDecoder(frozenset(config.model.eos_token_ids))
    send_results = spec.rank == 0
    pending: tuple[int, Any, bool] | None = None  # (step, handle, always answer) launched, not resolved
    clock = None
    if spec.step_timing_path is not None:
        clock = StepClock(spec.rank, spec.local_device.startswith("cuda"))

    def resolve() -> None:
        nonlocal pending
        assert pending is not None
        step, handle, always = pending
        pending = None
        if clock is not None:
            clock.resolving(step)
        out = handle.result()
        if clock is not None:
            clock.resolved(step)
        ids = list(out.sampled_token_ids.values())
        if send_results and (ids or always):
            result = StepResult(step, ids, out.logprobs, out.prompt_logprobs)
            push.send(encoder.encode(result), copy=False)
            if clock is not None:
                clock.sent(step)

    while True:
        if pending is not None:
            # Resolve the launched step as soon as its ids are on the host, unless the next
            # message comes first (then launch it before waiting, so the device stays busy).
            while not sub.poll(0, zmq.POLLIN):
                if pending[1].done():
                    resolve()
                    break
                time.sleep(0)
            if pending is None:
                continue
        else:
            while not sub.poll(_IDLE_POLL_MS, zmq.POLLIN):
                if spec.parent_pid is not None and os.getppid() != spec.parent_pid:
                    raise _EngineGone
                if monitor is not None and _disconnected(monitor):
                    raise _EngineGone
        msg = decoder.decode(sub.recv(copy=False).buffer)
        if isinstance(msg, StepMessage):
            if clock is not None:
                clock.received(msg.step)
            so = steps.decode(msg)
            if clock is not None:
                clock.launching()
            handle = runner.execute_async(so)
            if clock is not None:
                clock.launched(handle)
            if pending is not None:
                resolve()
            if msg.any_prompt_logprobs or any(s.sample for s in msg.scheduled):
                pending = (msg.step, handle, msg.any_prompt_logprobs)
            else:
                handle.result()
            continue
        if pending is not None:
            resolve()
        if isinstance(msg, InitKVCache):
            runner.init_kv_cache(msg.num_blocks)
            push.send(encoder.encode(KVCacheReady(spec.rank)))
        elif isinstance(msg, ShutdownWorkers):
            if clock is not None and spec.step_timing_path is not None:
                clock.write(f"{spec.step_timing_path}.rank{spec.rank}.jsonl")
            return
