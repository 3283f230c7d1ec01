"""A grammar compile worker process and its messages.

The engine's :class:`~surge.structured.compiler.CompiledGrammarCache` starts these
(``python -m surge.structured.compile_worker FD NAME``: a fresh interpreter with one end of a
socket pair as descriptor ``FD``), sends each its :class:`CompileWorkerSpec`, then one
:class:`CompileJob` at a time; a worker answers
:class:`CompileDone` (a small compiled grammar as xgrammar's JSON serialization; of a larger
one only that it compiled, and the engine compiles it again) or :class:`CompileFailed`. A process, unlike a thread, can be killed: a compilation that runs past
the engine's limit ends with its worker (:attr:`~surge.config.EngineConfig.grammar_compile_timeout`).
"""

from __future__ import annotations

import importlib
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from surge.parent_death import set_parent_death_signal
from surge.sampling_params import StructuredOutputsParams
from surge.structured.validate import build_grammar, clean_error


class CompileWorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a compile worker needs to build its xgrammar ``TokenizerInfo`` and compiler.

    Attributes:
        tokenizer_dir: the model folder (its tokenizer files).
        vocab_size: the model's vocabulary size (logits width).
        stop_token_ids: the model's EOS ids.
        threads: xgrammar threads of one compilation.
        hook: tests only: ``"module:function"``, called with each job's
            ``StructuredOutputsParams`` before it is compiled (to make a compilation slow or
            end the worker); None in serving.
    """

    tokenizer_dir: str
    vocab_size: int
    stop_token_ids: tuple[int, ...]
    threads: int = 1
    hook: str | None = None


class WorkerReady(msgspec.Struct, frozen=True, tag=True):
    """The worker has built its tokenizer info and waits for jobs."""


class CompileJob(msgspec.Struct, frozen=True, tag=True):
    """Compile the grammar of ``params``."""

    params: StructuredOutputsParams


class CompileDone(msgspec.Struct, frozen=True, tag=True):
    """A compiled grammar.

    Attributes:
        compiled_json: ``xgrammar.CompiledGrammar.serialize_json()`` of a grammar of at most
            :data:`SERIALIZE_MAX_BYTES`; None for a larger one, which the engine compiles
            again itself (it compiled here, within the time limit).
        seconds: wall time of the compilation, its acceptance check and its serialization,
            in seconds.
    """

    compiled_json: str | None
    seconds: float


class CompileFailed(msgspec.Struct, frozen=True, tag=True):
    """The job's grammar is refused (or, as the first message, the worker could not start);
    ``message`` is the one-line reason given to the request."""

    message: str


WorkerMessage = WorkerReady | CompileDone | CompileFailed
"""What a worker sends."""

SERIALIZE_MAX_BYTES = 160 * 1024
"""Largest compiled grammar (xgrammar's ``memory_size_bytes``) a worker sends as JSON. Past it the
JSON round trip costs more than compiling again: its size grows about with the square of the
grammar's (``benchmarks/grammar_serialize_cost.py``, Qwen3's vocabulary, 2 CPUs, a schema of
``n`` required properties: at 20, 160 KB compiled, 0.30 MB of JSON, written and read back in
12 ms against a 19 ms compile; at 160, 0.66 MB, 6.8 MB, 345 against 28 ms; at 1,000, 3.8 MB,
268 MB, 12.6 s against 0.13 s, and each read left about 400 MB with the engine process;
``benchmarks/results/grammar-workers-cpu/session52/``)."""

MAX_COMPILED_BYTES = 64 * 1024 * 1024
"""Largest compiled grammar (``memory_size_bytes``) accepted. Long literals cost about 280
bytes a character (Qwen3's vocabulary: a 65,536-character ``const`` 18 MB, a 1,000,000-character
one 280 MB and 17 s; ``benchmarks/results/grammar-workers-cpu/session52/``), so one request
could otherwise take gigabytes of the engine's memory."""


def grammar_name(params: StructuredOutputsParams) -> str:
    """How messages name the grammar of ``params``: its kind, with "ebnf" for an EBNF
    ``grammar`` ("the ebnf grammar accepts no text")."""
    kind = params.kind
    return "ebnf" if kind == "grammar" else kind


def make_tokenizer_info(spec: CompileWorkerSpec) -> Any:
    """The xgrammar ``TokenizerInfo`` of ``spec``'s tokenizer, vocabulary size and stop tokens
    (imports xgrammar and transformers; about 1.7 s for Qwen3's 151K tokens).

    Raises:
        ValueError / OSError: the folder's tokenizer cannot be loaded.
    """
    import xgrammar as xgr

    from surge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(spec.tokenizer_dir)
    return xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=spec.vocab_size, stop_token_ids=list(spec.stop_token_ids)
    )


