"""The engine core process: an LLMEngine in a busy loop behind two ZMQ sockets.

Protocol (all messages msgpack-encoded msgspec structs):

- API -> engine (PUSH -> PULL, ``input_address``): :class:`AddRequest`, :class:`AbortRequest` or
  :class:`ResetPrefixCache`.
- engine -> API (PUSH -> PULL, ``output_address``): first one :class:`EngineReady` or
  :class:`EngineStartupError`, then :class:`EngineOutputs` batches (new tokens of each request
  after a step, requests the engine rejected, and a :class:`SchedulerStats` snapshot).

The API process binds both sockets before it starts this process, which connects.
The loop blocks on the input socket while there is no work, so an idle engine uses no CPU.
It exits on SIGTERM, when its parent process dies, or when the engine raises (after telling the
API process with :class:`EngineFatalError`). SIGINT is ignored: the API process, which gets the
terminal's Ctrl-C too, shuts the engine down itself.
"""

from __future__ import annotations

import contextlib
import gc
import logging
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
from surge.core.outputs import EngineOutput, SchedulerStats
from surge.sampling_params import SamplingParams

logger = logging.getLogger("surge.engine")

_IDLE_POLL_MS = 500
"""While idle, wake up this often (milliseconds) to check that the parent process lives."""
_PARENT_CHECK_S = 1.0
"""While busy, check that the parent process lives at most this often (seconds)."""
_HEARTBEAT_S = 1.0
"""While busy, send an (empty) EngineOutputs at least this often, so the API process can tell a
working engine from a wedged one (seconds)."""


class AddRequest(msgspec.Struct, tag=True, array_like=True):
    """Queue one single-sequence request (``sampling_params.n == 1``).

    Attributes:
        request_id: unique id.
        prompt_token_ids: the prompt, in tokens.
        sampling_params: how to sample.
        arrival_time: ``time.monotonic()`` seconds when the API received the request.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float | None = None


class AbortRequest(msgspec.Struct, tag=True, array_like=True):
    """Abort requests (unknown or finished ids are ignored). Attributes: request_ids."""

    request_ids: list[str]


class ResetPrefixCache(msgspec.Struct, tag=True, array_like=True):
    """Evict the cached KV blocks no request holds (``engine.reset_prefix_cache()``). Requests
    sent after this message are scheduled after the reset (the input socket keeps order)."""


EngineInput = AddRequest | AbortRequest | ResetPrefixCache


class RequestError(msgspec.Struct, array_like=True):
    """The engine rejected a request (``LLMEngine.add_request`` raised ValueError).

    Attributes: request_id; message (suitable for an HTTP 400 body).
    """

    request_id: str
    message: str


class EngineReady(msgspec.Struct, tag=True, array_like=True):
    """Sent once the engine is built.

    Attributes:
        pid: the engine process id.
        model: the model folder.
        max_model_len: longest prompt + output, in tokens.
        num_kv_blocks, block_size: the KV pool (``num_kv_blocks * block_size`` tokens).
        vocab_size: the model's vocabulary size.
        device: the device the engine runs on.
    """

    pid: int
    model: str
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    vocab_size: int
    device: str


class EngineStartupError(msgspec.Struct, tag=True, array_like=True):
    """The engine could not be built. Attributes: message (one line)."""

    message: str


class EngineFatalError(msgspec.Struct, tag=True, array_like=True):
    """The engine loop raised; the process exits right after this. Attributes: message."""

    message: str


class EngineOutputs(msgspec.Struct, tag=True, array_like=True):
    """One batch sent after a loop iteration.

    Attributes:
        outputs: new tokens of each request that got one this step.
        errors: requests rejected since the previous batch.
        stats: the scheduler after the step.
        grammar_compile_times: seconds of each grammar compilation finished since the
            previous batch.
    """

    outputs: list[EngineOutput]
    errors: list[RequestError]
    stats: SchedulerStats
    grammar_compile_times: list[float] = msgspec.field(default_factory=list)


EngineMessage = EngineReady | EngineStartupError | EngineFatalError | EngineOutputs

EngineFactory = Callable[[EngineConfig], Any]
"""Builds the engine from its config (``LLMEngine`` by default; tests may pass a fake)."""


class _Shutdown(Exception):
    """Raised by the SIGTERM handler to leave the loop."""


def _raise_shutdown(signum: int, frame: Any) -> None:
    raise _Shutdown


def _set_parent_death_signal() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        pass


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def run_engine_core(
    config: EngineConfig,
    input_address: str,
    output_address: str,
    parent_pid: int,
    engine_factory: EngineFactory | None = None,
    log_level: int = logging.INFO,
) -> None:
    """Entry point of the engine process (a ``multiprocessing`` spawn target).

    Args:
        config: the engine configuration.
        input_address, output_address: ZMQ addresses bound by the API process.
        parent_pid: the API process; the loop exits when it is gone.
        engine_factory: builds the engine (default ``LLMEngine``).
        log_level: ``logging`` level of this process.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_shutdown)
    _set_parent_death_signal()
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s [engine] %(message)s")
    ctx = zmq.Context(io_threads=1)
    in_sock = ctx.socket(zmq.PULL)
    out_sock = ctx.socket(zmq.PUSH)
    for sock in (in_sock, out_sock):
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
    in_sock.connect(input_address)
    out_sock.connect(output_address)
    encoder = msgspec.msgpack.Encoder()
    exit_code = 0
    engine: Any = None
    try:
        try:
            if engine_factory is None:
                from surge.engine.llm_engine import LLMEngine

                engine_factory = LLMEngine
            engine = engine_factory(config)
        except _Shutdown:
            raise
        except Exception as e:
            logger.error("engine start-up failed:\n%s", traceback.format_exc())
            out_sock.send(encoder.encode(EngineStartupError(_one_line(e))))
            exit_code = 1
            return
        out_sock.send(
            encoder.encode(
                EngineReady(
                    pid=os.getpid(),
                    model=config.model.model,
                    max_model_len=engine.max_model_len,
                    num_kv_blocks=engine.num_kv_blocks,
                    block_size=engine.block_size,
                    vocab_size=config.model.vocab_size,
                    device=config.device,
                )
            )
        )
        # The model, tokenizer-free engine state and CUDA graphs live until exit: move them out
        # of the garbage collector's generations so its collections scan only per-step garbage.
        gc.collect()
        gc.freeze()
        _busy_loop(engine, in_sock, out_sock, encoder, parent_pid)
    except _Shutdown:
        logger.info("engine process shutting down (SIGTERM)")
    except _ParentGone:
        logger.info("engine process exiting: the API process is gone")
    except Exception as e:
        logger.error("engine loop failed:\n%s", traceback.format_exc())
        with contextlib.suppress(zmq.ZMQError):
            out_sock.send(encoder.encode(EngineFatalError(_one_line(e))), flags=zmq.NOBLOCK)
        exit_code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        close = getattr(engine, "close", None)
        if close is not None:  # tensor-parallel workers stop with the engine
            with contextlib.suppress(Exception):
                close()
        in_sock.close(linger=0)
        out_sock.close(linger=500)
        ctx.term()
    if exit_code:
        sys.exit(exit_code)


