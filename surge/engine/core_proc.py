"""The engine core process: an LLMEngine in a busy loop behind two ZMQ sockets.

Protocol (all messages msgpack-encoded msgspec structs):

- API -> engine (PUSH -> PULL, ``input_address``): :class:`AddRequest`, :class:`AbortRequest` or
  :class:`ResetPrefixCache`.
- engine -> API (PUSH -> PULL, ``output_address``): first one :class:`EngineReady` (with the
  start-up :class:`SchedulerStats`) or :class:`EngineStartupError`, then :class:`EngineOutputs` batches (new tokens of each request
  after a step, requests the engine rejected, and a :class:`SchedulerStats` snapshot).

The API process binds both sockets before it starts this process, which connects. With several
API processes (``surge serve --api-server-count N``) the engine connects its input socket to each
one's input address (ZMQ fair-queues them) and has one output socket per API process: a
request's outputs go to the API process named by its ``AddRequest.client_index``, and every
batch goes to every API process (with only its own outputs), so each one sees every step's
stats (the replica's load, for data-parallel routing) and the heartbeat.
The loop blocks on the input socket while there is no work, so an idle engine uses no CPU.
It exits on :data:`STOP_SIGNAL` (SIGUSR1, what the API process sends once it has drained), on
SIGTERM once its parent process is gone (Linux sends it when the parent dies), or when the engine
raises (after telling the API process with :class:`EngineFatalError`). SIGINT, and SIGTERM while
the parent lives, are ignored: a Ctrl-C or a SIGTERM to the whole process group (``kill -TERM
-PGID``, systemd's default stop) reaches the API process too, which drains the requests in flight
and then stops the engine itself.
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
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import msgspec
import zmq

from surge.config import EngineConfig
from surge.core.outputs import EngineOutput, SchedulerStats
from surge.parent_death import set_parent_death_signal
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
    """Queue a request: one sequence, or with ``sampling_params.n > 1`` its ``n`` choices.

    The engine fans ``n`` choices out itself (``LLMEngine.add_choices``), so the parameters
    cross the socket, are decoded and are checked once: ``n: 128`` with 256 long
    ``bad_words`` sent 183 MB of token lists as one message per choice and stopped every stream
    for 7.5 s.

    Attributes:
        request_id: unique id (with ``n > 1``, the parent's: only for logs).
        prompt_token_ids: the prompt, in tokens.
        sampling_params: how to sample.
        arrival_time: ``time.monotonic()`` seconds when the API received the request.
        client_index: the API process that sent it (its outputs go back there); 0 with one.
        choice_ids: with ``n > 1``, the ``n`` choices' unique ids, in choice order (their
            outputs and errors carry them); empty for one sequence.
        prompt_logprobs_once: with ``choice_ids`` and ``prompt_logprobs``, only the first
            choice computes the prompt's logprobs (the same for every choice; the others can
            then reuse cached prompt blocks): the API process gives them to the other choices
            (a non-streamed answer, built once all choices are done).
        cache_salt: vLLM's ``cache_salt`` (a non-empty string, or None): only requests with the
            same salt share prefix-cache blocks.
        priority: the scheduling priority (lower first) under the ``priority`` policy; must be
            0 under ``fcfs`` (the engine refuses another value).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float | None = None
    client_index: int = 0
    choice_ids: list[str] = []
    prompt_logprobs_once: bool = False
    cache_salt: str | None = None
    priority: int = 0


class AbortRequest(msgspec.Struct, tag=True, array_like=True):
    """Abort requests (unknown or finished ids are ignored). Attributes: request_ids."""

    request_ids: list[str]


class ResetPrefixCache(msgspec.Struct, tag=True, array_like=True):
    """Evict the cached KV blocks no request holds (``engine.reset_prefix_cache()``). Requests
    sent after this message are scheduled after the reset (the input socket keeps order)."""


EngineInput = AddRequest | AbortRequest | ResetPrefixCache


class RequestError(msgspec.Struct, array_like=True):
    """The engine rejected a request (``LLMEngine.add_request`` raised ValueError), or ended
    it with an error later (:class:`~surge.core.outputs.RequestFailure`).

    Attributes: request_id; message (suitable for an HTTP error body); status (the HTTP status:
    400 for the request's fault, 500 for the server's); grammar (the request's grammar is at
    fault: the API names the field that carried it).
    """

    request_id: str
    message: str
    status: int = 400
    grammar: bool = False


