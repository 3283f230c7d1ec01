"""The engine's grammar compiler: xgrammar tokenizer info, a thread pool, a cache by key."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from surge.sampling_params import StructuredOutputsParams
from surge.structured.cpus import available_cpus
from surge.structured.validate import build_grammar, clean_error

logger = logging.getLogger("surge.structured")

CACHE_SIZE = 512
"""Compiled grammars kept (least recently used dropped first)."""

CPUS_PER_COMPILE_THREAD = 8
"""The compilations together use at most one thread per this many CPUs (at least one): the
engine loop, the mask fill's threads and the API process need the rest, and a compilation
that takes the cores they run on stalls every stream (measured: README of
``benchmarks/results/h200-qwen3-8b/features/``)."""


def compile_thread_budget(cpus: int) -> tuple[int, int]:
    """``(workers, threads_per_compile)`` for ``cpus`` CPUs: ``workers`` concurrent
    compilations of one xgrammar thread each, ``cpus // CPUS_PER_COMPILE_THREAD`` of them
    (1 to 4); ``workers * threads_per_compile`` never exceeds that budget."""
    return max(1, min(4, cpus // CPUS_PER_COMPILE_THREAD)), 1


class CompiledGrammarCache:
    """Compiles grammars off the engine loop and caches them by ``StructuredOutputsParams.key``.

    The xgrammar ``TokenizerInfo`` is built from the model folder's tokenizer (byte-level
    BPE such as Qwen3's, or byte-fallback SentencePiece such as stories260K's) with the
    model's vocabulary size (the LM head may be wider than the tokenizer: the padded ids
    are never allowed) and the model's EOS ids as stop tokens. It is built lazily, in the
    pool, by the first compilation: an engine that never sees a grammar never loads it.

    Args:
        tokenizer_dir: the model folder (its tokenizer files).
        vocab_size: the model's vocabulary size (logits width).
        stop_token_ids: the model's EOS ids; a finished grammar allows only these.
        max_workers: concurrent compilations (default: :func:`compile_thread_budget`).

    Attributes:
        compile_times: seconds of each finished compilation not yet taken by
            :meth:`take_compile_times` (for the grammar compile-time histogram).
    """

    def __init__(
        self,
        tokenizer_dir: str,
        vocab_size: int,
        stop_token_ids: tuple[int, ...],
        max_workers: int | None = None,
    ) -> None:
        self._tokenizer_dir = tokenizer_dir
        self._vocab_size = vocab_size
        self._stop_token_ids = list(stop_token_ids)
        workers, self._compiler_threads = compile_thread_budget(available_cpus())
        self._pool = ThreadPoolExecutor(
            max_workers=max_workers or workers, thread_name_prefix="surge-grammar"
        )
        self._lock = threading.Lock()
        self._compiler: Any = None
        self._cache: OrderedDict[tuple[str, Any], Future[Any]] = OrderedDict()
        self.compile_times: list[float] = []

    def submit(self, params: StructuredOutputsParams) -> Future[Any]:
        """A future of the ``xgrammar.CompiledGrammar`` of ``params`` (done at once on a
        cache hit). A failed compilation raises ``ValueError`` from ``result()`` and is
        not cached, nor is a compilation cancelled before it started (every request that
        waited for it was aborted)."""
        key = params.key
        future = self._cache.get(key)
        if (
            future is not None
            and not future.cancelled()
            and not (future.done() and future.exception() is not None)
        ):
            self._cache.move_to_end(key)
            return future
        future = self._pool.submit(self._compile, params)
        self._cache[key] = future
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return future

    def tokenizer_info(self) -> Any:
        """The xgrammar ``TokenizerInfo`` (built on first use)."""
        return self._get_compiler().tokenizer_info

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                from surge.tokenizer import load_tokenizer

                t0 = time.perf_counter()
                tokenizer = load_tokenizer(self._tokenizer_dir)
                info = xgr.TokenizerInfo.from_huggingface(
                    tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._stop_token_ids
                )
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=self._compiler_threads, cache_enabled=False
                )
                logger.info("grammar compiler ready (tokenizer info in %.2f s)", time.perf_counter() - t0)
            return self._compiler

    def _compile(self, params: StructuredOutputsParams) -> Any:
        grammar = build_grammar(params)  # ValueError for a bad spec
        compiler = self._get_compiler()
        t0 = time.perf_counter()
        try:
            compiled = compiler.compile_grammar(grammar)
        except Exception as e:
            raise ValueError(f"the {params.kind} grammar cannot be compiled: {clean_error(e)}") from e
        self.compile_times.append(time.perf_counter() - t0)
        return compiled

    def take_compile_times(self) -> list[float]:
        """Compile times (seconds) recorded since the last call."""
        times, self.compile_times = self.compile_times, []
        return times

    def shutdown(self) -> None:
        """Stop the pool (running compilations finish)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