class _ParentGone(Exception):
    """The API process died."""


def _busy_loop(
    engine: Any,
    in_sock: zmq.Socket,
    out_sock: zmq.Socket,
    encoder: msgspec.msgpack.Encoder,
    parent_pid: int,
) -> None:
    """Drain inputs, step, send outputs; block on the input socket while idle."""
    decoder = msgspec.msgpack.Decoder(EngineInput)
    check_health = getattr(engine, "check_health", None)
    poller = zmq.Poller()
    poller.register(in_sock, zmq.POLLIN)
    last_parent_check = last_sent = time.monotonic()
    late_errors = getattr(engine, "take_request_errors", None)  # test engines may lack it
    while True:
        if not engine.has_unfinished_requests():
            while not poller.poll(_IDLE_POLL_MS):
                if os.getppid() != parent_pid:
                    raise _ParentGone
                if check_health is not None:  # a dead tensor-parallel worker ends the engine
                    check_health()
        now = time.monotonic()
        if now - last_parent_check > _PARENT_CHECK_S:
            last_parent_check = now
            if os.getppid() != parent_pid:
                raise _ParentGone
        errors: list[RequestError] = []
        got_input = False
        while True:
            try:
                buf = in_sock.recv(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            got_input = True
            msg = decoder.decode(buf.buffer)
            if isinstance(msg, AddRequest):
                try:
                    engine.add_request(
                        msg.request_id, msg.prompt_token_ids, msg.sampling_params, msg.arrival_time
                    )
                except ValueError as e:
                    errors.append(RequestError(msg.request_id, str(e)))
            elif isinstance(msg, ResetPrefixCache):
                n = engine.reset_prefix_cache()
                logger.info("prefix cache reset: %d cached blocks evicted", n)
            else:
                engine.abort_requests(msg.request_ids)
        stepped = engine.has_unfinished_requests()
        outputs = engine.step() if stepped else []
        compile_times: list[float] = []
        if late_errors is not None:  # grammars that failed to compile
            errors += [RequestError(rid, message) for rid, message in late_errors()]
            compile_times = engine.take_grammar_compile_times()
        heartbeat = stepped and time.monotonic() - last_sent > _HEARTBEAT_S
        if outputs or errors or got_input or compile_times or heartbeat:
            batch = EngineOutputs(outputs, errors, engine.get_stats(), compile_times)
            out_sock.send(encoder.encode(batch), copy=False)
            last_sent = time.monotonic()