class EngineReady(msgspec.Struct, tag=True, array_like=True):
    """Sent once the engine is built.

    Attributes:
        pid: the engine process id.
        model: the model folder.
        max_model_len: longest prompt + output, in tokens.
        num_kv_blocks, block_size: the KV pool (``num_kv_blocks * block_size`` tokens).
        vocab_size: the model's vocabulary size.
        device: the device the engine runs on.
        stats: the scheduler's snapshot at start-up (the whole KV pool free), so the engine
            gauges show the pool before the first :class:`EngineOutputs`; None from an engine
            without ``get_stats``.
    """

    pid: int
    model: str
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    vocab_size: int
    device: str
    stats: SchedulerStats | None = None


class EngineStartupError(msgspec.Struct, tag=True, array_like=True):
    """The engine could not be built. Attributes: message (one line); user_error: the cause
    is the user's configuration or model folder (a ``ValueError`` from the engine's build,
    e.g. a missing tensor or a KV pool that cannot hold one request), not a crash."""

    message: str
    user_error: bool = False


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
            previous batch (sent to API process 0 only, so each is counted once).
        num_added: requests (choices of an ``AddRequest`` with ``choice_ids``, else one) the
            engine has received from this batch's API process so far: the API process's requests sent and not yet counted in ``stats``
            are its sent ones minus this.
    """

    outputs: list[EngineOutput]
    errors: list[RequestError]
    stats: SchedulerStats
    grammar_compile_times: list[float] = msgspec.field(default_factory=list)
    num_added: int = 0


EngineMessage = EngineReady | EngineStartupError | EngineFatalError | EngineOutputs

EngineFactory = Callable[[EngineConfig], Any]
"""Builds the engine from its config (``LLMEngine`` by default; tests may pass a fake)."""


STOP_SIGNAL = signal.SIGUSR1
"""The signal with which the API process stops its engine process (after draining)."""


class _Shutdown(Exception):
    """Raised by the stop-signal handler to leave the loop."""


class _StopSignals:
    """The engine process's stop signals: :data:`STOP_SIGNAL`, and SIGTERM once ``parent_pid``
    is no longer this process's parent (while it is, the API process drains and then sends
    :data:`STOP_SIGNAL`; SIGTERM is ignored).

    The first stop raises :class:`_Shutdown` to leave the loop. Once :attr:`stopping` is set
    (by that first stop, or by the process before it tells the API process it is ending, which
    answers with :data:`STOP_SIGNAL`), a stop does nothing: a handler that raised inside the
    clean-up would skip it and print a traceback.
    """

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid
        self.stopping = False

    def on_stop(self, signum: int, frame: Any) -> None:
        if not self.stopping:
            self.stopping = True
            raise _Shutdown

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if os.getppid() != self.parent_pid:
            self.on_stop(signum, frame)


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed: ``MemoryError`` (numpy's too), torch's
    ``OutOfMemoryError``, or a CPU allocator's ``RuntimeError`` ("can't allocate memory")."""
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    return isinstance(e, RuntimeError) and "can't allocate memory" in str(e)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _user_line(e: ValueError) -> str:
    """A refused model folder or setting's message as the user reads it: its first line, without
    the type's name (as a tensor-parallel rank sends it, :mod:`surge.parallel.worker`)."""
    return (str(e).strip().splitlines() or [""])[0] or _one_line(e)


def _report_start_error(conn: Connection | None, message: str) -> None:
    """Send a start-up failure's one line to the supervisor, if there is one and it still listens."""
    if conn is not None:
        with contextlib.suppress(OSError):
            conn.send(message)