def compile_grammar(compiler: Any, vocab_size: int, params: StructuredOutputsParams) -> Any:
    """The ``xgrammar.CompiledGrammar`` of ``params`` by ``compiler`` (an
    ``xgrammar.GrammarCompiler`` of ``vocab_size`` tokens), refused when it accepts no text.

    A grammar accepts no text when, at its start, no token is allowed (not even a stop token)
    and the matcher is not terminated: ``root ::= root`` (left recursion without a base case)
    compiles, and a request under it would fail at its first step.

    Raises:
        ValueError: the spec is invalid (:func:`~surge.structured.validate.build_grammar`),
            xgrammar cannot compile it, it compiles to more than :data:`MAX_COMPILED_BYTES`,
            or it accepts no text; the message names the kind.
    """
    import xgrammar as xgr

    grammar = build_grammar(params)
    kind = grammar_name(params)
    try:
        compiled = compiler.compile_grammar(grammar)
    except Exception as e:
        raise ValueError(f"the {kind} grammar cannot be compiled: {clean_error(e)}") from e
    size = compiled.memory_size_bytes
    if size > MAX_COMPILED_BYTES:
        raise ValueError(
            f"the {kind} grammar is too large: {size / 2**20:.0f} MiB compiled, over "
            f"{MAX_COMPILED_BYTES / 2**20:.0f} MiB (long literals such as a const string take about "
            "270-280 bytes a character): shorten its literals or split the task"
        )
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    if not bool(bitmask.any()) and not matcher.is_terminated():
        raise ValueError(
            f"the {kind} grammar accepts no text: no token can start it (a rule that refers to "
            "itself before anything else, such as root ::= root, needs an alternative that does not)"
        )
    return compiled


def _load_hook(path: str | None) -> Callable[[StructuredOutputsParams], None] | None:
    if path is None:
        return None
    module, _, name = path.partition(":")
    hook: Callable[[StructuredOutputsParams], None] = getattr(importlib.import_module(module), name)
    return hook


def run_compile_worker(spec: CompileWorkerSpec, conn: Connection) -> None:
    """The loop of a compile worker (:func:`main` runs it with the spec it receives).

    Builds the tokenizer info and an xgrammar compiler of ``spec.threads`` threads (no cache:
    the engine caches), sends :class:`WorkerReady` (or :class:`CompileFailed` and returns when
    that fails), then answers each :class:`CompileJob` until the pipe closes. SIGINT is
    ignored (the worker runs in its own session, so a terminal's Ctrl-C does not reach it; the
    engine stops its workers).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_parent_death_signal(signal.SIGKILL)  # the pool thread that started it lives as long as the pool
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(CompileJob)
    try:
        import xgrammar as xgr

        compiler = xgr.GrammarCompiler(
            make_tokenizer_info(spec), max_threads=spec.threads, cache_enabled=False
        )
        hook = _load_hook(spec.hook)
    except Exception as e:
        text = " ".join(str(e).split())
        conn.send_bytes(
            encoder.encode(CompileFailed(f"{type(e).__name__}: {text}" if text else type(e).__name__))
        )
        return
    conn.send_bytes(encoder.encode(WorkerReady()))
    while True:
        try:
            job = decoder.decode(conn.recv_bytes())
        except (EOFError, OSError):  # the engine is gone or closed the pipe
            return
        if hook is not None:
            hook(job.params)
        reply: CompileDone | CompileFailed
        t0 = time.perf_counter()
        try:
            compiled = compile_grammar(compiler, spec.vocab_size, job.params)
            small = compiled.memory_size_bytes <= SERIALIZE_MAX_BYTES
            reply = CompileDone(compiled.serialize_json() if small else None, time.perf_counter() - t0)
        except ValueError as e:
            reply = CompileFailed(str(e))
        except Exception as e:  # an xgrammar failure outside compile_grammar's wrapping
            reply = CompileFailed(
                f"the {grammar_name(job.params)} grammar cannot be compiled: {clean_error(e)}"
            )
        conn.send_bytes(encoder.encode(reply))


def main(argv: list[str]) -> int:
    """``python -m surge.structured.compile_worker FD NAME``: read the
    :class:`CompileWorkerSpec` from the socket inherited as descriptor ``FD`` and run
    :func:`run_compile_worker` on it (``NAME`` only labels the process for ``ps``). Returns the
    exit status: 0, or 2 for bad arguments or a spec that cannot be read."""
    if len(argv) < 1 or not argv[0].isdigit():
        print("usage: python -m surge.structured.compile_worker FD [NAME]", file=sys.stderr)
        return 2
    conn = Connection(int(argv[0]))
    try:
        spec = msgspec.msgpack.decode(conn.recv_bytes(), type=CompileWorkerSpec)
    except (EOFError, OSError, msgspec.DecodeError) as e:
        print(f"surge grammar compile worker: no spec from the engine ({e})", file=sys.stderr)
        return 2
    run_compile_worker(spec, conn)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