def run_engine_core(
    config: EngineConfig,
    input_address: str | Sequence[str],
    output_address: str | Sequence[str],
    parent_pid: int,
    engine_factory: EngineFactory | None = None,
    log_level: int = logging.INFO,
    log_user_start_error: bool = True,
    start_error_conn: Connection | None = None,
) -> None:
    """Entry point of the engine process (a ``multiprocessing`` spawn target).

    Args:
        config: the engine configuration.
        input_address, output_address: ZMQ addresses bound by the API process, or one of each
            per API process (the same number; outputs go to ``output_address[client_index]``).
        parent_pid: the API process; the loop exits when it is gone.
        engine_factory: builds the engine (default ``LLMEngine``).
        log_level: ``logging`` level of this process.
        log_user_start_error: log a start-up failure that is the user's to fix (a model folder
            or configuration the engine refuses, a size that does not fit in memory) at ERROR.
            False where the one client that spawned this process shows it to the user (it gets
            the message in :class:`EngineStartupError`), so that it is read once: it is logged
            at DEBUG then. A crash's traceback is logged at ERROR either way.
        start_error_conn: the sending end of a pipe to the ``surge serve`` supervisor of several
            API processes (:mod:`surge.server.api_workers`), which shows the user such a failure's
            one line: the API processes may bind their addresses after this process has exited,
            and its :class:`EngineStartupError` is then lost.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stops = _StopSignals(parent_pid)
    signal.signal(signal.SIGTERM, stops.on_sigterm)
    signal.signal(STOP_SIGNAL, stops.on_stop)
    # a supervisor of several API processes starts this one with SIGINT and SIGTERM blocked
    # (surge.server.api_workers.start_with_stops_blocked): one that came while it imported goes
    # to the handlers above (SIGINT ignored, SIGTERM as any)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    except _Shutdown:  # a SIGTERM while it imported, its parent gone since: nothing to serve
        return
    set_parent_death_signal()
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s [engine] %(message)s")
    in_addrs = [input_address] if isinstance(input_address, str) else list(input_address)
    out_addrs = [output_address] if isinstance(output_address, str) else list(output_address)
    ctx = zmq.Context(io_threads=1)
    in_sock = ctx.socket(zmq.PULL)
    out_socks = [ctx.socket(zmq.PUSH) for _ in out_addrs]
    for sock in (in_sock, *out_socks):
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
    for addr in in_addrs:
        in_sock.connect(addr)
    for sock, addr in zip(out_socks, out_addrs, strict=True):
        sock.connect(addr)
    out_sock = _Broadcast(out_socks)
    encoder = msgspec.msgpack.Encoder()
    exit_code = 0
    engine: Any = None
    user_error_level = logging.ERROR if log_user_start_error else logging.DEBUG
    try:
        try:
            if engine_factory is None:
                from surge.engine.llm_engine import LLMEngine

                engine_factory = LLMEngine
            engine = engine_factory(config)
        except _Shutdown:
            raise
        except ValueError as e:  # the configuration or the model folder: one line, no traceback
            # (the engine's build raises ValueError for those only; a crash is another type, and a
            # tensor-parallel rank's crash a RuntimeError)
            logger.log(user_error_level, "engine start-up failed: %s", _user_line(e))
            logger.debug("engine start-up failed:\n%s", traceback.format_exc())
            stops.stopping = True  # before the API process hears of it and stops this process
            _report_start_error(start_error_conn, _user_line(e))
            out_sock.send(encoder.encode(EngineStartupError(_user_line(e), user_error=True)))
            exit_code = 2
            return
        except Exception as e:
            if _out_of_memory(e):  # sizes asked for (KV blocks, sequences): one line, no traceback
                message = (
                    f"out of memory at start-up ({_one_line(e)}): lower --num-kv-blocks, --max-num-seqs, "
                    "--max-num-batched-tokens or --max-model-len (or --gpu-memory-utilization)"
                )
                logger.log(user_error_level, "engine start-up failed: %s", message)
                logger.debug("engine start-up failed:\n%s", traceback.format_exc())
                stops.stopping = True
                _report_start_error(start_error_conn, message)
                out_sock.send(encoder.encode(EngineStartupError(message, user_error=True)))
                exit_code = 2
                return
            logger.error("engine start-up failed:\n%s", traceback.format_exc())
            stops.stopping = True
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
                    stats=engine.get_stats() if hasattr(engine, "get_stats") else None,
                )
            )
        )
        # The model, tokenizer-free engine state and CUDA graphs live until exit: move them out
        # of the garbage collector's generations so its collections scan only per-step garbage.
        gc.collect()
        gc.freeze()
        _busy_loop(engine, in_sock, out_socks, encoder, parent_pid)
    except _Shutdown:
        logger.info("engine process shutting down")
    except _ParentGone:
        logger.info("engine process exiting: the API process is gone")
    except Exception as e:
        logger.error("engine loop failed:\n%s", traceback.format_exc())
        stops.stopping = True
        with contextlib.suppress(zmq.ZMQError):
            out_sock.send(encoder.encode(EngineFatalError(_one_line(e))), flags=zmq.NOBLOCK)
        exit_code = 1
    finally:
        stops.stopping = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(STOP_SIGNAL, signal.SIG_IGN)
        close = getattr(engine, "close", None)
        if close is not None:  # tensor-parallel workers stop with the engine
            with contextlib.suppress(Exception):
                close()
        in_sock.close(linger=0)
        for sock in out_socks:
            sock.close(linger=500)
        ctx.term()
        if exit_code:  # here, not after the block: a failed start-up returns from inside it
            sys.exit(exit_code)


class _Broadcast:
    """The engine's output sockets as one for the messages every API process gets (ready,
    start-up error, fatal error)."""

    def __init__(self, socks: list[zmq.Socket]) -> None:
        self._socks = socks

    def send(self, buf: bytes, flags: int = 0) -> None:
        for sock in self._socks:
            sock.send(buf, flags=flags)


class _ParentGone(Exception):
    """The API process died."""


def _busy_loop(
    engine: Any,
    in_sock: zmq.Socket,
    out_socks: zmq.Socket | list[zmq.Socket],
    encoder: msgspec.msgpack.Encoder,
    parent_pid: int,
) -> None:
    """Drain inputs, step, send outputs; block on the input socket while idle.

    With several API processes (``len(out_socks) > 1``) each batch is split by the
    ``client_index`` of each request (kept from its ``AddRequest`` until it finishes or is
    aborted) and sent to every API process.
    """
    if isinstance(out_socks, zmq.Socket):  # one API process
        out_socks = [out_socks]
    num_clients = len(out_socks)
    num_added = [0] * num_clients
    client_of: dict[str, int] = {}  # request id -> API process (several API processes only)
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
                _add_request(engine, msg, errors, client_of if num_clients > 1 else None)
                num_added[msg.client_index] += max(1, len(msg.choice_ids))
            elif isinstance(msg, ResetPrefixCache):
                n = engine.reset_prefix_cache()
                logger.info("prefix cache reset: %d cached block%s evicted", n, "" if n == 1 else "s")
            else:
                engine.abort_requests(msg.request_ids)
                if num_clients > 1:
                    for rid in msg.request_ids:
                        client_of.pop(rid, None)
        stepped = engine.has_unfinished_requests()
        outputs = engine.step() if stepped else []
        compile_times: list[float] = []
        if late_errors is not None:  # grammars that failed to compile
            errors += [RequestError(f.request_id, f.message, f.status, f.grammar) for f in late_errors()]
            compile_times = engine.take_grammar_compile_times()
        heartbeat = stepped and time.monotonic() - last_sent > _HEARTBEAT_S
        if outputs or errors or got_input or compile_times or heartbeat:
            stats = engine.get_stats()
            if num_clients == 1:
                batch = EngineOutputs(outputs, errors, stats, compile_times, num_added[0])
                out_socks[0].send(encoder.encode(batch), copy=False)
            else:
                _send_split(out_socks, encoder, client_of, outputs, errors, stats, compile_times, num_added)
            last_sent = time.monotonic()


def _add_request(
    engine: Any, msg: AddRequest, errors: list[RequestError], client_of: dict[str, int] | None
) -> None:
    """Queue ``msg``'s request, or its choices (``choice_ids``, through ``engine.add_choices``,
    which checks the request once); a request or choice the engine rejects gets a
    :class:`RequestError` in ``errors``. ``client_of`` (several API processes) learns which
    process each id came from."""
    ids = msg.choice_ids or [msg.request_id]
    if client_of is not None:
        client_of.update(dict.fromkeys(ids, msg.client_index))
    try:
        if msg.choice_ids:
            refused = engine.add_choices(
                ids,
                msg.prompt_token_ids,
                msg.sampling_params,
                msg.arrival_time,
                msg.prompt_logprobs_once,
                msg.cache_salt,
                msg.priority,
            )
            errors.extend(RequestError(rid, message) for rid, message in refused)
        else:
            engine.add_request(
                msg.request_id,
                msg.prompt_token_ids,
                msg.sampling_params,
                msg.arrival_time,
                msg.cache_salt,
                msg.priority,
            )
    except ValueError as e:  # the request (every choice of it) is refused
        errors.extend(RequestError(rid, str(e)) for rid in ids)


def _send_split(
    out_socks: list[zmq.Socket],
    encoder: msgspec.msgpack.Encoder,
    client_of: dict[str, int],
    outputs: list[EngineOutput],
    errors: list[RequestError],
    stats: SchedulerStats,
    compile_times: list[float],
    num_added: list[int],
) -> None:
    """Send one batch to every API process, each with the outputs and errors of its requests
    (a request is forgotten once finished or rejected)."""
    per_client: list[list[EngineOutput]] = [[] for _ in out_socks]
    errs: list[list[RequestError]] = [[] for _ in out_socks]
    for out in outputs:
        c = client_of.get(out.request_id, 0)
        per_client[c].append(out)
        if out.finish_reason is not None:
            client_of.pop(out.request_id, None)
    for err in errors:
        errs[client_of.pop(err.request_id, 0)].append(err)
    for c, sock in enumerate(out_socks):
        batch = EngineOutputs(per_client[c], errs[c], stats, compile_times if c == 0 else [], num_added[c])
        sock.send(encoder.encode(batch), copy=False)
